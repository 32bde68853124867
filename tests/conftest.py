import pytest

from barter_mini.core.configs import ModelConfig
from barter_mini.core.models import get_model_config

from helpers import TINY_CCT, TINY_VIT


@pytest.fixture(params=["cct", "vit"])
def tiny_config(request) -> ModelConfig:
    return TINY_CCT if request.param == "cct" else TINY_VIT


@pytest.fixture
def paper_cct() -> ModelConfig:
    return get_model_config("cct-paper")
