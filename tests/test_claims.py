"""A page's hand-written claims stop the build in one line when their numbers contradict them."""

import math

import pytest

from barter_mini.book.claims import ClaimNoLongerHolds, claim
from barter_mini.errors import BarterError


def test_a_claim_that_holds_is_silent():
    claim("BARTER is level with Static", abs(0.1) <= 2 * 0.2, gap=0.1, se=0.2)


def test_a_claim_that_fails_names_the_sentence_and_its_numbers_on_one_line():
    with pytest.raises(ClaimNoLongerHolds) as info:
        claim("BARTER is level with Static", abs(0.9) <= 2 * 0.2, gap=0.9, se=0.2, seeds=3, verdict="ahead")
    message = str(info.value)
    assert isinstance(info.value, BarterError) and "\n" not in message
    assert "'BARTER is level with Static'" in message
    assert "(gap = 0.9, se = 0.2, seeds = 3, verdict = ahead)" in message


def test_nan_numbers_are_shown_not_hidden():
    with pytest.raises(ClaimNoLongerHolds, match=r"se = nan"):
        claim("the gap is beyond the seed noise", False, se=math.nan)
