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


def test_a_seed_run_twice_in_a_cell_is_refused_with_the_cell_named():
    frame = pd.DataFrame([run_row("barter", 0, 0.50, 0.40), run_row("static", 0, 0.48, 0.41),
                          run_row("barter", 0, 0.51, 0.42)])
    with pytest.raises(ValueError, match=r"barter ran seed 0 twice in the cell cct-mini .*, rho 0.3, 3 ep: keep one"):
        paired_cells(frame)


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


# --- the book's map: its figure, its table and its reading -------------------------------

from barter_mini.book.reallocation_map import cell_runs, map_reading, map_table, paper_gaps, plot_map  # noqa: E402
from barter_mini.book.experiments import read_paper_table  # noqa: E402
from barter_mini.errors import BarterError  # noqa: E402

PAPER = paper_gaps(read_paper_table("table13_static_vs_barter_cct_cifar100"))


def cell_frame(gaps, model="cct-mini", density=0.3, epochs=3, start="even", base=0.6):
    """Runs whose paired validation gaps (points) are ``gaps``, one seed each."""
    rows = []
    for seed, gap in enumerate(gaps):
        rows += [{**run_row("static", seed, base, base, density, model), "epochs": epochs, "start": start},
                 {**run_row("barter", seed, base + gap / 100, base, density, model), "epochs": epochs,
                  "start": start}]
    return pd.DataFrame(rows)


def test_the_paper_gaps_are_table_13s():
    assert PAPER.set_index("density").gap.round(2).to_dict() == {0.1: 2.97, 0.3: 0.95, 0.5: 1.05, 0.7: 0.27}


def test_the_reading_of_a_level_map_says_no_gain_and_names_the_largest():
    frame = pd.concat([cell_frame([0.2, -0.2, 0.1, -0.1, 0.0]),
                       cell_frame([0.3, -0.1, 0.2, -0.2, 0.05], model="cct-mini-deep")])
    text = map_reading(frame, PAPER)
    assert ("ahead of Static beyond the seed noise (the paired validation gap beyond twice its standard error) "
            "in 0") in text
    assert "No cell shows a gain beyond the seed-to-seed noise" in text
    assert "the depth, from cct-mini 4x10 to cct-mini-deep 7x10 (at rho 0.3, 3 ep)" in text
    assert "0.00 ± 0.07 (level) to +0.05 ± 0.09 (level)" in text
    assert "0.0x" not in text and "opposite" not in text


def test_a_lead_on_five_seeds_is_reported_with_what_five_fresh_seeds_made_of_it():
    held = cell_frame([0.5, 0.6, 0.4, 0.5, 0.7, 0.4, 0.6, 0.5, 0.3, 0.6], model="cct-mini-deep", density=0.1)
    lost = cell_frame([0.5, 0.6, 0.4, 0.5, 0.7, 0.1, -0.4, 0.2, -0.3, 0.0], model="cct-mini-deep-16h", density=0.1)
    text = map_reading(pd.concat([held, lost]), PAPER)
    assert "Confirmed on fresh seeds: cct-mini-deep 7x10, rho 0.1, 3 ep: +0.54 ± 0.05 on its first five" in text
    assert "Not confirmed on fresh seeds: cct-mini-deep-16h 7x16, rho 0.1, 3 ep" in text
    assert "the heads per layer" in text
    assert "The largest lead beyond the seed noise is +0.51 points, against the paper's +2.97" in text


def test_one_seed_is_undecided_and_an_empty_map_says_so():
    assert "(1 with one seed: undecided)" in map_reading(cell_frame([0.4]), PAPER)
    assert map_reading(cell_frame([]).reindex(columns=COLUMNS), PAPER) == "The map has no recorded cell yet."


def test_the_map_figure_fits_the_column_and_labels_every_cell():
    import matplotlib
    matplotlib.use("Agg")
    frame = pd.concat([cell_frame([0.2, -0.2, 0.1]), cell_frame([0.3, 0.4, 0.35], start="first")])
    cells = paired_cells(frame)
    fig = plot_map(cells, PAPER, added=paired_cells(cell_frame([0.5, 0.2, 0.4], density=0.5)))
    assert fig.get_size_inches()[0] <= 7
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:3] == ["cct-mini 4x10, rho 0.3, 3 ep", "cct-mini 4x10, rho 0.3, 3 ep, piled start",
                          "cct-mini 4x10, rho 0.5, 3 ep (yours)"]
    assert sum(label.startswith("paper: cct-paper 7x16") for label in labels) == 4
    assert min(t.get_fontsize() for t in fig.axes[0].get_yticklabels()) >= 9
    table = map_table(cells)
    assert list(table["standing"]) == ["level", "ahead"] and list(table["seeds"]) == [3, 3]


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


def test_the_introductions_headline_is_composed_from_the_map():
    from barter_mini.book.reallocation_map import map_headline
    level = map_headline(pd.concat([cell_frame([0.2, -0.2, 0.1, -0.1, 0.0]),
                                    cell_frame([0.1, -0.3, 0.2, 0.0, 0.1], density=0.1)]))
    assert level == ("Over the 2 cells of the map, along the density (5 paired seeds each), BARTER is ahead of its own "
                     "frozen allocation (Static) beyond the seed noise in 0, and level or behind in 2.")
    lost = cell_frame([0.5, 0.6, 0.4, 0.5, 0.7, 0.1, -0.4, 0.2, -0.3, 0.0], model="cct-mini-deep-16h", density=0.1)
    text = map_headline(pd.concat([lost, cell_frame([0.1, 0.0, 0.2])]))
    assert "(3 to 10 paired seeds each)" in text and "Of the 1 lead seen on five seeds, 0 held on five fresh ones." in text
    assert "along" not in text                     # the two cells differ in more than one setting
