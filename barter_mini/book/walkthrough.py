"""Helpers for the walkthrough notebook: a briefly trained model to operate on."""

from __future__ import annotations

from itertools import cycle, islice

import torch
from torch import nn

from ..core.configs import get_model_config
from ..training.data import load_dataset, make_loaders
from ..core.models import CompactTransformer, build_model
from .profiles import Profile
from ..core.unit_statistics import UnitStatistics
from ..training.trainer import parameter_groups, seed_everything


def warmed_up_model(profile: Profile, density: float, seed: int = 0, steps: int = 30,
                    batch_size: int = 64, lr: float = 1e-3):
    """A compact model of ``profile`` trained ``steps`` AdamW steps on real images.

    Returns ``(model, optimizer, statistics, probe)``: the model in eval mode (so outputs are
    deterministic), its optimizer with live state, the statistics its hooks gathered, and a
    fixed batch of images to compare outputs on.
    """
    seed_everything(seed)
    splits = load_dataset(profile.dataset, seed=seed, train_subset=steps * batch_size, augment=False)
    loader, _, _ = make_loaders(splits, batch_size, seed)
    info = splits.info
    config = get_model_config(profile.model).for_data(info.img_size, info.in_chans, info.num_classes)
    model: CompactTransformer = build_model(config, density)
    optimizer = torch.optim.AdamW(parameter_groups(model, 0.05), lr=lr)
    statistics = UnitStatistics(model)
    for x, y in islice(cycle(loader), steps):
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    probe = next(iter(loader))[0][:32]
    return model.eval(), optimizer, statistics, probe
