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
(``BarterSettings.pruning_score`` and ``receiver_rule``, compared over seeds in notebook 05) are

* pruning score ``taylor-abs``: ``EMA[|sum_j W_j g_j|]`` (the same Taylor term, its size
  averaged instead of its square: less dominated by a few large mini-batches);
  ``magnitude``: ``EMA[||W_out[:, i]||^2]`` (no gradient: the unit's output-weight energy);
* receiver rule ``mean-pressure``: ``P_l = mean_i g_i``, the layer whose input weights are
  pushed hardest on average.

The default pruning score (:data:`DEFAULT_PRUNING_SCORE`, for this class and for BARTER
alike) is ``magnitude``, chosen on validation over paired seeds (notebook 05): with the
Taylor score the heads flowed into the first layer and left the last nearly empty, an
allocation worse than the even one; with the magnitude score they spread towards the later
layers. ``P_l`` averages whichever pruning score is used, so the score also picks the
receiver.

Every EMA is bias-corrected by its own age (``ema / (1 - beta^age)``), so a unit born a few
steps ago is comparable with an old one; units of age 0 have no statistics yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import time

import torch
from torch import nn
from torch.autograd import Variable

from ..errors import BarterError, choose
from .surgery import UNIT_KINDS, unit_count, unit_parameters


#: per-step pruning scores of a unit, from its output weights (module docstring)
PRUNING_SCORES = ("taylor-squared", "taylor-abs", "magnitude")
#: the pruning score of :class:`UnitStatistics` unless it is given another, and of BARTER
#: (``BarterSettings.pruning_score``): one default for both
DEFAULT_PRUNING_SCORE = "magnitude"
#: what a layer's growth priority P_l averages: its units' pruning or growth scores
RECEIVER_RULES = ("mean-importance", "mean-pressure")
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

    def growth_priority(self, rule: str = "mean-importance") -> float:
        """``P_l``: the mean pruning score (``mean-importance``) or growth score
        (``mean-pressure``) over the units that have statistics (0 if none)."""
        scores = self.pruning_scores() if rule == "mean-importance" else self.growth_scores()
        known = scores[~scores.isnan()]
        return float(known.mean()) if known.numel() else 0.0

    def observe_pruning_score(self, per_unit_score: torch.Tensor) -> None:
        self.pruning_ema.mul_(self.beta).add_(per_unit_score, alpha=1 - self.beta)
        self.age += 1

    def observe_growth_score(self, per_unit_grad_sq: torch.Tensor) -> None:
        self.growth_ema.mul_(self.beta).add_(per_unit_grad_sq, alpha=1 - self.beta)

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
        # checkpoints written before the fields were renamed keep them as importance, pressure
        self.pruning_ema = state.get("pruning_ema", state.get("importance")).to(device)
        self.growth_ema = state.get("growth_ema", state.get("pressure")).to(device)
        self.age = state["age"].to(device)
        self.beta = float(state["beta"])


def _per_unit(values: torch.Tensor, groups: int, num_units: int, width: int) -> torch.Tensor:
    return values.view(groups, num_units, width).sum(dim=(0, 2))


@torch.no_grad()
def output_scores(param: torch.Tensor, score: str, groups: int, width: int, axis: int) -> torch.Tensor:
    """One step's pruning score of every unit whose output weights ``param`` holds (units
    along ``axis``, ``width`` entries each, in ``groups`` groups): ``(sum_j W_j g_j)^2``
    (``taylor-squared``), ``|sum_j W_j g_j|`` (``taylor-abs``) or ``||W_out[:, i]||^2``
    (``magnitude``), ``g`` being ``param.grad``."""
    other = 1 - axis
    num_units = param.shape[axis] // (groups * width)
    if score == "magnitude":
        return _per_unit(param.square().sum(dim=other), groups, num_units, width)
    taylor = _per_unit((param * param.grad).sum(dim=other), groups, num_units, width)
    return taylor.square() if score == "taylor-squared" else taylor.abs()


@dataclass
class _KindTensors:
    """What one step's statistics of one unit kind read, over all layers at once: the input
    and output weights of every layer (rows resp. columns are units' entries), which unit of
    the flat statistics each row / column belongs to (None where that is the row itself), and
    the flat statistics the layers' :class:`LayerStatistics` are views of."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    input_units: torch.Tensor | None
    output_units: torch.Tensor | None
    pruning_ema: torch.Tensor
    growth_ema: torch.Tensor
    age: torch.Tensor


def _unit_index(specs: list, counts: list[int], device) -> torch.Tensor | None:
    """For each row (input) or column (output) of the layers' tensors concatenated along the
    unit axis, the flat index of the unit it belongs to; None when that is the position itself
    (one group of width one: an FFN channel)."""
    if all(spec.groups == 1 and spec.width == 1 for spec in specs):
        return None
    index, offset = [], 0
    for spec, count in zip(specs, counts):
        units = torch.arange(count, device=device).repeat_interleave(spec.width).repeat(spec.groups)
        index.append(units + offset)
        offset += count
    return torch.cat(index)


def _per_unit_sums(values: torch.Tensor, units: torch.Tensor | None, num_units: int) -> torch.Tensor:
    if units is None:
        return values
    return torch.zeros(num_units, dtype=values.dtype, device=values.device).index_add_(0, units, values)


@dataclass
class UnitStatistics:
    """Statistics of every layer and unit kind of a compact model, gathered once per backward.

    ``layers[kind][l]`` is the :class:`LayerStatistics` of layer ``l``: views of one flat
    tensor per kind, so that a step's statistics of all layers are a few batched operations
    (one concatenation and one reduction per unit kind and role, one EMA update) rather than
    work per parameter, which on a GPU would be hundreds of small kernel launches a step.
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
    pruning_score: str = DEFAULT_PRUNING_SCORE
    enabled: bool = True
    in_backward: bool = True
    layers: dict[str, list[LayerStatistics]] = field(default_factory=dict)
    #: wall time spent gathering statistics (host time: on a GPU it excludes queued kernels)
    observe_seconds: float = 0.0
    _handles: list = field(default_factory=list)
    _kinds: dict[str, _KindTensors] = field(default_factory=dict)
    _queued: bool = False

    def __post_init__(self) -> None:
        choose("pruning_score", self.pruning_score, PRUNING_SCORES)
        device = next(self.model.parameters()).device
        if not self.layers:
            self.layers = {kind: [LayerStatistics.fresh(unit_count(b, kind), self.beta, device)
                                  for b in self.model.blocks] for kind in UNIT_KINDS}
        self.attach()

    def attach(self) -> None:
        """Gather the weights the model holds now, pack the layers' statistics into one flat
        tensor per kind (the layers keep views of it) and (re)register the hook."""
        self.detach()
        for kind in UNIT_KINDS:
            weights = {"in": [], "out": []}
            for block in self.model.blocks:
                for spec in unit_parameters(block, kind):
                    if spec.name == "weight":
                        weights[spec.role].append(spec)
            stats = self.layers[kind]
            counts = [s.age.numel() for s in stats]
            flat = {name: torch.cat([getattr(s, name) for s in stats])
                    for name in ("pruning_ema", "growth_ema", "age")}
            for name, tensor in flat.items():
                for s, view in zip(stats, tensor.split(counts)):
                    setattr(s, name, view)
            device = flat["age"].device
            self._kinds[kind] = _KindTensors([spec.tensor for spec in weights["in"]],
                                             [spec.tensor for spec in weights["out"]],
                                             _unit_index(weights["in"], counts, device),
                                             _unit_index(weights["out"], counts, device), **flat)
        if self.in_backward:
            tracked = [t for kind in self._kinds.values() for t in kind.inputs + kind.outputs]
            self._queued = False
            self._handles += [t.register_post_accumulate_grad_hook(self._on_accumulated) for t in tracked]

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def observe(self) -> None:
        """Fold the gradients the parameters hold now into the statistics (``in_backward=False``)."""
        self._fold([t.grad for kind in self._kinds.values() for t in kind.inputs + kind.outputs])

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
        self.observe()

    @torch.no_grad()
    def _fold(self, grads: list) -> None:
        """One step's statistics of every kind from ``grads``, the gradients of the kinds'
        input then output weights in :meth:`attach`'s order; a kind changed by a surgery since
        :meth:`attach` is skipped."""
        if not self.enabled:
            return
        start = time.perf_counter()
        with torch.profiler.record_function(PROFILE_LABEL):     # so a profile can tell this work apart
            for name, kind in self._kinds.items():
                count = len(kind.inputs) + len(kind.outputs)
                kind_grads, grads = grads[:count], grads[count:]
                # a surgery since attach() replaced tensors: they are out of this backward
                # (None) or their layers no longer view the flat statistics; attach() again
                replaced = any(s.age._base is not kind.age for s in self.layers[name])
                if replaced or any(g is None for g in kind_grads):
                    continue
                self._fold_kind(kind, kind_grads[:len(kind.inputs)], kind_grads[len(kind.inputs):])
        self.observe_seconds += time.perf_counter() - start

    def _fold_kind(self, kind: _KindTensors, input_grads: list, output_grads: list) -> None:
        """The module docstring's scores for every unit of one kind, then the EMA update."""
        num_units = kind.age.numel()
        outputs = torch.cat(kind.outputs, dim=1)
        if self.pruning_score == "magnitude":
            pruning = _per_unit_sums(outputs.square().sum(dim=0), kind.output_units, num_units)
        else:
            taylor = _per_unit_sums((outputs * torch.cat(output_grads, dim=1)).sum(dim=0),
                                    kind.output_units, num_units)
            pruning = taylor.square() if self.pruning_score == "taylor-squared" else taylor.abs()
        growth = _per_unit_sums(torch.cat(input_grads, dim=0).square().sum(dim=1), kind.input_units, num_units)
        beta = self.beta
        kind.pruning_ema.mul_(beta).add_(pruning, alpha=1 - beta)
        kind.growth_ema.mul_(beta).add_(growth, alpha=1 - beta)
        kind.age += 1

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

