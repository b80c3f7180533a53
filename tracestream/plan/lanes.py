"""Lane allocation and flow binding: one time-ordered sweep over packed records.

Greedy interval partitioning by start time is optimal: each slice takes the
lane whose previous slice ended earliest if that lane is free (end <= start),
else opens a new lane, so the lane count equals the peak overlap. Bounds are
the conservative nanosecond bounds from `timebase`, so lanes stay free of
overlap in the exact values and in Perfetto's imported ones.

The greedy choice runs a block of slices at a time in numpy, without a Python
step per slice. Every slice leaves a *token* (its end bound) when placed; a
slice consumes the smallest free token, ties going to the token placed first.
Consumed tokens therefore come in sorted order, so slice ``i`` of a block
consumes sorted token ``i - opened`` (``opened``: lanes opened before it in the
block) when that token is free by then, and opens a lane otherwise. The lanes
opened so far are a running maximum of the overlap, and each slice inherits the
lane of the slice whose token it took.

Flows on a relocated track bind as Perfetto binds them on their original track:
to the activity that starts exactly at the flow's time, else (`s`, `t`, and `f`
with `"bp": "e"`) to the one activity containing it. Each then moves to its
activity's lane, where it must bind to the same activity: a flow at the very end
of its activity where another activity on the lane starts (Perfetto binds it to
that one), and an `f` without `"bp": "e"` anywhere but at an activity's start (it
binds to the next slice of its track, which the lane changes) are refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from tracestream.index.facts import FLOW, NEXT_FLOW
from tracestream.index.records import take_rows
from tracestream.model import GPU_SCOPE

FLOW_KIND = FLOW  # the sweep kind of flow events
NEXT_FLOW_KIND = NEXT_FLOW  # an `f` without "bp": "e"
SCOPE_KIND = GPU_SCOPE  # scopes get lanes but never bind flows
LANE_CAP = 62  # lanes beyond this share a code; more than 10 lanes is refused anyway

_EMPTY = np.zeros(0, np.int64)


def member_table(members: Iterable[int]) -> np.ndarray:
    """A lookup table for `is_member`: entry v + 1 is True for each member v (>= -1), and
    the last entry, False, stands for every value above the largest member."""
    ids = np.fromiter(members, np.int64)
    table = np.zeros((int(ids.max()) + 3) if len(ids) else 1, bool)
    table[ids + 1] = True
    return table


def is_member(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """np.isin(values, members) for ids >= -1 (kinds, groups with -1 for none, tracks),
    by indexing `member_table(members)`: the sweep asks it of every record, block by
    block, and a lookup costs a fraction of isin's sort."""
    return table[np.minimum(values.astype(np.int64) + 1, len(table) - 1)]


_FLOW_TABLE = member_table((FLOW_KIND, NEXT_FLOW_KIND))


@dataclass
class GroupLanes:
    """Allocator state of one group (a GPU device, or one pid's scopes).

    Between blocks, each lane keeps one free-from token: its last slice's end
    bound and that slice's place in the group's order (the tie-break).
    """

    lanes: int = 0
    peak_at_ns: int | None = None  # time at which the last (highest) lane opened
    count: int = 0
    token_end: np.ndarray = field(default_factory=lambda: _EMPTY)
    token_seq: np.ndarray = field(default_factory=lambda: _EMPTY)
    token_lane: np.ndarray = field(default_factory=lambda: _EMPTY)

    def place_block(self, lo: np.ndarray, hi: np.ndarray,
                    start: np.ndarray | None = None) -> np.ndarray:
        """Lanes for slices in start order with bounds [lo, hi] (int64 arrays).

        `start` (exact) is what a peak reports; it defaults to `lo`.
        """
        n = len(lo)
        if not n:
            return _EMPTY
        lo = np.asarray(lo, np.int64)
        hi = occupied_end(lo, np.asarray(hi, np.int64))
        carried = self.lanes
        ends = np.concatenate([self.token_end, hi])
        seqs = np.concatenate([self.token_seq, np.arange(self.count, self.count + n)])
        order = np.lexsort((seqs, ends))
        position = np.arange(n)
        # free tokens when slice i starts: those ended by lo[i] (every slice occupies at
        # least its first nanosecond, so none of them is placed at or after i)
        free = np.searchsorted(ends[order], lo, "right")
        opened_after = np.maximum.accumulate(np.maximum(position - free + 1, 0))
        opened_before = np.concatenate([[0], opened_after[:-1]])
        opens = opened_after > opened_before

        lane = np.empty(n, np.int64)
        lane[opens] = carried + opened_before[opens]
        takes = np.flatnonzero(~opens)
        token = order[takes - opened_before[takes]]
        from_carried = token < carried
        lane[takes[from_carried]] = self.token_lane[token[from_carried]]
        parent = position.copy()
        parent[takes[~from_carried]] = token[~from_carried] - carried
        lane = lane[_roots(parent)]

        consumed = n - int(opened_after[-1])
        left = order[consumed:]
        self.token_end = ends[left]
        self.token_seq = seqs[left]
        self.token_lane = np.concatenate([self.token_lane, lane])[left]
        if opens.any():
            last = int(np.flatnonzero(opens)[-1])
            self.peak_at_ns = int((lo if start is None else start)[last])
        self.lanes = carried + int(opened_after[-1])
        self.count += n
        return lane


@dataclass
class PeakOverlap:
    """What `GroupLanes` reports of a group (its lane count and the time its last lane
    opened) without choosing any lane: `inspect`'s peak overlaps.

    Greedy allocation opens a lane exactly where the overlap of the slices seen so far
    reaches a new maximum, so counting is enough: a slice's overlap is itself plus the
    earlier slices whose occupied end lies past its start. Ends at or before a block's
    last start cannot overlap any later slice; only the others are carried (as many as
    slices alive at that time), so a block costs one sort and one search, not the
    allocator's lexsort and lane bookkeeping. Slices that start together may come in any
    order: the last of them reaches the same overlap at the same start whichever it is.
    """

    lanes: int = 0
    peak_at_ns: int | None = None  # start of the slice that raised the overlap to `lanes`
    open_ends: np.ndarray = field(default_factory=lambda: _EMPTY)  # sorted

    def add_block(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Count slices in start order with bounds [lo, hi] (int64 arrays).

        Returns each slice's overlap at its start and the sorted occupied ends it was
        counted against (the carried slices' and the block's), for a caller that draws
        the overlap over time, not only its peak (`inspect`'s occupancy strip).
        """
        n = len(lo)
        if not n:
            return _EMPTY, self.open_ends
        lo = np.asarray(lo, np.int64)
        ends = np.concatenate([self.open_ends, occupied_end(lo, np.asarray(hi, np.int64))])
        ends.sort()
        # slice i: the carried ends, the block's ends and itself, less the ends by its start
        # (a block slice after i ends past lo[i]: it is among those, as it should not count)
        overlap = np.arange(len(self.open_ends) + 1, len(self.open_ends) + 1 + n)
        overlap -= np.searchsorted(ends, lo, "right")
        k = int(np.argmax(overlap))  # the first slice to reach the block's peak
        if int(overlap[k]) > self.lanes:
            self.lanes = int(overlap[k])
            self.peak_at_ns = int(lo[k])
        self.open_ends = ends[np.searchsorted(ends, lo[-1], "right"):]
        return overlap, ends


def occupied_end(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """End of the nanoseconds [lo, end) a slice occupies on a lane: at least its first one.

    Perfetto orders slices that start together longest first and closes a slice only
    when its end <= the next start, so a zero-length slice sharing its start with a
    longer one on a track nests under it. Occupying its start nanosecond keeps every
    other slice from starting there.
    """
    return np.maximum(hi, lo + 1)


def _roots(parent: np.ndarray) -> np.ndarray:
    """Follow parent links (parent[i] <= i) to their roots by pointer jumping."""
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return parent
        parent = grand


@dataclass
class FlowProblem:
    cand: int
    ts_ns: int
    reason: str


@dataclass
class _Activities:
    """Activities on flow tracks that a later flow may still bind to (end >= its time)."""

    track: np.ndarray = field(default_factory=lambda: _EMPTY)
    start: np.ndarray = field(default_factory=lambda: _EMPTY)
    end: np.ndarray = field(default_factory=lambda: _EMPTY)
    code: np.ndarray = field(default_factory=lambda: _EMPTY)

    def extended(self, track, start, end, code) -> _Activities:
        return _Activities(*(np.concatenate([a, b]) for a, b in zip(
            (self.track, self.start, self.end, self.code), (track, start, end, code))))

    def ending_from(self, t: int) -> _Activities:
        keep = self.end >= t
        return _Activities(self.track[keep], self.start[keep], self.end[keep], self.code[keep])


class Sweep:
    """Walks sorted sweep blocks once: allocates lanes and binds flows.

    For every slice of a compacted group and every bound flow on one of the
    `flow_tracks` given to `run`, `lane_code(group, lane)` is written to
    `actions[cand]`; other flows are skipped.
    """

    def __init__(self, compacted_groups: set[int]):
        self.compacted = compacted_groups
        self.groups: dict[int, GroupLanes] = {}
        self.flow_problems: list[FlowProblem] = []
        self._open = _Activities()
        self._at_end: list[tuple[int, int, int]] = []  # (cand, ts, lane code): see at_ends

    def run(self, blocks: Iterable[np.ndarray], actions: np.ndarray, base_code: dict[int, int],
            flow_tracks: set[int]) -> None:
        """Lane of each slice and bound flow into `actions[cand]` as base_code[group] + lane.

        `flow_tracks`: relocated tracks that have flows (only those need binding state).
        """
        in_compacted = member_table(self.compacted)
        on_flow_track = member_table(flow_tracks)
        for block in blocks:
            is_flow = is_member(_FLOW_TABLE, block["kind"])
            keep = (~is_flow & is_member(in_compacted, block["group"])) | (
                is_flow & is_member(on_flow_track, block["track"]))
            if not keep.any():
                continue
            block = take_rows(block, keep)
            is_flow = is_flow[keep]
            codes = np.zeros(len(block), np.int64)
            group = block["group"]
            for g in np.unique(group[~is_flow]).tolist():
                rows = np.flatnonzero((group == g) & ~is_flow)
                state = self.groups.get(g)
                if state is None:
                    state = self.groups[g] = GroupLanes()
                lanes = state.place_block(block["key"][rows], block["hi"][rows],
                                          block["start"][rows])
                codes[rows] = base_code[g] + np.minimum(lanes, LANE_CAP)
            binds = ~is_flow & (block["kind"] != SCOPE_KIND) & is_member(on_flow_track,
                                                                         block["track"])
            self._open = self._open.extended(
                block["track"][binds].astype(np.int64), block["start"][binds],
                block["end"][binds], codes[binds])
            flows = np.flatnonzero(is_flow)
            if len(flows):
                codes[flows] = self._bind(block["track"][flows].astype(np.int64),
                                          block["key"][flows], block["cand"][flows],
                                          block["kind"][flows] == NEXT_FLOW_KIND)
            self._open = self._open.ending_from(int(block["key"][-1]))
            bound = codes > 0
            actions[block["cand"][bound]] = codes[bound]

    def _bind(self, track: np.ndarray, t: np.ndarray, cands: np.ndarray,
              next_binding: np.ndarray) -> np.ndarray:
        """Lane code of the activity each flow binds to; 0 (a problem kept) if none."""
        act = self._open
        # one sortable key per (track, time): times replaced by their rank
        ranks = np.unique(np.concatenate([act.start, act.end, t]), return_inverse=True)[1]
        m = len(act.start)
        start_key = (act.track << 32) | ranks[:m]
        end_key = np.sort((act.track << 32) | ranks[m:2 * m])
        by_start = np.argsort(start_key, kind="stable")
        start_key = start_key[by_start]
        flow_key = (track << 32) | ranks[2 * m:]
        track_key = track << 32
        first = np.searchsorted(start_key, flow_key, "left")
        after = np.searchsorted(start_key, flow_key, "right")
        exact = after - first
        started = after - np.searchsorted(start_key, track_key, "left")
        ended = np.searchsorted(end_key, flow_key, "left") - np.searchsorted(
            end_key, track_key, "left")
        inside = started - ended  # an activity that ended before t also started before it
        codes = np.zeros(len(t), np.int64)
        one = exact == 1
        codes[one] = act.code[by_start[first[one]]]
        for k in np.flatnonzero(exact != 1).tolist():
            reason = _unbound(int(exact[k]), int(inside[k]), bool(next_binding[k]))
            if reason is None:
                (hit,) = np.flatnonzero((act.track == track[k]) & (act.start <= t[k])
                                        & (act.end >= t[k]))
                codes[k] = act.code[hit]
                if act.end[hit] == t[k]:
                    self._at_end.append((int(cands[k]), int(t[k]), int(act.code[hit])))
                continue
            self.flow_problems.append(FlowProblem(int(cands[k]), int(t[k]), reason))
        return codes

    def at_ends(self, blocks: Iterable[np.ndarray], actions: np.ndarray) -> None:
        """Keep the flows bound to their activity only by its end unless, on its lane,
        another activity starts exactly there: Perfetto would bind the flow to that one.

        Such flows are rare, so the sweep's blocks are read again only when there are
        some, and each is looked for with a few whole-block comparisons.
        """
        if not self._at_end:
            return
        pending = np.array(self._at_end, np.int64).reshape(-1, 3)
        taken = np.zeros(len(pending), bool)
        for block in blocks:
            activity = ~is_member(_FLOW_TABLE, block["kind"]) & (block["kind"] != SCOPE_KIND)
            starts = block["start"][activity]
            lanes = actions[block["cand"][activity]].astype(np.int64)
            for k in np.flatnonzero(~taken).tolist():
                taken[k] = bool(np.any((starts == pending[k, 1]) & (lanes == pending[k, 2])))
        for (cand, t, _), lost in zip(pending.tolist(), taken.tolist()):
            if lost:
                actions[cand] = 0
                self.flow_problems.append(FlowProblem(cand, t, (
                    "lies exactly at the end of its activity, where another activity on its "
                    "lane starts (Perfetto would bind it to that one)")))


def _unbound(exact: int, inside: int, next_binding: bool) -> str | None:
    """Why a flow starting at no activity or at several binds to none; None when exactly
    one activity contains it (it binds to that one)."""
    if exact > 1:
        return f"starts exactly at {exact} activities"
    if next_binding:
        return ('is an `f` without "bp": "e" that does not start exactly at a GPU activity '
                "(Perfetto binds it to the next slice of its track, which a lane changes)")
    if inside != 1:
        return "binds to no GPU activity" if not inside else f"lies inside {inside} activities"
    return None
