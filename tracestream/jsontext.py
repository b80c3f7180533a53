"""Writing JSON text where some numbers must keep their exact source digits (and the one
definition of JSON whitespace, which readers skip)."""

from __future__ import annotations

import re
from typing import Any

import orjson

SKIP_WS = re.compile(rb"[ \t\r\n]*")
"""JSON whitespace (matches at any position, maybe empty)."""


def template_parts(template: bytes) -> tuple[bytes, ...]:
    """The literal pieces of a `%b`/`%d` byte template, around its fields (the C extension
    writes rows from them, the numpy code joins them with the values)."""
    return tuple(re.split(rb"%[bd]", template))


class RawNumber(str):
    """A number written verbatim (its text came from the trace)."""


class RawJSON(bytes):
    """A JSON value written verbatim (an event copied from the trace, digits and all)."""


def dumps(value: Any) -> bytes:
    """Compact JSON; `RawNumber` values are emitted as their text, never via float."""
    if isinstance(value, RawNumber):
        return value.encode()
    if isinstance(value, RawJSON):
        return bytes(value)
    if isinstance(value, dict):
        if not any(_has_raw(v) for v in value.values()):
            return orjson.dumps(value)
        return b"{" + b", ".join(
            orjson.dumps(str(k)) + b": " + dumps(v) for k, v in value.items()
        ) + b"}"
    if isinstance(value, (list, tuple)):
        if not any(_has_raw(v) for v in value):
            return orjson.dumps(list(value))
        return b"[" + b", ".join(dumps(v) for v in value) + b"]"
    return orjson.dumps(value)


def _has_raw(value: Any) -> bool:
    if isinstance(value, (RawNumber, RawJSON)):
        return True
    if isinstance(value, dict):
        return any(_has_raw(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_raw(v) for v in value)
    return False


def dumps_pretty(value: Any) -> bytes:
    """Indented JSON for reports, exact numbers included."""
    return _pretty(value, 0) + b"\n"


def _pretty(value: Any, depth: int) -> bytes:
    pad = b"  " * (depth + 1)
    end = b"  " * depth
    if isinstance(value, dict) and value:
        items = [
            pad + orjson.dumps(str(k)) + b": " + _pretty(v, depth + 1) for k, v in value.items()
        ]
        return b"{\n" + b",\n".join(items) + b"\n" + end + b"}"
    if isinstance(value, (list, tuple)) and value:
        if all(not isinstance(v, (dict, list, tuple)) for v in value):
            return dumps(list(value))
        items = [pad + _pretty(v, depth + 1) for v in value]
        return b"[\n" + b",\n".join(items) + b"\n" + end + b"]"
    return dumps(value)


def pretty_item(value: Any, depth: int) -> bytes:
    """A value as `dumps_pretty` writes it `depth` levels deep (without its indent)."""
    return _pretty(value, depth)


def write_pretty(value: dict, write) -> None:
    """`dumps_pretty(value)` written in pieces through `write`. A top-level value with
    `pretty_blocks(depth)` (report rows made as they are written) is a list streamed a
    block at a time; every other value is written as `dumps_pretty` writes it."""
    PrettyWriter(value, write).finish()


class PrettyWriter:
    """`write_pretty` in steps, so that the blocks of a streamed list (a top-level value
    with `pretty_blocks`: a report's guide rows) can be handed in by whoever makes them
    (the rewrite, which makes each block of guides' events and rows together), between
    the members before that list and those after it.

    `head()` writes the members before the first streamed list and its opening bracket
    and returns that list (None when there is none); `rows(block)` writes one of its
    blocks; `finish()` closes it and writes the rest, reading those members only then
    (their values may be filled in meanwhile; no member may be added). A streamed list
    whose blocks nobody handed in is written by `finish()` from its own `pretty_blocks`.
    The bytes are `write_pretty`'s either way."""

    def __init__(self, value: dict, write):
        self._value = value
        self._write = write
        self._keys = list(value)
        self._next = 0  # the next member to write
        self._started = False
        self._open = None  # the streamed list whose bracket is open
        self._blocks = 0  # its blocks written

    def head(self):
        if self._started:
            raise RuntimeError("the head is written already")
        if not any(_streamed(self._value[key]) for key in self._keys):
            return None  # nothing to hand in: all of it is written by finish()
        self._started = True
        self._write(b"{\n")
        return self._members(stop=True)

    def rows(self, block: bytes) -> None:
        if self._open is None:
            raise RuntimeError("no streamed list is open")
        self._write(b",\n" + block if self._blocks else block)
        self._blocks += 1

    def finish(self) -> None:
        if not self._keys:
            self._write(dumps_pretty(self._value))
            return
        if not self._started:
            self._started = True
            self._write(b"{\n")
        self._close()
        self._members(stop=False)
        self._write(b"\n}\n")

    def _close(self) -> None:
        if self._open is None:
            return
        if not self._blocks:
            for block in self._open.pretty_blocks(2):
                self.rows(block)
        self._write(b"\n  ]")
        self._open = None
        self._blocks = 0

    def _members(self, *, stop: bool):
        while self._next < len(self._keys):
            n, key = self._next, self._keys[self._next]
            item = self._value[key]
            self._next += 1
            self._write((b",\n" if n else b"") + b"  " + orjson.dumps(str(key)) + b": ")
            if not hasattr(item, "pretty_blocks"):
                self._write(_pretty(item, 1))
            elif not _streamed(item):
                self._write(b"[]")
            else:
                self._write(b"[\n")
                self._open = item
                if stop:
                    return item
                self._close()
        return None


def _streamed(item) -> bool:
    """Whether a member is a list written a block at a time (a non-empty one)."""
    return hasattr(item, "pretty_blocks") and len(item) > 0
