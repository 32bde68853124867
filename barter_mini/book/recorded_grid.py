"""Grids recorded at a scale the book build cannot afford, read by the chapters beside their
own runs.

The hour of a quick book holds each chapter's own runs at one density and one seed; the
grids the chapters' conclusions rest on (three seeds, and for chapter 02 three densities, at
the quick profile's settings) cost hours of two cores more. Each comparison is then paired by
seed and told from the seed noise (:func:`~barter_mini.book.seed_noise.beyond_noise`). A recorded grid is a chapter run
with other values of its papermill parameters (``seeds=[0, 1, 2]``, ...): it is trained once
by the one ``barter-mini sweep --book`` command :meth:`RecordedGrid.command` prints, and its
table, the same table the chapter makes of its own runs, is recorded in a small CSV under
``data/`` with that command and the commit of the code that trained it
(:meth:`RecordedGrid.record`). A chapter reads its file (:meth:`RecordedGrid.read`) and draws
it beside its own runs, marked as recorded; a rebuild never recomputes it.

* :data:`FROM_SCRATCH` (chapter 02): every method at rho = 0.1, 0.3 and 0.7, seeds 0-2;
* :data:`ABLATIONS` (chapter 03): Static, the three random variants and BARTER at the
  paper's rho = 0.5, seeds 0-2;
* :data:`POLICIES` (chapter 07): the five optimizer-state policies at rho = 0.3, seeds 0-2;
* :data:`MULTIPLIERS` (chapter 08): transfer counts x1, x2, x4, x6 at rho = 0.5, seeds 0-2;
* :data:`FINETUNING` (chapter 06, Figure 5): every method fine-tuned at rho = 0.1, 0.3 and 0.7
  and BARTER compute-matched, seeds 0-2 (its runs come in three stages: pretraining first).
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import pandas as pd

from ..errors import BarterError
from ..training.cache import CACHE_ENV
from ..training.checkpoints import write_csv_atomically
from ..training.sweep import read_only_cache
from .build import REPO, source_notebooks
from .experiments import ABLATION_METHODS, run_grid
from .finetuning import run_finetuning
from .grids import CHAPTERS, chapter_parameters, listed_runs
from .optimizer_state import run_policies
from .profiles import Profile, resolve_profile
from .transfer_counts import run_multipliers

#: where the recorded grids live
DATA_DIR = Path(__file__).resolve().parents[2] / "data"
#: a folder to read the recorded grids from instead of :data:`DATA_DIR` (a test flips a value
#: in a copy and shows that the page's claims stop the build)
DATA_ENV = "BARTER_MINI_RECORDED"


def recorded_data_dir() -> Path:
    """:data:`DATA_DIR`, or the folder named by ``$BARTER_MINI_RECORDED``."""
    return Path(os.environ[DATA_ENV]) if os.environ.get(DATA_ENV) else DATA_DIR
#: the columns of a chapter's table that hold a count per layer (a tuple)
ALLOCATION_COLUMNS = frozenset({"heads", "ffn"})
#: what every recorded row carries after the chapter's own columns
PROVENANCE = ("commit", "command")


@dataclass(frozen=True)
class RecordedGrid:
    """Chapter ``chapter`` run with ``parameters`` instead of its defaults, its table recorded
    in ``data/NAME_grid.csv``. ``table(setup, parameters)`` is the chapter's own function that
    makes one row per run (reading or training each run through the run cache)."""

    name: str
    chapter: str
    parameters: dict = field(hash=False)
    table: Callable[[Profile, dict], pd.DataFrame] = field(repr=False, compare=False)

    @property
    def csv(self) -> Path:
        return recorded_data_dir() / f"{self.name}_grid.csv"

    def notebook_parameters(self, profile: str = "quick", repo: Path = REPO) -> dict:
        """The chapter notebook's parameters: its defaults with :attr:`parameters` applied."""
        notebook = {path.name[:2]: path for path in source_notebooks(repo)}[self.chapter]
        return chapter_parameters(notebook, self.parameters, profile)

    def runs(self, profile: str = "quick", repo: Path = REPO) -> list:
        """The grid's runs that need no other run's result, exactly as ``barter-mini sweep``
        lists them for :meth:`command` (chapter 06's fine-tuning runs follow once these are
        trained)."""
        return listed_runs(CHAPTERS[self.chapter](profile, self.notebook_parameters(profile, repo))[0])

    def command(self, profile: str = "quick") -> str:
        """The one ``barter-mini sweep`` command that trains the whole grid under ``profile``."""
        flags = " ".join(f"--parameter {name}={json.dumps(value, separators=(',', ':'))}"
                         for name, value in self.parameters.items())
        return f"barter-mini sweep --book {profile} --chapters {self.chapter} {flags} --jobs 2"

    def frame(self, commit: str, profile: str = "quick", cache_dir: Path | None = None,
              repo: Path = REPO) -> pd.DataFrame:
        """The chapter's table of the grid's runs, read from the run cache (never trained),
        with :data:`PROVENANCE`: ``commit`` names the code that trained them. A missing run is
        a one-line :class:`~barter_mini.errors.BarterError` with :meth:`command`."""
        parameters = self.notebook_parameters(profile, repo)
        setup = resolve_profile(profile, parameters["dataset"])
        try:
            # the cache only (read_only_cache): a missing run raises instead of training
            with read_only_cache(), mock.patch.dict(os.environ, {} if cache_dir is None else
                                                    {CACHE_ENV: str(Path(cache_dir).resolve())}):
                table = self.table(setup, parameters)
        except BarterError as error:
            raise BarterError(f"the {self.name} grid is not all in the run cache ({str(error).split(':')[0]}): "
                              f"train it with `{self.command(profile)}`") from None
        return table.assign(commit=commit, command=self.command(profile))

    def record(self, commit: str, profile: str = "quick", cache_dir: Path | None = None,
               path: Path | None = None) -> Path:
        """Write :meth:`frame` to ``path`` (default :attr:`csv`), atomically."""
        frame = self.frame(commit, profile, cache_dir).round(4)     # scores in % to 1e-4: what a page shows
        return write_csv_atomically(Path(path or self.csv), tuple(frame.columns), frame.to_dict("records"))

    def read(self, path: Path | None = None) -> pd.DataFrame:
        """The recorded table, in the layout of the chapter's own (plus :data:`PROVENANCE`), so
        that the chapter's summaries, figures and sentences read it as they read its runs."""
        path = Path(path or self.csv)
        if not path.is_file():
            raise BarterError(f"{path} is missing: train the {self.name} grid with `{self.command()}`, then record "
                              f"it with barter_mini.book.recorded_grid.GRIDS[{self.name!r}].record(commit)")
        frame = pd.read_csv(path, dtype={"commit": "string"})    # a hash of digits only is still a hash
        for column in ALLOCATION_COLUMNS.intersection(frame.columns):     # per-layer counts, written as "(2, 3)"
            frame[column] = frame[column].map(ast.literal_eval)
        return frame


def _from_scratch(setup: Profile, p: dict) -> pd.DataFrame:
    return run_grid(setup, p["methods"], p["densities"], p["seeds"], progress=False)


def _ablations(setup: Profile, p: dict) -> pd.DataFrame:
    return run_grid(setup, ABLATION_METHODS, [p["density"]], p["seeds"], progress=False)


def _policies(setup: Profile, p: dict) -> pd.DataFrame:
    return run_policies(setup, p["policies"], p["density"], p["seeds"], progress=False)[0]


def _multipliers(setup: Profile, p: dict) -> pd.DataFrame:
    return run_multipliers(setup, p["multipliers"], p["density"], p["seeds"], progress=False)


def _finetuning(setup: Profile, p: dict) -> pd.DataFrame:
    return run_finetuning(setup, p["methods"], p["densities"], p["seeds"], p["compute_matched"], progress=False)


SEEDS = [0, 1, 2]
#: chapter 02: every method at the paper's lowest, a middle and a high density, three seeds
FROM_SCRATCH = RecordedGrid("from_scratch", "02", {"densities": [0.1, 0.3, 0.7], "seeds": SEEDS}, _from_scratch)
#: chapter 03: the ablations of Figure 6 at its density, three seeds
ABLATIONS = RecordedGrid("ablations", "03", {"seeds": SEEDS}, _ablations)
#: chapter 07: every optimizer-state policy, three seeds
POLICIES = RecordedGrid("policies", "07", {"seeds": SEEDS}, _policies)
#: chapter 08: every transfer-count multiplier, three seeds
MULTIPLIERS = RecordedGrid("multipliers", "08", {"seeds": SEEDS}, _multipliers)
#: chapter 06: Figure 5 (a) and (b), a line per method over three densities, three seeds
FINETUNING = RecordedGrid("finetuning", "06", {"densities": [0.1, 0.3, 0.7], "seeds": SEEDS}, _finetuning)
#: every recorded grid, by name
GRIDS = {grid.name: grid for grid in (FROM_SCRATCH, ABLATIONS, POLICIES, MULTIPLIERS, FINETUNING)}
