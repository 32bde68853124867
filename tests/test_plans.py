"""Each chapter's runs are declared once, in the plan beside its notebook: the page trains them
from it, `barter-mini sweep --book` lists them from it, and its recorded grids are it at other
parameter values. A new chapter is its notebook, its plan and a line of _toc.yml."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from barter_mini.book.build import REPO, source_notebooks
from barter_mini.book.plans import KINDS, PLAN_SUFFIX, book_stages, chapter_plans, read_plan, recorded_grids
from barter_mini.errors import BarterError
from barter_mini.training.cache import run_dir

#: the package's run listings and trainers: a page reaches them only through its plan
LISTINGS = ("run_grid(", "grid_runs(", "run_policies(", "policy_run(", "run_multipliers(", "multiplier_run(",
            "run_finetuning(", "finetuning_runs(", "walkthrough_run(", "cached_train(")


def _code(notebook: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")


def _names(runs) -> list[str]:
    return sorted(run_dir(run).name for run in runs)


@pytest.mark.parametrize("notebook", source_notebooks(REPO), ids=lambda p: p.name)
def test_a_page_trains_its_runs_from_its_plan_and_lists_none_itself(notebook):
    plan, code = read_plan(notebook), _code(notebook)
    # a kind without a trainer is trained by its page, run by run, through the run cache
    by_the_page = ("cached_train(",) if plan is not None and KINDS[plan.kind].train is None else ()
    listed = [call for call in LISTINGS if call in code and call not in by_the_page]
    assert not listed, f"{notebook.name} lists or trains runs itself ({listed}): declare them in its plan"
    if plan is None:
        assert "plan.train(" not in code
        return
    if KINDS[plan.kind].train is not None:
        assert f'chapter_plan("{plan.chapter}")' in code and "plan.train(setup, globals())" in code, notebook.name
    for name in plan.recorded:
        assert f'recorded_grid("{name}")' in code, f"{notebook.name} never reads its recorded grid {name}"


@pytest.mark.parametrize("chapter", sorted(chapter_plans()))
def test_the_sweep_lists_exactly_the_plans_runs(chapter):
    plan = chapter_plans()[chapter]
    swept = book_stages("smoke", [chapter])
    planned = plan.stages("smoke", plan.parameters())
    assert _names(swept[0].runs()) == _names(planned[0]())
    assert len(swept) == len(planned)


def test_every_recorded_grid_is_its_chapter_at_the_recorded_parameters():
    grids = recorded_grids()
    assert sorted(grids) == ["ablations", "finetuning", "from_scratch", "multipliers", "policies"]
    for grid in grids.values():
        plan = chapter_plans()[grid.chapter]
        at = plan.parameters(plan.recorded[grid.name], "quick")
        assert _names(grid.runs()) == _names(plan.stages("quick", at)[0]())
        assert f"--chapters {grid.chapter}" in grid.command()


def _chapter(folder: Path, name: str, plan: str, parameters: str) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]})]
    path = folder / "notebooks" / f"{name}.ipynb"
    nbformat.write(notebook, path)
    path.with_name(name + PLAN_SUFFIX).write_text(plan)
    return path


PARAMETERS = 'density: float = 0.3\nseeds: list = [0]\ndataset: str = "default"\nprofile: str = "quick"'


def test_a_new_chapter_is_its_notebook_and_its_plan(tmp_path):
    (tmp_path / "notebooks").mkdir()
    for notebook in source_notebooks(REPO):
        shutil.copy2(notebook, tmp_path / "notebooks" / notebook.name)
        if read_plan(notebook) is not None:
            shutil.copy2(read_plan(notebook).path, tmp_path / "notebooks")
    _chapter(tmp_path, "09_static_alone", "runs:\n  kind: grid\n  methods: [static]\n  densities: [$density]\n"
                                          "  seeds: $seeds\n", PARAMETERS)
    stages = book_stages("smoke", ["09"], repo=tmp_path)
    assert [run.method for run in stages[0].runs()] == ["static"]
    assert len(book_stages("smoke", repo=tmp_path)[0].runs()) == len(book_stages("smoke")[0].runs()) + 1


@pytest.mark.parametrize("plan, message", [
    ("runs:\n  kind: lottery\n", r"unknown kind of runs in 09_x\.plan\.yml 'lottery': choose one of"),
    ("runs:\n  kind: grid\n  methods: $methods\n  densities: [$density]\n  seeds: $seeds\n",
     r"09_x\.plan\.yml names parameter 'methods', which the notebook does not have"),
    ("recorded: {}\n", r"must hold 'runs' \(a kind and its arguments\)"),
    ("runs:\n  kind: grid\nextra: 1\n", r"may hold 'recorded', not \['extra'\]"),
    ("runs:\n  kind: grid\n  methods: [static]\n  densities: [$density]\n  seeds: $seeds\n"
     "recorded:\n  wide:\n    densites: [0.1]\n", r"notebook 09_x\.ipynb has no parameter 'densites' to set"),
])
def test_a_bad_plan_is_refused_in_one_line(tmp_path, plan, message):
    (tmp_path / "notebooks").mkdir()
    notebook = _chapter(tmp_path, "09_x", plan, PARAMETERS)
    with pytest.raises(BarterError, match=message) as info:
        read_plan(notebook)
    assert "\n" not in str(info.value)


def test_the_plan_files_name_only_known_kinds_and_say_what_they_are():
    for plan in chapter_plans().values():
        text = plan.path.read_text()
        assert text.startswith("# The runs chapter"), plan.path.name
        assert re.search(r"^runs:\n  kind: [\w-]+", text, re.M), plan.path.name
