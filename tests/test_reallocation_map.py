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


# --- runs recorded on a lent GPU ---------------------------------------------------------

from barter_mini.book.reallocation_map import GPU_MAP_CSV, record_gpu_rows  # noqa: E402
from barter_mini.measure.gpu_pair import COLUMNS as GPU_COLUMNS  # noqa: E402


def gpu_row(method, seed, val, test):
    """A row as ``gpu-lend`` writes it (``gpu_pair.pair_row``) for a made-up lend."""
    return {**run_row(method, seed, val, test, density=0.1, model="cct-paper"), "epochs": 4, "train_subset": "",
            "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "precision": "bf16",
            "cuda_graphs": True, "batch": 128, "recipe": "paper"}


def write_rows(path, rows, columns=GPU_COLUMNS):
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_lends_pair_csv_is_recorded_into_the_gpu_map_and_nothing_else_is(tmp_path):
    pair = write_rows(tmp_path / "pair.csv", [gpu_row(m, s, 0.5 + s / 100, 0.5) for s in range(3)
                                             for m in ("static", "barter")])
    recorded = record_gpu_rows(pair, tmp_path / GPU_MAP_CSV.name)
    frame = read_map(recorded)
    assert list(frame.columns) == list(GPU_COLUMNS) and len(frame) == 6
    again = record_gpu_rows(write_rows(tmp_path / "more.csv", [gpu_row("barter", 0, 0.9, 0.9)]), recorded)
    assert len(read_map(again)) == 6 and read_map(again).query("method == 'barter' and seed == 0").val_acc.item() == 0.9
    with pytest.raises(BarterError, match="is not a gpu-pair CSV: it has no device, device_name"):
        record_gpu_rows(MAP_CSV, tmp_path / "x.csv")
    with pytest.raises(BarterError, match="BARTER and Static runs on a GPU only"):
        record_gpu_rows(write_rows(tmp_path / "cpu.csv", [{**gpu_row("barter", 0, 0.5, 0.5), "device": "cpu"}]),
                        tmp_path / "x.csv")


@pytest.mark.slow
def test_chapter_05_draws_recorded_gpu_runs_beside_the_cpu_cells_and_marks_them(tmp_path, monkeypatch):
    """Chapter 05 in the smoke profile with a GPU file among its recorded data: the map's table
    has the GPU cell, labelled with the card, and the page counts its runs. (It reads the
    smoke runs from the run cache, where the smoke book's build left them.)"""
    import shutil

    import nbformat
    import papermill

    repo = MAP_CSV.parents[1]
    recorded = tmp_path / "recorded"
    shutil.copytree(repo / "data", recorded, ignore=shutil.ignore_patterns("cifar10", "FashionMNIST"))
    write_rows(recorded / GPU_MAP_CSV.name, [gpu_row(m, s, 0.6 + (s % 2) / 100 + (m == "barter") / 200, 0.6)
                                             for s in range(5) for m in ("static", "barter")])
    monkeypatch.setenv("BARTER_MINI_RECORDED", str(recorded))
    monkeypatch.setenv("BARTER_MINI_DATA", str(repo / "data"))
    out = tmp_path / "05.ipynb"
    papermill.execute_notebook(str(repo / "notebooks" / "05_reallocation.ipynb"), str(out), kernel_name="python3",
                               parameters={"profile": "smoke"}, cwd=str(tmp_path), progress_bar=False)
    executed = nbformat.read(out, as_version=4)
    text = "\n".join(str(output.get("data", {}).get("text/plain", "")) + str(output.get("data", {}).get("text/html", ""))
                     for cell in executed.cells if cell.cell_type == "code" for output in cell.get("outputs", []))
    assert "GPU (H100): cct-paper 7x16, rho 0.1, 4 ep" in text
    assert "trained on a GPU: bf16 + graphs, batch 128" in text
    glued = [output for cell in executed.cells for output in cell.get("outputs", [])
             if output.get("metadata", {}).get("scrapbook", {}).get("name") == "05-gpu-runs"]
    assert len(glued) == 1 and "10" in {str(value) for value in glued[0]["data"].values()}, glued
