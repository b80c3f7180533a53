"""The checksum a pass makes of a file read partly by worker processes (source.PieceChecksum)."""

from __future__ import annotations

import random
import zlib

import pytest

from tracestream.errors import TraceError
from tracestream.source import PieceChecksum, ReadStats


def test_pieces_and_spans_filled_in_any_order_give_the_whole_files_crc():
    """Bytes read here and spans whose CRC a worker returns later, in any order of return:
    the same CRC-32 and length as one read of the whole, which `finish_read` compares."""
    rng = random.Random(5)
    data = bytes(rng.randrange(256) for _ in range(20_000))
    cuts = sorted(rng.sample(range(1, len(data)), 30))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    checksum = PieceChecksum()
    spans = {}
    for k, piece in enumerate(pieces):
        if k % 3:
            spans[checksum.span(len(piece))] = piece
        else:
            checksum.read(piece)
    assert not checksum.complete
    for number in rng.sample(sorted(spans), len(spans)):
        checksum.fill(number, zlib.crc32(spans[number]))
    stats = ReadStats()
    checksum.finish(stats)
    assert (stats.raw_bytes, stats.data_bytes, stats.crc32) == (
        len(data), len(data), zlib.crc32(data))


def test_a_span_never_filled_is_an_internal_error_not_a_checksum():
    checksum = PieceChecksum()
    checksum.read(b"[")
    number = checksum.span(10)
    checksum.read(b"]")
    with pytest.raises(TraceError, match="internal error"):
        checksum.finish(ReadStats())
    with pytest.raises(TraceError, match="internal error"):
        checksum.fill(number + 1, 0)
    checksum.fill(number, zlib.crc32(b"0123456789"))
    stats = ReadStats()
    checksum.finish(stats)
    assert stats.crc32 == zlib.crc32(b"[0123456789]")
