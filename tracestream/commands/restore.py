"""`restore`: the source trace back, byte for byte, from an annotated trace and its report.

The rewrite pass is a splice that can be undone: every byte it did not change is
still in the annotated trace, in order. `splice_back` copies the annotated
trace's bytes and undoes each edit where it lies:

* a relocated event (its provenance is the first member of its own `args`, see
  `relocate.provenance_match`) gets its pid/tid texts back and loses the member;
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
from collections import deque
from dataclasses import dataclass

import msgspec

from tracestream import _native
from tracestream.errors import TraceError, malformed_report
from tracestream.index.keyscan import separators
from tracestream.model import PROVENANCE_MARK, RAW_EVENTS
from tracestream.parallel.memory import release_memory
from tracestream.plan.report import find_report, load_report
from tracestream.progress import SILENT, Meter, Progress, or_silent
from tracestream.read.compression import compression_for
from tracestream.read.document import CHUNK_BYTES, SETTLE, DocumentScanner, Layout
from tracestream.read.hashing import ReadStats
from tracestream.read.jsonbytes import SEPARATOR
from tracestream.read.source import TraceSource
from tracestream.write.relocate import undo_relocation
from tracestream.write.rewrite import StreamCursor
from tracestream.write.sink import (
    OutputFile,
    check_compress_level,
    input_identity,
    refuse_writing_input,
)

_ADDED_MEMBER = b',\n  "tracestream": '
_BLOCK = 1 << 20
_TRIM_EVERY = 32  # chunks: fewer trims, fewer pages faulted in again (see verify's
# _WORKER_TRIM_EVERY: its restore check runs this in a worker)


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
            raise malformed_report(f"{type(exc).__name__}: {exc}") from None


class HashingWriter:
    """Hashes what is written, and passes it on to `out` (an OutputFile) if there is one.

    The splice writes a few pieces per relocated event: they are joined into blocks
    of about `_BLOCK` bytes first (one hash update and one write per block); a piece of
    a block or more (a chunk with nothing to undo but relocations) goes as it is, after
    what is held, never copied into a join."""

    def __init__(self, out: OutputFile | None = None):
        self._digest = hashlib.sha256()
        self._out = out
        self._pieces: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        if len(data) >= _BLOCK:  # a whole chunk: hashed as it lies, not joined (a copy)
            if self._pieces:
                self.flush()
            self._digest.update(data)
            if self._out is not None:
                self._out.write(data)
            return
        self._pieces.append(data)
        self._size += len(data)
        if self._size >= _BLOCK:
            self.flush()

    def flush(self) -> None:
        block = b"".join(self._pieces)
        self._pieces, self._size = [], 0
        self._digest.update(block)
        if self._out is not None:
            self._out.write(block)

    def hexdigest(self) -> str:
        """The sha256 of everything written (what is held is written first)."""
        self.flush()
        return self._digest.hexdigest()


def separated_events(data: bytes) -> int:
    """How many events a chunk of whole events holds, counted by the `}` `,` `{` between
    them (not decoded: text so written inside an event counts too)."""
    return len(separators(data)[0]) + 1


def _decoded(data: bytes, base: int) -> list:
    """The events of a speculative chunk, as the scanner would have decoded them."""
    try:
        return RAW_EVENTS.decode(b"".join((b"[", data, b"]")))
    except msgspec.DecodeError:
        raise TraceError(f"events from byte {base} on cannot be read where quick restore "
                         "cut them") from None


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
            compress_level: int | None = None, max_event_bytes: int | None = None,
            progress: Progress | None = None) -> dict:
    """Write the source trace, byte for byte, from an annotated trace and its report.

    `max_event_bytes`: the longest single event read (None: read.document's default).
    `progress` sees the phase "restore" (see tracestream.progress)."""
    trace, output = str(trace), str(output)
    refuse_writing_input(input_identity(trace), output, "output", trace)
    check_compress_level(compression_for(output, compress), compress_level)
    report_path = find_report(trace, report)
    data, retired = load_report(report_path)
    refuse_window(data, trace)
    undo = Undo.from_report(data, retired, name=trace)
    with TraceSource(trace, hashes_data=False, max_event_bytes=max_event_bytes) as annotated, \
            OutputFile(output, compression=compression_for(output, compress),
                       level=compress_level) as out:
        writer = HashingWriter(out)
        meter = or_silent(progress).phase("restore", annotated.progress_total)
        try:
            counts = splice_back(annotated, undo, writer, meter=meter)
        finally:
            meter.close()
        digest = writer.hexdigest()
        if digest != undo.sha256:
            raise TraceError(
                f"the restored bytes differ from the source (sha256 "
                f"{digest[:16]}… vs the report's {undo.sha256[:16]}…): "
                f"{trace} or its report {report_path} was edited")
        out.commit()
    return {**counts, "report": str(report_path)}


def refuse_window(data: dict, trace: str) -> None:
    """A window or piece is not the whole trace: nothing can give the source back from it."""
    options = data.get("options")
    if "window" not in data and not (isinstance(options, dict) and "window" in options):
        return
    window = data.get("window")
    option = window.get("option") if isinstance(window, dict) else None
    what = option[:80] if isinstance(option, str) else "a window"
    raise TraceError(f"{trace} holds a window of its source ({what}), not the whole trace: "
                     "restore needs the output of a run without --pass-window, --time-window "
                     "or --split-mb")


def splice_back(annotated: TraceSource, undo: Undo, writer, *,
                chunk_bytes: int = CHUNK_BYTES, quick: bool = False,
                speculative: bool = False, meter: Meter = SILENT) -> dict:
    """Write the source's bytes to `writer` (anything with `write`); the counts of events
    restored, moved back, re-inserted and dropped. TraceError where the annotated trace
    does not match the report. (`chunk_bytes`: how much the scanner cuts at once.)

    `quick`: undo the relocations of a chunk at once where `_native.undo_relocations` can,
    for a caller that compares the result's sha256 with the source's (and does not
    trust it otherwise).

    `speculative` (quick only): the annotated trace is cut where events seem to end and
    not decoded, a chunk's events counted by the `}` `,` `{` between them (an array of
    objects or such text in a string inside an event counts too many: the restored bytes
    then differ). Only a chunk with more to undo than relocations is decoded.

    `meter` is moved on after each chunk (see tracestream.progress)."""
    stats = ReadStats()
    replay = _Replay(annotated.read(stats))
    scanner = DocumentScanner(replay.read(), chunk_bytes=chunk_bytes,
                              speculative=quick and speculative,
                              max_event_bytes=annotated.max_event_bytes)
    cursor = StreamCursor(replay)
    state = _State(undo, cursor, writer, quick)
    for number, chunk in enumerate(scanner.chunks()):
        if chunk is SETTLE:  # (never rewound: a wrong cut gives other bytes)
            continue
        if number % _TRIM_EVERY == 0:
            release_memory()  # chunk buffers come and go: give their pages back
        if state.events == 0 and not state.appended:
            state.top_level(scanner.layout, before_events=True)
        state.chunk(chunk)
        if chunk.events is None:
            scanner.confirm(chunk)
        meter.advance_to(stats.position(chunk.offset + chunk.length))
    layout = scanner.layout
    if state.events == 0 and not state.appended:
        state.top_level(layout, before_events=True)
    state.finish(layout)
    annotated.finish_read(stats)
    meter.advance_to(stats.raw_bytes)  # (the bytes after the last event too)
    return {"events": state.restored, "relocated": state.relocated,
            "retired": len(undo.retired), "dropped": state.appended}


class _State:
    """The splice in progress: where the copy is, and which source event comes next."""

    def __init__(self, undo: Undo, cursor: StreamCursor, writer, quick: bool = False):
        self.undo = undo
        self.quick = quick
        self.cursor = cursor
        self.writer = writer
        self.pending = deque(undo.retired)
        self.restored = 0  # source events written (or copied) so far
        self.relocated = 0
        self.events = 0  # output events seen
        self.appended = 0
        self.last_kept_end = -1  # end of the last output event that is a source event
        self.member_edits_done = False

    def _retired(self, pieces: list, *, rest: bool = False) -> None:
        """The retired events that come next in the source (`rest`: all that are left),
        each with its separator, appended to `pieces`."""
        pending = self.pending
        while pending and (rest or pending[0][0] <= self.restored):
            index, event, separator = pending.popleft()
            if index != self.restored:
                raise self._mismatch(f"retired event {index} would go back at source "
                                     f"position {self.restored}")
            pieces.append(event + separator)
            self.restored += 1

    def chunk(self, chunk) -> None:
        """Copy a chunk of output events and the separator before it, edits undone.

        The chunk's bytes are spliced as one list of pieces and written once; the added
        events at the end of the array are cut, with the separator before the first.
        """
        undo, cursor = self.undo, self.cursor
        base, data, raws, first = chunk.offset, chunk.content(), chunk.events, self.events
        if raws is None:  # a speculative chunk: decoded only if more than relocations
            count = separated_events(data)
            if first <= undo.appended_from and not self._relocations_only(first, count):
                raws = _decoded(data, base)
        count = len(raws) if raws is not None else count
        self.events = first + count
        if first > undo.appended_from:  # added events only: skipped with what is between
            self.appended += count
            cursor.skip(base + chunk.length - cursor.pos)
            return
        if first == undo.appended_from and not self.pending and self.last_kept_end >= 0:
            cursor.copy_to(self.writer, self.last_kept_end)  # the separator goes too
            cursor.skip(base - cursor.pos)
        else:
            cursor.copy_to(self.writer, base)
        cursor.skip(chunk.length)
        if self._relocations_only(first, count):
            # nothing to undo in this chunk but relocations: at once where they can be
            undone = ((data, 0) if PROVENANCE_MARK not in data
                      else _native.undo_relocations(data) if self.quick else None)
            if undone is not None:
                self.restored += count
                self.relocated += undone[1]
                self.last_kept_end = base + chunk.length
                self.writer.write(undone[0])
                return
            if raws is None:  # the key's text left in a name or nested object: exactly
                raws = _decoded(data, base)
        pieces: list[bytes] = []
        pos = 0  # chunk bytes before this are in `pieces`
        start = 0
        find, separator = data.find, SEPARATOR.match
        for i, raw in enumerate(raws):
            end = start + len(raw)
            if first + i == undo.appended_from:
                cut = start if self.pending or not i else self.last_kept_end - base
                pieces.append(data[pos:cut])
                self._retired(pieces, rest=True)
                self.appended += count - i
                self.writer.write(b"".join(pieces))
                return
            if self.pending and self.pending[0][0] <= self.restored:
                pieces.append(data[pos:start])
                pos = start
                self._retired(pieces)
            if find(PROVENANCE_MARK, start, end) >= 0:
                undone = undo_relocation(bytes(raw))
                if undone is not None:
                    original, index = undone
                    if index != self.restored:
                        raise self._mismatch(f"an event says it is source event {index} but "
                                             f"sits at source position {self.restored}")
                    pieces.append(data[pos:start])
                    pieces.append(original)
                    pos = end
                    self.relocated += 1
            self.restored += 1
            self.last_kept_end = base + end
            if end < len(data):
                start = separator(data, end).end()
        pieces.append(data[pos:])
        self.writer.write(b"".join(pieces))

    def _relocations_only(self, first: int, count: int) -> bool:
        """Whether `count` output events from `first` on are source events with nothing
        to undo but relocations (no retired event goes back among them)."""
        return first + count <= self.undo.appended_from and (
            not self.pending or self.pending[0][0] >= self.restored + count)

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
