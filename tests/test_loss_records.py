"""A graphed run keeps its training losses on the device and reads ten steps' at once
(``Training.read_every``); here on the CPU the same deferral must record exactly what reading
every loss at once records, read the host far less often, and still stop a run at the step
whose loss was not finite."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from barter_mini.errors import TrainingDiverged
from barter_mini.training.loss_records import LOG_EVERY
from barter_mini.training.run_config import RunConfig
from barter_mini.training.trainer import build_training, fit_one_epoch

RUN = RunConfig(method="barter", model="cct-mini", dataset="digits", recipe="smoke", epochs=3, density=0.5, seed=2,
                progress=False, device="cpu")


def _epoch(read_every: int, monkeypatch) -> tuple:
    """RUN's epochs, reading its losses every ``read_every`` steps; what it recorded and how
    many times a tensor was read to the host with ``item``."""
    t = replace(build_training(RUN), read_every=read_every)
    reads = []
    original = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: reads.append(1) or original(self))
    entries = [fit_one_epoch(t) for _ in range(RUN.epochs)]
    monkeypatch.setattr(torch.Tensor, "item", original)
    p = t.progress
    return (p.step_losses, p.curve, [e["train_loss"] for e in entries], t.unread), len(reads), p.step


def test_deferred_reads_record_what_eager_reads_do_with_fewer_host_reads(monkeypatch):
    (eager, eager_reads, steps), (deferred, deferred_reads, _) = (_epoch(1, monkeypatch),
                                                                 _epoch(LOG_EVERY, monkeypatch))
    assert steps > LOG_EVERY and len(eager[0]) == steps and eager[1]
    assert deferred == eager and deferred[-1] == []
    assert eager_reads - deferred_reads >= 2 * steps           # the loss and the accuracy of every step


def test_a_non_finite_loss_read_late_stops_the_run_at_its_own_step():
    # static: BARTER's statistics would stop it first
    t = replace(build_training(replace(RUN, method="static")), read_every=LOG_EVERY)
    calls = []

    def poison(module, inputs, output):
        calls.append(module.training)               # a topology update's FLOP count runs it in eval mode
        return output * float("nan") if calls.count(True) == 3 and module.training else output

    t.model.register_forward_hook(poison)
    with pytest.raises(TrainingDiverged) as stopped:
        fit_one_epoch(t)
    assert stopped.value.step == 3 and "the training loss is nan" in str(stopped.value)
    assert t.progress.step >= 3 and len(t.progress.step_losses) == 2
