"""Grids recorded at a scale the book build cannot afford, read by the chapters beside their
own runs.

The hour of a quick book holds each chapter's own runs at one density and one seed; the
grids the chapters' conclusions rest on (three seeds, and for chapter 02 three densities, at
the quick profile's settings) cost an hour of two cores more. Each is trained once by the
command :meth:`RecordedGrid.command` prints and recorded in a small CSV under ``data/``: one
row per run, with the command that trains it and the commit of the code that did
(:meth:`RecordedGrid.record`). A chapter reads its file (:meth:`RecordedGrid.read`) and
draws it beside its own runs, marked as recorded; a rebuild never recomputes it.

* :data:`FROM_SCRATCH` (chapter 02): every method at rho = 0.1, 0.3 and 0.7, seeds 0-2;
* :data:`ABLATIONS` (chapter 03): Static, the three random variants and BARTER at the
  paper's rho = 0.5, seeds 0-2.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import BarterError
from ..training.cache import cached_metrics, sweep_command
from ..training.checkpoints import write_csv_atomically
from .experiments import ABLATION_METHODS, grid_runs, run_scores
from .profiles import PROFILES, Profile

#: where the recorded grids live
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
#: the columns of a recorded grid: Top-1 and macro-F1 in %, as
#: :func:`~barter_mini.book.experiments.run_grid` gives them, then what trained the run
COLUMNS = ("method", "density", "seed", "val_acc", "acc", "f1", "wall_time_s", "model", "dataset", "recipe",
           "epochs", "train_subset", "commit", "command")


@dataclass(frozen=True)
class RecordedGrid:
    """``methods x densities x seeds`` under a profile (dense once, at rho = 1), recorded in
    ``data/NAME_grid.csv``."""

    name: str
    methods: tuple[str, ...]
    densities: tuple[float, ...]
    seeds: tuple[int, ...]

    @property
    def csv(self) -> Path:
        return DATA_DIR / f"{self.name}_grid.csv"

    def runs(self, setup: Profile = PROFILES["quick"]) -> list:
        """The grid's runs, exactly as the chapter's own grid would train them."""
        return grid_runs(setup, self.methods, self.densities, self.seeds)

    def command(self, setup: Profile = PROFILES["quick"]) -> str:
        """The one ``barter-mini sweep`` command that trains the whole grid under ``setup``."""
        return (f"barter-mini sweep --methods {','.join(self.methods)} "
                f"--densities {','.join(f'{d:g}' for d in self.densities)} "
                f"--seeds {','.join(map(str, self.seeds))} --model {setup.model} --dataset {setup.dataset} "
                f"--recipe {setup.recipe} --epochs {setup.epochs} --train-subset {setup.grid_train_subset} "
                "--jobs 2")

    def rows(self, commit: str, setup: Profile = PROFILES["quick"], cache_dir: Path | None = None) -> list[dict]:
        """One :data:`COLUMNS` row per run, read from the run cache (never trained); ``commit``
        names the code that trained them. A missing run is a one-line
        :class:`~barter_mini.errors.BarterError` with :meth:`command`."""
        rows, missing = [], 0
        for run in self.runs(setup):
            metrics = cached_metrics(run, cache_dir)
            if metrics is None:
                missing += 1
                continue
            scores = {name: round(value, 2) for name, value in run_scores(metrics).items()}
            rows.append({"method": run.method, "density": run.density, "seed": run.seed, **scores,
                         "wall_time_s": round(metrics["wall_time_s"], 1), "model": run.model,
                         "dataset": run.dataset, "recipe": run.recipe, "epochs": run.epochs,
                         "train_subset": run.train_subset, "commit": commit, "command": sweep_command(run)})
        if missing:
            raise BarterError(f"{missing} of the {self.name} grid's runs are not in the cache: train them with "
                              f"`{self.command(setup)}`")
        return rows

    def record(self, commit: str, setup: Profile = PROFILES["quick"], cache_dir: Path | None = None,
               path: Path | None = None) -> Path:
        """Write the grid's rows (:meth:`rows`) to ``path`` (default :attr:`csv`), atomically."""
        return write_csv_atomically(Path(path or self.csv), COLUMNS, self.rows(commit, setup, cache_dir))

    def read(self, path: Path | None = None) -> pd.DataFrame:
        """The recorded runs, in the layout of :func:`~barter_mini.book.experiments.run_grid`
        (``method``, ``density``, ``seed``, ``val_acc``, ``acc``, ``f1``, ...), so that
        :func:`~barter_mini.book.experiments.summarize` and the chapter's tables read them
        as they read its own runs."""
        return pd.read_csv(path or self.csv)


#: chapter 02: every method at the paper's lowest, a middle and a high density, three seeds
FROM_SCRATCH = RecordedGrid("from_scratch", ("dense", "set", "snfs", "rigl", "srigl", "s2vite", "static", "barter"),
                            (0.1, 0.3, 0.7), (0, 1, 2))
#: chapter 03: the ablations of Figure 6 at its density, three seeds
ABLATIONS = RecordedGrid("ablations", ABLATION_METHODS, (0.5,), (0, 1, 2))
#: every recorded grid, by name
GRIDS = {grid.name: grid for grid in (FROM_SCRATCH, ABLATIONS)}
