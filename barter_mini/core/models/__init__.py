"""Compact CCT and ViT models on timm modules (paper Table 4), and stock timm ViTs."""

from __future__ import annotations

from torch import nn

from ...errors import choose
from ..budgets import Allocation, check_allocation, compute_budget, full_allocation, initial_allocation
from ..configs import MODEL_CONFIGS, ModelConfig
from .blocks import CCTBlock, attention_with_head_dim, vit_block
from .compact import CompactCCT, CompactTransformer, CompactViT
from .timm_vit import TIMM_PREFIX, build_timm_vit, describe_timm_vit, timm_model_config

FAMILIES = {"cct": CompactCCT, "vit": CompactViT}


def get_model_config(name: str) -> ModelConfig:
    """A configuration of ``MODEL_CONFIGS``, or a stock timm ViT named ``timm:ARCH[:key=value,...]``
    (:func:`~barter_mini.core.models.timm_vit.timm_model_config`)."""
    if isinstance(name, str) and name.startswith(TIMM_PREFIX):
        return timm_model_config(name)
    choose("model", name, MODEL_CONFIGS, extra=f"or {TIMM_PREFIX}ARCH[:key=value,...] for a stock timm ViT")
    return MODEL_CONFIGS[name]


def model_family(name: str) -> str:
    """The family of model ``name`` (which of the paper's recipes it takes), without building
    a timm model: every stock timm model this package accepts is a ViT."""
    return "vit" if isinstance(name, str) and name.startswith(TIMM_PREFIX) else get_model_config(name).family


def build_model(config: ModelConfig, density: float = 1.0, allocation: Allocation | None = None,
                drop_path: float = 0.0) -> nn.Module:
    """A compact model of ``config`` at ``density`` with its initial (even) allocation,
    or with an explicit per-layer ``allocation`` (to rebuild a trained model); a stock timm
    model where ``config.timm_model`` names one."""
    if allocation is None:
        allocation = (full_allocation(config) if density == 1.0
                      else initial_allocation(config, compute_budget(config, density)))
    check_allocation(config, allocation)
    if config.timm_model:
        return build_timm_vit(config, allocation, drop_path=drop_path)
    return FAMILIES[config.family](config, allocation, drop_path=drop_path)


__all__ = ["build_model", "get_model_config", "CompactCCT", "CompactViT", "CompactTransformer", "CCTBlock",
           "vit_block", "attention_with_head_dim", "build_timm_vit", "describe_timm_vit"]
