"""When a run has diverged, and what its ``last.pt`` keeps of it.

A non-finite training loss stops a run at once (the trainer's step checks it before
backward); a finite loss that averages far above a uniform guess's stops it too
(:func:`check_loss_against_chance`), and so does a validation loss after an epoch that is
not finite or as far above (:func:`check_validation_loss`): the only check that sees the
model after a run's last update. The stopped run's ``last.pt`` records why
(:func:`divergence_record`), so that ``--resume`` stops again with the same line
(:func:`diverged_again`) instead of training on from a broken state.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import BarterError, TrainingDiverged

#: a run whose mean training loss over a stretch of steps exceeds this many times the loss of
#: a uniform guess (``ln C``) has diverged (:func:`check_loss_against_chance`)
DIVERGED_LOSS_FACTOR = 20


def check_loss_against_chance(mean_loss: float, step: int, num_classes: int, steps: int) -> None:
    """Raise :class:`~barter_mini.errors.TrainingDiverged` if the mean training loss of the
    ``steps`` steps up to ``step`` exceeds :data:`DIVERGED_LOSS_FACTOR` times the loss of
    a uniform guess, ``ln C`` for ``C`` classes (whatever the label smoothing): a model that
    far worse than chance has diverged, though every number is still finite."""
    limit = DIVERGED_LOSS_FACTOR * math.log(max(num_classes, 2))
    if mean_loss > limit:
        raise TrainingDiverged(step, f"the training loss averaged {mean_loss:.4g} over steps {step - steps + 1}-{step}, "
                                     f"over {DIVERGED_LOSS_FACTOR} times that of a uniform guess "
                                     f"({limit:.3g} = {DIVERGED_LOSS_FACTOR} x ln {num_classes})")


def check_validation_loss(loss: float, step: int, num_classes: int) -> None:
    """Raise :class:`~barter_mini.errors.TrainingDiverged` if the validation loss after step
    ``step`` is not finite or exceeds :data:`DIVERGED_LOSS_FACTOR` times ``ln C``: the training
    loss of a step is read before its update, so only the model after it shows whether the
    last update of an epoch (the last of the run among them) broke the weights."""
    limit = DIVERGED_LOSS_FACTOR * math.log(max(num_classes, 2))
    if not math.isfinite(loss) or loss > limit:
        raise TrainingDiverged(step, f"the validation loss after step {step} is {loss:.4g}, "
                                     + ("not a finite number" if not math.isfinite(loss) else
                                        f"over {DIVERGED_LOSS_FACTOR} times that of a uniform guess "
                                        f"({limit:.3g} = {DIVERGED_LOSS_FACTOR} x ln {num_classes})"))


def divergence_record(diverged: TrainingDiverged) -> dict:
    """What last.pt keeps of a divergence (:attr:`~barter_mini.training.progress.Progress.diverged`):
    enough to raise it again."""
    return {"step": diverged.step, "what": diverged.what, "hint": diverged.hint}


def diverged_again(checkpoint: dict, path: Path) -> TrainingDiverged:
    """The divergence that stopped the run whose ``last.pt`` (at ``path``) is ``checkpoint``,
    to raise again on ``--resume``: the same line, the same exit status. A resumed diverged
    run would otherwise train on from a broken state until its loss happened to fall below
    the rule and end as if it had finished."""
    record = checkpoint["diverged"]
    if not (isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("what"), str)
            and isinstance(record.get("hint", ""), str) and isinstance(checkpoint.get("step"), int)):
        raise BarterError(f"{path} marks its run as diverged but does not say where (a damaged file): "
                          "train the run again in another --out")
    return TrainingDiverged(record["step"], record["what"], checkpoint=path, kept_step=checkpoint["step"],
                            hint=record.get("hint", ""))
