"""The arithmetic of the evidence: layer counts that fit a cluster, cadence verdicts, windows
between anchors and the cross-check of a second landmark. Pure functions over numbers."""

from __future__ import annotations

import numpy as np

from tracestream.index.matches import MatchView

INSIDE_VARIATION = 1.1
"""Largest in-cluster gap (in median gaps) above which the verdict mentions sub-structure."""


def separation(between: np.ndarray, first: np.ndarray, median_ns: float | None) -> dict:
    """Largest gap inside clusters and smallest gap between them, in median gaps
    (`between`: the start-to-start gaps, `first`: each cluster's first index).

    This is the margin of the rule: a clean split has inside ~1 and between >> 1.
    """
    if median_ns is None or median_ns <= 0:
        return {"max_inside_ratio": None, "min_between_ratio": None}
    is_between = np.zeros(len(between), bool)
    is_between[first[1:] - 1] = True
    inside = int(np.max(between, where=~is_between, initial=NO_GAP))
    low = int(np.min(between, where=is_between, initial=np.iinfo(np.int64).max))
    return {
        "max_inside_ratio": round(inside / median_ns, 2) if len(first) < len(between) + 1
        else None,
        "min_between_ratio": round(low / median_ns, 2) if len(first) > 1 else None,
    }


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def readings(size: int) -> str:
    """What a pass of `size` anchor matches is consistent with (never a choice)."""
    options = [f"{size} layers per pass"]
    if size > 1:
        options.append(f"{size - 1} layers + 1 extra anchor per pass (--extra-anchors-per-pass 1)")
    strides = _divisors(size)
    if strides:
        shown = ", ".join(f"{size // s} layers x stride {s}" for s in strides[:4])
        options.append(f"an anchor that runs several times per layer ({shown}, --anchor-stride)")
    return ", or ".join(options)


def verdict_text(count: int, first: np.ndarray, sizes: np.ndarray,
                 max_inside_ratio: float | None = None) -> str:
    """One line: what the cluster sizes are consistent with (clusters as their first
    indices and sizes). States facts, picks nothing."""
    text = _sizes_text(count, first, sizes)
    if max_inside_ratio is not None and max_inside_ratio > INSIDE_VARIATION:
        text += (
            f"; gaps inside clusters reach {max_inside_ratio:g} x the median: a cluster may "
            "hold several short passes or layers of different kinds (see the gap histogram)"
        )
    return text


def _sizes_text(count: int, first: np.ndarray, sizes: np.ndarray) -> str:
    if len(first) == 1:
        return (
            f"{count} match(es) in 1 cluster: the gaps do not separate passes; "
            f"{count} is consistent with {readings(count)}, or with several passes whose "
            "gaps are not larger — verify in the model config and the timeline"
        )
    distinct, times = np.unique(sizes, return_counts=True)
    if len(distinct) == 1:
        size = int(sizes[0])
        return (
            f"{len(first)} clusters of {size}: consistent with {readings(size)} — "
            "verify in the model config"
        )
    # the most common size; ties go to the size seen first, as Counter.most_common does
    top = np.flatnonzero(times == times.max())
    first_seen = [int(np.argmax(sizes == distinct[k])) for k in top.tolist()]
    common = int(distinct[top[int(np.argmin(first_seen))]])
    odd = np.flatnonzero(sizes != common)
    listing = ", ".join(f"{int(sizes[c])} at index {int(first[c])}"
                        for c in odd[:6].tolist()) + (" …" if len(odd) > 6 else "")
    return (
        f"{len(first)} clusters of unequal size: {int(times.max())} of {common} "
        f"({readings(common)}); others: {listing}. A short first or last cluster may be a "
        "pass cut by the capture window; another size may be another phase — the offset "
        "must start a complete pass of the verified phase; verify in the model config"
    )


def matches_before(anchor_ns: np.ndarray, cross_ns: np.ndarray) -> np.ndarray:
    """Per anchor: how many cross-check matches start before it (both in time order, as
    exact ns; ties with digits below 1 ns are the caller's to settle)."""
    return np.searchsorted(cross_ns, anchor_ns, "left")


def window_counts(before: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cross-check matches in [anchor i, anchor i+1) for every i, from `matches_before`,
    and whether that window is counted (both anchors in one cluster; `first`: each
    cluster's first index).

    Windows that span two clusters are not counted: the gap between passes is
    not a layer.
    """
    inside = np.ones(max(len(before) - 1, 0), bool)
    inside[first[1:] - 1] = False
    return np.diff(before), inside


def outside_windows(before: np.ndarray, first: np.ndarray, sizes: np.ndarray,
                    total: int) -> int:
    """Cross-check matches that fall in no counted window (before, between or after
    clusters), of `total`."""
    if not len(first):
        return total
    return total - int((before[first + sizes - 1] - before[first]).sum())


def after_last_anchor(before: np.ndarray, first: np.ndarray, sizes: np.ndarray,
                      total: int) -> np.ndarray:
    """Per cluster: cross-check matches from its last anchor up to the next cluster (or
    the end, `total`).

    A terminal there means the last anchor opens a layer; none means it is
    more likely an extra anchor (an output head) — evidence, not a decision.
    """
    upto = np.append(before[first[1:]], total)
    return upto - before[first + sizes - 1]


def cross_verdict(window_counts: np.ndarray, tails: np.ndarray, sizes: np.ndarray) -> str:
    """What the cross-check counts are consistent with (one sentence, no choice made)."""
    bad = int(np.count_nonzero(window_counts != 1))
    if bad:
        return (
            f"{bad} window(s) without exactly one match: there the anchor or the cross-check "
            "kernel does not run once per layer (a different phase, a partial pass, or the "
            "wrong landmark)"
        )
    if not len(window_counts) or (sizes != sizes[0]).any():
        return "every counted window holds exactly one match"
    size = int(sizes[0])
    if (tails == 0).all():
        return (
            f"every cluster has {size - 1} windows with one match each and none after its last "
            f"anchor: consistent with {size - 1} layers + 1 extra anchor per pass"
        )
    if (tails == 1).all():
        return (
            f"every window holds one match and one more follows each cluster's last anchor: "
            f"consistent with {size} layers per pass"
        )
    return "every counted window holds exactly one match; the matches after the last anchor vary"


NO_GAP = np.iinfo(np.int64).min  # what the C extension's json_rows writes as null


def start_gaps(anchors: MatchView, block: int = 1 << 16,
               out: np.ndarray | None = None) -> np.ndarray:
    """Start-to-start gaps (ns) of the matches in view order (into `out` when given),
    computed a block at a time (the whole column of starts in view order is never made)."""
    starts = anchors.table.starts
    order = anchors.order
    if out is None:
        out = np.empty(max(len(order) - 1, 0), np.int64)
    for lo in range(0, len(out), block):
        hi = min(lo + block, len(out))
        times = starts[order[lo : hi + 1]]
        np.subtract(times[1:], times[:-1], out=out[lo:hi])
    return out
