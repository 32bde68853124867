"""The walkthrough's model and run, which the package needs beyond the walkthrough's page:
:func:`briefly_trained` gives the method page's figures (:mod:`~barter_mini.book.mechanism`)
their model, and :func:`walkthrough_run` is the run the sweep trains for chapter 01
(:mod:`~barter_mini.book.plans`). The page's tables and figures are defined in its cells."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..core.unit_statistics import DEFAULT_PRUNING_SCORE, UnitStatistics
from ..training.parts import parts_for_new_model
from ..training.run_config import RunConfig
from .experiments import profile_run
from .profiles import Profile


def briefly_trained(config, density: float, batches, lr: float = 1e-3,
                    pruning_score: str = DEFAULT_PRUNING_SCORE):
    """A compact model of ``config`` at ``density`` trained one step per ``(images, labels)``
    batch as ``train`` steps a Static run (:func:`~barter_mini.training.parts.parts_for_new_model`:
    fused AdamW, the quick recipe's weight decay and label smoothing at learning rate ``lr``),
    with its statistics hooks attached (by default the method's own pruning
    score, one default for both kinds). Returns ``(model, optimizer, statistics)``, the model
    in train mode."""
    run = RunConfig(method="static", model=config.name, density=density, recipe="quick", lr=lr)
    parts = parts_for_new_model(run, config, 1, torch.device("cpu"))
    statistics = UnitStatistics(parts.model, pruning_score=pruning_score)
    for x, y in batches:
        parts.step(x, y, None)
    return parts.model, parts.optimizer, statistics


def walkthrough_run(setup: Profile, density: float, seed: int) -> RunConfig:
    """The walkthrough's BARTER run: the profile's run (:func:`~barter_mini.book.experiments.profile_run`)
    on the profile's own training subset rather than the grids' smaller one."""
    return replace(profile_run(setup, "barter", density, seed), train_subset=setup.train_subset)
