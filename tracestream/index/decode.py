"""A chunk of events decoded and validated: msgspec's structs, or the C scan that reads
the same fields where it can be sure to read them alike; JSON errors named by event."""

from __future__ import annotations

import re

import msgspec
import numpy as np
import orjson

from tracestream import _native
from tracestream.index.facts import BadCut, ChunkError, Context
from tracestream.index.keyscan import separators
from tracestream.model import (
    FLOW_PHASES,
    RAW_EVENTS,
    Event,
    ReadEvent,
    describe_validation_error,
)
from tracestream.read.jsonbytes import ARRAY_ENDS, CUT, orjson_reason, orjson_verdict

_EVENTS = msgspec.json.Decoder(list[Event])
_READ_EVENTS = msgspec.json.Decoder(list[ReadEvent])
"""`id` and `bp` accept any value: skipping them refuses the same inputs, and saves ~3% of
the decode where nothing binds flows."""
_EVENT = msgspec.json.Decoder(Event)
"""One event of a scanned chunk, decoded where Python code reads it (see decode_chunk)."""
INTERPRETED_KEYS = (b'"ts"', b'"dur"', b'"pid"', b'"tid"', b'"name"', b'"cat"', b'"ph"')
MOVED_KEYS = INTERPRETED_KEYS[:4]
PHASE_OTHER, PHASE_COMPLETE, PHASE_METADATA, PHASE_FLOW = range(4)
PHASE_CODES = {"X": PHASE_COMPLETE, "M": PHASE_METADATA, **dict.fromkeys(FLOW_PHASES, PHASE_FLOW)}


def decode_chunk(data: bytes, offset: int, doc=None, decoder=_EVENTS) -> list[Event]:
    """The chunk's events; BadCut if the cut was wrong, ChunkError if the input is malformed.

    `doc`: the chunk between `[` and `]` where the caller has it so (else it is made
    where msgspec decodes it).
    `decoder`: `_EVENTS`, or `_READ_EVENTS` where no flow is bound (see `decoder_for`).
    The events are `_native.scan_events`' scan (a sequence of msgspec's Event) unless it
    declines the chunk (its numpy twin declines every chunk).
    """
    scanned = _native.scan_events(data if doc is None else doc, msgspec.json.decode,
                                  _EVENT.decode, msgspec.UNSET, doc is not None)
    if scanned is not None:
        if not scanned.ascii:
            _check_utf8(data, offset)
        return scanned
    if doc is None:
        doc, ascii_only = bracketed(data)
    else:
        ascii_only = data.isascii()
    if not ascii_only:
        _check_utf8(data, offset)
    try:
        return decoder.decode(doc)
    except msgspec.ValidationError as exc:
        local = _validation_index(exc)
        starts = event_starts(data, None)
        where = offset + starts[local] if local is not None and local < len(starts) else offset
        raise ChunkError(describe_validation_error(exc), where, local) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        first = exc
    try:
        orjson.loads(doc)
    except orjson.JSONDecodeError as exc:
        verdict = orjson_verdict(exc, len(doc))
        if verdict == CUT:
            raise BadCut() from None
        if verdict == ARRAY_ENDS:
            raise BadCut(array_ends_at=exc.pos - 1) from None
        raise ChunkError(f"malformed JSON: {orjson_reason(exc)}",
                         offset + exc.pos - 1, None) from None
    except RecursionError:
        pass
    reason = "JSON nested too deeply" if isinstance(first, RecursionError) else str(first)
    raise ChunkError(reason, offset, None)


def _check_utf8(data: bytes, offset: int) -> None:
    """ChunkError where the chunk's bytes are not UTF-8 (JSON text is)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChunkError(f"invalid UTF-8: {exc.reason}", offset + exc.start, None) from None


def bracketed(data: bytes) -> tuple[bytes, bool]:
    """(b"[" + data + b"]", whether data is all ASCII): the chunk as the array the decoder
    reads. Only a chunk the C scan declines comes here (the scan checks the bytes in its
    own pass), so it has no C twin."""
    return b"".join((b"[", data, b"]")), data.isascii()


def _validation_index(exc: msgspec.ValidationError) -> int | None:
    m = re.search(r"at `\$\[(\d+)\]", str(exc))
    return int(m.group(1)) if m else None


def event_spans(data: bytes, count: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) offsets of every event in a validated chunk.

    Every real boundary matches the separator pattern; a match inside a string or a
    nested value would add one, so a count equal to the decoded count proves the
    spans exact. Otherwise the events' exact bytes come from msgspec.
    """
    sep_starts, sep_ends = separators(data)
    if count is None or len(sep_starts) + 1 == count:
        starts = np.empty(len(sep_starts) + 1, np.int64)
        ends = np.empty(len(sep_starts) + 1, np.int64)
        starts[0] = 0
        starts[1:] = sep_ends - 1
        ends[:-1] = sep_starts + 1
        ends[-1] = len(data)
        return starts, ends
    starts_l = []
    ends_l = []
    pos = 0
    for raw in RAW_EVENTS.decode(b"".join((b"[", data, b"]"))):
        pos = data.find(b"{", pos)
        starts_l.append(pos)
        pos += len(raw)
        ends_l.append(pos)
    return np.array(starts_l, np.int64), np.array(ends_l, np.int64)


def event_starts(data: bytes, count: int | None) -> list[int]:
    """Offset of every event in a validated chunk (see `event_spans`)."""
    return event_spans(data, count)[0].tolist()


def decoder_for(ctx: Context) -> msgspec.json.Decoder:
    """The events' decoder: flows are bound (their `id` and `bp` read) only where the
    chunk's candidates are numbered for a rewrite (see `_Observer.run`)."""
    return _EVENTS if ctx.records or ctx.moves_gpu or ctx.window else _READ_EVENTS


