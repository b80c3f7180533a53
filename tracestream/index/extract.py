"""What one chunk of events contains: the index pass's work, as a pure function.

`observe_chunk(data, offset, context)` validates a chunk (JSON syntax, UTF-8,
field types) and decodes it in one msgspec call into small structs that keep
`ts`/`dur` as their exact number text. It returns `ChunkFacts`: packed numpy
records for the events the plan needs (GPU activity and scopes, flows, thread
metadata), the first other event per track, anchor matches and counters.

It runs in worker processes, so everything it returns is picklable and numbered
chunk-locally (event index within the chunk, local track and group tables);
the index builder maps that to global ids."""

from __future__ import annotations

from collections import Counter
from itertools import repeat
from operator import attrgetter

import msgspec
import numpy as np
import orjson
from isal import isal_zlib

from tracestream import _native
from tracestream.index import timebase
from tracestream.index.decode import (
    MOVED_KEYS,
    PHASE_CODES,
    PHASE_COMPLETE,
    PHASE_FLOW,
    PHASE_METADATA,
    PHASE_OTHER,
    decode_chunk,
    decoder_for,
    event_spans,
)
from tracestream.index.extract_duplicates import DuplicateChecks
from tracestream.index.extract_flows import FlowsAndMetadata
from tracestream.index.extract_matches import MatchFinding, hashable, json_type, name_counts_of
from tracestream.index.facts import (
    CANDIDATE_DTYPE,
    FLOW,
    META,
    SCOPES,
    SLICE_DTYPE,
    SLICE_SUMMARY_DTYPE,
    ChunkError,
    ChunkFacts,
    Context,
    OtherOnTrack,
)
from tracestream.index.keyscan import (
    CAREFUL,
    SPLICE_FIELDS,
    SPLICE_KEYS,
    EventKeys,
    splice_positions,
)
from tracestream.index.numbers import (
    double_column,
    end_out_of_range,
    importer_bounds,
    time_value,
)
from tracestream.index.window import (
    SEPARATOR_BYTES,
    chunk_range,
    chunk_sizes,
    chunk_times,
    linked_rows,
)
from tracestream.model import (
    CPU_ANNOTATION,
    GPU_SCOPE,
    KERNEL,
    LAYER_GUIDE,
    CategoryKinds,
    Event,
)
from tracestream.parallel.slots import received_view
from tracestream.read.source import read_span


def observe_chunk(data: bytes, offset: int, ctx: Context, doc=None) -> ChunkFacts:
    """The index pass's view of one chunk (see module docstring; `doc` as decode_chunk's)."""
    events = decode_chunk(data, offset, doc, decoder_for(ctx))
    facts = _Observer(data, offset, ctx, events).run()
    if ctx.checksum:
        facts.crc32 = isal_zlib.crc32(data)
    return facts


def observe_file_chunk(path: str, offset: int, length: int, ctx: Context) -> ChunkFacts:
    """`observe_chunk` of a span of a plain file (the chunk's bytes never cross a pipe)."""
    return observe_chunk(read_span(path, offset, length), offset, ctx)


def observe_received_chunk(slot: int, length: int, offset: int, ctx: Context) -> ChunkFacts:
    """`observe_chunk` of a chunk the parent put in a shared slot between `[` and `]` (see
    parallel.slots.ChunkSlots, builder._submit): decoded where it lies, copied out once for the
    byte work."""
    doc = received_view(slot, length + 2)
    return observe_chunk(bytes(doc[1:-1]), offset, ctx, doc)


_CATEGORY_KINDS = CategoryKinds()
"""The process's memo of category kinds, shared by its chunks: a trace has a few
categories, and classifying them afresh for every chunk cost ~2% of a worker's time."""




class _Texts:
    """The `ts` or `dur` texts of a chunk's events, read where one is needed."""

    __slots__ = ("events", "read")

    def __init__(self, events: list[Event], key: str):
        self.events = events
        self.read = attrgetter(key)

    def __getitem__(self, i: int) -> msgspec.Raw:
        return self.read(self.events[i])


class _Observer(MatchFinding, DuplicateChecks, FlowsAndMetadata):
    def __init__(self, data: bytes, offset: int, ctx: Context, events: list[Event]):
        self.data = data
        self.offset = offset
        self.ctx = ctx
        self.events = events
        self._spans: tuple[np.ndarray, np.ndarray] | None = None
        self._backslashes: np.ndarray | None = None  # where the chunk has one (if it has)
        self.tracks: dict[tuple, int] = {}
        self.groups: dict[tuple, int] = {}
        self.inexact: set[int] = set()  # events whose ts or dur has digits below 1 ns
        self.odd: dict[int, str] = {}  # unread events with an odd ts/dur -> what is odd
        self._kernel_hits: dict | None = None  # name -> patterns, where `_anchor_kernels` ran
        self.vocabulary: dict = {}  # pid -> {kernel name: count}, where patterns are matched

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
            phase = np.fromiter(map(PHASE_CODES.get, phs, repeat(PHASE_OTHER)), np.int8, n)
            phase_counts = Counter(phs)
            try:
                kind_of = np.fromiter(map(kinds_of.__getitem__, [e.cat for e in events]),
                                      np.int8, n)
            except TypeError:  # an unhashable category: classify one by one
                kind_of = np.fromiter((kinds_of.of(e.cat) for e in events), np.int8, n)
            owned = np.fromiter((e.pid is not None and e.tid is not None for e in events),
                                bool, n)
        kind_of[phase != PHASE_COMPLETE] = -1  # only complete events are activity
        is_slice = (kind_of >= KERNEL) & (kind_of <= GPU_SCOPE)
        # strict only where a value is read: GPU activity is moved and timed, flows are
        # bound, guides are checked; any other event passes through whatever it holds
        read_dur = is_slice | (kind_of == LAYER_GUIDE)
        ts_ns, ts_int, has_ts = self._column("ts", read_dur | (phase == PHASE_FLOW))
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
        is_flow = (phase == PHASE_FLOW) & has_ts & owned
        flows = np.flatnonzero(is_flow).tolist()
        is_meta = phase == PHASE_METADATA
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
            event_keys = EventKeys(self.data, starts[cand_index], ends[cand_index],
                                   MOVED_KEYS + SPLICE_KEYS)
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
        window_facts = None
        if self.ctx.window:
            # (the columns read above: nothing read twice)
            times = chunk_times(events, (phase, phase_counts, ts_ns, has_ts, dur_ns, has_dur,
                                         self.inexact))
            starts, ends = self.spans
            # an event's bytes and the separator after it (the whitespace a run copies)
            lengths = np.diff(np.r_[starts, len(self.data) + SEPARATOR_BYTES])
            window_facts = (*chunk_range(times), linked_rows(events, times, self.track),
                            chunk_sizes(times, lengths, (is_slice | (phase == PHASE_FLOW))
                                        if self.ctx.moves_gpu else None))
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
            kernel_vocabulary=self.vocabulary,
            cpu_annotations=name_counts_of(annotations),
            flow_categories=flow_categories,
            phase_counts=phase_counts,
            odd_values=len(self.odd),
            first_odd=min(self.odd.items()) if self.odd else None,
            window=window_facts,
        )

    def _first_on_track(self, others: list[int]) -> dict[tuple, int]:
        """{(pid, tid): the first of `others` on that track}, keyed in order of each track's
        last event, latest first (the order `track` numbers them in)."""
        codes, keys = _native.track_keys(self.events, others)
        codes = np.frombuffer(codes, np.int32)
        first = np.unique(codes, return_index=True)[1]  # per code (0, 1, ...): first position
        last = len(codes) - 1 - np.unique(codes[::-1], return_index=True)[1]
        return {keys[code]: others[first[code]] for code in np.argsort(-last).tolist()}

    def _classified(self, kinds: CategoryKinds) -> tuple | None:
        """(phase codes, category kinds, has a pid and a tid, phase counts) of the events;
        None where `_native.classify` declines them (an unhashable category, many phases)."""
        try:
            phases, kind_codes, owners, counts = _native.classify(
                self.events, PHASE_CODES, PHASE_OTHER, kinds)
        except TypeError:
            return None
        return (np.frombuffer(phases, np.int8), np.frombuffer(kind_codes, np.int8),
                np.frombuffer(owners, bool), Counter(counts))

    def _column(self, key: str, strict: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Exact values of the `ts` or `dur` column: (floor ns, integer literal?, present?) per
        event.

        Absent values are 0 (their events are never read). Each value is parsed by
        its own shape: integers and numbers with one to three decimals (Kineto's
        shapes, and floats such as `68.0`) a shape group at a time
        (`_native.decimal_column`), anything else one by one (and marked in
        `self.inexact` when it has digits below 1 ns).
        So `"ts": 0` on metadata among epoch values with three decimals costs its
        own event, not its chunk. Non-numbers and values out of range are refused
        where `strict` (the value is read); elsewhere they count as absent and are
        noted in `self.odd`.
        """
        ns, shapes = _native.decimal_column(self.events, key, key != "dur")
        ns, shapes = np.frombuffer(ns, np.int64), np.frombuffer(shapes, np.int8)
        integer = shapes == _native.SHAPE_INTEGER
        has = (shapes == _native.SHAPE_INTEGER) | (shapes == _native.SHAPE_DECIMAL)
        odd = np.flatnonzero(shapes == _native.SHAPE_OTHER)
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
            value, problem = time_value(t, key)
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
                k = next(k for k, d in enumerate(devices) if not hashable(d))
                raise self.fail(slices[k], "`args.device` of a GPU event must be a number or "
                                           f"a string, not {json_type(devices[k])}") from None
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
            ts_f = double_column(start, ts_texts, slices, inexact)
            dur_f = double_column(dur, dur_texts, slices, inexact)
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
            rows["lane_group"] = (0 if self.ctx.lane_groups is None
                                  else self._lane_group_codes(slices, kind_a))
        kernels = np.flatnonzero(kind_a == KERNEL).tolist()
        if not kernels:
            return rows, matches, kernel_names
        if self.ctx.count_names:
            kernel_names = self._kernel_names(slices, kernels, groups)
        if patterns:
            matches = self._matches(slices, kernels, start, dur, tracks, groups)
        return rows, matches, kernel_names







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








def _intern(table, keys: list) -> list[int]:
    ids = {key: table(*key) for key in dict.fromkeys(keys)}
    return list(map(ids.__getitem__, keys))


def _quoted(value) -> str:
    """A pid/tid as a message shows it: a number as is, a string in JSON quotes."""
    return orjson.dumps(value).decode() if isinstance(value, str) else str(value)


