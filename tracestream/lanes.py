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

from tracestream.spill import take_rows

FLOW_KIND = 8  # same code as index.FLOW; kept here so this module stays standalone
SCOPE_KIND = 5  # events.GPU_SCOPE: scopes get lanes but never bind flows
LANE_CAP = 62  # lanes beyond this share a code; more than 10 lanes is refused anyway


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


class Sweep:
    """Walks sorted sweep blocks once: allocates lanes and binds flows.

    `relocated` says which tracks move; flows elsewhere are skipped. For every
    slice of a compacted group and every bound flow, `lane_code(group, lane)` is
    written to `actions[cand]`.
    """

    def __init__(self, relocated_tracks: set[int], compacted_groups: set[int]):
        self.relocated = relocated_tracks
        self.compacted = compacted_groups
        self.groups: dict[int, GroupLanes] = {}
        self.open_by_track: dict[int, list] = {}  # track -> [(start, end, group, lane)]
        self.flow_problems: list[FlowProblem] = []

    def run(self, blocks: Iterable[np.ndarray], actions: np.ndarray, base_code: dict[int, int],
            flow_tracks: set[int]) -> None:
        """Lane of each slice and bound flow into `actions[cand]` as base_code[group] + lane.

        `flow_tracks`: relocated tracks that have flows (only those need binding state).
        """
        self._base_code = base_code
        groups = self.groups
        compacted = np.array(sorted(self.compacted), np.int64)
        flow_track_ids = np.array(sorted(flow_tracks), np.int64)
        open_by_track = self.open_by_track
        for block in blocks:
            is_flow = block["kind"] == FLOW_KIND
            keep = (~is_flow & np.isin(block["group"], compacted)) | (
                is_flow & np.isin(block["track"], flow_track_ids))
            if not keep.any():
                continue
            block = take_rows(block, keep)
            cands = block["cand"]
            codes = []
            reasons = {}  # position in the block -> why that flow does not bind
            for key, hi, start, end, track, group, kind in zip(
                    block["key"].tolist(), block["hi"].tolist(), block["start"].tolist(),
                    block["end"].tolist(), block["track"].tolist(), block["group"].tolist(),
                    block["kind"].tolist()):
                if kind == FLOW_KIND:
                    code = self._bind(track, key)
                    if code is None:
                        reasons[len(codes)] = self._reason
                    codes.append(code)
                    continue
                state = groups.get(group)
                if state is None:
                    state = groups[group] = GroupLanes()
                heap = state.heap
                state.count += 1
                if heap and heap[0][0] <= key:
                    lane = heap[0][1]
                    heapq.heapreplace(heap, (hi, lane))
                else:
                    lane = state.lanes
                    state.lanes += 1
                    state.peak_at_ns = start
                    heapq.heappush(heap, (hi, lane))
                codes.append(base_code[group] + (lane if lane < LANE_CAP else LANE_CAP))
                if track in flow_tracks and kind != SCOPE_KIND:
                    entries = open_by_track.get(track)
                    if entries is None:
                        entries = open_by_track[track] = []
                    elif len(entries) > 16:
                        entries[:] = [e for e in entries if e[1] >= key]
                    entries.append((start, end, group, lane))
            if reasons:  # flows that bind to nothing or to several activities: rare
                for k, reason in reasons.items():
                    self.flow_problems.append(
                        FlowProblem(int(cands[k]), int(block["key"][k]), reason))
                bound = np.array([code is not None for code in codes])
                codes = [code for code in codes if code is not None]
                cands = cands[bound]
            actions[cands] = codes

    def _bind(self, track: int, t: int):
        """The lane code of the activity a flow at `t` binds to, or None (reason kept)."""
        entries = self.open_by_track.get(track)
        if entries:
            entries[:] = [e for e in entries if e[1] >= t]
        if not entries:
            self._reason = "binds to no GPU activity"
            return None
        exact = [e for e in entries if e[0] == t]
        if len(exact) > 1:
            self._reason = f"starts exactly at {len(exact)} activities"
            return None
        if not exact:
            exact = [e for e in entries if e[0] <= t <= e[1]]
            if len(exact) != 1:
                self._reason = ("binds to no GPU activity" if not exact
                                else f"lies inside {len(exact)} activities")
                return None
        _, _, group, lane = exact[0]
        return self._base_code[group] + min(lane, LANE_CAP)
