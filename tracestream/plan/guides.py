"""Layer guides: which anchor matches label which layer, and where each guide ends.

Pure functions over the kernel matches the index pass found. The tool never guesses: the
user gives the offset of the verified first layer, the layer count, the stride and the
extras per pass; anything that does not fit is refused. Guides are kept as columns
(`GuideTable`), a block at a time, never one object per guide."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tracestream.errors import TraceError
from tracestream.index.matches import MatchTable, MatchView
from tracestream.plan.specs import (
    ANCHOR_POINT_ONLY,
    NEXT_LAYER_ANCHOR,
    TERMINAL_KERNEL_END,
    LayerSpec,
    anchor_index,
    complete_passes,
    required_matches,
)

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
    first: int = 0  # the guides written: first … stop - 1 (a window writes some)
    stop: int | None = None

    @property
    def count(self) -> int:
        """The guides of the selection (a window writes `len(self)` of them)."""
        return self.spec.passes * self.spec.num_layers

    def __len__(self) -> int:
        return (self.count if self.stop is None else self.stop) - self.first

    def anchor_start(self, guide: int) -> tuple[int, bytes]:
        """(floor ns, exact text) of the start of guide `guide` (of the selection)."""
        _, _, index = _guide_positions(self.spec, guide, guide + 1)
        rows = self.anchors.order[index]
        packed = self.anchors.table.take(rows)
        floor, _ = self.anchors.table.exact_times(rows, rows=packed)
        return int(floor[0]), self.anchors.table.start_texts(rows, packed)[0]

    def pass_start(self, p: int) -> int | None:
        """The floor ns of pass `p`'s L0 anchor, labelled or not, where the trace holds that
        pass whole (None: it does not, the labelled passes run to the end of the trace)."""
        if p >= complete_passes(self.spec, len(self.anchors)):
            return None
        index = anchor_index(self.spec, p, 0)
        rows = self.anchors.order[np.array([index])]
        floor, _ = self.anchors.table.exact_times(rows, rows=self.anchors.table.take(rows))
        return int(floor[0])

    def blocks(self, size: int = GUIDE_BLOCK) -> Iterator[GuideBlock]:
        spec, view = self.spec, self.anchors
        table = view.table
        stop = self.first + len(self)
        for first in range(self.first, stop, size):
            p, layer, index = _guide_positions(spec, first, min(first + size, stop))
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
