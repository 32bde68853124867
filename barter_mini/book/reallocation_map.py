"""The recorded runs of chapter 05's map of where reallocation pays: BARTER and Static along
the settings that separate the book's setting from the paper's (paper Table 13).

The map's runs take hours on two cores, more than a book build may spend, so they are
trained once by ``barter-mini sweep`` (:func:`sweep_command`) and recorded, one row per run,
in :data:`MAP_CSV` with the exact command and the commit of the code that trained it
(:func:`rows_from_cache`, :func:`write_map`). A cell is one setting (:data:`CELL`: model,
density, epochs, training images, start); chapter 05 pairs a cell's runs by seed, computes
its gap and draws the map in its own cells, and trains the cells a reader adds
(:func:`train_cells`) in the same form.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import BarterError, check_list
from ..measure.gpu_pair import COLUMNS as GPU_COLUMNS
from ..training.cache import cached_train
from ..training.checkpoints import read_json, write_csv_atomically
from ..training.run_config import RunConfig
from .recorded_grid import recorded_data_dir

#: the recorded runs of the map (one row per run)
MAP_CSV = Path(__file__).resolve().parents[2] / "data" / "reallocation_map.csv"
#: runs of the map trained on a lent GPU (``barter-mini gpu-lend``'s ``pair.csv``, merged by
#: :func:`record_gpu_rows`): the paper's CCT in bf16 with CUDA graphs, never pooled with the CPU cells
GPU_MAP_CSV = MAP_CSV.with_name("reallocation_map_gpu.csv")
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
        rows.append(map_row(run, metrics, commit))
    return rows


def map_row(run: dict, metrics: dict, commit: str) -> dict:
    """One run as a row of the map (:data:`COLUMNS`): ``run`` its settings, ``metrics`` its
    metrics.json, ``commit`` the code that trained it (empty for a reader's own run)."""
    return {"model": run["model"], "dataset": run["dataset"], "density": run["density"],
            "epochs": metrics["epochs"], "train_subset": run.get("train_subset") or "",
            "start": run.get("start", "even"), "method": run["method"], "seed": run["seed"],
            "val_acc": metrics["val_acc"], "test_acc": metrics["test_acc"],
            "train_time_s": round(metrics["train_time_s"], 1), "threads": metrics["threads"],
            "commit": commit, "command": sweep_command({**run, "epochs": metrics["epochs"]})}


def write_map(rows: list[dict], path: Path = MAP_CSV, columns=COLUMNS) -> Path:
    """``rows`` merged into the CSV at ``path`` (a row of the same cell, method and seed is
    replaced), sorted, written atomically in ``columns``."""
    known = {}
    if Path(path).is_file():
        for row in read_map(path).to_dict("records"):
            known[_row_key(row)] = row
    for row in rows:
        known[_row_key(row)] = row
    ordered = sorted(known.values(), key=lambda row: tuple(str(row[key]) for key in CELL + ("method",)) + (int(row["seed"]),))
    return write_csv_atomically(Path(path), columns, ordered)


def record_gpu_rows(pair_csv: Path, path: Path = GPU_MAP_CSV) -> Path:
    """The rows of a lend's ``pair.csv`` (:mod:`~barter_mini.measure.gpu_pair`) merged into
    :data:`GPU_MAP_CSV`; one-line errors for a file that is not one."""
    frame = read_map(pair_csv)
    missing = [column for column in GPU_COLUMNS if column not in frame.columns]
    if missing:
        raise BarterError(f"{pair_csv} is not a gpu-pair CSV: it has no {', '.join(missing)} column")
    if set(frame["method"]) - set(PAIR) or (frame["device"] != "cuda").any():
        raise BarterError(f"{pair_csv}: the GPU map records BARTER and Static runs on a GPU only")
    return write_map(frame.to_dict("records"), path, GPU_COLUMNS)


def _row_key(row: dict) -> tuple:
    return tuple(str(row[key]) for key in CELL + ("method",)) + (int(row["seed"]),)


def read_map(path: Path | None = None) -> pd.DataFrame:
    """The recorded runs (``train_subset`` empty: all training images), from ``path`` or
    the recorded folder (:data:`MAP_CSV`, or its copy under ``$BARTER_MINI_RECORDED``)."""
    path = Path(path) if path is not None else recorded_data_dir() / MAP_CSV.name
    return pd.read_csv(path, dtype={"train_subset": "string", "commit": "string"}, keep_default_na=False)


#: a cell the reader adds (chapter 05's ``map_cells`` parameter): its keys and their defaults
CELL_SPEC = {"model": None, "density": None, "epochs": 3, "seeds": [0, 1, 2, 3, 4], "start": "even"}
#: the map's fixed settings: the book's quick setting on CIFAR-10
MAP_SETTINGS = {"dataset": "cifar10", "recipe": "quick", "train_subset": 15000}


def cell_runs(spec: dict) -> list[RunConfig]:
    """The runs of one cell a reader names (``{"model": "cct-mini-deep", "density": 0.5}``,
    optionally ``epochs``, ``seeds``, ``start``): BARTER and Static per seed at the map's
    settings (:data:`MAP_SETTINGS`)."""
    if not isinstance(spec, dict):
        raise BarterError(f"a map cell is a mapping such as {{model: cct-mini-deep, density: 0.5}}, not {spec!r}")
    unknown = sorted(set(spec) - set(CELL_SPEC))
    missing = [key for key, default in CELL_SPEC.items() if default is None and key not in spec]
    if unknown or missing:
        raise BarterError(f"a map cell has the keys {', '.join(CELL_SPEC)} (model and density required): "
                          + (f"unknown {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}"))
    cell = {**CELL_SPEC, **spec}
    seeds = check_list("seeds", cell["seeds"], "seeds")
    return [RunConfig(method=method, model=cell["model"], density=cell["density"], seed=seed,
                      epochs=cell["epochs"], start=cell["start"], progress=False, **MAP_SETTINGS).validate()
            for seed in seeds for method in reversed(PAIR)]


def train_cells(specs: list[dict], cache_dir: Path | None = None) -> pd.DataFrame:
    """The runs of the cells ``specs`` (:func:`cell_runs`) as rows of the map's form, trained
    through the run cache (a run trained before is read, not retrained); ``commit`` is left
    empty: these rows are the reader's, not recorded."""
    rows = [map_row({**vars(run), "train_subset": str(run.train_subset)}, cached_train(run, cache_dir), "")
            for spec in specs for run in cell_runs(spec)]
    return pd.DataFrame(rows, columns=list(COLUMNS))
