"""Lane allocation and flow binding: one time-ordered sweep over packed records.

Greedy interval partitioning by start time is optimal: each slice takes the
lane whose previous slice ended earliest if that lane is free (end <= start),
else opens a new lane, so the lane count equals the peak overlap. Bounds are
the conservative nanosecond bounds from `timebase`, so lanes stay free of
overlap in the exact values and in Perfetto's imported ones.

Flows on a relocated track bind, during the same sweep, to the activity on
their original track that starts exactly at the flow's time, else to the one
activity containing it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

FLOW_KIND = 8  # same code as index.FLOW; kept here so this module stays standalone
SCOPE_KIND = 5  # events.GPU_SCOPE: scopes get lanes but never bind flows


@dataclass
class GroupLanes:
    """Allocator state of one group (a GPU device, or one pid's scopes)."""

    heap: list = field(default_factory=list)  # (end bound, lane)
    lanes: int = 0
    peak_at_ns: int | None = None  # time at which the last (highest) lane opened
    count: int = 0

    def place(self, lo: int, hi: int, start: int | None = None) -> int:
        """Lane for a slice with bounds [lo, hi]; `start` (exact) is what a peak reports."""
        heap = self.heap
        self.count += 1
        if heap and heap[0][0] <= lo:
            lane = heap[0][1]
            heapq.heapreplace(heap, (hi, lane))
            return lane
        lane = self.lanes
        self.lanes += 1
        self.peak_at_ns = lo if start is None else start
        heapq.heappush(heap, (hi, lane))
        return lane


def allocate(lo: Iterable[int], hi: Iterable[int]) -> tuple[list[int], int, int | None]:
    """Lanes for slices given in start order: (lane per slice, lane count, peak time)."""
    group = GroupLanes()
    lanes = [group.place(s, e) for s, e in zip(lo, hi)]
    return lanes, group.lanes, group.peak_at_ns


def peak_overlap(lo: np.ndarray, hi: np.ndarray) -> int:
    """Maximum number of half-open [lo, hi) intervals alive at one time (zero-length count)."""
    if not len(lo):
        return 0
    times = np.concatenate([lo, hi])
    delta = np.concatenate([np.ones(len(lo), np.int64), -np.ones(len(hi), np.int64)])
    # ends sort before starts at equal times (touching slices do not overlap),
    # except zero-length slices, which must count while they exist
    zero = np.concatenate([hi == lo, hi == lo])
    order = np.lexsort((np.where(zero, -delta, delta), times))
    return int(np.cumsum(delta[order]).max())


@dataclass
class FlowProblem:
    cand: int
    ts_ns: int
    reason: str


@dataclass
class SweepResult:
    """Lane per slice candidate, bound lane per flow candidate, per-group outcome."""

    groups: dict[int, GroupLanes]
    slice_lane: dict[int, tuple[int, int]]  # filled only when collect=True (tests)
    flow_problems: list[FlowProblem]


class Sweep:
    """Walks sorted sweep blocks once: allocates lanes and binds flows.

    `relocated` says which tracks move; flows elsewhere are skipped. Results go
    into `actions` (one uint16 per span candidate): lane codes from `lane_code`.
    """

    def __init__(self, relocated_tracks: set[int], compacted_groups: set[int]):
        self.relocated = relocated_tracks
        self.compacted = compacted_groups
        self.groups: dict[int, GroupLanes] = {}
        self.open_by_track: dict[int, list] = {}  # track -> [start, end, group, lane]
        self.flow_problems: list[FlowProblem] = []
        self.bindings: list[tuple[int, int, int]] = []  # (flow cand, group, lane)

    def run(self, blocks: Iterable[np.ndarray], on_slice, on_flow) -> None:
        groups = self.groups
        compacted = self.compacted
        relocated = self.relocated
        open_by_track = self.open_by_track
        for block in blocks:
            keys = block["key"].tolist()
            his = block["hi"].tolist()
            starts = block["start"].tolist()
            ends = block["end"].tolist()
            tracks = block["track"].tolist()
            grps = block["group"].tolist()
            kinds = block["kind"].tolist()
            cands = block["cand"].tolist()
            for i, kind in enumerate(kinds):
                track = tracks[i]
                if kind != FLOW_KIND:
                    group = grps[i]
                    if group not in compacted:
                        continue
                    state = groups.get(group)
                    if state is None:
                        state = groups[group] = GroupLanes()
                    lane = state.place(keys[i], his[i], starts[i])
                    on_slice(cands[i], group, lane)
                    if track in relocated and kind != SCOPE_KIND:
                        entries = open_by_track.get(track)
                        if entries is None:
                            entries = open_by_track[track] = []
                        elif len(entries) > 16:
                            now = keys[i]
                            entries[:] = [e for e in entries if e[1] >= now]
                        entries.append((starts[i], ends[i], group, lane))
                elif track in relocated:
                    self._bind(cands[i], track, keys[i], on_flow)

    def _bind(self, cand: int, track: int, t: int, on_flow) -> None:
        entries = self.open_by_track.get(track)
        if entries:
            entries[:] = [e for e in entries if e[1] >= t]
        if not entries:
            self.flow_problems.append(FlowProblem(cand, t, "binds to no GPU activity"))
            return
        exact = [e for e in entries if e[0] == t]
        if len(exact) > 1:
            self.flow_problems.append(
                FlowProblem(cand, t, f"starts exactly at {len(exact)} activities")
            )
            return
        if not exact:
            exact = [e for e in entries if e[0] <= t <= e[1]]
            if len(exact) != 1:
                reason = (
                    "binds to no GPU activity" if not exact
                    else f"lies inside {len(exact)} activities"
                )
                self.flow_problems.append(FlowProblem(cand, t, reason))
                return
        _, _, group, lane = exact[0]
        on_flow(cand, group, lane)
