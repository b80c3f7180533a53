"""The source's chunks as the plan rewrites them, streamed beside the output for comparison."""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Iterator

import msgspec
import numpy as np

from tracestream._native import reference
from tracestream.commands.verify.output_checks import WORKER_TRIM_EVERY, OutputChecks
from tracestream.index.builder import TraceIndex
from tracestream.parallel.memory import release_memory
from tracestream.parallel.pool import outcome
from tracestream.parallel.slots import deliver, received
from tracestream.plan.planner import DELETE, Plan
from tracestream.read.hashing import ReadStats
from tracestream.read.source import TraceSource, read_span
from tracestream.write.rewrite import StreamCursor, chunk_edits, dropped_last, rewrite_chunk


def observed_file_chunk(path: str, offset: int, length: int, first: int,
                        synthetic: dict[tuple, str]) -> tuple | None:
    """`observed_chunk` of a span of a plain file, read by the worker itself."""
    return observed_chunk(read_span(path, offset, length), first, synthetic)


def observed_chunk(content: bytes, first: int, synthetic: dict[tuple, str]) -> tuple | None:
    """The output-only checks' facts of a run of events (`content`, the first numbered
    `first` in the output), in a worker; None when they are not JSON (the per-event
    comparison then names what is wrong)."""
    facts = _facts_of(content, first, synthetic)
    _worker_trim()
    return facts


def _facts_of(content: bytes, first: int, synthetic: dict[tuple, str]) -> tuple | None:
    """What `observed_chunk` says, in the calling process. The decode and the UTF-8 check
    are those the output's scan would make: an output that is these bytes is valid where
    they are."""
    checks = OutputChecks.of_chunk(synthetic)
    try:
        if not content.isascii():
            content.decode("utf-8")
        checks.observe_chunk(first, None, content)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return checks.facts()


_TRAILING_SEPARATOR = re.compile(rb"(?:[ \t\r\n]*,[ \t\r\n]*)?\Z")


class Sequential:
    """Bytes handed out in order from an iterator of pieces."""

    def __init__(self, pieces: Iterator[bytes]):
        self._pieces = pieces
        self._data = b""
        self._pos = 0

    def _left(self) -> int:
        """Bytes left in the current piece, moving on to the next non-empty one (0: none)."""
        while self._pos >= len(self._data):
            piece = next(self._pieces, None)
            if piece is None:
                return 0
            # (bytes, whose `startswith` `matches` compares with)
            self._data, self._pos = bytes(piece) if type(piece) is not bytes else piece, 0
        return len(self._data) - self._pos

    def take(self, length: int) -> bytes | None:
        """The next `length` bytes, or None when fewer are left."""
        parts = []
        while length:
            left = self._left()
            if not left:
                return None
            n = min(left, length)
            parts.append(self._data[self._pos : self._pos + n])
            self._pos += n
            length -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def matches(self, data: bytes | memoryview) -> bool:
        """Whether the next len(data) bytes are `data`, compared where both lie: no copy of
        a 16 MB chunk's worth of planned or output bytes (whose pages would be faulted in)
        to compare them. (The caller stops at the first chunk that differs.)"""
        at = 0
        with memoryview(data) as view:
            while at < len(view):
                left = self._left()
                if not left:
                    return False
                length = min(left, len(view) - at)
                if not self._data.startswith(view[at : at + length], self._pos):
                    return False
                self._pos += length
                at += length
        return True

    def ended(self) -> bool:
        """Whether every byte was taken."""
        return self._pos >= len(self._data) and not any(self._pieces)


class PlannedStream:
    """The rewrite's output from the first event to the end of the added events, made again
    a chunk at a time (as `rewrite._rewrite` does) with the splice's numpy twin; the report's
    retired events are compared with the source's on the way (`retired_ok`).

    The output-only checks (`checks`) observe the planned events in the workers, as each
    chunk is made: where the output is byte for byte these pieces, they are its events,
    numbered as in the output, so the output is never decoded (`observed_ok` is False when
    a piece is not JSON: the per-event comparison then says what is wrong)."""

    def __init__(self, source: TraceSource, index: TraceIndex, plan: Plan, retired_map: dict,
                 pool, checks: OutputChecks):
        self._source, self._index, self._plan = source, index, plan
        self._retired = retired_map
        self._pool = pool
        self._checks = checks
        self._pending: deque = deque()
        self.retired_ok = True
        self.observed_ok = True

    def pieces(self) -> Iterator[bytes]:
        index, plan, pool, pending = self._index, self._plan, self._pool, self._pending
        cursor = StreamCursor(self._source.read(ReadStats()))
        window = 2 * max(pool.workers, 1)
        by_path = self._source.plain_path if pool.workers else None
        synthetic = self._checks.synthetic
        ends_dropped = False
        first = True
        dropped_before = 0  # retired events before this chunk: output ordinals lag by them
        for chunk, rows, actions in chunk_edits(index, plan):
            separator = cursor.take(chunk.offset - cursor.pos)
            dropping = int((actions == DELETE).sum()) if len(rows) else 0
            out_first = chunk.first_ordinal - dropped_before
            dropped_before += dropping
            # a worker hands its chunk back in a shared slot when one is free
            slot = pool.slots.acquire() if len(rows) and pool.slots is not None else None
            if len(rows) and by_path is not None and not dropping:
                cursor.skip(chunk.length)
                payload = pool.submit(planned_file_chunk, by_path, chunk.offset, chunk.length,
                                      rows, actions, plan.targets, slot, out_first, synthetic)
            elif len(rows):
                data = cursor.take(chunk.length)
                if dropping:
                    self._check_retired(data, chunk.offset, rows, actions)
                if slot is not None and pool.slots.put(slot, data):  # no pickle, no pipe
                    payload = pool.submit(planned_slot_chunk, slot, len(data), chunk.offset,
                                          rows, actions, plan.targets, out_first, synthetic)
                else:
                    payload = pool.submit(planned_chunk, data, chunk.offset, rows, actions,
                                          plan.targets, slot, out_first, synthetic)
            else:
                data = cursor.take(chunk.length)
                observing = (pool.submit(observed_file_chunk, by_path, chunk.offset,
                                         chunk.length, out_first, synthetic)
                             if by_path is not None else
                             pool.submit(observed_chunk, data, out_first, synthetic))
                payload = (data, observing)
            pending.append((b"" if first else separator, payload, not first, slot))
            first = False
            while len(pending) > window:
                piece, ends_dropped = self._next(ends_dropped)
                yield from piece
        while pending:
            piece, ends_dropped = self._next(ends_dropped)
            yield from piece
        if plan.appended:
            yield from self._appended(index.layout.event_count - dropped_before, ends_dropped,
                                      window)

    def _appended(self, out_first: int, ends_dropped: bool, window: int) -> Iterator[bytes]:
        """The plan's added events, a block at a time, observed in the workers meanwhile."""
        lead = b"" if (not self._index.layout.event_count or ends_dropped) else b",\n"
        observing: deque = deque()
        for content in self._plan.appended.texts():
            observing.append(self._pool.submit(observed_chunk, content, out_first,
                                               self._checks.synthetic))
            out_first += content.count(b",\n") + 1  # (no raw newline inside a JSON string)
            yield lead + content
            lead = b",\n"
            while len(observing) > window:
                self._merge(outcome(observing.popleft()))
        while observing:
            self._merge(outcome(observing.popleft()))

    def _merge(self, facts: tuple | None) -> None:
        if facts is None:
            self.observed_ok = False
        elif self.observed_ok:
            self._checks.merge(facts)

    def _next(self, ends_dropped: bool) -> tuple[tuple[bytes, ...], bool]:
        """The next chunk's separator and bytes, and whether its last event was dropped
        (its checks' facts merged on the way)."""
        separator, payload, conditional, slot = self._pending.popleft()
        lead = b"" if conditional and ends_dropped else separator
        if isinstance(payload, tuple):
            data, observing = payload
            self._merge(outcome(observing))
            return (lead, data), False
        spliced, dropped, facts = outcome(payload)
        self._merge(facts)
        if isinstance(spliced, int):  # its length, in the slot
            spliced = self._pool.slots.read(slot, spliced)
        if slot is not None:
            self._pool.slots.release(slot)
        return (lead, spliced), dropped_last(dropped)

    def _check_retired(self, data: bytes, offset: int, rows: np.ndarray,
                       actions: np.ndarray) -> None:
        for ordinal, start, length, action in zip(rows["ordinal"].tolist(),
                                                  rows["offset"].tolist(),
                                                  rows["length"].tolist(), actions.tolist()):
            start -= offset
            if action == DELETE and self._retired.get(ordinal) != data[start : start + length]:
                self.retired_ok = False

    def close(self) -> None:
        """Drop the chunks still being made (the comparison stopped early; their slots stay
        taken, a worker may still write in them)."""
        for _, payload, _, _ in self._pending:
            (payload[1] if isinstance(payload, tuple) else payload).cancel()
        self._pending.clear()


def planned_file_chunk(path: str, offset: int, length: int, rows: np.ndarray,
                       actions: np.ndarray, targets: dict, slot: int | None, first: int,
                       synthetic: dict[tuple, str]
                       ) -> tuple[bytes | int, tuple[bytes, ...], tuple | None]:
    """`planned_chunk` of a span of a plain file, read by the worker itself."""
    return planned_chunk(read_span(path, offset, length), offset, rows, actions, targets, slot,
                         first, synthetic)


def planned_slot_chunk(slot: int, length: int, offset: int, rows: np.ndarray,
                       actions: np.ndarray, targets: dict, first: int,
                       synthetic: dict[tuple, str]
                       ) -> tuple[bytes | int, tuple[bytes, ...], tuple | None]:
    """`planned_chunk` of the source bytes the parent put in `slot` (copied out first: the
    planned bytes go back in the same slot)."""
    return planned_chunk(received(slot, length), offset, rows, actions, targets, slot, first,
                         synthetic)


def planned_chunk(data: bytes, offset: int, rows: np.ndarray, actions: np.ndarray,
                  targets: dict, slot: int | None, first: int, synthetic: dict[tuple, str]
                  ) -> tuple[bytes | int, tuple[bytes, ...], tuple | None]:
    """A source chunk as the plan makes it, spliced by the numpy twin of the rewrite's C
    splice, so the two are checked against each other (in a worker: handed back in `slot`
    if it has one, see parallel.slots.deliver), the separators its dropped events took,
    and the output-only checks' facts of its events (the first numbered `first` in the
    output; see `observed_chunk`)."""
    spliced, dropped = rewrite_chunk(data, offset, rows, actions, targets,
                                     splice=reference.splice)
    result = deliver(spliced, slot)
    del data
    if dropped_last(dropped):  # it ends with the separator before its dropped last event
        spliced = spliced[: _TRAILING_SEPARATOR.search(spliced).start()]
    facts = _facts_of(spliced, first, synthetic)
    del spliced
    _worker_trim()
    return result, dropped, facts


_worker_tasks = itertools.count(1)


def _worker_trim() -> None:
    """In a worker, after every few chunks: give the pages of their buffers back."""
    if next(_worker_tasks) % WORKER_TRIM_EVERY == 0:
        release_memory()
