import pytest
import torch

from barter_mini.budgets import Allocation
from barter_mini.configs import ModelConfig, get_model_config
from barter_mini.models import build_model

#: a CPU-instant model: 3 layers, up to 4 heads of 16 and 12 FFN channels, 4x4 inputs
TINY_CCT = ModelConfig(name="tiny-cct", family="cct", img_size=8, in_chans=1, num_classes=5, depth=3,
                       embed_dim=24, heads_per_layer=4, ffn_per_layer=12, conv_layers=1)
TINY_VIT = ModelConfig(name="tiny-vit", family="vit", img_size=8, in_chans=1, num_classes=5, depth=3,
                       embed_dim=24, heads_per_layer=4, ffn_per_layer=12, patch_size=2)


@pytest.fixture(params=["cct", "vit"])
def tiny_config(request) -> ModelConfig:
    return TINY_CCT if request.param == "cct" else TINY_VIT


def tiny_model(config: ModelConfig, heads=(2, 3, 1), ffn=(5, 8, 3), seed: int = 0):
    torch.manual_seed(seed)
    return build_model(config, allocation=Allocation(heads=tuple(heads), ffn=tuple(ffn)))


def batch(config: ModelConfig, n: int = 6, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, config.in_chans, config.img_size, config.img_size, generator=g)
    y = torch.randint(0, config.num_classes, (n,), generator=g)
    return x, y


def train_step(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.fixture
def paper_cct() -> ModelConfig:
    return get_model_config("cct-paper")
