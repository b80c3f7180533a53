"""Perfetto's nesting on one output track: slices that start together nest longest first,
and every synthetic lane and the guide track must import at depth zero."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class NestState:
    """Where `nesting_in_block` left off: the last record's track and start, the latest end
    of the slices that started before that start on the track (or the track's first start),
    and the latest end of those that start there."""

    track: int | None = None
    before: int = 0
    together: int = 0
    together_end: int = 0


def nesting_in_block(block: np.ndarray, state: NestState) -> list[tuple[int, int, int | None]]:
    """(track, start, before) of each slice in `block` (records in (track, start) order,
    following those `state` saw) that Perfetto nests: `before` the end of an earlier slice
    it starts before, or None for a slice starting with others, one of them longer than
    zero (at or before it in the block's order). Updates `state` for the next block.

    The per-slice rule in columns: a slice starting a group (its start differs from the
    previous record's) nests when its start is before the latest end of the track's
    earlier groups (or the track's first start); any other one when some slice of its
    group, up to it, ends after the start.
    """
    track, start, end = block["track"], block["start"], block["end"]
    n = len(track)
    if n == 0:
        return []
    new_track = np.empty(n, bool)
    new_track[0] = int(track[0]) != state.track
    np.not_equal(track[1:], track[:-1], out=new_track[1:])
    new_group = new_track.copy()
    new_group[0] |= int(start[0]) != state.together
    new_group[1:] |= start[1:] != start[:-1]
    continues = not new_group[0]  # the first record joins the group `state` ends in
    # slices starting together: one of the group up to this slice ends after its start
    longer = end > start
    if continues:
        longer[0] |= state.together_end > int(start[0])
    seen = np.cumsum(longer)
    groups = np.flatnonzero(new_group)
    group_of = np.cumsum(new_group) - 1 + (1 if continues else 0)
    group_starts = np.concatenate(([0], groups)) if continues else groups
    seen_before = (seen - longer)[group_starts]
    together = ~new_group & (seen - seen_before[group_of] > 0)
    # the latest end of each group, then per track the latest end of its earlier groups
    group_end = np.maximum.reduceat(end, group_starts)
    if continues:
        group_end[0] = max(int(group_end[0]), state.together_end)
    group_track = track[group_starts]
    group_first = start[group_starts]
    before = np.empty(len(group_starts), np.int64)
    track_bounds = np.flatnonzero(np.concatenate(([True], group_track[1:] != group_track[:-1],
                                                  [True])))
    for lo, hi in zip(track_bounds[:-1].tolist(), track_bounds[1:].tolist()):
        if lo == 0 and not new_track[0]:  # the track `state` was on goes on
            base = state.before if continues else max(state.before, state.together_end)
        else:
            base = int(group_first[lo])
        before[lo] = base
        if hi - lo > 1:
            np.maximum.accumulate(np.maximum(group_end[lo:hi - 1], base), out=before[lo + 1:hi])
    overlaps = new_group & (start < before[group_of])
    state.track, state.together = int(track[-1]), int(start[-1])
    state.before, state.together_end = int(before[-1]), int(group_end[-1])
    found = []
    rows = np.flatnonzero(overlaps | together)
    for t, s, b, o in zip(track[rows].tolist(), start[rows].tolist(),
                          before[group_of[rows]].tolist(), overlaps[rows].tolist()):
        found.append((t, s, b if o else None))
    return found
