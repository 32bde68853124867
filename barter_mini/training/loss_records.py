"""What a run records of its training loss, and when it reads it from the device.

Every batch's loss and accuracy go to the run's :class:`~barter_mini.training.progress.Progress`:
the epoch's losses, the losses by optimizer step (the windows around updates in
metrics.json) and, every :data:`LOG_EVERY` optimizer steps, a point of the training curve,
checked against chance (:func:`~barter_mini.training.divergence.check_loss_against_chance`).
An eager run reads each loss before its backward pass; a graphed run keeps them on the device
and :func:`read_losses` reads an interval's at once, so no step waits for the host. Before
anything is written from a run's state, :func:`check_recent_losses` reads what is left and
checks the last steps.
"""

from __future__ import annotations

import math
import numpy as np
import torch

from ..errors import TrainingDiverged
from .divergence import check_loss_against_chance

#: optimizer steps per point of the training curve (running train loss and accuracy), and
#: between a graphed run's reads of its losses
LOG_EVERY = 10


def read_losses(t) -> float | None:
    """Record the losses and accuracies of the batches in ``t.unread`` (``t`` a
    :class:`~barter_mini.training.trainer.Training`), those still on the
    device read in one transfer: the epoch's losses, the losses by optimizer step and, every
    :data:`LOG_EVERY` steps, a point of the training curve, checked against chance
    (:func:`~barter_mini.training.divergence.check_loss_against_chance`). A non-finite loss read
    here (a graphed run's) stops the run at its step. Returns the last loss recorded."""
    if not t.unread:
        return None
    unread = list(t.unread)
    t.unread.clear()
    on_device = [value for loss, accuracy, _, _ in unread for value in (loss, accuracy) if torch.is_tensor(value)]
    read = iter(torch.stack(on_device).tolist() if on_device else [])
    p = t.progress
    for loss, accuracy, stepped, step in unread:
        loss, accuracy = (next(read) if torch.is_tensor(value) else value for value in (loss, accuracy))
        if not math.isfinite(loss):
            raise TrainingDiverged(step if stepped else step + 1, f"the training loss is {loss}")
        p.epoch_losses.append(loss)
        if stepped:                           # step_losses and the curve are indexed by optimizer step
            p.step_losses.append(loss)
            p.window.append((loss, accuracy))
        if stepped and step % LOG_EVERY == 0:
            p.curve.append({"step": step, "train_loss": float(np.mean([l for l, _ in p.window])),
                            "train_acc": float(np.mean([a for _, a in p.window]))})
            p.window.clear()
            check_loss_against_chance(p.curve[-1]["train_loss"], step, t.config.num_classes, LOG_EVERY)
    return loss


def check_recent_losses(t) -> None:
    """:func:`~barter_mini.training.divergence.check_loss_against_chance` on the mean loss of
    the last ``LOG_EVERY`` optimizer steps (fewer in a run that has taken fewer), after reading
    any still on the device (:func:`read_losses`): called before anything is written from the
    run's state, so a step whose loss the periodic check has not yet seen (a run shorter than
    ``LOG_EVERY`` steps, the end of an epoch between two curve points) never reaches a
    checkpoint or metrics.json unchecked."""
    read_losses(t)
    recent = t.progress.step_losses[-LOG_EVERY:]
    if recent:
        check_loss_against_chance(float(np.mean(recent)), t.progress.step, t.config.num_classes, len(recent))
