"""One optimizer step of any method: the one place the step protocol is written.

The trainer, the bench, the statistics' overhead timing and the book's walkthrough all call
:func:`training_step`, so what the bench times is what ``train`` runs, and a change to the
step (a precision, a graph, a new method hook) is made once::

    optimizer.zero_grad(set_to_none=True)
    with execution.autocast(x.device):  # fp32: nothing; bf16: torch.autocast
        logits = forward(x)
        loss = criterion(logits, y)
    check_loss(loss, logits)            # the trainer: average over processes, stop if not finite
    loss.backward()
    controller.before_step()            # between backward and the optimizer step
    optimizer.step()
    controller.after_step(step)         # on schedule: change the topology or the masks

The controller's two calls run under the profiler label :data:`METHOD_LABEL`, so a profile
charges them to the method (:mod:`barter_mini.measure.breakdown`).

With a loss scaler (fp16, :meth:`~barter_mini.core.execution.Execution.grad_scaler`) backward
runs on ``scaler.scale(loss)`` and the gradients are unscaled before the controller reads
them. A step whose gradients overflowed is no step at all: the optimizer skips it (the
scaler halves its scale), the controller sees neither call, and the outcome says
``skipped``, so the caller does not count it (a masked method's update or BARTER's
statistics never read an infinity the scale produced).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..core.execution import Execution
from ..core.method import MethodController
from ..errors import BarterError

#: the profiler label of a method's own per-step work (its before_step and after_step)
METHOD_LABEL = "barter_mini.method_step"


@dataclass
class StepOutcome:
    """What one :func:`training_step` did: its loss and logits (not detached from nothing: the
    graph is freed by backward), what the controller's ``after_step`` returned (None: nothing
    changed), the wall seconds that call took (synchronised on a GPU when it changed the
    model, so the seconds are the update's) and whether the step was skipped."""

    loss: torch.Tensor
    logits: torch.Tensor
    changed: Any = None
    update_seconds: float = 0.0
    #: the gradients overflowed under loss scaling: no optimizer step, no controller call
    skipped: bool = False


def training_step(forward: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
                  criterion: Callable = nn.functional.cross_entropy,
                  controller: MethodController | None = None, step: int | None = None,
                  check_loss: Callable[[torch.Tensor, torch.Tensor], Any] | None = None,
                  execution: Execution = Execution(), scaler: torch.amp.GradScaler | None = None,
                  recording: bool = False) -> StepOutcome:
    """One optimizer step of ``forward`` (a model or its DDP replica) on the batch ``(x, y)``
    (module docstring). ``controller`` None: a method that never changes its model;
    ``step`` (1-based) None: the controller's ``after_step`` is not called (the bench times an
    update step's cost apart from it). ``check_loss(loss, logits)`` runs before backward and
    may raise to stop the step there. ``execution`` gives the precision of the forward pass and
    the loss (:meth:`~barter_mini.core.execution.Execution.autocast`); its compile and
    recompute were applied to the model when it was built. ``scaler``: the run's loss scaler
    under fp16 (required there, refused elsewhere). ``recording``: the step is being recorded
    into a CUDA graph (:mod:`~barter_mini.training.graphs`), so autocast keeps no cast cache
    that would outlive a replay."""
    if (scaler is not None) != execution.loss_scaling:
        raise BarterError(f"precision {execution.precision} steps {'with' if execution.loss_scaling else 'without'} "
                          "a loss scaler: pass execution.grad_scaler(device)'s")
    optimizer.zero_grad(set_to_none=True)
    with execution.autocast(x.device, cache_enabled=not recording):
        logits = forward(x)
        loss = criterion(logits, y)
    if check_loss is not None:
        check_loss(loss, logits)
    if scaler is None:
        loss.backward()
    else:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        if not gradients_finite(scaler, optimizer):
            scaler.update()              # halves the scale; the optimizer is never called, so even a
                                         # fused AdamW creates no state for the step
            return StepOutcome(loss, logits, skipped=True)
    if controller is not None:
        with torch.profiler.record_function(METHOD_LABEL):
            controller.before_step()
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    outcome = StepOutcome(loss, logits)
    if controller is not None and step is not None:
        after_step(controller, step, outcome, x.device)
    return outcome


def gradients_finite(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``scaler.unscale_(optimizer)`` found every gradient finite (one synchronisation,
    which ``scaler.step`` makes anyway). GradScaler records the answer per device and keeps it
    private until its ``step``; the method must know before it (the tests pin this reading)."""
    return not any(bool(found) for found in scaler._found_inf_per_device(optimizer).values())


def after_step(controller: MethodController, step: int, outcome: StepOutcome, device: torch.device) -> StepOutcome:
    """The controller's ``after_step(step)`` under the method's profiler label, recorded in
    ``outcome``: what it changed and, where it changed something, its wall seconds (the
    device's queue drained first, so they are the update's)."""
    started = time.perf_counter()
    with torch.profiler.record_function(METHOD_LABEL):
        outcome.changed = controller.after_step(step)
    if outcome.changed is not None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        outcome.update_seconds = time.perf_counter() - started
    return outcome
