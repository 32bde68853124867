"""The recorded grids of chapters 02 and 03: the runs their command trains are the chapter's
own runs, and their rows come from a real run cache with the command and the commit that
trained them."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest

from barter_mini.book import recorded_grid
from barter_mini.book.experiments import summarize
from barter_mini.book.profiles import PROFILES
from barter_mini.book.recorded_grid import ABLATIONS, FROM_SCRATCH, GRIDS, RecordedGrid
from barter_mini.cli import GRID_SETTINGS, build_parser
from barter_mini.errors import BarterError
from barter_mini.training import sweep
from barter_mini.training.cache import cached_train, run_dir


def _sweep_runs(command: str):
    """The runs ``barter-mini sweep`` would train for ``command``."""
    args = build_parser().parse_args(shlex.split(command)[1:])
    settings = {name: getattr(args, name) for name in GRID_SETTINGS if getattr(args, name) is not None}
    return sweep.grid_runs(args.methods, args.densities, args.seeds, **settings)


@pytest.mark.parametrize("grid, count", [(FROM_SCRATCH, 7 * 3 * 3 + 3), (ABLATIONS, 5 * 3)], ids=lambda g: str(g))
def test_the_grid_command_trains_exactly_the_chapters_runs(grid, count):
    setup = PROFILES["quick"]
    ours = grid.runs(setup)
    assert len(ours) == count
    assert sorted(map(str, map(run_dir, _sweep_runs(grid.command(setup))))) == sorted(map(str, map(run_dir, ours)))
    assert GRIDS[grid.name] is grid and grid.csv.parent.name == "data"


def test_rows_are_read_from_a_real_cache_and_a_missing_run_names_the_command(tmp_path):
    tiny = replace(PROFILES["smoke"], dataset="digits", train_subset=64, grid_train_subset=64)
    grid = RecordedGrid("tiny", ("static", "barter"), (0.5,), (0, 1))
    runs = grid.runs(tiny)
    for run in runs[:-1]:
        cached_train(run, tmp_path / "cache")
    with pytest.raises(BarterError, match=r"^1 of the tiny grid's runs are not in the cache: train them with "
                                          r"`barter-mini sweep --methods static,barter --densities 0.5 --seeds 0,1"):
        grid.rows("a" * 40, tiny, tmp_path / "cache")
    cached_train(runs[-1], tmp_path / "cache")
    path = grid.record("a" * 40, tiny, tmp_path / "cache", tmp_path / "grid.csv")
    frame = grid.read(path)
    assert list(frame.columns) == list(recorded_grid.COLUMNS) and len(frame) == 4
    assert frame["acc"].between(0, 100).all() and (frame["commit"] == "a" * 40).all()
    for row in frame.itertuples():
        args = build_parser().parse_args(shlex.split(row.command)[1:])
        assert (args.methods, args.densities, args.seeds) == ([row.method], [row.density], [row.seed])
    assert set(summarize(frame)["seeds"]) == {2}
