"""How far a run has come: :class:`Progress`, the one part of a run that changes while it trains.

A run's settings, parts, data and length are fixed when it is built
(:class:`~barter_mini.training.trainer.Training` is frozen); everything the loop advances is
here. The fields declared with :func:`saved` are ``last.pt``'s ``progress`` entry, each with
the check a resumed run applies to it (:data:`PROGRESS_CHECKS`); the others live only in the
process (the DDP replica, the losses still on the device) or are recomputed on resume (the
cost per image of the tensors as they are).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch
from torch import nn

from .checkpoint_contents import are_scores, finite_number, integer, is_real, is_record, list_of, optional
from .resume_contents import generator_state_error

#: the key of a field's metadata that holds its check in ``last.pt`` (:func:`saved`)
CHECK = "check"


def saved(default: Any, check: Callable[[Any], bool], allowed: str):
    """A field of :class:`Progress` that ``last.pt`` keeps, ``check(value)`` being what a resumed
    run accepts for it (``allowed`` in words, for the one-line refusal)."""
    if isinstance(default, list):
        return field(default_factory=list, metadata={CHECK: (check, allowed)})
    return field(default=default, metadata={CHECK: (check, allowed)})


def _is_loss_pair(pair) -> bool:
    return isinstance(pair, (list, tuple)) and len(pair) == 2 and all(map(is_real, pair))


@dataclass
class Progress:
    """How far a run has come: what ``last.pt`` keeps of it and a resumed run restores, through
    one symmetric pair, :meth:`state_dict` and :meth:`load_state_dict` (its :func:`saved`
    fields and the elapsed time, ``perf_counter() - started``)."""

    #: the cumulative training GFLOPs so far: each segment between topology updates at its own cost
    train_gflops: float = saved(0.0, finite_number(0.0), "a finite number >= 0")
    #: wall seconds spent in the controller's after_step calls that changed the model
    update_seconds: float = saved(0.0, finite_number(0.0), "a finite number >= 0")
    step: int = saved(0, integer(0), "an integer >= 0")
    #: batches whose fp16 gradients overflowed: trained on, but no optimizer step (not in ``step``)
    skipped_steps: int = saved(0, integer(0), "an integer >= 0")
    best_acc: float = saved(-1.0, finite_number(-1.0, 1.0), "a number in [-1, 1]")
    history: list = saved([], list_of(is_record), "a list of dicts of numbers")
    curve: list = saved([], list_of(is_record), "a list of dicts of numbers")
    window: list = saved([], list_of(_is_loss_pair), "a list of (loss, accuracy) pairs")
    #: the training loss of every step so far (for the windows around updates)
    step_losses: list = saved([], list_of(is_real), "a list of numbers")
    #: the epoch in progress or next to start (1-based), the batches of it already trained,
    #: their losses, and the training loader's generator state at its start
    epoch: int = saved(1, integer(1), "an integer >= 1")
    batches_done: int = saved(0, integer(0), "an integer >= 0")
    epoch_losses: list = saved([], list_of(is_real), "a list of numbers")
    epoch_loader_state: torch.Tensor | None = saved(None, optional(lambda state: generator_state_error(state) is None),
                                                    "None or the state of a torch generator")
    #: the last completed epoch's validation scores
    last_val: dict | None = saved(None, optional(are_scores), "None or the validation scores {acc, macro_f1} in [0, 1]")
    #: when the run started, on this process's ``perf_counter`` (a resumed run: minus the time it had trained)
    started: float = field(default_factory=time.perf_counter)
    #: training GFLOPs per image of the tensors as they are now (3 x forward; recomputed on resume)
    gflops_per_image: float = 0.0
    #: what the training step calls: the model, or its DDP replica (training.parallel)
    forward: nn.Module | None = None
    #: why the run stopped for divergence (:func:`~barter_mini.training.divergence.divergence_record`),
    #: else None: last.pt keeps it, so a resume of a diverged run stops with the same line
    diverged: dict | None = None
    #: ``(loss, accuracy, stepped, step)`` of the batches not yet recorded (tensors where unread)
    unread: list = field(default_factory=list)

    def state_dict(self) -> dict:
        return {**{spec.name: _copy(getattr(self, spec.name)) for spec in fields(self) if CHECK in spec.metadata},
                "elapsed_s": time.perf_counter() - self.started}

    def load_state_dict(self, state: dict) -> None:
        for spec in fields(self):
            if CHECK in spec.metadata:
                setattr(self, spec.name, _copy(state[spec.name]))
        self.started = time.perf_counter() - state["elapsed_s"]


def _copy(value):
    return list(value) if isinstance(value, list) else value


#: every entry of ``last.pt``'s ``progress`` (:meth:`Progress.state_dict`) and what it must be
#: for the trainer to continue from it: the :func:`saved` fields' checks and the elapsed time
PROGRESS_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{spec.name: spec.metadata[CHECK] for spec in fields(Progress) if CHECK in spec.metadata},
    "elapsed_s": (finite_number(0.0), "a finite number >= 0"),
}
