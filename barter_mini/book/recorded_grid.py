"""Chapter 02's grid, recorded: every method at three densities over three seeds.

The hour of a quick book holds chapter 02's own runs at one density and one seed; the grid
its conclusions rest on (:data:`GRID_DENSITIES` x :data:`GRID_SEEDS`, the quick profile's
settings) costs about an hour of two cores more, so it is trained once by the command
:func:`grid_command` prints and recorded in :data:`GRID_CSV`: one row per run, with the
command that trains it and the commit of the code that did (:func:`record_grid`). The
chapter reads that file (:func:`read_grid`) and draws it beside its own runs, marked as
recorded; a rebuild never recomputes it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import BarterError
from ..training.cache import cached_metrics, sweep_command
from ..training.checkpoints import write_csv_atomically
from .experiments import grid_runs
from .profiles import PROFILES, Profile

#: the recorded grid, one row per run (:data:`COLUMNS`)
GRID_CSV = Path(__file__).resolve().parents[2] / "data" / "from_scratch_grid.csv"
#: chapter 02's methods (dense trains once, at rho = 1)
GRID_METHODS = ("dense", "set", "snfs", "rigl", "srigl", "s2vite", "static", "barter")
#: the paper's lowest, a middle and a high density (Tables 1 and 13)
GRID_DENSITIES = (0.1, 0.3, 0.7)
#: three seeds, as the paper averages
GRID_SEEDS = (0, 1, 2)
#: Top-1 and macro-F1 in %, as :func:`~barter_mini.book.experiments.run_grid` gives them
COLUMNS = ("method", "density", "seed", "val_acc", "acc", "f1", "wall_time_s", "model", "dataset", "recipe",
           "epochs", "train_subset", "commit", "command")


def grid_command(setup: Profile = PROFILES["quick"]) -> str:
    """The one ``barter-mini sweep`` command that trains the whole grid under ``setup``."""
    return (f"barter-mini sweep --methods {','.join(GRID_METHODS)} "
            f"--densities {','.join(f'{d:g}' for d in GRID_DENSITIES)} --seeds {','.join(map(str, GRID_SEEDS))} "
            f"--model {setup.model} --dataset {setup.dataset} --recipe {setup.recipe} --epochs {setup.epochs} "
            f"--train-subset {setup.grid_train_subset} --jobs 2")


def grid_rows(commit: str, setup: Profile = PROFILES["quick"], cache_dir: Path | None = None) -> list[dict]:
    """One :data:`COLUMNS` row per run of the grid, read from the run cache (never trained);
    ``commit`` names the code that trained them. A missing run is a one-line
    :class:`~barter_mini.errors.BarterError` with :func:`grid_command`."""
    rows, missing = [], 0
    for run in grid_runs(setup, GRID_METHODS, GRID_DENSITIES, GRID_SEEDS):
        metrics = cached_metrics(run, cache_dir)
        if metrics is None:
            missing += 1
            continue
        rows.append({"method": run.method, "density": run.density, "seed": run.seed,
                     "val_acc": round(100 * metrics["val_acc"], 2), "acc": round(100 * metrics["test_acc"], 2),
                     "f1": round(100 * metrics["test_macro_f1"], 2),
                     "wall_time_s": round(metrics["wall_time_s"], 1), "model": run.model, "dataset": run.dataset,
                     "recipe": run.recipe, "epochs": run.epochs, "train_subset": run.train_subset,
                     "commit": commit, "command": sweep_command(run)})
    if missing:
        raise BarterError(f"{missing} of the grid's runs are not in the cache: train them with "
                          f"`{grid_command(setup)}`")
    return rows


def record_grid(commit: str, setup: Profile = PROFILES["quick"], cache_dir: Path | None = None,
                path: Path = GRID_CSV) -> Path:
    """Write the grid's rows (:func:`grid_rows`) to ``path``, atomically."""
    return write_csv_atomically(Path(path), COLUMNS, grid_rows(commit, setup, cache_dir))


def read_grid(path: Path = GRID_CSV) -> pd.DataFrame:
    """The recorded runs, in the layout of :func:`~barter_mini.book.experiments.run_grid`
    (``method``, ``density``, ``seed``, ``val_acc``, ``acc``, ``f1``), so that
    :func:`~barter_mini.book.experiments.summarize` and the chapter's tables read them as
    they read its own runs."""
    return pd.read_csv(path)
