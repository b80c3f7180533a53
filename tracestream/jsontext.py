"""Writing JSON text where some numbers must keep their exact source digits."""

from __future__ import annotations

from typing import Any

import orjson


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
    if not value:
        write(dumps_pretty(value))
        return
    write(b"{\n")
    for n, (key, item) in enumerate(value.items()):
        write((b",\n" if n else b"") + b"  " + orjson.dumps(str(key)) + b": ")
        if not hasattr(item, "pretty_blocks"):
            write(_pretty(item, 1))
        elif not len(item):
            write(b"[]")
        else:
            write(b"[\n")
            for k, block in enumerate(item.pretty_blocks(2)):
                write(b",\n" + block if k else block)
            write(b"\n  ]")
    write(b"\n}\n")
