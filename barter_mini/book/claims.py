"""Conclusions written by hand, checked against the numbers they rest on.

A chapter's conclusions are Markdown a person wrote, against the recorded grid under
``data/`` they rest on. The numbers in a sentence are pasted by MyST-NB's glue
(``{glue:text}`key:.2f```) from a removed cell that computes them from that grid, and each
thing a sentence asserts ("level with Static at every density", "ranks 2 of 8", "beyond the
seed noise") is checked in the same cell with :func:`claim`. If a re-recorded grid
contradicts the text, the book build stops at that cell with one line naming the sentence and
its numbers, and a person rewrites the sentence: no code composes a page's prose.
"""

from __future__ import annotations

import math
import numbers

from ..errors import BarterError


class ClaimNoLongerHolds(BarterError):
    """A hand-written sentence of a page that its numbers contradict."""


def _shown(value) -> str:
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        return "nan" if math.isnan(value) else f"{float(value):.3g}"
    return str(value)


def claim(sentence: str, holds: bool, **numbers_it_rests_on) -> None:
    """Stop the page where ``holds`` is false: ``sentence`` is what the page's Markdown says,
    ``numbers_it_rests_on`` the values that decide it (named as on the page), all of them in
    the one-line error."""
    if not bool(holds):
        shown = ", ".join(f"{name} = {_shown(value)}" for name, value in numbers_it_rests_on.items())
        raise ClaimNoLongerHolds(f"the page says {sentence!r}, and the numbers no longer support it"
                                 + (f" ({shown})" if shown else "") + ": rewrite the sentence to what they show")
