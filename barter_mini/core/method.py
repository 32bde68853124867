"""One protocol for every training method, and the two that never change the topology.

Every method of the paper's comparisons (dense, static, BARTER and its Table 12 ablations,
the masked baselines of Table 1) is driven by the trainer, the bench and export through
the same :class:`MethodController`::

    loss.backward()
    controller.before_step()     # between backward and the optimizer step
    optimizer.step()
    step += 1
    controller.after_step(step)  # on schedule: change the topology or the masks

and reports through ``metrics()`` (what it adds to ``metrics.json``; ``rank_checks`` counts the
updates after which a data-parallel run checked that every process holds the same topology
or masks, :mod:`~barter_mini.core.distributed`), saves and restores
itself with ``state_dict()`` / ``load_state_dict()`` (everything it needs to continue: its
statistics, masks, random generators and counts; the step number comes from the caller),
and says how a trained model of the method is exported in its smallest dense form
(:meth:`MethodController.smallest_dense_form`, paper Tables 7, 9 and 15).
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import torch
from torch import nn

from ..errors import BarterError, TrainingDiverged

#: the metrics.json entries every method writes; a method that moves nothing leaves them empty
NO_TRANSFERS = {"heads": 0, "ffn": 0}


def check_finite(tensors, step: int, what: str) -> None:
    """Raise :class:`~barter_mini.errors.TrainingDiverged` at ``step`` if any of ``tensors``
    holds a NaN or an infinity: a method never decides on such values. One reduction and
    one synchronisation, so methods call it only before a step that updates them."""
    tensors = [t for t in tensors if t is not None]
    if tensors and not bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all()):
        raise TrainingDiverged(step, f"{what} hold a non-finite value")


class MethodController:
    """What a training method does around the optimizer step (see the module docstring).

    The defaults are those of a method that never changes its model: no work before or
    after a step, no topology updates, no state, exported as trained.
    """

    #: the method's name in the registry and in metrics.json
    name: ClassVar[str] = "method"
    #: how many times :meth:`after_step` changed the model's tensors (a topology or mask
    #: update), counted whoever called it: a recorded CUDA graph addresses the tensors of
    #: one version and is recorded again when this moves (:mod:`~barter_mini.training.graphs`)
    tensors_version: int = 0

    def __init_subclass__(cls, **kwargs) -> None:
        """Every method's ``after_step`` counts its own changes (:attr:`tensors_version`), so
        that no caller (the trainer, the bench's update timing, a probe) can change the
        tensors without a recorded graph seeing it."""
        super().__init_subclass__(**kwargs)
        if "after_step" in cls.__dict__:
            cls.after_step = _counting_changes(cls.__dict__["after_step"])

    def before_step(self) -> None:
        """Called after ``loss.backward()`` and before ``optimizer.step()``."""

    def after_step(self, step: int) -> Any:
        """Called after optimizer step number ``step`` (1-based); returns what it changed, or None."""
        return None

    def graph_safe(self, step: int) -> bool:
        """Whether step number ``step`` may be replayed from a recorded CUDA graph
        (:mod:`~barter_mini.training.graphs`): its ``before_step`` must be the recorded one,
        kernels only, nothing read on the host. False unless a method says so; a method that
        never changes its model does nothing before a step."""
        return type(self).before_step is MethodController.before_step

    def changing_steps(self) -> list[int]:
        """The steps at which :meth:`after_step` changes the model (what the bench times); a
        schedule's ``update_steps`` may hold more, steps on which nothing is due."""
        return []

    def metrics(self) -> dict:
        """The metrics.json entries of the method's topology or mask changes."""
        return {"transfers_planned": dict(NO_TRANSFERS), "transfers_executed": dict(NO_TRANSFERS),
                "allocation_history": [], "mask": None, "rank_checks": 0}

    def state_dict(self) -> dict:
        """Everything the controller needs to continue exactly (tensors on the CPU)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned, on a model rebuilt from the same checkpoint."""
        if state:
            raise BarterError(f"{self.name} keeps no state, but the checkpoint holds {', '.join(sorted(state))}")

    @classmethod
    def smallest_dense_form(cls, model: nn.Module, state: dict) -> nn.Module:
        """The trained ``model`` as it is exported: the fewest parameters dense kernels can use.

        ``state`` is the controller's :meth:`state_dict` saved with the model. The default is
        the model as trained (compact methods are already compact; unstructured zeros cannot be
        removed); ``model`` itself is never modified.
        """
        return model


def _counting_changes(after_step):
    """``after_step`` that adds one to the controller's :attr:`~MethodController.tensors_version`
    whenever it reports a change (returns something other than None)."""
    if getattr(after_step, "counts_changes", False):
        return after_step

    @functools.wraps(after_step)
    def counted(self, step: int):
        changed = after_step(self, step)
        if changed is not None:
            self.tensors_version += 1
        return changed
    counted.counts_changes = True
    return counted


class Dense(MethodController):
    """Full width, no updates: the dense reference of Table 1 (density 1)."""

    name = "dense"


class Static(MethodController):
    """BARTER's budgeted compact model with its initial even allocation, frozen.

    The ablation that BARTER's reallocation must beat (Table 13, Figure 6).
    """

    name = "static"


class OneShot(Static):
    """The COMPOT-style comparison: allocate once by importance, then train static.

    Starts from a trained dense model cut to the budgets with the layers' shares set by a
    global ranking of unit importance
    (:func:`~barter_mini.core.dense_start.oneshot_allocation`), and never moves a unit.
    """

    name = "oneshot"
