"""The index pass: stream the events once and keep only what decisions need.

Chunks of events are observed (validated and reduced to packed facts) by
`extract.observe_chunk`, in worker processes when a pool is given; this module
merges the facts in file order into a `TraceIndex`: per GPU slice and flow a
few packed numbers (spillable to disk), per thread metadata event its bytes,
and O(1) state for everything else (the trace origin, tracks in use,
counters). Nothing here decides anything: the plan does.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, deque
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracestream.errors import TraceError
from tracestream.index import timebase
from tracestream.index.extract import observe_chunk, observe_file_chunk, observe_received_chunk
from tracestream.index.facts import (
    FLOW,
    META,
    NEXT_FLOW,
    NO_ID,
    SCOPES,
    BadCut,
    ChunkError,
    ChunkFacts,
    Context,
    DuplicateInFlow,
    GuideEvent,
    MetaEvent,
    OtherOnTrack,
)
from tracestream.index.keyscan import SPLICE_FIELDS
from tracestream.index.lanegroups import LaneGroups
from tracestream.index.matches import Match, MatchTable
from tracestream.index.records import RecordStore
from tracestream.index.vocabulary import KernelVocabulary
from tracestream.index.window import BEGIN, END, LINKED_BUDGET, LINKED_DTYPE, SizeBins
from tracestream.model import KERNEL
from tracestream.parallel.memory import collector_paused, release_memory
from tracestream.parallel.pool import SLOTS_PER_WORKER, InlinePool, outcome
from tracestream.progress import Meter, Progress, or_silent
from tracestream.read.document import (
    CHUNK_BYTES,
    SETTLE,
    DocumentScanner,
    EventChunk,
    FilePeek,
    Layout,
)
from tracestream.read.hashing import ReadStats
from tracestream.read.source import TraceSource

__all__ = [
    "FLOW", "META", "SCOPES", "GuideEvent", "IndexOptions", "Match", "MatchTable", "MetaEvent",
    "OtherOnTrack", "TraceIndex", "run_index",
]

SPAN_DTYPE = np.dtype([("ordinal", "<i8"), ("offset", "<i8"), ("length", "<i4"), ("kind", "i1"),
                       *SPLICE_FIELDS])
"""Every event the rewrite may touch, in file order: GPU activity, scopes, flows, thread
metadata; with where compaction splices it (keyscan.splice_positions)."""

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
    ("lane_group", "i1"),  # a slice's semantic lane group (index.lanegroups), 0 for flows
])
"""Slices and flows for the plan's time sweep (lane allocation and flow binding)."""

PEAK_DTYPE = np.dtype([("key", "<i8"), ("hi", "<i8"), ("group", "<i4")])
"""Slices only, for `inspect`'s peak overlaps: a third the bytes of a SWEEP_DTYPE row (a
1 GB trace spills ~40 MB of them)."""
PEAK_SORT = ("key", "group")
"""The order of the peak rows. Within a group, slices that start together may come in
any order: a peak and the time it is reached do not depend on it (see lanes.PeakOverlap).
A trace of one GPU has one group, so the spill's sort meets no ties out of order."""

_FLOW_ID_DTYPE = np.dtype([("cand", "<i8"), ("id", "<i8")])
_FLOW_TIE = 1 << 62
_NO_ID = NO_ID
_TRIM_EVERY = 8  # chunks between giving freed memory back (see parallel.memory.release_memory)


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
    stats: bool = True  # per GPU group: counts, streams, time span (inspect and the plan)
    tmpdir: str | None = None  # where spilled records go
    chunk_bytes: int = CHUNK_BYTES  # size of the chunks the workers get
    moves_gpu: bool = False  # compaction will move GPU events (their keys must be unique)
    # the first other event per track and the first provenance key: inspect reports them,
    # the plan and verify check them; anchors does neither (~2-4% of its workers' time)
    track_facts: bool = True
    lane_groups: LaneGroups | None = None  # compaction by semantic group: classify slices
    window: bool = False  # chunk time ranges and linked events, for a window (index.window)

    @property
    def slice_facts(self) -> bool:
        """Whether GPU slices are summarised at all (their bounds, stats or records)."""
        return self.stats or self.sweep or self.records


@dataclass
class ChunkSpan:
    """Where a validated chunk of events is, so the rewrite pass can cut the same way."""

    offset: int
    length: int
    first_ordinal: int
    count: int
    crc32: int | None = None  # of its bytes, where the pass is checksummed by parts
    # with IndexOptions.window: its placed events' first start and last end (ns), its
    # events in every window and its linked events (see index.window)
    first_ns: int = 0
    last_ns: int = 0
    always: int = 0
    linked: int = 0


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
    flow_id_store: RecordStore
    flow_text_ids: dict[int, Any]
    flow_tracks: set[int]
    chunks: list[ChunkSpan]
    linked: RecordStore | None  # with IndexOptions.window: LINKED_DTYPE by (key, ts)
    sizes: SizeBins  # with IndexOptions.window: the bytes on the time line (--split-mb)
    thread_meta: list[MetaEvent]
    process_meta: dict[Any, dict[str, Any]]
    other_on_track: dict[int, OtherOnTrack]
    duplicate_flows: dict[int, DuplicateInFlow]
    matches: dict[str, MatchTable]
    guides: list[GuideEvent]
    provenance_ordinal: int | None
    kernel_names: dict[int, Counter]
    kernel_vocabulary: KernelVocabulary
    """The kernel names per pid where patterns were matched: hints when one matches nothing."""
    cpu_annotations: Counter
    flow_categories: Counter
    phase_counts: Counter
    odd_values: int = 0
    """Events whose ts/dur nothing reads and that is not a usable number: passed through."""
    first_odd: tuple[int, str] | None = None  # (event ordinal, what is odd) of the first

    @property
    def pids(self) -> set:
        return {pid for pid, _ in self.tracks} | set(self.process_meta)

    def tids_of(self, pid) -> set:
        return {tid for p, tid in self.tracks if p == pid}

    def flow_id(self, cand: int) -> Any:
        """The `id` of the flow event at span candidate `cand` (for messages)."""
        if cand in self.flow_text_ids:
            return self.flow_text_ids[cand]
        for block in self.flow_id_store.batches():
            hit = block[block["cand"] == cand]
            if len(hit):
                value = int(hit["id"][0])
                return None if value == _NO_ID else value
        return None

    def planned(self) -> None:
        """The plan is made: drop what only planning reads (the rewrite needs the spans)."""
        self.sweep.close()
        self.flow_id_store.close()
        self.matches.clear()
        if self.linked is not None:  # decided by the plan (plan.window)
            self.linked.close()

    def close(self) -> None:
        self.spans.close()
        self.sweep.close()
        self.flow_id_store.close()
        if self.linked is not None:
            self.linked.close()


class IndexBuilder:
    """Merges ChunkFacts in file order; `finish()` returns the TraceIndex."""

    def __init__(self, options: IndexOptions):
        self.options = options
        self._track_ids: dict[tuple, int] = {}
        self._group_ids: dict[tuple, int] = {}
        self._track_list: list[tuple] = []
        self._group_list: list[tuple] = []
        self.group_stats: dict[int, GroupStats] = {}
        self.spans = RecordStore(SPAN_DTYPE, tmpdir=options.tmpdir)
        self.sweep = (RecordStore(SWEEP_DTYPE, sort_keys=("key", "tie"), tmpdir=options.tmpdir)
                      if options.records else
                      RecordStore(PEAK_DTYPE, sort_keys=PEAK_SORT, tmpdir=options.tmpdir))
        self.flow_id_store = RecordStore(_FLOW_ID_DTYPE, tmpdir=options.tmpdir)
        self.flow_text_ids: dict[int, Any] = {}
        self.flow_tracks: set[int] = set()
        self.chunks: list[ChunkSpan] = []
        # (a small budget: a window's stores come on top of a full run's)
        self.linked = (RecordStore(LINKED_DTYPE, sort_keys=("key", "ts"), tmpdir=options.tmpdir,
                                   budget=LINKED_BUDGET) if options.window else None)
        self.sizes = SizeBins()
        self.thread_meta: list[MetaEvent] = []
        self.process_meta: dict[Any, dict[str, Any]] = {}
        self.other_on_track: dict[int, OtherOnTrack] = {}
        self.duplicate_flows: dict[int, DuplicateInFlow] = {}
        self.matches: dict[str, MatchTable] = {
            name: MatchTable(self._track_list, self._group_list, tmpdir=options.tmpdir)
            for name in options.patterns}
        self.guides: list[GuideEvent] = []
        self.provenance_ordinal: int | None = None
        self.kernel_names: dict[int, Counter] = {}
        self.kernel_vocabulary = KernelVocabulary()
        self.cpu_annotations: Counter = Counter()
        self.flow_categories: Counter = Counter()
        self.phase_counts: Counter = Counter()
        self.odd_values = 0
        self.first_odd: tuple[int, str] | None = None
        self.event_count = 0
        self._origin: tuple[float, timebase.Decimal10, str] | None = None

    @property
    def context(self) -> Context:
        return Context(patterns=self.options.patterns, count_names=self.options.count_names,
                       moves_gpu=self.options.moves_gpu, records=self.options.records,
                       bounds=self.options.slice_facts, track_facts=self.options.track_facts,
                       lane_groups=self.options.lane_groups, window=self.options.window)

    def _track(self, pid, tid) -> int:
        key = (pid, tid)
        track = self._track_ids.get(key)
        if track is None:
            track = self._track_ids[key] = len(self._track_ids)
            self._track_list.append(key)
        return track

    def _tracks(self, keys: list[tuple]) -> list[int]:
        """Global ids of a chunk's tracks (most were seen in earlier chunks: looked up at once)."""
        ids = list(map(self._track_ids.get, keys))
        if None in ids:
            ids = [self._track(*key) for key in keys]
        return ids

    def _group(self, pid, device) -> int:
        key = (pid, device)
        group = self._group_ids.get(key)
        if group is None:
            group = self._group_ids[key] = len(self._group_ids)
            self._group_list.append(key)
            self.group_stats[group] = GroupStats()
        return group

    def add(self, facts: ChunkFacts, chunk: EventChunk) -> None:
        """Merge one chunk's facts (chunk-local numbering) into the global index."""
        base = self.event_count
        span = ChunkSpan(chunk.offset, chunk.length, base, facts.count, facts.crc32)
        self.chunks.append(span)
        tracks = np.array(self._tracks(facts.tracks) or [0], dtype=np.int32)
        if facts.window is not None:
            span.first_ns, span.last_ns, span.always, linked, sizes = facts.window
            span.linked = len(linked)
            self.sizes.add(*sizes)
            if len(linked):
                linked["ordinal"] += base
                by_track = (linked["role"] == BEGIN) | (linked["role"] == END)
                linked["key"][by_track] = tracks[linked["key"][by_track]]
                self.linked.append(linked)
        groups = np.array([self._group(*g) for g in facts.groups] or [0], dtype=np.int32)
        cand_base = len(self.spans)
        if self.options.records and len(facts.candidates):
            rows = np.empty(len(facts.candidates), SPAN_DTYPE)
            for name in SPAN_DTYPE.names:
                rows[name] = facts.candidates["index" if name == "ordinal" else name]
            rows["ordinal"] += base
            self.spans.append(rows)
        if len(facts.slices) and self.options.slice_facts:
            self._slices(facts.slices, tracks, groups, cand_base)
        if len(facts.flows) and self.options.records:
            self._flows(facts, tracks, cand_base)
        for meta in facts.thread_meta:
            meta.ordinal += base
            self.thread_meta.append(meta)
        for pid, key, value in facts.process_meta:
            self.process_meta.setdefault(pid, {})[key] = value
        for local, other in facts.other_on_track.items():
            track = int(tracks[local])
            if track not in self.other_on_track:
                other.ordinal += base
                self.other_on_track[track] = other
        for local, found in facts.duplicate_flows.items():
            track = int(tracks[local])
            if track not in self.duplicate_flows:
                found.ordinal += base
                self.duplicate_flows[track] = found
        for name, (rows, names, streams, texts) in facts.matches.items():
            if not len(rows):
                continue
            table = self.matches[name]
            rows["ordinal"] += base
            rows["track"] = tracks[rows["track"]]
            rows["group"] = groups[rows["group"]]
            rows["name"] = np.array([table.intern_name(n) for n in names], np.int32)[rows["name"]]
            rows["stream"] = np.array([table.intern_stream(x) for x in streams],
                                      np.int32)[rows["stream"]]
            table.extend(rows, texts)
        for guide in facts.guides:
            guide.ordinal += base
            self.guides.append(guide)
        if facts.provenance is not None and self.provenance_ordinal is None:
            self.provenance_ordinal = facts.provenance + base
        for local, names in facts.kernel_names.items():
            self.kernel_names.setdefault(int(groups[local]), Counter()).update(names)
        self.kernel_vocabulary.add(facts.kernel_vocabulary)
        self.cpu_annotations.update(facts.cpu_annotations)
        self.flow_categories.update(facts.flow_categories)
        self.phase_counts.update(facts.phase_counts)
        self.odd_values += facts.odd_values
        if facts.first_odd is not None and self.first_odd is None:
            self.first_odd = (facts.first_odd[0] + base, facts.first_odd[1])
        if facts.origin is not None:
            ns, text = facts.origin
            if self._origin is None or ns <= self._origin[0]:
                value = timebase.parse_decimal(text)
                if self._origin is None or value < self._origin[1]:
                    self._origin = (ns, value, text)
        self.event_count += facts.count

    def _slices(self, rows: np.ndarray, tracks, groups, cand_base: int) -> None:
        local_track = rows["track"]
        local_group = rows["group"]
        kind = rows["kind"]
        # chunk-local ids are small: count them with bincount, translate the few seen
        for local in np.flatnonzero(np.bincount(local_group)).tolist():
            mask = local_group == local
            stats = self.group_stats[int(groups[local])]
            counts = np.bincount(kind[mask])
            for kk in np.flatnonzero(counts).tolist():
                stats.kinds[kk] += int(counts[kk])
            stats.tracks.update(tracks[np.flatnonzero(np.bincount(local_track[mask]))].tolist())
            kernel_tracks = np.bincount(local_track[mask & (kind == KERNEL)])
            stats.kernel_tracks.update(tracks[np.flatnonzero(kernel_tracks)].tolist())
            first, last = int(rows["lo"][mask].min()), int(rows["hi"][mask].max())
            stats.first_ns = first if stats.first_ns is None else min(stats.first_ns, first)
            stats.last_ns = last if stats.last_ns is None else max(stats.last_ns, last)
        if not self.options.records:
            if self.options.sweep:
                self._peak_rows(rows, groups)
            return
        batch = np.empty(len(rows), SWEEP_DTYPE)
        cand = rows["cand"].astype(np.int64) + cand_base
        batch["key"] = rows["lo"]
        batch["tie"] = cand
        batch["hi"] = rows["hi"]
        batch["start"] = rows["start"]
        batch["end"] = rows["end"]
        batch["track"] = tracks[local_track]
        batch["group"] = groups[local_group]
        batch["kind"] = kind
        batch["cand"] = cand
        batch["lane_group"] = rows["lane_group"]
        self.sweep.append(batch)

    def _peak_rows(self, rows: np.ndarray, groups) -> None:
        batch = np.empty(len(rows), PEAK_DTYPE)
        batch["key"] = rows["lo"]
        batch["hi"] = rows["hi"]
        batch["group"] = groups[rows["group"]]
        self.sweep.append(batch)

    def _flows(self, facts: ChunkFacts, tracks, cand_base: int) -> None:
        rows = facts.flows
        cand = rows["cand"].astype(np.int64) + cand_base
        batch = np.zeros(len(rows), SWEEP_DTYPE)
        batch["key"] = rows["ts"]
        batch["tie"] = cand + _FLOW_TIE
        batch["start"] = rows["ts"]
        batch["end"] = rows["ts"]
        batch["hi"] = rows["ts"]
        batch["track"] = tracks[rows["track"]]
        self.flow_tracks.update(np.unique(batch["track"]).tolist())
        batch["group"] = -1
        batch["kind"] = np.where(rows["binds_next"], NEXT_FLOW, FLOW)
        batch["cand"] = cand
        self.sweep.append(batch)
        ids = np.empty(len(rows), _FLOW_ID_DTYPE)
        ids["cand"] = cand
        ids["id"] = rows["id"]
        self.flow_id_store.append(ids)
        for local, value in facts.flow_ids.items():
            self.flow_text_ids[local + cand_base] = value

    def close(self) -> None:
        self.spans.close()
        self.sweep.close()
        self.flow_id_store.close()
        if self.linked is not None:
            self.linked.close()

    def finish(self, source_name: str, compression: str, stats: ReadStats, layout: Layout):
        layout.event_count = self.event_count
        origin = self._origin
        return TraceIndex(
            source_name=source_name,
            compression=compression,
            stats=stats,
            layout=layout,
            event_count=self.event_count,
            origin=origin[1] if origin else None,
            origin_text=origin[2] if origin else None,
            tracks=self._track_list,
            groups=self._group_list,
            group_stats=self.group_stats,
            spans=self.spans,
            sweep=self.sweep,
            flow_id_store=self.flow_id_store,
            flow_text_ids=self.flow_text_ids,
            flow_tracks=self.flow_tracks,
            chunks=self.chunks,
            linked=self.linked,
            sizes=self.sizes,
            thread_meta=self.thread_meta,
            process_meta=self.process_meta,
            other_on_track=self.other_on_track,
            duplicate_flows=self.duplicate_flows,
            matches=self.matches,
            guides=self.guides,
            provenance_ordinal=self.provenance_ordinal,
            kernel_names=self.kernel_names,
            kernel_vocabulary=self.kernel_vocabulary,
            cpu_annotations=self.cpu_annotations,
            flow_categories=self.flow_categories,
            phase_counts=self.phase_counts,
            odd_values=self.odd_values,
            first_odd=self.first_odd,
        )


def _submit(pool, chunk: EventChunk, by_path: str | None, context: Context):
    """A speculative chunk handed to a worker: (its task, the slot holding its bytes).

    A worker reads a plain file's chunk itself; a decompressed chunk goes through a
    shared slot when one is free and it fits (between `[` and `]`, as the worker decodes
    it), else through the pipe.
    """
    if by_path is not None:
        return pool.submit(observe_file_chunk, by_path, chunk.offset, chunk.length,
                           context), None
    slot = pool.slots.acquire() if pool.slots is not None else None
    if slot is not None and pool.slots.put_pieces(slot, (b"[", *(chunk.pieces or (chunk.data,)),
                                                         b"]")):
        return pool.submit(observe_received_chunk, slot, chunk.length, chunk.offset,
                           context), slot
    if slot is not None:
        pool.slots.release(slot)
    return pool.submit(observe_chunk, chunk.content(), chunk.offset, context), None


def _chunk_error(exc: ChunkError, base: int) -> TraceError:
    where = f"event {base + exc.local} (byte {exc.offset})" if exc.local is not None else (
        f"byte {exc.offset} (in or after event {base})")
    return TraceError(f"{where}: {exc.message}")


def run_index(source: TraceSource, options: IndexOptions, *, progress: Progress | None = None,
              pool=None) -> TraceIndex:
    """Stream the source once and build its index (chunks observed in `pool` if given;
    `progress` sees the phase "index", see tracestream.progress)."""
    stats = ReadStats()
    builder = IndexBuilder(options)
    context = builder.context
    meter = or_silent(progress).phase("index", source.progress_total)
    with collector_paused():
        try:
            return _run_index(source, options, stats, builder, context, meter, pool)
        finally:
            meter.close()


def _run_index(source, options, stats, builder, context, meter: Meter, pool) -> TraceIndex:
    try:
        pool = pool if pool is not None else InlinePool()
        by_path = source.plain_path if pool.workers else None
        # one pass over a file the workers read: the scanner reads only what it decodes
        blocks: Iterable[bytes] | None = (
            source.read_skipping(stats) if by_path is not None else None)
        by_parts = blocks is not None and not source.read_once
        if by_parts:  # checksummed from each chunk's bytes, where they are decoded
            context = dataclasses.replace(context, checksum=True)
        if blocks is None:
            blocks = source.read(stats)
        # a file the workers read themselves: the scanner reads only the bytes near each cut
        scanner = DocumentScanner(blocks, speculative=True, chunk_bytes=options.chunk_bytes,
                                  max_event_bytes=source.max_event_bytes,
                                  peek=FilePeek(by_path) if by_path is not None else None)
        inflight: deque = deque()
        window = SLOTS_PER_WORKER * pool.workers  # (a compressed chunk in flight has a slot)

        def settle(chunk: EventChunk, result, slot: int | None) -> bool:
            """Merge one speculative result; False when the scanner had to rewind."""
            try:
                facts = outcome(result)
            except BadCut:
                scanner.rewind(chunk)
                for _, later, _ in inflight:
                    later.cancel()
                for _, later, later_slot in inflight:  # a slot is free once no worker reads it
                    if later_slot is not None:
                        futures.wait([later])
                        pool.slots.release(later_slot)
                inflight.clear()
                return False
            except ChunkError as exc:
                raise _chunk_error(exc, builder.event_count) from None
            finally:
                if slot is not None:
                    pool.slots.release(slot)
            builder.add(facts, chunk)
            scanner.confirm(chunk)
            meter.advance_to(stats.position(chunk.offset + chunk.length))
            if len(builder.chunks) % _TRIM_EVERY == 0:
                release_memory()
            return True

        for chunk in scanner.chunks():
            if chunk is SETTLE:
                while inflight and settle(*inflight.popleft()):
                    pass
                continue
            if chunk.events is None:
                inflight.append((chunk, *_submit(pool, chunk, by_path, context)))
                while len(inflight) > window:
                    settle(*inflight.popleft())
                continue
            try:
                facts = observe_chunk(chunk.data, chunk.offset, context)
            except ChunkError as exc:
                raise _chunk_error(exc, builder.event_count) from None
            builder.add(facts, chunk)
            meter.advance_to(stats.position(chunk.offset + chunk.length))
        while inflight:
            if not settle(*inflight.popleft()):  # pragma: no cover - needs a final decode
                raise TraceError("internal error: rewind after the last chunk")
        if by_parts:
            source.checksum_by_parts(stats, ((c.offset, c.length, c.crc32)
                                             for c in builder.chunks))
        source.finish_read(stats)
        meter.advance_to(stats.raw_bytes)  # (the bytes after the last event too)
    except BaseException:
        builder.close()
        raise
    return builder.finish(source.name, source.compression, stats, scanner.layout)
