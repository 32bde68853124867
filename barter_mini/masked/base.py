"""Full-tensor masked dynamic sparse training: what the baselines share.

A masked method keeps the model at full width (build it with ``build_model(config, 1.0)``)
and puts a binary mask on the four weight matrices of every encoder layer: ``attn.qkv``,
``attn.proj``, ``mlp.fc1`` and ``mlp.fc2`` (:func:`masked_tensors`). Everything else
(tokenizer, norms, biases, positional embedding, pooling, classifier) stays dense, as in the
reference implementations, which leave the first and last layers alone. *Density* is the
fraction of those four kinds of weights that is active.

How the trainer drives a method (``before_step`` / ``after_step``)::

    loss.backward()
    dst.before_step()          # read dense gradients (update steps only), then mask them
    optimizer.step()
    step += 1
    dst.after_step(step)       # re-apply the masks; on schedule, drop and grow

Keeping masked weights at exactly zero. Masking only the weights after the step is not
enough with AdamW: the moments of an inactive weight would grow from its (dense) gradient
and leak into it at the next step. So the gradient is masked *before* the step (an inactive
weight then sees a zero gradient, its Adam moments or SGD momentum stay zero, and AdamW's
decoupled decay of a zero is zero) and ``param.mul_(mask)`` is re-applied after every step
as well. When a weight is dropped, its value and every per-element optimizer state entry
(``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``, ``momentum_buffer``, whatever has the
parameter's shape) are zeroed; a grown weight starts at 0 with zeroed state (the RigL
convention; ``MaskedSettings.regrow_moments="reset"``) or, with ``"warmup"``, starts so and has
its updates ramped in over ``warmup_steps`` (SMET's optimizer warm-up, :mod:`barter_mini.core.warmup`);
Adam's step count is shared by the tensor and is kept. (rigl-torch masks only
SGD momentum and leaves Adam moments of inactive weights alone; this harness does not.)

Schedule (RigL, :class:`MaskSchedule`): an update every ``delta_t`` optimizer steps up to
``t_end * total_steps``; at step ``t`` the drop fraction is
``alpha / 2 * (1 + cos(pi * t / (t_end * total_steps)))``. Unstructured methods drop
``n = round(fraction * active)`` weights per tensor and grow as many, so the density is
preserved exactly (SNFS moves the regrowth between tensors, SRigL and S2ViTE have their own
granularity: see their modules).

Growth candidates. The weights that were inactive before the update come first; a weight
dropped in the same update is only re-picked when a tensor has too few inactive weights left
(above density ~0.77 at alpha = 0.3), and then keeps its value, as in rigl-torch. The
references let a just-dropped weight compete with the inactive ones on equal terms.

Initial masks are uniform: every masked tensor gets ``round(rho * numel)`` active weights at
seeded random positions. The reference RigL uses ERK, which makes small-fan layers denser;
here all masked tensors of a model are of comparable size (``3A x D``, ``D x A``, ``F x D``,
``D x F``) and the point is a like-for-like comparison with BARTER's budgets, which give every
layer ``rho`` of its heads and FFN channels, so a uniform ``rho`` per tensor is the matching
allocation.

Initial masks from a trained dense model (fine-tuning, ``init_from_weights=True``): the
same counts, at the largest-magnitude weights instead of random positions (one-shot
magnitude pruning, the usual start of sparse fine-tuning); each method states its own
granularity (SRigL per row, S2ViTE per head and neuron).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from torch import nn

from ..core import distributed
from ..core.budgets import check_density
from ..core.method import MethodController, check_finite
from ..core.warmup import UpdateWarmup, start_warmup
from ..errors import BarterError, check_in_range, check_integer, choose
from .selection import drop_smallest, grow_largest

#: what a regrown weight's optimizer state starts as, by name (MaskedSettings.regrow_moments):
#: zeroed either way; whether its updates then ramp in (the module docstring)
REGROW_MOMENTS = {"reset": False, "warmup": True}
#: the masked weight of each layer, by kind: (module path inside the block, attribute)
MASKED_KINDS = ("qkv", "proj", "fc1", "fc2")


@dataclass(frozen=True)
class MaskedSettings:
    """Knobs of the masked baselines (defaults: the references' ViT settings)."""

    delta_t: int = 100          # optimizer steps between mask updates
    t_end: float = 0.75         # fraction of training after which masks are frozen
    alpha: float = 0.3          # initial drop fraction, cosine-decayed to 0 at t_end
    srigl_gamma_sal: float = 0.95   # SRigL: minimum salient share of a row's fan-in
    s2vite_death_rate: float = 0.5  # S2ViTE: initial death rate, cosine-decayed
    s2vite_t_end: float = 0.8       # S2ViTE: fraction of training with updates
    regrow_moments: str = "reset"   # a regrown weight's optimizer state: "reset" (zeroed) or "warmup"
    warmup_steps: int | None = None  # "warmup": steps over which its updates ramp in (None: delta_t / 2)

    def validate(self) -> "MaskedSettings":
        check_integer("delta_t", self.delta_t)
        for name in ("t_end", "s2vite_t_end"):
            check_in_range(name, getattr(self, name), 0.0, 1.0, low_open=True)
        for name in ("alpha", "srigl_gamma_sal", "s2vite_death_rate"):
            check_in_range(name, getattr(self, name), 0.0, 1.0)
        choose("regrow_moments", self.regrow_moments, REGROW_MOMENTS)
        if self.warmup_steps is not None:
            check_integer("warmup_steps", self.warmup_steps)
        return self

    @property
    def regrow_warmup_steps(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.delta_t // 2)


@dataclass(frozen=True)
class MaskSchedule:
    """When masks change and by how much (RigL's cosine-decayed drop fraction)."""

    total_steps: int
    delta_t: int
    t_end: float
    alpha: float

    @property
    def end(self) -> float:
        """``T_end``: the last step at which the masks may change."""
        return self.t_end * self.total_steps

    @property
    def update_steps(self) -> list[int]:
        return [s for s in range(self.delta_t, self.total_steps + 1, self.delta_t) if s <= self.end]

    def is_update(self, step: int) -> bool:
        return step >= self.delta_t and step % self.delta_t == 0 and step <= self.end

    def fraction(self, step: float) -> float:
        """``alpha / 2 * (1 + cos(pi * step / T_end))``; 0 after ``T_end``."""
        if step > self.end:
            return 0.0
        return self.alpha / 2 * (1 + math.cos(math.pi * step / self.end))


@dataclass(frozen=True)
class MaskedTensor:
    """One masked weight: ``model.blocks[layer]``'s ``kind`` matrix, called ``name`` in the model."""

    name: str
    layer: int
    kind: str
    module: nn.Linear

    @property
    def param(self) -> nn.Parameter:
        return self.module.weight


def masked_tensors(model: nn.Module) -> list[MaskedTensor]:
    """The four weights of every layer that the masked methods sparsify, in layer order."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or len(blocks) == 0:
        raise BarterError("masked methods need a model with .blocks of layers (attn.qkv, attn.proj, mlp.fc1, mlp.fc2)")
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = []
    for layer, block in enumerate(blocks):
        modules = {"qkv": block.attn.qkv, "proj": block.attn.proj, "fc1": block.mlp.fc1, "fc2": block.mlp.fc2}
        for kind in MASKED_KINDS:
            tensors.append(MaskedTensor(names[id(modules[kind].weight)], layer, kind, modules[kind]))
    return tensors


# ----------------------------------------------------------------------------- base class

class MaskedDST(MethodController):
    """Base of the masked methods: masks, schedule, gradient/state hygiene, records.

    A subclass states its rule in ``_next_masks`` (new masks from the old ones, the
    weights and whatever gradients it gathered). ``needs_dense_gradient`` makes
    :meth:`before_step` keep a copy of every masked tensor's dense gradient at update steps,
    before the gradient is masked (in a masked full-tensor model the backward pass produces
    the dense gradient anyway, so this costs a copy, not extra compute).
    """

    name: ClassVar[str] = "masked"
    needs_dense_gradient: ClassVar[bool] = False

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, density: float,
                 total_steps: int, settings: MaskedSettings = MaskedSettings(), seed: int = 0,
                 init_from_weights: bool = False):
        self.target_density = check_density(density)
        #: initial masks keep the largest weights of a trained model instead of random ones
        self.init_from_weights = bool(init_from_weights)
        check_integer("total_steps", total_steps)
        if not isinstance(settings, MaskedSettings):
            raise BarterError(f"settings must be MaskedSettings, got {type(settings).__name__}")
        self.settings = settings.validate()
        self.model, self.optimizer = model, optimizer
        self.total_steps = int(total_steps)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(int(seed))
        self.tensors = masked_tensors(model)
        self.schedule = self._make_schedule()
        self.step = 0                 # optimizer steps seen by after_step
        self.history: list[dict] = []
        #: updates after which every process of a data-parallel run was checked to hold the same masks
        self.rank_checks = 0
        self._dense_grads: dict[str, torch.Tensor] = {}
        self.warmup = (UpdateWarmup(optimizer, self.settings.regrow_warmup_steps)
                       if REGROW_MOMENTS[self.settings.regrow_moments] else None)
        self._masks: dict[str, torch.Tensor] = self._initial_masks()
        #: the masks in their tensors' dtype, and the mask set they were made from
        self._multipliers: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
        self._multipliers_of: dict | None = None
        with torch.no_grad():
            for param, mask in self._enforced():
                param.mul_(mask)
                self._zero_state(param, mask)

    # ---------------------------------------------------------------- hooks for subclasses

    def _make_schedule(self) -> MaskSchedule:
        s = self.settings
        return MaskSchedule(self.total_steps, s.delta_t, s.t_end, s.alpha)

    def _initial_masks(self) -> dict[str, torch.Tensor]:
        """Uniform: ``round(rho * numel)`` (at least 1) active weights per tensor, at random
        positions, or at the largest ``|w|`` with ``init_from_weights``."""
        masks = {}
        for t in self.tensors:
            numel = t.param.numel()
            k = max(1, round(self.target_density * numel))
            if self.init_from_weights:
                chosen = torch.topk(t.param.detach().abs().flatten().cpu(), k).indices
            else:
                chosen = torch.randperm(numel, generator=self.generator)[:k]
            mask = torch.zeros(numel, dtype=torch.bool)
            mask[chosen] = True
            masks[t.name] = mask.view_as(t.param).to(t.param.device)
        return masks

    def _enforced(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        """(parameter, mask) pairs multiplied into parameters and gradients."""
        return [(t.param, self._masks[t.name]) for t in self.tensors]

    def _enforced_names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def _enforced_multipliers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The enforced parameters and their masks in the parameters' dtype, made once per set
        of masks (every update makes a new ``_masks``). ``torch._foreach_mul_`` multiplies
        same-dtype lists in one fused kernel per chunk of tensors, but a float tensor times a
        bool mask takes its per-tensor path (a launch per tensor, every step). The copies cost
        4 bytes per masked weight beside the bool masks; ``x * 1.0`` and ``x * 0.0`` equal
        ``x * True`` and ``x * False`` bit for bit, signed zeros and NaN included."""
        if self._multipliers_of is not self._masks:
            pairs = self._enforced()
            self._multipliers = ([param for param, _ in pairs], [mask.to(param.dtype) for param, mask in pairs])
            self._multipliers_of = self._masks
        return self._multipliers

    def _observe_gradients(self, update_next: bool) -> None:
        """Called by :meth:`before_step` with the dense (not yet masked) gradients."""
        if self.needs_dense_gradient and update_next:
            for t in self.tensors:
                grad = t.param.grad
                self._dense_grads[t.name] = (torch.zeros_like(t.param) if grad is None
                                             else grad.detach().clone())

    def _next_masks(self, step: int, fraction: float) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _record_extra(self, old: dict[str, torch.Tensor]) -> dict:
        return {}

    def _after_step_hook(self) -> None:
        pass

    # ---------------------------------------------------------------- trainer interface

    @torch.no_grad()
    def before_step(self) -> None:
        """After ``loss.backward()``, before ``optimizer.step()``: read, then mask gradients."""
        update_next = self.schedule.is_update(self.step + 1)
        if update_next:                 # the gradients (or estimates made of them) decide after this step
            check_finite([t.param.grad for t in self.tensors], self.step + 1, f"{self.name}'s gradients")
        self._observe_gradients(update_next)
        params, multipliers = self._enforced_multipliers()
        masked = [(param.grad, mask) for param, mask in zip(params, multipliers) if param.grad is not None]
        if masked:
            torch._foreach_mul_(*map(list, zip(*masked)))
        if self.warmup is not None:
            self.warmup.before_step()

    def graph_safe(self, step: int) -> bool:
        """Replayable from a CUDA graph unless the masks are updated after ``step`` (then
        :meth:`before_step` checks the gradients on the host and keeps the dense ones, and
        S2ViTE's hooks record), the regrown weights' optimizer state warms up (host work every
        step) or the gradients are averaged over processes. Otherwise :meth:`before_step` is
        kernels only (mask the gradients; SNFS: update its momentum) and the same every step."""
        return not self.schedule.is_update(step) and self.warmup is None and not distributed.is_distributed()

    @torch.no_grad()
    def after_step(self, step: int) -> dict | None:
        """After ``optimizer.step()`` (``step`` counts from 1): re-mask; update on schedule."""
        self.step = int(step)
        if self.warmup is not None:
            self.warmup.after_step()
        params, multipliers = self._enforced_multipliers()
        if params:
            torch._foreach_mul_(params, multipliers)
        record = None
        if self.schedule.is_update(self.step):
            record = self._update(self.step)
        self._dense_grads.clear()
        self._after_step_hook()
        return record

    def _missing_gradient(self, name: str):
        raise BarterError(f"{self.name} needs the dense gradient of {name} at update step {self.step}: "
                          "call before_step() after loss.backward() and before optimizer.step()")

    def dense_grad(self, name: str) -> torch.Tensor:
        if name not in self._dense_grads:
            self._missing_gradient(name)
        return self._dense_grads[name]

    def _update(self, step: int) -> dict:
        fraction = self.schedule.fraction(step)
        old = {name: m.clone() for name, m in self._masks.items()}
        old_enforced = [m.clone() for _, m in self._enforced()]
        self._masks = self._next_masks(step, fraction)
        for (param, new), before in zip(self._enforced(), old_enforced):
            keep = before & new          # active before and after: value and state survive
            param.mul_(keep)
            self._zero_state(param, keep)
            if self.warmup is not None:
                start_warmup(self.optimizer, param, new & ~before, self.warmup.steps)
        record = {"step": step, "fraction": fraction,
                  "dropped": {n: int((old[n] & ~m).sum()) for n, m in self._masks.items()},
                  "grown": {n: int((m & ~old[n]).sum()) for n, m in self._masks.items()},
                  **self._record_extra(old), "density": self.density()}
        self.history.append(record)
        if distributed.is_distributed():    # decided from DDP's averaged gradients: the same everywhere
            distributed.check_same_on_every_rank("masks", self._masks, step)
            self.rank_checks += 1
        return record

    def _zero_state(self, param: nn.Parameter, keep: torch.Tensor) -> None:
        """Zero every per-element optimizer state entry of ``param`` where ``keep`` is False."""
        state = self.optimizer.state.get(param) if self.optimizer is not None else None
        if not state:
            return
        for value in state.values():
            if torch.is_tensor(value) and value.shape == param.shape and value.is_floating_point():
                value.mul_(keep)

    # ---------------------------------------------------------------- reporting

    def density(self) -> float:
        """Active fraction of the masked weights right now."""
        active = sum(int(m.sum()) for m in self._masks.values())
        return active / sum(m.numel() for m in self._masks.values())

    def masks(self) -> dict[str, torch.Tensor]:
        """Parameter name -> bool mask of active weights (copies)."""
        return {name: m.clone() for name, m in self._masks.items()}

    def enforced_masks(self) -> dict[str, torch.Tensor]:
        """Parameter name -> the mask actually multiplied into that parameter and its gradient."""
        return {name: m.clone() for name, (_, m) in zip(self._enforced_names(), self._enforced())}

    # ---------------------------------------------------------------- the method protocol

    def changing_steps(self) -> list[int]:
        return list(self.schedule.update_steps)

    def metrics(self) -> dict:
        return {**super().metrics(), "mask": {**self.summary(), "history": self.history},
                "rank_checks": self.rank_checks}

    def state_dict(self) -> dict:
        return {"masks": {name: m.cpu() for name, m in self._masks.items()}, "step": self.step,
                "history": list(self.history), "generator": self.generator.get_state(),
                "rank_checks": self.rank_checks, **self._extra_state()}

    def load_state_dict(self, state: dict) -> None:
        if set(state["masks"]) != set(self._masks):
            raise BarterError(f"the checkpoint's {self.name} masks are for other tensors: "
                              f"{sorted(set(state['masks']) ^ set(self._masks))}")
        self._masks = {name: state["masks"][name].to(m.device) for name, m in self._masks.items()}
        self.step, self.history = int(state["step"]), list(state["history"])
        self.rank_checks = state["rank_checks"]
        self.generator.set_state(state["generator"])
        self._load_extra_state(state)

    def _extra_state(self) -> dict:
        """What a subclass keeps beyond the masks (running estimates, per-tensor budgets)."""
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass

    def summary(self) -> dict:
        total = sum(m.numel() for m in self._masks.values())
        return {"method": self.name, "target_density": self.target_density, "density": self.density(),
                "masked_weights": total, "active_weights": sum(int(m.sum()) for m in self._masks.values()),
                "updates": len(self.history), "planned_updates": len(self.schedule.update_steps),
                "dropped": sum(sum(r["dropped"].values()) for r in self.history),
                "grown": sum(sum(r["grown"].values()) for r in self.history),
                "settings": {f.name: getattr(self.settings, f.name) for f in fields(self.settings)}}


class UnstructuredDST(MaskedDST):
    """Per-tensor drop-and-grow: drop ``round(fraction * active)`` smallest ``|w|``, grow by a score."""

    def _grow_score(self, t: MaskedTensor) -> torch.Tensor:
        raise NotImplementedError

    def _grow_counts(self, dropped: dict[str, int], kept: dict[str, torch.Tensor]) -> dict[str, int]:
        """How many weights each tensor grows (default: as many as it dropped)."""
        return dict(dropped)

    def _next_masks(self, step: int, fraction: float) -> dict[str, torch.Tensor]:
        kept, dropped = {}, {}
        for t in self.tensors:
            mask = self._masks[t.name]
            n = round(fraction * int(mask.sum()))
            kept[t.name] = mask & ~drop_smallest(t.param.detach().abs(), mask, n)
            dropped[t.name] = n
        counts = self._grow_counts(dropped, kept)
        new = {}
        for t in self.tensors:
            before = self._masks[t.name]
            grown = grow_largest(self._grow_score(t), before, kept[t.name], counts[t.name])
            new[t.name] = kept[t.name] | grown
        return new
