"""Which events a time window holds: the membership rule of `--pass-window` and
`--time-window`, as pure functions over a chunk's decoded events.

The rule, the same for every window:

* metadata (`ph: M`) is in every window: process and thread names, sort order and
  device properties must be right in each;
* an event with no usable `ts` cannot be placed in time, so it is in every window too;
* a complete slice (`X`) is in when `[ts, ts + dur]` overlaps the window, any other event
  when its `ts` lies in it: windows are half open, `[start, end)`, so pieces that tile a
  trace hold each instant once and a slice that crosses a cut in each piece it overlaps;
* events that only mean something together are decided together (`LinkedRows`): a flow
  (`s`/`t`/`f` of one category and id) only whole, inside the window; an async slice
  (`b`/`e`/`n`, and the legacy `S`/`T`/`p`/`F`, of one category and id) and a `B`/`E` pair
  of one track when their whole span overlaps the window. Their decision needs the whole
  trace, so the index pass keeps a row per such event and the plan decides
  (plan.window).

Times are integer nanoseconds: a start's floor and an end's ceiling, so the comparisons
with a window's whole-nanosecond bounds are exact.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from operator import attrgetter

import numpy as np
import orjson

from tracestream import _native
from tracestream.index import timebase
from tracestream.index.decode import (
    PHASE_CODES,
    PHASE_COMPLETE,
    PHASE_FLOW,
    PHASE_METADATA,
    PHASE_OTHER,
)
from tracestream.index.numbers import time_value
from tracestream.model import CategoryKinds

FOREVER = int(np.iinfo(np.int64).max)
"""A window's end when it runs to the end of the trace."""

FREE, COMPLETE, METADATA, FLOW, ASYNC, BEGIN, END = range(7)
"""What an event's `ph` makes of it here: decided alone by its ts (FREE) or its span
(COMPLETE), in every window (METADATA), or with the events it is linked to."""
_PHASE = attrgetter("ph")
_PAIRED = frozenset("benSTpFBE")  # the phases classify counts as other that are linked
_KINDS = CategoryKinds()
_ROLE_OF = {"X": COMPLETE, "M": METADATA, **dict.fromkeys("stf", FLOW),
            **dict.fromkeys("benSTpF", ASYNC), "B": BEGIN, "E": END}
_KEY_BASE = {FLOW: 1 << 61, ASYNC: 2 << 61}
"""Flow and async keys are hashes above 2**61; a B/E row's key is its track (below 2**31)."""

LINKED_BUDGET = 2 << 20
"""Bytes of linked rows (and of their decisions, plan.window) held before a spill."""
LINKED_DTYPE = np.dtype([("ordinal", "<i8"), ("key", "<i8"), ("ts", "<i8"), ("up", "<i8"),
                         ("role", "i1"), ("timed", "?")])
"""A linked event as the index keeps it (`ordinal` chunk-local until the index merges it):
its ts's floor (`ts`) and ceiling (`up`) in ns."""


@dataclass(frozen=True)
class Window:
    """The half-open time range `[start_ns, end_ns)` a window or piece holds."""

    start_ns: int
    end_ns: int = FOREVER

    def points(self, ts: np.ndarray) -> np.ndarray:
        return (ts >= self.start_ns) & (ts < self.end_ns)

    def spans(self, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Whether each `[ts, end]` overlaps the window (a zero-length one as a point)."""
        overlaps = (ts < self.end_ns) & (end > self.start_ns)
        return np.where(end > ts, overlaps, self.points(ts))


@dataclass
class ChunkTimes:
    """A chunk's events as the rule reads them, a column each."""

    role: np.ndarray  # int8: FREE, COMPLETE, ... per event
    ts: np.ndarray  # int64 floor ns (0 where untimed)
    end: np.ndarray  # int64 ceiling ns of ts + dur for a slice, else of ts
    timed: np.ndarray  # bool: a usable ts

    def linked(self) -> np.ndarray:
        """Events decided with their group (plan.window): flow and async events, and timed
        B and E events (an untimed one cannot be paired: it is in every window alone)."""
        return (((self.role == FLOW) | (self.role == ASYNC))
                | (((self.role == BEGIN) | (self.role == END)) & self.timed))

    def always(self) -> np.ndarray:
        """Events in every window: metadata, and unlinked events with no usable ts."""
        return (self.role == METADATA) | (~self.timed & ~self.linked())

    def members(self, window: Window, kept_linked: np.ndarray) -> np.ndarray:
        """Which events `window` holds; `kept_linked`: chunk indices of the linked events
        the plan keeps (the rest of them are out)."""
        linked = self.linked()
        inside = self.always() | (self.timed & ~linked & window.spans(self.ts, self.end))
        inside[linked] = False
        inside[kept_linked] = True
        return inside


def chunk_times(events, columns: tuple | None = None) -> ChunkTimes:
    """The columns of a decoded chunk (see ChunkTimes). `columns`: what the index pass
    read of the chunk already (see `read_columns`), so that nothing is read twice."""
    codes, counts, ts, timed, dur, has_dur, inexact = (
        columns if columns is not None else read_columns(events))
    role = _roles(events, codes, counts)
    end = ts.copy()
    exact = {}
    for i in sorted(inexact):
        if timed[i]:
            exact[i] = timebase.parse_decimal(bytes(events[i].ts))
            end[i] = max(exact[i].ceil_ns(), ts[i])  # digits below 1 ns: the ceiling
    slices = np.flatnonzero((role == COMPLETE) & timed & has_dur)
    if len(slices):
        room = FOREVER - np.maximum(ts[slices], 0)
        end[slices] = np.where(dur[slices] < room, ts[slices] + dur[slices], FOREVER)
        for i in inexact & set(slices.tolist()):  # digits below 1 ns: the exact sum's ceiling
            start = exact.get(i) or timebase.parse_decimal(bytes(events[i].ts))
            total = start + timebase.parse_decimal(bytes(events[i].dur))
            end[i] = min(max(total.ceil_ns(), ts[i]), FOREVER)
    return ChunkTimes(role, ts, end, timed)


def read_columns(events) -> tuple:
    """(phase codes or None, phase counts, ts floor ns, ts usable, dur ns, dur usable,
    events whose ts or dur has digits below 1 ns): what chunk_times reads, as the index
    pass's observer reads it too (index.extract)."""
    try:
        codes, _, _, counts = _native.classify(events, PHASE_CODES, PHASE_OTHER, _KINDS)
        codes = np.frombuffer(codes, np.int8)
    except TypeError:  # an unhashable category or phase: roles one by one
        codes, counts = None, {}
    ts, ts_exact, timed = _times(events, "ts", True)
    dur, dur_exact, has_dur = _times(events, "dur", False)
    return codes, counts, ts, timed, dur, has_dur, set(ts_exact) | set(dur_exact)


def _roles(events, codes: np.ndarray | None, counts) -> np.ndarray:
    """Each event's role by its `ph`, from the C classifier's phase codes (which read the
    phases without making the events: a scanned chunk makes each on access); only events
    of other phases are looked at one by one, and only where the chunk has B/E or async
    phases. Without codes (an unhashable category or phase), one by one."""
    if codes is None:
        return np.array([_ROLE_OF.get(ph, FREE) if isinstance(ph, str) else FREE
                         for ph in map(_PHASE, events)], np.int8)
    role = np.full(len(codes), FREE, np.int8)
    role[codes == PHASE_COMPLETE] = COMPLETE
    role[codes == PHASE_METADATA] = METADATA
    role[codes == PHASE_FLOW] = FLOW
    if any(isinstance(ph, str) and ph in _PAIRED for ph in counts):
        other = np.flatnonzero(codes == PHASE_OTHER)
        role[other] = [_ROLE_OF.get(ph, FREE) if isinstance(ph, str) else FREE
                       for ph in map(_PHASE, map(events.__getitem__, other.tolist()))]
    return role


def _times(events, key: str, signed: bool):
    """(floor ns, {index: exact value} where it has digits below 1 ns, usable?) of `key`."""
    ns, shapes = _native.decimal_column(events, key, signed)
    ns = np.frombuffer(ns, np.int64).copy()
    shapes = np.frombuffer(shapes, np.int8)
    usable = (shapes == _native.SHAPE_INTEGER) | (shapes == _native.SHAPE_DECIMAL)
    inexact: dict[int, timebase.Decimal10] = {}
    odd = np.flatnonzero(shapes == _native.SHAPE_OTHER)
    for i in odd.tolist():
        value, problem = time_value(bytes(getattr(events[i], key)), key)
        if problem is not None:
            continue
        ns[i] = value.floor_ns()
        usable[i] = True
        if ns[i] != value.ceil_ns():
            inexact[i] = value
    ns[~usable] = 0
    return ns, inexact, usable


def linked_rows(events, times: ChunkTimes, track_of) -> np.ndarray:
    """LINKED_DTYPE rows of the chunk's linked events (ChunkTimes.linked), chunk-local
    ordinals; `track_of(pid, tid)` numbers a B/E event's track."""
    role = times.role
    at = np.flatnonzero(times.linked())
    rows = np.empty(len(at), LINKED_DTYPE)
    rows["ordinal"] = at
    timed = times.timed[at]
    rows["ts"] = np.where(timed, times.ts[at], -FOREVER - 1)
    rows["up"] = np.where(timed, times.end[at], -FOREVER - 1)  # (of a ts: its ceiling)
    rows["role"] = role[at]
    rows["timed"] = timed
    keys = np.zeros(len(at), np.int64)
    paired = (role[at] == BEGIN) | (role[at] == END)
    if paired.any():
        which = at[paired].tolist()
        codes, tracks = _native.track_keys(events, which)
        numbers = np.array([track_of(*track) for track in tracks], np.int64)
        keys[paired] = numbers[np.frombuffer(codes, np.int32)]
    grouped = np.flatnonzero(~paired)
    keys[grouped] = _group_keys(events, at[grouped].tolist(), role[at[grouped]].tolist())
    rows["key"] = keys
    return rows


def _group_keys(events, ordinals: list[int], roles: list[int]) -> list[int]:
    """`group_key` of each event: a flow's `s` and `f` have the same category and id, so
    each key is made once per chunk (the same types too: `1` and `true` are two ids)."""
    made: dict = {}
    keys = []
    for ordinal, role in zip(ordinals, roles):
        e = events[ordinal]
        cat, id_ = e.cat, e.id
        try:
            key = made.get(seen := (role, type(cat), cat, type(id_), id_))
        except TypeError:  # an object or array as category or id: not a dict key
            key, seen = None, None
        if key is None:
            key = group_key(role, cat, id_)
            if seen is not None:
                made[seen] = key
        keys.append(key)
    return keys


def group_key(role: int, cat, id_) -> int:
    """The key of a flow's or async slice's events: its category and id, hashed (the same
    in every process). Ids are read as Perfetto reads them, so `1`, `1.0` and `"1"` are
    one id; a collision only joins two groups, which then go or stay together."""
    try:
        text = orjson.dumps([cat, _id_text(id_)])
    except TypeError:  # (orjson.JSONEncodeError) a category it cannot write
        text = repr((cat, id_)).encode()
    digest = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
    return _KEY_BASE[role] | (digest & ((1 << 61) - 1))


_UINT64 = (1 << 64) - 1


def _id_text(value) -> str:
    """An id as Perfetto's importer coerces it to an unsigned 64-bit number (a string as
    hexadecimal), or its JSON text where it is no number."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value & _UINT64)
    if isinstance(value, float) and value.is_integer():
        return str(int(value) & _UINT64)
    if isinstance(value, str):
        try:
            return str(int(value, 16) & _UINT64)
        except ValueError:
            return "text:" + value
    try:
        return "json:" + orjson.dumps(value).decode()
    except TypeError:
        return "repr:" + repr(value)


def chunk_range(times: ChunkTimes) -> tuple[int, int, int]:
    """(first start, last end, events in every window) of a chunk's placed events: the
    rewrite copies or skips a chunk wholly inside or outside a window without decoding it.
    Linked events count as placed at their own times (their groups' decisions are
    checked apart)."""
    always = times.always()
    placed = times.timed & (times.role != METADATA)
    if not placed.any():
        return FOREVER, -FOREVER - 1, int(always.sum())
    return int(times.ts[placed].min()), int(times.end[placed].max()), int(always.sum())


SIZE_BIN_SHIFT = 16
"""Sizes are summed in bins of 2**16 ns (65.5 µs) of the time line, made coarser (twice
as wide at a time) where a long trace would need more than MAX_BINS of them (2 ms bins
for a 10 GB trace of three minutes)."""
MAX_BINS = 1 << 15
MOVED_EXTRA = 160
"""Bytes a relocated GPU event may grow by (its provenance member and a longer tid)."""
SEPARATOR_BYTES = 3


def chunk_sizes(times: ChunkTimes, lengths: np.ndarray, moved: np.ndarray | None):
    """What the events of a chunk weigh on the time line: (bins, bytes) of the placed
    events by the bin of their start, and again by the bin of their end, and the bytes of
    the events in every window (with B/E and async events: a pair or slice is written in
    every piece it spans, which their own ts do not tell). `lengths`: each event's bytes
    with the separator after it; `moved`: the events compaction may relocate (they
    grow)."""
    weight = lengths.astype(np.int64)
    if moved is not None:
        weight = weight + np.where(moved, MOVED_EXTRA, 0)
    always = times.always() | (times.role == ASYNC) | (times.role == BEGIN) | (
        times.role == END)
    placed = times.timed & ~always & (times.role != METADATA)
    weights = weight[placed]
    return (binned(times.ts[placed], weights), binned(times.end[placed], weights),
            int(weight[always].sum()))


def binned(ns: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the bins SIZE_BIN_SHIFT wide that hold a time of `ns`, ascending; the sum of the
    `weights` in each). A chunk's times lie a few ms apart, so the bins are counted over
    their range (linear; a sort took most of the index pass's window work); a chunk
    whose times lie far apart is sorted."""
    bins = ns >> SIZE_BIN_SHIFT
    if len(bins):
        low = int(bins.min())
        span = int(bins.max()) - low + 1
        if span <= 4 * len(bins) + 4096:
            offsets = bins - low
            held = np.flatnonzero(np.bincount(offsets, minlength=span))
            sums = np.bincount(offsets, weights=weights, minlength=span)[held]
            return held + low, sums.astype(np.int64)
    keys, at = np.unique(bins, return_inverse=True)
    return keys, np.bincount(at, weights=weights, minlength=len(keys)).astype(np.int64)


class _Histogram:
    """Bytes per bin, merged from chunks' (bins, bytes) and compacted as it grows."""

    def __init__(self):
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []
        self._rows = 0
        self._compacted = 0

    def add(self, keys: np.ndarray, sums: np.ndarray, coarser: int) -> None:
        """Add a chunk's bins (SIZE_BIN_SHIFT wide), `coarser` times halved in number."""
        self._parts.append((keys >> coarser, sums))
        self._rows += len(keys)
        if self._rows > 2 * max(self._compacted, 1 << 16):
            self._compact()

    @property
    def bins(self) -> int:
        self._compact()
        return self._compacted

    def coarsen(self) -> None:
        """Bins twice as wide."""
        self._parts = [(keys >> 1, sums) for keys, sums in self._parts]
        self._compact()

    def _compact(self) -> None:
        keys = np.concatenate([k for k, _ in self._parts]) if self._parts else np.zeros(
            0, np.int64)
        sums = np.concatenate([v for _, v in self._parts]) if self._parts else np.zeros(
            0, np.int64)
        unique, at = np.unique(keys, return_inverse=True)
        self._parts = [(unique, np.bincount(at, weights=sums, minlength=len(unique))
                        .astype(np.int64))]
        self._rows = self._compacted = len(unique)

    def cumulative(self) -> tuple[np.ndarray, np.ndarray]:
        """(bins ascending, bytes in bins up to and including each)."""
        self._compact()
        keys, sums = self._parts[0]
        return keys, np.cumsum(sums)


class SizeBins:
    """The trace's bytes on its time line (the index pass's sum of `chunk_sizes`): a
    conservative estimate of what a piece of it weighs. An event overlaps [a, e) unless it
    starts at or after e or ends before a, so the piece weighs (bytes starting before e)
    - (bytes ending before a), each read at the resolution of a bin, rounded up."""

    GUIDE_BYTES = 700  # a guide event with short names (the plan measures its own)

    def __init__(self):
        self._starts = _Histogram()
        self._ends = _Histogram()
        self.always = 0
        self.shift = SIZE_BIN_SHIFT  # the bins' width: 2**shift ns

    def add(self, starts, ends, always: int) -> None:
        coarser = self.shift - SIZE_BIN_SHIFT
        self._starts.add(*starts, coarser)
        self._ends.add(*ends, coarser)
        self.always += always
        if self._starts._rows > 2 * MAX_BINS or self._ends._rows > 2 * MAX_BINS:
            while max(self._starts.bins, self._ends.bins) > MAX_BINS:  # memory stays flat
                self._starts.coarsen()
                self._ends.coarsen()
                self.shift += 1

    def _arrays(self):
        if not hasattr(self, "_cumulative"):
            self._cumulative = (*self._starts.cumulative(), *self._ends.cumulative())
        return self._cumulative

    def bin_edges(self) -> np.ndarray:
        """The ns where each bin in which an event starts begins (cuts without guides)."""
        return self._arrays()[0] << self.shift

    def estimate(self, start: int, ends: np.ndarray, pass_starts: np.ndarray, layers: int,
                 fixed: int = 0, guide_bytes: int = GUIDE_BYTES) -> np.ndarray:
        """An upper bound of the JSON bytes of the piece [start, end) for each end
        (`fixed`: the bytes every piece has besides its events, the document's own;
        `guide_bytes`: the most one guide event takes)."""
        start_keys, started, end_keys, ended = self._arrays()
        # bytes of events starting before each end: every bin up to the end's own
        reach = np.searchsorted(start_keys, (ends - 1) >> self.shift, "right")
        before_end = np.where(reach > 0, started[np.maximum(reach - 1, 0)], 0)
        # bytes of events ending before the start: only whole bins before its own
        if start <= -FOREVER:
            over = 0
        else:
            count = int(np.searchsorted(end_keys, start >> self.shift, "left"))
            over = int(ended[count - 1]) if count > 0 else 0
        passes = (np.searchsorted(pass_starts, ends, "left")
                  - np.searchsorted(pass_starts, start, "left"))
        return (before_end - over + self.always + fixed
                + passes * layers * guide_bytes)
