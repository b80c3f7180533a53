"""What one chunk of events contains: the index pass's work, as a pure function.

`observe_chunk(data, offset, context)` validates a chunk (JSON syntax, UTF-8,
field types), decodes it in one msgspec call into small structs, and returns
`ChunkFacts`: packed numpy records for the events the plan needs (GPU activity
and scopes, flows, thread metadata), first-seen other events per track, anchor
matches and counters. It runs in worker processes; everything it returns is
picklable and uses chunk-local numbering (event index within the chunk, local
track and group tables) that the index builder maps to global ids.

Exact number text is read only for GPU slices and flows, from the event's own
bytes: a fast path for events without backslashes whose keys appear once (one
regex search plus a few counts), else an exact per-event decode.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import orjson

from tracestream import timebase
from tracestream.errors import TraceError
from tracestream.events import (
    CPU_ANNOTATION,
    FLOW_PHASES,
    GPU_SCOPE,
    KERNEL,
    LAYER_GUIDE,
    OTHER,
    PROVENANCE_KEY,
    CategoryKinds,
    describe_validation_error,
)

FLOW = 8  # candidate kind of flow events
META = 9  # candidate kind of thread metadata events

CANDIDATE_DTYPE = np.dtype([
    ("index", "<i4"), ("offset", "<i8"), ("length", "<i4"), ("kind", "i1"),
    # where the rewrite splices, relative to the event start (pid_at -1: find them then)
    ("pid_at", "<i4"), ("pid_len", "<i4"), ("tid_at", "<i4"), ("tid_len", "<i4"),
    ("args_at", "<i4"),  # the '{' of args, -1 without args
    ("args_empty", "i1"),
])
SLICE_DTYPE = np.dtype([
    ("cand", "<i4"), ("track", "<i4"), ("group", "<i4"), ("kind", "i1"),
    ("start", "<i8"), ("end", "<i8"), ("lo", "<i8"), ("hi", "<i8"),
])
FLOW_DTYPE = np.dtype([("cand", "<i4"), ("track", "<i4"), ("ts", "<i8"), ("id", "<i8")])

SCOPES = "scopes"
_NO_ID = np.iinfo(np.int64).min


class _Args(msgspec.Struct):
    device: Any = None
    stream: Any = None


class Event(msgspec.Struct):
    """The fields every event is classified by (everything else is skipped, but validated)."""

    ph: str | None = None
    cat: Any = None
    name: Any = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    id: Any = None
    args: _Args | None = None


class _Timing(msgspec.Struct):
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()


_EVENTS = msgspec.json.Decoder(list[Event])
_EVENT = msgspec.json.Decoder(Event)
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_TIMING = msgspec.json.Decoder(_Timing)
_SEPARATOR = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_NUM = rb"(-?[0-9][0-9.eE+-]*)"
_TS_DUR = re.compile(rb'"ts"[ \t\r\n]*:[ \t\r\n]*' + _NUM + rb'[ \t\r\n]*,[ \t\r\n]*"dur"[ \t\r\n]*:[ \t\r\n]*' + _NUM)
_TS = re.compile(rb'"ts"[ \t\r\n]*:[ \t\r\n]*' + _NUM)
_PROVENANCE = b'"' + PROVENANCE_KEY.encode() + b'"'
_SCALAR_VALUE = re.compile(rb'[ \t\r\n]*:[ \t\r\n]*(-?[0-9]+|"[^"]*")')
_OBJECT_VALUE = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*(\{)[ \t\r\n]*(\}?)")
_UNKNOWN = (-1, 0, 0, 0, -1, 0)


@dataclass
class Context:
    """What every chunk needs to know (sent to each worker once)."""

    patterns: dict[str, re.Pattern] = field(default_factory=dict)
    count_names: bool = False
    records: bool = True
    positions: bool = True  # find the rewrite's splice positions (compaction)


@dataclass
class Match:
    """A kernel whose name matched one of the user's patterns (ordinal is chunk-local
    inside ChunkFacts, global once the index builder has it)."""

    ordinal: int
    pid: Any
    tid: Any
    device: Any
    name: str
    ts: timebase.Decimal10
    dur: timebase.Decimal10
    ts_text: str
    dur_text: str
    stream: Any

    @property
    def end(self) -> timebase.Decimal10:
        return self.ts + self.dur


@dataclass
class MetaEvent:
    """A `ph: M` event about a thread (name, sort index), with its byte span and bytes."""

    ordinal: int
    offset: int
    length: int
    pid: Any
    tid: Any
    name: str
    value: Any
    raw: bytes


@dataclass
class OtherOnTrack:
    """First event on a track that is neither activity, scope, flow nor metadata."""

    ordinal: int
    ph: Any
    name: Any
    ts: Any


@dataclass
class GuideEvent:
    ordinal: int
    pid: Any
    tid: Any
    args: dict


@dataclass
class ChunkFacts:
    """Everything the index keeps from one chunk, in chunk-local numbering."""

    count: int
    origin: tuple[float, str] | None
    tracks: list[tuple]  # local track id -> (pid, tid)
    groups: list[tuple]  # local group id -> (pid, device or SCOPES)
    candidates: np.ndarray  # CANDIDATE_DTYPE, in file order
    slices: np.ndarray  # SLICE_DTYPE
    flows: np.ndarray  # FLOW_DTYPE
    flow_ids: dict[int, Any]  # local candidate -> id, for ids that are not integers
    thread_meta: list[MetaEvent]
    process_meta: list[tuple[Any, str, Any]]
    other_on_track: dict[int, OtherOnTrack]  # local track -> first other event
    matches: dict[str, list[Match]]
    guides: list[GuideEvent]
    provenance: int | None
    kernel_names: dict[int, Counter]  # local group -> names
    cpu_annotations: Counter
    flow_categories: Counter
    phase_counts: Counter


class BadCut(Exception):
    """The chunk's cut lies inside a string or nested value (or past the event array)."""

    def __init__(self, array_ends_at: int | None = None):
        super().__init__("bad cut")
        self.array_ends_at = array_ends_at


class ChunkError(Exception):
    """Malformed input inside a chunk: `local` is the event index in the chunk (or None)."""

    def __init__(self, message: str, offset: int, local: int | None):
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.local = local


def decode_chunk(data: bytes, offset: int) -> list[Event]:
    """The chunk's events; BadCut if the cut was wrong, ChunkError if the input is malformed."""
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ChunkError(f"invalid UTF-8: {exc.reason}", offset + exc.start, None) from None
    doc = b"[" + data + b"]"
    try:
        return _EVENTS.decode(doc)
    except msgspec.ValidationError as exc:
        local = _validation_index(exc)
        starts = event_starts(data, None)
        where = offset + starts[local] if local is not None and local < len(starts) else offset
        raise ChunkError(describe_validation_error(exc), where, local) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        first = exc
    try:
        orjson.loads(doc)
    except orjson.JSONDecodeError as exc:
        text = str(exc)
        if exc.pos >= len(doc) - 1 or "unexpected end" in text.lower():
            raise BadCut() from None
        if "unexpected content after document" in text:
            raise BadCut(array_ends_at=exc.pos - 1) from None
        reason = exc.msg if hasattr(exc, "msg") else text
        raise ChunkError(f"malformed JSON: {reason.split(': line ')[0]}",
                         offset + exc.pos - 1, None) from None
    except RecursionError:
        pass
    reason = "JSON nested too deeply" if isinstance(first, RecursionError) else str(first)
    raise ChunkError(reason, offset, None)


def _validation_index(exc: msgspec.ValidationError) -> int | None:
    m = re.search(r"at `\$\[(\d+)\]", str(exc))
    return int(m.group(1)) if m else None


def event_starts(data: bytes, count: int | None) -> list[int]:
    """Offset of every event in a validated chunk.

    Every real boundary matches the separator pattern; a match inside a string or a
    nested value would add one, so a count equal to the decoded count proves the
    list exact. Otherwise the events' exact bytes come from msgspec.
    """
    starts = [0]
    starts.extend(m.end() - 1 for m in _SEPARATOR.finditer(data))
    if count is None or len(starts) == count:
        return starts
    starts = []
    pos = 0
    for raw in _RAW_LIST.decode(b"[" + data + b"]"):
        pos = data.find(b"{", pos)
        starts.append(pos)
        pos += len(raw)
    return starts


def observe_chunk(data: bytes, offset: int, ctx: Context) -> ChunkFacts:
    """The index pass's view of one chunk (see module docstring)."""
    events = decode_chunk(data, offset)
    return _Observer(data, offset, ctx, events).run()


class _Observer:
    def __init__(self, data: bytes, offset: int, ctx: Context, events: list[Event]):
        self.data = data
        self.offset = offset
        self.ctx = ctx
        self.events = events
        self._starts: list[int] | None = None
        self.tracks: dict[tuple, int] = {}
        self.groups: dict[tuple, int] = {}
        self.plain = b"\\" not in data

    @property
    def starts(self) -> list[int]:
        if self._starts is None:
            self._starts = event_starts(self.data, len(self.events))
        return self._starts

    def span(self, i: int) -> tuple[int, int]:
        starts = self.starts
        start = starts[i]
        bound = starts[i + 1] if i + 1 < len(starts) else len(self.data)
        return start, self.data.rindex(b"}", start, bound) + 1

    def raw(self, i: int) -> bytes:
        s, e = self.span(i)
        return self.data[s:e]

    def fail(self, i: int, what: str) -> ChunkError:
        return ChunkError(what, self.offset + self.starts[i], i)

    def track(self, pid, tid) -> int:
        key = (pid, tid)
        t = self.tracks.get(key)
        if t is None:
            t = self.tracks[key] = len(self.tracks)
        return t

    def group(self, pid, device) -> int:
        key = (pid, device)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = len(self.groups)
        return g

    # -- the one loop over every event ------------------------------------------

    def run(self) -> ChunkFacts:
        events = self.events
        kinds = CategoryKinds()
        count_names = self.ctx.count_names
        phase_counts: Counter = Counter()
        other: dict[tuple, int] = {}
        slices: list[int] = []
        flows: list[int] = []
        metas: list[int] = []
        guides: list[int] = []
        cpu_annotations: Counter = Counter()
        low, high = -timebase.MAX_ABS_US, timebase.MAX_ABS_US
        min_ts = float("inf")
        min_at: list[int] = []
        for i, e in enumerate(events):
            ph = e.ph
            phase_counts[ph] += 1
            ts = e.ts
            if ts is not None:
                if not low < ts < high:
                    raise self.fail(i, f"ts {self._text(i, 'ts')} is out of range")
                if ts <= min_ts:
                    if ts < min_ts:
                        min_ts = ts
                        min_at = [i]
                    else:
                        min_at.append(i)
            dur = e.dur
            if dur is not None and not 0 <= dur < high:
                word = "negative" if dur < 0 else "out of range"
                raise self.fail(i, f"dur {self._text(i, 'dur')} is {word}")
            if ph == "X":
                try:
                    kind = kinds[e.cat]
                except TypeError:
                    kind = OTHER
                if KERNEL <= kind <= GPU_SCOPE:
                    slices.append(i)
                    continue
                if kind == LAYER_GUIDE:
                    guides.append(i)
                elif kind == CPU_ANNOTATION and count_names:
                    cpu_annotations[e.name] += 1
            elif ph in FLOW_PHASES:
                if e.pid is not None and e.tid is not None and ts is not None:
                    flows.append(i)
                    continue
            elif ph == "M":
                metas.append(i)
                continue
            key = (e.pid, e.tid)
            if key not in other:
                other[key] = i
        facts = self._facts(slices, flows, metas, guides, other, min_at)
        facts.phase_counts = phase_counts
        facts.cpu_annotations = cpu_annotations
        return facts

    def _text(self, i: int, key: str) -> str:
        m = re.search(rb'"' + key.encode() + rb'"[ \t\r\n]*:[ \t\r\n]*([^,}\s]+)', self.raw(i))
        return m.group(1).decode(errors="replace") if m else "?"

    # -- assembling the facts ---------------------------------------------------

    def _facts(self, slices, flows, metas, guides, other, min_at) -> ChunkFacts:
        events = self.events
        origin = self._origin(min_at) if min_at else None
        thread_meta, process_meta, meta_cands = self._metadata(metas)
        # candidates in file order: slices, flows and thread metadata merged by index
        bulk = _bulk_columns(self, slices, flows) if not meta_cands else None
        if bulk is not None:
            candidates, slice_rows, flow_rows, flow_ids, flow_categories, matches, names = bulk
            return self._finish(candidates, slice_rows, flow_rows, flow_ids, flow_categories,
                                matches, names, origin, thread_meta, process_meta, other,
                                guides)
        order = sorted([(i, 0) for i in slices] + [(i, FLOW) for i in flows]
                       + [(i, META) for i in meta_cands])
        sliced = _SliceBuilder(self)
        flowed = _FlowBuilder(self)
        rows = []
        data = self.data
        starts = self.starts
        count = len(starts)
        size = len(data)
        base = self.offset
        positions = self.ctx.positions
        for c, (i, kind) in enumerate(order):
            s = starts[i]
            e = data.rindex(b"}", s, starts[i + 1] if i + 1 < count else size) + 1
            if kind == 0:
                kind, where = sliced.add(c, i, s, e)
            elif kind == FLOW:
                where = flowed.add(c, i, s, e)
            else:
                where = _UNKNOWN
            rows.append((i, base + s, e - s, kind, *(where if positions else _UNKNOWN)))
        candidates = np.array(rows, dtype=CANDIDATE_DTYPE) if rows else np.zeros(
            0, CANDIDATE_DTYPE)
        return self._finish(candidates, sliced.rows(), flowed.rows(), flowed.ids,
                            flowed.categories, sliced.matches, sliced.kernel_names, origin,
                            thread_meta, process_meta, other, guides)

    def _finish(self, candidates, slice_rows, flow_rows, flow_ids, flow_categories, matches,
                kernel_names, origin, thread_meta, process_meta, other, guides) -> ChunkFacts:
        events = self.events
        provenance = self._provenance()
        other_on_track = {
            self.track(*key): OtherOnTrack(i, events[i].ph, events[i].name, events[i].ts)
            for key, i in other.items()
        }
        guide_events = [self._guide(i) for i in guides]
        return ChunkFacts(
            count=len(events),
            origin=origin,
            tracks=list(self.tracks),
            groups=list(self.groups),
            candidates=candidates,
            slices=slice_rows,
            flows=flow_rows,
            flow_ids=flow_ids,
            thread_meta=thread_meta,
            process_meta=process_meta,
            other_on_track=other_on_track,
            matches=matches,
            guides=guide_events,
            provenance=provenance,
            kernel_names=kernel_names,
            cpu_annotations=Counter(),
            flow_categories=flow_categories,
            phase_counts=Counter(),
        )

    def _origin(self, min_at: list[int]) -> tuple[float, str]:
        """Exact text of the smallest ts (the float finds it, the digits break ties)."""
        best = None
        for i in min_at:
            text = bytes(_TIMING.decode(self.raw(i)).ts)
            value = timebase.parse_decimal(text)
            if best is None or value < best[0]:
                best = (value, text)
        return self.events[min_at[0]].ts, best[1].decode()

    def _exact_texts(self, i: int, s: int, e: int, want_dur: bool) -> tuple[bytes, bytes]:
        """ts (and dur) number text of event i at [s, e), checked against the decoded values.

        The first `"ts": .., "dur": ..` in the event is the top-level pair when its
        values equal msgspec's (which reads the top-level keys); otherwise (other
        key order, nested keys, duplicates) the event is decoded exactly.
        """
        data = self.data
        ev = self.events[i]
        if self.plain or data.find(b"\\", s, e) < 0:
            m = (_TS_DUR if want_dur else _TS).search(data, s, e)
            if m is not None:
                try:
                    if float(m.group(1)) == ev.ts and (not want_dur or float(m.group(2)) == ev.dur):
                        return m.group(1), (m.group(2) if want_dur else b"")
                except ValueError:
                    pass
        raw = data[s:e]
        dup = _duplicate_key(raw)
        if dup is not None:
            raise self.fail(i, f"duplicate key `{dup}` in an event tracestream interprets")
        timing = _TIMING.decode(raw)
        return bytes(timing.ts), bytes(timing.dur)

    def _positions(self, i: int, s: int, e: int) -> tuple:
        """Where pid, tid and args are (relative to s), or _UNKNOWN for the exact path later.

        Needs no backslash in the chunk and exactly one `"pid"`/`"tid"`/`"args"` token:
        then each is the top-level key (a duplicate key is refused here).
        """
        data = self.data
        if not self.plain and data.find(b"\\", s, e) >= 0:
            return _UNKNOWN
        found = []
        for key in (b'"pid"', b'"tid"'):
            at = data.find(key, s, e)
            if at < 0:
                return _UNKNOWN
            if data.find(key, at + 5, e) >= 0:
                dup = _duplicate_key(data[s:e])
                if dup is not None:
                    raise self.fail(i, f"duplicate key `{dup}` in an event tracestream moves")
                return _UNKNOWN
            m = _SCALAR_VALUE.match(data, at + 5, e)
            if m is None:
                return _UNKNOWN
            found.append(m.start(1) - s)
            found.append(m.end(1) - m.start(1))
        at = data.find(b'"args"', s, e)
        if at < 0:
            return (*found, -1, 0)
        if data.find(b'"args"', at + 6, e) >= 0:
            return _UNKNOWN
        m = _OBJECT_VALUE.match(data, at + 6, e)
        if m is None:
            return _UNKNOWN
        return (*found, m.start(1) - s, 1 if m.group(2) else 0)

    def _metadata(self, metas: list[int]) -> tuple[list, list, list]:
        thread_meta = []
        process_meta = []
        cands = []
        for i in metas:
            e = self.events[i]
            name = e.name
            if not isinstance(name, str):
                continue
            raw = self.raw(i)
            args = orjson.loads(raw).get("args")
            args = args if isinstance(args, dict) else {}
            if name.startswith("thread_"):
                s, _ = self.span(i)
                value = args.get("name", args.get("sort_index"))
                thread_meta.append(
                    MetaEvent(i, self.offset + s, len(raw), e.pid, e.tid, name, value, raw))
                self.track(e.pid, e.tid)
                cands.append(i)
            elif name in ("process_name", "process_labels", "process_sort_index"):
                key = {"process_name": "name", "process_labels": "labels",
                       "process_sort_index": "sort_index"}[name]
                process_meta.append((e.pid, key, args.get(key)))
        return thread_meta, process_meta, cands

    def _guide(self, i: int) -> GuideEvent:
        e = self.events[i]
        self.track(e.pid, e.tid)
        args = orjson.loads(self.raw(i)).get("args")
        return GuideEvent(i, e.pid, e.tid, args if isinstance(args, dict) else {})

    def _provenance(self) -> int | None:
        if _PROVENANCE not in self.data:
            return None
        for i, e in enumerate(self.events):
            raw = self.raw(i)
            if _PROVENANCE in raw:
                args = orjson.loads(raw).get("args")
                if isinstance(args, dict) and PROVENANCE_KEY in args:
                    return i
        return None


class _SliceBuilder:
    """Collects the chunk's GPU slices (exact bounds, track, group) as it meets them."""

    def __init__(self, obs: _Observer):
        self.obs = obs
        self.kinds = CategoryKinds()
        self.patterns = obs.ctx.patterns
        self.count_names = obs.ctx.count_names
        self.matches: dict[str, list[Match]] = {name: [] for name in self.patterns}
        self.kernel_names: dict[int, Counter] = {}
        self._hits: dict[Any, list[str]] = {}
        self.cand: list[int] = []
        self.track: list[int] = []
        self.group: list[int] = []
        self.kind: list[int] = []
        self.start: list[int] = []
        self.end: list[int] = []
        self.ts_f: list[float] = []
        self.dur_f: list[float] = []
        self.int_ts: list[bool] = []
        self.int_dur: list[int] = []  # ns of integer durations, -1 otherwise

    def add(self, cand: int, i: int, s: int, e: int) -> tuple[int, tuple]:
        obs = self.obs
        ev = obs.events[i]
        pid, tid = ev.pid, ev.tid
        if pid is None or tid is None or ev.dur is None:
            missing = "pid" if pid is None else "tid" if tid is None else "dur"
            raise obs.fail(i, f"GPU activity event has no `{missing}`")
        kind = self.kinds[ev.cat]
        fast = _kineto_slice(obs, s, e)
        if fast is not None:
            ts_text, dur_text, where = fast
        else:
            ts_text, dur_text = obs._exact_texts(i, s, e, True)
            where = obs._positions(i, s, e)
        start, end = _exact_span(ts_text, dur_text)
        args = ev.args
        if kind == GPU_SCOPE:
            group = obs.group(pid, SCOPES)
        else:
            group = obs.group(pid, args.device if args is not None else None)
        self.cand.append(cand)
        self.track.append(obs.track(pid, tid))
        self.group.append(group)
        self.kind.append(kind)
        self.start.append(start)
        self.end.append(end)
        self.ts_f.append(ev.ts)
        self.dur_f.append(ev.dur)
        self.int_ts.append(b"." not in ts_text and b"e" not in ts_text and b"E" not in ts_text)
        if b"." not in dur_text and b"e" not in dur_text and b"E" not in dur_text:
            self.int_dur.append(int(dur_text) * 1000)
        else:
            self.int_dur.append(-1)
        if kind == KERNEL:
            name = ev.name
            if self.count_names:
                names = self.kernel_names.get(group)
                if names is None:
                    names = self.kernel_names[group] = Counter()
                names[name] += 1
            if self.patterns:
                hits = self._hits.get(name)
                if hits is None:
                    text = name if isinstance(name, str) else str(name)
                    hits = self._hits[name] = [
                        p for p, rx in self.patterns.items() if rx.search(text)]
                for p in hits:
                    self.matches[p].append(Match(
                        i, pid, tid, args.device if args is not None else None, name,
                        timebase.parse_decimal(ts_text), timebase.parse_decimal(dur_text),
                        ts_text.decode(), dur_text.decode(),
                        args.stream if args is not None else None))
        return kind, where

    def rows(self) -> np.ndarray:
        n = len(self.cand)
        rows = np.empty(n, SLICE_DTYPE)
        if not n:
            return rows
        start = np.array(self.start, np.int64)
        end = np.array(self.end, np.int64)
        int_dur = np.array(self.int_dur, np.int64)
        lo, hi = importer_bounds(start, end, np.array(self.ts_f), np.array(self.dur_f),
                                 np.array(self.int_ts), int_dur >= 0, int_dur)
        rows["cand"] = self.cand
        rows["track"] = self.track
        rows["group"] = self.group
        rows["kind"] = self.kind
        rows["start"] = start
        rows["end"] = end
        rows["lo"] = lo
        rows["hi"] = hi
        return rows


class _FlowBuilder:
    """Collects the chunk's flow events (exact time, track, id)."""

    def __init__(self, obs: _Observer):
        self.obs = obs
        self.ids: dict[int, Any] = {}
        self.categories: Counter = Counter()
        self._rows: list[tuple] = []

    def add(self, cand: int, i: int, s: int, e: int) -> tuple:
        obs = self.obs
        ev = obs.events[i]
        fast = _kineto_flow(obs, s, e)
        if fast is not None:
            ts_text, where = fast
        else:
            ts_text, _ = obs._exact_texts(i, s, e, False)
            where = obs._positions(i, s, e)
        fid = ev.id
        if isinstance(fid, int) and not isinstance(fid, bool) and -(2**62) < fid < 2**62:
            number = fid
        else:
            number = _NO_ID
            self.ids[cand] = fid
        self._rows.append((cand, obs.track(ev.pid, ev.tid), _floor_ns(ts_text), number))
        cat = ev.cat
        self.categories[cat if isinstance(cat, str) else str(cat)] += 1
        return where

    def rows(self) -> np.ndarray:
        return np.array(self._rows, FLOW_DTYPE) if self._rows else np.zeros(0, FLOW_DTYPE)


_W = rb"[ \t\r\n]*"
_STR = rb'"[^"\\]*"'
_INT_OR_STR = rb'(-?[0-9]+|"[^"\\]*")'
_KINETO_SLICE = re.compile(
    rb"\{" + _W + rb'"ph"' + _W + rb":" + _W + rb'"X"' + _W + rb"," + _W
    + rb'"cat"' + _W + rb":" + _W + _STR + _W + rb"," + _W
    + rb'"name"' + _W + rb":" + _W + _STR + _W + rb"," + _W
    + rb'"pid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"tid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"ts"' + _W + rb":" + _W + _NUM + _W + rb"," + _W
    + rb'"dur"' + _W + rb":" + _W + _NUM
    + rb"(?:" + _W + rb"," + _W + rb'"args"' + _W + rb":" + _W + rb"(\{)" + _W + rb"(\}?))?"
)
_KINETO_FLOW = re.compile(
    rb"\{" + _W + rb'"ph"' + _W + rb":" + _W + rb'"[stf]"' + _W + rb"," + _W
    + rb'"id"' + _W + rb":" + _W + rb'(?:-?[0-9]+|"[^"\\]*")' + _W + rb"," + _W
    + rb'"pid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"tid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"ts"' + _W + rb":" + _W + _NUM
)
_LATER_SLICE_KEY = re.compile(rb'"(?:ph|cat|name|pid|tid|ts|dur|args)"' + _W + rb":")
_LATER_FLOW_KEY = re.compile(rb'"(?:ph|id|pid|tid|ts|args)"' + _W + rb":")


def _kineto_slice(obs: _Observer, s: int, e: int):
    """(ts text, dur text, splice positions) for an `X` event in Kineto's key order, or None.

    The match starts at the event's `{` and walks its first members in JSON
    grammar, so what it captures are top-level members; a later occurrence of any
    interpreted key (a duplicate) sends the event down the exact path.
    """
    data = obs.data
    m = _KINETO_SLICE.match(data, s, e)
    if m is None or _LATER_SLICE_KEY.search(data, m.end(), e) is not None:
        return None
    if m.group(5) is None:
        args_at, empty = -1, 0
    else:
        args_at, empty = m.start(5) - s, 1 if m.group(6) else 0
    where = (m.start(1) - s, m.end(1) - m.start(1), m.start(2) - s, m.end(2) - m.start(2),
             args_at, empty)
    return m.group(3), m.group(4), where


def _kineto_flow(obs: _Observer, s: int, e: int):
    """(ts text, splice positions) for a flow event in Kineto's key order, or None."""
    data = obs.data
    m = _KINETO_FLOW.match(data, s, e)
    if m is None or _LATER_FLOW_KEY.search(data, m.end(), e) is not None:
        return None
    where = (m.start(1) - s, m.end(1) - m.start(1), m.start(2) - s, m.end(2) - m.start(2), -1, 0)
    return m.group(3), where


_GPU_CATEGORIES = rb"kernel|gpu_memcpy|gpu_memset|cuda_sync|gpu_user_annotation|Kernel|Memcpy|Memset"
_US = rb"(-?[0-9]+)(?:\.([0-9]{3}))?"
_FULL_SLICE = re.compile(
    rb"\{" + _W + rb'"ph"' + _W + rb":" + _W + rb'"X"' + _W + rb"," + _W
    + rb'"cat"' + _W + rb":" + _W + rb'"(' + _GPU_CATEGORIES + rb')"' + _W + rb"," + _W
    + rb'"name"' + _W + rb":" + _W + _STR + _W + rb"," + _W
    + rb'"pid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"tid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"ts"' + _W + rb":" + _W + rb"(" + _US + rb")" + _W + rb"," + _W
    + rb'"dur"' + _W + rb":" + _W + rb"(" + _US + rb")"
    + rb"(?:" + _W + rb"," + _W + rb'"args"' + _W + rb":" + _W
    + rb'(\{)([^{}"]*(?:"[^"\\]*"[^{}"]*)*)\})?' + _W + rb"\}"
)
_FULL_FLOW = re.compile(
    rb"\{" + _W + rb'"ph"' + _W + rb":" + _W + rb'"[stf]"' + _W + rb"," + _W
    + rb'"id"' + _W + rb":" + _W + rb'(?:-?[0-9]+|"[^"\\]*")' + _W + rb"," + _W
    + rb'"pid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"tid"' + _W + rb":" + _W + _INT_OR_STR + _W + rb"," + _W
    + rb'"ts"' + _W + rb":" + _W + rb"(" + _US + rb")" + _W + rb"," + _W
    + rb'"cat"' + _W + rb":" + _W + _STR + _W + rb"," + _W
    + rb'"name"' + _W + rb":" + _W + _STR
    + rb"(?:" + _W + rb"," + _W + rb'"bp"' + _W + rb":" + _W + _STR + rb")?" + _W + rb"\}"
)
_CATEGORY_KIND = {b"kernel": KERNEL, b"Kernel": KERNEL, b"gpu_memcpy": 2, b"Memcpy": 2,
                  b"gpu_memset": 3, b"Memset": 3, b"cuda_sync": 4,
                  b"gpu_user_annotation": GPU_SCOPE}


def _bulk_columns(obs: _Observer, slices: list[int], flows: list[int]):
    """Columnar fast path for chunks in Kineto's layout, or None for the per-event path.

    One regex per event kind matches whole events (every top-level member, in
    Kineto's order, so no duplicate key can hide); its matches must pair one to
    one, in order, with the slices and flows msgspec decoded, with equal values.
    Then every number, position and id is computed a column at a time.
    """
    data = obs.data
    if not obs.plain or not (slices or flows):
        return None
    sm = list(_FULL_SLICE.finditer(data))
    if len(sm) != len(slices):
        return None
    fm = list(_FULL_FLOW.finditer(data)) if flows else []
    if len(fm) != len(flows):
        return None
    events = obs.events
    sev = [events[i] for i in slices]
    fev = [events[i] for i in flows]
    try:
        s_cols = _number_columns(sm, sev, slice_kind=True)
        f_cols = _number_columns(fm, fev, slice_kind=False)
    except ValueError:
        return None
    if s_cols is None or f_cols is None:
        return None
    base = obs.offset
    # candidates: slices and flows merged in file order
    n_s, n_f = len(sm), len(fm)
    cands = np.empty(n_s + n_f, CANDIDATE_DTYPE)
    cands["index"][:n_s] = slices
    cands["index"][n_s:] = flows
    for cols, lo_, hi_ in ((s_cols, 0, n_s), (f_cols, n_s, n_s + n_f)):
        part = cands[lo_:hi_]
        part["offset"] = cols["start_at"] + base
        part["length"] = cols["length"]
        part["pid_at"] = cols["pid_at"]
        part["pid_len"] = cols["pid_len"]
        part["tid_at"] = cols["tid_at"]
        part["tid_len"] = cols["tid_len"]
        part["args_at"] = cols["args_at"]
        part["args_empty"] = cols["args_empty"]
    cands["kind"][:n_s] = s_cols["kind"]
    cands["kind"][n_s:] = FLOW
    if not obs.ctx.positions:
        cands["pid_at"] = -1
    order = np.argsort(cands["index"], kind="stable")
    cands = cands[order]
    cand_of = np.empty(len(order), np.int64)
    cand_of[order] = np.arange(len(order))
    # slices
    slice_rows = np.empty(n_s, SLICE_DTYPE)
    matches: dict[str, list[Match]] = {name: [] for name in obs.ctx.patterns}
    kernel_names: dict[int, Counter] = {}
    if n_s:
        pids = [e.pid for e in sev]
        tids = [e.tid for e in sev]
        kinds = s_cols["kind"]
        devices = [SCOPES if k == GPU_SCOPE else (e.args.device if e.args is not None else None)
                   for e, k in zip(sev, kinds.tolist())]
        tracks = _intern(obs.track, list(zip(pids, tids)))
        groups = _intern(obs.group, list(zip(pids, devices)))
        lo, hi = importer_bounds(s_cols["start"], s_cols["end"], s_cols["ts_f"], s_cols["dur_f"],
                                 s_cols["int_ts"], s_cols["int_dur"] >= 0, s_cols["int_dur"])
        slice_rows["cand"] = cand_of[:n_s]
        slice_rows["track"] = tracks
        slice_rows["group"] = groups
        slice_rows["kind"] = kinds
        slice_rows["start"] = s_cols["start"]
        slice_rows["end"] = s_cols["end"]
        slice_rows["lo"] = lo
        slice_rows["hi"] = hi
        kernel_at = np.flatnonzero(kinds == KERNEL).tolist()
        names = [sev[k].name for k in kernel_at]
        if obs.ctx.count_names:
            for (group, name), n in Counter(zip([groups[k] for k in kernel_at], names)).items():
                kernel_names.setdefault(group, Counter())[name] += n
        patterns = obs.ctx.patterns
        if patterns:
            hits = {}
            for name in set(names):
                text = name if isinstance(name, str) else str(name)
                found = [p for p, rx in patterns.items() if rx.search(text)]
                if found:
                    hits[name] = found
            if hits:
                for k, name in zip(kernel_at, names):
                    if name in hits:
                        ev = sev[k]
                        m = sm[k]
                        ts_text, dur_text = m.group(4), m.group(7)
                        args = ev.args
                        for p in hits[name]:
                            matches[p].append(Match(
                                slices[k], ev.pid, ev.tid, args.device if args else None, name,
                                timebase.parse_decimal(ts_text), timebase.parse_decimal(dur_text),
                                ts_text.decode(), dur_text.decode(),
                                args.stream if args else None))
    # flows
    flow_rows = np.empty(n_f, FLOW_DTYPE)
    flow_ids: dict[int, Any] = {}
    categories: Counter = Counter()
    if n_f:
        flow_rows["cand"] = cand_of[n_s:]
        flow_rows["track"] = _intern(obs.track, [(e.pid, e.tid) for e in fev])
        flow_rows["ts"] = f_cols["start"]
        ids = []
        for k, e in enumerate(fev):
            fid = e.id
            if isinstance(fid, int) and not isinstance(fid, bool) and -(2**62) < fid < 2**62:
                ids.append(fid)
            else:
                ids.append(_NO_ID)
                flow_ids[int(cand_of[n_s + k])] = fid
        flow_rows["id"] = ids
        categories.update(e.cat if isinstance(e.cat, str) else str(e.cat) for e in fev)
    return cands, slice_rows, flow_rows, flow_ids, categories, matches, kernel_names


def _intern(table, keys: list) -> list[int]:
    ids = {key: table(*key) for key in dict.fromkeys(keys)}
    return list(map(ids.__getitem__, keys))


def _number_columns(found: list, events: list, *, slice_kind: bool):
    """Positions and exact numbers of regex-matched events, checked against msgspec's values.

    Groups: slices (cat, pid, tid, ts, ts int, ts frac, dur, dur int, dur frac,
    args '{', args body); flows (pid, tid, ts, ts int, ts frac).
    """
    n = len(found)
    if slice_kind:
        g_pid, g_tid, g_ts, g_ti, g_tf, g_dur, g_di, g_df = 2, 3, 4, 5, 6, 7, 8, 9
    else:
        g_pid, g_tid, g_ts, g_ti, g_tf = 1, 2, 3, 4, 5
    groups = [m.groups() for m in found]
    start_at = np.fromiter((m.start() for m in found), np.int64, n)
    end_at = np.fromiter((m.end() for m in found), np.int64, n)
    pid_span = [m.span(g_pid) for m in found]
    tid_span = [m.span(g_tid) for m in found]
    cols: dict[str, np.ndarray] = {"start_at": start_at, "length": end_at - start_at}
    cols["pid_at"] = np.fromiter((a for a, _ in pid_span), np.int64, n) - start_at
    cols["pid_len"] = np.fromiter((b - a for a, b in pid_span), np.int64, n)
    cols["tid_at"] = np.fromiter((a for a, _ in tid_span), np.int64, n) - start_at
    cols["tid_len"] = np.fromiter((b - a for a, b in tid_span), np.int64, n)
    ts_texts = [g[g_ts - 1] for g in groups]
    if [e.ts for e in events] != list(map(float, ts_texts)):
        return None
    pid_texts = [g[g_pid - 1] for g in groups]
    tid_texts = [g[g_tid - 1] for g in groups]
    if [e.pid for e in events] != [_scalar(t) for t in pid_texts]:
        return None
    if [e.tid for e in events] != [_scalar(t) for t in tid_texts]:
        return None
    ts_int = [g[g_ti - 1] for g in groups]
    if any(t[:1] == b"-" for t in ts_int):
        return None
    ts_frac = [g[g_tf - 1] for g in groups]
    start = np.fromiter(map(int, ts_int), np.int64, n) * 1000 + np.fromiter(
        (int(f) if f else 0 for f in ts_frac), np.int64, n)
    cols["start"] = start
    if not slice_kind:
        cols["args_at"] = np.full(n, -1, np.int64)
        cols["args_empty"] = np.zeros(n, np.int8)
        return cols
    dur_texts = [g[g_dur - 1] for g in groups]
    if [e.dur for e in events] != list(map(float, dur_texts)):
        return None
    dur_frac = [g[g_df - 1] for g in groups]
    dur_ns = np.fromiter(map(int, (g[g_di - 1] for g in groups)), np.int64, n) * 1000 + np.fromiter(
        (int(f) if f else 0 for f in dur_frac), np.int64, n)
    cols["end"] = start + dur_ns
    cols["ts_f"] = np.array([e.ts for e in events])
    cols["dur_f"] = np.array([e.dur for e in events])
    cols["int_ts"] = np.array([f is None for f in ts_frac])
    cols["int_dur"] = np.where(np.array([f is None for f in dur_frac]), dur_ns, -1)
    cols["kind"] = np.fromiter((_CATEGORY_KIND[g[0]] for g in groups), np.int8, n)
    args_open = [m.start(10) for m in found]
    cols["args_at"] = np.array(args_open, np.int64) - start_at
    cols["args_at"][np.array(args_open) < 0] = -1
    cols["args_empty"] = np.fromiter(
        (1 if (g[10] is not None and not g[10].strip()) else 0 for g in groups), np.int8, n)
    return cols


def _scalar(text: bytes):
    return int(text) if text[:1] != b'"' else text[1:-1].decode()


def _floor_ns(text: bytes) -> int:
    if text[-4:-3] == b".":
        try:
            return int(text.replace(b".", b""))
        except ValueError:
            pass
    elif b"." not in text:
        try:
            return int(text) * 1000
        except ValueError:
            pass
    return timebase.parse_decimal(text).floor_ns()


def _exact_span(ts_text: bytes, dur_text: bytes) -> tuple[int, int]:
    """(floor ns of ts, ceil ns of ts+dur), fast for Kineto's three-decimal text."""
    if ts_text[-4:-3] == b"." and dur_text[-4:-3] == b".":
        try:
            start = int(ts_text.replace(b".", b""))
            return start, start + int(dur_text.replace(b".", b""))
        except ValueError:
            pass
    elif b"." not in ts_text and b"." not in dur_text:
        try:
            start = int(ts_text) * 1000
            return start, start + int(dur_text) * 1000
        except ValueError:
            pass
    ts = timebase.parse_decimal(ts_text)
    return ts.floor_ns(), (ts + timebase.parse_decimal(dur_text)).ceil_ns()


def importer_bounds(start, end, ts_f, dur_f, int_ts, has_int_dur, int_dur):
    """Conservative [lo, hi] ns bounds: the exact span plus both Perfetto importer variants.

    Integer literals (`int_ts`, `has_int_dur`) are converted exactly, as Perfetto does;
    anything else through a double, rounded (current) or truncated (older versions).
    """
    ts_x = ts_f * 1000.0
    dur_x = dur_f * 1000.0
    ts_round = np.where(int_ts, start, _llround(ts_x))
    ts_trunc = np.where(int_ts, start, np.trunc(ts_x).astype(np.int64))
    dur_round = np.where(has_int_dur, int_dur, _llround(dur_x))
    dur_trunc = np.where(has_int_dur, int_dur, np.trunc(dur_x).astype(np.int64))
    lo = np.minimum(np.minimum(start, ts_round), ts_trunc)
    hi = np.maximum(np.maximum(end, ts_round + dur_round), ts_trunc + dur_trunc)
    return lo, hi


def _llround(x: np.ndarray) -> np.ndarray:
    f = np.floor(x)
    diff = x - f
    up = np.where(x >= 0, diff >= 0.5, diff > 0.5)
    return f.astype(np.int64) + up


def _duplicate_key(raw: bytes) -> str | None:
    """A key that appears twice at the top level of an event (exact, slow path)."""
    found: list[str] = []

    def pairs(items):
        seen = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return dict(items)

    try:
        obj = json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    del obj
    return found[0] if found else None
