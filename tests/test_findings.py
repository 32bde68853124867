"""Conclusions the chapters still compose from their own tables (the rest are written by hand
and checked by :func:`~barter_mini.book.claims.claim` on their pages)."""

from __future__ import annotations

import pandas as pd
import pytest


def test_efficiency_conclusion_states_speedup_ideal_and_memory():
    from barter_mini.book.efficiency import what_this_showed
    comparison = pd.DataFrame([
        {"model": "cct-paper", "execution": "eager", "density": 0.1, "speedup": 3.0, "ideal_speedup": 9.0,
         "efficiency": 1 / 3, "memory_fraction": 0.4, "update_percent_of_training": 0.02},
        {"model": "cct-paper", "execution": "eager", "density": 0.5, "speedup": 1.8, "ideal_speedup": 2.0,
         "efficiency": 0.9, "memory_fraction": 0.7, "update_percent_of_training": 0.05},
        {"model": "cct-paper", "execution": "recompute", "density": 0.1, "speedup": 9.0, "ideal_speedup": 9.0,
         "efficiency": 1.0, "memory_fraction": 0.1, "update_percent_of_training": 0.0}])
    text = what_this_showed(comparison, "cpu")
    assert ("**cct-paper** on cpu: at rho = 0.1 3.00x faster per step than RigL (FLOPs ideal 9.00x, so 33 % of it) "
            "with 40 % of RigL's peak memory; at rho = 0.5 1.80x") in text
    assert "at most 0.05 % of training time" in text and "9.00x faster" not in text
    assert "nothing to compare" in what_this_showed(comparison[comparison["execution"] == "recompute"], "cpu")


def test_setup_objects_render_as_readable_tables():
    from barter_mini.book.efficiency import BENCH_PROFILES
    from barter_mini.book.finetuning import PAPER_TRANSFER
    from barter_mini.book.profiles import PROFILES
    quick = PROFILES["quick"]._repr_markdown_()
    assert quick.startswith("**Profile `quick`**") and "| train subset | 15,000 |" in quick
    assert "| epochs | the recipe's |" in PROFILES["paper"]._repr_markdown_()
    bench = BENCH_PROFILES["smoke"]._repr_markdown_()
    assert "| paper models | (`cct-mini`, 16) |" in bench and "| all densities executed | no |" in bench
    assert "| pretrain classes | all |" in PAPER_TRANSFER._repr_markdown_()


def test_composed_sentences_never_print_a_rounded_zero_as_a_result():
    """The edge values (zero, equal, below the printed precision): no "0.0x", no "0.000 ms",
    no sign compared on "+0.00" and no "at most 0.00 %"."""
    from barter_mini.book.efficiency import what_this_showed as efficiency_showed
    comparison = pd.DataFrame([
        {"model": "cct-mini", "execution": "eager", "density": 0.3, "speedup": 1.1, "ideal_speedup": 1.5,
         "efficiency": 0.7, "memory_fraction": 0.8, "update_percent_of_training": 0.0}])
    text = efficiency_showed(comparison, "cpu")
    assert "less than 0.01 % of training time" in text and "0.00 %" not in text


def test_counts_agree_with_their_noun_and_zeros_have_no_sign():
    from barter_mini.book.tables import _float_format, count_noun
    assert [count_noun(n, "head") for n in (0, 1, 1.2, 2)] == ["0 heads", "1 head", "1 head", "2 heads"]
    shown = _float_format(pd.Series([-0.00041, 0.1234, 0.2345]), 3)
    assert shown(-0.00041) == "0.000" and shown(-0.25) == "-0.250"


def test_the_introductions_efficiency_sentence_spans_the_densities_and_says_one_value_once():
    from barter_mini.book.efficiency import headline
    rows = [{"model": "cct-paper", "execution": "eager", "density": d, "speedup": s, "efficiency": e,
             "memory_fraction": m} for d, s, e, m in ((0.1, 3.0, 1 / 3, 0.4), (0.5, 1.8, 0.9, 0.4))]
    rows.append({"model": "cct-paper", "execution": "recompute", "density": 0.1, "speedup": 9.0, "efficiency": 1.0,
                 "memory_fraction": 0.1})
    text = headline(pd.DataFrame(rows), "cpu")
    assert text == ("Measured on this machine (cpu): on `cct-paper` BARTER's step ran at 3.00x RigL's speed at "
                    "rho = 0.1 and 1.80x at 0.5 (33 to 90 % of its FLOPs-ideal speedup) and held 40 % of RigL's "
                    "peak memory.")
    assert "at rho = 0.1 (33 %" in headline(pd.DataFrame(rows[:1]), "cpu")
    assert headline(pd.DataFrame(rows[2:]), "cpu") == "No eager BARTER and RigL pair was measured in this build."


def test_words_are_listed_as_a_sentence_lists_them():
    from barter_mini.book.tables import listed
    assert listed([]) == "" and listed(["a"]) == "a" and listed(("a", "b")) == "a and b"
    assert listed(str(n) for n in range(3)) == "0, 1 and 2"
