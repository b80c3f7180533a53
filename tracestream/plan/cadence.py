"""The cadence rule shared by `anchors` and `layers`: where the gaps between anchors break.

`anchors` splits all matches into clusters where a gap exceeds `factor` x the
median gap; `layers` applies the same threshold to the gaps inside each selected
pass, whose layers must run at one cadence. Pure functions over start times in
ns (numpy arrays): a nightly job checks millions of matches, so nothing here
makes a Python object per match.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

GAP_FACTOR = 3.0
"""Default cluster split: a gap larger than this many median gaps starts a new cluster.

3, not 5: in the shipped sample the gap between two target passes is only
~3.6x the layer-to-layer gap (draft passes run in between), so 5x would merge
every pass into one cluster. The output always shows the measured separation.
"""


def gap_factor_problem(factor) -> str | None:
    """Why `factor` cannot be the rule's threshold (text after the option's name), or None.
    inf would make no gap a break and record null in the report; nan none either."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        return f" must be a number, got {factor!r}"
    if not math.isfinite(factor) or not factor > 1:
        return f" must be > 1 and finite, got {factor}"
    return None


def gaps(times: Sequence[int]) -> np.ndarray:
    """Start-to-start gaps between consecutive matches (ns)."""
    return np.diff(np.asarray(times, dtype=np.int64))


def is_break(gap_ns, median_ns: float, factor: float = GAP_FACTOR):
    """The rule itself: a gap longer than `factor` x the median gap is a break."""
    return gap_ns > factor * median_ns


def cluster_starts(times: Sequence[int], factor: float = GAP_FACTOR):
    """(first index of every cluster as an array, median gap in ns or None): a new cluster
    starts after every gap longer than `factor` x the median gap.

    Passes of a phase show up as clusters because the host/other phases run
    between them; the rule is deliberately simple so a user can check it by hand.
    """
    between = gaps(times)
    if not len(between):
        return np.zeros(min(len(times), 1), np.int64), None
    median = float(np.median(between))
    return starts_at_breaks(between, median, factor), median


def starts_at_breaks(between: np.ndarray, median_ns: float,
                     factor: float = GAP_FACTOR) -> np.ndarray:
    """First index of every cluster of matches whose start-to-start gaps are `between`
    (at least one), given their median."""
    breaks = np.flatnonzero(is_break(between, median_ns, factor)) + 1
    return np.concatenate([np.zeros(1, np.int64), breaks])


def rule_text(factor: float, median_ns: float | None) -> str:
    """The clustering rule as printed, with the threshold it produced."""
    if median_ns is None:
        return "fewer than 2 matches: no gaps to cluster"
    return (
        f"a gap > {factor:g} x the median gap ({median_ns / 1000:.3f} us, threshold "
        f"{factor * median_ns / 1000:.3f} us) starts a new cluster"
    )
