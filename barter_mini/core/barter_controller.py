"""BARTER during training: the controller that runs the topology update
(:func:`~barter_mini.core.barter.topology_update`) on its schedule
(:class:`~barter_mini.core.barter.TransferSchedule`), gathers the unit statistics the update
reads, and saves and restores all of it for an exact resume."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import torch
from torch import nn

from . import distributed
from .barter import BarterSettings, Transfer, TransferSchedule, topology_update
from .budgets import Budget
from .method import MethodController, check_finite
from .surgery import UNIT_KINDS, allocation_of
from .unit_statistics import UnitStatistics
from .warmup import UpdateWarmup


class BarterController(MethodController):
    """Runs the schedule during training: call :meth:`after_step` after each optimizer step.

    The statistics hooks read the gradients during ``backward``, so nothing happens before
    the step (the protocol's default ``before_step``), except where they would read them too
    early: in a data-parallel run (before DDP averages them) and under loss scaling
    (``loss_scaled``: before they are unscaled). There :meth:`before_step` folds them in.
    """

    name = "barter"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, total_steps: int,
                 settings: BarterSettings = BarterSettings(), seed: int = 0, loss_scaled: bool = False):
        self.model, self.optimizer, self.settings = model, optimizer, settings
        allocation = allocation_of(model)
        self.budget = Budget(heads=sum(allocation.heads), ffn=sum(allocation.ffn))
        self.schedule = TransferSchedule(total_steps, self.budget, settings)   # validates settings
        #: the strategies the settings name, looked up once here and handed to every update
        self.strategies = settings.strategies()
        #: in a data-parallel run, statistics of the averaged gradients, decisions checked on every rank
        self.distributed = distributed.is_distributed()
        self.statistics = UnitStatistics(model, beta=settings.stats_beta, pruning_score=settings.pruning_score,
                                         in_backward=not (self.distributed or loss_scaled))
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.executed = {kind: 0 for kind in UNIT_KINDS}
        self.history: list[dict] = [{"step": 0, **allocation.as_dict()}]
        self.warmup = (UpdateWarmup(optimizer, settings.clone_warmup_steps)
                       if self.strategies.clone_moments.ramps_in else None)
        #: updates after which every process was checked to hold the same widths
        self.rank_checks = 0
        #: optimizer steps seen by after_step
        self.step = 0

    def before_step(self) -> None:
        if not self.statistics.in_backward:
            self.statistics.observe()       # averaged over processes, unscaled: the whole batch's
        if self._moves_after(self.step + 1):          # the statistics decide after this step
            check_finite(self.statistics.tensors(), self.step + 1, "BARTER's unit statistics")
        if self.warmup is not None:
            self.warmup.before_step()

    def _moves_after(self, step: int) -> bool:
        """Whether the update after ``step`` moves any unit: the cosine schedule spreads its
        units over the update steps, and late in training most of them move nothing."""
        return any(self.schedule.transfers_at(step).values())

    def graph_safe(self, step: int) -> bool:
        """Replayable unless the statistics decide after ``step`` (units move then, and
        :meth:`before_step` checks them on the host), the clones' optimizer state warms up
        (host work every step) or the statistics read the gradients after backward rather
        than in it (DDP). An update step that moves nothing replays like any other."""
        return not self._moves_after(step) and self.warmup is None and self.statistics.in_backward

    def after_step(self, step: int) -> dict[str, Transfer] | None:
        self.step = step
        if self.warmup is not None:
            self.warmup.after_step()
        ks = self.schedule.transfers_at(step)
        if not any(ks.values()):
            return None
        # equal on every rank up to the last bit in principle; rank 0's copy makes it so
        distributed.broadcast_(self.statistics.tensors())
        records = topology_update(self.model, ks, self.statistics, self.optimizer,
                                  self.settings, self.rng, self.generator, self.strategies)
        for kind, record in records.items():
            self.executed[kind] += record.executed
        self.history.append({"step": step, **allocation_of(self.model).as_dict(),
                             "transfers": {k: asdict(r) | {"executed": r.executed}
                                           for k, r in records.items()}})
        if self.distributed:
            distributed.check_same_on_every_rank("per-layer widths and transfers", self.history[-1], step)
            self.rank_checks += 1
        return records

    def changing_steps(self) -> list[int]:
        """The update steps that move units: the cosine schedule spreads K units over all
        its update steps, so on many of them nothing is due."""
        return [step for step in self.schedule.update_steps if any(self.schedule.transfers_at(step).values())]

    def metrics(self) -> dict:
        return {**super().metrics(), "transfers_planned": self.schedule.planned_totals(),
                "transfers_executed": dict(self.executed), "allocation_history": self.history,
                "rank_checks": self.rank_checks}

    def state_dict(self) -> dict:
        return {"statistics": self.statistics.state_dict(), "rng": self.rng.bit_generator.state,
                "generator": self.generator.get_state(), "executed": dict(self.executed),
                "history": list(self.history), "rank_checks": self.rank_checks, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.statistics.load_state_dict(state["statistics"])
        self.rng.bit_generator.state = state["rng"]
        self.generator.set_state(state["generator"])
        self.executed = dict(state["executed"])
        self.history = list(state["history"])
        self.rank_checks = state["rank_checks"]
        self.step = int(state["step"])
