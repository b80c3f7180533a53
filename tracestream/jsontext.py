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
