"""The index pass: stream the events once and keep only what decisions need.

Per GPU activity event a handful of packed numbers (ordinal, byte span, track,
group, exact and conservative nanosecond bounds); per flow and per thread
metadata event likewise; for everything else O(1) state (the trace origin, the
tids in use, counters). Nothing here decides anything: the plan does.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import orjson

from tracestream import timebase
from tracestream.document import DocumentScanner, EventChunk, Layout
from tracestream.errors import TraceError
from tracestream.events import (
    CPU_ANNOTATION,
    FLOW_PHASES,
    GPU_SCOPE,
    HEAD,
    KERNEL,
    LAYER_GUIDE,
    PROVENANCE_KEY,
    TIMING,
    CategoryKinds,
    describe_validation_error,
    duplicate_key,
)
from tracestream.source import ReadStats, TraceSource
from tracestream.spill import RecordStore
from tracestream.timebase import is_integer_text

_PROVENANCE_BYTES = b'"' + PROVENANCE_KEY.encode() + b'"'
SCOPES = "scopes"
"""Device slot of a scope group: GPU scopes are grouped per pid (they carry no device)."""
_SCOPES = SCOPES


@dataclass
class Match:
    """A kernel whose name matched one of the user's patterns."""

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
    """A `ph: M` event about a thread (name, sort index), with its byte span."""

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
    count: int = 1


@dataclass
class GuideEvent:
    ordinal: int
    pid: Any
    tid: Any
    args: dict


SPAN_DTYPE = np.dtype([("ordinal", "<i8"), ("offset", "<i8"), ("length", "<i4"), ("kind", "i1")])
"""Every event the rewrite may touch, in file order: GPU activity, scopes, flows, thread metadata."""

SWEEP_DTYPE = np.dtype([
    ("key", "<i8"),  # lo bound for slices, exact ns for flows: the sweep's time order
    ("tie", "<i8"),  # slices before flows at equal keys, then file order
    ("hi", "<i8"),
    ("start", "<i8"),
    ("end", "<i8"),
    ("track", "<i4"),
    ("group", "<i4"),
    ("kind", "i1"),
    ("cand", "<i8"),  # index into the span store
])
"""Slices and flows for the plan's time sweep (lane allocation and flow binding)."""

FLOW = 8  # span kind for flow events
META = 9  # span kind for thread metadata events
_FLOW_TIE = 1 << 62


@dataclass
class GroupStats:
    """Per (pid, device) GPU group (or per pid for scopes): counts and time span."""

    kinds: Counter = field(default_factory=Counter)
    tracks: set = field(default_factory=set)
    kernel_tracks: set = field(default_factory=set)
    first_ns: int | None = None
    last_ns: int | None = None


@dataclass
class IndexOptions:
    """What the index pass should collect beyond the always-kept state."""

    patterns: dict[str, re.Pattern] = field(default_factory=dict)
    count_names: bool = False  # kernel name and CPU annotation counters (inspect)
    records: bool = True  # per-event rewrite/sweep records (off for read-only commands)
    sweep: bool = True  # sweep records of slices (needed for lanes and peak overlap)
    tmpdir: str | None = None  # where spilled records go


@dataclass
class TraceIndex:
    """Everything the plan needs to know about one trace, in compact form."""

    source_name: str
    compression: str
    stats: ReadStats
    layout: Layout
    event_count: int
    origin: timebase.Decimal10 | None
    origin_text: str | None
    tracks: list[tuple[Any, Any]]
    groups: list[tuple[Any, Any]]
    group_stats: dict[int, GroupStats]
    spans: RecordStore
    sweep: RecordStore
    flow_ids: dict[int, Any]
    thread_meta: list[MetaEvent]
    process_meta: dict[Any, dict[str, Any]]
    other_on_track: dict[int, OtherOnTrack]
    matches: dict[str, list[Match]]
    guides: list[GuideEvent]
    provenance_ordinal: int | None
    kernel_names: dict[int, Counter]
    cpu_annotations: Counter
    flow_categories: Counter
    phase_counts: Counter

    @property
    def pids(self) -> set:
        return {pid for pid, _ in self.tracks} | set(self.process_meta)

    def tids_of(self, pid) -> set:
        return {tid for p, tid in self.tracks if p == pid}

    def close(self) -> None:
        self.spans.close()
        self.sweep.close()


class IndexBuilder:
    """Consumes event chunks in order; `finish()` returns the TraceIndex."""

    def __init__(self, options: IndexOptions):
        self.options = options
        self._kinds = CategoryKinds()
        self._track_ids: dict[tuple, int] = {}
        self._group_ids: dict[tuple, int] = {}
        self.group_stats: dict[int, GroupStats] = {}
        self.spans = RecordStore(SPAN_DTYPE, tmpdir=options.tmpdir)
        self.sweep = RecordStore(SWEEP_DTYPE, sort_keys=("key", "tie"), tmpdir=options.tmpdir)
        self.flow_ids: dict[int, Any] = {}
        self.thread_meta: list[MetaEvent] = []
        self.process_meta: dict[Any, dict[str, Any]] = {}
        self.other_on_track: dict[int, OtherOnTrack] = {}
        self.matches: dict[str, list[Match]] = {name: [] for name in options.patterns}
        self._name_hits: dict[Any, list[str]] = {}
        self.guides: list[GuideEvent] = []
        self.provenance_ordinal: int | None = None
        self.kernel_names: dict[int, Counter] = {}
        self.cpu_annotations: Counter = Counter()
        self.flow_categories: Counter = Counter()
        self.phase_counts: Counter = Counter()
        self.event_count = 0
        self._min_ts = float("inf")
        self._origin: timebase.Decimal10 | None = None
        self._origin_text: str | None = None

    # -- helpers -----------------------------------------------------------

    def _track(self, pid, tid) -> int:
        key = (pid, tid)
        track = self._track_ids.get(key)
        if track is None:
            track = self._track_ids[key] = len(self._track_ids)
        return track

    def _group(self, pid, device) -> int:
        key = (pid, device)
        group = self._group_ids.get(key)
        if group is None:
            group = self._group_ids[key] = len(self._group_ids)
            self.group_stats[group] = GroupStats()
        return group

    def _pattern_hits(self, name) -> list[str]:
        hits = self._name_hits.get(name)
        if hits is None:
            text = name if isinstance(name, str) else str(name)
            hits = [key for key, rx in self.options.patterns.items() if rx.search(text)]
            self._name_hits[name] = hits
        return hits

    # -- the per-chunk loop -------------------------------------------------

    def observe(self, chunk: EventChunk) -> None:
        data = chunk.data
        base = chunk.offset
        find = data.find
        head_decode = HEAD.decode
        kinds = self._kinds
        track_of = self._track
        other = self._other
        phase_counts = self.phase_counts
        count_names = self.options.count_names
        candidates: list = []  # (ordinal, offset, length, kind) in file order
        slices: list = []  # (candidate index, ordinal, offset, raw, head, kind)
        flows: list = []  # (candidate index, ordinal, offset, raw, head)
        pos = 0
        ordinal = chunk.first_ordinal
        min_ts = self._min_ts
        has_provenance = self.provenance_ordinal is None and _PROVENANCE_BYTES in data
        for raw in chunk.events:
            if data[pos] != 123:  # '{'
                pos = find(b"{", pos)
            offset = base + pos
            try:
                ev = head_decode(raw)
            except msgspec.ValidationError as exc:
                raise _bad_event(ordinal, offset, describe_validation_error(exc)) from None
            ph = ev.ph
            phase_counts[ph] += 1
            ts = ev.ts
            if ts is not None:
                if not -timebase.MAX_ABS_US < ts < timebase.MAX_ABS_US:
                    raise _bad_event(ordinal, offset, f"ts {_number_text(raw, 'ts')} is out of range")
                if ts <= min_ts:
                    min_ts = self._consider_origin(raw, ts, min_ts)
            dur = ev.dur
            if dur is not None and not 0 <= dur < timebase.MAX_ABS_US:
                word = "negative" if dur < 0 else "out of range"
                raise _bad_event(ordinal, offset, f"dur {_number_text(raw, 'dur')} is {word}")
            if ph == "X":
                kind = kinds[ev.cat]
                if KERNEL <= kind <= GPU_SCOPE:
                    slices.append((len(candidates), ordinal, offset, raw, ev, kind))
                    candidates.append((ordinal, offset, len(raw), kind))
                else:
                    if kind == LAYER_GUIDE:
                        self._guide(ordinal, raw, ev)
                    elif kind == CPU_ANNOTATION and count_names:
                        self.cpu_annotations[ev.name] += 1
                    other(track_of(ev.pid, ev.tid), ordinal, ev)
            elif ph in FLOW_PHASES:
                if ev.pid is not None and ev.tid is not None and ts is not None:
                    flows.append((len(candidates), ordinal, offset, raw, ev))
                    candidates.append((ordinal, offset, len(raw), FLOW))
                    self.flow_categories[ev.cat] += 1
            elif ph == "M":
                if self._meta(ordinal, offset, raw, ev):
                    candidates.append((ordinal, offset, len(raw), META))
            else:
                other(track_of(ev.pid, ev.tid), ordinal, ev)
            if has_provenance and _PROVENANCE_BYTES in bytes(raw) and _carries_provenance(raw):
                self.provenance_ordinal = ordinal
                has_provenance = False
            pos += len(raw)
            ordinal += 1
        self._min_ts = min_ts
        self.event_count = ordinal
        if not candidates:
            return
        first_cand = len(self.spans)
        if self.options.records:
            self.spans.append(np.array(candidates, dtype=SPAN_DTYPE))
        if slices:
            self._slices(slices, first_cand)
        if flows and self.options.records:
            self._flows(flows, first_cand)

    def _other(self, track: int, ordinal: int, ev) -> None:
        seen = self.other_on_track.get(track)
        if seen is None:
            self.other_on_track[track] = OtherOnTrack(ordinal, ev.ph, ev.name, ev.ts)
        else:
            seen.count += 1

    def _consider_origin(self, raw, ts: float, min_ts: float) -> float:
        """Keep the exact text of the smallest ts (float first, digits on ties)."""
        text = bytes(TIMING.decode(raw).ts)
        value = timebase.parse_decimal(text)
        if self._origin is None or value < self._origin:
            self._origin = value
            self._origin_text = text.decode()
        return min(ts, min_ts)

    def _slices(self, rows: list, first_cand: int) -> None:
        """Pack the chunk's GPU activity and scopes (exact ns from the number text)."""
        n = len(rows)
        ts_f = np.empty(n)
        dur_f = np.empty(n)
        exact_ts = np.zeros(n, dtype=bool)
        exact_dur = np.zeros(n, dtype=bool)
        int_dur = np.zeros(n, dtype=np.int64)
        starts: list[int] = []
        ends: list[int] = []
        tracks: list[int] = []
        groups: list[int] = []
        patterns = self.options.patterns
        count_names = self.options.count_names
        for i, (_, ordinal, offset, raw, ev, kind) in enumerate(rows):
            pid, tid = ev.pid, ev.tid
            for key, value in (("pid", pid), ("tid", tid), ("ts", ev.ts), ("dur", ev.dur)):
                if value is None:
                    raise _bad_event(ordinal, offset, f"GPU {_kind_word(kind)} has no `{key}`")
            dup = duplicate_key(raw)
            if dup is not None:
                raise _bad_event(ordinal, offset, f"duplicate key `{dup}` in a GPU event")
            timing = TIMING.decode(raw)
            ts_text = bytes(timing.ts)
            dur_text = bytes(timing.dur)
            start, end = _exact_span(ts_text, dur_text)
            starts.append(start)
            ends.append(end)
            ts_f[i] = ev.ts
            dur_f[i] = ev.dur
            exact_ts[i] = is_integer_text(ts_text)
            if is_integer_text(dur_text):
                exact_dur[i] = True
                int_dur[i] = int(dur_text) * 1000
            args = ev.args
            device = args.device if args is not None and kind != GPU_SCOPE else None
            group = self._group(pid, device) if kind != GPU_SCOPE else self._group(pid, _SCOPES)
            track = self._track(pid, tid)
            groups.append(group)
            tracks.append(track)
            stats = self.group_stats[group]
            stats.kinds[kind] += 1
            stats.tracks.add(track)
            if kind == KERNEL:
                stats.kernel_tracks.add(track)
                if count_names:
                    names = self.kernel_names.get(group)
                    if names is None:
                        names = self.kernel_names[group] = Counter()
                    names[ev.name] += 1
                if patterns:
                    for key in self._pattern_hits(ev.name):
                        self.matches[key].append(Match(
                            ordinal, pid, tid, device, ev.name,
                            timebase.parse_decimal(ts_text), timebase.parse_decimal(dur_text),
                            ts_text.decode(), dur_text.decode(),
                            args.stream if args is not None else None,
                        ))
        start_a = np.array(starts, dtype=np.int64)
        end_a = np.array(ends, dtype=np.int64)
        lo, hi = importer_bounds(start_a, end_a, ts_f, dur_f, exact_ts, exact_dur, int_dur)
        self._group_spans(groups, lo, hi)
        if not (self.options.records or self.options.sweep):
            return
        cand = np.fromiter((row[0] for row in rows), dtype=np.int64, count=n) + first_cand
        batch = np.empty(n, dtype=SWEEP_DTYPE)
        batch["key"] = lo
        batch["tie"] = cand
        batch["hi"] = hi
        batch["start"] = start_a
        batch["end"] = end_a
        batch["track"] = tracks
        batch["group"] = groups
        batch["kind"] = [row[5] for row in rows]
        batch["cand"] = cand
        self.sweep.append(batch)

    def _group_spans(self, groups: list[int], lo: np.ndarray, hi: np.ndarray) -> None:
        """Extend each group's time span (first start, last end) with this chunk's slices."""
        group_a = np.array(groups)
        for group in set(groups):
            mask = group_a == group
            stats = self.group_stats[group]
            first, last = int(lo[mask].min()), int(hi[mask].max())
            stats.first_ns = first if stats.first_ns is None else min(stats.first_ns, first)
            stats.last_ns = last if stats.last_ns is None else max(stats.last_ns, last)

    def _flows(self, rows: list, first_cand: int) -> None:
        n = len(rows)
        batch = np.zeros(n, dtype=SWEEP_DTYPE)
        times = []
        tracks = []
        for i, (cand, _, _, raw, ev) in enumerate(rows):
            times.append(timebase.parse_decimal(bytes(TIMING.decode(raw).ts)).floor_ns())
            tracks.append(self._track(ev.pid, ev.tid))
            if ev.id is not None:
                self.flow_ids[first_cand + cand] = ev.id
            del i
        cand = np.fromiter((row[0] for row in rows), dtype=np.int64, count=n) + first_cand
        batch["key"] = times
        batch["tie"] = cand + _FLOW_TIE
        batch["start"] = times
        batch["end"] = times
        batch["hi"] = times
        batch["track"] = tracks
        batch["group"] = -1
        batch["kind"] = FLOW
        batch["cand"] = cand
        self.sweep.append(batch)

    def _meta(self, ordinal: int, offset: int, raw, ev) -> bool:
        """Record metadata; True for thread metadata (a rewrite candidate)."""
        name = ev.name
        if not isinstance(name, str):
            return False
        args = orjson.loads(bytes(raw)).get("args")
        args = args if isinstance(args, dict) else {}
        if name.startswith("thread_"):
            value = args.get("name", args.get("sort_index"))
            self.thread_meta.append(
                MetaEvent(ordinal, offset, len(raw), ev.pid, ev.tid, name, value, bytes(raw))
            )
            self._track(ev.pid, ev.tid)
            return True
        info = self.process_meta.setdefault(ev.pid, {})
        if name == "process_name":
            info["name"] = args.get("name")
        elif name == "process_labels":
            info["labels"] = args.get("labels")
        elif name == "process_sort_index":
            info["sort_index"] = args.get("sort_index")
        return False

    def _guide(self, ordinal: int, raw, ev) -> None:
        args = orjson.loads(bytes(raw)).get("args")
        self.guides.append(
            GuideEvent(ordinal, ev.pid, ev.tid, args if isinstance(args, dict) else {})
        )

    def finish(self, source_name: str, compression: str, stats: ReadStats, layout: Layout):
        return TraceIndex(
            source_name=source_name,
            compression=compression,
            stats=stats,
            layout=layout,
            event_count=self.event_count,
            origin=self._origin,
            origin_text=self._origin_text,
            tracks=list(self._track_ids),
            groups=list(self._group_ids),
            group_stats=self.group_stats,
            spans=self.spans,
            sweep=self.sweep,
            flow_ids=self.flow_ids,
            thread_meta=self.thread_meta,
            process_meta=self.process_meta,
            other_on_track=self.other_on_track,
            matches=self.matches,
            guides=self.guides,
            provenance_ordinal=self.provenance_ordinal,
            kernel_names=self.kernel_names,
            cpu_annotations=self.cpu_annotations,
            flow_categories=self.flow_categories,
            phase_counts=self.phase_counts,
        )


def importer_bounds(start, end, ts_f, dur_f, exact_ts, exact_dur, int_dur):
    """Conservative [lo, hi] ns bounds: exact span plus both Perfetto importer variants.

    `exact_ts`/`exact_dur` mark integer literals, which Perfetto converts exactly
    (`int_dur` holds those durations in ns).
    """
    ts_x = ts_f * 1000.0
    dur_x = dur_f * 1000.0
    ts_round = np.where(exact_ts, start, _llround(ts_x))
    ts_trunc = np.where(exact_ts, start, np.trunc(ts_x).astype(np.int64))
    dur_round = np.where(exact_dur, int_dur, _llround(dur_x))
    dur_trunc = np.where(exact_dur, int_dur, np.trunc(dur_x).astype(np.int64))
    lo = np.minimum(np.minimum(start, ts_round), ts_trunc)
    hi = np.maximum(np.maximum(end, ts_round + dur_round), ts_trunc + dur_trunc)
    return lo, hi


def _llround(x: np.ndarray) -> np.ndarray:
    f = np.floor(x)
    diff = x - f
    up = np.where(x >= 0, diff >= 0.5, diff > 0.5)
    return f.astype(np.int64) + up


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


def _kind_word(kind: int) -> str:
    return "scope" if kind == GPU_SCOPE else "activity event"


def _number_text(raw, key: str) -> str:
    match = re.search(rb'"' + key.encode() + rb'"[ \t\r\n]*:[ \t\r\n]*([^,}\s]+)', raw)
    return match.group(1).decode(errors="replace") if match else "?"


def _carries_provenance(raw) -> bool:
    args = orjson.loads(bytes(raw)).get("args")
    return isinstance(args, dict) and PROVENANCE_KEY in args


def _bad_event(ordinal: int, offset: int, what: str) -> TraceError:
    return TraceError(f"event {ordinal} (byte {offset}): {what}")


def run_index(source: TraceSource, options: IndexOptions, *, progress=None) -> TraceIndex:
    """Stream the source once and build its index."""
    stats = ReadStats()
    builder = IndexBuilder(options)
    try:
        blocks: Iterable[bytes] = source.read(stats)
        if progress is not None:
            blocks = progress.wrap(blocks, "index")
        scanner = DocumentScanner(blocks)
        for chunk in scanner.chunks():
            builder.observe(chunk)
        source.finish_read(stats)
    except BaseException:
        builder.spans.close()
        builder.sweep.close()
        raise
    return builder.finish(source.name, source.compression, stats, scanner.layout)
