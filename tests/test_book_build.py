"""What ``barter-mini book`` reports while it works: a line as each notebook starts and ends,
papermill's bar over the running notebook's cells, and a table of seconds per step.

No book is built here: papermill, staging and jupyter-book are replaced by fakes, except in
one test that executes a three-cell notebook to see the cell bar count its cells.
"""

import io
import os
from pathlib import Path

import nbformat
import pytest

import barter_mini.book.build as build
from barter_mini.book.build import HTML_STEP, BookBuild, cell_progress, execute_notebook, format_times
from barter_mini.cli import main

REPO = Path(__file__).resolve().parents[1]
KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
          "language_info": {"name": "python"}}


def fake_repo(tmp_path: Path, names=("01_first.ipynb", "02_second.ipynb")) -> Path:
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    for name in names:
        (repo / "notebooks" / name).write_text("{}")
    return repo


def test_the_build_logs_each_notebook_and_times_every_step(tmp_path, monkeypatch):
    executed = []

    def fake_papermill(source, target, parameters, progress_bar=False):
        executed.append((Path(source).name, parameters, progress_bar))
        return 2.0 if Path(source).name.startswith("01") else 3.0

    monkeypatch.setattr(build, "stage_sources", lambda stage, repo: (stage / "notebooks").mkdir(parents=True,
                                                                                                exist_ok=True))
    monkeypatch.setattr(build, "vendor_mathjax", lambda stage, cache: None)
    monkeypatch.setattr(build, "vendor_thebe", lambda stage, cache: None)
    monkeypatch.setattr(build, "execute_notebook", fake_papermill)
    monkeypatch.setattr(build, "build_html", lambda stage: stage / "_build" / "html" / "index.html")
    figures = []
    monkeypatch.setattr(build, "write_mechanism_figures", figures.append)
    lines = []
    repo = fake_repo(tmp_path)
    result = build.run_book_build("smoke", tmp_path / "out", log=lines.append, repo=repo)

    # the mechanism's figures are drawn into the stage, beside the pages that show them
    assert figures == [tmp_path / "out" / "book" / "book" / "figures"]
    assert lines.pop(0) == "drawing the mechanism's figures for the introduction and the method page"

    assert [name for name, _, _ in executed] == ["01_first.ipynb", "02_second.ipynb"]
    assert all(parameters == {"profile": "smoke"} for _, parameters, _ in executed)
    # papermill's tqdm bar is on, named after the running notebook
    assert [bar["desc"] for _, _, bar in executed] == ["01_first.ipynb", "02_second.ipynb"]
    assert lines[:4] == ["[1/2] running 01_first.ipynb (smoke)", "[1/2] executed 01_first.ipynb in 2 s",
                         "[2/2] running 02_second.ipynb (smoke)", "[2/2] executed 02_second.ipynb in 3 s"]
    assert [step for step, _ in result.times] == ["01_first.ipynb", "02_second.ipynb", HTML_STEP]
    assert [seconds for _, seconds in result.times[:2]] == [2.0, 3.0]
    assert result.index == tmp_path / "out" / "book" / "_build" / "html" / "index.html"
    # build_book, which the other tests call, still returns the index alone
    assert build.build_book("smoke", tmp_path / "out", log=lines.append, repo=repo) == result.index


def test_the_time_table_lists_notebooks_the_html_build_and_the_total():
    table = format_times(BookBuild(Path("index.html"), [("01_walkthrough.ipynb", 61.25), ("02_from_scratch.ipynb", 5.0),
                                                        (HTML_STEP, 12.5)], total_s=80.0))
    rows = [line.split() for line in table.splitlines()]
    assert rows[0] == ["step", "seconds"]
    assert rows[1] == ["01_walkthrough.ipynb", "61.2"] and rows[2] == ["02_from_scratch.ipynb", "5.0"]
    assert rows[3] == ["HTML", "(jupyter-book)", "12.5"] and rows[4] == ["total", "80.0"]
    assert len({line.index("seconds") + len("seconds") for line in table.splitlines()[:1]}
               | {len(line) for line in table.splitlines()}) == 1          # one right edge


def test_barter_mini_book_prints_the_time_table(monkeypatch, capsys):
    timed = BookBuild(Path("/b/index.html"), [("01_walkthrough.ipynb", 3.0), (HTML_STEP, 1.0)], total_s=4.5)
    monkeypatch.setattr(build, "run_book_build", lambda profile, build_dir: timed)
    assert main(["book", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert format_times(timed) in out and "open /b/index.html" in out


@pytest.mark.parametrize("flag, expected", [([], None), (["--cached-only"], "0")])
def test_cached_only_makes_the_notebooks_read_the_run_cache(monkeypatch, flag, expected):
    """--cached-only sets BARTER_MINI_TRAIN=0 for the build, which the papermill kernels inherit
    (training.cache.cached_train then trains nothing)."""
    monkeypatch.delenv("BARTER_MINI_TRAIN", raising=False)
    seen = {}

    def fake_build(profile, build_dir):
        seen["env"] = os.environ.get("BARTER_MINI_TRAIN")
        return BookBuild(Path("/b/index.html"), [(HTML_STEP, 1.0)], total_s=1.0)

    monkeypatch.setattr(build, "run_book_build", fake_build)
    assert main(["book", "--profile", "smoke", *flag]) == 0
    assert seen["env"] == expected
    assert "BARTER_MINI_TRAIN" not in os.environ           # only for the build: nothing leaks into this process


def test_the_cell_bar_counts_a_real_notebooks_cells(tmp_path):
    notebook = nbformat.v4.new_notebook(metadata=KERNEL)
    notebook.cells = [nbformat.v4.new_code_cell("profile = 'quick'", metadata={"tags": ["parameters"]}),
                      nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("print(profile)")]
    source = tmp_path / "03_tiny.ipynb"
    nbformat.write(notebook, source)
    stream = io.StringIO()
    # off a terminal tqdm stays quiet (disable=None): turned on here to see what a terminal shows
    bar = {**cell_progress(source.name, stream), "disable": False, "mininterval": 0, "miniters": 1}
    seconds = execute_notebook(source, tmp_path / "out.ipynb", {"profile": "smoke"}, progress_bar=bar)
    shown = stream.getvalue()
    assert seconds > 0 and "03_tiny.ipynb" in shown
    assert "4/4" in shown              # the three cells and the parameters papermill injects
    assert cell_progress("x.ipynb")["disable"] is None


def included_functions(page: Path) -> list[tuple[Path, str]]:
    """The (source file, object) pairs that ``page`` shows with ``literalinclude`` ``:pyobject:``."""
    import re
    found = re.findall(r"```\{literalinclude\} (\S+)\n:pyobject: (\w+)", page.read_text())
    return [((page.parent / source).resolve(), name) for source, name in found]


def test_the_code_the_method_page_shows_keeps_to_79_columns():
    """The column the browser test measures holds 79 characters of the book's code font: a
    longer line of a function the method page includes would need a horizontal scroll bar."""
    import ast
    shown = included_functions(build.REPO / "book" / "method.md")
    assert len(shown) >= 7, f"book/method.md includes only {shown}"
    wide = []
    for source, name in shown:
        lines = source.read_text().splitlines()
        nodes = [n for n in ast.parse(source.read_text()).body if getattr(n, "name", None) == name]
        assert nodes, f"book/method.md includes {name}, which {source.name} does not define"
        node = nodes[0]
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        wide += [f"{source.name}:{first + i} ({len(line)} characters, in {name})"
                 for i, line in enumerate(lines[first - 1:node.end_lineno]) if len(line) > 79]
    assert not wide, f"lines the method page shows are over 79 characters: {wide}"


def test_the_introductions_findings_are_pasted_from_the_chapters_never_typed():
    """Each answer of "What this book finds on a CPU" is written by hand with its numbers glued
    from a chapter (``{glue:text}`../notebooks/NN.ipynb::key:fmt```), whose removed cell also
    asserts the answer's claims: the introduction cannot contradict the chapters."""
    import re

    intro = (REPO / "book" / "intro.md").read_text()
    section = intro[intro.index("## What this book finds on a CPU"):intro.index("## How this book is organised")]
    bullets = [b for b in section.split("\n- ")[1:]]
    assert len(bullets) == 5
    for bullet in bullets:
        pasted = re.findall(r"\{glue:text\}`\.\./(notebooks/\w+\.ipynb)::([\w-]+)(?::[^`]*)?`", bullet)
        assert pasted, bullet
        # MyST-NB reads a cross-page key without a format as a format of its own ("path:" + ":key")
        bare = re.findall(r"\{glue:text\}`[^`]*::[\w-]+`", bullet)
        assert not bare, f"give every pasted number a format (':s', ':.2f'): {bare}"
        for notebook, key in pasted:
            code = "\n".join(c.source for c in nbformat.read(REPO / notebook, as_version=4).cells
                             if c.cell_type == "code")
            assert re.search(rf'glue\(\s*"{re.escape(key)}", ', code), (notebook, key)
            assert "claim(" in code, f"{notebook} glues {key} for the introduction but asserts no claim"
        assert "{glue:any}" not in bullet, f"an answer pastes a composed headline: {bullet[:80]}"
