"""SRigL (Lasby et al., 2023): RigL with constant fan-in and dynamic neuron ablation.

A *row* is one output neuron of a masked matrix (a row of ``W``, shape ``out x in``): a q, k or v
channel of ``qkv``, an embedding channel of ``proj`` or ``fc2``, an FFN channel of ``fc1``.
Every active row of a tensor has exactly ``k`` non-zeros; an ablated row has none.

Initial masks: ``k0 = round(rho * in)`` (between 1 and ``in``) random non-zeros in every row,
seeded (from a trained model: the row's ``k0`` largest ``|w|``); ``budget = k0 * out`` is the
tensor's weight budget from then on.

Rule, per masked tensor at every update (``n_prune = round(fraction * active)``,
``n_keep = active - n_prune``):

1. salience: the ``n_keep`` active weights of largest ``|w|`` (RigL's kept set) and the
   ``n_prune`` inactive weights of largest dense ``|grad|`` (RigL's grown set) are salient;
2. ablation: a row with fewer than ``max(1, int(gamma_sal * k0))`` salient weights is ablated
   (``gamma_sal`` = 0.95), keeping at least ``ceil(budget / in)`` rows (the rows with the most
   salient weights are spared first) so that the budget still fits;
3. new fan-in ``k = round(budget / active rows)`` (at most ``in``): the ablated rows' budget
   goes to the remaining rows;
4. keep the ``n_keep`` largest ``|w|`` among the active weights of the remaining rows, at most
   ``k`` per row (largest ``|w|`` first);
5. grow every remaining row back to exactly ``k`` by largest dense ``|grad|``, weights
   inactive before the update first (a just-dropped weight only if the row has no other).

Ablation is decided afresh at every update, so an ablated row whose gradients become salient
can come back. The classifier head is never ablated: it is not masked at all here.

Reference: calgaryml/condensed-sparsity (``src/rigl_torch/rigl_constant_fan.py``,
``get_fan_in_after_ablation``; ViT: ``gamma_sal`` = 0.95, ``delta`` = 100, threshold
relative to the sparse constant fan-in). Deviations: (1) ``k = round(budget / rows)`` instead
of the reference's floor, so the density stays as close to ``rho`` as a constant fan-in
allows: ``|active - budget| <= active rows / 2``, i.e. SRigL cannot hold the density to one
weight per tensor as the unstructured methods do; (2) the grown salient set is drawn among
inactive weights (the reference ranks ``|grad|`` over all weights, active ones included);
(3) when a row keeps more than ``k`` weights it keeps its largest ones (the reference's
per-row truncation sorts the boolean mask, i.e. keeps arbitrary ones); (4) the minimum number
of rows is enforced by sparing the most salient rows, where the reference lowers the threshold
to the salience of the ``min_neurons``-th row; (5) uniform ``rho`` per tensor instead of ERK.
"""

from __future__ import annotations

import math

import torch

from .base import MaskedDST
from .selection import growth_tiers, select_top


class SRigL(MaskedDST):
    name = "srigl"
    needs_dense_gradient = True

    def _initial_masks(self) -> dict[str, torch.Tensor]:
        masks = {}
        self.budget, self.fan_in, self.initial_fan_in = {}, {}, {}
        self.ablated: dict[str, torch.Tensor] = {}
        for t in self.tensors:
            rows, cols = t.param.shape
            k0 = min(cols, max(1, round(self.target_density * cols)))
            scores = (t.param.detach().abs().cpu() if self.init_from_weights
                      else torch.rand(rows, cols, generator=self.generator))
            masks[t.name] = select_top(scores, torch.zeros(rows, cols, dtype=torch.long), k0).to(t.param.device)
            self.budget[t.name], self.fan_in[t.name], self.initial_fan_in[t.name] = k0 * rows, k0, k0
            self.ablated[t.name] = torch.zeros(rows, dtype=torch.bool, device=t.param.device)
        return masks

    def threshold(self, name: str) -> int:
        """Fewest salient weights a row needs to stay active."""
        return max(1, int(self.settings.srigl_gamma_sal * self.initial_fan_in[name]))

    def _next_masks(self, step: int, fraction: float) -> dict[str, torch.Tensor]:
        new = {}
        for t in self.tensors:
            mask = self._masks[t.name]
            rows, cols = mask.shape
            magnitude = t.param.detach().abs()
            grad = self.dense_grad(t.name).abs()
            active = int(mask.sum())
            n_prune = round(fraction * active)
            n_keep = active - n_prune
            flat = lambda x: x.reshape(1, -1)  # noqa: E731
            keep_salient = select_top(flat(magnitude), flat(torch.where(mask, 0, -1)), n_keep).view_as(mask)
            grow_salient = select_top(flat(grad), flat(torch.where(mask, -1, 0)), n_prune).view_as(mask)
            salient = (keep_salient | grow_salient).sum(dim=1)
            ablate = salient < self.threshold(t.name)
            budget = self.budget[t.name]
            min_rows = min(rows, max(1, math.ceil(budget / cols)))
            if int((~ablate).sum()) < min_rows:       # spare the most salient rows
                spared = select_top(salient.view(1, -1).float(),
                                    torch.zeros(1, rows, dtype=torch.long, device=mask.device), min_rows).view(-1)
                ablate &= ~spared
            live = int((~ablate).sum())
            k = min(cols, max(1, round(budget / live)))
            alive = ~ablate[:, None]
            kept = select_top(flat(magnitude), flat(torch.where(mask & alive, 0, -1)), n_keep).view_as(mask)
            kept = select_top(magnitude, torch.where(kept, 0, -1), k)
            need = torch.where(ablate, 0, k - kept.sum(dim=1))
            tier = torch.where(alive, growth_tiers(mask, kept), -1)
            grown = select_top(grad, tier, need)
            new[t.name] = kept | grown
            self.fan_in[t.name] = k
            self.ablated[t.name] = ablate
        return new

    def _extra_state(self) -> dict:
        return {"fan_in": dict(self.fan_in), "ablated": {n: a.cpu() for n, a in self.ablated.items()}}

    def _load_extra_state(self, state: dict) -> None:
        self.fan_in = dict(state["fan_in"])
        self.ablated = {n: state["ablated"][n].to(a.device) for n, a in self.ablated.items()}

    def _record_extra(self, old: dict[str, torch.Tensor]) -> dict:
        return {"fan_in": dict(self.fan_in),
                "ablated_rows": {n: int(a.sum()) for n, a in self.ablated.items()}}

    def summary(self) -> dict:
        return {**super().summary(), "fan_in": dict(self.fan_in),
                "ablated_rows": {n: int(a.sum()) for n, a in self.ablated.items()}}
