"""The grids the chapters share: their methods, the paper's tables, and the run cache they share."""

import math

import pytest

from barter_mini.errors import BarterError
from barter_mini.book.experiments import (check_methods, mean_std,
                                          paper_from_scratch, read_paper_table)


def test_the_paper_tables_and_their_cells():
    paper = paper_from_scratch().set_index(["method", "density"])
    assert paper.loc[("rigl", 0.3), "acc_mean"] == 71.74            # Table 1
    assert paper.loc[("barter", 0.3), "acc_mean"] == 71.38          # Table 13
    assert mean_std(paper.loc[("rigl", 0.3), "acc_mean"], paper.loc[("rigl", 0.3), "acc_std"]) == "71.74 ± 0.14"
    assert mean_std(70.0, math.nan) == "70.00" and mean_std(math.nan, 0.1) == ""


def test_bad_method_and_table_names():
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
