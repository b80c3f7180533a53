"""Perfetto's flow binding, modelled independently: which slice each flow event binds to."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

import numpy as np

BIND_ACTIVITY, BIND_FLOW, BIND_NEXT_FLOW = range(3)
BOUND_NONE, BOUND_MANY = -1, -2  # a flow bound to no activity, or to several
BIND_ROW_DTYPE = np.dtype([("source", "<i8"), ("lane", "<i8"), ("key", "<i8"), ("end", "<i8"),
                            ("mode", "i1"), ("ordinal", "<i8")])
BIND_DTYPE = np.dtype([("track", "<i8"), ("key", "<i8"), ("end", "<i8"), ("mode", "i1"),
                        ("ordinal", "<i8")])
"""An activity (key: its start, ns) or a flow (key: its ts, ns) on a track."""
BOUND_DTYPE = np.dtype([("flow", "<i8"), ("bound", "<i8")])


def bound_rows(blocks) -> Iterator[tuple[int, int]]:
    for block in blocks:
        yield from zip(block["flow"].tolist(), block["bound"].tolist())


def perfetto_bindings(blocks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """(flow ordinal, ordinal of the activity it binds to, or BOUND_NONE/BOUND_MANY) for every
    flow of `BIND_DTYPE` records in (track, key) order, as Perfetto binds v1 flows on a track.

    `s`, `t` and `f` with `"bp": "e"` bind to the slice that starts exactly at them,
    else to the one that encloses them, its end included (a slice ending there has not
    been closed yet). An `f` without `"bp": "e"` binds to the next slice that begins
    at or after it. Records come in start order per track; those of one (track, start)
    are taken together, activities before flows (the key is the start itself, so that
    every timestamp the index accepts fits). The records are taken a block at a time,
    each cut after its last whole (track, key): in columns where a track's activities
    follow one another without overlap (`_bind_in_columns`), else a record at a time
    (`_TrackBindings`), both sharing one state.
    """
    out: list[tuple[int, int]] = []
    state = _TrackBindings(out)
    held = None
    for block in blocks:
        if held is not None and len(held):
            block = np.concatenate((held, block))
        if not len(block):
            continue
        track, key = block["track"], block["key"]
        differ = np.flatnonzero((track != track[-1]) | (key != key[-1]))
        cut = int(differ[-1]) + 1 if len(differ) else 0
        held, block = block[cut:], block[:cut]
        yield from _bind_block(block, state)
        if len(out) > 65536:
            yield np.array(out, BOUND_DTYPE)
            out.clear()
    if held is not None:
        yield from _bind_block(held, state)
    state.end_track()
    if out:
        yield np.array(out, BOUND_DTYPE)


def _bind_block(block: np.ndarray, state: _TrackBindings) -> list[np.ndarray]:
    """The bindings of a block of whole (track, key) groups, in columns when they can be."""
    if not len(block):
        return []
    bound = _bind_in_columns(block, state)
    if bound is not None:
        return [bound]
    track, key = block["track"].tolist(), block["key"].tolist()
    end, mode, ordinal = block["end"].tolist(), block["mode"].tolist(), block["ordinal"].tolist()
    lo = 0
    for hi in range(1, len(track) + 1):
        if hi == len(track) or track[hi] != track[lo] or key[hi] != key[lo]:
            state.take((track[lo], key[lo]),
                       [(end[i], ordinal[i]) for i in range(lo, hi) if mode[i] == BIND_ACTIVITY],
                       [(ordinal[i], mode[i]) for i in range(lo, hi) if mode[i] != BIND_ACTIVITY])
            lo = hi
    return []


def _bind_in_columns(block: np.ndarray, state: _TrackBindings) -> np.ndarray | None:
    """`_TrackBindings.take` of every (track, key) group of `block` at once, when each
    track's activities there start one after another, none before its predecessor ends
    (the carried open one included) nor ends before it starts: then a flow binds to the
    activity starting at it, else to the last one started if that encloses it (an `f`
    without `"bp": "e"` to the next one on its track). None (and `state` untouched)
    otherwise. Returns the (flow, bound) rows; flows still waiting stay in `state`."""
    track, key, end = block["track"], block["key"], block["end"]
    mode, ordinal = block["mode"], block["ordinal"]
    is_act = mode == BIND_ACTIVITY
    acts = np.flatnonzero(is_act)
    a_track, a_key, a_end, a_ord = track[acts], key[acts], end[acts], ordinal[acts]
    follows = a_track[1:] == a_track[:-1]
    if np.any(a_end < a_key) or np.any(follows & ((a_key[1:] <= a_key[:-1])
                                                 | (a_end[:-1] > a_key[1:]))):
        return None
    first, last = int(track[0]), int(track[-1])
    carried = None
    if first == state.track:
        still_open = [e for e in state.open if e[0] >= int(key[0])]  # the others have ended
        if len(still_open) > 1 or any(e[0] < e[1] for e in still_open):
            return None
        if still_open:
            carried = still_open[0]
            if len(acts) and int(a_track[0]) == first and carried[0] > int(a_key[0]):
                return None
        waiting, state.open = state.waiting, still_open
    else:
        state.end_track()
        waiting = []
    rows = []
    # flows waiting from the block before bind to the track's next activity
    if waiting:
        if len(acts) and int(a_track[0]) == first:
            rows.append((waiting, int(a_ord[0])))
            waiting = []
        elif last != first:
            rows.append((waiting, BOUND_NONE))
            waiting = []
    flows = np.flatnonzero(~is_act)
    f_track, f_key, f_mode = track[flows], key[flows], mode[flows]
    new_group = np.concatenate(((track[1:] != track[:-1]) | (key[1:] != key[:-1]), [True]))
    group_last = np.flatnonzero(new_group)
    group_of = np.cumsum(np.concatenate(([False], new_group[:-1])))
    latest = np.cumsum(is_act)[group_last[group_of[flows]]] - 1  # last activity at or before
    if len(acts):
        at = np.clip(latest, 0, None)
        found = (latest >= 0) & (a_track[at] == f_track)
        c_key, c_end, c_ord = a_key[at], a_end[at], a_ord[at]
    else:
        found = np.zeros(len(flows), bool)
        c_key = c_end = c_ord = np.zeros(len(flows), np.int64)
    if carried is not None:
        from_before = ~found & (f_track == first)
        carried_end, carried_key, carried_ord = carried
        c_key = np.where(from_before, carried_key, c_key)
        c_end = np.where(from_before, carried_end, c_end)
        c_ord = np.where(from_before, carried_ord, c_ord)
        found |= from_before
    exact = found & (c_key == f_key)
    encloses = found & (c_end >= f_key)
    bound = np.where(encloses, c_ord, BOUND_NONE)
    following = np.flatnonzero((f_mode == BIND_NEXT_FLOW) & ~exact)
    if len(following):
        after = latest[following] + 1
        has_next = after < len(acts)
        nxt = np.clip(after, 0, max(len(acts) - 1, 0))
        if len(acts):
            has_next &= a_track[nxt] == f_track[following]
        bound[following] = np.where(has_next, a_ord[nxt] if len(acts) else BOUND_NONE, BOUND_NONE)
        stays = following[~has_next & (f_track[following] == last)]
        waiting = waiting + ordinal[flows[stays]].tolist()
        keep = np.ones(len(flows), bool)
        keep[stays] = False
        flows, bound = flows[keep], bound[keep]
    state.track, state.waiting = last, waiting
    if len(acts) and int(a_track[-1]) == last:
        state.open = [(int(a_end[-1]), int(a_key[-1]), int(a_ord[-1]))]
    elif last != first:
        state.open = []
    result = np.empty(len(flows) + sum(len(w) for w, _ in rows), BOUND_DTYPE)
    result["flow"][:len(flows)], result["bound"][:len(flows)] = ordinal[flows], bound
    at = len(flows)
    for flows_waiting, to in rows:
        result["flow"][at:at + len(flows_waiting)] = flows_waiting
        result["bound"][at:at + len(flows_waiting)] = to
        at += len(flows_waiting)
    return result


class _TrackBindings:
    """The binding state of one track at a time, for `perfetto_bindings`."""

    def __init__(self, out: list):
        self.out = out
        self.track = None
        self.open: list = []  # (end, start, ordinal) of the track's activities not yet ended
        self.waiting: list[int] = []  # flows binding to the next activity to start

    def end_track(self) -> None:
        self.out.extend((flow, BOUND_NONE) for flow in self.waiting)
        self.open, self.waiting = [], []

    def take(self, at: tuple[int, int], activities: list, flows: list) -> None:
        """The activities starting at `at` (track, start ns), then the flows there."""
        track, t = at
        if track != self.track:
            self.end_track()
            self.track = track
        if activities and self.waiting:  # the next slice after them starts here
            bound = activities[0][1] if len(activities) == 1 else BOUND_MANY
            self.out.extend((flow, bound) for flow in self.waiting)
            self.waiting = []
        for end, ordinal in activities:
            heapq.heappush(self.open, (end, t, ordinal))
        if not flows:
            return
        while self.open and self.open[0][0] < t:  # ended before these flows (and later ones)
            heapq.heappop(self.open)
        exact = [e for e in self.open if e[1] == t]
        hits = exact or self.open  # every open activity started at or before the flows
        bound = hits[0][2] if len(hits) == 1 else BOUND_NONE if not hits else BOUND_MANY
        for ordinal, mode in flows:
            if mode == BIND_NEXT_FLOW and not exact:
                self.waiting.append(ordinal)
            else:
                self.out.append((ordinal, bound))
