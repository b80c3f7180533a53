"""Layer guides: which anchor matches label which layer, and where each guide ends.

Pure functions over the kernel matches the index pass found. The tool never
guesses: the user gives the offset of the verified first layer, the layer count,
the stride and the extras per pass; anything that does not fit is refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracestream.errors import Option, SpecError, TraceError, require_utf8
from tracestream.index.matches import MatchTable, MatchView
from tracestream.plan.cadence import GAP_FACTOR, cluster_starts, gap_factor_problem, is_break

GUIDE_NOTICE = (
    "Navigation aid: the interval from this layer's verified anchor kernel to the next "
    "layer's anchor (or to the verified terminal kernel's end). Not a layer latency and "
    "not exclusive ownership of the kernels inside it."
)

NEXT_LAYER_ANCHOR = "next_layer_anchor"
TERMINAL_KERNEL_END = "terminal_kernel_end"
ANCHOR_POINT_ONLY = "anchor_point_only"

ALL_PASSES = "all"
"""`passes` that labels every complete pass from the offset."""

NAMES_IN_REFUSAL = 6  # kernel names listed when a pattern matches several
NAMES_IN_REPORT = 10


@dataclass(frozen=True)
class LayerSpec:
    """What the user verified: the anchor, where L0 starts, and the pass structure."""

    anchor_regex: str
    num_layers: int
    anchor_offset: int
    phase: str
    evidence: str
    passes: int | str = 1  # a count, or "all": every complete pass from the offset
    anchor_stride: int = 1
    extra_anchors_per_pass: int = 0
    first_layer: int = 0
    end_anchor_regex: str | None = None
    pid: Any = None
    device: Any = None
    gap_factor: float = GAP_FACTOR  # the cadence rule of `anchors`: a break is > F x median
    allow_several_anchor_names: bool = False  # the pattern may match several kernel names
    allow_gaps: bool = False  # a selected pass may cross a cadence break

    def validate(self) -> None:
        """Refuses values no trace can satisfy; messages name the spec fields."""
        if not self.phase or not self.phase.strip():
            raise SpecError(Option("phase"), " must not be empty (e.g. 'target-verify')")
        if not self.evidence or not self.evidence.strip():
            raise SpecError(
                Option("evidence"), " must not be empty: say how you verified that the anchor "
                "runs once per layer and where L0 is"
            )
        if self.passes != ALL_PASSES and (isinstance(self.passes, bool)
                                          or not isinstance(self.passes, int)):
            raise SpecError(Option("passes"), f" must be a count or 'all', got {self.passes!r}")
        for name, value, least in (
            ("anchor_offset", self.anchor_offset, 0),
            ("num_layers", self.num_layers, 1),
            ("passes", 1 if self.passes == ALL_PASSES else self.passes, 1),
            ("anchor_stride", self.anchor_stride, 1),
            ("extra_anchors_per_pass", self.extra_anchors_per_pass, 0),
            ("first_layer", self.first_layer, 0),
        ):
            if value < least:
                raise SpecError(Option(name), f" must be >= {least}, got {value}")
            if value > LARGEST_COUNT:
                raise SpecError(Option(name), f" must be <= {LARGEST_COUNT}, got {value}")
        if (problem := gap_factor_problem(self.gap_factor)) is not None:
            raise SpecError(Option("gap_factor"), problem)
        for name, text in (("anchor_regex", self.anchor_regex), ("phase", self.phase),
                           ("evidence", self.evidence), ("end_anchor_regex", self.end_anchor_regex),
                           ("pid", self.pid), ("device", self.device)):
            require_utf8(text, name)

    @property
    def matches_per_pass(self) -> int:
        """Matches one pass uses: its layers' anchors and the extras before the next pass."""
        return self.num_layers * self.anchor_stride + self.extra_anchors_per_pass


LARGEST_COUNT = 2**31 - 1
"""Largest layer number, count, offset or stride: far above any real model, and small
enough that every sum of them fits the packed int64 arrays and JSON's exact integers."""


def anchor_index(spec: LayerSpec, pass_index: int, layer: int) -> int:
    """Match index of layer `layer` in pass `pass_index`: K + p*(N*S + E) + l*S."""
    return spec.anchor_offset + pass_index * spec.matches_per_pass + layer * spec.anchor_stride


def required_matches(spec: LayerSpec, passes: int | None = None) -> int:
    """Matches needed from the offset: every layer of every pass, extras between passes."""
    passes = spec.passes if passes is None else passes
    return (passes - 1) * spec.matches_per_pass + spec.num_layers * spec.anchor_stride


def complete_passes(spec: LayerSpec, count: int) -> int:
    """How many complete passes `count` matches hold from the offset (extras are needed
    only between passes, so the last pass may end the trace)."""
    available = count - spec.anchor_offset
    layer_matches = spec.num_layers * spec.anchor_stride
    if available < layer_matches:
        return 0
    return (available - layer_matches) // spec.matches_per_pass + 1


def with_passes(spec: LayerSpec, count: int) -> LayerSpec:
    """The spec with `passes` a number: `all` becomes every complete pass from the offset
    (at least 1, so that too few matches are refused with their counts)."""
    if spec.passes != ALL_PASSES:
        return spec
    return dataclasses.replace(spec, passes=max(complete_passes(spec, count), 1))


def coverage(spec: LayerSpec, count: int) -> dict:
    """What the selection leaves out: complete passes from the offset not labelled, and
    matches outside the selection (before the offset, skipped, or after its last pass)."""
    complete = complete_passes(spec, count)
    used = required_matches(spec)
    return {
        "complete_passes": complete,
        "unlabelled_complete_passes": complete - spec.passes,
        "labelled_anchor_count": spec.passes * spec.num_layers,
        "matches_outside_selection": count - used,
    }


# -- the mistakes people make most ---------------------------------------------------


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
def select_gpu(matches, pid: Any, device: Any, what: str) -> tuple[Any, Any]:
    """The one (pid, device) the matches are on, or a refusal that lists the candidates
    (`what`: the spec field of the pattern, e.g. `anchor_regex`)."""
    gpus = matches.gpus() if isinstance(matches, MatchTable) else Counter(
        (m.pid, m.device) for m in matches)
    if pid is not None:
        gpus = Counter({key: gpus[key] for key in same_id_filter(gpus, pid, lambda k: k[0])})
        if not gpus:
            raise SpecError("no kernel matches ", Option(what), f" in pid {id_text(pid)}")
    pids: Counter = Counter()
    for (p, _), n in gpus.items():
        pids[p] += n
    if len(pids) > 1:
        listing = ", ".join(f"pid {id_text(p)}: {n}"
                            for p, n in sorted(pids.items(), key=_order))
        raise SpecError(
            Option(what), f" matches kernels in several processes ({listing}); pick one with ",
            Option("pid"),
        )
    chosen_pid = next(iter(pids))
    if device is not None:
        gpus = Counter({key: gpus[key] for key in same_id_filter(gpus, device, lambda k: k[1])})
        if not gpus:
            raise SpecError("no kernel matches ", Option(what),
                            f" on device {id_text(device)} of pid {id_text(chosen_pid)}")
    devices: Counter = Counter()
    for (_, d), n in gpus.items():
        devices[d] += n
    if len(devices) > 1:
        listing = ", ".join(f"device {id_text(d)}: {n}"
                            for d, n in sorted(devices.items(), key=_order))
        raise SpecError(
            Option(what), f" matches kernels on several devices of pid {id_text(chosen_pid)} "
            f"({listing}); "
            "pick one with ", Option("device"),
        )
    return chosen_pid, next(iter(devices))


def _same(value: Any, wanted: Any) -> bool:
    return value == wanted or str(value) == str(wanted)


def same_id_filter(keys, wanted: Any, at=lambda key: key) -> list:
    """The keys whose id (`at(key)`) is `wanted`: exactly (0 is not "0") where one is, else
    as text (`--pid 7` also finds a trace's "7")."""
    exact = [k for k in keys if type(at(k)) is type(wanted) and at(k) == wanted]
    return exact or [k for k in keys if _same(at(k), wanted)]


def id_from_text(value: Any) -> Any:
    """--pid/--device as typed: an integer when it reads as one, else the text; in JSON
    quotes (`--pid '"0"'`) the string inside, for a trace whose pid "0" is a string."""
    if not isinstance(value, str):
        return value
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            inner = json.loads(value)
        except ValueError:
            inner = None
        if isinstance(inner, str):
            return inner
    try:
        return int(value)
    except ValueError:
        return value


def id_text(value: Any) -> str:
    """A pid/device in a message: a string in JSON quotes, so pid "0" is not pid 0."""
    return json.dumps(value) if isinstance(value, str) else str(value)


def _order(item):
    key = item[0]
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def on_gpu(matches, pid: Any, device: Any):
    """Matches on one GPU, sorted by exact start time (ties in file order)."""
    if isinstance(matches, MatchTable):
        return matches.on_gpu(pid, device)
    chosen = [m for m in matches if m.pid == pid and m.device == device]
    chosen.sort(key=lambda m: (m.ts.floor_ns(), m.ts, m.ordinal))
    return chosen


# -- guides as columns ------------------------------------------------------------------

GUIDE_BLOCK = 1 << 10
"""Guides checked, and later written, at a time: a nightly job labels 10^5-10^6 of them,
so no step holds more than a block's worth of per-guide values."""

BOUNDARY_KINDS = (NEXT_LAYER_ANCHOR, TERMINAL_KERNEL_END, ANCHOR_POINT_ONLY)
_NEXT, _TERMINAL, _POINT = range(3)


def as_view(matches, *, in_time_order: bool) -> MatchView:
    """Matches as a MatchView: a view as it is, a list packed into a table (in the given
    order, or sorted by exact start with `in_time_order`)."""
    if isinstance(matches, MatchView):
        return matches
    table = MatchTable.from_matches(list(matches))
    order = np.arange(len(table), dtype=np.int64)
    if in_time_order:
        order = np.argsort(table.starts, kind="stable")
        if table.texts:
            order = table._exact_ties(order)
    return MatchView(table, order)


@dataclass
class GuideBlock:
    """Consecutive guides as columns (what the guide events and report rows are made of)."""

    pass_index: np.ndarray
    layer_id: np.ndarray
    anchor_index: np.ndarray
    anchor_rows: np.ndarray  # rows of the anchors' MatchTable
    anchor_name: np.ndarray  # the anchors' name ids (MatchTable.names)
    anchor_track: np.ndarray  # and tracks (MatchTable.tid_of)
    start_text: list[bytes]  # the anchor's ts as the source wrote it
    end_text: list[bytes]
    start_floor_ns: np.ndarray
    end_floor_ns: np.ndarray
    guide_start_us: np.ndarray  # whole µs, halves up
    guide_end_us: np.ndarray
    kind: np.ndarray  # index into BOUNDARY_KINDS


@dataclass
class GuideTable:
    """The selected guides: a few bytes per pass (its terminal), the rest computed from
    the spec and the anchors' packed columns a block at a time (`blocks`)."""

    spec: LayerSpec  # passes a number
    anchors: MatchView
    terminals: MatchView | None
    terminal_at: np.ndarray  # view position of each pass's terminal (empty without)

    def __len__(self) -> int:
        return self.spec.passes * self.spec.num_layers

    def blocks(self, size: int = GUIDE_BLOCK) -> Iterator[GuideBlock]:
        spec, view = self.spec, self.anchors
        table = view.table
        for first in range(0, len(self), size):
            p, layer, index = _guide_positions(spec, first, min(first + size, len(self)))
            last = layer == spec.num_layers - 1
            rows = view.order[index]
            packed = table.take(rows)
            start_text = table.start_texts(rows, packed)
            start_floor, start_us = table.exact_times(rows, rows=packed)
            end_text = list(start_text)
            end_floor, end_us = start_floor.copy(), start_us.copy()
            kind = np.full(len(index), _NEXT, np.int8)
            inside = np.flatnonzero(~last)
            if len(inside):
                upper = view.order[index[inside] + spec.anchor_stride]
                packed_upper = table.take(upper)
                for k, text in zip(inside.tolist(), table.start_texts(upper, packed_upper)):
                    end_text[k] = text
                end_floor[inside], end_us[inside] = table.exact_times(upper, rows=packed_upper)
            ends = np.flatnonzero(last)
            if self.terminals is None:
                kind[ends] = _POINT
            elif len(ends):
                kind[ends] = _TERMINAL
                terminal = self.terminals.order[self.terminal_at[p[ends]]]
                found = self.terminals.table
                packed_terminal = found.take(terminal)
                for k, text in zip(ends.tolist(), found.ends_of(terminal, packed_terminal)[0]):
                    end_text[k] = text
                end_floor[ends], end_us[ends] = found.exact_times(terminal, end=True,
                                                                  rows=packed_terminal)
            yield GuideBlock(p, layer + spec.first_layer, index, rows, packed["name"],
                             packed["track"], start_text, end_text, start_floor, end_floor,
                             start_us, end_us, kind)


def _guide_positions(spec: LayerSpec, first: int, stop: int):
    """(pass, layer, anchor match index) of guides first..stop-1 (anchor_index, vectorised)."""
    guide = np.arange(first, stop, dtype=np.int64)
    p, layer = np.divmod(guide, spec.num_layers)
    return p, layer, spec.anchor_offset + p * spec.matches_per_pass + layer * spec.anchor_stride


def build_guides(anchors, terminals, spec: LayerSpec) -> GuideTable:
    """The guides of the selection, checked block by block in one vectorised pass over the
    sorted matches (terminal windows by `searchsorted`, linear in the matches); refuses
    whatever does not fit the spec, naming the first guide (in pass and layer order) that
    fails, with the same check order as one guide at a time: anchor order, duplicate
    anchor times, then its terminal window.

    `anchors`: the GPU's matches in time order (MatchView, or a list of Match);
    `terminals`: the terminal matches, or None without --end-anchor-regex."""
    anchors = as_view(anchors, in_time_order=False)
    needed = required_matches(spec)
    available = len(anchors) - spec.anchor_offset
    if available < needed:
        raise TraceError(
            f"need {needed} anchors from offset {spec.anchor_offset}, found {max(available, 0)} "
            f"({spec.passes} pass(es) x {spec.num_layers} layers x stride {spec.anchor_stride}"
            f" + {spec.extra_anchors_per_pass} extra between passes; {len(anchors)} matches "
            "in all)"
        )
    if terminals is not None:
        terminals = as_view(terminals, in_time_order=True)
        terminal_starts = terminals.starts
    guides = GuideTable(spec, anchors, terminals,
                        np.zeros(spec.passes if terminals is not None else 0, np.int64))
    previous = -1  # the last selected anchor of the block before
    previous_us = None  # and its rounded start
    shared = None  # the first two consecutive guides with one rounded start
    for first in range(0, len(guides), GUIDE_BLOCK):
        p, layer, index = _guide_positions(spec, first, min(first + GUIDE_BLOCK, len(guides)))
        last = layer == spec.num_layers - 1
        upper = np.where(last, spec.anchor_offset + (p + 1) * spec.matches_per_pass,
                         index + spec.anchor_stride)
        has_upper = upper < len(anchors)
        upper_or_self = np.where(has_upper, upper, index)
        before = np.concatenate([[previous], index[:-1]])
        out_of_order = before >= 0
        out_of_order[out_of_order] = ~_starts_before(anchors, before[out_of_order],
                                                     index[out_of_order])
        duplicate = has_upper & ~_starts_before(anchors, index, upper_or_self)
        bad = out_of_order | duplicate
        if terminals is not None:
            low = _first_not_before(terminals, terminal_starts, anchors, index)
            high = np.where(has_upper, _first_not_before(terminals, terminal_starts, anchors,
                                                         upper_or_self), len(terminals))
            single = np.flatnonzero((high - low == 1) & has_upper)
            crossing = np.zeros(len(index), bool)
            crossing[single] = _ends_after(terminals, low[single], anchors, upper[single])
            bad |= (high - low != 1) | crossing
            guides.terminal_at[p[last]] = low[last]
        if bad.any():
            k = int(np.argmax(bad))
            _refuse_guide(anchors, terminals, spec, int(p[k]), int(layer[k]), int(index[k]),
                          int(before[k]), int(upper[k]) if has_upper[k] else None,
                          out_of_order[k], duplicate[k])
        starts_us = anchors.table.exact_times(anchors.order[index])[1]
        if shared is None:  # refused after every other check, as one guide at a time did
            before_us = starts_us[0] - 1 if previous_us is None else previous_us
            same = np.flatnonzero(np.diff(starts_us, prepend=before_us) == 0)
            if len(same):
                shared = (first + int(same[0]) - 1, first + int(same[0]))
        previous, previous_us = int(index[-1]), int(starts_us[-1])
    if shared is not None:
        refuse_shared_guide_start(anchors, spec, *shared)
    return guides


def refuse_shared_guide_start(anchors: MatchView, spec: LayerSpec, before: int,
                              guide: int) -> None:
    """Refuse two guides (numbers `before` and `guide`) that round to the same
    whole-microsecond start.

    Guides are whole microseconds on one track. Perfetto sorts slices that start
    together longest first and closes one only when its end <= the next start, so
    of two guides starting in the same microsecond one imports nested under the
    other (depth 1). Moving either would misstate where its layer starts.
    """
    p0, l0 = divmod(before, spec.num_layers)
    p1, l1 = divmod(guide, spec.num_layers)
    i0, i1 = anchor_index(spec, p0, l0), anchor_index(spec, p1, l1)
    raise TraceError(
        f"layers L{spec.first_layer + l0} (pass {p0}, anchor at ts "
        f"{anchors[i0].ts_text}) and L{spec.first_layer + l1} (pass {p1}, "
        f"anchor at ts {anchors[i1].ts_text}) start in the same microsecond once "
        "rounded: whole-microsecond guides on one track would nest in Perfetto. "
        "These anchors are less than 1 µs apart; check --anchor-regex and "
        "--anchor-stride"
    )


def _starts_before(view: MatchView, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Whether match `left[k]` starts strictly before `right[k]` (view positions), exactly:
    by the packed ns, and by the exact decimal where a row kept as text is within 1 ns."""
    table = view.table
    a_rows, b_rows = view.order[left], view.order[right]
    a, b = table.starts[a_rows], table.starts[b_rows]
    before = a < b
    if table.texts:
        near = np.flatnonzero(np.abs(a - b) <= 1)
        whole = table.whole_ns(a_rows[near]) & table.whole_ns(b_rows[near])
        for k in near[~whole].tolist():
            before[k] = view[int(left[k])].ts < view[int(right[k])].ts
    return before


def _first_not_before(terminals: MatchView, starts: np.ndarray, anchors: MatchView,
                      which: np.ndarray) -> np.ndarray:
    """Per anchor position `which`, the first terminal position whose start is not before
    the anchor's (a bisect on the packed ns; exact near a row kept as text)."""
    floor = anchors.table.starts[anchors.order[which]]
    found = np.searchsorted(starts, floor, "left")
    if not (anchors.table.texts or terminals.table.texts):
        return found
    low = np.searchsorted(starts, floor - 1, "left")
    high = np.searchsorted(starts, floor + 1, "right")
    for k in np.flatnonzero(high > low).tolist():
        exact = anchors[int(which[k])].ts
        j = int(low[k])
        while j < high[k] and terminals[j].ts < exact:
            j += 1
        found[k] = j
    return found


def _ends_after(terminals: MatchView, at: np.ndarray, anchors: MatchView,
                upper: np.ndarray) -> np.ndarray:
    """Whether terminal `at[k]` ends after anchor `upper[k]` starts (exact)."""
    t_rows, u_rows = terminals.order[at], anchors.order[upper]
    t = terminals.table.take(t_rows)
    ends, starts = t["start"] + t["dur"], anchors.table.starts[u_rows]
    after = starts < ends
    inexact = ~(terminals.table.whole_ns(t_rows) & anchors.table.whole_ns(u_rows))
    for k in np.flatnonzero(inexact).tolist():
        after[k] = anchors[int(upper[k])].ts < terminals[int(at[k])].end
    return after


def _refuse_guide(anchors, terminals, spec: LayerSpec, p: int, layer: int, index: int,
                  before: int, upper_index: int | None, out_of_order, duplicate) -> None:
    """The refusal of the first guide that fails a check (see build_guides)."""
    anchor = anchors[index]
    layer_id = spec.first_layer + layer
    if out_of_order:
        raise TraceError(
            f"anchors are not strictly increasing in time: match {index} (pass {p}, "
            f"layer L{layer_id}) at ts {anchor.ts_text} does not come "
            f"after the previous selected anchor at ts {anchors[before].ts_text}"
        )
    upper = anchors[upper_index] if upper_index is not None else None
    if duplicate:
        raise TraceError(
            f"anchor match {upper_index} at ts {upper.ts_text} does not come after "
            f"match {index} at ts {anchor.ts_text} (pass {p}, layer "
            f"L{layer_id}): duplicate anchor times"
        )
    floor = np.array([index], np.int64)
    low = int(_first_not_before(terminals, terminals.starts, anchors, floor)[0])
    high = len(terminals) if upper is None else int(_first_not_before(
        terminals, terminals.starts, anchors, np.array([upper_index], np.int64))[0])
    where = f"pass {p}, layer L{layer_id}"
    window = f"[{anchor.ts_text}, {upper.ts_text if upper else 'end of trace'})"
    if high == low:
        raise TraceError(
            f"no terminal kernel (--end-anchor-regex) in the window of {where}: {window} µs"
        )
    if high - low > 1:
        raise TraceError(
            f"{high - low} terminal kernels in the window of {where}: {window} µs; "
            "the terminal must run exactly once per layer"
        )
    terminal = terminals[low]
    raise TraceError(
        f"the terminal kernel of {where} (ts {terminal.ts_text}, dur {terminal.dur_text}) "
        f"ends after the next anchor at ts {upper.ts_text}"
    )
