"""`restore`: the source trace back, byte for byte, from an annotated trace and its report.

The rewrite pass is a splice that can be undone: every byte it did not change is
still in the annotated trace, in order. `splice_back` copies the annotated
trace's bytes and undoes each edit where it lies:

* a relocated event (its provenance is the first member of its own `args`, see
  `edit.provenance_match`) gets its pid/tid texts back and loses the member;
* a retired metadata event goes back, with the separator it took with it, before
  the event that followed it (the report keeps both; the source's last events
  go back where the added events begin);
* the added events, and the separator before them, are cut out;
* the added top-level `tracestream` member is cut out with its separator, or an
  older one the source had gets its value back.

The result is checked against the sha256 of the source's decompressed bytes in
the report, so a restore that would not give the source back is refused.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from dataclasses import dataclass

from tracestream.document import DocumentScanner, Layout
from tracestream.edit import provenance_match, unrelocate
from tracestream.errors import TraceError
from tracestream.reports import find_report, load_report
from tracestream.rewrite import StreamCursor
from tracestream.sink import OutputFile, compression_for
from tracestream.source import ReadStats, TraceSource

_SEPARATOR = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
_MARK = b"_compact_gpu_track"
_ADDED_MEMBER = b',\n  "tracestream": '


@dataclass
class Undo:
    """What the report says the rewrite did, as far as undoing it needs."""

    original: int  # source events
    appended_from: int  # output position of the first added event
    retired: list[tuple[int, bytes, bytes]]  # (source index, event, separator after it)
    source_tracestream: bytes | None  # the source's own `tracestream` value, if it had one
    sha256: str  # of the source's decompressed bytes
    name: str  # the annotated trace, for messages

    @classmethod
    def from_report(cls, data: dict, retired: list[tuple[int, bytes]], name: str) -> Undo:
        try:
            rows = data.get("compaction", data).get("retired_track_metadata", [])
            separators = {row["source_event_index"]: row.get("separator") for row in rows}
            if not data.get("source_data_sha256") or None in separators.values():
                raise TraceError(
                    "the report was written by an older tracestream (it has no "
                    "source_data_sha256 or retired separators): restore needs a report of "
                    "this version")
            return cls(
                original=int(data["original_event_count"]),
                appended_from=int(data["output_event_count"]) - int(data["added_event_count"]),
                retired=[(k, event, separators[k].encode()) for k, event in retired],
                source_tracestream=data.get("source_tracestream"),
                sha256=str(data["source_data_sha256"]),
                name=name,
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise TraceError(f"the report is incomplete or malformed ({type(exc).__name__}: "
                             f"{exc})") from None


class HashingWriter:
    """Hashes what is written, and passes it on to `out` (an OutputFile) if there is one."""

    def __init__(self, out: OutputFile | None = None):
        self.digest = hashlib.sha256()
        self._out = out

    def write(self, data: bytes) -> None:
        self.digest.update(data)
        if self._out is not None:
            self._out.write(data)


class _Replay:
    """The blocks the scanner has read, handed to the cursor that copies behind it."""

    def __init__(self, blocks):
        self._blocks = blocks
        self.kept: deque = deque()

    def read(self):
        for block in self._blocks:
            self.kept.append(block)
            yield block

    def __iter__(self):
        return self

    def __next__(self) -> bytes:
        if self.kept:
            return self.kept.popleft()
        raise StopIteration


def restore(trace, output, report: str | None = None, *, compress: str | None = None,
            compress_level: int | None = None) -> dict:
    """Write the source trace, byte for byte, from an annotated trace and its report."""
    trace, output = str(trace), str(output)
    report_path = find_report(trace, report)
    undo = Undo.from_report(*load_report(report_path), name=trace)
    with TraceSource(trace) as annotated, OutputFile(
        output, compression=compression_for(output, compress), level=compress_level
    ) as out:
        writer = HashingWriter(out)
        counts = splice_back(annotated, undo, writer)
        if writer.digest.hexdigest() != undo.sha256:
            raise TraceError(
                f"the restored bytes differ from the source (sha256 "
                f"{writer.digest.hexdigest()[:16]}… vs the report's {undo.sha256[:16]}…): "
                f"{trace} or its report {report_path} was edited")
        out.commit()
    return {**counts, "report": str(report_path)}


def splice_back(annotated: TraceSource, undo: Undo, writer) -> dict:
    """Write the source's bytes to `writer` (anything with `write`); the counts of events
    restored, moved back, re-inserted and dropped. TraceError where the annotated trace
    does not match the report."""
    stats = ReadStats()
    replay = _Replay(annotated.read(stats))
    scanner = DocumentScanner(replay.read())
    cursor = StreamCursor(replay)
    state = _State(undo, cursor, writer)
    for chunk in scanner.chunks():
        if state.events == 0 and not state.appended:
            state.top_level(scanner.layout, before_events=True)
        state.chunk(chunk)
    layout = scanner.layout
    if state.events == 0 and not state.appended:
        state.top_level(layout, before_events=True)
    state.finish(layout)
    annotated.finish_read(stats)
    return {"events": state.restored, "relocated": state.relocated,
            "retired": len(undo.retired), "dropped": state.appended}


class _State:
    """The splice in progress: where the copy is, and which source event comes next."""

    def __init__(self, undo: Undo, cursor: StreamCursor, writer):
        self.undo = undo
        self.cursor = cursor
        self.writer = writer
        self.pending = deque(undo.retired)
        self.restored = 0  # source events written (or copied) so far
        self.relocated = 0
        self.events = 0  # output events seen
        self.appended = 0
        self.last_kept_end = -1  # end of the last output event that is a source event
        self.member_edits_done = False

    def _insert_retired(self, at: int, *, rest: bool = False) -> None:
        """Write at `at` the retired events that come next in the source (`rest`: all)."""
        pending = self.pending
        if pending and (rest or pending[0][0] <= self.restored):
            self.cursor.copy_to(self.writer, at)
            while pending and (rest or pending[0][0] <= self.restored):
                index, event, separator = pending.popleft()
                if index != self.restored:
                    raise self._mismatch(f"retired event {index} would go back at source "
                                         f"position {self.restored}")
                self.writer.write(event + separator)
                self.restored += 1

    def chunk(self, chunk) -> None:
        undo = self.undo
        count = len(chunk.events)
        first = chunk.first_ordinal
        self.events = first + count
        quiet = (first + count <= undo.appended_from and _MARK not in chunk.data
                 and (not self.pending or self.pending[0][0] >= self.restored + count))
        if quiet:  # nothing to undo in this chunk: its bytes are copied as they are
            self.restored += count
            self.last_kept_end = chunk.offset + chunk.length
            self.cursor.copy_to(self.writer, self.last_kept_end)
            return
        data = chunk.data
        start = chunk.offset
        for i, raw in enumerate(chunk.events):
            end = start + len(raw)
            if first + i >= undo.appended_from:
                self._added(start, end)
            else:
                marked = data.find(_MARK, start - chunk.offset, end - chunk.offset) >= 0
                self._source_event(raw if marked else None, start, end)
            if end < chunk.offset + chunk.length:
                start = chunk.offset + _SEPARATOR.match(data, end - chunk.offset).end()

    def _source_event(self, raw, start: int, end: int) -> None:
        """`raw`: the event, if it holds the provenance key's text (None otherwise)."""
        self._insert_retired(start)
        if raw is not None:
            raw = bytes(raw)
            if provenance_match(raw) is not None:
                original, index = unrelocate(raw)
                if index != self.restored:
                    raise self._mismatch(f"an event says it is source event {index} but sits "
                                         f"at source position {self.restored}")
                self.cursor.copy_to(self.writer, start)
                self.cursor.skip(end - start)
                self.writer.write(original)
                self.relocated += 1
        self.restored += 1
        self.last_kept_end = end

    def _added(self, start: int, end: int) -> None:
        """Cut an added event out; the first takes the separator before it (or the
        retired events at the end of the source go back in its place)."""
        if not self.appended:
            if self.pending:
                self._insert_retired(start, rest=True)
            else:
                self.cursor.copy_to(self.writer, self.last_kept_end if self.last_kept_end >= 0
                                    else start)
        self.appended += 1
        self.cursor.skip(end - self.cursor.pos)

    def top_level(self, layout: Layout, *, before_events: bool) -> None:
        """Undo the `tracestream` member edit on the side of the event array given."""
        if self.member_edits_done or layout.shape != "object":
            return
        ours = [v for v in layout.values if v.key == "tracestream"]
        if not ours:
            return
        value = ours[0]
        if before_events != (value.value_end <= layout.events_open):
            return
        self.member_edits_done = True
        cursor = self.cursor
        if self.undo.source_tracestream is not None:
            cursor.copy_to(self.writer, value.value_start)
            cursor.skip(value.value_end - value.value_start)
            self.writer.write(self.undo.source_tracestream)
            return
        ends = [v.value_end for v in layout.values if v.value_end <= value.key_start]
        if 0 <= layout.events_close < value.key_start:  # (not yet known: -1)
            ends.append(layout.events_close + 1)
        if not ends:
            raise self._mismatch("the added top-level `tracestream` member is the first one")
        start = max(ends)
        cursor.copy_to(self.writer, start)
        if cursor.take(len(_ADDED_MEMBER)) != _ADDED_MEMBER:
            raise self._mismatch("the top-level `tracestream` member is not where tracestream "
                                 "puts it")
        cursor.skip(value.value_end - cursor.pos)

    def finish(self, layout: Layout) -> None:
        if self.pending or self.restored != self.undo.original:
            raise self._mismatch(f"restored {self.restored} events but the report says the "
                                 f"source had {self.undo.original}")
        self.top_level(layout, before_events=False)
        self.cursor.drain(self.writer)

    def _mismatch(self, what: str) -> TraceError:
        return TraceError(f"{self.undo.name} does not match its report: {what} "
                          "(was the file edited?)")
