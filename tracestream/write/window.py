"""The rewrite pass of windows: each output gets only the events its window holds
(index.window's rule), with the plan's edits, in the source's order; the pieces of a
split are all written in this one pass.

The stream is cut where the index pass cut it. A chunk whose events all lie outside
every window (none in every window, no linked event kept) is skipped undecoded; one
whose events all lie inside one window (no linked event dropped, no metadata retired)
is copied or edited as the full rewrite does it; any other goes to a worker
(`window_chunk`), which decodes it once and cuts it for each window it reaches. Events
are joined by ",\\n" where the source's separators were cut out; the bytes before the
first event and after the last are the source's.

From an uncompressed file, as in the full rewrite, the workers read the chunks they
rewrite or cut themselves, and the CRC-32 of every chunk the pass skips (the pass
checksums every byte of its source; see write.rewrite.FileCursor): this process reads
only the chunks it copies as they are.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np
from isal import isal_zlib

from tracestream.index.decode import decode_chunk, event_spans
from tracestream.index.window import Window, chunk_times
from tracestream.parallel.memory import collector_paused, release_memory
from tracestream.parallel.pool import SLOTS_PER_WORKER, InlinePool, outcome
from tracestream.parallel.slots import write_result
from tracestream.plan.planner import DELETE, Plan
from tracestream.plan.window import DECISION_DTYPE
from tracestream.progress import Progress, or_silent
from tracestream.read.hashing import PieceChecksum, ReadStats
from tracestream.read.source import TraceSource, read_span
from tracestream.write.rewrite import (
    FileCursor,
    StreamCursor,
    _member_edit,
    _refuse_if_changed,
    chunk_edits,
    file_span_crc,
    rewrite_chunk,
    submit_chunk,
)

_TRIM_EVERY = 8
_JOIN = b",\n"


def window_chunk(data: bytes, offset: int, first_ordinal: int, rows: np.ndarray,
                 actions: np.ndarray, targets: dict, windows: list[tuple[Window, int]],
                 decisions: np.ndarray) -> list[tuple[bytes, int]]:
    """For each (window, piece) given: the chunk's members with their edits, joined, and
    how many there are.

    `rows`/`actions`: the plan's edits of the chunk (as `rewrite_chunk` takes them; a
    DELETE is a retired metadata event, left out of every window); `decisions`: the
    chunk's kept linked events (DECISION_DTYPE: kept in pieces first … last)."""
    events = decode_chunk(data, offset)
    starts, ends = _spans(events, data)
    times = chunk_times(events)
    local = rows["ordinal"] - first_ordinal
    retired = local[actions == DELETE]
    edited = actions != DELETE
    rows, actions, local = rows[edited], actions[edited], local[edited]
    out = []
    for window, piece in windows:
        kept = decisions["ordinal"][(decisions["first"] <= piece)
                                    & (decisions["last"] >= piece)] - first_ordinal
        keep = times.members(window, kept)
        keep[retired] = False
        out.append(_members(data, offset, starts, ends, keep, rows, actions, local, targets))
    return out


def window_file_chunk(path: str, offset: int, length: int, *args
                      ) -> tuple[list[tuple[bytes, int]], int]:
    """`window_chunk` of a span of a plain file, read by the worker itself, and the CRC-32
    of the bytes it read (see FileCursor)."""
    data = read_span(path, offset, length)
    return window_chunk(data, offset, *args), isal_zlib.crc32(data)


def _members(data, offset, starts, ends, keep, rows, actions, local, targets) -> tuple[bytes,
                                                                                     int]:
    """The kept events, edited, joined (runs of consecutive members copied as one)."""
    if not keep.any():
        return b"", 0
    edges = np.diff(np.r_[0, keep.view(np.int8), 0])
    pieces = []
    for first, stop in zip(np.flatnonzero(edges == 1).tolist(),
                           np.flatnonzero(edges == -1).tolist()):
        lo, hi = int(starts[first]), int(ends[stop - 1])
        at = slice(*np.searchsorted(local, [first, stop]).tolist())
        piece, _ = rewrite_chunk(data[lo:hi], offset + lo, rows[at], actions[at], targets)
        pieces.append(piece)
    return _JOIN.join(pieces), int(keep.sum())


def _spans(events, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The events' byte spans (the scan's where it made them, else event_spans')."""
    if hasattr(events, "spans") and len(events):
        starts, ends = (np.frombuffer(b, np.int64) for b in events.spans())
        if starts[0] == 0 and ends[-1] == len(data):
            return starts, ends
    return event_spans(data, len(events))


def rewrite_window(source: TraceSource, index, plans: list[Plan], outs: list, *,
                   progress: Progress | None = None, pool=None, report_rows=None,
                   phase: str = "rewrite") -> None:
    """The rewrite pass of plans with windows (one per output, from one cut: see
    plan.window.CutPlan), which counts what it wrote into each report. `report_rows`:
    per output, where its guides' report rows go (see engine.report_rows), or None;
    `progress` sees the pass as `phase`."""
    meter = or_silent(progress).phase(phase, source.progress_total)
    stats = ReadStats()
    pool = pool if pool is not None else InlinePool()
    outs = [CountingWriter(out) for out in outs]
    by_path = source.plain_path if pool.workers else None
    with collector_paused():
        try:
            one_pass = _Pass(index, plans, outs, pool, report_rows or [None] * len(plans))

            def written(offset: int) -> None:
                meter.advance_to(stats.position(offset))

            if by_path is not None:  # the workers read what they rewrite, cut or skip
                cursor = FileCursor(source.open_plain(), PieceChecksum())
                try:
                    counts = one_pass.run(cursor, written, by_path)
                finally:
                    cursor.close()
                cursor.checksum.finish(stats)
            else:
                counts = one_pass.run(StreamCursor(source.read(stats)), written)
            source.finish_read(stats)
            meter.advance_to(stats.raw_bytes)
        except Exception:
            if not any(out.failed for out in outs):
                _refuse_if_changed(source)
            raise
        finally:
            meter.close()
    for plan, out, events in zip(plans, outs, counts):
        plan.report["output_event_count"] = events + plan.report["added_event_count"]
        window = plan.report["window"]
        window.update(source_events_written=events,
                      source_events_left_out=index.event_count - events)
        if plan.window.spec.piece is not None:  # (the manifest lists it)
            window["json_bytes"] = out.bytes


class _Pass:
    """One pass over the source into every output."""

    def __init__(self, index, plans: list[Plan], outs: list, pool, report_rows: list):
        self.index, self.plans, self.outs, self.pool = index, plans, outs, pool
        self.report_rows = report_rows
        cut = plans[0].window.cut
        self.windows = [(plan.window.window, plan.window.piece) for plan in plans]
        self.decisions = cut.linked.kept
        self.wrote = [False] * len(plans)
        self.events = [0] * len(plans)

    def run(self, cursor: StreamCursor | FileCursor, written,
            by_path: str | None = None) -> list[int]:
        """The pass over `cursor`; with `by_path` (a FileCursor's file), the workers read
        the chunks they are given from it, and the CRC of each chunk left out."""
        self.cursor, self.by_path = cursor, by_path
        index, layout = self.index, self.index.layout
        members = [_member_edit(index, plan) for plan in self.plans]
        pending: deque = deque()  # (what each output gets, its checksum span, chunk end)
        depth = max(1, SLOTS_PER_WORKER * self.pool.workers)
        decided = _InFileOrder(self.decisions)
        first, flushed = True, 0
        for chunk, rows, actions in chunk_edits(index, self.plans[0]):
            head = cursor.take(chunk.offset - cursor.pos)
            if first:  # the document up to the first event: the source's, in every output
                for out, member in zip(self.outs, members):
                    out.write(_with_member(head, 0, member))
                first = False
            decisions = decided.upto(chunk.first_ordinal + chunk.count)
            pending.append((*self._chunk(chunk, rows, actions, decisions),
                            chunk.offset + chunk.length))
            while len(pending) > depth:
                flushed = self._flush(pending, written, flushed)
        while pending:
            flushed = self._flush(pending, written, flushed)
        if not layout.event_count and first:
            head = cursor.take(layout.events_open + 1 - cursor.pos)
            for out, member in zip(self.outs, members):
                out.write(_with_member(head, 0, member))
        insert_at = layout.last_event_end if layout.event_count else layout.events_open + 1
        if cursor.pos < insert_at:  # (only whitespace after the last chunk)
            cursor.take(insert_at - cursor.pos)
        for k, (plan, out) in enumerate(zip(self.plans, self.outs)):
            if plan.appended:
                lead = _JOIN if self.wrote[k] else b""
                for text in plan.appended.texts(self.report_rows[k]):
                    out.write(lead)
                    out.write(text)
                    lead = _JOIN
        base = cursor.pos
        tail = cursor.take_rest()
        for out, member in zip(self.outs, members):
            out.write(_with_member(tail, base, member))
        return self.events

    def _chunk(self, chunk, rows, actions, decisions: np.ndarray) -> tuple[dict, int | None]:
        """What the outputs get of `chunk` ({output: payload or a worker's future}), and
        the number of its span in the checksum where a worker reads it (else None)."""
        cursor, by_path = self.cursor, self.by_path
        reached = []
        for k, (window, piece) in enumerate(self.windows):
            inside_decided = ((decisions["first"] <= piece) & (decisions["last"] >= piece))
            if (chunk.always or inside_decided.any()
                    or (chunk.first_ns < window.end_ns and chunk.last_ns >= window.start_ns)):
                reached.append(k)
        if not reached:
            if by_path is None:
                cursor.skip(chunk.length)
                return {}, None
            return ({_CRC: self.pool.submit(file_span_crc, by_path, chunk.offset,
                                            chunk.length)},
                    cursor.skip(chunk.length))
        targets = self.plans[0].targets
        if len(reached) == 1:
            window, piece = self.windows[reached[0]]
            kept = int(((decisions["first"] <= piece) & (decisions["last"] >= piece)).sum())
            if (not chunk.always and kept == chunk.linked
                    and chunk.first_ns >= window.start_ns and chunk.last_ns < window.end_ns
                    and not (actions == DELETE).any()):
                if not len(rows):
                    return {reached[0]: [(cursor.take(chunk.length), chunk.count)]}, None
                return self._edited(reached[0], chunk, rows, actions, targets)
        cut = (rows, actions, targets, [self.windows[k] for k in reached], decisions)
        if by_path is None:
            future = self.pool.submit(window_chunk, cursor.take(chunk.length), chunk.offset,
                                      chunk.first_ordinal, *cut)
            return {_ALL: (future, reached)}, None
        future = self.pool.submit(window_file_chunk, by_path, chunk.offset, chunk.length,
                                  chunk.first_ordinal, *cut)
        return {_ALL: (future, reached)}, cursor.skip(chunk.length)

    def _edited(self, k: int, chunk, rows, actions, targets) -> tuple[dict, int | None]:
        """A chunk whose every event is a member of its one window (output `k`), rewritten
        by a worker as the full rewrite has it rewritten (`submit_chunk`: read by the
        worker itself from a plain file, else through a shared slot where one is free; the
        megabytes in flight never pickled, never held in this process's heap)."""
        slot = self.pool.slots.acquire() if self.pool.slots is not None else None
        future, span = submit_chunk(self.pool, self.cursor, self.by_path, slot, chunk, rows,
                                    actions, targets)
        return {k: _Edited(future, slot, chunk.count)}, span

    def _flush(self, pending: deque, written, flushed: int) -> int:
        given, span, end = pending.popleft()
        flushed += 1
        if flushed % _TRIM_EVERY == 0:
            release_memory()
        if _CRC in given:  # a chunk left out: only its CRC
            self.cursor.checksum.fill(span, outcome(given.pop(_CRC)))
        if _ALL in given:
            future, reached = given.pop(_ALL)
            results = outcome(future)
            if span is not None:
                results, crc = results
                self.cursor.checksum.fill(span, crc)
            given = dict(zip(reached, ([r] for r in results)))
        for k, payload in given.items():
            if isinstance(payload, _Edited):
                result, _, *crc = outcome(payload.future)  # (it dropped nothing: no DELETE)
                if span is not None:
                    self.cursor.checksum.fill(span, *crc)
                if self.wrote[k]:
                    self.outs[k].write(_JOIN)
                write_result(self.outs[k], result, payload.slot, self.pool.slots)
                self.wrote[k] = True
                self.events[k] += payload.count
                continue
            if not isinstance(payload, list):
                payload = outcome(payload)
            for text, count in payload:
                if text:
                    if self.wrote[k]:
                        self.outs[k].write(_JOIN)
                    self.outs[k].write(text)
                    self.wrote[k] = True
                    self.events[k] += count
        written(end)
        return flushed


_ALL, _CRC = "all", "crc"
"""Keys of what `_Pass._chunk` gives besides outputs: a worker's cut of the chunk for every
output it reaches; the CRC of a chunk left out that a worker read."""


class _Edited(NamedTuple):
    """A worker's rewrite of a chunk for one window: its future, its slot (or None) and
    how many source events it holds."""

    future: object
    slot: int | None
    count: int


class _InFileOrder:
    """The decisions store read alongside the chunks (both in ordinal order)."""

    def __init__(self, store):
        self._blocks = store.sorted_blocks() if store is not None else iter(())
        self._rows = np.zeros(0, DECISION_DTYPE)

    def upto(self, stop: int) -> np.ndarray:
        """The rows with ordinals below `stop` not handed out yet."""
        while not len(self._rows) or self._rows["ordinal"][-1] < stop:
            block = next(self._blocks, None)
            if block is None:
                break
            self._rows = np.concatenate([self._rows, block])
        cut = int(np.searchsorted(self._rows["ordinal"], stop))
        taken, self._rows = self._rows[:cut], self._rows[cut:]
        return taken


class CountingWriter:
    """An output that counts the (uncompressed) bytes written to it (a piece's JSON size)."""

    def __init__(self, out):
        self.out = out
        self.bytes = 0

    @property
    def failed(self) -> bool:
        return self.out.failed

    def write(self, data) -> None:
        self.bytes += len(data)
        self.out.write(data)

    def write_then(self, data: memoryview, done) -> None:
        """OutputFile.write_then: `data` written, then `done()` (a slot freed)."""
        self.bytes += len(data)
        self.out.write_then(data, done)


def _with_member(data: bytes, base: int, member) -> bytes:
    """`data` (the source's bytes from `base`) with the `tracestream` member spliced in,
    where it falls inside."""
    if member is None:
        return data
    start, end, text = member
    if not base <= start <= base + len(data):
        return data
    return data[: start - base] + text + data[end - base:]
