"""Splitting a Chrome-JSON trace into its top-level values and chunks of events.

The whole document is validated (syntax and UTF-8) but never held in memory.
Events are cut into chunks of a few MB at candidate boundaries (``}`` then
``,`` then ``{``); msgspec validates each chunk as a JSON array and hands back
each event's exact bytes. A cut that falls inside a string or a nested value
can never parse, so a failed parse that ends at the cut means "cut elsewhere";
any other failure is malformed input, reported with its byte offset and event
index.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import msgspec
import orjson

from tracestream.errors import TraceError
from tracestream.model import RAW_EVENTS
from tracestream.read.buffer import Buffer, grow_window
from tracestream.read.jsonbytes import (
    ARRAY_ENDS,
    CUT,
    MALFORMED,
    ArrayEndsBefore,
    check_utf8,
    describe_event,
    event_at,
    first_non_object,
    last_cut,
    orjson_reason,
    orjson_verdict,
    scan_value,
    short_message,
    string_end,
)
from tracestream.read.source import read_span

CHUNK_BYTES = 2 << 20
"""Bytes of events per worker task. 4 MB chunks held ~50 MiB more in flight (chunks
sent through pipes, results, windows) at the same speed (measured on 1 GB)."""
MAX_EVENT_MB = 64
"""Default longest single event (MiB; a caller may give another limit, the CLI takes it from
TRACESTREAM_MAX_EVENT_MB). Reading one event holds it about four times (the read window, the
validated copy, its decode), so the cap bounds memory; Kineto's longest events are a few KB."""
MAX_EVENT_BYTES = MAX_EVENT_MB << 20


@dataclass
class TopLevelValue:
    """One key of the top-level object other than ``traceEvents``, kept verbatim."""

    key: str
    key_start: int
    value_start: int
    value_end: int
    raw: bytes


@dataclass
class EventChunk:
    """Consecutive events: their bytes, exact per-event slices and absolute position."""

    offset: int  # absolute offset of data[0], the first event's first byte
    data: bytes | None  # None: a speculative chunk in `pieces`, or of a file the caller
    # reads itself (`peek`)
    first_ordinal: int
    events: list  # msgspec.Raw per event, in order
    length: int = -1
    pieces: tuple = ()
    """A speculative chunk of a stream: its bytes as slices of the decompressed blocks,
    not joined (the caller copies them once, where the chunk goes: see `content`)."""

    def __post_init__(self):
        if self.length < 0:
            self.length = len(self.data)

    def content(self) -> bytes:
        """The chunk's bytes (its pieces joined, where it has them)."""
        return self.data if self.data is not None else b"".join(self.pieces)


SETTLE = EventChunk(-1, b"", -1, None)
"""Yielded by a speculative scanner before it decodes a chunk itself (see DocumentScanner)."""


@dataclass
class Layout:
    """Where things are in the decompressed document; filled in as the scan proceeds."""

    shape: str = ""  # "object" or "array"
    values: list[TopLevelValue] = field(default_factory=list)
    events_key_index: int = -1  # position of traceEvents among the top-level keys
    events_open: int = -1  # offset of '[' of the event array
    events_close: int = -1  # offset of ']' of the event array
    close: int = -1  # offset of the top-level '}' (objects only)
    length: int = 0
    event_count: int = 0
    first_event_offset: int = -1
    last_event_end: int = -1


class DocumentScanner:
    """Yields validated event chunks of one trace; `layout` describes the rest.

    With `speculative=True` most chunks come back undecoded (`events is None`,
    `first_ordinal == -1`): the caller validates them (in parallel) and calls
    `confirm(chunk)`, or `rewind(chunk)` when a cut turned out to lie inside a
    string or nested value; the scanner then re-cuts from that chunk exactly.
    The chunk before the end of the event array is always decoded here. Before
    it decodes a chunk itself, the scanner yields `SETTLE`: the caller confirms
    or rewinds every speculative chunk it holds (a wrong cut before would make
    the decoded chunk start inside a value, which reads as malformed JSON).

    `peek` (a plain file that the caller's workers read themselves) lets the
    scanner cut from the bytes near each cut alone; speculative chunks then
    carry no `data`, only their `length`.
    """

    def __init__(self, blocks: Iterable[bytes], *, chunk_bytes: int = CHUNK_BYTES,
                 speculative: bool = False, peek: FilePeek | None = None,
                 events_key: str = "traceEvents", events_required: bool = True,
                 max_event_bytes: int | None = None):
        self._buf = Buffer(blocks)
        self._max_event = MAX_EVENT_BYTES if max_event_bytes is None else max_event_bytes
        # a report is read the same way: its `layers` rows are the "events"
        self._events_key = events_key
        self._events_required = events_required
        self._peek = peek
        self._chunk_bytes = chunk_bytes
        self.layout = Layout()
        self.speculative = speculative
        self._history: deque = deque()
        self._rewind_to: EventChunk | None = None
        self._exact_next = False

    def chunks(self) -> Iterator[EventChunk]:
        buf = self._buf
        pos = buf.skip_ws(0)
        if pos >= len(buf.data):
            raise TraceError("input is empty: expected a JSON trace object or event array")
        first = buf.data[pos : pos + 1]
        if first == b"[":
            self.layout.shape = "array"
            self.layout.events_open = buf.base + pos
            yield from self._events(pos + 1)
            pos = self._after_events()
        elif first == b"{":
            self.layout.shape = "object"
            pos = yield from self._object(pos + 1)
        else:
            buf.ensure(pos, 12)
            what = describe_event(buf.take(pos, pos + 12))
            raise TraceError(
                f"top level is {what}, not a trace: expected an object with "
                f"\"traceEvents\" or an array of events (byte {buf.base + pos})"
            )
        self._expect_end(pos)

    # -- top-level object -------------------------------------------------

    def _object(self, pos: int):
        buf = self._buf
        layout = self.layout
        seen_keys: set[str] = set()
        pos = buf.skip_ws(pos)
        while buf.data[pos : pos + 1] != b"}":
            if buf.data[pos : pos + 1] != b'"':
                raise self._unexpected(pos, "a key string in the top-level object")
            key_start = buf.base + pos
            key, pos = self._string(pos)
            if key in seen_keys:
                raise TraceError(f"top-level key {key!r} appears twice (byte {key_start})")
            seen_keys.add(key)
            pos = buf.skip_ws(pos)
            if buf.data[pos : pos + 1] != b":":
                raise self._unexpected(pos, "':' after a top-level key")
            pos = buf.skip_ws(pos + 1)
            if key == self._events_key:
                if buf.data[pos : pos + 1] != b"[":
                    buf.ensure(pos, 12)
                    what = describe_event(buf.take(pos, pos + 12))
                    raise TraceError(
                        f"\"{key}\" is {what}, not an array of events "
                        f"(byte {buf.base + pos})"
                    )
                layout.events_key_index = len(layout.values)
                layout.events_open = buf.base + pos
                yield from self._events(pos + 1)
                pos = self._after_events()
            else:
                pos = self._top_level_value(key, key_start, pos)
            pos = buf.skip_ws(pos)
            if buf.data[pos : pos + 1] == b",":
                pos = buf.skip_ws(pos + 1)
                if buf.data[pos : pos + 1] == b"}":
                    raise self._unexpected(pos, "a key after ',' (trailing comma)")
            elif buf.data[pos : pos + 1] != b"}":
                raise self._unexpected(pos, "',' or '}' after a top-level value")
        layout.close = buf.base + pos
        if layout.events_open < 0 and self._events_required:
            raise TraceError(
                "the top-level object has no \"traceEvents\" array; not a Chrome/Kineto trace"
            )
        return pos + 1

    def _top_level_value(self, key: str, key_start: int, pos: int) -> int:
        buf = self._buf
        end = self._value_end(pos)
        raw = buf.take(pos, end)
        check_utf8(raw, buf.base + pos, f"top-level value of {key!r}")
        try:
            msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise TraceError(
                f"top-level value of {key!r} is not valid JSON (byte {buf.base + pos}): "
                f"{short_message(exc)}"
            ) from None
        self.layout.values.append(
            TopLevelValue(key, key_start, buf.base + pos, buf.base + end, raw)
        )
        return end

    def _string(self, pos: int) -> tuple[str, int]:
        buf = self._buf
        while True:
            end = string_end(buf.data, pos)
            if end is not None:
                text = buf.take(pos, end)
                check_utf8(text, buf.base + pos, "a top-level key")
                try:
                    return msgspec.json.decode(text), end
                except msgspec.DecodeError as exc:
                    raise TraceError(
                        f"invalid string at byte {buf.base + pos}: {short_message(exc)}"
                    ) from None
            if not grow_window(buf, pos):
                raise TraceError(
                    f"unterminated string at byte {buf.base + pos}: input is truncated"
                )

    def _value_end(self, pos: int) -> int:
        """End (relative, exclusive) of the JSON value starting at `pos`."""
        buf = self._buf
        while True:
            end = scan_value(buf.data, pos)
            if end is not None:
                return end
            if not grow_window(buf, pos):
                raise TraceError(
                    f"top-level value at byte {buf.base + pos} is incomplete: input is truncated"
                )

    def _expect_end(self, pos: int) -> None:
        buf = self._buf
        pos = buf.skip_ws(pos)
        if pos < len(buf.data):
            raise TraceError(
                f"trailing data after the end of the JSON document at byte {buf.base + pos}"
            )
        self.layout.length = buf.base + len(buf.data)

    def _unexpected(self, pos: int, wanted: str) -> TraceError:
        buf = self._buf
        buf.ensure(pos, 12)
        got = buf.take(pos, pos + 12)
        if not got:
            return TraceError(f"input ends at byte {buf.base + pos}, expected {wanted}: truncated")
        return TraceError(f"expected {wanted} at byte {buf.base + pos}, found {got[:12]!r}")

    # -- the event array --------------------------------------------------

    def _after_events(self) -> int:
        """Relative position just after the event array's ']'."""
        return self.layout.events_close - self._buf.base + 1

    def _events(self, pos: int):
        buf = self._buf
        layout = self.layout
        pos = buf.skip_ws(pos)
        ordinal = 0
        if buf.data[pos : pos + 1] == b"]":
            layout.events_close = buf.base + pos
            return
        if pos >= len(buf.data):
            raise TraceError(
                f"input ends inside the event array at byte {buf.base + pos}: truncated"
            )
        layout.first_event_offset = buf.base + pos
        while True:
            # data[pos] is the first byte of the next event
            if self._rewind_to is not None:
                pos = self._apply_rewind(pos)
            if pos > (len(buf.data) >> 1):
                pos = buf.discard(pos)
            if self.speculative and not self._exact_next:
                cut = self._speculative_cut(pos)
                if cut is not None:
                    chunk, end = cut
                    # a rewind reads the file again, or joins the chunks' own bytes and
                    # the separators after them
                    chunk_end = chunk.offset + chunk.length
                    separator = b"" if self._peek is not None else buf.read(
                        chunk_end, end - 1 - chunk_end)
                    self._history.append((chunk, separator))
                    yield chunk
                    pos = buf.skip_to(end - 1)
                    continue
            if self._history:
                yield SETTLE
                if self._rewind_to is not None:
                    continue
            self._exact_next = False
            chunk, end, closed = self._next_chunk(pos)
            chunk.first_ordinal = ordinal
            ordinal += len(chunk.events)
            yield chunk
            if self._rewind_to is not None:  # an earlier speculative chunk was cut wrongly
                continue
            layout.last_event_end = chunk.offset + chunk.length
            if closed:
                layout.events_close = buf.base + end - 1
                layout.event_count = ordinal
                return
            pos = end - 1  # the '{' of the next event

    # -- speculative chunks (validated elsewhere, e.g. in worker processes) -----

    def _speculative_cut(self, start: int):
        """(chunk, absolute end) cut at a `}` `,` `{` candidate, not decoded; None near the
        array end.

        A cut before `]` is always decoded here instead, so the top level after the
        event array is only ever parsed from a validated position. Only the bytes
        near the cut are read (from the blocks held ahead, or from the file with
        `peek`): the cut is looked for in the last 64 KB before the target, in the
        whole chunk only if there is none. A file's chunk carries no bytes (whoever
        observes it reads them); a stream's carries its blocks' slices, copied once where
        the chunk goes.
        """
        buf = self._buf
        target = self._chunk_bytes
        begin = buf.base + start
        if self._peek is not None:
            read, available = self._peek.read, self._peek.size - begin
        else:
            read, available = buf.read, buf.lookahead(start, 2 * target + 64)
        if available <= 2 * target + 64:  # the input ends there, or soon after
            return None
        at = max(begin, begin + target - _PEEK_BYTES)
        cut = last_cut(read(at, begin + target - at + 64), 0, begin + target - at)
        if cut is None and at > begin:  # an event of more than 64 KB spans the target
            at = begin
            cut = last_cut(read(at, target + 64), 0, target)
        if cut is None or cut[2]:
            return None
        close_brace, after, _ = cut
        length = at + close_brace + 1 - begin
        pieces = () if self._peek is not None else tuple(buf.pieces(begin, length))
        return EventChunk(begin, None, -1, None, length, pieces), at + after

    def confirm(self, chunk: EventChunk) -> None:
        """A speculative chunk decoded fine: forget the bytes kept for a rewind."""
        while self._history and self._history[0][0] is not chunk:
            self._history.popleft()
        if self._history:
            self._history.popleft()
        self.layout.last_event_end = chunk.offset + chunk.length

    def rewind(self, chunk: EventChunk) -> None:
        """A speculative chunk was cut wrongly: continue from its start, decoding exactly."""
        self._rewind_to = chunk

    def _apply_rewind(self, pos: int) -> int:
        buf = self._buf
        chunk = self._rewind_to
        self._rewind_to = None
        kept = list(self._history)
        self._history.clear()
        index = next(i for i, (c, _) in enumerate(kept) if c is chunk)
        if self._peek is not None:
            before = self._peek.read(chunk.offset, buf.base + pos - chunk.offset)
        else:
            before = b"".join(c.content() + sep for c, sep in kept[index:])
        buf.data = bytearray(before) + buf.data[pos:]
        buf.base = chunk.offset
        self._exact_next = True
        return 0

    def _next_chunk(self, start: int) -> tuple[EventChunk, int, bool]:
        """Cut, validate and return the chunk starting at data[start]."""
        buf = self._buf
        target = self._chunk_bytes
        ceiling = target + self._max_event  # one longest event after a chunk's worth
        array_ends = False
        while True:
            if target > ceiling:
                if target >= 2 * ceiling:  # the ceiling itself was tried: no cut parsed
                    raise _event_too_long(buf.base + start, self._max_event)
                target = ceiling
            buf.ensure(start, target + 64)
            cut = last_cut(buf.data, start, min(len(buf.data), start + target))
            if cut is None:
                if array_ends or (buf.eof and len(buf.data) <= start + target):
                    # no event ends where the array does: something else is in it
                    raise self._truncated_events(start)
                target *= 2
                continue
            close_brace, after, closed = cut
            data = buf.take(start, close_brace + 1)
            events = self._decode(data, buf.base + start)
            if isinstance(events, ArrayEndsBefore):
                # the cut lay past the end of the event array (in later top-level values)
                target = events.position
                array_ends = True
                continue
            if events is not None:
                return EventChunk(buf.base + start, data, 0, events), after, closed
            if array_ends or (buf.eof and start + target >= len(buf.data)):
                # that was the last candidate of the array or input (e.g. `[[{}]]`)
                raise self._truncated_events(start)
            # the cut was inside a string or nested value: take a longer chunk
            target = max(target * 2, close_brace + 2 - start)

    def _decode(self, data: bytes, base: int):
        """The chunk's events, or None when the cut itself was wrong; TraceError if malformed."""
        check_utf8(data, base, "event data")
        doc = b"".join((b"[", data, b"]"))  # one copy (a + b + c copies twice)
        try:
            return RAW_EVENTS.decode(doc)
        except (msgspec.DecodeError, RecursionError) as exc:
            first_error = exc
        try:
            orjson.loads(doc)
        except orjson.JSONDecodeError as exc:
            verdict = orjson_verdict(exc, len(doc))
            if verdict == CUT:
                return None
            if verdict == ARRAY_ENDS:
                return ArrayEndsBefore(exc.pos - 1)
            where = base + exc.pos - 1
            raise TraceError(
                f"malformed JSON at byte {where} ({event_at(data, base, exc.pos - 1)}): "
                f"{orjson_reason(exc)}"
            ) from None
        except RecursionError:
            pass
        raise TraceError(
            f"event data starting at byte {base} cannot be read: {short_message(first_error)}"
        )

    def _truncated_events(self, start: int) -> TraceError:
        buf = self._buf
        tail = buf.take(start, len(buf.data))
        check_utf8(tail, buf.base + start, "event data")
        doc = b"[" + tail
        try:
            orjson.loads(doc)
        except orjson.JSONDecodeError as exc:
            if orjson_verdict(exc, len(doc)) == MALFORMED:
                return TraceError(
                    f"malformed JSON at byte {buf.base + start + exc.pos - 1}: "
                    f"{orjson_reason(exc)}"
                )
        bad = first_non_object(buf.data, start)
        if bad is not None:
            what = describe_event(buf.take(bad, bad + 12))
            return TraceError(
                f"expected an event object at byte {buf.base + bad}, found {what}: every "
                "element of the event array must be a JSON object"
            )
        return TraceError(
            f"input ends inside the event array (last complete data before byte "
            f"{buf.base + len(buf.data)}): the trace is truncated"
        )


_PEEK_BYTES = 64 << 10  # read before a speculative cut to find an event boundary in


class FilePeek:
    """Random reads of a plain trace file (a speculative cut needs only the bytes near it)."""

    def __init__(self, path: str):
        self.path = path
        self.size = os.path.getsize(path)

    def read(self, offset: int, length: int) -> bytes:
        return read_span(self.path, offset, length)


def _event_too_long(offset: int, limit_bytes: int) -> TraceError:
    limit = limit_bytes / (1 << 20)
    return TraceError(
        f"an event starting at byte {offset} (or one right after it) is longer than "
        f"{limit:g} MiB, the limit for one event (TRACESTREAM_MAX_EVENT_MB raises it; "
        "reading an event costs about 4x its size in memory)"
    )


def iter_events(chunks: Iterable[EventChunk]):
    """(ordinal, raw bytes) of every event, for code that wants one event at a time."""
    for chunk in chunks:
        for i, raw in enumerate(chunk.events):
            yield chunk.first_ordinal + i, raw
