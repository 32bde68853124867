"""A compact start cut from a trained dense model (fine-tuning: paper Figure 5, Tables 10, 11).

From scratch, BARTER starts from a randomly initialised compact model. When a trained dense
model exists (a ``--method dense`` run of this package, or a stock timm ViT), the compact
model is *cut* from it: every layer keeps its most important heads and FFN channels, with
their weights unchanged, and the tensors become physically smaller. The model object is the
same; BARTER, the statistics, the surgery, the bench and export then treat it like any
compact model.

Importance (calibration)
    For unit ``i`` with output weights ``W_out[:, i]`` and their gradient ``g``, over ``B``
    calibration batches::

        I_i = 1/B * sum_b (sum_{j in out(i)} W_j g_j^(b))^2

    the first-order Taylor estimate of the squared change of the batch loss when the unit is
    removed (Molchanov et al. 2019; the ``taylor-squared`` score of
    :mod:`~barter_mini.core.strategies`), measured on the data the model will be trained
    on. Why this rule: it asks what removing the unit does to the loss on *that* data, which
    a trained model's weight magnitudes cannot say (a unit with large weights may be idle on
    the new images); and every ``I_i`` estimates the same quantity, a loss change, so the
    scores of different layers can be ranked against each other, which the one-shot
    allocation below needs. (BARTER's own pruning score during training is the output-weight
    magnitude, chosen on validation for a model that is still learning; a cut happens once,
    on a trained model, before any step.)

Allocations
    Both hold exactly the budgets of :func:`~barter_mini.core.budgets.compute_budget`.

    ``even``
        BARTER's start: the budgets spread evenly (or any given allocation); each layer
        keeps its ``n_l`` most important units.
    ``oneshot``
        the COMPOT-style "allocate once, then train static": the units of each kind are
        ranked globally by ``I_i`` and the budget's most important survive, every layer
        keeping at least one (its best) unit. The ``oneshot`` method trains this
        allocation frozen.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from ..errors import BarterError, check_integer, choose
from .budgets import Allocation, Budget, check_allocation, compute_budget, initial_allocation
from .configs import ModelConfig
from .models.timm_vit import describe_timm_vit
from .surgery import UNIT_KINDS, allocation_of, resize_layers, unit_parameters
from .strategies import PRUNING_SCORES

#: how a cut spreads the budgets over the layers (module docstring)
CUT_ALLOCATIONS = ("even", "oneshot")
#: calibration batches a cut measures importance on, unless told
CALIBRATION_BATCHES = 8
#: the per-batch importance of a unit (module docstring): the ``taylor-squared`` pruning score
CALIBRATION_SCORE = PRUNING_SCORES["taylor-squared"]


def full_config(model: nn.Module) -> ModelConfig:
    """The model's full-width configuration: ``model.config`` (the package's models, and
    timm models already described), else read off a stock timm model
    (:func:`~barter_mini.core.models.timm_vit.describe_timm_vit`) and stored there."""
    if getattr(model, "config", None) is None:
        model.config = describe_timm_vit(model)
    return model.config


def calibration_importance(model: nn.Module, batches: Iterable,
                           loss_fn: nn.Module | None = None) -> dict[str, list[torch.Tensor]]:
    """``I_i`` of every unit (module docstring) over ``batches`` of ``(images, labels)``.

    The model is run in eval mode (no dropout or drop-path noise) and its parameters'
    gradients are cleared afterwards; its weights are not changed.
    """
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    device = next(model.parameters()).device
    totals = {kind: [torch.zeros(0)] * len(model.blocks) for kind in UNIT_KINDS}
    was_training, count = model.training, 0
    model.eval()
    try:
        for images, labels in batches:
            model.zero_grad(set_to_none=True)
            loss_fn(model(images.to(device)), labels.to(device)).backward()
            for layer, block in enumerate(model.blocks):
                for kind in UNIT_KINDS:
                    out = next(s for s in unit_parameters(block, kind) if s.role == "out" and s.name == "weight")
                    scores = CALIBRATION_SCORE.of_units(out.tensor, out.groups, out.width, out.axis).cpu()
                    totals[kind][layer] = scores if count == 0 else totals[kind][layer] + scores
            count += 1
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    if count == 0:
        raise BarterError("calibration needs at least one batch of (images, labels)")
    return {kind: [t / count for t in layers] for kind, layers in totals.items()}


def oneshot_allocation(importance: dict[str, list[torch.Tensor]], budget: Budget, config: ModelConfig) -> Allocation:
    """The budgets spread by global rank of importance (module docstring): each layer's best
    unit survives, then the most important of all the others until the budget is spent."""
    counts = {}
    for kind in UNIT_KINDS:
        total = getattr(budget, kind)
        layers = importance[kind]
        if not len(layers) <= total <= sum(len(scores) for scores in layers):
            raise BarterError(f"a budget of {total} {kind} does not fit {len(layers)} layers of this model")
        best = [int(scores.argmax()) for scores in layers]
        rest = [(float(score), layer) for layer, scores in enumerate(layers)
                for unit, score in enumerate(scores.tolist()) if unit != best[layer]]
        rest.sort(key=lambda entry: (-entry[0], entry[1]))
        kept = [1] * len(layers)
        for _, layer in rest[:total - len(layers)]:
            kept[layer] += 1
        counts[kind] = tuple(kept)
    return check_allocation(config, Allocation(heads=counts["heads"], ffn=counts["ffn"]))


def most_important(importance: dict[str, list[torch.Tensor]], allocation: Allocation) -> dict[str, list[torch.Tensor]]:
    """Per kind and layer, the indices of the ``n_l`` most important units, in their order
    in the layer (ties to the lower index)."""
    keep = {}
    for kind in UNIT_KINDS:
        keep[kind] = []
        for scores, count in zip(importance[kind], getattr(allocation, kind)):
            order = sorted(range(len(scores)), key=lambda u: (-float(scores[u]), u))
            keep[kind].append(torch.tensor(sorted(order[:count]), dtype=torch.long))
    return keep


def cut_allocation(model: nn.Module, density: float, importance: dict[str, list[torch.Tensor]],
                   allocation: str | Allocation = "even") -> Allocation:
    """The allocation a cut at ``density`` keeps: ``even``, ``oneshot``, or one given."""
    config = full_config(model)
    budget = compute_budget(config, density)
    if isinstance(allocation, Allocation):
        given = check_allocation(config, allocation)
        if (sum(given.heads), sum(given.ffn)) != (budget.heads, budget.ffn):
            raise BarterError(f"the allocation holds {sum(given.heads)} heads and {sum(given.ffn)} FFN channels; "
                              f"density {density:g} budgets {budget.heads} and {budget.ffn}")
        return given
    choose("allocation", allocation, CUT_ALLOCATIONS)
    if allocation == "oneshot":
        return oneshot_allocation(importance, budget, config)
    return initial_allocation(config, budget)


def cut_to_density(model: nn.Module, density: float, batches: Iterable,
                   allocation: str | Allocation = "even", loss_fn: nn.Module | None = None,
                   max_batches: int = CALIBRATION_BATCHES) -> nn.Module:
    """Cut a trained dense ``model`` in place to the budgets of ``density``: measure
    :func:`calibration_importance` on the first ``max_batches`` of ``batches``, choose the
    allocation (:func:`cut_allocation`) and keep each layer's most important units.

    Returns the same object, with physically smaller tensors and ``model.config`` set.
    Make the optimizer afterwards: the cut replaces the resized parameters.
    """
    config = full_config(model)
    if allocation_of(model) != Allocation(heads=(config.heads_per_layer,) * config.depth,
                                          ffn=(config.ffn_per_layer,) * config.depth):
        raise BarterError("the model is already compact: cut a full-width (dense) model")
    check_integer("max_batches", max_batches)
    limited = (batch for batch, _ in zip(batches, range(max_batches)))
    importance = calibration_importance(model, limited, loss_fn)
    chosen = cut_allocation(model, density, importance, allocation)
    return resize_layers(model, chosen, most_important(importance, chosen))
