"""Physical resizing of compact layers: prune, clone with output splitting, optimizer remap.

A *unit* is an attention head or an FFN channel. Each unit owns

* input parameters: a head's q, k and v rows of ``attn.qkv`` (plus bias rows, if any);
  a channel's row of ``mlp.fc1.weight`` and its entry of ``mlp.fc1.bias``;
* output parameters: a head's ``head_dim`` columns of ``attn.proj.weight``; a channel's
  column of ``mlp.fc2.weight``.

Every change of a layer's units is one *regather*: new unit ``j`` is old unit
``sources[j]``. Pruning leaves units out; cloning lists a parent twice. A split clone
multiplies the two copies' output parameters by ``alpha`` and ``1 - alpha``, so the sum of
their contributions, and hence the network function, is unchanged (paper Figure 2).

Optimizer state under a split. The two copies have identical
activations, so their output columns receive exactly the gradient the original column
received, and their input parameters receive the original input gradient times their
output factor ``s`` (``alpha`` or ``1 - alpha``): ``dL/dz_copy = s * dL/dz``. State that is
linear in the gradient (Adam's ``exp_avg``, SGD's ``momentum_buffer``) is therefore scaled
by ``s`` on input parameters and copied on output parameters; quadratic state (``exp_avg_sq``,
``max_exp_avg_sq``) is scaled by ``s**2`` and copied; the step count is kept. With this
state the next Adam step is what it would have been had the split always existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..errors import BarterError
from .budgets import Allocation
from .configs import ModelConfig
from .warmup import WARMUP_AGE

#: how a per-element optimizer state scales with the gradient: linearly or quadratically
STATE_GRADIENT_POWER = {"exp_avg": 1, "momentum_buffer": 1, "exp_avg_sq": 2, "max_exp_avg_sq": 2,
                        WARMUP_AGE: 0}


@dataclass(frozen=True)
class UnitParameter:
    """Where one parameter tensor stores its units.

    Along ``axis`` the tensor holds ``groups`` consecutive groups (q, k, v for ``qkv``),
    each of ``num_units * width`` entries, unit ``u`` at ``[u * width, (u + 1) * width)``.
    ``role`` is ``"in"`` (copied to a clone) or ``"out"`` (split between parent and clone).
    """

    module: nn.Module
    name: str
    axis: int
    width: int
    groups: int
    role: str

    @property
    def tensor(self) -> nn.Parameter:
        return getattr(self.module, self.name)

    def element_index(self, units: torch.Tensor, num_units: int) -> torch.Tensor:
        """Indices along ``axis`` of the entries of ``units`` (in the order given)."""
        offsets = torch.arange(self.width, device=units.device)
        return torch.cat([((g * num_units + units)[:, None] * self.width + offsets).flatten()
                          for g in range(self.groups)])

    def per_element(self, per_unit: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-unit vector to this tensor's shape (for scaling along ``axis``)."""
        values = per_unit.repeat_interleave(self.width).repeat(self.groups)
        shape = [1] * self.tensor.dim()
        shape[self.axis] = -1
        return values.view(shape)


def _head_parameters(block: nn.Module) -> list[UnitParameter]:
    attn = block.attn
    params = [UnitParameter(attn.qkv, "weight", 0, attn.head_dim, 3, "in"),
              UnitParameter(attn.proj, "weight", 1, attn.head_dim, 1, "out")]
    if attn.qkv.bias is not None:
        params.append(UnitParameter(attn.qkv, "bias", 0, attn.head_dim, 3, "in"))
    return params


def _channel_parameters(block: nn.Module) -> list[UnitParameter]:
    mlp = block.mlp
    params = [UnitParameter(mlp.fc1, "weight", 0, 1, 1, "in"),
              UnitParameter(mlp.fc2, "weight", 1, 1, 1, "out")]
    if mlp.fc1.bias is not None:
        params.append(UnitParameter(mlp.fc1, "bias", 0, 1, 1, "in"))
    return params


# timm's modules read these attributes in forward (Attention reshapes with num_heads and
# attn_dim); the Linear attributes keep repr() and state_dict loading honest.
def _set_head_count(block: nn.Module, count: int) -> None:
    attn = block.attn
    attn.num_heads = count
    attn.attn_dim = count * attn.head_dim
    attn.qkv.out_features = 3 * attn.attn_dim
    attn.proj.in_features = attn.attn_dim


def _set_channel_count(block: nn.Module, count: int) -> None:
    block.mlp.fc1.out_features = count
    block.mlp.fc2.in_features = count


@dataclass(frozen=True)
class UnitKind:
    """One kind of unit, everything the surgery needs to know of it: how many a layer holds
    now (``count``) and at full width (``full_width``, from the model's config), the
    parameters each unit owns (``parameters``: where, along which axis, copied or split) and
    how a layer is told its new count (``set_count``). Every operation here and in the
    update reads this table, so a new kind of unit is one entry."""

    name: str
    count: Callable[[nn.Module], int]
    full_width: Callable[[ModelConfig], int]
    parameters: Callable[[nn.Module], list[UnitParameter]]
    set_count: Callable[[nn.Module, int], None]


#: the kinds of unit a compact layer holds: attention heads and FFN channels
UNITS: dict[str, UnitKind] = {
    "heads": UnitKind("heads", lambda block: block.attn.num_heads, lambda config: config.heads_per_layer,
                      _head_parameters, _set_head_count),
    "ffn": UnitKind("ffn", lambda block: block.mlp.fc1.out_features, lambda config: config.ffn_per_layer,
                    _channel_parameters, _set_channel_count),
}
UNIT_KINDS = tuple(UNITS)


def unit_kind(kind: str) -> UnitKind:
    """The :data:`UNITS` entry of ``kind``; a one-line error names the kinds there are."""
    if kind not in UNITS:
        raise BarterError(f"unknown unit kind {kind!r}: choose one of {', '.join(UNIT_KINDS)}")
    return UNITS[kind]


def unit_count(block: nn.Module, kind: str) -> int:
    return unit_kind(kind).count(block)


def check_units(kind: str, units: list[int], count: int, action: str) -> None:
    """Refuse unit indices outside ``0 .. count - 1`` of a layer, naming them."""
    bad = [u for u in units if not 0 <= u < count]
    if bad:
        raise BarterError(f"cannot {action} {kind} {bad}: the layer has {count} {kind}, indices 0..{count - 1}")


def allocation_of(model: nn.Module) -> Allocation:
    """The per-layer head and FFN-channel counts ``model.blocks`` hold right now (any model
    whose layers have a timm ``Attention`` ``.attn`` and ``Mlp`` ``.mlp``)."""
    return Allocation(**{kind: tuple(unit_count(b, kind) for b in model.blocks) for kind in UNIT_KINDS})


def unit_parameters(block: nn.Module, kind: str) -> list[UnitParameter]:
    """The parameters of ``block`` that hold units of ``kind`` (:data:`UNITS`)."""
    return unit_kind(kind).parameters(block)


@torch.no_grad()
def unit_l1_norms(block: nn.Module, kind: str) -> torch.Tensor:
    """Per unit of ``kind``: the L1 norm of all its weights, input and output."""
    count = unit_count(block, kind)
    norms = torch.zeros(count, device=block.mlp.fc1.weight.device)
    for spec in unit_parameters(block, kind):
        other = [d for d in range(spec.tensor.dim()) if d != spec.axis]
        per_entry = spec.tensor.abs().sum(dim=other) if other else spec.tensor.abs()
        norms += per_entry.view(spec.groups, count, spec.width).sum(dim=(0, 2))
    return norms


def remap_optimizer_state(optimizer: torch.optim.Optimizer | None,
                          old: nn.Parameter, new: nn.Parameter,
                          spec: UnitParameter, index: torch.Tensor,
                          gradient_scale: torch.Tensor | None) -> None:
    """Move ``old``'s optimizer state to ``new``, gathered along the unit
    axis.

    ``gradient_scale`` (per new element, or None) is how much larger the new
    entry's gradient is than the old one's; first moments scale by it, second
    moments by its square. The param groups are pointed at ``new``, so LR
    schedulers and weight decay keep working.
    """
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        group["params"] = [new if p is old else p for p in group["params"]]
    state = optimizer.state.pop(old, None)
    if not state:
        return
    remapped = {}
    for key, value in state.items():
        if torch.is_tensor(value) and value.shape == old.shape:
            if key not in STATE_GRADIENT_POWER:
                supported = ", ".join(STATE_GRADIENT_POWER)
                raise BarterError(f"cannot remap optimizer state {key!r}: "
                                  f"supported are {supported} (AdamW, Adam, "
                                  "SGD)")
            value = value.index_select(spec.axis, index)
            if gradient_scale is not None:
                power = STATE_GRADIENT_POWER[key]
                value = value * gradient_scale ** power
        remapped[key] = value
    optimizer.state[new] = remapped


def regather_units(block: nn.Module, kind: str, sources: torch.Tensor, out_scale: torch.Tensor,
                   optimizer: torch.optim.Optimizer | None = None) -> None:
    """Rebuild ``block``'s units of ``kind`` so that new unit ``j`` is old unit ``sources[j]``.

    Output parameters of new unit ``j`` are multiplied by ``out_scale[j]``; input parameters
    are copied. Every touched tensor becomes a new ``nn.Parameter`` and its optimizer state
    is remapped (:func:`remap_optimizer_state`, input gradients scale with ``out_scale``).
    """
    num_old = unit_count(block, kind)
    sources = torch.as_tensor(sources).to(torch.long).flatten()
    bad = sources[(sources < 0) | (sources >= num_old)].tolist()
    if bad:
        raise BarterError(f"cannot regather {kind} from units {bad}: the layer has {num_old}, indices 0..{num_old - 1}")
    if sources.numel() == 0:
        raise BarterError(f"cannot regather {kind} to no units: every layer keeps at least one")
    if torch.as_tensor(out_scale).numel() != sources.numel():
        raise BarterError(f"out_scale has {torch.as_tensor(out_scale).numel()} entries for {sources.numel()} new "
                          f"{kind}: one per new unit")
    for spec in unit_parameters(block, kind):
        old = spec.tensor
        index = spec.element_index(sources.to(old.device), num_old)
        scale = spec.per_element(out_scale.to(old.device, old.dtype))
        with torch.no_grad():
            data = old.detach().index_select(spec.axis, index)
            if spec.role == "out":
                data = data * scale
        new = nn.Parameter(data, requires_grad=old.requires_grad)
        setattr(spec.module, spec.name, new)
        remap_optimizer_state(optimizer, old, new, spec, index, scale if spec.role == "in" else None)
    unit_kind(kind).set_count(block, int(sources.numel()))


def resize_layers(model: nn.Module, allocation: Allocation,
                  keep: dict[str, list[torch.Tensor]] | None = None) -> nn.Module:
    """Resize ``model``'s layers in place to ``allocation``: layer ``l`` keeps the units
    ``keep[kind][l]`` (in their order), by default its first ones. Weights of kept units are
    copied exactly (no output split: nothing is cloned)."""
    for kind in UNIT_KINDS:
        for layer, (block, count) in enumerate(zip(model.blocks, getattr(allocation, kind))):
            units = keep[kind][layer] if keep else torch.arange(count)
            if units.numel() != count:
                raise BarterError(f"layer {layer} keeps {units.numel()} {kind}, the allocation says {count}")
            if units.numel() != unit_count(block, kind) or not torch.equal(units, torch.arange(count)):
                regather_units(block, kind, units, torch.ones(count))
    return model


#: the optimizer states that carry a parameter's momentum (AdamW/Adam, SGD)
MOMENTUM_STATES = ("exp_avg", "momentum_buffer")


@torch.no_grad()
def reset_optimizer_state(block: nn.Module, kind: str, units: torch.Tensor,
                          optimizer: torch.optim.Optimizer | None, only=None) -> None:
    """Zero the per-element optimizer state entries of ``units`` (input and output parameters):
    every one, or those named in ``only`` (e.g. :data:`MOMENTUM_STATES`). The tensor's step
    count is shared by all its entries and is kept."""
    if optimizer is None:
        return
    count = unit_count(block, kind)
    for spec in unit_parameters(block, kind):
        state = optimizer.state.get(spec.tensor)
        if not state:
            continue
        index = spec.element_index(units.to(spec.tensor.device), count)
        for key, value in state.items():
            if (only is None or key in only) and torch.is_tensor(value) and value.shape == spec.tensor.shape:
                value.index_fill_(spec.axis, index, 0.0)


@torch.no_grad()
def perturb_input_parameters(block: nn.Module, kind: str, parents: torch.Tensor, clones: torch.Tensor,
                             alpha: float, scale: float, generator: torch.Generator | None = None) -> None:
    """Antithetic noise on split pairs: parent ``+= (1 - alpha) eps``, clone ``-= alpha eps``.

    ``eps ~ N(0, (scale * rms)^2)`` per entry, rms the root mean square of the parameter.
    The pair's input weights now differ by ``eps``, while the layer's output changes only
    to second order: ``alpha f'(w)(1 - alpha) eps - (1 - alpha) f'(w) alpha eps = 0``.
    """
    count = unit_count(block, kind)
    for spec in unit_parameters(block, kind):
        if spec.role != "in":
            continue
        param = spec.tensor
        parent_index = spec.element_index(parents.to(param.device), count)
        clone_index = spec.element_index(clones.to(param.device), count)
        shape = list(param.shape)
        shape[spec.axis] = parent_index.numel()
        eps = torch.randn(shape, generator=generator).to(param.device, param.dtype)
        eps *= scale * param.pow(2).mean().sqrt()
        param.index_add_(spec.axis, parent_index, (1 - alpha) * eps)
        param.index_add_(spec.axis, clone_index, -alpha * eps)
