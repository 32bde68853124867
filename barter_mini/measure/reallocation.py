"""What a topology update costs and buys, measured inside a real training run.

:func:`probe_run` trains a run exactly as :func:`~barter_mini.training.trainer.train` does,
with its controller wrapped in a :class:`ProbedController` that, at every update that moves
units, measures on a fixed set of validation images (never the test split):

* the validation loss and Top-1 right before the update, after its prune part alone, after
  its clone part alone (each on a copy of the model, per unit kind), right after the whole
  update, and ``later`` steps after it;
* the function change of the clone part with the configured symmetry noise and without it
  (largest absolute change of the logits, relative to their largest magnitude);
* how far each clone's input weights are from its parent's, ``||w_clone - w_parent|| /
  ||w_parent||``, at ``later`` steps after the update (until the next update reshapes the
  layer);
* the per-layer importance (the mean and the total Taylor importance ``EMA[(sum_j W_j g_j)^2]``
  of the layer's units) at every update step, from statistics hooks that only observe (the
  same definition whatever score the method prunes by; for BARTER re-attached after every
  update that reshapes the layers), for BARTER and Static alike, so the two can be compared
  layer by layer.

The probes run under ``torch.no_grad`` on copies or between steps, so the run itself is the
same as an unprobed one (a test checks the weights).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core.barter import Transfer, clone, plan_transfer, prune_donors
from ..core.barter_controller import BarterController
from ..core.method import MethodController
from ..core.surgery import allocation_of, unit_count, unit_parameters
from ..core.unit_statistics import UnitStatistics
from ..training.run_config import RunConfig
from ..training.trainer import build_training, fit_one_epoch

#: the per-layer importance the probe records, whatever score the run prunes by: the
#: Taylor importance of the module docstring, for BARTER and Static alike
OBSERVED_SCORE = "taylor-squared"
#: steps after an update at which the probe looks again
LATER = (1, 5, 20)


@torch.no_grad()
def probe_scores(model: nn.Module, batches: list) -> dict[str, float]:
    """Mean cross-entropy and Top-1 (fractions) of ``model`` on ``batches``, in eval mode."""
    was_training = model.training
    model.eval()
    loss, correct, count = 0.0, 0, 0
    for x, y in batches:
        logits = model(x)
        loss += float(nn.functional.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(dim=1) == y).sum())
        count += len(y)
    model.train(was_training)
    return {"loss": loss / count, "acc": correct / count}


@torch.no_grad()
def _logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    was_training = model.training
    model.eval()
    out = model(x)
    model.train(was_training)
    return out


def input_rows(block: nn.Module, kind: str, units: list[int]) -> torch.Tensor:
    """The input weights of ``units`` of one layer, one flattened row per unit."""
    spec = next(s for s in unit_parameters(block, kind) if s.role == "in" and s.name == "weight")
    count = unit_count(block, kind)
    rows = []
    for unit in units:
        index = spec.element_index(torch.tensor([unit], device=spec.tensor.device), count)
        rows.append(spec.tensor.detach().index_select(spec.axis, index).flatten())
    return torch.stack(rows)


def layer_importance(statistics: UnitStatistics) -> dict[str, dict[str, list[float]]]:
    """Per unit kind and layer: the mean (``priority``) and the total of the units' pruning scores."""
    out = {}
    for kind, layers in statistics.layers.items():
        totals = []
        for stats in layers:
            scores = stats.pruning_scores()
            known = scores[~scores.isnan()]
            totals.append(float(known.sum()) if known.numel() else 0.0)
        out[kind] = {"priority": [s.growth_priority() for s in layers], "total": totals}
    return out


@dataclass
class _Pairs:
    """Clones to follow until the next update: ``(kind, layer, parents, clones, step)``."""

    kind: str
    layer: int
    parents: list[int]
    clones: list[int]
    step: int
    distances: dict[int, float] = field(default_factory=dict)


class ProbedController(MethodController):
    """Wraps a run's controller and measures around every update (see the module docstring).

    BARTER's own updates are probed; for any other compact method (Static) statistics hooks
    observe the same per-layer importance at the same steps, without changing anything.
    """

    def __init__(self, inner: MethodController, model: nn.Module, batches: list, update_every: int,
                 later: tuple[int, ...] = LATER):
        self.inner, self.model, self.batches, self.later = inner, model, batches, later
        self.name = inner.name
        self.is_barter = isinstance(inner, BarterController)
        self.observer = UnitStatistics(model, pruning_score=OBSERVED_SCORE)
        self.update_every = update_every
        self.updates: list[dict] = []
        self.importance: list[dict] = []
        self.clone_distances: list[dict] = []
        self._pairs: list[_Pairs] = []

    def before_step(self) -> None:
        self.inner.before_step()

    def after_step(self, step: int):
        moving = self.is_barter and any(self.inner.schedule.transfers_at(step).values())
        if step % self.update_every == 0:        # before the update: the layers as they were used
            self.importance.append({"step": step, **layer_importance(self.observer)})
        if moving:
            self._close_pairs()
            record = self._probe_update(step)
        result = self.inner.after_step(step)
        if moving:
            record["after"] = probe_scores(self.model, self.batches)
            record["allocation"] = allocation_of(self.model).as_dict()
            self.updates.append(record)
            for kind, transfer in (result or {}).items():
                if transfer.executed:
                    count = unit_count(self.model.blocks[transfer.receiver], kind) - transfer.executed
                    self._pairs.append(_Pairs(kind, transfer.receiver, list(transfer.parents),
                                              list(range(count, count + transfer.executed)), step))
            self.observer.detach()              # its hooks sit on the tensors the surgery replaced
            self.observer = UnitStatistics(self.model, pruning_score=OBSERVED_SCORE)
        for update in self.updates:
            if step - update["step"] in self.later:
                update.setdefault("later", {})[str(step - update["step"])] = probe_scores(self.model, self.batches)
        for pairs in self._pairs:
            if step - pairs.step in self.later:
                pairs.distances[step - pairs.step] = self._distance(pairs)
        return result

    def _probe_update(self, step: int) -> dict:
        """Scores before the update and after each part of it alone, per kind, on copies."""
        s = self.inner.settings
        record = {"step": step, "before": probe_scores(self.model, self.batches), "kinds": {}}
        if s.random_receiver or s.random_donor:      # a plan here would not be the run's own draw
            return record
        x = self.batches[0][0]
        reference = _logits(self.model, x)
        for kind, k in self.inner.schedule.transfers_at(step).items():
            plan: Transfer = plan_transfer(self.model, kind, k, self.inner.statistics, s)
            if not plan.executed:
                continue
            pruned = copy.deepcopy(self.model)
            prune_donors(pruned, kind, plan.donors, copy.deepcopy(self.inner.statistics.layers[kind]), None)
            parts = {"units": plan.executed, "receiver": plan.receiver, "after_prune": probe_scores(pruned, self.batches)}
            for noise, label in ((s.symmetry_noise, "after_clone"), (0.0, "after_exact_clone")):
                cloned = copy.deepcopy(self.model)
                clone(cloned.blocks[plan.receiver], kind, plan.parents,
                      copy.deepcopy(self.inner.statistics.layers[kind][plan.receiver]), None, alpha=s.split_alpha,
                      symmetry_noise=noise, generator=torch.Generator().manual_seed(step))
                parts[label] = probe_scores(cloned, self.batches)
                change = (_logits(cloned, x) - reference).abs().max() / reference.abs().max()
                parts[f"{label}_logit_change"] = float(change)
            record["kinds"][kind] = parts
        return record

    def _distance(self, pairs: _Pairs) -> float:
        block = self.model.blocks[pairs.layer]
        parents, clones = input_rows(block, pairs.kind, pairs.parents), input_rows(block, pairs.kind, pairs.clones)
        return float(((clones - parents).norm(dim=1) / parents.norm(dim=1)).mean())

    def _close_pairs(self) -> None:
        """The next update reshapes layers: store the pairs followed so far and start afresh."""
        self.clone_distances += [{"kind": p.kind, "layer": p.layer, "step": p.step, "units": len(p.parents),
                                  "distance": {str(k): v for k, v in p.distances.items()}} for p in self._pairs]
        self._pairs = []

    def metrics(self) -> dict:
        self._close_pairs()
        return {**self.inner.metrics(), "probe": {"updates": self.updates, "importance": self.importance,
                                                  "clone_distances": self.clone_distances}}


def probe_batches(loaders, device: torch.device, images: int) -> list:
    """The first ``images`` validation images of a run (``loaders[1]``), as batches on its device."""
    batches, seen = [], 0
    for x, y in loaders[1]:
        batches.append((x.to(device), y.to(device)))
        seen += len(y)
        if seen >= images:
            break
    return batches


def probe_run(run: RunConfig, images: int = 1000, later: tuple[int, ...] = LATER) -> dict:
    """Train ``run`` with its updates probed; return the probe records and the final
    validation scores (nothing is written: the run is for measuring, not for the cache)."""
    def probed(controller, model, recipe, loaders, device) -> ProbedController:
        return ProbedController(controller, model, probe_batches(loaders, device, images), recipe.barter.delta_t, later)

    t = build_training(run, wrap_controller=probed)
    while t.progress.epoch <= t.recipe.epochs:
        fit_one_epoch(t)
    history = t.progress.history
    return {"method": run.method, "seed": run.seed, "density": t.run.density, "history": history,
            "val_acc": history[-1]["val_acc"], **t.controller.metrics()}
