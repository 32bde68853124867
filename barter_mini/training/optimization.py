"""What a run optimizes with: the device, the seeds, AdamW over its parameter groups, the
loss, and the recipe with the run's own settings applied. The trainer, the bench and the
book's walkthrough build their steps from these, so all three optimize alike."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import torch
from torch import nn

from ..errors import BarterError
from .recipes import Recipe, get_recipe
from .run_config import RECIPE_TARGETS, RunConfig, recipe_settings


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BarterError("device cuda requested but no CUDA device is available: use --device cpu or auto")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: biases, norms and embeddings (1-D or positional) are not decayed."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim <= 1 or name.endswith(("pos_embed", "cls_token")) else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, recipe: Recipe, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW over :func:`parameter_groups` at the recipe's learning rate and weight decay.

    PyTorch's fused kernel (``fused=True``, CPU and CUDA) updates every tensor in one pass,
    where the default loop pays a fixed Python cost per parameter tensor whatever its size: a
    cost that does not shrink with the density, so it weighs most on the sparsest compact
    models. The update is the same up to float32 rounding. ``capturable``: its step
    counts on the device and a tensor learning rate accepted, so a CUDA graph can record it
    (:mod:`~barter_mini.training.graphs`).
    """
    fused = next(model.parameters()).device.type in ("cpu", "cuda")
    return torch.optim.AdamW(parameter_groups(model, recipe.weight_decay), lr=recipe.lr, fused=fused,
                             capturable=capturable)


def make_criterion(recipe: Recipe) -> nn.Module:
    """The training loss: cross-entropy with the recipe's label smoothing."""
    return nn.CrossEntropyLoss(label_smoothing=recipe.label_smoothing)


def resolve_recipe(run: RunConfig, family: str) -> Recipe:
    """The run's recipe (of the model ``family``) with the run's settings applied: its
    ``method_settings`` in place of the recipe's settings of that type, then every recipe
    setting the run gives as a field of its own
    (:func:`~barter_mini.training.run_config.recipe_settings`), to the settings that field
    names (the recipe's own, or BARTER's)."""
    recipe = get_recipe(run.recipe, family)
    if run.method_settings is not None:
        recipe = recipe.with_method_settings(run.method_settings)
    given = {target: {name: getattr(run, name) for name in recipe_settings(target) if getattr(run, name) is not None}
             for target in RECIPE_TARGETS}
    return replace(recipe, **given["recipe"], barter=replace(recipe.barter, **given["barter"]))
