"""What a run steps with, built in one place: :func:`build_parts`.

From a run's settings (:class:`~barter_mini.training.run_config.RunConfig`), its model, its
recipe and its length, :func:`build_parts` makes the optimizer (AdamW over the parameter
groups, capturable under CUDA graphs), the method's controller (optionally wrapped, e.g. by a
probe of its updates), the loss, the execution (compile, recompute, precision: applied to the
model), the fp16 loss scaler and, under ``--cuda-graphs``, the graphed step. The trainer, the
bench, the statistics' overhead timing and the book's walkthrough all take their parts from
here, and :meth:`RunParts.step` is the one place a step chooses between a graph's replay and an
eager :func:`~barter_mini.training.step.training_step`, so what the bench times is what
``train`` runs.

The parts are frozen: a run's controller is the one its graphed step and its checkpoints
hold, and nothing can swap it from outside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..core.configs import ModelConfig
from ..core.execution import Execution
from ..core.method import MethodController
from ..core.models import build_model
from .graphs import GraphedStep, check_graphs_possible
from .methods import MethodSetup, get_method
from .optimization import make_criterion, make_optimizer, resolve_recipe
from .recipes import Recipe
from .run_config import RunConfig
from .step import StepOutcome, training_step


@dataclass(frozen=True)
class RunParts:
    """A run's model, optimizer, controller, loss, execution, loss scaler (fp16, else None)
    and graphed step (``--cuda-graphs``, else None)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    controller: MethodController
    criterion: nn.Module
    execution: Execution
    scaler: torch.amp.GradScaler | None = None
    graphed: GraphedStep | None = None

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int | None, *,
             check_loss: Callable[[torch.Tensor, torch.Tensor], Any] | None = None,
             forward: nn.Module | None = None) -> StepOutcome:
        """Optimizer step number ``step`` (1-based) on ``(x, y)``: the graph's replay where the
        run has one, else :func:`~barter_mini.training.step.training_step` through ``forward``
        (the model, or its DDP replica). ``step`` None: the controller's ``after_step`` is not
        called and the step runs eagerly (the bench times an update apart from its step)."""
        if self.graphed is not None and step is not None:
            return self.graphed(x, y, step, check_loss)
        return training_step(forward if forward is not None else self.model, self.optimizer, x, y,
                             criterion=self.criterion, controller=self.controller, step=step,
                             check_loss=check_loss, execution=self.execution, scaler=self.scaler)


def build_parts(run: RunConfig, model: nn.Module, recipe: Recipe, total_steps: int, device: torch.device, *,
                wrap_controller: Callable[[MethodController], MethodController] | None = None,
                distributed: bool = False) -> RunParts:
    """The parts of ``run`` around ``model`` (already on ``device``), its update schedule laid
    over ``total_steps`` with ``recipe``; ``wrap_controller`` wraps the method's controller
    before anything holds it. One-line errors where the run asks for CUDA graphs it cannot
    have (:func:`~barter_mini.training.graphs.check_graphs_possible`)."""
    execution = run.execution()
    if execution.graphs:
        check_graphs_possible(device, run.method, distributed)
    optimizer = make_optimizer(model, recipe, capturable=execution.graphs)
    controller = get_method(run.method).build(MethodSetup(model, optimizer, run.density, total_steps, recipe,
                                                          run.seed, from_trained=run.init is not None,
                                                          loss_scaled=execution.loss_scaling))
    if wrap_controller is not None:
        controller = wrap_controller(controller)
    execution.apply(model)
    criterion = make_criterion(recipe)
    graphed = GraphedStep(model, optimizer, criterion, controller, execution) if execution.graphs else None
    return RunParts(model, optimizer, controller, criterion, execution, execution.grad_scaler(device), graphed)


def parts_for_new_model(run: RunConfig, config: ModelConfig, total_steps: int, device: torch.device) -> RunParts:
    """:func:`build_parts` around a freshly built model of ``config`` (sized to its data) at the
    width ``run``'s method trains (compact at its density, full for a masked one), on
    ``device``, with ``run``'s own recipe: the parts of a run that starts from nothing."""
    model = build_model(config, get_method(run.method).model_density(run.density)).to(device)
    return build_parts(run, model, resolve_recipe(run, config.family), total_steps, device)
