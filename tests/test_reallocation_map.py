"""The map of where reallocation pays (chapter 05): recorded runs, paired by seed."""

import math
import re
import shlex

import pandas as pd
import pytest

import barter_mini.training.cache as cache
from barter_mini.book.reallocation_map import (CELL, COLUMNS, MAP_CSV, paired_cells, read_map, rows_from_cache,
                                                write_map)
from barter_mini.cli import build_parser
from barter_mini.training.run_config import RunConfig


def run_row(method, seed, val, test, density=0.3, model="cct-mini"):
    return {"model": model, "dataset": "cifar10", "density": density, "epochs": 3, "train_subset": "15000",
            "start": "even", "method": method, "seed": seed, "val_acc": val, "test_acc": test,
            "train_time_s": 100.0, "threads": 1, "commit": "0" * 40, "command": "barter-mini sweep"}


def test_cells_pair_by_seed_and_leave_out_unpaired_seeds():
    frame = pd.DataFrame([run_row("barter", 0, 0.50, 0.40), run_row("static", 0, 0.48, 0.41),
                          run_row("barter", 1, 0.46, 0.45), run_row("static", 1, 0.47, 0.43),
                          run_row("barter", 2, 0.90, 0.90)])          # seed 2 has no Static run: not paired
    cell = paired_cells(frame).iloc[0]
    assert cell.seeds == 2
    assert cell.val_gap == pytest.approx((2.0 - 1.0) / 2)            # +2 and -1 points
    assert cell.val_std == pytest.approx(math.sqrt(((2 - 0.5) ** 2 + (-1 - 0.5) ** 2) / 1))
    assert cell.val_sem == pytest.approx(cell.val_std / math.sqrt(2))
    assert cell.test_gap == pytest.approx((-1.0 + 2.0) / 2)


def test_rows_come_from_a_real_cache_and_merge_into_the_csv(tmp_path):
    runs = [RunConfig(method=method, model="vit-mini", dataset="digits", density=0.5, seed=0, recipe="smoke",
                      epochs=1, progress=False) for method in ("static", "barter", "rigl")]
    for run in runs:
        cache.cached_train(run, tmp_path / "cache")
    rows = rows_from_cache(tmp_path / "cache", "a" * 40)
    assert sorted(row["method"] for row in rows) == ["barter", "static"]          # the pair only
    path = write_map(rows, tmp_path / "map.csv")
    again = write_map([{**rows[0], "val_acc": 0.123}], path)                     # a rerun replaces its row
    frame = read_map(again)
    assert len(frame) == 2 and list(frame.columns) == list(COLUMNS)
    assert frame.loc[frame.method == rows[0]["method"], "val_acc"].item() == 0.123
    assert paired_cells(frame).iloc[0].seeds == 1


def test_the_recorded_map_names_the_command_and_commit_of_every_row():
    frame = read_map(MAP_CSV)
    parser = build_parser()
    for row in frame.itertuples():
        assert re.fullmatch(r"[0-9a-f]{40}", row.commit), row
        args = parser.parse_args(shlex.split(row.command)[1:])
        assert (args.model, args.dataset, args.densities, args.seeds) == (row.model, row.dataset, [row.density], [row.seed])
        assert args.epochs == row.epochs and row.method in args.methods
    cells = paired_cells(frame)
    assert len(cells) == frame.groupby(list(CELL)).ngroups          # every recorded cell has paired seeds
    assert (cells.seeds >= 3).all()
