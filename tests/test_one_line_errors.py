"""A failure prints one line: the error first, and nothing after it but where the full log is.

The room's command (``python -m barter_mini.book.room``) refuses bad flags and reports a
:class:`~barter_mini.errors.BarterError` of its work as ``error: ...``, exit status 2, as
``barter-mini`` does. A notebook run at a bad parameter with ``barter-mini notebook`` (the
project's papermill) is one line that names the cell and its error and ends with the executed
notebook, which keeps the whole traceback; papermill's own command would print its traceback
after the notebook's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from barter_mini.book.room import main as room_main
from barter_mini.cli import main as cli_main

from helpers import exit_status_and_stderr

REPO = Path(__file__).resolve().parents[1]
WALKTHROUGH = REPO / "notebooks" / "01_walkthrough.ipynb"


def one_line(status, stderr: str) -> str:
    """The one ``error: ...`` line of a refusal with exit status 2."""
    lines = stderr.strip().splitlines()
    assert status == 2 and "Traceback" not in stderr, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def run_module(module: str, *args, cache: Path) -> subprocess.CompletedProcess:
    """``python -m MODULE ARGS`` from the repository root, on the run cache ``cache``."""
    env = {**os.environ, "BARTER_MINI_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env=env)


def run_room(argv, capsys) -> tuple[int, str]:
    """The room's command in-process: its exit status and what it wrote to stderr."""
    return exit_status_and_stderr(room_main, argv, capsys)


def run_cli(argv, capsys) -> tuple[int, str]:
    return exit_status_and_stderr(cli_main, argv, capsys)


# ----------------------------------------------------------------------------- the room's command

def test_the_room_refuses_a_jobs_count_below_one_in_one_line(tmp_path):
    result = run_module("barter_mini.book.room", "--jobs", "-1", cache=tmp_path)
    assert one_line(result.returncode, result.stderr) == "error: argument --jobs: expected a positive integer, got '-1'"


def test_the_room_says_that_record_trains_nothing_when_given_a_dry_run(tmp_path):
    result = run_module("barter_mini.book.room", "--record", "X", "--dry-run", cache=tmp_path)
    line = one_line(result.returncode, result.stderr)
    assert "--record COMMIT records the runs already in the run cache and trains nothing" in line
    assert "leave out --dry-run (it lists the runs a sweep would train)" in line


def test_recording_the_room_from_an_empty_cache_is_one_line_and_writes_nothing(tmp_path):
    before = {path: path.stat().st_mtime_ns for path in (REPO / "data").glob("room*.csv")}
    result = run_module("barter_mini.book.room", "--record", "X", cache=tmp_path)
    line = one_line(result.returncode, result.stderr)
    assert line.startswith("error: nothing to record: the first stage, 'room: starts', is not all in the run cache")
    assert "barter-mini sweep" in line and result.stdout == ""
    assert {path: path.stat().st_mtime_ns for path in (REPO / "data").glob("room*.csv")} == before


@pytest.mark.parametrize("argv, message", [
    (["--jobs", "0"], "argument --jobs: expected a positive integer, got '0'"),
    (["--jobs", "two"], "argument --jobs: expected a positive integer, got 'two'"),
    (["--h1", "--jobs", "-1"], "argument --jobs: expected a positive integer, got '-1'"),
    (["--record", ""], "argument --record: expected the commit the rows record, one word"),
    (["--record", "a b"], "argument --record: expected the commit the rows record, one word"),
    (["--h1", "--record", "X", "--dry-run"], "leave out --dry-run (it lists the runs a sweep would train)"),
    (["--record", "X", "--jobs", "3"], "leave out --jobs (it sets the runs training at once)"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_every_refusal_of_the_rooms_flags_is_one_line(argv, message, capsys):
    status, err = run_room(argv, capsys)
    assert message in one_line(status, err)


# ----------------------------------------------------------------------------- a notebook at a bad parameter

def test_a_notebook_at_a_bad_density_fails_in_one_line_that_points_at_the_executed_notebook(tmp_path):
    out = tmp_path / "run" / "out.ipynb"
    result = run_module("barter_mini.cli", "notebook", WALKTHROUGH, out, "-p", "density", "2", cache=tmp_path)
    assert one_line(result.returncode, result.stderr) == (
        f"error: notebook {WALKTHROUGH.name} failed in cell 3: BarterError: density must be in (0, 1], got 2 "
        f"(full log: {out})")
    executed = nbformat.read(out, as_version=4)
    errors = [output for cell in executed.cells for output in cell.get("outputs", []) if output.output_type == "error"]
    assert [error.traceback for error in errors] == [["error: density must be in (0, 1], got 2"]]


@pytest.mark.parametrize("argv, message", [
    (["-p", "densty", "0.1"], f"notebook {WALKTHROUGH.name} has no parameter 'densty' to set: it has density, seed"),
    (["-y", "{seeds: [0, 1]}"], f"notebook {WALKTHROUGH.name} has no parameter 'seeds' to set"),
])
def test_a_parameter_the_notebook_lacks_is_refused_before_a_kernel_starts(argv, message, tmp_path, capsys,
                                                                        monkeypatch):
    import barter_mini.book.build as build

    def no_kernel(*args, **kwargs):
        raise AssertionError("a kernel started")
    monkeypatch.setattr(build, "execute_notebook", no_kernel)
    status, err = run_cli(["notebook", WALKTHROUGH, tmp_path / "out.ipynb", *argv], capsys)
    assert message in one_line(status, err)
    assert not (tmp_path / "out.ipynb").exists()


def test_what_the_notebook_command_cannot_run_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "README.md").write_text("# not a notebook\n")
    (tmp_path / "bad.ipynb").write_text("{not json")
    cases = {(WALKTHROUGH, WALKTHROUGH): "is the notebook to run: give another file",
             (tmp_path / "README.md", tmp_path / "out.ipynb"): "is no notebook file",
             (tmp_path / "bad.ipynb", tmp_path / "out.ipynb"): "is no notebook whose parameters can be read"}
    for (notebook, out), message in cases.items():
        status, err = run_cli(["notebook", notebook, out], capsys)
        assert message in one_line(status, err)


def test_a_yaml_option_that_is_no_mapping_is_refused(tmp_path, capsys):
    status, err = run_cli(["notebook", WALKTHROUGH, tmp_path / "out.ipynb", "-y", "[0, 1]"], capsys)
    assert status == 2 and "Traceback" not in err
    assert "expected a YAML mapping of parameter names" in err.strip().splitlines()[-1]


def test_a_value_is_read_as_papermills_own_p_reads_it():
    from barter_mini.cli.arguments import papermill_value

    assert [papermill_value(text) for text in ("True", "None", "3", "0.1", "1e-3", "quick", "[0, 1]")] == \
        [True, None, 3, 0.1, 1e-3, "quick", "[0, 1]"]
