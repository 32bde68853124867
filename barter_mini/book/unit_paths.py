"""What a BARTER run's updates did to its units, read from its recorded metrics and its last
model: when each clone was made and pruned again (:func:`unit_fates`), the path of its
allocation (:func:`path_rows`), a run's summary of both (:func:`update_diagnostics`) and the
clones that never parted from their parents (:func:`twins`)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..core.surgery import unit_count
from ..errors import BarterError
from ..measure.reallocation import input_rows
from ..training.cache import run_dir
from ..training.checkpoints import load_checkpoint, model_from_checkpoint
from ..training.run_config import RunConfig

#: a unit whose input weights lie within this distance of another unit's of its layer,
#: relative to its own norm, is a twin: a clone that never became a unit of its own
TWIN_DISTANCE = 0.02


def unit_fates(history: list[dict], kind: str) -> list[dict]:
    """Every clone of a run's ``allocation_history``: the step it was made, and the step it was
    pruned (None if it lived to the end).

    Units are followed by their place in their layer's tensors: a prune keeps the survivors in
    order, a between-layer update appends its clones to the receiver after pruning the donors,
    a within-layer one appends them to the donor's layer before pruning (``core.barter``).
    """
    layers = [[("start", i) for i in range(n)] for n in history[0][kind]]
    born: dict[tuple, int] = {}
    pruned: dict[tuple, int] = {}

    def remove(donors, step):
        for layer in sorted({at for at, _ in donors}):
            doomed = {u for at, u in donors if at == layer}
            for u in doomed:
                pruned[layers[layer][u]] = step
            layers[layer] = [unit for u, unit in enumerate(layers[layer]) if u not in doomed]

    def add(layer, step, count):
        for _ in range(count):
            unit = ("clone", len(born))
            born[unit] = step
            layers[layer].append(unit)

    for entry in history[1:]:
        record = entry.get("transfers", {}).get(kind)
        if not record or not record["executed"]:
            continue
        step = entry["step"]
        if record["receiver"] is None:
            for layer in sorted({at for at, _ in record["parents"]}):
                add(layer, step, sum(at == layer for at, _ in record["parents"]))
            remove(record["donors"], step)
        else:
            remove(record["donors"], step)
            add(record["receiver"], step, record["executed"])
        if [len(units) for units in layers] != list(entry[kind]):
            raise BarterError(f"the {kind} of step {step} do not follow from its transfers: "
                              f"{[len(u) for u in layers]} followed, {entry[kind]} recorded")
    return [{"born": step, "pruned": pruned.get(unit)} for unit, step in born.items()]


def twins(model, kind: str, distance: float = TWIN_DISTANCE) -> int:
    """Units of ``kind`` whose input weights lie within ``distance`` of another unit of the same
    layer, relative to their own norm (``min_j |w_i - w_j| / |w_i|``): a clone and its parent
    that still move in lockstep count two; independent units are far apart (about sqrt(2))."""
    count = 0
    for block in model.blocks:
        rows = input_rows(block, kind, list(range(unit_count(block, kind))))
        apart = torch.cdist(rows, rows) / rows.norm(dim=1, keepdim=True)
        apart.fill_diagonal_(math.inf)
        count += int((apart.min(dim=1).values < distance).sum())
    return count


def final_twins(run: RunConfig, cache_dir: Path | None = None) -> dict:
    """:func:`twins` of each kind in the model a cached run ended with (its ``last.pt`` in
    ``cache_dir``, default the run cache's)."""
    model = model_from_checkpoint(load_checkpoint(run_dir(run, cache_dir) / "last.pt"))
    return {f"twins_{kind}": twins(model, kind) for kind in ("heads", "ffn")}


def update_diagnostics(metrics: dict) -> dict:
    """What a run's updates did, per kind: units moved, the share of its clones pruned again at
    a later update (``repruned``), and the net displacement from where it started (half the L1
    distance: the units that would have to move back); and the training loss's change across
    an update (mean of the losses recorded after it minus the mean of those before, averaged
    over the updates that moved units)."""
    history = metrics.get("allocation_history") or []
    row = {}
    for kind in ("heads", "ffn"):
        fates = unit_fates(history, kind) if history else []
        row[f"moved_{kind}"] = len(fates)
        row[f"repruned_{kind}"] = (sum(f["pruned"] is not None for f in fates) / len(fates)) if fates else float("nan")
        row[f"displaced_{kind}"] = (sum(abs(a - b) for a, b in zip(history[-1][kind], history[0][kind])) // 2
                                    if history else 0)
    jumps = [sum(u["after"]) / len(u["after"]) - sum(u["before"]) / len(u["before"])
             for u in metrics.get("update_losses") or [] if u["after"] and u["before"]]
    row["loss_jump"] = sum(jumps) / len(jumps) if jumps else float("nan")
    return row


def path_rows(metrics: dict) -> list[dict]:
    """A run's path: its heads and FFN channels per layer at the start and after every update
    that moved units, with each kind's receiver and units moved there (None and 0 where that
    kind moved nothing)."""
    rows = []
    for entry in metrics.get("allocation_history") or []:
        transfers = entry.get("transfers", {})
        if entry["step"] and not any(t["executed"] for t in transfers.values()):
            continue
        row = {"step": entry["step"], "heads": tuple(entry["heads"]), "ffn": tuple(entry["ffn"])}
        for kind in ("heads", "ffn"):
            moved = transfers.get(kind, {}).get("executed", 0)
            row[f"receiver_{kind}"] = transfers[kind]["receiver"] if moved else None
            row[f"moved_{kind}"] = moved
        rows.append(row)
    return rows
