"""Selective recomputation of LayerNorm and GELU outputs: same function and gradients, less kept."""

import copy

import pytest
import torch
from torch import nn

from barter_mini.core.models import build_model, get_model_config
from barter_mini.core.recompute import (disable_selective_recompute, enable_selective_recompute,
                                        selective_recompute_of)
from barter_mini.core.surgery import regather_units
from barter_mini.measure.bench import build_training_step
from barter_mini.measure.memory import step_memory


def twins(name: str, density: float, seed: int = 0):
    """A model and an exact copy of it with selective recompute on."""
    torch.manual_seed(seed)
    plain = build_model(get_model_config(name), density)
    other = copy.deepcopy(plain)
    return plain, other, enable_selective_recompute(other)


def images(name: str, n: int = 4, seed: int = 1) -> torch.Tensor:
    config = get_model_config(name)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, config.in_chans, config.img_size, config.img_size, generator=g)


def assert_same_step(plain: nn.Module, other: nn.Module, x: torch.Tensor) -> None:
    """Forward and backward of both give the same output and the same gradient of every parameter."""
    for model in (plain, other):
        model.zero_grad(set_to_none=True)
    outputs = [model(x) for model in (plain, other)]
    for out in outputs:
        out.square().mean().backward()
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0, atol=1e-6)
    names = [name for name, _ in plain.named_parameters()]
    assert names == [name for name, _ in other.named_parameters()]
    for name, p, q in zip(names, plain.parameters(), other.parameters()):
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-7, msg=name)


def hooks_active() -> bool:
    """Whether saved-tensor hooks other than an outer probe's are in force right now."""
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        torch.ones(2, requires_grad=True).exp()
    return not seen


#: per layer two LayerNorm outputs and a GELU output; CCT's final norm output is saved twice
#: (by the attention pool and the pooling product), ViT's once (its class-token row)
RECOMPUTED = {"cct-mini": 3 * 4 + 2, "vit-mini": 3 * 4 + 1}


@pytest.mark.parametrize("density", [1.0, 0.3])
@pytest.mark.parametrize("name", ["cct-mini", "vit-mini"])
def test_same_outputs_and_gradients(name, density):
    plain, other, recompute = twins(name, density)
    assert_same_step(plain, other, images(name))
    assert recompute.recomputed == RECOMPUTED[name] and recompute.kept > 0
    assert recompute.records == 0 and not hooks_active()


def test_enabling_twice_does_not_stack_and_disable_detaches():
    _, model, recompute = twins("cct-mini", 0.3)
    hooks = len(model._forward_pre_hooks), len(model._forward_hooks)
    assert enable_selective_recompute(model) is recompute
    assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == hooks
    assert selective_recompute_of(model) is recompute
    assert disable_selective_recompute(model) and selective_recompute_of(model) is None
    assert not disable_selective_recompute(model)
    model(images("cct-mini")).sum().backward()
    assert recompute.recomputed == 0                      # detached: nothing went through it
    again = enable_selective_recompute(model)
    assert again is not recompute and selective_recompute_of(model) is again


def test_a_copy_gets_its_own_recompute():
    # counting FLOPs deep-copies the model; disabling the copy must leave the original alone
    _, model, recompute = twins("vit-mini", 0.3)
    replica = copy.deepcopy(model)
    theirs = selective_recompute_of(replica)
    assert theirs is not recompute and theirs.model is replica
    theirs.disable()
    assert selective_recompute_of(model) is recompute
    model(images("vit-mini")).sum().backward()
    assert recompute.recomputed == RECOMPUTED["vit-mini"]


@pytest.mark.parametrize("name", ["cct-mini", "vit-mini"])
def test_step_memory_no_longer_counts_the_rebuilt_outputs(name):
    batch = 8
    setup = build_training_step(name, "barter", 0.3, batch, 1000, torch.device("cpu"))
    measure = lambda: step_memory(setup, setup.model, setup.optimizer, setup.controller)  # noqa: E731
    before = measure()
    enable_selective_recompute(setup.model)
    during = measure()
    disable_selective_recompute(setup.model)
    after = measure()
    # what is no longer kept: per layer two width-D LayerNorm outputs and the GELU output
    # (width: the layer's FFN channels), plus the final norm's output, float32
    config, allocation = setup.model.config, setup.model.allocation()
    tokens, dim = config.num_tokens, config.embed_dim
    expected = 4 * batch * tokens * (2 * dim * config.depth + sum(allocation.ffn) + dim) / 1024 ** 2
    assert before["saved_activations_mb"] - during["saved_activations_mb"] == pytest.approx(expected)
    assert before["peak_mem_mb"] - during["peak_mem_mb"] == pytest.approx(expected)
    assert after == before
    assert during["params_mb"] == before["params_mb"] and during["optimizer_mb"] == before["optimizer_mb"]


@pytest.mark.parametrize("name", ["cct-mini", "vit-mini"])
def test_keeps_working_after_surgery_replaces_parameters_and_modules(name):
    plain, other, recompute = twins(name, 0.3)
    x = images(name)
    assert_same_step(plain, other, x)
    for model in (plain, other):
        torch.manual_seed(2)
        block = model.blocks[1]
        heads, channels = block.attn.num_heads, block.mlp.fc1.out_features
        # prune a head, clone an FFN channel with a split: new nn.Parameters everywhere
        regather_units(block, "heads", torch.arange(1, heads), torch.ones(heads - 1))
        regather_units(block, "ffn", torch.tensor([*range(channels), 0]),
                       torch.tensor([0.3] + [1.0] * (channels - 1) + [0.7]))
        # whole modules swapped for equal new ones, LayerNorm and GELU included
        old = block.mlp.fc1
        block.mlp.fc1 = nn.Linear(old.in_features, old.out_features)
        block.mlp.fc1.load_state_dict(old.state_dict())
        block.mlp.act = nn.GELU()
        norm = "pre_norm" if hasattr(block, "pre_norm") else "norm2"
        setattr(block, norm, copy.deepcopy(getattr(block, norm)))
    assert other.allocation() == plain.allocation() != build_model(get_model_config(name), 0.3).allocation()
    assert_same_step(plain, other, x)
    assert recompute.recomputed == RECOMPUTED[name]


def test_no_grad_and_eval_forwards_leave_nothing_behind():
    plain, other, recompute = twins("cct-mini", 0.3)
    x = images("cct-mini")
    norms = [m for m in other.modules() if isinstance(m, (nn.LayerNorm, nn.GELU))]
    with torch.no_grad():
        torch.testing.assert_close(other(x), plain(x), rtol=0, atol=0)
    assert recompute.records == 0 and not hooks_active()
    assert all(not m._forward_hooks for m in norms)
    plain.eval(), other.eval()
    with torch.inference_mode():
        torch.testing.assert_close(other(x), plain(x), rtol=0, atol=0)
    assert_same_step(plain, other, x)                     # eval mode with gradients: still exact
    assert recompute.recomputed == RECOMPUTED["cct-mini"]


def test_repeated_steps_do_not_accumulate():
    _, model, recompute = twins("vit-mini", 0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = images("vit-mini")
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.GELU))]
    hooks = len(model._forward_pre_hooks), len(model._forward_hooks)
    for _ in range(3):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
        assert recompute.records == 0 and recompute.recomputed == RECOMPUTED["vit-mini"]
        assert all(not m._forward_hooks for m in norms)
        assert (len(model._forward_pre_hooks), len(model._forward_hooks)) == hooks
        assert not hooks_active()


def test_an_exception_in_forward_closes_the_hooks():
    _, model, recompute = twins("vit-mini", 0.3)
    with pytest.raises(Exception):
        model(torch.randn(2, 3, 5, 5))                    # wrong channels and size
    assert recompute.records == 0 and not hooks_active()
    assert all(not m._forward_hooks for m in model.modules() if m is not model)
    model(images("vit-mini")).sum().backward()
    assert recompute.recomputed == RECOMPUTED["vit-mini"]


class Toy(nn.Module):
    """Linear -> LayerNorm -> Linear -> GELU -> Linear, with an inplace edit at a chosen point."""

    def __init__(self, edit=None):
        super().__init__()
        self.inp, self.norm, self.fc1, self.act, self.fc2 = (
            nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 12), nn.GELU(), nn.Linear(12, 3))
        self.edit = edit

    def forward(self, x):
        self.h = self.inp(x)
        self.normed = self.norm(self.h)
        if self.edit == "output before it is saved":
            self.normed.mul_(2)
        self.hidden = self.fc1(self.normed)
        return self.fc2(self.act(self.hidden))


def toy_twins(edit=None):
    torch.manual_seed(0)
    plain = Toy(edit)
    other = copy.deepcopy(plain)
    return plain, other, enable_selective_recompute(other)


def test_output_edited_before_saving_is_kept():
    plain, other, recompute = toy_twins("output before it is saved")
    assert_same_step(plain, other, torch.randn(5, 6))
    assert recompute.recomputed == 1                      # the GELU output; the edited norm output kept


@pytest.mark.parametrize("edited", ["h", "hidden"])
def test_input_edited_after_forward_is_an_error_not_a_wrong_gradient(edited):
    # the LayerNorm's (GELU's) input changes between forward and backward: autograd refuses
    # the plain model's backward, and the recomputing one must refuse too
    for model in toy_twins()[:2]:
        out = model(torch.randn(5, 6))
        with torch.no_grad():
            getattr(model, edited).add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_output_edited_after_saving_still_gives_the_true_gradient():
    # autograd refuses the plain model's backward; the recomputed output is the one forward
    # used, so the recomputing model's gradients are those of the unedited step
    plain, other, _ = toy_twins()
    x = torch.randn(5, 6)
    out = plain(x)
    with torch.no_grad():
        plain.normed.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    plain.zero_grad(set_to_none=True)
    plain(x).sum().backward()
    out = other(x)
    with torch.no_grad():
        other.normed.mul_(2)
    out.sum().backward()
    for p, q in zip(plain.parameters(), other.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0)
