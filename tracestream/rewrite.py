"""The rewrite pass: stream the source again and apply the plan's edits in order.

Bytes between edited events are copied as they are (whole ranges, never
re-encoded); a relocated event is its own bytes with two splices; a retired
metadata event is dropped with one neighbouring separator; new events go just
after the last original event and the `tracestream` member just after the last
top-level value.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from tracestream.edit import relocate
from tracestream.errors import TraceError
from tracestream.index import TraceIndex
from tracestream.plan import DELETE, KEEP, Plan
from tracestream.sink import OutputFile
from tracestream.source import ReadStats, TraceSource

_WS = b" \t\r\n"


class StreamCursor:
    """Sequential access to the decompressed stream by absolute offset."""

    def __init__(self, blocks: Iterable[bytes]):
        self._blocks = iter(blocks)
        self._data = b""
        self._base = 0  # absolute offset of _data[0]
        self.pos = 0  # absolute offset of the next byte not yet consumed

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

    def _next_block(self) -> None:
        block = next(self._blocks, None)
        if block is None:
            raise TraceError("input ended early in the rewrite pass (it changed since the index pass)")
        self._base += len(self._data)
        self._data = block

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

    def peek_byte(self) -> bytes:
        while True:
            rel = self.pos - self._base
            if rel < len(self._data):
                return self._data[rel : rel + 1]
            block = next(self._blocks, None)
            if block is None:
                return b""
            self._base += len(self._data)
            self._data = block

    def skip_separator(self) -> bool:
        """Skip whitespace and one comma after an event; True if a comma was skipped."""
        comma = False
        while True:
            c = self.peek_byte()
            if c and c in _WS:
                self.pos += 1
            elif c == b"," and not comma:
                comma = True
                self.pos += 1
            else:
                return comma

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


def rewrite(source: TraceSource, index: TraceIndex, plan: Plan, out: OutputFile,
            *, progress=None) -> None:
    stats = ReadStats()
    blocks: Iterable[bytes] = source.read(stats)
    if progress is not None:
        blocks = progress.wrap(blocks, "rewrite")
    cursor = StreamCursor(blocks)
    layout = index.layout
    targets = plan.targets
    member = _member_edit(index, plan)
    if member is not None and member[0] < layout.events_open:
        _splice(cursor, out, member)
        member = None
    dangling_separator = False
    for ordinal, offset, length, action in edits(index, plan):
        cursor.copy_to(out, offset)
        raw = cursor.take(length)
        if action == DELETE:
            comma = cursor.skip_separator()
            dangling_separator = not comma
            continue
        new_tid, new_pid = targets[action]
        out.write(relocate(raw, new_tid, ordinal, new_pid))
        dangling_separator = False
    insert_at = layout.last_event_end if layout.event_count else layout.events_open + 1
    if cursor.pos < insert_at:
        cursor.copy_to(out, insert_at)
        dangling_separator = False
    if plan.appended:
        lead = b"" if (not layout.event_count or dangling_separator) else b",\n"
        out.write(lead + b",\n".join(plan.appended))
    elif dangling_separator:
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
