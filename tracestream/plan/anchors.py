"""The checks of the anchors a spec selects: one kernel name (or several, when allowed), one
cadence inside every selected pass (the rule of `anchors`), passes cut where clusters are."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from tracestream.errors import Option, SpecError
from tracestream.index.matches import MatchView
from tracestream.plan.cadence import cluster_starts, is_break
from tracestream.plan.specs import NAMES_IN_REFUSAL, LayerSpec


def anchor_names(anchors) -> dict:
    """Kernel names of the matches with their counts, most frequent first."""
    if isinstance(anchors, MatchView):
        return anchors.name_counts()
    return dict(Counter(m.name for m in anchors).most_common())


def anchored_pattern(name: str) -> str:
    """A pattern that matches exactly one kernel name."""
    return f"^{re.escape(name)}$"


def check_anchor_names(names: dict, spec: LayerSpec, pid: Any, device: Any) -> None:
    """Refuse a pattern that matches several kernel names: an anchor is one kernel (a
    pattern like `rope` also matches the draft model's anchor)."""
    if len(names) < 2 or spec.allow_several_anchor_names:
        return
    shown = list(names.items())[:NAMES_IN_REFUSAL]
    listing = ", ".join(f"{_clipped(name)!r} ({count:,})" for name, count in shown)
    if len(names) > len(shown):
        listing += f", … and {len(names) - len(shown)} more"
    raise SpecError(
        Option("anchor_regex"), f" {spec.anchor_regex!r} matches {len(names)} different kernel "
        f"names on pid {pid} device {device}: {listing}. An anchor is one kernel that runs once "
        "per layer; anchor the pattern to one name, e.g. ",
        Option("anchor_regex", anchored_pattern(shown[0][0])),
        " (check it with `tracestream anchors`), or give ",
        Option("allow_several_anchor_names", True), " if these names are one anchor",
    )


def _clipped(name: str, width: int = 100) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def match_starts(anchors) -> np.ndarray:
    """Floor ns of each match's start, in the given (time) order."""
    if isinstance(anchors, MatchView):
        return anchors.starts
    return np.array([m.ts.floor_ns() for m in anchors], np.int64)


def pass_points(spec: LayerSpec) -> np.ndarray:
    """(passes, num_layers + extras) match indices of each selected pass, in time order:
    its layers' anchors (`anchor_stride` apart), then the extras that trail its last layer."""
    first = spec.anchor_offset + np.arange(spec.passes, dtype=np.int64) * spec.matches_per_pass
    layer_matches = spec.num_layers * spec.anchor_stride
    steps = np.concatenate([
        np.arange(spec.num_layers, dtype=np.int64) * spec.anchor_stride,
        layer_matches + np.arange(spec.extra_anchors_per_pass, dtype=np.int64),
    ])
    return first[:, None] + steps


def layer_gaps(starts: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """(passes, num_layers - 1) gaps in ns between consecutive selected anchors of each pass."""
    return np.diff(starts[pass_points(spec)[:, : spec.num_layers]], axis=1)


def cadence(starts: np.ndarray, spec: LayerSpec) -> dict:
    """The gap rule over the selection: the median of its layer gaps, and where a gap inside
    a pass (between its layers, or from its last layer through its trailing extras) exceeds
    `gap_factor` x that median: the pass then straddles two iterations."""
    points = pass_points(spec)
    present = points < len(starts)  # the last pass's extras may lie past the trace's end
    found = np.diff(starts[np.where(present, points, 0)], axis=1)
    layers = found[:, : spec.num_layers - 1]
    evidence = {"gap_factor": spec.gap_factor, "median_layer_gap_us": None,
                "threshold_us": None, "breaks": 0, "first_break": None}
    if not layers.size:
        return evidence
    median = float(np.median(layers))
    evidence["median_layer_gap_us"] = round(median / 1000, 3)
    evidence["threshold_us"] = round(spec.gap_factor * median / 1000, 3)
    if median <= 0:  # duplicate anchor times: refused with their indices by build_guides
        return evidence
    breaks = np.flatnonzero(is_break(found, median, spec.gap_factor) & present[:, 1:])
    evidence["breaks"] = len(breaks)
    if len(breaks):
        p, j = divmod(int(breaks[0]), found.shape[1])
        gap = int(found[p, j])
        evidence["first_break"] = {
            "pass_index": p,
            "from_index": int(points[p, j]),
            "from": _point_name(spec, j),
            "to_index": int(points[p, j + 1]),
            "to": _point_name(spec, j + 1),
            "gap_us": round(gap / 1000, 3),
            "median_ratio": round(gap / median, 2),
        }
    return evidence


def _point_name(spec: LayerSpec, j: int) -> str:
    """`L3`, or `extra anchor 1` for the pass's first trailing extra."""
    if j < spec.num_layers:
        return f"L{spec.first_layer + j}"
    return f"extra anchor {j - spec.num_layers + 1}"


def check_cadence(anchors, starts: np.ndarray, spec: LayerSpec, evidence: dict) -> None:
    """Refuse a selected pass that crosses a cadence break (wrong offset, a missing
    extra anchor per pass, a wrong layer count), naming the two anchors and the gap."""
    found = evidence["first_break"]
    if spec.allow_gaps:
        return
    if found is None:
        _check_passes_on_clusters(anchors, starts, spec)
        return
    before, after = anchors[found["from_index"]], anchors[found["to_index"]]
    more = evidence["breaks"] - 1
    raise SpecError(
        f"pass {found['pass_index']} crosses a cadence break: from match {found['from_index']} "
        f"({found['from']}, ts {before.ts_text} µs) to match {found['to_index']} ({found['to']}, "
        f"ts {after.ts_text} µs) the gap is {found['gap_us']:,.3f} µs, "
        f"{found['median_ratio']:g} x the median layer gap of the selection "
        f"({evidence['median_layer_gap_us']:,.3f} µs; a break is > {spec.gap_factor:g} x)"
        + (f", and {more} more such gap(s)" if more else "")
        + ": the pass straddles two iterations (check ", Option("anchor_offset"), ", ",
        Option("extra_anchors_per_pass"), " and ", Option("num_layers"), ")",
        *_aligned(starts, spec),
        "; `tracestream anchors` shows the clusters, ", Option("allow_gaps", True),
        " labels it anyway",
    )


def pass_boundary_breaks(starts: np.ndarray, spec: LayerSpec) -> tuple[np.ndarray, np.ndarray,
                                                                         float | None]:
    """(gaps in ns just before each selected pass after the first, whether each is a break,
    the median layer gap) by the rule of `cadence`. Passes on the clusters of `anchors` are
    all separated by breaks, or (one stream of back-to-back passes) none are."""
    first = pass_points(spec)[1:, 0]
    layers = layer_gaps(starts, spec)
    if not len(first) or not layers.size:
        return np.zeros(0, np.int64), np.zeros(0, bool), None
    median = float(np.median(layers))
    before = starts[first] - starts[first - 1]
    return before, is_break(before, median, spec.gap_factor), median


def _check_passes_on_clusters(anchors, starts: np.ndarray, spec: LayerSpec) -> None:
    """Refuse passes that do not line up with the clusters: some start after a break, others
    in the middle of an iteration (3 iterations of 8 anchors read as 6 passes of 4)."""
    before, breaks, median = pass_boundary_breaks(starts, spec)
    if median is None or median <= 0 or breaks.all() or not breaks.any():
        return
    first = pass_points(spec)[1:, 0]

    def passes(where: np.ndarray) -> str:
        shown = [f"{k + 1}" for k in where[:5].tolist()]
        return ", ".join(shown) + (f" and {len(where) - 5} more" if len(where) > 5 else "")

    inside, after = np.flatnonzero(~breaks), np.flatnonzero(breaks)
    k = int(inside[0])
    at = anchors[int(first[k])]
    raise SpecError(
        f"the passes do not line up with the cadence clusters: pass(es) {passes(after)} "
        f"follow a break (up to {before[after].max() / 1000:,.3f} µs) but pass(es) "
        f"{passes(inside)} do not ({before[inside].min() / 1000:,.3f} µs and more; median layer "
        f"gap {median / 1000:,.3f} µs, a break is > {spec.gap_factor:g} x): pass {k + 1} starts "
        f"at match {int(first[k])} (ts {at.ts_text} µs) inside an iteration (check ",
        Option("anchor_offset"), ", ", Option("extra_anchors_per_pass"), " and ",
        Option("num_layers"), ")", *_aligned(starts, spec),
        "; `tracestream anchors` shows the clusters, ", Option("allow_gaps", True),
        " labels them anyway",
    )


def _aligned(starts: np.ndarray, spec: LayerSpec) -> list:
    """Settings that put every pass on one cluster of `anchors`, when the clusters show them
    (most clusters of one size): the offset of such a cluster, with the extras that fill it
    for the given layers, or the layers that fill it with the given extras. Both readings
    are offered; which one is right, the model says."""
    first, _ = cluster_starts(starts, spec.gap_factor)
    sizes = np.diff(np.append(first, len(starts)))
    values, counts = np.unique(sizes, return_counts=True)
    if len(first) < 2 or counts.max() < 2:
        return []
    size = int(values[np.argmax(counts)])
    regular = first[sizes == size]
    where = (f"; the matches fall into clusters of {size} ({len(regular)} of {len(first)} "
             f"clusters, first at index {int(regular[0])})")
    at = int(np.searchsorted(regular, spec.anchor_offset, "right")) - 1
    offset = int(regular[max(at, 0)])
    start = [Option("anchor_offset", offset)] if offset != spec.anchor_offset else []
    stride, extra = spec.anchor_stride, spec.extra_anchors_per_pass
    readings = []
    if size >= spec.num_layers * stride and size - spec.num_layers * stride != extra:
        readings.append([Option("extra_anchors_per_pass", size - spec.num_layers * stride)])
    if size > extra and (size - extra) % stride == 0 and (size - extra) // stride != (
            spec.num_layers):
        readings.append([Option("num_layers", (size - extra) // stride)])
    if not readings:
        if size < spec.num_layers * stride:
            return [where + f", fewer than the {spec.num_layers * stride} matches of a pass's "
                    "layers: check ", Option("num_layers"), " and ", Option("anchor_stride")]
        if not start:
            return []
        readings = [[]]
    text: list = [where + (": either " if len(readings) > 1 else ": ")]
    for k, reading in enumerate(readings):
        text.append(", or " if k else "")
        for n, option in enumerate(start + reading):
            text += [" " if n else "", option]
    return text + [", puts each pass on one cluster" if len(readings) > 1
                   else " puts each pass on one cluster"]
