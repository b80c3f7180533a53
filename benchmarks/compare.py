"""Streaming comparison of two traces' events, without loading either one.

`restore` promises the source's events back exactly (every byte of every
event, in order) and its top-level keys; the whitespace *between* events is
not part of that promise. This module checks it on multi-GB files with its own
small splitter, independent of tracestream's scanner: cut a buffer at the last
``}`` ``,`` ``{`` candidate and let msgspec validate the piece as a JSON array
of raw values; a cut inside a string cannot parse, so an earlier candidate (or
more data) is tried. Memory stays at a few buffers of `BLOCK` bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import zstandard

BLOCK = 8 << 20
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_WS = re.compile(rb"[ \t\r\n]+")


def open_trace(path):
    """A binary reader of the decompressed bytes (compression from the magic bytes)."""
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if magic == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


@dataclass
class Split:
    """What surrounds the event array (for the top-level comparison)."""

    head: bytes = b""
    tail: bytes = b""


def iter_events(path, split: Split) -> Iterator[bytes]:
    """Every event's exact bytes, in order; `split` gets the bytes around the array."""
    with open_trace(path) as fh:
        buf = fh.read(BLOCK)
        found = _EVENTS_KEY.search(buf)
        if buf.lstrip()[:1] == b"[":
            start = buf.index(b"[") + 1
        elif found:
            start = found.end()
        else:
            raise ValueError(f"{path}: no traceEvents array in the first {BLOCK} bytes")
        split.head = buf[:start]
        buf = buf[start:].lstrip()
        eof = False
        while True:
            if not eof and len(buf) < 2 * BLOCK:
                more = fh.read(BLOCK)
                eof = not more
                buf += more
                continue
            if eof:
                events, buf = _take_last(buf)
                yield from events
                break
            events, buf = _take(buf)
            yield from events
        split.tail = buf


def _take(buf: bytes) -> tuple[list[bytes], bytes]:
    """Decode the longest valid prefix of events (cut at a candidate in the last block)."""
    cuts = [m.start() for m in _CUT.finditer(buf, max(0, len(buf) - BLOCK))]
    for close in reversed(cuts):
        try:
            raws = _RAW_LIST.decode(b"[" + buf[: close + 1] + b"]")
        except msgspec.DecodeError:
            continue
        rest = buf[close + 1 :]
        return [bytes(r) for r in raws], rest[rest.index(b"{"):]
    raise ValueError("no valid cut in a whole block: an event larger than 8 MB?")


def _take_last(buf: bytes) -> tuple[list[bytes], bytes]:
    """The remaining events: the longest prefix that closes with ']' and parses."""
    end = len(buf)
    while True:
        end = buf.rfind(b"]", 0, end)
        if end < 0:
            raise ValueError("the event array never closes")
        try:
            raws = _RAW_LIST.decode(b"[" + buf[:end] + b"]")
        except msgspec.DecodeError:
            continue
        return [bytes(r) for r in raws], buf[end:]


def compare_events(source, restored) -> dict:
    """Event by event equality of two traces, plus the top-level bytes around the array."""
    split_a, split_b = Split(), Split()
    count = 0
    digest = hashlib.sha256()
    first_difference = None
    pairs = itertools.zip_longest(iter_events(source, split_a), iter_events(restored, split_b))
    for a, b in pairs:
        if a != b and first_difference is None:
            first_difference = {"index": count, "source": (a or b"<missing>")[:200].decode(),
                                "restored": (b or b"<missing>")[:200].decode()}
        if a is not None:
            digest.update(a)
        count += 1
    head_same = split_a.head == split_b.head or _WS.sub(b"", split_a.head) == _WS.sub(
        b"", split_b.head)
    tail_same = split_a.tail == split_b.tail or _WS.sub(b"", split_a.tail) == _WS.sub(
        b"", split_b.tail)
    return {
        "events_equal": first_difference is None,
        "events": count,
        "events_sha256": digest.hexdigest(),
        "first_difference": first_difference,
        "top_level_equal": head_same and tail_same,
        "verdict": "identical events" if first_difference is None and head_same and tail_same
        else "DIFFERENT",
    }
