"""The book's one rule for a gap beyond the seed noise, and that every chapter applies it."""

import math

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from barter_mini.book.seed_noise import beyond_noise, paired_summary, standing


def test_a_gap_is_beyond_the_noise_past_twice_its_standard_error_and_never_on_one_seed():
    # sd 0.3 over 9 seeds: standard error 0.1, so the line is at 0.2
    assert beyond_noise(0.21, 0.3, 9) and beyond_noise(-0.21, 0.3, 9)
    assert not beyond_noise(0.19, 0.3, 9) and not beyond_noise(0.15, 0.3, 9)  # past 1 se, within 2
    assert not beyond_noise(5.0, math.nan, 1) and not beyond_noise(5.0, 0.0, 1)
    assert standing(0.3, 0.1) == "ahead" and standing(-0.3, 0.1) == "behind"
    assert standing(0.15, 0.1) == "level" and standing(0.0, 0.0) == "level"
    assert standing(0.5, math.nan) == "undecided" and standing(0.5, math.inf) == "undecided"


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=12))     # timing is the machine's, not the property's
def test_standing_and_beyond_noise_agree_on_any_paired_gaps(gaps):
    mean, sd, se = paired_summary(gaps)
    assert math.isclose(sd, np.std(gaps, ddof=1), abs_tol=1e-12)
    assert standing(mean, se) != "level" if beyond_noise(mean, sd, len(gaps)) else standing(mean, se) == "level"


def test_one_difference_has_no_spread():
    mean, sd, se = paired_summary([0.4])
    assert mean == 0.4 and math.isnan(sd) and math.isnan(se) and standing(mean, se) == "undecided"
