"""Grids recorded at a scale the book build cannot afford, read by the chapters beside their
own runs.

The hour of a quick book holds each chapter's own runs at one density and one seed; the
grids the chapters' conclusions rest on (three seeds, and for chapters 02 and 06 three
densities, at the quick profile's settings) cost hours of two cores more. A recorded grid is a
chapter run with other values of its papermill parameters, declared under ``recorded:`` in the
chapter's plan (:mod:`~barter_mini.book.plans`): it is trained once by the one
``barter-mini sweep --book`` command :meth:`RecordedGrid.command` prints, and its table, the
same table the chapter makes of its own runs, is recorded in a small CSV under ``data/`` with
that command and the commit of the code that trained it (:meth:`RecordedGrid.record`). A
chapter reads its file (:meth:`RecordedGrid.read`), draws it beside its own runs and rests its
hand-written conclusions on it; a rebuild never recomputes it. To re-record one::

    barter-mini sweep --book quick --chapters 03 --parameter seeds=[0,1,2] --jobs 2
    python -c "from barter_mini.book.plans import recorded_grids; recorded_grids()['ablations'].record('COMMIT')"
"""

from __future__ import annotations

import ast
import json
import os
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from ..errors import BarterError
from ..training.checkpoints import write_csv_atomically

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
    """The chapter of ``plan`` run with ``parameters`` instead of its defaults, its table
    recorded in ``data/NAME_grid.csv``."""

    name: str
    #: the chapter's :class:`~barter_mini.book.plans.ChapterPlan` (that module imports this one)
    plan: "barter_mini.book.plans.ChapterPlan" = field(repr=False)
    parameters: dict = field(hash=False)

    @property
    def chapter(self) -> str:
        return self.plan.chapter

    @property
    def csv(self) -> Path:
        return recorded_data_dir() / f"{self.name}_grid.csv"

    def notebook_parameters(self, profile: str = "quick") -> dict:
        """The chapter notebook's parameters: its defaults with :attr:`parameters` applied."""
        return self.plan.parameters(self.parameters, profile)

    def runs(self, profile: str = "quick") -> list:
        """The grid's runs that need no other run's result, exactly as ``barter-mini sweep``
        lists them for :meth:`command` (chapter 06's fine-tuning runs follow once these are
        trained)."""
        return self.plan.stages(profile, self.notebook_parameters(profile))[0]()

    def command(self, profile: str = "quick") -> str:
        """The one ``barter-mini sweep`` command that trains the whole grid under ``profile``."""
        flags = " ".join("--parameter " + shlex.quote(f"{name}={json.dumps(value, separators=(',', ':'))}")
                         for name, value in self.parameters.items())
        return f"barter-mini sweep --book {profile} --chapters {self.chapter} {flags} --jobs 2"

    def frame(self, commit: str, profile: str = "quick", cache_dir: Path | None = None) -> pd.DataFrame:
        """The chapter's table of the grid's runs, read from the run cache (never trained),
        with :data:`PROVENANCE`: ``commit`` names the code that trained them. A missing run is
        a one-line :class:`~barter_mini.errors.BarterError` with :meth:`command`."""
        parameters = self.notebook_parameters(profile)
        # the cache only: a missing run raises instead of training
        setup = replace(self.plan.setup(profile, parameters), cache_dir=cache_dir and Path(cache_dir).resolve(),
                        train_missing=False)
        try:
            table = self.plan.table(setup, parameters)
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
                              f"it with barter_mini.book.plans.recorded_grids()[{self.name!r}].record(commit)")
        frame = pd.read_csv(path, dtype={"commit": "string"})    # a hash of digits only is still a hash
        for column in ALLOCATION_COLUMNS.intersection(frame.columns):     # per-layer counts, written as "(2, 3)"
            frame[column] = frame[column].map(ast.literal_eval)
        return frame

