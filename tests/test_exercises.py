"""Every chapter ends with exercises a learner can do alone, and their answers still run.

A chapter is ``book/method.md`` or a notebook of ``notebooks/``. Its last section is
``## Exercises``; each exercise in it is a ``### `` heading with a graded difficulty,

    ### ★ Warm-up. Title         ### ★★ Practice. Title         ### ★★★ Challenge. Title

in that order of difficulty, and holds a ``**Cost:**`` statement (what it costs on a two-core
CPU), then a ``:::{dropdown} Hint`` and a ``:::{dropdown} Answer`` (sphinx-design dropdowns,
closed until the reader opens them). An exercise whose title starts with ``Implement`` asks
the reader to write something and says in a ``**Check:**`` statement what it must agree
with; every chapter has at least one.

The ``python`` code blocks of every answer are run here, exercise by exercise, in a fresh
namespace (they are written to run in seconds, and assert the expectation they state), so
an answer cannot drift from the package. Every ``barter-mini notebook`` command (papermill's
``-p`` and ``-y``) in an exercise must name an existing notebook and only parameters of its
``parameters`` cell.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest
import torch
import yaml

from barter_mini.book.plans import notebook_defaults

REPO = Path(__file__).resolve().parents[1]
CHAPTERS = [REPO / "book" / "method.md", *sorted((REPO / "notebooks").glob("[0-9]*.ipynb"))]
#: difficulty marker -> its word, in increasing difficulty
LEVELS = {"★": "Warm-up", "★★": "Practice", "★★★": "Challenge"}
HEADING = re.compile(r"(★{1,3}) (Warm-up|Practice|Challenge)\. (\S.*)")
DROPDOWN = re.compile(r"^:::\{dropdown\} (\w+)\n(.*?)^:::$", re.S | re.M)
PYTHON = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)
RERUN = re.compile(r"barter-mini notebook (\S+\.ipynb) (.*)")


def chapter_text(path: Path) -> str:
    """The chapter's Markdown: the page, or a notebook's Markdown cells in order."""
    if path.suffix == ".md":
        return path.read_text()
    return "\n\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


def headings(text: str, level: int) -> list[tuple[int, str]]:
    """``(line number, title)`` of every heading of ``level`` outside code fences."""
    found, fenced, marker = [], False, "#" * level + " "
    for number, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith(marker):
            found.append((number, line[len(marker):].strip()))
    return found


def exercises_section(text: str) -> str | None:
    """The text under the last ``## `` heading, if that heading is ``## Exercises``."""
    sections = headings(text, 2)
    if not sections or sections[-1][1] != "Exercises":
        return None
    return "\n".join(text.splitlines()[sections[-1][0] + 1:])


def exercises(path: Path) -> list[tuple[str, str]]:
    """``(heading, body)`` of every exercise of the chapter's Exercises section."""
    section = exercises_section(chapter_text(path)) or ""
    lines = section.splitlines()
    starts = headings(section, 3)
    return [(title, "\n".join(lines[start + 1:end]))
            for (start, title), end in zip(starts, [s for s, _ in starts[1:]] + [len(lines)])]


def case_id(chapter: Path, title: str) -> str:
    return f"{chapter.name}-{title.lstrip('★ ')[:40]}"


def dropdowns(body: str) -> list[tuple[str, str]]:
    return DROPDOWN.findall(body)


def answer_code(body: str) -> str:
    return "\n".join(code for kind, text in dropdowns(body) if kind == "Answer" for code in PYTHON.findall(text))


def test_the_book_loads_the_extension_that_draws_the_dropdowns():
    """``:::{dropdown}`` is sphinx-design's directive (closed ``<details>`` until opened)."""
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    assert "colon_fence" in config["parse"]["myst_enable_extensions"]
    assert "sphinx_design" in config["sphinx"]["config"]["extensions"]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_the_last_section_is_exercises(chapter):
    assert exercises_section(chapter_text(chapter)) is not None, f"{chapter.name} does not end with ## Exercises"
    if chapter.suffix == ".ipynb":      # nothing after the exercises: they are the last cell's
        last = nbformat.read(chapter, as_version=4).cells[-1]
        assert last.cell_type == "markdown" and exercises_section(last.source) is not None, chapter.name


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_exercises_are_graded_costed_and_answered(chapter):
    found = exercises(chapter)
    assert len(found) >= 3, f"{chapter.name} has {len(found)} exercises, at least three are needed"
    levels = []
    for title, body in found:
        match = HEADING.fullmatch(title)
        assert match, (f"{chapter.name}: {title!r} is not "
                       "'<★, ★★ or ★★★> <Warm-up, Practice or Challenge>. Title'")
        stars, word, _ = match.groups()
        assert LEVELS[stars] == word, f"{chapter.name}: {title!r}: {stars} is {LEVELS[stars]}"
        levels.append(len(stars))
        kinds = [kind for kind, _ in dropdowns(body)]
        assert kinds == ["Hint", "Answer"], f"{chapter.name}: {title!r} has dropdowns {kinds}, not Hint, Answer"
        assert all(text.strip() for _, text in dropdowns(body)), f"{chapter.name}: {title!r} has an empty dropdown"
        before = body[:body.index(":::{dropdown}")]
        assert re.search(r"^\*\*Cost:\*\* \S", before, re.M), f"{chapter.name}: {title!r} states no **Cost:**"
    assert levels == sorted(levels), f"{chapter.name}: the exercises are not in order of difficulty: {levels}"
    assert set(levels) == {1, 2, 3}, f"{chapter.name}: not every difficulty is there: {levels}"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.name)
def test_every_chapter_asks_to_implement_something_and_checks_it(chapter):
    implement = [(title, body) for title, body in exercises(chapter)
                 if HEADING.fullmatch(title) and HEADING.fullmatch(title).group(3).startswith("Implement")]
    assert implement, f"{chapter.name} has no exercise whose title starts with 'Implement'"
    for title, body in implement:
        assert "**Check:**" in body, f"{chapter.name}: {title!r} states no **Check:** to meet"
        assert answer_code(body).strip(), f"{chapter.name}: {title!r} has no Python in its answer"


def rerun_commands():
    for chapter in CHAPTERS:
        for title, body in exercises(chapter):
            for line in body.splitlines():
                match = RERUN.search(line.strip().strip("`"))
                if match:
                    yield pytest.param(chapter, match.group(1), match.group(2), id=case_id(chapter, title))


@pytest.mark.parametrize("chapter, notebook, arguments", list(rerun_commands()))
def test_rerun_commands_name_real_parameters(chapter, notebook, arguments):
    path = REPO / notebook
    assert path.is_file(), f"{chapter.name} runs {notebook}, which does not exist"
    declared = set(notebook_defaults(path))
    words = shlex.split(arguments)
    named = []
    for flag, value in zip(words, words[1:]):
        if flag == "-p":
            named.append(value)
        elif flag == "-y":
            parsed = yaml.safe_load(value)
            assert isinstance(parsed, dict), f"-y {value!r} is not a YAML mapping"
            named += list(parsed)
    assert named, f"{chapter.name}: 'barter-mini notebook {notebook} {arguments}' sets no parameter"
    assert set(named) <= declared, f"{chapter.name}: {sorted(set(named) - declared)} are not parameters of {notebook}"


def runnable_answers():
    for chapter in CHAPTERS:
        for title, body in exercises(chapter):
            code = answer_code(body)
            if code.strip():
                yield pytest.param(chapter, title, code, id=case_id(chapter, title))


#: a number an answer's prose quotes to the page's precision, two decimals or more: 0.35,
#: -0.13, +15.45 (one-decimal settings such as rho = 0.3 are not quotes of a measurement)
QUOTED = re.compile(r"(?<![\w.])[+\-−]?\d[\d,]*\.\d{2,}")
MATHS = re.compile(r"\$[^$]+\$")


def quoted_numbers(body: str) -> set[str]:
    """The numbers the answer's prose quotes (its Python code and inline maths left out), as
    written, without sign: an answer that quotes a measured number must print it."""
    prose = "\n".join(MATHS.sub("", PYTHON.sub("", text)) for kind, text in dropdowns(body) if kind == "Answer")
    return {number.lstrip("+-−") for number in QUOTED.findall(prose)}


def rounds_to(printed: str, quoted: str) -> bool:
    """Whether ``printed`` (0.711) is ``quoted`` (0.71) at the quoted number's decimals."""
    decimals = len(quoted.split(".")[1])
    return round(float(printed), decimals) == float(quoted.replace(",", ""))


def answers_that_quote_numbers():
    for chapter in CHAPTERS:
        for title, body in exercises(chapter):
            if quoted_numbers(body):
                yield pytest.param(chapter, title, body, id=case_id(chapter, title))


@pytest.mark.parametrize("chapter, title, body", list(answers_that_quote_numbers()))
def test_an_answer_that_quotes_numbers_computes_them(chapter, title, body):
    """The numbers an answer states come from its code, which reads them (from ``data/`` where
    they are measured): the code below prints each of them, so a re-recorded grid that moves
    one fails here instead of leaving the answer stale."""
    assert answer_code(body).strip(), (f"{chapter.name}: {title!r} quotes {sorted(quoted_numbers(body))} "
                                       "and has no Python that computes them")


@pytest.mark.parametrize("chapter, title, code", list(runnable_answers()))
def test_the_answers_code_runs_and_meets_its_check(chapter, title, code, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)            # whatever an answer writes lands here
    threads = torch.get_num_threads()
    torch.set_num_threads(1)               # tiny models: one thread is fastest on shared cores
    torch.manual_seed(0)
    try:
        exec(compile(code, f"{chapter.name}: {title}", "exec"), {"__name__": "__exercise__"})
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    body = dict(exercises(chapter))[title]
    printed_numbers = [number.lstrip("+-−").replace(",", "") for number in QUOTED.findall(printed)]
    missing = sorted(quoted for quoted in quoted_numbers(body) if not any(
        rounds_to(number, quoted) for number in printed_numbers))
    assert not missing, (f"{chapter.name}: {title!r} quotes {missing}, which its code does not print "
                         f"(it printed: {printed.strip()[:300]!r})")
