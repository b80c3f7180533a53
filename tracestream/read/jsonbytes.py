"""JSON at the byte level: where a string or a value ends, where an event can be cut, and
how an event or a parse error is named in a message."""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from tracestream.errors import TraceError
from tracestream.jsontext import SKIP_WS

_AFTER_EVENT = re.compile(rb"[ \t\r\n]*(?:,[ \t\r\n]*(\{)|(\]))")
_STRUCTURAL = re.compile(rb'["\[\]{}]')
_SCALAR_END = re.compile(rb"[,}\] \t\r\n]")
SEPARATOR = re.compile(rb"[ \t\r\n]*,[ \t\r\n]*")
"""The comma between two array elements, with the whitespace around it."""
_EVENT_SEPARATOR = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")


def describe_event(token: bytes) -> str:
    if not token:
        return "end of input"
    ch = token[:1]
    kinds = {b'"': "a string", b"[": "an array", b"{": "an object", b"n": "null"}
    if ch in kinds:
        return kinds[ch]
    if ch in b"-0123456789":
        return "a number"
    if ch in b"tf":
        return "a boolean"
    return f"{token[:12]!r}"


@dataclass
class ArrayEndsBefore:
    """The event array closes before the cut, at `position` bytes into the chunk."""

    position: int


def string_end(data: bytes, pos: int) -> int | None:
    """End (exclusive) of the JSON string whose quote is at `pos`; None if the data ends first.

    The closing quote is the first one not escaped by an odd run of backslashes;
    `bytes.find` gets there at memory speed even through a string of many MB.
    """
    i = pos + 1
    while True:
        j = data.find(b'"', i)
        if j < 0:
            return None
        k = j
        while data[k - 1] == 0x5C:  # '\\'
            k -= 1
        if (j - k) % 2 == 0:
            return j + 1
        i = j + 1


def first_non_object(data: bytes, pos: int) -> int | None:
    """Position of the first element from `pos` of the event array that is not an object."""
    while True:
        pos = SKIP_WS.match(data, pos).end()
        if pos >= len(data) or data[pos] == 0x5D:  # ']'
            return None
        if data[pos] != 0x7B:  # '{'
            return pos
        end = scan_value(data, pos)
        if end is None:
            return None
        pos = SKIP_WS.match(data, end).end()
        if data[pos : pos + 1] != b",":
            return None
        pos += 1


def last_cut(data: bytes, start: int, limit: int):
    """Last candidate event boundary before `limit`: (close brace, next start, array closed)."""
    find = data.rfind
    match = _AFTER_EVENT.match
    end = limit
    while True:
        j = find(b"}", start, end)
        if j < 0:
            return None
        m = match(data, j + 1)
        if m is not None:
            if m.group(1) is not None:
                return j, m.start(1) + 1, False
            return j, m.end(), True
        end = j


def scan_value(data: bytes, pos: int) -> int | None:
    """End of the JSON value at `pos`, or None if the data ends first (not validated)."""
    ch = data[pos : pos + 1]
    if not ch:
        return None
    if ch == b'"':
        return string_end(data, pos)
    if ch not in b"[{":
        m = _SCALAR_END.search(data, pos)
        return m.start() if m else None
    depth = 0
    i = pos
    while True:
        m = _STRUCTURAL.search(data, i)
        if m is None:
            return None
        c = data[m.start()]
        if c == 0x22:  # '"'
            end = string_end(data, m.start())
            if end is None:
                return None
            i = end
            continue
        i = m.end()
        if c in (0x5B, 0x7B):
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i


def event_at(data: bytes, base: int, rel: int) -> str:
    """Best-effort event position for an error inside a chunk starting at `base`."""
    before = len(_EVENT_SEPARATOR.findall(data, 0, max(rel, 0)))
    return f"event {before} after the one starting at byte {base}" if before else (
        f"event starting at byte {base}"
    )


def check_utf8(data: bytes, base: int, what: str) -> None:
    if data.isascii():
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"invalid UTF-8 in {what} at byte {base + exc.start}: {exc.reason}"
        ) from None


def short_message(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply"
    return text.splitlines()[0][:200]


CUT = "cut"
ARRAY_ENDS = "array ends"
MALFORMED = "malformed"


def orjson_verdict(exc: orjson.JSONDecodeError, length: int) -> str:
    """What orjson's error on a document of `length` bytes (a chunk's events in brackets)
    means: CUT (the text ends inside a value: the cut was too early, or the input is
    truncated), ARRAY_ENDS (the event array closes before the chunk does, at
    `exc.pos - 1`) or MALFORMED (a real syntax error at `exc.pos - 1`).

    orjson says which only in its message text, so this is the one place that reads it."""
    text = str(exc)
    if exc.pos >= length - 1 or "unexpected end" in text.lower():
        return CUT
    if "unexpected content after document" in text:
        return ARRAY_ENDS
    return MALFORMED


def orjson_reason(exc: orjson.JSONDecodeError) -> str:
    """orjson's reason for a syntax error, without its line and column (ours is a byte)."""
    msg = exc.msg if hasattr(exc, "msg") else str(exc)
    return msg.split(": line ")[0]
