"""Statistics of active units, gathered once per step from the ordinary backward pass.

Only the compact tensors exist, so only active units can be scored; nothing here runs an
extra forward or backward pass or builds a dense gradient. Once the gradients of a step are
computed, a per-unit reduction of ``w * g``, ``w ** 2`` or ``g ** 2`` is folded into an
exponential moving average (EMA, factor beta), for all layers of a unit kind at once.

For unit ``i`` of a layer with output parameters ``W_out`` (the head's ``proj`` columns, the
channel's ``fc2`` column) and input parameters ``W_in`` (the head's q, k, v rows, the
channel's ``fc1`` row):

pruning score (first-order Taylor importance, Molchanov et al. 2019)
    ``p_i = EMA[(sum_{j in out(i)} W_j g_j)^2]``. Because ``sum_j W_out[:, i] g_out[:, i]``
    equals ``sum_{batch, tokens} a_i dL/da_i`` for the unit's activation ``a_i``, the bracket
    is the first-order change of the mini-batch loss when the unit is removed; squaring
    before averaging keeps units that matter in either direction. Lowest are pruned first.

growth score (gradient pressure)
    ``g_i = EMA[||dL/dW_in[i]||^2]``: how hard the loss pushes on the unit's input weights.
    After a split the two copies can follow that push in different directions, so the
    units under the most pressure are the most useful parents to clone.

growth priority of a layer
    the mean pruning score of its units, ``P_l = mean_i p_i``: the marginal value of one
    unit in that layer. Capacity flows from the units worth least anywhere to the layer
    whose units are worth most on average, which is the "barter" of the method's name.

The definitions above are the method's as the paper gives them; the alternatives
(``BarterSettings.pruning_score`` and ``receiver_rule``, strategies of
:mod:`~barter_mini.core.strategies`) are

* pruning score ``taylor-abs``: ``EMA[|sum_j W_j g_j|]`` (the same Taylor term, its size
  averaged instead of its square: less dominated by a few large mini-batches);
  ``magnitude``: ``EMA[||W_out[:, i]||^2]`` (no gradient: the unit's output-weight energy);
* receiver rule ``mean-pressure``: ``P_l = mean_i g_i``, the layer whose input weights are
  pushed hardest on average.

The default pruning score (:data:`DEFAULT_PRUNING_SCORE`, for this class and for BARTER
alike) is ``magnitude``, chosen on validation over paired seeds: with the Taylor score the
heads flowed into the first layer and left the last nearly empty, an allocation worse than
the even one; with the magnitude score they spread towards the later layers. ``P_l``
averages whichever pruning score is used, so the score also picks the receiver.

Every EMA is bias-corrected by its own age (``ema / (1 - beta^age)``), so a unit born a few
steps ago is comparable with an old one; units of age 0 have no statistics yet.

The per-unit sums are one ``index_add_`` per step. On a GPU its default kernel adds with
atomics, in whatever order the threads arrive, so the scores, and through them the units
BARTER prunes and clones, can differ in the last bits from run to run of one seed; a tie
broken differently sends the runs apart. By default (``deterministic=True``) the sums run
under PyTorch's deterministic algorithms, which sort the indices first and add in a fixed
order: a seed then fixes the run's choices, at the cost of a sort of a few thousand indices
per step. ``deterministic=False`` keeps the atomic kernel. On the CPU both are the same sum.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
import time
import weakref

import torch
from torch import nn
from torch.autograd import Variable

from ..errors import BarterError
from .strategies import PRUNING_SCORES, RECEIVER_RULES, PruningScore, UnitScore, resolve
from .surgery import UNIT_KINDS, unit_count, unit_parameters


#: the pruning score of :class:`UnitStatistics` unless it is given another, and of BARTER
#: (``BarterSettings.pruning_score``): one default for both
DEFAULT_PRUNING_SCORE = "magnitude"
#: the profiler label of the hooks' work (barter_mini.measure.breakdown counts it as the method's)
PROFILE_LABEL = "barter_mini.unit_statistics"


@dataclass
class LayerStatistics:
    """EMA statistics of the units of one kind in one layer: per unit, the running averages
    of its pruning score (``pruning_ema``) and its growth score (``growth_ema``), not yet
    bias-corrected, and the steps it has been observed (``age``)."""

    pruning_ema: torch.Tensor
    growth_ema: torch.Tensor
    age: torch.Tensor
    beta: float

    @classmethod
    def fresh(cls, num_units: int, beta: float, device=None) -> "LayerStatistics":
        zeros = torch.zeros(num_units, device=device)
        return cls(zeros.clone(), zeros.clone(), torch.zeros(num_units, dtype=torch.long, device=device), beta)

    def _corrected(self, ema: torch.Tensor) -> torch.Tensor:
        correction = 1 - self.beta ** self.age.to(ema.dtype)
        return torch.where(self.age > 0, ema / correction.clamp_min(1e-12), torch.nan)

    def pruning_scores(self) -> torch.Tensor:
        """Bias-corrected pruning scores ``p_i``; NaN where a unit has no statistics yet."""
        return self._corrected(self.pruning_ema)

    def growth_scores(self) -> torch.Tensor:
        """Bias-corrected growth scores ``g_i``; NaN where a unit has no statistics yet."""
        return self._corrected(self.growth_ema)

    def growth_priority(self, rule: str | UnitScore = "mean-importance") -> float:
        """``P_l``: the mean, over the units that have statistics (0 if none), of the unit
        scores ``rule`` reads (a name of :data:`~barter_mini.core.strategies.RECEIVER_RULES`
        or the rule): pruning scores (``mean-importance``) or growth scores (``mean-pressure``)."""
        scores = resolve("receiver_rule", rule, RECEIVER_RULES)(self)
        known = scores[~scores.isnan()]
        return float(known.mean()) if known.numel() else 0.0

    def regather(self, sources: torch.Tensor, reset: torch.Tensor) -> None:
        """Follow a surgery: new unit ``j`` is old ``sources[j]``; ``reset`` units start afresh."""
        sources = sources.to(self.age.device)
        reset = reset.to(self.age.device)
        self.pruning_ema = torch.where(reset, 0.0, self.pruning_ema[sources])
        self.growth_ema = torch.where(reset, 0.0, self.growth_ema[sources])
        self.age = torch.where(reset, 0, self.age[sources])

    def state_dict(self) -> dict:
        return {"pruning_ema": self.pruning_ema.cpu(), "growth_ema": self.growth_ema.cpu(),
                "age": self.age.cpu(), "beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        if state["age"].numel() != self.age.numel():
            raise BarterError(f"the saved statistics hold {state['age'].numel()} units, the layer "
                              f"{self.age.numel()}: load them into the model they were saved from")
        device = self.age.device
        self.pruning_ema = state["pruning_ema"].to(device)
        self.growth_ema = state["growth_ema"].to(device)
        self.age = state["age"].to(device)
        self.beta = float(state["beta"])


@dataclass
class _Packed:
    """What one step's statistics read, over every layer and unit kind at once.

    The input weights of all layers and kinds (the q, k, v rows of ``qkv``, the rows of
    ``fc1``) are all D wide, as are the output weights' columns (``proj``, ``fc2``), so one
    concatenation per role holds every unit's entries. ``input_units`` / ``output_units`` name,
    for each row / column, the unit it belongs to in the flat statistics: units are numbered
    kind by kind, layer by layer; growth scores land ``num_units`` further on. ``ema`` holds
    the pruning (row 0) and growth (row 1) EMAs, ``age`` the ages; the layers'
    :class:`LayerStatistics` hold views of both.
    """

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    input_units: torch.Tensor
    output_units: torch.Tensor
    ema: torch.Tensor
    age: torch.Tensor


def _unit_index(specs: list, counts: list[int], offsets: list[int], device) -> torch.Tensor:
    """For each row (input) or column (output) of the tensors of ``specs`` concatenated along
    the unit axis, the flat index of the unit it belongs to (``counts`` units each, numbered
    from ``offsets``)."""
    index = [torch.arange(count, device=device).repeat_interleave(spec.width).repeat(spec.groups) + offset
             for spec, count, offset in zip(specs, counts, offsets)]
    return torch.cat(index)


def _weak_hook(statistics: "UnitStatistics"):
    """The gradient hook of ``statistics``, holding it weakly. A tensor keeps its hooks in
    C++, where Python's garbage collector cannot see them: a hook holding the statistics
    (and through them the model and its parameters, which hold the hook) would be a cycle
    that is never collected, and every dropped model would stay in memory."""
    owner = weakref.ref(statistics)

    def on_accumulated(param) -> None:
        statistics = owner()
        if statistics is not None:
            statistics._on_accumulated(param)
    return on_accumulated


@contextmanager
def deterministic_algorithms(enabled: bool = True):
    """PyTorch's deterministic algorithms inside the block only (``enabled`` False, or already
    on: nothing changes), the caller's setting restored after it."""
    if not enabled or torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False, warn_only=warn_only)


@dataclass
class UnitStatistics:
    """Statistics of every layer and unit kind of a compact model, gathered once per backward.

    ``layers[kind][l]`` is the :class:`LayerStatistics` of layer ``l``: views of one flat
    tensor, so that a step's statistics of all layers and kinds are a dozen batched
    operations (one concatenation and one reduction per role, one scatter into units, one EMA
    update) rather than work per parameter, which on a GPU would be over a hundred small
    kernel launches a step.
    Call :meth:`attach` again after a surgery replaced parameters (``barter.topology_update``
    does).

    With ``in_backward=True`` the first unit weight whose gradient is accumulated in a
    backward pass (``register_post_accumulate_grad_hook``, which leaves autograd free to hand
    the gradient over without a copy) queues one callback for the end of that pass, which
    folds every gradient in. With
    ``in_backward=False`` no hook is registered and :meth:`observe` reads the gradients once
    ``backward`` is over: in a data-parallel run a hook would see this process's share of the
    batch, while after ``backward`` DDP has averaged the gradients over all of them.
    """

    model: nn.Module
    beta: float = 0.9
    #: a name of :data:`~barter_mini.core.strategies.PRUNING_SCORES` or the score; the score
    #: from construction on
    pruning_score: str | PruningScore = DEFAULT_PRUNING_SCORE
    enabled: bool = True
    in_backward: bool = True
    #: the per-unit sums in a fixed order on every device (the module docstring)
    deterministic: bool = True
    layers: dict[str, list[LayerStatistics]] = field(default_factory=dict)
    #: wall time spent gathering statistics (host time: on a GPU it excludes queued kernels)
    observe_seconds: float = 0.0
    _handles: list = field(default_factory=list)
    _packed: _Packed | None = field(default=None, init=False, repr=False)
    _queued: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.pruning_score = resolve("pruning_score", self.pruning_score, PRUNING_SCORES)
        device = next(self.model.parameters()).device
        if not self.layers:
            self.layers = {kind: [LayerStatistics.fresh(unit_count(b, kind), self.beta, device)
                                  for b in self.model.blocks] for kind in UNIT_KINDS}
        self.attach()

    def attach(self) -> None:
        """Gather the weights the model holds now, pack the layers' statistics into one flat
        tensor (the layers keep views of it) and (re)register the hooks."""
        self.detach()
        specs = {"in": [], "out": []}
        counts, offsets, offset = [], [], 0
        stats = [s for kind in UNIT_KINDS for s in self.layers[kind]]
        for kind in UNIT_KINDS:
            for block, layer in zip(self.model.blocks, self.layers[kind]):
                for spec in unit_parameters(block, kind):
                    if spec.name == "weight":
                        specs[spec.role].append(spec)
                counts.append(layer.age.numel())
                offsets.append(offset)
                offset += counts[-1]
        ema = torch.stack([torch.cat([s.pruning_ema for s in stats]), torch.cat([s.growth_ema for s in stats])])
        age = torch.cat([s.age for s in stats])
        for s, pruning, growth, ages in zip(stats, ema[0].split(counts), ema[1].split(counts), age.split(counts)):
            s.pruning_ema, s.growth_ema, s.age = pruning, growth, ages
        device = age.device
        self._packed = _Packed([spec.tensor for spec in specs["in"]], [spec.tensor for spec in specs["out"]],
                               _unit_index(specs["in"], counts, offsets, device) + offset,
                               _unit_index(specs["out"], counts, offsets, device), ema, age)
        if self.in_backward:
            self._queued = False
            hook = _weak_hook(self)
            self._handles += [t.register_post_accumulate_grad_hook(hook)
                              for t in self._packed.inputs + self._packed.outputs]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def observe(self) -> None:
        """Fold the gradients the parameters hold now into the statistics (``in_backward=False``)."""
        self._fold()

    def tensors(self) -> list[torch.Tensor]:
        """Every statistics tensor, in a fixed order (what a data-parallel run synchronizes)."""
        return [t for layer_stats in self.layers.values() for s in layer_stats
                for t in (s.pruning_ema, s.growth_ema, s.age)]

    def _on_accumulated(self, param) -> None:
        if not self._queued:       # once per backward pass: at its end every gradient is in
            self._queued = True
            Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._queued = False
        self._fold()

    @torch.no_grad()
    def _fold(self) -> None:
        """One step's scores of every unit (the module docstring's), from the gradients the
        weights hold, folded into the EMAs: a dozen operations whatever the depth. Skipped
        where a surgery since :meth:`attach` replaced tensors (their gradients are missing, or
        the layers no longer view the flat statistics: call :meth:`attach` again)."""
        packed = self._packed
        if not self.enabled or any(t.grad is None for t in packed.inputs + packed.outputs):
            return
        if any(s.age._base is not packed.age for layers in self.layers.values() for s in layers):
            return
        start = time.perf_counter()
        with torch.profiler.record_function(PROFILE_LABEL):     # so a profile can tell this work apart
            num_units, score = packed.age.numel(), self.pruning_score
            per_entry = score.terms(torch.cat(packed.outputs, dim=1),
                                    lambda: torch.cat([t.grad for t in packed.outputs], dim=1)).sum(dim=0)
            growth = torch.cat([t.grad for t in packed.inputs], dim=0).square().sum(dim=1)
            scores = torch.zeros(2 * num_units, dtype=packed.ema.dtype, device=packed.ema.device)
            with deterministic_algorithms(self.deterministic):
                scores.index_add_(0, packed.output_units, per_entry).index_add_(0, packed.input_units, growth)
            scores = scores.view(2, num_units)
            score.finish(scores[0])
            packed.ema.mul_(self.beta).add_(scores, alpha=1 - self.beta)
            packed.age += 1
        self.observe_seconds += time.perf_counter() - start

    def state_dict(self) -> dict:
        """Per unit kind, each layer's :meth:`LayerStatistics.state_dict` (tensors shared with
        the live statistics, as in torch's state dicts)."""
        return {kind: [s.state_dict() for s in layer_stats] for kind, layer_stats in self.layers.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on the model it was saved from (same per-layer widths)."""
        for kind, layer_stats in self.layers.items():
            if len(state[kind]) != len(layer_stats):
                raise BarterError(f"the saved {kind} statistics have {len(state[kind])} layers, the model "
                                  f"{len(layer_stats)}")
            for stats, saved in zip(layer_stats, state[kind]):
                stats.load_state_dict(saved)
        self.attach()                  # the loaded tensors replaced the layers' views: pack them anew

