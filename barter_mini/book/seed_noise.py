"""The book's one rule for telling a gap from seed noise.

Every comparison between two settings is paired by seed: the same seed gives both settings
the same initial weights, data order and validation split, so the per-seed differences
``d_s = a_s - b_s`` cancel what a good or bad seed does to both. Over ``n`` seeds the gap is
``mean(d)``, its spread the sample standard deviation ``sd(d)`` (n - 1) and its standard
error ``se = sd(d) / sqrt(n)``. A gap is *beyond the seed noise* when
``|mean(d)| > 2 se``: about a 95 % interval for many seeds, and lenient for few (a paired
t-test at three seeds would ask for 4.3 se), so "within the noise" is the safer reading.
One seed has no spread and never decides.

Every chapter that states whether a gap is real (02, 03, 05, 07, 08) uses this rule through
:func:`beyond_noise` or :func:`standing`, and says so in the words of :data:`RULE`.
"""

from __future__ import annotations

import math

import numpy as np

#: how many standard errors a paired gap must clear to be beyond the seed noise
STANDARD_ERRORS = 2
#: the rule in the words a page prints after "beyond the seed noise"
RULE = "twice its standard error"


def paired_summary(gaps) -> tuple[float, float, float]:
    """Mean, sample standard deviation (n - 1) and standard error ``sd / sqrt(n)`` of paired
    differences; one difference has no spread (NaN)."""
    gaps = np.asarray(gaps, dtype=float)
    sd = float(np.std(gaps, ddof=1)) if len(gaps) > 1 else math.nan
    return float(np.mean(gaps)), sd, sd / math.sqrt(len(gaps))


def beyond_noise(gap: float, sd: float, seeds: int) -> bool:
    """Whether a mean gap paired over ``seeds`` seeds, with sample standard deviation ``sd``,
    is beyond the seed noise: ``|gap| > 2 sd / sqrt(seeds)``; never with one seed."""
    return seeds > 1 and not math.isnan(sd) and abs(gap) > STANDARD_ERRORS * sd / math.sqrt(seeds)


def standing(gap: float, se: float) -> str:
    """``ahead`` or ``behind`` where a paired gap with standard error ``se`` is beyond the seed
    noise (``|gap| > 2 se``), ``level`` within it, ``undecided`` where one seed gives no
    standard error."""
    if not math.isfinite(se):
        return "undecided"
    if gap > STANDARD_ERRORS * se:
        return "ahead"
    if gap < -STANDARD_ERRORS * se:
        return "behind"
    return "level"
