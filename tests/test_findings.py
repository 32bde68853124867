"""Conclusions the chapters still compose from their own tables (the rest are written by hand
and checked by :func:`~barter_mini.book.claims.claim` on their pages)."""

from __future__ import annotations

import pandas as pd


def test_setup_objects_render_as_readable_tables():
    from barter_mini.book.efficiency import BENCH_PROFILES
    from barter_mini.book.finetuning import PAPER_TRANSFER
    from barter_mini.book.profiles import BUILT_WITH, PROFILES
    quick = PROFILES["quick"]._repr_markdown_()
    assert quick.startswith("> **This page was built with the `quick` profile.**")
    assert "**Profile `quick`**" in quick and "| train subset | 15,000 |" in quick
    assert set(BUILT_WITH) == set(PROFILES)
    assert "mean nothing" in PROFILES["smoke"]._repr_markdown_()
    assert "| epochs | the recipe's |" in PROFILES["paper"]._repr_markdown_()
    bench = BENCH_PROFILES["smoke"]._repr_markdown_()
    assert "| paper models | (`cct-mini`, 16) |" in bench and "| all densities executed | no |" in bench
    assert "| pretrain classes | all |" in PAPER_TRANSFER._repr_markdown_()


def test_zeros_have_no_sign():
    from barter_mini.book.tables import _float_format
    shown = _float_format(pd.Series([-0.00041, 0.1234, 0.2345]), 3)
    assert shown(-0.00041) == "0.000" and shown(-0.25) == "-0.250"


def test_words_are_listed_as_a_sentence_lists_them():
    from barter_mini.book.tables import listed
    assert listed([]) == "" and listed(["a"]) == "a" and listed(("a", "b")) == "a and b"
    assert listed(str(n) for n in range(3)) == "0, 1 and 2"
