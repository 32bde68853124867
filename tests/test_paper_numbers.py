"""The paper's numbers quoted on the book's Markdown pages come from data/paper/, through
substitutions the build writes into the staged _config.yml."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from barter_mini.book.build import write_substitutions
from barter_mini.book.paper_numbers import paper_substitutions

BOOK = Path(__file__).resolve().parents[1] / "book"


def test_every_substitution_a_page_uses_is_defined():
    used = {key for page in BOOK.glob("*.md") for key in re.findall(r"\{\{\s*(\w+)\s*\}\}", page.read_text())}
    assert used, "the introduction quotes the paper through substitutions"
    assert used <= set(paper_substitutions()), f"undefined: {sorted(used - set(paper_substitutions()))}"


def test_the_quoted_numbers_are_the_papers():
    numbers = paper_substitutions()
    assert numbers["iphone_speedup"] == "2.78" and numbers["iphone_rigl_s"] == "1,699.36"
    assert numbers["table6_dense_s"] == "68.45" and numbers["paper_dense_acc"] == "73.49"
    rows = numbers["paper_accuracy_table"].splitlines()
    assert len(rows) == 2 + 4 and rows[2] == "| 0.1 | 63.16 | 66.13 | 67.01 |"


def test_the_build_writes_them_into_the_staged_config(tmp_path):
    config = tmp_path / "_config.yml"
    config.write_text("title: t\nparse:\n  myst_enable_extensions: [substitution]\n")
    write_substitutions(config, {"a": "1"})
    settings = yaml.safe_load(config.read_text())
    assert settings["parse"] == {"myst_enable_extensions": ["substitution"], "myst_substitutions": {"a": "1"}}
