"""The paper configurations reproduce the paper's own FLOP and parameter counts."""

import pytest
import torch
from torch import nn
from timm.layers import Attention, Mlp
from timm.models.vision_transformer import Block

from barter_mini.core.budgets import compute_budget
from barter_mini.core.counting import count_parameters, training_gflops_per_image
from barter_mini.core.models import CCTBlock, build_model, get_model_config


def within(value, reference, tolerance=0.005):
    return abs(value / reference - 1) <= tolerance


@pytest.mark.parametrize("name, gflops", [("cct-paper", 7.089840), ("vit-paper", 1.137138)])
def test_dense_training_gflops_match_tables_7_and_9(name, gflops):
    model = build_model(get_model_config(name), 1.0)
    measured = training_gflops_per_image(model)
    assert within(measured, gflops), (measured, gflops)


@pytest.mark.parametrize("density, gflops, mparams", [(0.1, 0.750, 0.4802), (0.5, 3.569, 1.9480)])
def test_compact_cct_matches_table_15(density, gflops, mparams):
    model = build_model(get_model_config("cct-paper"), density)
    assert within(training_gflops_per_image(model), gflops)
    assert within(count_parameters(model) / 1e6, mparams)


def test_models_are_built_from_timm_modules():
    cct = build_model(get_model_config("cct-paper"), 0.3)
    vit = build_model(get_model_config("vit-paper"), 0.3)
    assert all(isinstance(b, CCTBlock) for b in cct.blocks)
    assert all(isinstance(b, Block) for b in vit.blocks)
    for block in [*cct.blocks, *vit.blocks]:
        assert isinstance(block.attn, Attention) and isinstance(block.mlp, Mlp)
        assert block.attn.head_dim == 16
        assert block.attn.qkv.weight.shape[0] == 3 * 16 * block.attn.num_heads


@pytest.mark.parametrize("name", ["cct-paper", "vit-paper", "cct-mini", "vit-mini"])
@pytest.mark.parametrize("density", [0.1, 0.3, 1.0])
def test_allocation_matches_budget_and_forward_runs(name, density):
    config = get_model_config(name)
    model = build_model(config, density)
    allocation = model.allocation()
    if density < 1:
        budget = compute_budget(config, density)
        assert sum(allocation.heads) == budget.heads and sum(allocation.ffn) == budget.ffn
        assert max(allocation.heads) - min(allocation.heads) <= 1
    else:
        assert allocation.heads == (config.heads_per_layer,) * config.depth
    out = model(torch.randn(2, config.in_chans, config.img_size, config.img_size))
    assert out.shape == (2, config.num_classes)


def test_compact_flops_fall_with_density():
    config = get_model_config("cct-paper")
    flops = [training_gflops_per_image(build_model(config, rho)) for rho in (0.1, 0.3, 0.5, 0.7, 1.0)]
    assert flops == sorted(flops)
    # Table 15 at rho = 0.3 and 0.7 as a further check of the budget rule
    assert within(flops[1], 2.166) and within(flops[3], 4.973)


@pytest.mark.parametrize("name", ["cct-paper", "cct-mini"])
def test_tokenizer_pools_before_relu_with_the_same_function_and_gradients(name):
    """The tokenizer runs conv -> MaxPool -> ReLU; the reference order conv -> ReLU -> MaxPool,
    on the same convolutions, gives bitwise the same tokens and convolution gradients."""
    config = get_model_config(name)
    torch.manual_seed(0)
    model = build_model(config, 1.0)
    convs = [m for m in model.tokenizer if isinstance(m, nn.Conv2d)]
    assert [type(m) for m in model.tokenizer] == [nn.Conv2d, nn.MaxPool2d, nn.ReLU] * config.conv_layers
    reference = nn.Sequential(*[layer for conv in convs for layer in (conv, nn.ReLU(), nn.MaxPool2d(3, 2, 1))])
    x = torch.randn(4, config.in_chans, config.img_size, config.img_size)
    ours, theirs = model.tokenizer(x), reference(x)
    assert torch.equal(ours, theirs)
    upstream = torch.randn_like(ours)
    ours_grads = torch.autograd.grad(ours, [c.weight for c in convs], upstream)
    theirs_grads = torch.autograd.grad(theirs, [c.weight for c in convs], upstream)
    for a, b in zip(ours_grads, theirs_grads):
        assert torch.equal(a, b)
    assert (ours == 0).any() and (ours > 0).any()      # the ReLU did cut something
