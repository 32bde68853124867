"""SNFS, sparse momentum (Dettmers & Zettlemoyer, 2019): momentum growth and redistribution.

Rule at every update:

1. drop, per masked tensor, the ``round(fraction * active)`` active weights of smallest ``|w|``;
2. redistribute the total number dropped across tensors in proportion to each tensor's mean
   momentum magnitude over its active weights (:func:`~barter_mini.masked.selection.apportion`:
   a tensor is capped at full, the excess is shared among the others, integer parts add up
   to the total exactly), so per-tensor densities move while the overall density is exact;
3. grow, per tensor, its share of weights with the largest ``|momentum|`` among the inactive.

Momentum: for Adam(W) ``exp_avg / (sqrt(exp_avg_sq) + 1e-8)`` (no bias correction, as in the
reference), for SGD the momentum buffer, without momentum the gradient. Because this harness
masks the gradients of inactive weights (so that they stay exactly zero), the optimizer's own
moments of inactive weights are zero and cannot rank them. SNFS therefore keeps a separate
running estimate fed with the *dense* gradient at every step, in :meth:`~barter_mini.masked.base.MaskedDST.before_step` before
masking, with the optimizer's own coefficients (``betas``; ``momentum``, ``dampening`` and
SGD's coupled ``weight_decay``). On active weights it equals the optimizer's state; on
inactive weights it is what the reference's optimizer state would be, since the reference
does not mask gradients. Cost: one (SGD) or two (Adam) extra copies of the masked weights.

Reference: TimDettmers/sparse_learning (``sparselearning/core.py``: magnitude death,
``momentum_growth``, ``momentum_redistribution``). Deviations: the drop count uses
``round`` and RigL's cosine-decayed schedule (shared by all methods here) instead of
``ceil`` and the reference's own prune-rate decay; the redistribution is exact (the
reference's ``ceil`` shares and ``0.99 * max`` cap may grow a few weights more or fewer than it
dropped); a just-dropped weight is re-grown only when a tensor has no other room.
"""

from __future__ import annotations

import torch

from .base import MaskedTensor, UnstructuredDST
from .selection import apportion


class SNFS(UnstructuredDST):
    name = "snfs"
    eps = 1e-8

    def __init__(self, *args, **kwargs):
        self._moments: dict[str, dict[str, torch.Tensor]] = {}
        super().__init__(*args, **kwargs)
        self._groups = {}
        if self.optimizer is not None:
            owner = {id(p): g for g in self.optimizer.param_groups for p in g["params"]}
            self._groups = {t.name: owner.get(id(t.param), {}) for t in self.tensors}

    def _observe_gradients(self, update_next: bool) -> None:
        for t in self.tensors:
            param = t.param
            grad = torch.zeros_like(param) if param.grad is None else param.grad.detach()
            group = self._groups.get(t.name, {})
            state = self._moments.setdefault(t.name, {})
            if "betas" in group:
                beta1, beta2 = group["betas"]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)
                state["exp_avg"].mul_(beta1).add_(grad, alpha=1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            elif group.get("momentum", 0) > 0:
                if group.get("weight_decay", 0):
                    grad = grad + group["weight_decay"] * param.detach()
                if "momentum_buffer" not in state:      # torch.optim.SGD's first step
                    state["momentum_buffer"] = grad.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(
                        grad, alpha=1 - group.get("dampening", 0))
            else:
                state["grad"] = grad.clone()

    def momentum(self, name: str) -> torch.Tensor:
        """The momentum SNFS ranks by, from the dense-gradient estimate."""
        state = self._moments.get(name)
        if not state:
            self._missing_gradient(name)
        if "exp_avg" in state:
            return state["exp_avg"] / (state["exp_avg_sq"].sqrt() + self.eps)
        return state.get("momentum_buffer", state.get("grad"))

    def _grow_score(self, t: MaskedTensor) -> torch.Tensor:
        return self.momentum(t.name).abs()

    def _grow_counts(self, dropped: dict[str, int], kept: dict[str, torch.Tensor]) -> dict[str, int]:
        weights = []
        for t in self.tensors:
            active = self._masks[t.name]
            weights.append(float(self.momentum(t.name).abs()[active].mean()) if active.any() else 0.0)
        caps = [int((~kept[t.name]).sum()) for t in self.tensors]
        parts = apportion(sum(dropped.values()), weights, caps)
        self._last_weights = dict(zip((t.name for t in self.tensors), weights))
        return dict(zip((t.name for t in self.tensors), parts))

    def _extra_state(self) -> dict:
        return {"moments": {name: {k: v.cpu() for k, v in state.items()} for name, state in self._moments.items()}}

    def _load_extra_state(self, state: dict) -> None:
        device = {t.name: t.param.device for t in self.tensors}
        self._moments = {name: {k: v.to(device[name]) for k, v in moments.items()}
                         for name, moments in state["moments"].items()}

    def _record_extra(self, old: dict[str, torch.Tensor]) -> dict:
        return {"mean_momentum": dict(self._last_weights),
                "tensor_density": {n: float(m.float().mean()) for n, m in self._masks.items()}}
