"""The method's named variants as strategies: the object or function each name selects.

Settings, run configurations, the run cache's keys, the CLI and the notebooks name a variant
by a string (``BarterSettings.pruning_score``, ``receiver_rule``, ``parent_score``,
``clone_moments``). The core looks each name up once, in this module's registries
(:func:`resolve`), where it builds the statistics or the controller, and passes the strategy
inward: the functions that do the work call it and never compare names.

pruning score (:class:`PruningScore`, :data:`PRUNING_SCORES`)
    one step's score of unit ``i`` is ``finish(sum_{j in out(i)} entry(W_j, g_j))`` over its
    output weights ``W_j`` and their gradients ``g_j``. ``taylor-squared``:
    ``(sum_j W_j g_j)^2``, the first-order Taylor importance (Molchanov et al. 2019);
    ``taylor-abs``: ``|sum_j W_j g_j|``; ``magnitude``: ``sum_j W_j^2``, the output weights'
    energy (no gradient).
unit scores a rule ranks by (:data:`RECEIVER_RULES`, :data:`PARENT_SCORES`)
    a layer's pruning scores ``p_i`` (:func:`by_pruning_score`, "importance") or growth scores
    ``g_i`` (:func:`by_growth_score`, "pressure"). The receiver rule averages them into the
    layer's growth priority ``P_l``; the parent score ranks the receiver's units by them.
clone moments (:class:`CloneMoments`, :data:`CLONE_MOMENTS`)
    what a clone's optimizer state starts as, after the surgery's remap gave it half of its
    parent's: ``split`` keeps that (exact: the pair moves in lockstep); ``fresh`` zeroes both
    moments (the clone diverges, but Adam bias-corrects with the tensor's shared step count,
    so its first steps are several times the normal size); ``zero-momentum`` zeroes the first
    moment only (normal step sizes, the parent's momentum separates the two); ``warmup``
    zeroes both and ramps the clone's updates in (SMET's optimizer warm-up,
    :mod:`~barter_mini.core.warmup`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..errors import choose
from .surgery import MOMENTUM_STATES, reset_optimizer_state, unit_count, unit_parameters
from .warmup import start_warmup


def resolve(setting: str, choice: Any, registry: Mapping[str, Any]) -> Any:
    """The strategy ``registry`` holds under the name ``choice``, or ``choice`` itself when it is
    a strategy already; an unknown name is refused in one line naming the ``setting`` and the
    names there are."""
    if not isinstance(choice, str):
        return choice
    choose(setting, choice, registry)
    return registry[choice]


# ----------------------------------------------------------------------------- pruning scores

def taylor_term(weights: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
    """``W_j g_j``: summed over a unit's output weights, the first-order change of the loss
    when the unit is removed."""
    return weights * gradients


def energy_term(weights: torch.Tensor, gradients: None) -> torch.Tensor:
    """``W_j^2``: summed over a unit's output weights, their energy."""
    return weights.square()


def squared_(sums: torch.Tensor) -> torch.Tensor:
    return sums.square_()


def absolute_(sums: torch.Tensor) -> torch.Tensor:
    return sums.abs_()


def unchanged(sums: torch.Tensor) -> torch.Tensor:
    return sums


@dataclass(frozen=True)
class PruningScore:
    """One step's pruning score of a unit: ``finish(sum_{j in out(i)} entry(W_j, g_j))`` (the
    module docstring). :meth:`of_units` scores one layer's output weights; the statistics'
    fold scores every layer's at once with the same :attr:`entry` and :attr:`finish`."""

    name: str
    #: ``entry(W, g)``, elementwise: each output weight's term (``g`` None where the score
    #: reads no gradient)
    entry: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
    #: applied in place to each unit's sum of terms
    finish: Callable[[torch.Tensor], torch.Tensor]
    #: whether :attr:`entry` reads the gradients (where not, nobody gathers them)
    reads_gradient: bool = True

    def terms(self, weights: torch.Tensor, gradients: Callable[[], torch.Tensor]) -> torch.Tensor:
        """:attr:`entry` of every weight; ``gradients()`` is called only where the score reads them."""
        return self.entry(weights, gradients() if self.reads_gradient else None)

    @torch.no_grad()
    def of_units(self, param: torch.Tensor, groups: int, width: int, axis: int) -> torch.Tensor:
        """The score of every unit whose output weights ``param`` holds (units along ``axis``,
        ``width`` entries each, in ``groups`` groups), ``g`` being ``param.grad``."""
        num_units = param.shape[axis] // (groups * width)
        per_entry = self.terms(param, lambda: param.grad).sum(dim=1 - axis)
        return self.finish(per_entry.view(groups, num_units, width).sum(dim=(0, 2)))


#: the pruning scores by name (``BarterSettings.pruning_score``, ``UnitStatistics.pruning_score``)
PRUNING_SCORES = {"taylor-squared": PruningScore("taylor-squared", taylor_term, squared_),
                  "taylor-abs": PruningScore("taylor-abs", taylor_term, absolute_),
                  "magnitude": PruningScore("magnitude", energy_term, unchanged, reads_gradient=False)}


# ----------------------------------------------------------------------------- unit scores

#: a rule's reading of a layer's statistics (a ``LayerStatistics``): one score per unit, NaN
#: where a unit has no statistics yet
UnitScore = Callable[[Any], torch.Tensor]


def by_pruning_score(stats) -> torch.Tensor:
    """A layer's bias-corrected pruning scores ``p_i`` (its units' "importance")."""
    return stats.pruning_scores()


def by_growth_score(stats) -> torch.Tensor:
    """A layer's bias-corrected growth scores ``g_i`` (the "pressure" on its units)."""
    return stats.growth_scores()


#: what a layer's growth priority ``P_l`` averages, by name (``BarterSettings.receiver_rule``)
RECEIVER_RULES = {"mean-importance": by_pruning_score, "mean-pressure": by_growth_score}
#: what ranks a receiver's units as parents, by name (``BarterSettings.parent_score``)
PARENT_SCORES = {"pressure": by_growth_score, "importance": by_pruning_score}


# ----------------------------------------------------------------------------- clone moments

def keep_split_moments(block: nn.Module, kind: str, clones: torch.Tensor,
                       optimizer: torch.optim.Optimizer | None, warmup_steps: int) -> None:
    """``split``: the remap's moments stay as they are."""


def zero_moments(block: nn.Module, kind: str, clones: torch.Tensor,
                 optimizer: torch.optim.Optimizer | None, warmup_steps: int) -> None:
    """``fresh``: every optimizer state entry of the clones zeroed."""
    reset_optimizer_state(block, kind, clones, optimizer)


def zero_first_moment(block: nn.Module, kind: str, clones: torch.Tensor,
                      optimizer: torch.optim.Optimizer | None, warmup_steps: int) -> None:
    """``zero-momentum``: the clones' momentum zeroed, their split second moment kept."""
    reset_optimizer_state(block, kind, clones, optimizer, only=MOMENTUM_STATES)


def zero_moments_and_warm_up(block: nn.Module, kind: str, clones: torch.Tensor,
                             optimizer: torch.optim.Optimizer | None, warmup_steps: int) -> None:
    """``warmup``: as ``fresh``, and the clones' entries marked as born now, so that their
    updates ramp in over ``warmup_steps`` optimizer steps."""
    reset_optimizer_state(block, kind, clones, optimizer)
    count = unit_count(block, kind)
    for spec in unit_parameters(block, kind):
        born = torch.zeros(spec.tensor.shape, dtype=torch.bool, device=spec.tensor.device)
        born.index_fill_(spec.axis, spec.element_index(clones.to(born.device), count), True)
        start_warmup(optimizer, spec.tensor, born, warmup_steps)


@dataclass(frozen=True)
class CloneMoments:
    """What a clone's optimizer state starts as (the module docstring): :attr:`start` sets it
    right after the surgery's remap; where :attr:`ramps_in`, the clones' updates then ramp in
    (the controller runs a :class:`~barter_mini.core.warmup.UpdateWarmup`)."""

    #: ``start(block, kind, clone_units, optimizer, warmup_steps)``
    start: Callable[[nn.Module, str, torch.Tensor, torch.optim.Optimizer | None, int], None]
    ramps_in: bool = False


#: the clone-moment policies by name (``BarterSettings.clone_moments``)
CLONE_MOMENTS = {"split": CloneMoments(keep_split_moments), "fresh": CloneMoments(zero_moments),
                 "zero-momentum": CloneMoments(zero_first_moment),
                 "warmup": CloneMoments(zero_moments_and_warm_up, ramps_in=True)}


# ----------------------------------------------------------------------------- all of them

#: a unit kind's ``(receiver, donors, parents)`` for one update, as in ``barter.Transfer``
#: (no receiver: None)
Plan = tuple[int | None, list[tuple[int, int]], list]


@dataclass(frozen=True)
class BarterStrategies:
    """The strategies a ``BarterSettings`` names (``BarterSettings.strategies()``); its pruning
    score belongs to the statistics."""

    receiver_rule: UnitScore
    parent_score: UnitScore
    clone_moments: CloneMoments
    #: ``BarterSettings.scope``'s planner of an update's steps 1-3 (``barter.SCOPES``):
    #: ``plan(stats, counts, full_width, k, settings, strategies, rng) -> Plan``
    plan: Callable[..., Plan]
