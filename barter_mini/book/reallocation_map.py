"""The map of where reallocation pays: BARTER against Static, paired by seed, along the axes
that separate the book's setting from the paper's (chapter 05; paper Table 13).

The map's runs take hours on two cores, more than a book build may spend, so they are
trained once by ``barter-mini sweep`` and recorded, one row per run, in :data:`MAP_CSV`
with the exact command and the commit of the code that trained it (:func:`rows_from_cache`).
The book reads that file (:func:`paired_cells`) and marks what it draws as recorded, not
recomputed.

A cell is one setting (model, density, epochs, training images, start); its value is the
paired difference ``d_s = acc(BARTER, s) - acc(Static, s)`` over the seeds ``s`` both
methods ran, reported as ``mean(d)``, ``std(d)`` (n - 1) and the standard error
``std(d) / sqrt(n)``, on validation (which decides) and on test (beside it).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..training.checkpoints import read_json, write_atomically

#: the recorded runs of the map (one row per run)
MAP_CSV = Path(__file__).resolve().parents[2] / "data" / "reallocation_map.csv"
#: what identifies a cell of the map
CELL = ("model", "dataset", "density", "epochs", "train_subset", "start")
#: the columns of :data:`MAP_CSV`
COLUMNS = CELL + ("method", "seed", "val_acc", "test_acc", "train_time_s", "threads", "commit", "command")
#: the two methods a cell compares: the first minus the second
PAIR = ("barter", "static")


def sweep_command(run: dict) -> str:
    """The ``barter-mini sweep`` command that trains the pair of runs (BARTER and Static) of
    one seed of a cell, as the map's runs were trained (one one-thread job)."""
    command = ["barter-mini", "sweep", "--methods", ",".join(reversed(PAIR)), "--densities", f"{run['density']:g}",
               "--seeds", str(run["seed"]), "--model", run["model"], "--dataset", run["dataset"],
               "--recipe", run["recipe"], "--epochs", str(run["epochs"])]
    if run.get("train_subset") is not None:
        command += ["--train-subset", str(run["train_subset"])]
    if run.get("start", "even") != "even":
        command += ["--start", run["start"]]
    return " ".join(command + ["--jobs", "1", "--threads-per-job", "1"])


def rows_from_cache(cache_dir: Path, commit: str) -> list[dict]:
    """One row per finished BARTER or Static run in the run cache ``cache_dir`` (its
    metrics.json), trained by the code at ``commit``."""
    rows = []
    for path in sorted(Path(cache_dir).glob("*/metrics.json")):
        metrics = read_json(path)
        run = metrics["run"]
        if run["method"] not in PAIR:
            continue
        rows.append({"model": run["model"], "dataset": run["dataset"], "density": run["density"],
                     "epochs": metrics["epochs"], "train_subset": run.get("train_subset") or "",
                     "start": run.get("start", "even"), "method": run["method"], "seed": run["seed"],
                     "val_acc": metrics["val_acc"], "test_acc": metrics["test_acc"],
                     "train_time_s": round(metrics["train_time_s"], 1), "threads": metrics["threads"],
                     "commit": commit, "command": sweep_command({**run, "epochs": metrics["epochs"]})})
    return rows


def write_map(rows: list[dict], path: Path = MAP_CSV) -> Path:
    """``rows`` merged into the CSV at ``path`` (a row of the same cell, method and seed is
    replaced), sorted, written atomically."""
    known = {}
    if Path(path).is_file():
        for row in read_map(path).to_dict("records"):
            known[_row_key(row)] = row
    for row in rows:
        known[_row_key(row)] = row
    ordered = sorted(known.values(), key=lambda row: tuple(str(row[key]) for key in CELL + ("method",)) + (int(row["seed"]),))

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows({key: row[key] for key in COLUMNS} for row in ordered)
    return write_atomically(Path(path), write)


def _row_key(row: dict) -> tuple:
    return tuple(str(row[key]) for key in CELL + ("method",)) + (int(row["seed"]),)


def read_map(path: Path = MAP_CSV) -> pd.DataFrame:
    """The recorded runs (``train_subset`` empty: all training images)."""
    frame = pd.read_csv(path, dtype={"train_subset": "string", "commit": "string"}, keep_default_na=False)
    return frame


def paired_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the seeds both methods ran (``seeds``), the paired difference BARTER - Static
    in Top-1 points on validation and test (mean, std, standard error), and what a run cost
    (median seconds of training, one thread)."""
    cells = []
    for cell, runs in frame.groupby(list(CELL), sort=True):
        by_method = {method: runs[runs.method == method].set_index("seed") for method in PAIR}
        seeds = sorted(set(by_method[PAIR[0]].index) & set(by_method[PAIR[1]].index))
        if not seeds:
            continue
        entry = dict(zip(CELL, cell), seeds=len(seeds), run_s=float(np.median(runs.train_time_s)))
        for split in ("val", "test"):
            gaps = 100 * (by_method[PAIR[0]].loc[seeds, f"{split}_acc"].to_numpy()
                          - by_method[PAIR[1]].loc[seeds, f"{split}_acc"].to_numpy())
            std = float(np.std(gaps, ddof=1)) if len(gaps) > 1 else math.nan
            entry.update({f"{split}_gap": float(np.mean(gaps)), f"{split}_std": std,
                          f"{split}_sem": std / math.sqrt(len(gaps))})
        cells.append(entry)
    return pd.DataFrame(cells)
