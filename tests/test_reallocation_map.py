"""The map of where reallocation pays (chapter 05): recorded runs, paired by seed."""

import re
import shlex

import pytest

import barter_mini.training.cache as cache
from barter_mini.book.reallocation_map import CELL, COLUMNS, MAP_CSV, read_map, rows_from_cache, write_map
from barter_mini.cli import build_parser
from barter_mini.training.run_config import RunConfig


def run_row(method, seed, val, test, density=0.3, model="cct-mini"):
    return {"model": model, "dataset": "cifar10", "density": density, "epochs": 3, "train_subset": "15000",
            "start": "even", "method": method, "seed": seed, "val_acc": val, "test_acc": test,
            "train_time_s": 100.0, "threads": 1, "commit": "0" * 40, "command": "barter-mini sweep"}


def test_the_recorded_map_pairs_every_cell_and_runs_no_seed_twice(tmp_path, monkeypatch):
    frame = read_map()
    assert not frame.duplicated(list(CELL) + ["method", "seed"]).any()
    for _, runs in frame.groupby(list(CELL)):
        by_method = {method: set(runs[runs.method == method].seed) for method in ("barter", "static")}
        assert by_method["barter"] == by_method["static"] and len(by_method["barter"]) >= 5
    copy = tmp_path / MAP_CSV.name                     # read from $BARTER_MINI_RECORDED when set
    copy.write_text(MAP_CSV.read_text().replace(",barter,0,", ",barter,99,", 1))
    monkeypatch.setenv("BARTER_MINI_RECORDED", str(tmp_path))
    assert 99 in set(read_map().seed) and 99 not in set(read_map(MAP_CSV).seed)


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


def test_the_recorded_map_names_the_command_and_commit_of_every_row():
    frame = read_map(MAP_CSV)
    parser = build_parser()
    for row in frame.itertuples():
        assert re.fullmatch(r"[0-9a-f]{40}", row.commit), row
        args = parser.parse_args(shlex.split(row.command)[1:])
        assert (args.model, args.dataset, args.densities, args.seeds) == (row.model, row.dataset, [row.density], [row.seed])
        assert args.epochs == row.epochs and row.method in args.methods


# --- the cells a reader adds ------------------------------------------------------------

from barter_mini.book.reallocation_map import cell_runs  # noqa: E402
from barter_mini.errors import BarterError  # noqa: E402


@pytest.mark.parametrize("spec, words", [
    ({"density": 0.5}, "missing model"),
    ({"model": "cct-mini", "density": 0.5, "lr": 1}, "unknown lr"),
    ("cct-mini", "a map cell is a mapping"),
    ({"model": "cct-mini", "density": 2}, "density"),
])
def test_a_bad_cell_is_a_one_line_error(spec, words):
    with pytest.raises(BarterError, match=words) as error:
        cell_runs(spec)
    assert "\n" not in str(error.value)


def test_a_cell_is_barter_and_static_per_seed_at_the_maps_settings():
    runs = cell_runs({"model": "cct-mini-deep", "density": 0.5, "seeds": [3, 4], "start": "first"})
    assert [(run.method, run.seed) for run in runs] == [("static", 3), ("barter", 3), ("static", 4), ("barter", 4)]
    assert {(run.dataset, run.recipe, run.train_subset, run.epochs, run.start) for run in runs} == {
        ("cifar10", "quick", 15000, 3, "first")}
