"""The per-chunk columns the output checks read: kinds, tracks, names, numbered once."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tracestream import _native
from tracestream.model import ACTIVITY_KINDS, CategoryKinds


class Kept:
    """Record batches as a chunk's checks made them (a RecordStore's `append`)."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.batches: list[np.ndarray] = []

    def append(self, batch: np.ndarray) -> None:
        self.batches.append(batch)

    def joined(self) -> list[np.ndarray]:
        """The batches as one, in order (none if there are none)."""
        if len(self.batches) > 1:
            self.batches = [np.concatenate(self.batches)]
        return self.batches


class GuidesSeen:
    """A chunk's guides as `GuideOrder` would get them, in order: their start and end
    (ns) and names, handed to `GuideOrder.observe_many` as columns."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.names: list = []

    def observe(self, start: int, end: int, name: Any) -> None:
        self.starts.append(start)
        self.ends.append(end)
        self.names.append(name)

    def observe_many(self, starts: np.ndarray, ends: np.ndarray, names: list) -> None:
        self.starts.extend(starts.tolist())
        self.ends.extend(ends.tolist())
        self.names.extend(names)

    def columns(self) -> tuple:
        try:
            return np.array(self.starts, np.int64), np.array(self.ends, np.int64), self.names
        except OverflowError:  # a value timebase read past int64: checked one at a time
            return self.starts, self.ends, self.names


class Interned:
    """Values (decoded JSON scalars) numbered in the order first met: equal values (as a
    dict's keys are equal) share a number."""

    def __init__(self):
        self._numbers: dict = {}
        self._values: list = []

    @property
    def table(self) -> tuple[dict, list]:
        """(value -> number, values by number), for `_native.check_columns` to extend in
        place."""
        return self._numbers, self._values

    def __len__(self) -> int:
        return len(self._values)

    def number(self, value) -> int | None:
        return self._numbers.get(value)

    def value(self, number: int):
        return self._values[number]


class TrackCodes:
    """Tracks (pid, tid) as one int64 each: the pid's number in the high half, the tid's
    in the low one (`Interned`), so a chunk's tracks are compared, grouped and counted
    in numpy, each event's pid and tid hashed once."""

    def __init__(self):
        self.pids, self.tids = Interned(), Interned()

    def key(self, code: int) -> tuple:
        return self.pids.value(code >> 32), self.tids.value(code & 0xFFFFFFFF)

    def keys(self, codes: np.ndarray) -> list[tuple]:
        """`key` of each of `codes`."""
        return list(zip(map(self.pids.value, (codes >> 32).tolist()),
                        map(self.tids.value, (codes & 0xFFFFFFFF).tolist())))

    def known(self, keys: Iterable[tuple]) -> np.ndarray:
        """The codes of those `keys` whose pid and tid were both met."""
        codes = []
        for pid, tid in keys:
            p, t = self.pids.number(pid), self.tids.number(tid)
            if p is not None and t is not None:
                codes.append((p << 32) | t)
        return np.array(codes, np.int64)


IS_ACTIVITY = np.zeros(256, bool)  # by kind (as uint8)
IS_ACTIVITY[list(ACTIVITY_KINDS)] = True
_ACTIVITY_MASK = IS_ACTIVITY.tobytes()  # the same, as `_native.check_columns` takes it


def check_chunk_columns(events, kinds: CategoryKinds, codes: TrackCodes, devices: Interned
                   ) -> tuple[np.ndarray, ...]:
    """What the output-only checks read of a chunk's events (a list of `CheckEvent`, or
    their scan, see `scanned_chunk`), as columns:
    (phase: PH_X, PH_FLOW for s/t/f, else PH_OTHER; kind: kinds[cat] of X events, else
    0; track code; original track code: the provenance's for a moved flow or activity,
    else the track; moved: has provenance; device number of activities, else -1).

    One pass of `_native.check_columns`, which numbers the values in this order: every
    event's pid and tid, then the moved flows' and activities' provenance pid and tid,
    then the activities' devices."""
    columns = _native.check_columns(
        events, kinds, _ACTIVITY_MASK, codes.pids.table, codes.tids.table, devices.table)
    return tuple(np.frombuffer(column, dtype) for column, dtype in zip(
        columns, (np.int8, np.int8, np.int64, np.int64, bool, np.int64)))


def numbered_tracks(distinct: np.ndarray, numbered: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The track numbers of track `codes`, each one of the sorted `distinct`."""
    return numbered[np.searchsorted(distinct, codes)]
