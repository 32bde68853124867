"""S2ViTE (Chen et al., 2021, "structure_new"): structured DST of heads and FFN neurons.

Units. A layer's attention heads and FFN neurons are switched on and off as a whole, under
fixed per-layer budgets: every layer keeps the heads and neurons of BARTER's initial
allocation at density rho (:func:`~barter_mini.core.budgets.compute_budget` spread evenly by
:func:`~barter_mini.core.budgets.initial_allocation`) at all times, initially a seeded random
choice (from a trained model: the units whose weights, input and output, have the largest
L1 norm, S2ViTE's magnitude criterion). The global counts are therefore BARTER's budgets, and an exported S2ViTE model has
BARTER's parameter count at every density, as in the paper (Tables 7, 9, 15; Figure 4).

* A masked head has its q, k and v rows of ``attn.qkv`` at zero, so its attention output
  ``a_h`` is zero. Its ``head_dim`` columns of ``attn.proj`` are *not* masked: they multiply a
  zero input, so they receive no gradient (only AdamW's decay), and ``dL/da_h = proj_h^T dL/dy``
  stays non-zero, which is what regrowth ranks heads by.
* A masked neuron has its row of ``mlp.fc1.weight`` and its ``fc1.bias`` entry at zero, so its
  activation is ``GELU(0) = 0``. Its column of ``mlp.fc2`` is not masked (same reason: the
  gradient of its fc1 row, ``GELU'(0) fc2_col^T dL/dy x``, then ranks it for regrowth).

Rule, per layer at every update, with death rate
``d(t) = death_rate / 2 * (1 + cos(pi t / (s2vite_t_end * T)))`` (0.5, updates until 80 %):

* heads: drop the ``round(d * active heads)`` active heads of lowest first-order Taylor score
  ``|sum(a_h * dL/da_h)|`` (summed over tokens and the head's channels per image, then averaged
  over the batch); grow as many inactive heads of largest gradient norm ``||dL/da_h||_1``
  (per image, averaged over the batch), both as in the reference. ``a_h`` is captured by a
  forward pre-hook on ``attn.proj`` and its gradient by a tensor hook, only in the training
  step that ends in an update (the hooks are idle otherwise), so the scores come from that
  step's batch, as the reference's (which overwrites them at every training forward);
* neurons: drop the ``round(d * active neurons)`` active neurons of smallest
  ``|fc1 row|_1 + |fc2 col|_1``; grow as many inactive neurons of largest
  ``|dL/d fc1 row|_1 + |dL/d fc2 col|_1`` (dense gradients read in ``before_step``).

Units dropped in this update come last among the growth candidates. Re-grown q, k, v rows
and fc1 rows start at zero with zeroed optimizer state.

:meth:`~barter_mini.masked.base.MaskedDST.density` and :meth:`~barter_mini.masked.base.MaskedDST.masks` describe the *functional* masks over all four weight
matrices: the rows of ``qkv`` and columns of ``proj`` of active heads, the rows of ``fc1``
and columns of ``fc2`` of active neurons, i.e. what an exported compact model keeps (so
``density`` is close to, not exactly, ``rho``: the budgets are rounded to whole units).
:meth:`~barter_mini.masked.base.MaskedDST.enforced_masks` lists what is multiplied into parameters and gradients: ``qkv`` and
``fc1`` weights and ``fc1.bias``.

Reference: VITA-Group/SViTE (``dst_utils/core.py``, ``pruning_type structure_new``).
Deviations: (1) the reference masks fc1 rows *and fc2 columns* and leaves the fc1 bias alone
(a masked neuron still fires ``GELU(b)``, its fc2 column is zero, and regrowth ranks by the fc2
gradient that this activation produces); here the fc1 bias is masked and the fc2 column is
not, mirroring the heads (input side masked, output side free), so a masked unit's output is
exactly zero and the regrowth signal flows through its input weights; (2) counts use
``round`` instead of ``ceil``, and the budgets ``round`` instead of ``int``; (3) just-dropped
units come last for regrowth, where the reference ranks them with the other inactive units;
(4) the death rate follows this harness's cosine over the steps up to ``s2vite_t_end`` (the
reference steps a ``CosineAnnealingLR`` with ``eta_min`` 0.005 for it).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..core.budgets import Allocation, compute_budget, initial_allocation
from ..core.surgery import regather_units, unit_l1_norms
from ..errors import BarterError
from .base import MaskSchedule, MaskedDST
from .selection import drop_smallest, grow_largest


class S2ViTE(MaskedDST):
    name = "s2vite"
    needs_dense_gradient = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._head_stats: dict[int, list[torch.Tensor]] = {}
        self._hooks = [block.attn.proj.register_forward_pre_hook(self._proj_pre_hook(layer))
                       for layer, block in enumerate(self.model.blocks)]

    # ---------------------------------------------------------------- units and masks

    def _make_schedule(self) -> MaskSchedule:
        s = self.settings
        return MaskSchedule(self.total_steps, s.delta_t, s.s2vite_t_end, s.s2vite_death_rate)

    def _initial_masks(self) -> dict[str, torch.Tensor]:
        self.head_masks: list[torch.Tensor] = []
        self.ffn_masks: list[torch.Tensor] = []
        budget = initial_allocation(self.model.config, compute_budget(self.model.config, self.target_density))
        self.head_budget: list[int] = list(budget.heads)
        self.ffn_budget: list[int] = list(budget.ffn)
        for layer, block in enumerate(self.model.blocks):
            heads, ffn = block.attn.num_heads, block.mlp.fc1.out_features
            device = block.mlp.fc1.weight.device
            for kind, count, masks, k in (("heads", heads, self.head_masks, self.head_budget[layer]),
                                          ("ffn", ffn, self.ffn_masks, self.ffn_budget[layer])):
                unit = torch.zeros(count, dtype=torch.bool)
                if self.init_from_weights:
                    unit[torch.topk(unit_l1_norms(block, kind).cpu(), k).indices] = True
                else:
                    unit[torch.randperm(count, generator=self.generator)[:k]] = True
                masks.append(unit.to(device))
        return self._functional_masks()

    def _head_rows(self, layer: int) -> torch.Tensor:
        """Per row of ``qkv`` (q heads | k heads | v heads): is its head active?"""
        attn = self.model.blocks[layer].attn
        return self.head_masks[layer].repeat_interleave(attn.head_dim).repeat(3)

    def _functional_masks(self) -> dict[str, torch.Tensor]:
        masks = {}
        for t in self.tensors:
            attn = self.model.blocks[t.layer].attn
            heads, ffn = self.head_masks[t.layer], self.ffn_masks[t.layer]
            shape = t.param.shape
            unit = {"qkv": self._head_rows(t.layer)[:, None],
                    "proj": heads.repeat_interleave(attn.head_dim)[None, :],
                    "fc1": ffn[:, None], "fc2": ffn[None, :]}[t.kind]
            masks[t.name] = unit.expand(shape).clone()
        return masks

    def _enforced(self) -> list[tuple[nn.Parameter, torch.Tensor]]:
        pairs = []
        for layer, block in enumerate(self.model.blocks):
            qkv, fc1 = block.attn.qkv.weight, block.mlp.fc1.weight
            pairs.append((qkv, self._head_rows(layer)[:, None].expand(qkv.shape)))
            pairs.append((fc1, self.ffn_masks[layer][:, None].expand(fc1.shape)))
            if block.mlp.fc1.bias is not None:
                pairs.append((block.mlp.fc1.bias, self.ffn_masks[layer]))
        return pairs

    def _enforced_names(self) -> list[str]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [names[id(p)] for p, _ in self._enforced()]

    def allocation(self) -> Allocation:
        """Active heads and FFN neurons per layer (what a compact export would keep)."""
        return Allocation(heads=tuple(int(m.sum()) for m in self.head_masks),
                          ffn=tuple(int(m.sum()) for m in self.ffn_masks))

    # ---------------------------------------------------------------- head statistics

    def _proj_pre_hook(self, layer: int):
        def hook(module: nn.Module, inputs):
            a = inputs[0]
            if self._armed and module.training and torch.is_grad_enabled() and a.requires_grad:
                kept = a.detach()
                a.register_hook(lambda grad: self._head_grad(layer, kept, grad))
        return hook

    def _head_grad(self, layer: int, a: torch.Tensor, grad: torch.Tensor) -> None:
        attn = self.model.blocks[layer].attn
        images = a.shape[0]
        a = a.reshape(images, -1, attn.num_heads, attn.head_dim)
        g = grad.detach().reshape(images, -1, attn.num_heads, attn.head_dim)
        taylor = (a * g).sum(dim=(1, 3)).abs().sum(dim=0)      # per image |sum a g|, summed
        l1 = g.abs().sum(dim=(1, 3)).sum(dim=0)                  # per image ||g||_1, summed
        stats = self._head_stats.setdefault(layer, [torch.zeros_like(taylor), torch.zeros_like(l1), 0])
        stats[0] += taylor
        stats[1] += l1
        stats[2] += images

    def head_scores(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(Taylor score ``|sum a * dL/da|``, gradient norm ``||dL/da||_1``) per head of ``layer``,
        each averaged over the images of the update step."""
        if layer not in self._head_stats:
            raise BarterError(f"s2vite found no head statistics for layer {layer} at update step {self.step}: "
                              "the update step's forward and backward must run in training mode")
        taylor, l1, images = self._head_stats[layer]
        return taylor / images, l1 / images

    @property
    def _armed(self) -> bool:
        """Whether the coming training step ends in an update (the head hooks record then)."""
        return self.schedule.is_update(self.step + 1)

    def _after_step_hook(self) -> None:
        self._head_stats.clear()

    # ---------------------------------------------------------------- the update

    def _next_masks(self, step: int, fraction: float) -> dict[str, torch.Tensor]:
        self._changes = {"heads": [], "ffn": []}
        for layer, block in enumerate(self.model.blocks):
            taylor, grad_norm = self.head_scores(layer)
            fc1, fc2 = block.mlp.fc1.weight, block.mlp.fc2.weight
            prune_ffn = fc1.detach().abs().sum(dim=1) + fc2.detach().abs().sum(dim=0)
            grow_ffn = self.dense_grad(self._name(fc1)).abs().sum(dim=1) + \
                self.dense_grad(self._name(fc2)).abs().sum(dim=0)
            for kind, masks, prune, grow in (("heads", self.head_masks, taylor, grad_norm),
                                             ("ffn", self.ffn_masks, prune_ffn, grow_ffn)):
                before = masks[layer]
                n = round(fraction * int(before.sum()))
                kept = before & ~drop_smallest(prune, before, n)
                masks[layer] = kept | grow_largest(grow, before, kept, n)
                self._changes[kind].append({
                    "dropped": torch.nonzero(before & ~masks[layer]).flatten().tolist(),
                    "grown": torch.nonzero(masks[layer] & ~before).flatten().tolist()})
        return self._functional_masks()

    def _name(self, param: nn.Parameter) -> str:
        return next(t.name for t in self.tensors if t.param is param)

    def _record_extra(self, old: dict[str, torch.Tensor]) -> dict:
        return {"units": self._changes, **self.allocation().as_dict()}

    def summary(self) -> dict:
        return {**super().summary(), "head_budget": list(self.head_budget),
                "ffn_budget": list(self.ffn_budget), **self.allocation().as_dict()}

    # ---------------------------------------------------------------- state and export

    def _extra_state(self) -> dict:
        return {"head_masks": [m.cpu() for m in self.head_masks], "ffn_masks": [m.cpu() for m in self.ffn_masks]}

    def _load_extra_state(self, state: dict) -> None:
        self.head_masks = [m.to(old.device) for m, old in zip(state["head_masks"], self.head_masks)]
        self.ffn_masks = [m.to(old.device) for m, old in zip(state["ffn_masks"], self.ffn_masks)]
        self._masks = self._functional_masks()

    @classmethod
    def smallest_dense_form(cls, model: nn.Module, state: dict) -> nn.Module:
        """A copy of ``model`` with the masked heads and FFN channels removed physically: a
        compact model of the same family with BARTER's parameter count at equal density.

        Removal is the same regather that BARTER's prune uses, with no optimizer to remap.
        """
        model = copy.deepcopy(model)
        for layer, block in enumerate(model.blocks):
            for kind, masks in (("heads", state["head_masks"]), ("ffn", state["ffn_masks"])):
                alive = torch.nonzero(masks[layer]).flatten().cpu()
                if alive.numel() == 0:
                    raise BarterError(f"layer {layer} has no active {kind}: cannot export an empty layer")
                regather_units(block, kind, alive, torch.ones(alive.numel()))
        return model
