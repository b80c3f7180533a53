"""How verify reads an output event: its own schema (the provenance read as it was written),
with the C scan where it reads the chunk exactly as msgspec would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from tracestream import _native
from tracestream.index.numbers import double_values, imported_ns_columns
from tracestream.model import RAW_EVENTS, CheckEvent

CHECK_EVENTS = msgspec.json.Decoder(list[CheckEvent])


def event_name(event: CheckEvent) -> Any:
    """An event's name as `decode_head` reads it (None when it has none)."""
    return decoded_name(event.name)


def decoded_name(name: Any) -> Any:
    """A name as `decode_head` reads it: `CheckEvent`'s text (None when empty), or the
    value a scan gives."""
    if not isinstance(name, msgspec.Raw):
        return name
    return msgspec.json.decode(name) if len(name) else None


_CHECK_EVENT = msgspec.json.Decoder(CheckEvent)


def scanned_chunk(content: bytes):
    """A chunk's events as the C extension's scan reads them (`CheckEvent`s one by one,
    the provenance as `Origin`), or None where it declines them (its numpy twin declines
    every chunk): the caller then decodes them with msgspec, which decides what is valid.
    The scan accepts only what msgspec accepts with the same values (see the C
    extension's scan_events); it is the index pass's, run in the mode that reads a
    provenance's pid and tid, and its answers are held to msgspec's by tests
    (`tests/test_scan.py`)."""
    return _native.scan_events(content, msgspec.json.decode, _CHECK_EVENT.decode, None, False,
                               True)


def raw_events(content: bytes, document: bytes | None) -> list:
    """The chunk's events as exact texts (msgspec.Raw)."""
    if document is None:
        document = b"".join((b"[", content, b"]"))
    return RAW_EVENTS.decode(document)


def values_of(events, indices: list[int], key: str) -> list:
    """events[i].<key> for each of the indices (their texts where `CheckEvent` keeps one)."""
    return _native.event_values(events, indices, key)



@dataclass
class NumberColumn:
    """ts or dur texts as Perfetto imports them, a column at a time: the exact value in ns
    (floor and ceil agree on these shapes), llround(double(text) * 1000) and its truncated
    variant (integer literals are exact), and which texts are in Kineto's shapes (integer
    or one to three decimals, see _native.decimal_column); the others are
    left to timebase."""

    exact: np.ndarray
    rounded: np.ndarray
    truncated: np.ndarray
    regular: np.ndarray

    @classmethod
    def of_events(cls, events: list, key: str) -> NumberColumn:
        """`parse` of the events' `key` texts (msgspec.Raw), read by
        `_native.decimal_column`."""
        exact, shapes = _native.decimal_column(events, key, True)
        return cls._of(np.frombuffer(exact, np.int64), np.frombuffer(shapes, np.int8),
                       _FieldTexts(events, key))

    @classmethod
    def _of(cls, exact: np.ndarray, shapes: np.ndarray, texts) -> NumberColumn:
        integer = shapes == _native.SHAPE_INTEGER
        regular = integer | (shapes == _native.SHAPE_DECIMAL)
        rounded, truncated = imported_ns_columns(
            exact, integer, double_values(np.where(regular, exact, 0), texts))
        return cls(exact, rounded, truncated, regular)


class Timed(tuple):
    """(ts, dur) NumberColumns of a chunk's events."""

    def __new__(cls, events: list) -> Timed:
        return super().__new__(cls, (NumberColumn.of_events(events, "ts"),
                                     NumberColumn.of_events(events, "dur")))


class _FieldTexts:
    """The `key` texts of `events`, read one at a time (double_values reads the few it
    cannot compute from the exact ns)."""

    def __init__(self, events: list, key: str):
        self._events, self._key = events, key

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, k: int):
        return getattr(self._events[k], self._key)
