"""Optimizer warm-up of new parameters (the SMET remedy for Adam's cold start).

A parameter entry that starts with zeroed Adam moments while its tensor's step count is
late (a BARTER clone with ``clone_moments="fresh"``, a weight a masked method regrows) takes
a first step of about ``lr * (1 - beta1) / sqrt(1 - beta2)``, some 3x a warmed-up entry's
(SMET calls this the cold start, and sees loss spikes after topology updates). The
``warmup`` policy keeps the zeroed moments and ramps the new entries' *updates* in:

    ``w <- w_before + min(1, (a + 1) / W) * (w_after - w_before)``

on the ``a``-th optimizer step after the entry was born (``a = 0, 1, ...``), ``W`` the warm-up
length in steps, ``w_after`` what the optimizer wrote. After ``W`` steps the entry is an
ordinary one. This is a linear learning-rate warm-up per entry, the same shape as a run's
own LR warm-up, applied only where the optimizer state is new.

The age ``a`` lives in the optimizer state beside the moments (key :data:`WARMUP_AGE`, one
per element), so the surgery's remap gathers it like any state (clones inherit nothing
else) and :func:`~barter_mini.core.surgery.reset_optimizer_state` sets a new entry's age to
0. Tensors without the key are warmed up.
"""

from __future__ import annotations

import torch
from torch import nn

#: per-element optimizer state: optimizer steps since the entry's state was reset
WARMUP_AGE = "warmup_age"


@torch.no_grad()
def start_warmup(optimizer: torch.optim.Optimizer | None, param: nn.Parameter, new: torch.Tensor,
                 steps: int) -> None:
    """Mark the entries where ``new`` (bool, ``param``'s shape) is True as born now (age 0);
    every other entry of a tensor without ages yet counts as warmed up (age ``steps``)."""
    if optimizer is None or param not in optimizer.state:
        return
    state = optimizer.state[param]
    if WARMUP_AGE not in state:
        state[WARMUP_AGE] = torch.full_like(param, float(steps))
    state[WARMUP_AGE].masked_fill_(new, 0.0)


class UpdateWarmup:
    """Applies the ramp around ``optimizer.step()``: :meth:`before_step` remembers the
    tensors that have entries still warming up, :meth:`after_step` scales those entries'
    updates and ages them."""

    def __init__(self, optimizer: torch.optim.Optimizer | None, steps: int):
        self.optimizer, self.steps = optimizer, int(steps)
        self._before: list[tuple[nn.Parameter, torch.Tensor]] = []

    def _warming(self):
        if self.optimizer is None:
            return
        for param, state in self.optimizer.state.items():
            age = state.get(WARMUP_AGE)
            if age is not None and age.shape == param.shape and bool((age < self.steps).any()):
                yield param, age

    @torch.no_grad()
    def before_step(self) -> None:
        self._before = [(param, param.detach().clone()) for param, _ in self._warming()]

    @torch.no_grad()
    def after_step(self) -> None:
        for param, before in self._before:
            age = self.optimizer.state[param][WARMUP_AGE]
            ramp = ((age + 1) / self.steps).clamp_(max=1.0)
            param.copy_(before + ramp * (param - before))
            age.add_(1).clamp_(max=float(self.steps))
        self._before = []
