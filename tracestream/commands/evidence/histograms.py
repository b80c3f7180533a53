"""The shape of an anchor's cadence at a glance: a histogram of the gaps between
consecutive matches, one of the cluster sizes, and each cluster's median gap.

Pure functions over the packed gap column (numpy): a nightly trace has millions of
matches, so nothing here makes a Python object per match or gap.
"""

from __future__ import annotations

import numpy as np

from tracestream.commands.evidence.readings import NO_GAP

GAP_STEPS = (10, 15, 20, 30, 50, 70)
"""Bucket bounds per decade, in tenths (1, 1.5, 2, 3, 5, 7 x 10^k ns): steps of 1.3-1.7x
keep one cadence in one or two rows, and a decade of breaks in a handful."""

_LARGEST = int(np.iinfo(np.int64).max)

MAX_EXACT_SIZES = 16
"""Up to this many distinct cluster sizes get a row each; more are grouped by powers of 2."""


def gap_bounds(largest_ns: int, threshold_ns: int | None) -> np.ndarray:
    """Upper bounds (ns) of the gap buckets: 0 (gaps of 0), then 1, 1.5, 2, 3, 5, 7 x 10^k
    up to the first at or above `largest_ns`, and the rule's threshold (the largest gap
    that does not start a cluster), so no bucket mixes gaps inside and between clusters."""
    bounds = {0}
    scale = 1
    while max(bounds) < largest_ns:  # (a decade past int64's ns is its largest value)
        bounds.update(min(step * scale // 10, _LARGEST)
                      for step in GAP_STEPS if step * scale >= 10)
        scale *= 10
    if threshold_ns is not None:
        bounds.add(threshold_ns)
    found = np.array(sorted(bounds), np.int64)
    return found[: int(np.searchsorted(found, largest_ns, "left")) + 1]


def gap_histogram(between: np.ndarray, median_ns: float | None, factor: float) -> dict:
    """How many gaps fall in each bucket (above its `from_us`, up to and including its
    `to_us`; the first bucket, 0 to 0, holds gaps of 0): only the buckets that hold gaps,
    smallest first. `breaks` marks buckets above the rule's threshold, `break_above_us`
    is the threshold (None without gaps)."""
    if not len(between):
        return {"gaps": 0, "break_above_us": None, "buckets": []}
    largest = int(between.max())
    above = factor * median_ns  # a float: a huge --gap-factor makes it inf
    # a whole number of ns: a gap is > factor x median exactly when it is > this (None:
    # no gap is, and no bound is needed for it)
    threshold = int(np.floor(above)) if above < largest else None
    bounds = gap_bounds(largest, threshold)
    counts = np.bincount(np.searchsorted(bounds, between, "left"), minlength=len(bounds))
    return {
        "gaps": len(between),
        "break_above_us": float(np.floor(above)) / 1000 if np.isfinite(above) else None,
        "buckets": [
            {"from_us": (int(bounds[k - 1]) if k else 0) / 1000, "to_us": int(bounds[k]) / 1000,
             "count": n,
             "breaks": k > 0 and threshold is not None and int(bounds[k - 1]) >= threshold}
            for k, n in enumerate(counts.tolist()) if n
        ],
    }


def size_histogram(sizes: np.ndarray) -> dict:
    """How many clusters have each size (`from_size` = `to_size`), or, with more than
    MAX_EXACT_SIZES distinct sizes, each range of sizes from 2^k to 2^(k+1) - 1."""
    distinct, counts = np.unique(sizes, return_counts=True)
    if len(distinct) <= MAX_EXACT_SIZES:
        rows = [(size, size, n) for size, n in zip(distinct.tolist(), counts.tolist())]
    else:
        powers = np.floor(np.log2(distinct)).astype(np.int64)
        grouped = np.bincount(powers, weights=counts).astype(np.int64)
        rows = [(1 << k, (2 << k) - 1, n) for k, n in enumerate(grouped.tolist()) if n]
    return {"clusters": len(sizes),
            "buckets": [{"from_size": a, "to_size": b, "clusters": n} for a, b, n in rows]}


def cluster_median_gaps(between: np.ndarray, first: np.ndarray, sizes: np.ndarray,
                        block: int = 1 << 16) -> np.ndarray:
    """Each cluster's median gap between its own consecutive matches, in ns rounded half up
    (NO_GAP for a cluster of one match), from the gaps of all matches (`between`).

    Clusters are taken a block of about `block` gaps at a time, sorted by (cluster, gap)
    together, so the work is a few sorts and the memory a few arrays of one block.
    """
    medians = np.full(len(first), NO_GAP, np.int64)
    c = 0
    while c < len(first):
        lo = int(first[c])
        d = max(c + 1, int(np.searchsorted(first, lo + block, "right")))
        hi = int(first[d - 1] + sizes[d - 1]) - 1  # the gaps of clusters c..d-1 and those between
        key = between[lo:hi].copy()
        key[first[c + 1 : d] - 1 - lo] = np.iinfo(np.int64).max  # gaps between clusters: last
        owner = np.repeat(np.arange(d - c), sizes[c:d])[: hi - lo]
        ordered = key[np.lexsort((key, owner))]
        n = sizes[c:d] - 1  # gaps inside each cluster, first in its run of the sorted gaps
        at = first[c:d] - lo
        some = n > 0
        low = ordered[(at + (n - 1) // 2)[some]]
        high = ordered[(at + n // 2)[some]]
        medians[c:d][some] = (low + high + 1) // 2
        c = d
    return medians
