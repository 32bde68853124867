"""Chapter 04's recorded timing grid: what it holds, how it is recorded and read."""

from __future__ import annotations

from pathlib import Path

import pytest

from barter_mini.book.efficiency import BENCH_GRID, BenchGrid
from barter_mini.errors import BarterError
from barter_mini.training.methods import bench_methods


def test_the_recorded_grid_holds_every_case_of_every_run_with_its_provenance():
    assert BENCH_GRID.methods == bench_methods()          # the grid measures what the bench measures
    grid = BENCH_GRID.read()
    cases = {(model, method, density) for model, _ in BENCH_GRID.models for method in bench_methods()
             for density in ([1.0] if method == "dense" else BENCH_GRID.densities)}
    for repeat in range(BENCH_GRID.repeats):
        run = grid[grid["repeat"] == repeat]
        assert set(zip(run["model"], run["method"], run["density"])) == cases, repeat
    assert len(grid) == len(cases) * BENCH_GRID.repeats
    assert (grid["command"] == BENCH_GRID.command).all()
    assert grid["commit"].str.fullmatch(r"[0-9a-f]{7,40}").all()
    assert {"cpu", "threads", "torch"} <= set(grid.columns)
    assert (grid["step_ms"] > 0).all() and (grid["batch"] == 16).all()


def test_a_grid_records_each_run_and_reads_back_atomically(tmp_path):
    tiny = BenchGrid(models=(("cct-mini", 4),), methods=("rigl", "static"), densities=(0.3,), steps=1, warmup=1,
                     segment_steps=1, repeats=2)
    path = tiny.record("abc1234", path=tmp_path / "bench_grid.csv")
    frame = tiny.read(path)
    assert sorted(frame["repeat"].unique()) == [0, 1]
    assert len(frame) == 2 * 2
    assert (frame["commit"] == "abc1234").all() and (frame["model"] == "cct-mini").all()
    assert not list(tmp_path.glob("*.tmp*"))          # written through a temporary file, renamed


def test_a_missing_grid_is_one_line_naming_the_command(tmp_path):
    with pytest.raises(BarterError, match=r"record the bench grid with `python -m barter_mini.book.efficiency`"
                                          r" on a quiet machine") as error:
        BENCH_GRID.read(Path(tmp_path / "absent.csv"))
    assert "\n" not in str(error.value)
