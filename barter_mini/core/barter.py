"""BARTER's topology update, step by step as in the paper's Figure 2.

For each unit kind (attention heads, FFN channels) separately, at every scheduled update:

1. :func:`select_receiver` - the eligible layer with the highest growth priority;
2. :func:`select_donors` - the K eligible units with the lowest pruning scores outside it;
3. :func:`select_parents` - the K units with the highest growth scores inside it;
4. :func:`prune` the donors and :func:`clone` the parents (input parameters copied, output
   parameters split), which resizes the tensors and remaps the optimizer state
   (:func:`barter_mini.core.surgery.remap_optimizer_state`).

The global budgets stay exactly fixed: every update prunes as many units as it clones.
No layer drops below one unit or grows past its full width, and units whose statistics
were reset by a surgery (a clone and its parent) are not pruned before they have gathered
``min_age`` steps of statistics. The schedule (:class:`TransferSchedule`) sets K.
The steps receive the strategies the settings name (:meth:`BarterSettings.strategies`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch
from torch import nn

from ..errors import BarterError, check_in_range, check_integer, choose
from .budgets import Budget
from .strategies import (CLONE_MOMENTS, PARENT_SCORES, PRUNING_SCORES, RECEIVER_RULES, BarterStrategies, CloneMoments,
                         Plan, UnitScore, resolve)
from .unit_statistics import DEFAULT_PRUNING_SCORE, LayerStatistics, UnitStatistics
from .surgery import (UNIT_KINDS, check_units, perturb_input_parameters, regather_units, unit_count,
                      unit_kind)


@dataclass(frozen=True)
class BarterSettings:
    """Knobs of the method. Defaults reproduce Table 3's transfer counts (see TransferSchedule).

    ``random_receiver`` / ``random_donor`` replace the statistic-driven choice by a uniform
    random one (Table 12's ablations; both together are the "random pair" variant).
    """

    delta_t: int = 100
    t_end: float = 0.75
    head_fraction: float = 0.06
    ffn_fraction: float = 0.05625
    transfer_multiplier: float = 1.0
    split_alpha: float = 0.5
    symmetry_noise: float = 1e-2
    stats_beta: float = 0.9
    min_age: int | None = None
    random_receiver: bool = False
    random_donor: bool = False
    #: the clone's optimizer moments (a name of :data:`~barter_mini.core.strategies.CLONE_MOMENTS`),
    #: "fresh" chosen on CIFAR-10 validation over paired seeds against "split"
    clone_moments: str = "fresh"
    #: with clone_moments "warmup": optimizer steps over which a clone's updates ramp in
    #: (core.warmup); None: its protection period (``protected_steps``)
    warmup_steps: int | None = None
    #: the per-step pruning score, which the layer's growth priority averages: the statistics'
    #: own default (core.unit_statistics), chosen on CIFAR-10 validation over paired seeds
    #: against "taylor-squared"
    pruning_score: str = DEFAULT_PRUNING_SCORE
    #: what the growth priority P_l averages: the pruning scores ("mean-importance") or growth scores
    receiver_rule: str = "mean-importance"
    #: what ranks the receiver's parents: their growth scores ("pressure") or pruning scores ("importance")
    parent_score: str = "pressure"
    #: "between-layers": the method, the clones go to the receiver; "within-layer": a control
    #: that replaces every donor by a clone of its own layer's best unit (the same prune and
    #: clone, no unit changes layer: :func:`plan_within_layer`), to tell the moving of units
    #: from the churn of pruning and cloning
    scope: str = "between-layers"

    def validate(self) -> "BarterSettings":
        """Refuse settings the method cannot run with, in one line each."""
        check_integer("delta_t", self.delta_t)
        check_in_range("t_end", self.t_end, 0.0, 1.0, low_open=True)
        for name in ("head_fraction", "ffn_fraction"):
            check_in_range(name, getattr(self, name), 0.0, 1.0)
        check_in_range("split_alpha", self.split_alpha, 0.0, 1.0, low_open=True, high_open=True)
        check_in_range("symmetry_noise", self.symmetry_noise, 0.0, math.inf)
        check_in_range("stats_beta", self.stats_beta, 0.0, 1.0, high_open=True)
        check_in_range("transfer_multiplier", self.transfer_multiplier, 0.0, math.inf, low_open=True)
        if self.min_age is not None:
            check_integer("min_age", self.min_age, minimum=0)
        if self.warmup_steps is not None:
            check_integer("warmup_steps", self.warmup_steps)
        for name, registry in (("clone_moments", CLONE_MOMENTS), ("pruning_score", PRUNING_SCORES),
                               ("receiver_rule", RECEIVER_RULES), ("parent_score", PARENT_SCORES), ("scope", SCOPES)):
            choose(name, getattr(self, name), registry)
        return self

    @property
    def protected_steps(self) -> int:
        """Steps of statistics a reset unit needs before it may be pruned (default delta_t / 2)."""
        return self.min_age if self.min_age is not None else max(1, self.delta_t // 2)

    @property
    def clone_warmup_steps(self) -> int:
        """Steps over which a ``warmup`` clone's updates ramp in."""
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.protected_steps)

    def strategies(self) -> BarterStrategies:
        """The strategies these settings name, looked up once where an update is set up."""
        self.validate()
        return BarterStrategies(RECEIVER_RULES[self.receiver_rule], PARENT_SCORES[self.parent_score],
                                CLONE_MOMENTS[self.clone_moments], SCOPES[self.scope])


@dataclass(frozen=True)
class TransferSchedule:
    """When to update and how many units to move (paper Tables 3 and 16).

    Updates happen every ``delta_t`` optimizer steps up to ``t_end * total_steps``. Over the
    whole schedule ``K_total = multiplier * round(fraction * budget)`` units of each kind are
    moved (fractions 0.06 for heads and 0.05625 for FFN channels reproduce every K_H and K_C
    of Table 3). They are spread over the updates with RigL's cosine decay
    ``k(t) ~ (1 + cos(pi t / T_end)) / 2``: the cumulative share
    ``F(t) = (t + T_end / pi * sin(pi t / T_end)) / T_end`` is normalised to 1 at the last
    update, and update ``t`` moves ``round(K_total F(t)) - round(K_total F(t_prev))`` units, so
    the per-update counts decay and add up to ``K_total`` exactly.
    """

    total_steps: int
    budget: Budget
    settings: BarterSettings = BarterSettings()

    def __post_init__(self) -> None:
        self.settings.validate()
        check_integer("total_steps", self.total_steps)

    @cached_property
    def update_steps(self) -> list[int]:
        """Computed once: the trainer asks at every step (a paper run has thousands)."""
        last = int(self.settings.t_end * self.total_steps)
        return list(range(self.settings.delta_t, last + 1, self.settings.delta_t))

    def is_update(self, step: int) -> bool:
        steps = self.update_steps
        return bool(steps) and step % self.settings.delta_t == 0 and steps[0] <= step <= steps[-1]

    def planned_totals(self) -> dict[str, int]:
        """``K_total = round(multiplier * round(fraction * budget))``: Table 16 doubles K exactly."""
        s = self.settings
        return {"heads": round(s.transfer_multiplier * round(s.head_fraction * self.budget.heads)),
                "ffn": round(s.transfer_multiplier * round(s.ffn_fraction * self.budget.ffn))}

    def _cumulative_share(self, step: int) -> float:
        steps = self.update_steps
        end = self.settings.t_end * self.total_steps

        def share(t: float) -> float:
            return (t + end / math.pi * math.sin(math.pi * t / end)) / end

        return min(1.0, share(step) / share(steps[-1])) if steps else 0.0

    def transfers_at(self, step: int) -> dict[str, int]:
        """Units of each kind to move at ``step`` (0 where ``step`` is no update step)."""
        if not self.is_update(step):
            return {kind: 0 for kind in UNIT_KINDS}
        previous = step - self.settings.delta_t
        now, before = self._cumulative_share(step), self._cumulative_share(previous)
        return {kind: round(total * now) - round(total * before)
                for kind, total in self.planned_totals().items()}


# ----------------------------------------------------------------------------- selection

def select_receiver(stats: list[LayerStatistics], counts: list[int],
                    full_width: int, rng: np.random.Generator | None = None,
                    rule: str | UnitScore = BarterSettings.receiver_rule
                    ) -> int | None:
    """The eligible layer with the highest growth priority ``P_l``, the
    mean of the unit scores ``rule`` reads (random if ``rng``).

    Eligible: below full width and holding at least one unit with statistics
    to clone.
    """
    rule = resolve("receiver_rule", rule, RECEIVER_RULES)
    eligible = [layer for layer, (s, n) in enumerate(zip(stats, counts))
                if n < full_width and bool((s.age > 0).any())]
    if not eligible:
        return None
    if rng is not None:
        return int(rng.choice(eligible))
    return max(eligible, key=lambda layer: stats[layer].growth_priority(rule))


def select_donors(stats: list[LayerStatistics], counts: list[int],
                  receiver: int, k: int, min_age: int,
                  rng: np.random.Generator | None = None
                  ) -> list[tuple[int, int]]:
    """Up to ``k`` (layer, unit) pairs outside ``receiver`` with the lowest
    pruning scores.

    Units younger than ``min_age`` steps are not eligible, and no layer gives
    its last unit. Scores are compared globally, across layers (random order
    if ``rng``).
    """
    candidates = []
    for layer, s in enumerate(stats):
        if layer == receiver:
            continue
        # one read from the device per layer: scores beside who is old enough
        scores, old = torch.stack([s.pruning_scores().double(),
                                   (s.age >= min_age).double()]).tolist()
        candidates += [(score, layer, unit) for unit, (score, old_enough)
                       in enumerate(zip(scores, old)) if old_enough]
    if rng is not None:
        order = rng.permutation(len(candidates))
        candidates = [candidates[i] for i in order]
    else:
        candidates.sort()
    remaining = list(counts)
    donors: list[tuple[int, int]] = []
    for _, layer, unit in candidates:
        if len(donors) == k:
            break
        if remaining[layer] > 1:
            donors.append((layer, unit))
            remaining[layer] -= 1
    return donors


def select_parents(stats: LayerStatistics, k: int,
                   score: str | UnitScore = BarterSettings.parent_score
                   ) -> list[int]:
    """The ``k`` units of the receiver with the highest growth scores
    (``pressure``) or pruning scores (``importance``); unscored units last."""
    ranked = resolve("parent_score", score, PARENT_SCORES)(stats)
    scores = torch.nan_to_num(ranked, nan=-math.inf)
    return torch.topk(scores, k).indices.tolist()


# ----------------------------------------------------------------------------- surgery

def prune(block: nn.Module, kind: str, victims: list[int],
          stats: LayerStatistics,
          optimizer: torch.optim.Optimizer | None) -> None:
    """Remove ``victims`` from the layer's tensors, optimizer state and
    statistics."""
    count = unit_count(block, kind)
    check_units(kind, victims, count, "prune")
    if len(set(victims)) != len(victims):
        twice = sorted({u for u in victims if victims.count(u) > 1})
        raise BarterError(f"cannot prune {kind} {twice} twice: victims "
                          "must be distinct")
    if len(victims) >= count:
        raise BarterError(f"pruning {len(victims)} of {count} {kind} would "
                          "empty the layer: at most all but one may go")
    doomed = set(victims)
    keep = torch.tensor([u for u in range(count) if u not in doomed])
    regather_units(block, kind, keep, torch.ones(len(keep)), optimizer)
    stats.regather(keep, reset=torch.zeros(len(keep), dtype=torch.bool))


def clone(block: nn.Module, kind: str, parents: list[int],
          stats: LayerStatistics, optimizer: torch.optim.Optimizer | None, *,
          alpha: float = BarterSettings.split_alpha,
          symmetry_noise: float = BarterSettings.symmetry_noise,
          generator: torch.Generator | None = None,
          clone_moments: str | CloneMoments = BarterSettings.clone_moments,
          warmup_steps: int = 1) -> None:
    """Append one clone per parent: input parameters copied, output
    parameters split.

    The parent keeps ``alpha`` of its output weights and the clone gets
    ``1 - alpha``, so the layer computes the same function.

    Why symmetry breaking is needed: the two copies see identical inputs and,
    with the optimizer state of :mod:`barter_mini.core.surgery`, gradients
    that differ only by the factor ``alpha / (1 - alpha)``. Adam's update
    ``m / sqrt(v)`` is invariant to that scale, so the copies would keep
    identical input weights for ever and act as one unit. ``symmetry_noise``
    > 0 adds antithetic noise to the pair's input parameters
    (:func:`barter_mini.core.surgery.perturb_input_parameters`), which changes
    the function only to second order; 0 keeps the clone exact. The noise
    alone does not separate the pair under Adam (their relative distance
    stays near ``symmetry_noise``, whatever the noise), so ``clone_moments``
    decides the clone's optimizer state: ``split`` (the remap), ``fresh``,
    ``zero-momentum`` or ``warmup`` over ``warmup_steps``, a policy of
    :data:`~barter_mini.core.strategies.CLONE_MOMENTS` or its name.

    Every default is :class:`BarterSettings`' own: ``fresh`` moments, chosen
    over ``split`` on CIFAR-10 validation (``data/barter_defaults.csv``).
    """
    moments = resolve("clone_moments", clone_moments, CLONE_MOMENTS)
    count, k = unit_count(block, kind), len(parents)
    check_units(kind, parents, count, "clone")
    if len(set(parents)) != k:
        twice = sorted({u for u in parents if parents.count(u) > 1})
        raise BarterError(f"cannot clone {kind} {twice} twice in one update: "
                          "parents must be distinct")
    parent_index = torch.tensor(parents, dtype=torch.long)
    clone_index = torch.arange(count, count + k)
    sources = torch.cat([torch.arange(count), parent_index])
    out_scale = torch.ones(count + k)
    out_scale[parent_index] = alpha
    out_scale[clone_index] = 1 - alpha
    regather_units(block, kind, sources, out_scale, optimizer)
    moments.start(block, kind, clone_index, optimizer, warmup_steps)
    if symmetry_noise > 0:
        perturb_input_parameters(block, kind, parent_index, clone_index,
                                 alpha, symmetry_noise, generator)
    fresh = torch.zeros(count + k, dtype=torch.bool)
    fresh[parent_index] = True
    fresh[clone_index] = True
    stats.regather(sources, reset=fresh)


@dataclass
class Transfer:
    """What one update did to one unit kind: ``donors`` are ``(layer, unit)`` pairs and
    ``parents`` units of ``receiver``; within-layer (no receiver), ``parents`` are ``(layer,
    unit)`` pairs too, each layer cloning as many units as it gives."""

    kind: str
    scheduled: int
    receiver: int | None = None
    donors: list[tuple[int, int]] = field(default_factory=list)
    parents: list = field(default_factory=list)

    @property
    def executed(self) -> int:
        return len(self.parents)


def receiver_room(counts: list[int], receiver: int, full_width: int,
                  k: int) -> int:
    """How many of ``k`` units the receiver can take: no more than it lacks
    of full width, and no more than it holds (every clone needs its own
    parent)."""
    return min(k, full_width - counts[receiver], counts[receiver])


def prune_donors(model: nn.Module, kind: str, donors: list[tuple[int, int]], stats: list[LayerStatistics],
                 optimizer: torch.optim.Optimizer | None) -> None:
    """:func:`prune` the ``(layer, unit)`` donors, one surgery per layer that gives units."""
    for layer in sorted({layer for layer, _ in donors}):
        prune(model.blocks[layer], kind, [u for at, u in donors if at == layer], stats[layer], optimizer)


def plan_between_layers(stats: list[LayerStatistics], counts: list[int], full_width: int, k: int,
                        settings: BarterSettings, strategies: BarterStrategies,
                        rng: np.random.Generator | None = None) -> Plan:
    """The method's steps 1-3: the receiver, up to ``k`` donors outside it and as many parents in
    it; nothing where no layer can receive or none can give."""
    receiver = select_receiver(stats, counts, full_width, rng if settings.random_receiver else None,
                               strategies.receiver_rule)
    if receiver is None:
        return None, [], []
    donors = select_donors(stats, counts, receiver, receiver_room(counts, receiver, full_width, k),
                           settings.protected_steps, rng if settings.random_donor else None)
    if not donors:
        return None, [], []
    return receiver, donors, select_parents(stats[receiver], len(donors), strategies.parent_score)


def plan_within_layer(stats: list[LayerStatistics], counts: list[int], full_width: int, k: int,
                      settings: BarterSettings, strategies: BarterStrategies,
                      rng: np.random.Generator | None = None) -> Plan:
    """The within-layer control's donors and parents: the ``k`` units with the lowest pruning
    scores in every layer (as :func:`select_donors`, no receiver left out), and in each donor's
    layer as many parents, its best units by the parent score that are not donors.

    A layer gives at most half its units, so that each of its clones has a parent of its own.
    """
    # select_donors lets a layer give all but one of ``counts``: n // 2 + 1 caps it at n // 2
    halves = [n // 2 + 1 for n in counts]
    donors = select_donors(stats, halves, -1, k, settings.protected_steps, rng if settings.random_donor else None)
    parents = []
    for layer in sorted({at for at, _ in donors}):
        leaving = {u for at, u in donors if at == layer}
        ranked = select_parents(stats[layer], counts[layer], strategies.parent_score)
        parents += [(layer, u) for u in [u for u in ranked if u not in leaving][:len(leaving)]]
    return None, donors, parents


#: where the clones of an update go, by name (BarterSettings.scope): the planner of steps 1-3
SCOPES = {"between-layers": plan_between_layers, "within-layer": plan_within_layer}


def plan_transfer(model: nn.Module, kind: str, k: int, statistics: UnitStatistics, settings: BarterSettings,
                  rng: np.random.Generator | None = None, strategies: BarterStrategies | None = None) -> Transfer:
    """Steps 1-3: choose the receiver, up to ``k`` donors and as many parents; change nothing.
    ``strategies``: ``settings.strategies()``, looked up here unless the caller holds them."""
    record = Transfer(kind=kind, scheduled=k)
    if k <= 0:
        return record
    strategies = strategies or settings.strategies()
    counts = [unit_count(b, kind) for b in model.blocks]
    full = unit_kind(kind).full_width(model.config)
    record.receiver, record.donors, record.parents = strategies.plan(statistics.layers[kind], counts, full, k,
                                                                     settings, strategies, rng)
    return record


def apply_transfer(model: nn.Module, record: Transfer, statistics: UnitStatistics,
                   optimizer: torch.optim.Optimizer | None, settings: BarterSettings,
                   generator: torch.Generator | None = None, strategies: BarterStrategies | None = None) -> None:
    """Step 4: prune the planned donors, then clone the planned parents in the receiver
    (``strategies`` as in :func:`plan_transfer`).

    Pruning first keeps the receiver's unit indices valid: donors never lie in the receiver.
    """
    if not record.executed:
        return
    stats = statistics.layers[record.kind]
    moments = (strategies or settings.strategies()).clone_moments

    def clone_in(layer: int, parents: list[int]) -> None:
        clone(model.blocks[layer], record.kind, parents, stats[layer], optimizer,
              alpha=settings.split_alpha, symmetry_noise=settings.symmetry_noise, generator=generator,
              clone_moments=moments, warmup_steps=settings.clone_warmup_steps)

    if record.receiver is None:         # within-layer: clones are appended, so the donors keep their places
        for layer in sorted({at for at, _ in record.parents}):
            clone_in(layer, [u for at, u in record.parents if at == layer])
        prune_donors(model, record.kind, record.donors, stats, optimizer)
        return
    prune_donors(model, record.kind, record.donors, stats, optimizer)
    clone_in(record.receiver, record.parents)


def transfer_units(model: nn.Module, kind: str, k: int, statistics: UnitStatistics,
                   optimizer: torch.optim.Optimizer | None, settings: BarterSettings,
                   rng: np.random.Generator | None = None, generator: torch.Generator | None = None,
                   strategies: BarterStrategies | None = None) -> Transfer:
    """Move up to ``k`` units of ``kind`` into the receiving layer (steps 1-4 above)."""
    record = plan_transfer(model, kind, k, statistics, settings, rng, strategies)
    apply_transfer(model, record, statistics, optimizer, settings, generator, strategies)
    return record


def topology_update(model: nn.Module, ks: dict[str, int], statistics: UnitStatistics,
                    optimizer: torch.optim.Optimizer | None, settings: BarterSettings,
                    rng: np.random.Generator | None = None, generator: torch.Generator | None = None,
                    strategies: BarterStrategies | None = None) -> dict[str, Transfer]:
    """One topology update for both unit kinds; re-hooks the statistics on the new tensors."""
    strategies = strategies or settings.strategies()
    records = {kind: transfer_units(model, kind, ks.get(kind, 0), statistics, optimizer,
                                    settings, rng, generator, strategies) for kind in UNIT_KINDS}
    statistics.attach()
    return records
