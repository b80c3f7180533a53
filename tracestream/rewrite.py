"""The rewrite pass: stream the source again and apply the plan's edits in order.

The stream is cut exactly where the index pass cut it. Chunks without edits are
copied as they are; chunks with edits go to a worker (`rewrite_chunk`), which
copies every unchanged byte and splices the relocated events. A retired
metadata event is dropped with its following separator; new events go just
after the last original event and the `tracestream` member just after the last
top-level value (or in place of an older one).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

import numpy as np

from tracestream.edit import relocate
from tracestream.errors import TraceError
from tracestream.index import TraceIndex
from tracestream.plan import DELETE, KEEP, Plan
from tracestream.sink import OutputFile
from tracestream.source import ReadStats, TraceSource
from tracestream.workers import InlinePool

_WINDOW_PER_WORKER = 3


class StreamCursor:
    """Sequential access to the decompressed stream by absolute offset."""

    def __init__(self, blocks: Iterable[bytes]):
        self._blocks = iter(blocks)
        self._data = b""
        self._base = 0  # absolute offset of _data[0]
        self.pos = 0  # absolute offset of the next byte not yet consumed

    def _next_block(self) -> None:
        block = next(self._blocks, None)
        if block is None:
            raise TraceError(
                "input ended early in the rewrite pass (it changed since the index pass)")
        self._base += len(self._data)
        self._data = block

    def copy_to(self, out: OutputFile, offset: int) -> None:
        """Write [pos, offset) to `out` and advance."""
        while self.pos < offset:
            rel = self.pos - self._base
            if rel >= len(self._data):
                self._next_block()
                continue
            end = min(len(self._data), offset - self._base)
            out.write(self._data[rel:end])
            self.pos = self._base + end

    def take(self, length: int) -> bytes:
        """The next `length` bytes."""
        parts = []
        need = length
        while need:
            rel = self.pos - self._base
            if rel >= len(self._data):
                self._next_block()
                continue
            piece = self._data[rel : rel + need]
            parts.append(piece)
            need -= len(piece)
            self.pos += len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def drain(self, out: OutputFile) -> None:
        """Copy everything that is left."""
        while True:
            rel = self.pos - self._base
            if rel < len(self._data):
                out.write(self._data[rel:])
            self._base += len(self._data)
            self.pos = self._base
            block = next(self._blocks, None)
            if block is None:
                self._data = b""
                return
            self._data = block


def rewrite_chunk(data: bytes, offset: int, rows: np.ndarray, actions: np.ndarray,
                  targets: dict) -> tuple[bytes, bool]:
    """A chunk (starting at absolute `offset`) with its edits applied.

    `rows` are the span records of the chunk's changed events (ascending), `actions`
    the plan's action for each. A dropped event takes its following separator with
    it; True comes back when that was the chunk's last event (the caller then skips
    the separator after the chunk).
    """
    out = []
    pos = 0
    dropped_last = False
    size = len(data)
    for row, action in zip(rows.tolist(), actions.tolist()):
        ordinal, at, length, _, pid_at, pid_len, tid_at, tid_len, args_at, args_empty = row
        start = at - offset
        end = start + length
        out.append(data[pos:start])
        if action == DELETE:
            pos = _after_separator(data, end)
            dropped_last = pos >= size
            continue
        dropped_last = False
        positions = None
        if pid_at >= 0:
            positions = ((pid_at, pid_at + pid_len), (tid_at, tid_at + tid_len), args_at,
                         bool(args_empty))
        new_tid, new_pid = targets[action]
        out.append(relocate(data[start:end], new_tid, ordinal, new_pid, positions))
        pos = end
    out.append(data[pos:])
    return b"".join(out), dropped_last


def _after_separator(data: bytes, pos: int) -> int:
    """Position after the whitespace and one comma that follow an event (or the end)."""
    size = len(data)
    while pos < size and data[pos] in b" \t\r\n":
        pos += 1
    if pos < size and data[pos] == 0x2C:  # ','
        pos += 1
        while pos < size and data[pos] in b" \t\r\n":
            pos += 1
    return pos


def edits(index: TraceIndex, plan: Plan) -> Iterator[tuple[int, int, int, int]]:
    """(ordinal, offset, length, action) of every candidate the plan changes, in file order."""
    start = 0
    actions = plan.actions
    for batch in index.spans.batches():
        part = actions[start : start + len(batch)]
        changed = np.flatnonzero(part != KEEP)
        if len(changed):
            rows = batch[changed]
            yield from zip(
                rows["ordinal"].tolist(), rows["offset"].tolist(), rows["length"].tolist(),
                part[changed].tolist(),
            )
        start += len(batch)


def chunk_edits(index: TraceIndex, plan: Plan) -> Iterator[tuple[object, np.ndarray, np.ndarray]]:
    """(chunk, span records of its changed events, their actions) for every chunk, in order."""
    actions = plan.actions
    changed_rows: list[np.ndarray] = []
    changed_actions: list[np.ndarray] = []
    start = 0
    for batch in index.spans.batches():
        part = actions[start : start + len(batch)]
        mask = part != KEEP
        if mask.any():
            changed_rows.append(batch[mask])
            changed_actions.append(part[mask])
        start += len(batch)
    rows = np.concatenate(changed_rows) if changed_rows else np.zeros(0, index.spans.dtype)
    acts = np.concatenate(changed_actions) if changed_actions else np.zeros(0, np.uint16)
    bounds = np.searchsorted(rows["ordinal"], [c.first_ordinal for c in index.chunks]
                             + [index.event_count])
    for k, chunk in enumerate(index.chunks):
        lo, hi = bounds[k], bounds[k + 1]
        yield chunk, rows[lo:hi], acts[lo:hi]


def rewrite(source: TraceSource, index: TraceIndex, plan: Plan, out: OutputFile,
            *, progress=None, pool=None) -> None:
    pool = pool if pool is not None else InlinePool()
    stats = ReadStats()
    blocks: Iterable[bytes] = source.read(stats)
    if progress is not None:
        blocks = progress.wrap(blocks, "rewrite")
    cursor = StreamCursor(blocks)
    layout = index.layout
    member = _member_edit(index, plan)
    if member is not None and member[0] < layout.events_open:
        _splice(cursor, out, member)
        member = None
    # items in output order: (separator bytes, payload bytes or a worker's future)
    pending: deque = deque()
    window = _WINDOW_PER_WORKER * pool.workers
    dropped_last = False
    first = True

    def flush_one() -> None:
        nonlocal dropped_last
        separator, payload, conditional = pending.popleft()
        if not (conditional and dropped_last):
            out.write(separator)
        if isinstance(payload, bytes):
            out.write(payload)
            dropped_last = False
        else:
            data, dropped_last = payload.result()
            out.write(data)

    for chunk, rows, actions in chunk_edits(index, plan):
        separator = cursor.take(chunk.offset - cursor.pos)
        data = cursor.take(chunk.length)
        if len(rows):
            payload = pool.submit(rewrite_chunk, data, chunk.offset, rows, actions, plan.targets)
        else:
            payload = data
        pending.append((separator, payload, not first))
        first = False
        while len(pending) > window:
            flush_one()
    while pending:
        flush_one()
    insert_at = layout.last_event_end if layout.event_count else layout.events_open + 1
    if cursor.pos < insert_at:
        cursor.copy_to(out, insert_at)
    if plan.appended:
        lead = b"" if (not layout.event_count or dropped_last) else b",\n"
        out.write(lead + b",\n".join(plan.appended))
    elif dropped_last:
        raise TraceError("internal error: a dropped last event left a dangling separator")
    if member is not None:
        _splice(cursor, out, member)
    cursor.drain(out)
    source.finish_read(stats)


def _member_edit(index: TraceIndex, plan: Plan) -> tuple[int, int, bytes] | None:
    """Where the `tracestream` member goes: replacing an earlier one, else after the last key."""
    if plan.top_level_member is None:
        return None
    for value in index.layout.values:
        if value.key == "tracestream":
            return value.value_start, value.value_end, plan.top_level_member.split(b": ", 1)[1]
    end = _last_member_end(index)
    return end, end, b",\n  " + plan.top_level_member


def _splice(cursor: StreamCursor, out: OutputFile, edit: tuple[int, int, bytes]) -> None:
    start, end, text = edit
    cursor.copy_to(out, start)
    cursor.take(end - start)
    out.write(text)


def _last_member_end(index: TraceIndex) -> int:
    layout = index.layout
    ends = [v.value_end for v in layout.values] + [layout.events_close + 1]
    return max(ends)
