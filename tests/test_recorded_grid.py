"""The recorded grids: each is its chapter run with other parameter values, its one sweep
command trains exactly those runs (the book build's own runs among them), and its table comes
from a real run cache with the command and the commit that trained it."""

from __future__ import annotations

import re
import shlex

import pytest

from barter_mini.book.build import REPO
from barter_mini.book.finetuning import MATCHED_METHODS, finetuning_runs
from barter_mini.book.plans import book_stages, chapter_plan, recorded_grids
from barter_mini.book.profiles import resolve_profile
from barter_mini.book.recorded_grid import PROVENANCE, RecordedGrid
from barter_mini.cli import build_parser
from barter_mini.errors import BarterError
from barter_mini.training.cache import cached_train, run_dir


GRIDS = recorded_grids()


def _names(runs) -> list[str]:
    return sorted(run_dir(run).name for run in runs)


@pytest.mark.parametrize("name, count, stages", [("from_scratch", 7 * 3 * 3 + 3, 1), ("ablations", 5 * 3, 1),
                                                 ("policies", 5 * 3, 1), ("multipliers", 4 * 3, 1),
                                                 ("finetuning", 3, 3)])
def test_the_grid_command_trains_exactly_the_chapters_runs_and_the_builds_own_among_them(name, count, stages):
    """The first stage's runs (chapter 06 pretrains first; its fine-tuning runs are listed once
    the pretrained models are in the cache)."""
    grid = GRIDS[name]
    args = build_parser().parse_args(shlex.split(grid.command())[1:])
    swept = book_stages(args.book, args.chapters, parameters=dict(args.parameter))
    assert len(swept) == stages and _names(swept[0].runs()) == _names(grid.runs())
    assert len(grid.runs()) == count
    assert set(_names(book_stages("quick", [grid.chapter])[0].runs())) <= set(_names(grid.runs()))
    assert grid.csv.parent.name == "data"


def test_the_table_is_read_from_a_real_cache_and_a_missing_run_names_the_command(tmp_path):
    grid = RecordedGrid("tiny", chapter_plan("08"), {"multipliers": [1, 2], "seeds": [0], "dataset": "digits"})
    first, second = grid.runs("smoke")
    cached_train(first, tmp_path / "cache")
    command = grid.command("smoke")
    with pytest.raises(BarterError, match=r"^the tiny grid is not all in the run cache \(run barter-.*\): "
                                          + re.escape(f"train it with `{command}`") + "$"):
        grid.frame("a" * 40, "smoke", tmp_path / "cache")
    cached_train(second, tmp_path / "cache")
    path = grid.record("a" * 40, "smoke", tmp_path / "cache", tmp_path / "grid.csv")
    frame = grid.read(path)
    assert list(frame.columns[-2:]) == list(PROVENANCE) and list(frame["multiplier"]) == [1, 2]
    assert frame["acc"].between(0, 100).all() and (frame["commit"] == "a" * 40).all()
    digits = "0123456789" * 4    # a commit hash of digits only is read back as the same text, not a number
    assert (grid.read(grid.record(digits, "smoke", tmp_path / "cache", tmp_path / "digits.csv"))["commit"] == digits).all()
    args = build_parser().parse_args(shlex.split(frame["command"][0])[1:])
    assert (args.book, args.chapters, dict(args.parameter)) == ("smoke", ["08"], grid.parameters)
    with pytest.raises(BarterError, match=r"missing\.csv is missing: train the tiny grid with `barter-mini sweep"):
        grid.read(tmp_path / "missing.csv")


def _read_by_a_chapter(grid) -> bool:
    """Whether the grid's chapter notebook reads its recorded file."""
    notebook = next((REPO / "notebooks").glob(f"{grid.chapter}_*.ipynb"))
    return f'recorded_grid(\\"{grid.name}\\")' in notebook.read_text()


def _table_rows(grid) -> int:
    """How many rows the chapter's table of the grid has: one per run, except chapter 06's,
    whose table holds the fine-tuning runs (after the recipe's epochs, and compute-matched
    BARTER and Static per sparse density and seed) and not the pretraining runs they start from."""
    if grid.name != "finetuning":
        return len(grid.runs())
    p = grid.notebook_parameters()
    matched = p["compute_matched"] * len(MATCHED_METHODS) * sum(d < 1 for d in p["densities"]) * len(p["seeds"])
    return len(finetuning_runs(resolve_profile("quick", p["dataset"]), p["methods"], p["densities"], p["seeds"])) + matched


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_a_recorded_grid_a_chapter_reads_holds_every_run_with_its_command_and_commit(name):
    grid = GRIDS[name]
    if not _read_by_a_chapter(grid):
        assert not grid.csv.exists(), f"{grid.csv} is recorded but no chapter reads it"
        return
    frame = grid.read()
    assert len(frame) == _table_rows(grid)
    keys = [column for column in ("method", "policy", "multiplier", "density", "schedule") if column in frame]
    assert frame.groupby(keys)["seed"].nunique().min() >= 3
    assert not frame.duplicated(keys + ["seed"]).any()
    assert frame["commit"].str.fullmatch(r"[0-9a-f]{40}").all() and (frame["command"] == grid.command()).all()
    assert frame["acc"].between(0, 100).all()
