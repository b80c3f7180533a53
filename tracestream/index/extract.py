"""What one chunk of events contains: the index pass's work, as a pure function.

`observe_chunk(data, offset, context)` validates a chunk (JSON syntax, UTF-8,
field types) and decodes it in one msgspec call into small structs that keep
`ts`/`dur` as their exact number text. It returns `ChunkFacts`: packed numpy
records for the events the plan needs (GPU activity and scopes, flows, thread
metadata), the first other event per track, anchor matches and counters.

It runs in worker processes, so everything it returns is picklable and numbered
chunk-locally (event index within the chunk, local track and group tables);
the index builder maps that to global ids.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import orjson
from isal import isal_zlib

from tracestream import _native
from tracestream.index import timebase
from tracestream.index.keyscan import (
    CAREFUL,
    SPLICE_FIELDS,
    SPLICE_KEYS,
    EventKeys,
    KeyScan,
    separators,
    splice_positions,
)
from tracestream.index.matches import AS_TEXT, MATCH_DTYPE, number_forms
from tracestream.index.records import take_rows
from tracestream.model import (
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
from tracestream.parallel.slots import received_view

FLOW = 8  # candidate kind of flow events
NEXT_FLOW = 10  # sweep kind of an `f` without "bp": "e" (binds to the next slice, not its own)
META = 9  # candidate kind of thread metadata events

CANDIDATE_DTYPE = np.dtype([("index", "<i4"), ("offset", "<i8"), ("length", "<i4"),
                            ("kind", "i1"), *SPLICE_FIELDS])
SLICE_DTYPE = np.dtype([
    ("cand", "<i4"), ("track", "<i4"), ("group", "<i4"), ("kind", "i1"),
    ("start", "<i8"), ("end", "<i8"), ("lo", "<i8"), ("hi", "<i8"),
])
SLICE_SUMMARY_DTYPE = np.dtype([
    ("track", "<i4"), ("group", "<i4"), ("kind", "i1"), ("lo", "<i8"), ("hi", "<i8"),
])
"""What the read-only commands keep of a slice (stats and peak overlaps): half the bytes
each result carries back from a worker."""
FLOW_DTYPE = np.dtype([("cand", "<i4"), ("track", "<i4"), ("ts", "<i8"), ("id", "<i8"),
                       ("binds_next", "?")])

SCOPES = "scopes"
NO_ID = np.iinfo(np.int64).min


class _Args(msgspec.Struct, gc=False):
    device: Any = None
    stream: Any = None
    provenance: Any = msgspec.field(default=msgspec.UNSET, name=PROVENANCE_KEY)


class ReadEvent(msgspec.Struct, gc=False):
    """The fields every event is classified by (everything else is skipped, but validated):
    all that the read-only commands read."""

    ph: str | None = None
    cat: Any = None
    name: Any = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: msgspec.Raw = msgspec.Raw()  # the exact number text
    dur: msgspec.Raw = msgspec.Raw()
    args: _Args | None = None


class Event(ReadEvent, gc=False):
    """`ReadEvent` and what binding a flow reads (the rewrite's index pass)."""

    id: Any = None
    bp: Any = None


_EVENTS = msgspec.json.Decoder(list[Event])
_READ_EVENTS = msgspec.json.Decoder(list[ReadEvent])
"""`id` and `bp` accept any value: skipping them refuses the same inputs, and saves ~3% of
the decode where nothing binds flows."""
_EVENT = msgspec.json.Decoder(Event)
"""One event of a scanned chunk, decoded where Python code reads it (see decode_chunk)."""
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_INTERPRETED_KEYS = (b'"ts"', b'"dur"', b'"pid"', b'"tid"', b'"name"', b'"cat"', b'"ph"')
_MOVED_KEYS = _INTERPRETED_KEYS[:4]
_OTHER_PHASE, _COMPLETE, _METADATA, _FLOW = range(4)
_PHASE_CODES = {"X": _COMPLETE, "M": _METADATA, **dict.fromkeys(FLOW_PHASES, _FLOW)}


@dataclass
class Context:
    """What every chunk needs to know (sent along with each chunk)."""

    patterns: dict[str, re.Pattern] = field(default_factory=dict)
    count_names: bool = False
    moves_gpu: bool = False  # compaction: refuse GPU events with duplicate keys
    records: bool = True  # the candidates' byte spans (the rewrite pass needs them)
    bounds: bool = True  # the importer bounds of GPU slices (lanes, peaks, time spans)
    checksum: bool = False  # the CRC-32 of the chunk's bytes (the pass is checksummed by parts)
    track_facts: bool = True  # other events on tracks and the provenance key (not anchors)


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
class DuplicateInFlow:
    """First flow event on a track with a key spelled twice (once escaped counts)."""

    ordinal: int
    key: str


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
    origin: tuple[float, str] | None  # smallest ts of the chunk (float, exact text)
    tracks: list[tuple]  # local track id -> (pid, tid)
    groups: list[tuple]  # local group id -> (pid, device or SCOPES)
    candidates: np.ndarray  # CANDIDATE_DTYPE, in file order
    slices: np.ndarray  # SLICE_DTYPE (SLICE_SUMMARY_DTYPE without ctx.records)
    flows: np.ndarray  # FLOW_DTYPE (none without ctx.records)
    flow_ids: dict[int, Any]  # local candidate -> id, for ids that are not integers
    thread_meta: list[MetaEvent]
    process_meta: list[tuple[Any, str, Any]]
    other_on_track: dict[int, OtherOnTrack]  # local track -> first other event
    duplicate_flows: dict[int, DuplicateInFlow]  # local track -> first flow with a duplicate
    matches: dict[str, tuple]  # pattern -> (MATCH_DTYPE rows, names, streams, texts), chunk-local
    guides: list[GuideEvent]
    provenance: int | None
    kernel_names: dict[int, Counter]  # local group -> names
    cpu_annotations: Counter
    flow_categories: Counter
    phase_counts: Counter
    odd_values: int = 0  # events with a ts/dur nothing reads that is not a usable number
    first_odd: tuple[int, str] | None = None  # (local index, what is odd) of the first
    crc32: int | None = None  # of the chunk's bytes, with Context.checksum


class BadCut(Exception):
    """The chunk's cut lies inside a string or nested value (or past the event array)."""

    def __init__(self, array_ends_at: int | None = None):
        super().__init__("bad cut")
        self.array_ends_at = array_ends_at

    def __reduce__(self):  # raised in a worker, it is pickled back to the parent
        return type(self), (self.array_ends_at,)


class ChunkError(Exception):
    """Malformed input inside a chunk: `local` is the event index in the chunk (or None)."""

    def __init__(self, message: str, offset: int, local: int | None):
        super().__init__(message)
        self.message = message
        self.offset = offset
        self.local = local

    def __reduce__(self):  # raised in a worker, it is pickled back to the parent: by default
        # as ChunkError(message), which fails and breaks the process pool
        return type(self), (self.message, self.offset, self.local)


def decode_chunk(data: bytes, offset: int, doc=None, decoder=_EVENTS) -> list[Event]:
    """The chunk's events; BadCut if the cut was wrong, ChunkError if the input is malformed.

    `doc`: the chunk between `[` and `]` where the caller has it so (else it is made
    where msgspec decodes it).
    `decoder`: `_EVENTS`, or `_READ_EVENTS` where no flow is bound (see `decoder_for`).
    With the C extension the events are its scan (a sequence of msgspec's Event, see
    `speedups`), unless it declines the chunk.
    """
    native = _native.native
    if native is not None:
        scanned = native.scan_events(data if doc is None else doc, msgspec.json.decode,
                                     _EVENT.decode, msgspec.UNSET, doc is not None)
        if scanned is not None:
            if not scanned.ascii:
                _check_utf8(data, offset)
            return scanned
    if doc is None:
        doc, ascii_only = bracketed(data)
    else:
        ascii_only = data.isascii()
    if not ascii_only:
        _check_utf8(data, offset)
    try:
        return decoder.decode(doc)
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


def _check_utf8(data: bytes, offset: int) -> None:
    """ChunkError where the chunk's bytes are not UTF-8 (JSON text is)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChunkError(f"invalid UTF-8: {exc.reason}", offset + exc.start, None) from None


def bracketed(data: bytes) -> tuple[bytes, bool]:
    """(b"[" + data + b"]", whether data is all ASCII): the chunk as the array the decoder
    reads, made in one copy; the C extension checks the bytes in the same pass (a 2 MB
    chunk is read once, not twice)."""
    if _native.native is not None:
        return _native.native.bracketed(data)
    return b"".join((b"[", data, b"]")), data.isascii()


def _validation_index(exc: msgspec.ValidationError) -> int | None:
    m = re.search(r"at `\$\[(\d+)\]", str(exc))
    return int(m.group(1)) if m else None


def event_spans(data: bytes, count: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) offsets of every event in a validated chunk.

    Every real boundary matches the separator pattern; a match inside a string or a
    nested value would add one, so a count equal to the decoded count proves the
    spans exact. Otherwise the events' exact bytes come from msgspec.
    """
    sep_starts, sep_ends = separators(data)
    if count is None or len(sep_starts) + 1 == count:
        starts = np.empty(len(sep_starts) + 1, np.int64)
        ends = np.empty(len(sep_starts) + 1, np.int64)
        starts[0] = 0
        starts[1:] = sep_ends - 1
        ends[:-1] = sep_starts + 1
        ends[-1] = len(data)
        return starts, ends
    starts_l = []
    ends_l = []
    pos = 0
    for raw in _RAW_LIST.decode(b"".join((b"[", data, b"]"))):
        pos = data.find(b"{", pos)
        starts_l.append(pos)
        pos += len(raw)
        ends_l.append(pos)
    return np.array(starts_l, np.int64), np.array(ends_l, np.int64)


def event_starts(data: bytes, count: int | None) -> list[int]:
    """Offset of every event in a validated chunk (see `event_spans`)."""
    return event_spans(data, count)[0].tolist()


def decoder_for(ctx: Context) -> msgspec.json.Decoder:
    """The events' decoder: flows are bound (their `id` and `bp` read) only where the
    chunk's candidates are numbered for a rewrite (see `_Observer.run`)."""
    return _EVENTS if ctx.records or ctx.moves_gpu else _READ_EVENTS


def observe_chunk(data: bytes, offset: int, ctx: Context, doc=None) -> ChunkFacts:
    """The index pass's view of one chunk (see module docstring; `doc` as decode_chunk's)."""
    events = decode_chunk(data, offset, doc, decoder_for(ctx))
    facts = _Observer(data, offset, ctx, events).run()
    if ctx.checksum:
        facts.crc32 = isal_zlib.crc32(data)
    return facts


def read_span(path: str, offset: int, length: int) -> bytes:
    """Bytes of a plain file, for workers that read their chunk themselves."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    return data


def observe_file_chunk(path: str, offset: int, length: int, ctx: Context) -> ChunkFacts:
    """`observe_chunk` of a span of a plain file (the chunk's bytes never cross a pipe)."""
    return observe_chunk(read_span(path, offset, length), offset, ctx)


def observe_received_chunk(slot: int, length: int, offset: int, ctx: Context) -> ChunkFacts:
    """`observe_chunk` of a chunk the parent put in a shared slot between `[` and `]` (see
    workers.ChunkSlots, index._submit): decoded where it lies, copied out once for the
    byte work."""
    doc = received_view(slot, length + 2)
    return observe_chunk(bytes(doc[1:-1]), offset, ctx, doc)


_CATEGORY_KINDS = CategoryKinds()
"""The process's memo of category kinds, shared by its chunks: a trace has a few
categories, and classifying them afresh for every chunk cost ~2% of a worker's time."""


@dataclass
class FlowColumns:
    """What the index keeps of a chunk's flow events, a column each (`_Observer._flows`)."""

    track_keys: list  # the distinct (pid, tid), in order of first appearance
    track_codes: np.ndarray  # int32 per flow: its key's position in track_keys
    binds_next: np.ndarray  # bool: an `f` without "bp": "e" (see binds_next)
    ids: np.ndarray  # int64, NO_ID where the id is no integer within +-2**62
    categories: Counter  # how often each category (its str when no string) occurs


class _Texts:
    """The `ts` or `dur` texts of a chunk's events, read where one is needed."""

    __slots__ = ("events", "read")

    def __init__(self, events: list[Event], key: str):
        self.events = events
        self.read = attrgetter(key)

    def __getitem__(self, i: int) -> msgspec.Raw:
        return self.read(self.events[i])


class _Observer:
    def __init__(self, data: bytes, offset: int, ctx: Context, events: list[Event]):
        self.data = data
        self.offset = offset
        self.ctx = ctx
        self.events = events
        self._spans: tuple[np.ndarray, np.ndarray] | None = None
        self._scan: KeyScan | None = None  # shared by the duplicate check and the splices
        self._backslashes: np.ndarray | None = None  # where the chunk has one (if it has)
        self.tracks: dict[tuple, int] = {}
        self.groups: dict[tuple, int] = {}
        self.inexact: set[int] = set()  # events whose ts or dur has digits below 1 ns
        self.odd: dict[int, str] = {}  # unread events with an odd ts/dur -> what is odd
        self._kernel_hits: dict | None = None  # name -> patterns, where `_anchor_kernels` ran

    @property
    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        if self._spans is None:
            self._spans = self._scanned_spans() or event_spans(self.data, len(self.events))
        return self._spans

    def _scanned_spans(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The events' spans as the scan found them, where they are event_spans' (a chunk
        from its first event's `{` to its last one's `}`, as chunks are cut); else None."""
        if not hasattr(self.events, "spans") or not len(self.events):
            return None
        starts, ends = (np.frombuffer(b, np.int64) for b in self.events.spans())
        return (starts, ends) if starts[0] == 0 and ends[-1] == len(self.data) else None

    @property
    def scan(self) -> KeyScan:
        if self._scan is None:
            self._scan = KeyScan(self.data)
        return self._scan

    def span(self, i: int) -> tuple[int, int]:
        starts, ends = self.spans
        return int(starts[i]), int(ends[i])

    def raw(self, i: int) -> bytes:
        s, e = self.span(i)
        return self.data[s:e]

    def fail(self, i: int, what: str) -> ChunkError:
        return ChunkError(what, self.offset + int(self.spans[0][i]), i)

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
        n = len(events)
        # msgspec.Raw texts (bytes-like, empty when absent): bytes only where one is read
        ts_texts = _Texts(events, "ts")
        dur_texts = _Texts(events, "dur")
        kinds_of = _CATEGORY_KINDS
        classified = self._classified(kinds_of)
        if classified is not None:
            phase, kind_of, owned, phase_counts = classified
        else:
            phs = [e.ph for e in events]
            phase = np.fromiter(map(_PHASE_CODES.get, phs, repeat(_OTHER_PHASE)), np.int8, n)
            phase_counts = Counter(phs)
            try:
                kind_of = np.fromiter(map(kinds_of.__getitem__, [e.cat for e in events]),
                                      np.int8, n)
            except TypeError:  # an unhashable category: classify one by one
                kind_of = np.fromiter((_kind_of(kinds_of, e.cat) for e in events), np.int8, n)
            owned = np.fromiter((e.pid is not None and e.tid is not None for e in events),
                                bool, n)
        kind_of[phase != _COMPLETE] = -1  # only complete events are activity
        is_slice = (kind_of >= KERNEL) & (kind_of <= GPU_SCOPE)
        # strict only where a value is read: GPU activity is moved and timed, flows are
        # bound, guides are checked; any other event passes through whatever it holds
        read_dur = is_slice | (kind_of == LAYER_GUIDE)
        ts_ns, ts_int, has_ts = self._column("ts", read_dur | (phase == _FLOW))
        dur_ns, dur_int, has_dur = self._column("dur", read_dur)
        slice_at = np.flatnonzero(is_slice)  # for numpy, which would convert the list each time
        slices = slice_at.tolist()
        complete = has_ts[slice_at] & has_dur[slice_at] & owned[slice_at]
        if not complete.all():
            i = slices[int(np.argmin(complete))]
            e = events[i]
            missing = ("ts" if not ts_texts[i] else "dur" if not dur_texts[i]
                       else "pid" if e.pid is None else "tid")
            raise self.fail(i, f"GPU activity event has no `{missing}`")
        is_flow = (phase == _FLOW) & has_ts & owned
        flows = np.flatnonzero(is_flow).tolist()
        is_meta = phase == _METADATA
        metas = np.flatnonzero(is_meta).tolist()
        guides = np.flatnonzero(kind_of == LAYER_GUIDE).tolist()
        other = {}
        if self.ctx.track_facts:
            others = np.flatnonzero(~(is_slice | is_flow | is_meta)).tolist()
            other = self._first_on_track(others)
        annotations = (self._values(np.flatnonzero(kind_of == CPU_ANNOTATION).tolist(), "name")
                       if self.ctx.count_names else [])
        origin = self._chunk_origin(metas, ts_texts, ts_ns, has_ts)
        thread_meta, process_meta, meta_cands = self._metadata(metas)
        cand_index = cand_kind = cand_of = None  # read-only commands rewrite nothing
        if self.ctx.records or self.ctx.moves_gpu:
            cand_index, cand_kind, cand_of = _numbering(kind_of, slice_at, flows, meta_cands)
        event_keys = None
        if self.ctx.moves_gpu:  # compaction: the candidates' keys are counted once, for both
            starts, ends = self.spans
            event_keys = EventKeys(self.scan, starts[cand_index], ends[cand_index],
                                   _MOVED_KEYS + SPLICE_KEYS)
            if slices:
                self._check_gpu_duplicates(slices, cand_of, event_keys)
            duplicate_flows = self._flow_duplicates(flows, cand_of, event_keys)
        else:
            duplicate_flows = {}
        candidates = self._candidates(cand_index, cand_kind, event_keys)
        slice_rows, matches, kernel_names = self._slices(
            slices, slice_at, ts_texts, dur_texts, ts_ns, ts_int, dur_ns, dur_int, kind_of,
            cand_of)
        flow_rows, flow_ids, flow_categories = self._flows(flows, ts_ns, cand_of)
        other_on_track = {
            self.track(*key): OtherOnTrack(i, events[i].ph, events[i].name,
                                           bytes(ts_texts[i]).decode() or None)
            for key, i in other.items()
        }
        guide_events = [self._guide(i) for i in guides]
        return ChunkFacts(
            count=n,
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
            duplicate_flows=duplicate_flows,
            matches=matches,
            guides=guide_events,
            provenance=self._provenance() if self.ctx.track_facts else None,
            kernel_names=kernel_names,
            cpu_annotations=_name_counts(annotations),
            flow_categories=flow_categories,
            phase_counts=phase_counts,
            odd_values=len(self.odd),
            first_odd=min(self.odd.items()) if self.odd else None,
        )

    def _first_on_track(self, others: list[int]) -> dict[tuple, int]:
        """{(pid, tid): the first of `others` on that track}, keyed in order of each track's
        last event, latest first (the order `track` numbers them in); by the C extension
        where it is built."""
        native = _native.native
        if native is None:
            keys = [(self.events[i].pid, self.events[i].tid) for i in others]
            return dict(zip(reversed(keys), reversed(others)))  # first event per track wins
        codes, keys = native.track_keys(self.events, others)
        codes = np.frombuffer(codes, np.int32)
        first = np.unique(codes, return_index=True)[1]  # per code (0, 1, ...): first position
        last = len(codes) - 1 - np.unique(codes[::-1], return_index=True)[1]
        return {keys[code]: others[first[code]] for code in np.argsort(-last).tolist()}

    def _classified(self, kinds: CategoryKinds) -> tuple | None:
        """(phase codes, category kinds, has a pid and a tid, phase counts) of the events,
        from the C extension; None without it, or where it declines (an unhashable
        category, many phases)."""
        if _native.native is None:
            return None
        try:
            phases, kind_codes, owners, counts = _native.native.classify(
                self.events, _PHASE_CODES, _OTHER_PHASE, kinds)
        except TypeError:
            return None
        return (np.frombuffer(phases, np.int8), np.frombuffer(kind_codes, np.int8),
                np.frombuffer(owners, bool), Counter(counts))

    def _column(self, key: str, strict: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact values of the `ts` or `dur` column: (floor ns, integer literal?, present?) per
        event.

        Absent values are 0 (their events are never read). Each value is parsed by
        its own shape: integers and numbers with one to three decimals (Kineto's
        shapes, and floats such as `68.0`) a shape group at a time (by the C
        extension where it is built, else in numpy), anything else
        one by one (and marked in `self.inexact` when it has digits below 1 ns).
        So `"ts": 0` on metadata among epoch values with three decimals costs its
        own event, not its chunk. Non-numbers and values out of range are refused
        where `strict` (the value is read); elsewhere they count as absent and are
        noted in `self.odd`.
        """
        if _native.native is not None:
            ns, shapes = _native.native.decimal_column(self.events, key, key != "dur")
            ns, shapes = np.frombuffer(ns, np.int64), np.frombuffer(shapes, np.int8)
        else:
            ns, shapes = kineto_column(list(map(attrgetter(key), self.events)),
                                       signed=key != "dur")
        integer = shapes == SHAPE_INTEGER
        has = (shapes == SHAPE_INTEGER) | (shapes == SHAPE_DECIMAL)
        odd = np.flatnonzero(shapes == SHAPE_OTHER)
        if len(odd):
            self._parse_one_by_one(odd.tolist(), key, strict, ns, integer, has)
        return ns, integer, has

    def _refuse_end_out_of_range(self, slices, start, dur, ts_texts, dur_texts) -> None:
        """ts and dur each fit, their sum may not: an end past Perfetto's int64 nanoseconds
        would wrap (and pack overlapping slices on one lane)."""
        past = end_out_of_range(start, dur)
        if past.any():
            k = int(np.argmax(past))
            i = slices[k]
            e = self.events[i]
            raise self.fail(i, f"ts {bytes(ts_texts[i]).decode()} + dur "
                               f"{bytes(dur_texts[i]).decode()} (pid {_quoted(e.pid)} tid "
                               f"{_quoted(e.tid)}) ends out of range: an end must stay below "
                               f"{timebase.MAX_ABS_US:.2g} µs (64-bit nanoseconds)")

    def _parse_one_by_one(self, events: list[int], key: str, strict: np.ndarray,
                          ns: np.ndarray, integer: np.ndarray, has: np.ndarray) -> None:
        """Values of `key` of the given events in no Kineto shape, parsed exactly one at a
        time into the columns (refused where `strict`, else noted as odd)."""
        for i in events:
            t = bytes(getattr(self.events[i], key))
            value, problem = _time_value(t, key)
            if problem is not None:
                if strict[i]:
                    raise self.fail(i, problem)
                self.odd.setdefault(i, problem)
                continue
            floor = value.floor_ns()
            if floor != value.ceil_ns():
                self.inexact.add(i)
            ns[i] = floor
            integer[i] = timebase.is_integer_text(t)
            has[i] = True

    def _chunk_origin(self, metas, ts_texts, ts_ns, has_ts) -> tuple[int, str] | None:
        """The smallest ts of the chunk's events (metadata excluded): (floor ns, exact text)."""
        usable = has_ts.copy()
        usable[metas] = False
        if not usable.any():
            return None
        low = ts_ns[usable].min()
        tied = np.flatnonzero(usable & (ts_ns == low)).tolist()
        best = min(tied, key=lambda i: timebase.parse_decimal(bytes(ts_texts[i])))
        return int(low), bytes(ts_texts[best]).decode()

    # -- assembling the facts ---------------------------------------------------

    def _candidates(self, index: np.ndarray, kinds: np.ndarray,
                    keys: EventKeys | None) -> np.ndarray:
        """Spans of every rewrite candidate, in file order (none without `ctx.records`), with
        where compaction splices them (`keys`, when it does)."""
        rows = np.empty(len(index) if self.ctx.records else 0, CANDIDATE_DTYPE)
        if len(rows):
            starts, ends = self.spans
            rows["index"] = index
            rows["offset"] = starts[index] + self.offset
            rows["length"] = ends[index] - starts[index]
            rows["kind"] = kinds
            if keys is not None:
                where = splice_positions(keys)
                for name in where.dtype.names:
                    rows[name] = where[name]
            else:  # nothing is relocated
                for name, _ in SPLICE_FIELDS:
                    rows[name] = CAREFUL
        return rows

    def _slices(self, slices, slice_at, ts_texts, dur_texts, ts_ns, ts_int, dur_ns, dur_int,
                kind_of, cand_of) -> tuple:
        patterns = self.ctx.patterns
        matches: dict[str, tuple] = {}
        kernel_names: dict[int, Counter] = {}
        n = len(slices)
        dtype = SLICE_DTYPE if self.ctx.records else SLICE_SUMMARY_DTYPE
        rows = np.empty(n, dtype)
        if not n:
            return rows, {}, kernel_names
        events = self.events
        kind_a = kind_of[slice_at]
        idx = slice_at
        every_slice = self.ctx.bounds or self.ctx.records or self.ctx.count_names
        ids = self._slice_ids(slices, kind_a) if every_slice else None
        sev = None  # the slices' events, where a step reads them one by one
        if ids is None:
            # `anchors` keeps no per-slice facts: only the matched kernels go on
            keep = None if every_slice else self._anchor_kernels(slices, kind_a)
            if keep is not None:
                slices = [slices[k] for k in keep]
                kind_a = kind_a[keep]
                rows = np.empty(len(slices), dtype)
            sev = [events[i] for i in slices]
            kind_list = kind_a.tolist()
            devices = [SCOPES if k == GPU_SCOPE else
                       (e.args.device if e.args is not None else None)
                       for e, k in zip(sev, kind_list)]
            try:
                set(devices)
            except TypeError:  # an object or array as args.device
                k = next(k for k, d in enumerate(devices) if not _hashable(d))
                raise self.fail(slices[k], "`args.device` of a GPU event must be a number or "
                                           f"a string, not {_json_type(devices[k])}") from None
            if not every_slice and keep is None:
                keep = self._matching(slices, sev, kind_list)
                slices = [slices[k] for k in keep]
                sev = [sev[k] for k in keep]
                devices = [devices[k] for k in keep]
                kind_a = kind_a[keep]
                rows = np.empty(len(slices), dtype)
            pids = [e.pid for e in sev]
            tracks = _intern(self.track, list(zip(pids, [e.tid for e in sev])))
            groups = _intern(self.group, list(zip(pids, devices)))
            idx = np.array(slices, np.int64)  # fewer, where only the matched kernels go on
        else:
            tracks, groups = ids
        start = ts_ns[idx]
        dur = dur_ns[idx]
        self._refuse_end_out_of_range(slices, start, dur, ts_texts, dur_texts)
        end = start + dur
        inexact = [k for k, i in enumerate(slices) if i in self.inexact] if self.inexact else []
        for k in inexact:  # digits below 1 ns: the exact sum, rounded up
            i = slices[k]
            ts = timebase.parse_decimal(bytes(ts_texts[i]))
            end[k] = (ts + timebase.parse_decimal(bytes(dur_texts[i]))).ceil_ns()
        if self.ctx.bounds:
            ts_f = _doubles(start, ts_texts, slices, inexact)
            dur_f = _doubles(dur, dur_texts, slices, inexact)
            lo, hi = importer_bounds(start, end, ts_f, dur_f, ts_int[idx], dur_int[idx], dur)
        else:
            lo, hi = start, end
        rows["track"] = tracks
        rows["group"] = groups
        rows["kind"] = kind_a
        rows["lo"] = lo
        rows["hi"] = hi
        if self.ctx.records:
            rows["cand"] = cand_of[idx]
            rows["start"] = start
            rows["end"] = end
        kernels = np.flatnonzero(kind_a == KERNEL).tolist()
        if not kernels:
            return rows, matches, kernel_names
        if self.ctx.count_names:
            kernel_names = self._kernel_names(slices, kernels, groups)
        if patterns:
            matches = self._matches(slices, kernels, start, dur, tracks, groups)
        return rows, matches, kernel_names

    def _kernel_names(self, slices, kernels, groups) -> dict[int, Counter]:
        """How often each kernel name occurs, per (chunk-local) group."""
        if _native.native is not None:
            try:
                counted = _native.native.name_counts(self.events, slices, kernels, groups)
                return {group: Counter(counts) for group, counts in counted.items()}
            except TypeError:  # an object or array as a name: counted by its JSON text below
                pass
        names = [self.events[slices[k]].name for k in kernels]
        kernel_groups = [groups[k] for k in kernels]
        distinct = dict.fromkeys(kernel_groups)
        return {group: _name_counts(names if len(distinct) == 1 else [  # mostly one group
                    name for name, g in zip(names, kernel_groups) if g == group])
                for group in distinct}

    def _slice_ids(self, slices: list[int], kinds: np.ndarray) -> tuple[list, list] | None:
        """The slices' track and group ids, as `_intern` gives them, from the C extension
        (`kinds`: their category kinds; None without it, or where a device cannot be a key:
        the caller refuses it)."""
        if _native.native is None:
            return None
        try:
            track_codes, track_keys, group_codes, group_keys = _native.native.slice_keys(
                self.events, slices, kinds == GPU_SCOPE, SCOPES)
        except TypeError:
            return None
        tracks, groups = self.tracks, self.groups  # numbered as track() and group() do
        track_ids = np.array([tracks.setdefault(key, len(tracks)) for key in track_keys],
                             np.int64)
        group_ids = np.array([groups.setdefault(key, len(groups)) for key in group_keys],
                             np.int64)
        return (track_ids[np.frombuffer(track_codes, np.int32)].tolist(),
                group_ids[np.frombuffer(group_codes, np.int32)].tolist())

    def _hits(self, slices, sev, kernels, names) -> dict:
        """The patterns each distinct kernel name matches (names that match none left out)."""
        try:
            unique = set(names)
        except TypeError:  # an object or array as a kernel name
            k = kernels[next(j for j, name in enumerate(names) if not _hashable(name))]
            raise self.fail(slices[k], "a kernel `name` must be a string (--anchor-regex "
                                       f"matches names), not {_json_type(sev[k].name)}") from None
        return self._pattern_hits(unique)

    def _pattern_hits(self, unique) -> dict:
        hits = {}
        for name in unique:
            text = name if isinstance(name, str) else str(name)
            found = [p for p, rx in self.ctx.patterns.items() if rx.search(text)]
            if found:
                hits[name] = found
        return hits

    def _anchor_kernels(self, slices, kind_a) -> list[int] | None:
        """`_matching` from the C extension, once every slice's device is known to be a key;
        None without it, or where a device or name is odd (the Python path refuses it)."""
        native = _native.native
        if native is None or not self.ctx.patterns:
            return None
        events = self.events
        if native.first_unhashable_device(events, slices, kind_a == GPU_SCOPE) is not None:
            return None
        kernels = np.flatnonzero(kind_a == KERNEL).tolist()
        try:
            counted = native.name_counts(events, slices, kernels, [0] * len(slices))
        except TypeError:
            return None
        self._kernel_hits = self._pattern_hits(counted.get(0, {}))
        return native.named(events, slices, kernels, self._kernel_hits)

    def _matching(self, slices, sev, kind_list) -> list[int]:
        """Positions (among the slices) of the kernels whose name matches a pattern."""
        if not self.ctx.patterns:
            return []
        kernels = [k for k, kind in enumerate(kind_list) if kind == KERNEL]
        names = [sev[k].name for k in kernels]
        hits = self._hits(slices, sev, kernels, names)
        return [k for k, name in zip(kernels, names) if name in hits]

    def _matched_kernels(self, slices, kernels) -> tuple[list[int], dict]:
        """The kernels whose name matches a pattern (positions among the slices, in order),
        and the patterns each distinct name matches (see `_hits`)."""
        if self._kernel_hits is not None:  # `_anchor_kernels` kept the matched kernels only
            return kernels, self._kernel_hits
        native = _native.native
        if native is not None:
            try:
                counted = native.name_counts(self.events, slices, kernels, [0] * len(slices))
            except TypeError:  # an object or array as a name: refused below
                pass
            else:
                hits = self._pattern_hits(counted.get(0, {}))
                return native.named(self.events, slices, kernels, hits), hits
        sev = [self.events[slices[k]] for k in kernels]
        names = [e.name for e in sev]
        hits = self._hits([slices[k] for k in kernels], sev, range(len(kernels)), names)
        return [k for k, name in zip(kernels, names) if name in hits], hits

    def _values(self, events: list[int], key: str) -> list:
        """The `key` field of each of the events (by the C extension where it is built: it
        reads a scan's values where they lie, see decode_chunk)."""
        if _native.native is not None:
            return _native.native.event_values(self.events, events, key)
        return [getattr(self.events[i], key) for i in events]

    def _match_keys(self, events: list[int]) -> tuple:
        """(stream codes, streams, name codes, names) of the matched events: each one's
        args.stream and name as a code into the distinct (type, value) keys, in order of
        first appearance; an object or array as a stream is refused."""
        native = _native.native
        if native is not None:
            try:
                stream_codes, stream_keys, name_codes, name_keys = native.match_keys(
                    self.events, events)
            except TypeError:  # an object or array as a stream: refused below
                pass
            else:
                return (np.frombuffer(stream_codes, np.int32), [x for _, x in stream_keys],
                        np.frombuffer(name_codes, np.int32), [x for _, x in name_keys])
        matched = [self.events[i] for i in events]
        stream_ids: dict = {}
        streams = [a.stream if a is not None else None for a in (e.args for e in matched)]
        try:
            stream_codes = [stream_ids.setdefault((type(x), x), len(stream_ids))
                            for x in streams]
        except TypeError:  # an object or array as args.stream
            j = next(j for j, x in enumerate(streams) if not _hashable(x))
            raise self.fail(events[j], "`args.stream` of a matched kernel must be a number or "
                                       f"a string, not {_json_type(streams[j])}") from None
        name_ids: dict = {}
        name_codes = [name_ids.setdefault((type(e.name), e.name), len(name_ids))
                      for e in matched]
        return (stream_codes, [stream for _, stream in stream_ids], name_codes,
                [name for _, name in name_ids])

    def _matches(self, slices, kernels, start, dur, tracks, groups) -> dict[str, tuple]:
        """Kernels whose name matches a pattern, packed (see matches.MatchTable)."""
        patterns = self.ctx.patterns
        found, hits = self._matched_kernels(slices, kernels)  # positions among the slices
        events = [slices[k] for k in found]
        self._check_duplicates(events)
        stream_codes, streams_list, name_codes, names_list = self._match_keys(events)
        at = np.array(found, np.int64)
        ts_of = list(map(bytes, self._values(events, "ts")))
        dur_of = list(map(bytes, self._values(events, "dur")))
        forms = number_forms(ts_of, dur_of, start[at], dur[at])
        packed = np.empty(len(found), MATCH_DTYPE)
        packed["ordinal"] = events
        packed["track"] = [tracks[k] for k in found]
        packed["group"] = [groups[k] for k in found]
        packed["start"] = start[at]
        packed["dur"] = dur[at]
        packed["form"] = forms
        packed["stream"] = stream_codes
        packed["name"] = name_codes
        as_text = {j: (ts_of[j].decode(), dur_of[j].decode())
                   for j in np.flatnonzero(forms == AS_TEXT).tolist()}
        out = {}
        everywhere = all(len(hits[n]) == len(patterns) for n in names_list)
        for p in patterns:
            if everywhere:
                rows, texts = packed, as_text  # every match is a match of every pattern
            else:
                keep = np.flatnonzero(np.array([p in hits[n] for n in names_list],
                                               bool)[packed["name"]])
                rows = take_rows(packed, keep)
                texts = {new: as_text[old] for new, old in enumerate(keep.tolist())
                         if old in as_text} if as_text else {}
            out[p] = (rows, names_list, streams_list, texts)
        return out

    def _check_gpu_duplicates(self, slices, cand_of, keys: EventKeys) -> None:
        """Compaction moves GPU events by their pid, tid, ts and dur: a duplicate is refused.

        The keys' positions in the chunk (see keyscan) give each GPU event's count of
        each key; only an event with more than one (a duplicate, or the key nested in
        `args` or inside a string) or with a backslash (a key may be spelled with
        escapes) is looked at with a parser, which decodes every key.
        """
        suspect = self._suspects(slices, cand_of, keys)
        for k in np.flatnonzero(suspect).tolist():
            dup = duplicate_key(self.raw(slices[k]))
            if dup is not None:
                raise self.fail(slices[k], f"duplicate key `{dup}` in a GPU event (which value "
                                           "would a reader take?)")

    def _flow_duplicates(self, flows: list[int], cand_of,
                         keys: EventKeys) -> dict[int, DuplicateInFlow]:
        """Per track, the first flow with a duplicate key: compaction moves flows of GPU
        streams, and refuses one (the plan knows which tracks move; see `_check_gpu_duplicates`
        for how the few suspects are found)."""
        if not flows:
            return {}
        suspect = self._suspects(flows, cand_of, keys)
        found: dict[int, DuplicateInFlow] = {}
        for k in np.flatnonzero(suspect).tolist():
            i = flows[k]
            dup = duplicate_key(self.raw(i))
            track = self.track(self.events[i].pid, self.events[i].tid)
            if dup is not None and track not in found:
                found[track] = DuplicateInFlow(i, dup)
        return found

    def _suspects(self, events: list[int], cand_of, keys: EventKeys) -> np.ndarray:
        """Per event: may it spell a moved key twice? (more than one occurrence of one, or a
        backslash, since `"t\\u0069d"` is "tid")."""
        at = cand_of[events]
        return self._spelled_twice(events, [keys(key)[1][at] for key in _MOVED_KEYS])

    def _spelled_twice(self, events: list[int], counts: list[np.ndarray]) -> np.ndarray:
        """Per event: a key counted more than once (`counts`: per key, per event), or a
        backslash in it."""
        suspect = np.zeros(len(events), bool)
        for count in counts:
            suspect |= count > 1
        if b"\\" in self.data:
            if self._backslashes is None:
                self._backslashes = np.flatnonzero(np.frombuffer(self.data, np.uint8) == 0x5C)
            starts, ends = self.spans
            suspect |= _holding(self._backslashes, starts[events], ends[events])
        return suspect

    def _check_duplicates(self, events: list[int]) -> None:
        """Anchors and terminals are interpreted: a duplicate key in one is refused.

        Each interpreted key is counted in each matched event's bytes alone (one pass of
        the C extension where it is built; see keyscan.EventKeys); only an event that
        holds one more than once (a duplicate, or the key inside a string or a nested
        object) or a backslash (a key may be spelled with escapes) is parsed.
        """
        if not events:
            return
        starts, ends = self.spans
        at = np.array(events, np.int64)  # converted once, not by each index below
        keys = EventKeys(self.scan, starts[at], ends[at], _INTERPRETED_KEYS)
        counts = [keys(key)[1] for key in _INTERPRETED_KEYS]
        for k in np.flatnonzero(self._spelled_twice(at, counts)).tolist():
            dup = duplicate_key(self.raw(events[k]))
            if dup is not None:
                raise self.fail(events[k], f"duplicate key `{dup}` in a kernel that "
                                           "--anchor-regex or --end-anchor-regex matches")

    def _flows(self, flows, ts_ns, cand_of) -> tuple:
        if not flows:
            return np.zeros(0, FLOW_DTYPE), {}, Counter()
        if cand_of is None:  # no rewrite: only `inspect` reports the categories (and the
            # read-only decode has no `id` or `bp` to bind by)
            categories = (_category_counts(map(self.events.__getitem__, flows))
                          if self.ctx.count_names else Counter())
            return np.zeros(0, FLOW_DTYPE), {}, categories
        columns = self._flow_columns(flows)
        rows = np.empty(len(flows), FLOW_DTYPE)
        at = np.array(flows, np.int64)  # converted once, not by each index below
        rows["cand"] = cand_of[at]
        tracks = np.array([self.track(*key) for key in columns.track_keys], np.int64)
        rows["track"] = tracks[columns.track_codes]  # numbered as _intern numbers them
        rows["ts"] = ts_ns[at]
        rows["binds_next"] = columns.binds_next
        rows["id"] = columns.ids
        ids: dict[int, Any] = {}  # candidate -> id, for ids that are no such integer
        for k in np.flatnonzero(rows["id"] == NO_ID).tolist():
            ids[int(rows["cand"][k])] = self.events[flows[k]].id
        return rows, ids, columns.categories

    def _flow_columns(self, flows: list[int]) -> FlowColumns:
        """The flows' (pid, tid) keys, whether each binds to the next slice, their ids
        packed and their category counts (see FlowColumns); by the C extension where it
        is built."""
        native = _native.native
        if native is not None:
            codes, keys, binds, packed, categories = native.flow_columns(self.events, flows,
                                                                         NO_ID)
            return FlowColumns(keys, np.frombuffer(codes, np.int32), np.frombuffer(binds, bool),
                               np.frombuffer(packed, np.int64), Counter(categories))
        fev = [self.events[i] for i in flows]
        pairs = [(e.pid, e.tid) for e in fev]
        code = {key: k for k, key in enumerate(dict.fromkeys(pairs))}
        fids = [e.id for e in fev]
        return FlowColumns(
            list(code), np.array([code[pair] for pair in pairs], np.int32),
            np.array([binds_next(e.ph, e.bp) for e in fev], bool),
            np.array([fid if type(fid) is int and -(2**62) < fid < 2**62 else NO_ID
                      for fid in fids], np.int64),
            _category_counts(fev))

    def _metadata(self, metas: list[int]) -> tuple[list, list, list]:
        thread_meta = []
        process_meta = []
        cands = []
        for i in metas:
            e = self.events[i]
            name = e.name
            if not isinstance(name, str):
                continue
            if name.startswith("thread_"):
                s, end = self.span(i)
                raw = self.data[s:end]
                args = orjson.loads(raw).get("args")
                args = args if isinstance(args, dict) else {}
                value = args.get("name", args.get("sort_index"))
                thread_meta.append(
                    MetaEvent(i, self.offset + s, end - s, e.pid, e.tid, name, value, raw))
                self.track(e.pid, e.tid)
                cands.append(i)
            elif name in ("process_name", "process_labels", "process_sort_index"):
                args = orjson.loads(self.raw(i)).get("args")
                args = args if isinstance(args, dict) else {}
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
        """The first event whose args hold the provenance key (whatever its value)."""
        unset = msgspec.UNSET
        if _native.native is not None:
            return _native.native.first_set(self.events, "args", "provenance", unset)
        return next((i for i, e in enumerate(self.events)
                     if e.args is not None and e.args.provenance is not unset), None)


_NUMBER_BYTES = np.zeros(256, bool)
_NUMBER_BYTES[list(b"0123456789.-")] = True
_MAX_DIGITS = 16  # integer digits of a value below 9e15 µs (the first of 16 at most 8)


def binds_next(ph: Any, bp: Any) -> bool:
    """Perfetto binds an `f` without `"bp": "e"` to the next slice that begins at or after it
    on its track; `s`, `t` and `f` with `"bp": "e"` to the slice enclosing it."""
    return ph == "f" and bp != "e"


def _category_counts(events) -> Counter:
    """How often each flow category occurs (its str when it is no string), as the C
    extension's flow_columns counts them.

    Counted as they are in one C-level pass where every category is a string (almost
    always); otherwise one by one, as their str (`1` and `"1"` are one category, `1`
    and `true` two, though they are equal as keys).
    """
    events = list(events)
    try:
        counts = Counter(map(_CATEGORY, events))
    except TypeError:  # an object or array as a category
        counts = None
    if counts is not None and all(type(cat) is str for cat in counts):
        return counts
    return Counter(e.cat if isinstance(e.cat, str) else str(e.cat) for e in events)


_CATEGORY = attrgetter("cat")


def _holding(positions: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per event [start, end): does one of the (ascending) `positions` lie in it?"""
    return np.searchsorted(positions, ends) > np.searchsorted(positions, starts)


SHAPE_ABSENT, SHAPE_INTEGER, SHAPE_DECIMAL, SHAPE_OTHER = 0, 1, 2, 3
"""The shape of one ts/dur text, as the C extension's decimal_column codes it."""
MAX_FAST_DECIMALS = 3
"""Decimals a value may have and still be read as a column: 1 to 3 are exact in ns (Kineto
writes three; older exporters write floats such as `68.0`)."""


def kineto_shapes(blob: bytes, lengths: np.ndarray, *, signed: bool) -> np.ndarray:
    """Per text (JSON values of `lengths` bytes each, joined by commas in `blob`): its
    shape, SHAPE_DECIMAL for a number with one to three decimals, SHAPE_INTEGER for an
    integer, both below 9e15 µs (and not negative unless `signed`), else SHAPE_OTHER."""
    return _shapes_and_decimals(blob, lengths, signed=signed)[0]


def _shapes_and_decimals(blob: bytes, lengths: np.ndarray, *,
                         signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """`kineto_shapes` and each text's number of decimals (0 for the other shapes).

    The texts are valid JSON, so a text of only digits, `.` and `-` is a number
    without an exponent; counting its bytes of each kind and indexing its first
    byte and the bytes where a dot may stand settles the rest, for every text at once.
    """
    view = np.frombuffer(blob, np.uint8)
    ends = np.cumsum(lengths + 1) - 1  # each text's comma (or the blob's end)
    starts = ends - lengths

    def per_text(mask: np.ndarray) -> np.ndarray:
        counts = np.zeros(len(view) + 1, np.int64)
        np.cumsum(mask, out=counts[1:])
        return counts[ends] - counts[starts]

    odd_bytes = per_text(~_NUMBER_BYTES[view])
    dots = per_text(view == 0x2E)
    minus = per_text(view == 0x2D)
    negative = view[starts] == 0x2D
    decimals = np.zeros(len(lengths), np.int64)
    for d in range(MAX_FAST_DECIMALS, 0, -1):  # the first dot from the end wins, as in C
        dot = (lengths >= d + 2) & (view[np.maximum(ends - d - 1, 0)] == 0x2E)
        decimals[dot] = d
    decimal = (decimals > 0) & (dots == 1)
    digits = lengths - negative - np.where(decimal, decimals + 1, 0)
    first_digit = view[np.minimum(starts + negative, len(view) - 1)]
    regular = ((odd_bytes == 0) & (minus == negative) & ((dots == 0) | decimal)
               & (digits >= 1) & (digits <= _MAX_DIGITS)
               & ~((digits == _MAX_DIGITS) & (first_digit > ord("8"))))
    if not signed:
        regular &= ~negative
    shapes = np.where(regular, np.where(decimal, SHAPE_DECIMAL, SHAPE_INTEGER), SHAPE_OTHER)
    return shapes.astype(np.int8), np.where(regular & decimal, decimals, 0)


def kineto_column(texts: list, *, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """The numpy twin of the C extension's decimal_column: (ns, shape) per text (empty
    where absent), the values of each regular shape parsed a group at a time."""
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    shapes = np.zeros(len(texts), np.int8)  # SHAPE_ABSENT
    ns = np.zeros(len(texts), np.int64)
    present = np.flatnonzero(lengths)
    if not len(present):
        return ns, shapes
    whole = len(present) == len(texts)
    chosen = texts if whole else list(map(texts.__getitem__, present.tolist()))
    blob = b",".join(chosen)
    shapes[present], decimals_present = _shapes_and_decimals(blob, lengths[present],
                                                             signed=signed)
    decimals = np.zeros(len(texts), np.int64)
    decimals[present] = decimals_present
    for places in range(MAX_FAST_DECIMALS + 1):  # 0: the integers
        at = np.flatnonzero((shapes == (SHAPE_DECIMAL if places else SHAPE_INTEGER))
                            & (decimals == places))
        if not len(at):
            continue
        group = blob if len(at) == len(chosen) else b",".join(map(texts.__getitem__, at.tolist()))
        ns[at] = _ints(group.replace(b".", b"") if places else group) * 10 ** (3 - places)
    return ns, shapes


def _ints(blob: bytes) -> np.ndarray:
    """Comma-separated decimal integers (already validated) as int64, in C."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return np.fromstring(blob, dtype=np.int64, sep=",")


def double_values(ns: np.ndarray, texts: list) -> np.ndarray:
    """double(text) of each text from its exact nanoseconds `ns` (see `_doubles`)."""
    return _doubles(ns, texts, range(len(texts)), [])


def _doubles(ns: np.ndarray, texts: list, events, inexact: list[int]) -> np.ndarray:
    """double(text) for each value, computed from its exact nanoseconds without rounding twice
    (value k is events[k]'s, whose text is texts[events[k]]).

    Below 2**53 ns the integer is exact in a double and one division rounds
    correctly. Above, q + r/1000 is exact while q is in [1000, 2**52) µs. The
    rest (and values with digits below 1 ns) are converted from their text.
    """
    out = ns.astype(np.float64) / 1000.0
    big = np.abs(ns) >= 2**53
    if big.any():
        q, r = np.divmod(ns[big], 1000)
        out[big] = q.astype(np.float64) + r.astype(np.float64) / 1000.0
        unsafe = np.flatnonzero(big)[(np.abs(q) < 1000) | (np.abs(q) >= 2**52)].tolist()
        for k in unsafe:
            out[k] = float(bytes(texts[events[k]]))
    for k in inexact:
        out[k] = float(bytes(texts[events[k]]))
    return out


def _numbering(kinds: np.ndarray, slices: list[int], flows: list[int],
               metas: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rewrite candidates among a chunk's events (`kinds` their category kinds): their
    event indices in file order, their candidate kinds (a GPU slice's category kind, FLOW,
    META), and per event its candidate number (or -1)."""
    kind_of = np.full(len(kinds), -1, np.int8)
    kind_of[slices] = kinds[slices]
    kind_of[flows] = FLOW
    kind_of[metas] = META
    index = np.flatnonzero(kind_of >= 0)
    cand_of = np.full(len(kinds), -1, np.int64)
    cand_of[index] = np.arange(len(index))
    return index, kind_of[index], cand_of


def _name_counts(names: list) -> Counter:
    """How often each name occurs; an object or array as a name is counted by its JSON text."""
    try:
        return Counter(names)
    except TypeError:
        return Counter(name if _hashable(name) else orjson.dumps(name).decode()
                       for name in names)


def _hashable(value) -> bool:
    """False for the JSON objects and arrays msgspec decodes into dicts and lists."""
    return not isinstance(value, (dict, list))


def _json_type(value) -> str:
    return "an object" if isinstance(value, dict) else "an array"


def _intern(table, keys: list) -> list[int]:
    ids = {key: table(*key) for key in dict.fromkeys(keys)}
    return list(map(ids.__getitem__, keys))


def _kind_of(kinds: CategoryKinds, cat) -> int:
    try:
        return kinds[cat]
    except TypeError:
        return OTHER


def _time_value(text: bytes, key: str):
    """(exact value, None) of a `ts`/`dur` text, or (None, why it cannot be used)."""
    try:
        value = timebase.parse_decimal(text)
    except timebase.OutOfRange as exc:
        return None, f"{key} {text[:30].decode(errors='replace')} {exc}"
    except ValueError:
        return None, f"`{key}` must be a number, not {text[:30].decode(errors='replace')}"
    low = 0 if key == "dur" else -timebase.MAX_ABS_US
    if not low <= float(text) < timebase.MAX_ABS_US:
        word = "negative" if key == "dur" and float(text) < 0 else "out of range"
        return None, f"{key} {text.decode()} is {word}"
    return value, None


def end_out_of_range(start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per slice: whether ts + dur (ns; each already below the limit, dur >= 0) reaches
    MAX_ABS_US, computed without the int64 overflow the sum itself would hit."""
    limit = int(timebase.MAX_ABS_US * 1000)
    return dur >= limit - np.maximum(start, 0)


def _quoted(value) -> str:
    """A pid/tid as a message shows it: a number as is, a string in JSON quotes."""
    return orjson.dumps(value).decode() if isinstance(value, str) else str(value)


def importer_bounds(start, end, ts_f, dur_f, int_ts, has_int_dur, int_dur):
    """Conservative [lo, hi] ns bounds: the exact span plus both Perfetto importer variants,
    and at least the first nanosecond after each of their starts.

    Integer literals (`int_ts`, `has_int_dur`; `int_dur` their ns) are converted
    exactly, as Perfetto does; anything else through a double, rounded (current)
    or truncated (older versions).
    """
    ts_x = ts_f * 1000.0
    dur_x = dur_f * 1000.0
    ts_round = np.where(int_ts, start, llround_column(ts_x))
    ts_trunc = np.where(int_ts, start, np.trunc(ts_x).astype(np.int64))
    dur_round = np.where(has_int_dur, int_dur, llround_column(dur_x))
    dur_trunc = np.where(has_int_dur, int_dur, np.trunc(dur_x).astype(np.int64))
    lo = np.minimum(np.minimum(start, ts_round), ts_trunc)
    hi = np.maximum(np.maximum(end, ts_round + dur_round), ts_trunc + dur_trunc)
    # a slice occupies at least the first nanosecond of each of its starts (a zero-length
    # slice sharing a start with a longer one would import nested: see lanes.occupied_end)
    last_start = np.maximum(np.maximum(start, ts_round), ts_trunc)
    return lo, np.maximum(hi, last_start + 1)


def llround_column(x: np.ndarray) -> np.ndarray:
    """C's llround of each value (halves away from zero), as int64."""
    f = np.floor(x)
    diff = x - f
    up = np.where(x >= 0, diff >= 0.5, diff > 0.5)
    return f.astype(np.int64) + up


def duplicate_key(raw: bytes) -> str | None:
    """A key that appears twice in one object of an event (exact, for the few that need it)."""
    found: list[str] = []

    def pairs(items):
        seen = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return dict(items)

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return found[0] if found else None
