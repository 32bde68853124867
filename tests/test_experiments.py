"""Tables of the from-scratch and ablation notebooks, on hand-made runs."""

import math

import pandas as pd
import pytest

from barter_mini.errors import BarterError
from barter_mini.book.experiments import (ABLATION_METHODS, FROM_SCRATCH_METHODS, ablation_differences,
                                     beside_paper, check_methods, gaps_to, paper_ablation_differences,
                                     paper_from_scratch, rankings_beside_paper, read_paper_table,
                                     summarize, units_moved)
from barter_mini.training.methods import METHODS


def hand_made_runs():
    rows = [("dense", 1.0, 0, 80.0, 79.0), ("dense", 1.0, 1, 82.0, 81.0),
            ("rigl", 0.3, 0, 70.0, 69.0), ("rigl", 0.3, 1, 74.0, 73.0),
            ("barter", 0.3, 0, 75.0, 74.0), ("barter", 0.3, 1, 77.0, 76.0),
            ("static", 0.3, 0, 71.0, 70.0), ("static", 0.3, 1, 71.0, 70.0)]
    frame = pd.DataFrame(rows, columns=["method", "density", "seed", "acc", "f1"])
    frame["wall_time_s"] = [10.0, 12.0, 10.0, 10.0, 4.0, 6.0, 5.0, 5.0]
    return frame


def test_summary_is_mean_and_sample_std_over_seeds():
    table = summarize(hand_made_runs()).set_index("method")
    assert table.loc["rigl", "acc_mean"] == 72.0
    assert table.loc["rigl", "acc_std"] == pytest.approx(math.sqrt(8.0))   # sample std, ddof = 1
    assert table.loc["static", "acc_std"] == 0.0
    assert table.loc["barter", "wall_time_s"] == 5.0
    assert (table["seeds"] == 2).all()


def test_one_seed_leaves_the_std_blank():
    runs = hand_made_runs()
    table = beside_paper(summarize(runs[runs["seed"] == 0]), paper_from_scratch()).set_index("method")
    assert table.loc["rigl", "Top-1 (%)"] == "70.00"
    assert table.loc["rigl", "paper Top-1 (%)"] == "71.74 ± 0.14"          # Table 1, rho = 0.3
    assert table.loc["barter", "paper Top-1 (%)"] == "71.38 ± 0.36"        # Table 13


def test_gaps_and_rankings():
    summary = summarize(hand_made_runs())
    gaps = gaps_to(summary, "barter").set_index("method")
    assert gaps.loc["rigl", "barter minus method (Top-1 points)"] == 4.0
    assert gaps.loc["dense", "barter minus method (Top-1 points)"] == -5.0
    ranks = rankings_beside_paper(summary, paper_from_scratch())
    assert list(ranks.index) == ["barter", "rigl", "static"]
    # the paper at rho = 0.3: RigL 71.74 > BARTER 71.38 > static 70.43
    assert list(ranks["paper rank at rho=0.3"]) == [2, 1, 3]


def test_ablation_differences_are_variant_minus_barter():
    diffs = ablation_differences(hand_made_runs()[lambda f: f["method"] != "dense"]).set_index("method")
    assert diffs.loc["static", "acc_diff"] == -5.0 and diffs.loc["rigl", "f1_diff"] == -4.0
    paper = paper_ablation_differences().set_index("method")
    assert paper.loc["random-pair", "acc_diff"] == pytest.approx(71.20 - 72.85)
    assert set(paper.index) == set(ABLATION_METHODS) - {"barter"}
    with pytest.raises(BarterError, match="reference method 'barter'"):
        ablation_differences(hand_made_runs()[lambda f: f["method"] == "rigl"])


def test_units_moved_counts_units_away_from_the_even_start():
    runs = pd.DataFrame({"method": ["static", "barter", "rigl"], "seed": [0, 0, 0], "density": [0.3] * 3,
                         "heads": [(3, 3, 3, 3), (1, 2, 3, 6), (10,) * 4],
                         "ffn": [(39, 39, 38, 38), (47, 30, 24, 53), (128,) * 4]})
    moved = units_moved(runs, "cct-mini").set_index("method")
    assert list(moved.index) == ["static", "barter"]            # full-width runs left out
    assert moved.loc["static"].tolist() == [0, 0, 0]
    assert moved.loc["barter", "heads moved"] == 3               # |1-3|+|2-3|+0+|6-3| = 6, halved
    assert moved.loc["barter", "FFN channels moved"] == 23       # (8+9+14+15)/2


def test_method_lists_and_bad_names():
    assert set(FROM_SCRATCH_METHODS) <= set(METHODS) and set(ABLATION_METHODS) <= set(METHODS)
    with pytest.raises(BarterError, match="unknown method 'lottery'"):
        check_methods(["barter", "lottery"])
    with pytest.raises(BarterError, match="no paper table 'table99'"):
        read_paper_table("table99")


def test_quick_chapters_share_runs_through_the_cache():
    """The quick book trains each configuration once: the walkthrough's run is chapter 02's
    BARTER run, and chapter 05's Static and BARTER on seed 0 are chapter 02's too."""
    from barter_mini.book.experiments import grid_runs
    from barter_mini.book.profiles import PROFILES
    from barter_mini.book.reallocation_study import VARIANTS, variant_run
    from barter_mini.book.walkthrough import walkthrough_run
    from barter_mini.training.cache import run_dir

    setup = PROFILES["quick"]
    barter, static = (run_dir(run.validate()) for run in grid_runs(setup, ["barter", "static"], [0.3], [0]))
    assert run_dir(walkthrough_run(setup, 0.3, 0).validate()) == barter
    assert run_dir(variant_run(setup, VARIANTS["barter"], 0.3, 0).validate()) == barter
    assert run_dir(variant_run(setup, VARIANTS["static"], 0.3, 0).validate()) == static
