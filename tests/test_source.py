"""The checksum a pass makes of a file read partly by worker processes (source.PieceChecksum)."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import zlib

import pytest
from conftest import assert_refused, run

from tracestream.errors import TraceError
from tracestream.read.hashing import PieceChecksum, ReadStats
from tracestream.read.source import TraceSource


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


def test_a_checksum_by_parts_is_the_full_reads(tmp_path):
    """The first read of a plain file that worker processes read (the index pass): the
    spans they checksummed and the bytes around them read here give the CRC-32 and length
    of one read of the whole file, as `finish_read` records it for the later passes."""
    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(50_000))
    path = tmp_path / "trace.json"
    path.write_bytes(data)
    parts = [(1_000, 9_000), (10_003, 20_000), (31_000, 18_000)]
    with TraceSource(str(path)) as source:
        stats = ReadStats(checksummed=False)
        source.checksum_by_parts(stats, ((o, n, zlib.crc32(data[o:o + n])) for o, n in parts))
        source.finish_read(stats)
        assert (stats.raw_bytes, stats.crc32, stats.checksummed) == (
            len(data), zlib.crc32(data), True)
        again = ReadStats()
        for _ in source.read(again):  # a later pass reads it whole and compares
            pass
        source.finish_read(again)


def test_a_file_that_shrank_under_its_parts_is_refused(tmp_path):
    path = tmp_path / "trace.json"
    path.write_bytes(b"x" * 1_000)
    with TraceSource(str(path)) as source:
        with pytest.raises(TraceError, match="changed while being read"):
            source.checksum_by_parts(ReadStats(), [(2_000, 10, 0)])


def test_the_index_pass_with_workers_checksums_each_chunk_where_it_is_decoded(tmp_path):
    """With worker processes on a plain file, the main process reads only the bytes near
    each cut; the pass's checksum comes from each chunk's bytes as decoded and is the
    whole file's."""
    from samples.generate import TraceConfig, generate
    from tracestream.index.builder import IndexOptions, run_index
    from tracestream.read.sizing import pool_for

    path = tmp_path / "trace.json"
    generate(path, TraceConfig(iterations=30))
    with pool_for(str(path), 2) as pool, TraceSource(str(path)) as source:
        index = run_index(source, IndexOptions(chunk_bytes=64 << 10), pool=pool)
        try:
            assert len(index.chunks) > 4
            assert all(chunk.crc32 is not None for chunk in index.chunks)
            first = source.first_stats
            assert (first.raw_bytes, first.crc32, first.checksummed) == (
                path.stat().st_size, zlib.crc32(path.read_bytes()), True)
        finally:
            index.close()


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_only_a_source_whose_text_is_hashed_pays_for_the_hash(tmp_path, compress):
    """The first read of a compressed source hashes its JSON text (the report's
    source_data_sha256); an annotated trace's (`hashes_data=False`, verify and restore)
    is read without one, and asking for it is an internal error, not a wrong hash."""
    import gzip
    import hashlib

    import zstandard

    events = b",".join(b'{"ph": "i", "ts": %d}' % k for k in range(500))
    text = b'{"traceEvents": [' + events + b"]}"
    path = tmp_path / f"t.json.{compress[:2]}"
    path.write_bytes(gzip.compress(text) if compress == "gzip"
                     else zstandard.ZstdCompressor().compress(text))
    for hashes, expected in ((True, hashlib.sha256(text).hexdigest()), (False, "")):
        with TraceSource(path, hashes_data=hashes) as source:
            stats = ReadStats()
            assert b"".join(source.read(stats)) == text
            source.finish_read(stats)
            assert stats.data_sha256 == expected
            if hashes:
                assert source.data_sha256() == expected
            else:
                with pytest.raises(TraceError, match="internal error"):
                    source.data_sha256()


def test_a_file_comparison_hashes_the_file_it_matches(tmp_path):
    """verify's restore check compares the restored bytes with the plain source file as
    they are made and hashes the file on the way: written in any pieces, equal bytes give
    the file's sha256, size and CRC-32; a differing, missing or extra byte gives unequal."""
    import hashlib

    from tracestream.read.hashing import FileComparison

    text = random.Random(7).randbytes(600_000)
    path = tmp_path / "source.json"
    path.write_bytes(text)
    cuts = sorted(random.Random(8).sample(range(1, len(text)), 40))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    comparison = FileComparison(path)
    for piece in pieces:
        comparison.write(memoryview(piece) if len(piece) % 2 else piece)
    assert comparison.ended()
    comparison.close()
    assert comparison.hexdigest() == hashlib.sha256(text).hexdigest()
    assert (comparison.size, comparison.crc32) == (len(text), zlib.crc32(text))
    for written in (text[:-1], text + b"x", text[:1000] + b"?" + text[1001:]):
        comparison = FileComparison(path)
        comparison.write(written)
        assert not comparison.ended()
        comparison.close()
    with pytest.raises(TraceError, match="cannot read input .*gone.json"):
        FileComparison(tmp_path / "gone.json")


def test_a_hash_made_elsewhere_is_taken_only_for_the_first_read_s_bytes(tmp_path):
    """The source's sha256 made by verify's restore check stands for `sha256()` only when
    the bytes it hashed have the index pass's size and CRC-32: a file changed in between is
    refused as a changed input, never hashed as if it were the one indexed."""
    path = tmp_path / "t.json"
    text = b'{"traceEvents": []}'
    path.write_bytes(text)
    with TraceSource(path) as source:
        stats = ReadStats()
        b"".join(source.read(stats))
        source.finish_read(stats)
        with pytest.raises(TraceError, match="changed between passes"):
            source.adopt_sha256("ab" * 32, len(text), zlib.crc32(text) ^ 1)
        assert source.adopt_sha256("ab" * 32, len(text), zlib.crc32(text))
        assert source.sha256() == source.data_sha256() == "ab" * 32
    with TraceSource(path) as source:  # a hash already started is the one kept
        stats = ReadStats()
        b"".join(source.read(stats))
        source.finish_read(stats)
        source.start_hashing()
        assert not source.adopt_sha256("ab" * 32, len(text), zlib.crc32(text))
        assert source.sha256() != "ab" * 32


# -- the spool of a stream ------------------------------------------------------------------


def _read_all(source) -> bytes:
    stats = ReadStats()
    data = b"".join(source.read(stats))
    source.finish_read(stats)
    return data


@pytest.mark.parametrize("packed", [False, True])
def test_a_stream_is_spooled_small_and_read_back_exactly(decode_trace, tmp_path, packed):
    """Plain JSON from a pipe is spooled zstd-compressed (a fraction of the stream) and the
    second pass reads the stream's bytes exactly; a gzip stream is spooled as it came."""
    trace, _ = decode_trace
    plain = trace.read_bytes()
    stream = gzip.compress(plain) if packed else plain
    with TraceSource("-", stdin=io.BytesIO(stream), spool_dir=str(tmp_path)) as source:
        assert _read_all(source) == plain
        spooled = os.fstat(source._spool).st_size
        assert _read_all(source) == plain  # the second pass, from the spool
        assert source.sha256() == hashlib.sha256(stream).hexdigest()
    if packed:
        assert spooled == len(stream)
    else:
        assert spooled < len(plain) / 8, (spooled, len(plain))
    assert list(tmp_path.iterdir()) == []  # the spool has no name


def test_a_one_pass_command_spools_nothing(decode_trace):
    trace, _ = decode_trace
    with TraceSource("-", stdin=io.BytesIO(trace.read_bytes()), read_once=True) as source:
        assert _read_all(source) == trace.read_bytes()
        assert source._spool is None
        with pytest.raises(TraceError, match="read once is read again"):
            _read_all(source)


def test_a_spool_dir_that_cannot_hold_the_spool_is_named(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    missing = tmp_path / "no-such-folder"
    result = run("compact", "--trace", "-", "--output", out, "--spool-dir", missing,
                 stdin=trace.read_bytes())
    assert_refused(result, f"cannot spool the input in {missing}", out)


@pytest.mark.parametrize("packed", [False, True])
def test_a_first_pass_that_stops_early_leaves_the_next_one_the_whole_stream(packed):
    """verify's first pass over a piped output stops at the first difference: the next
    read copies the rest of the stream into the spool first, so it reads the whole trace
    (it read a truncated one, and called a tampered output truncated)."""
    plain = b"".join(b'{"ph": "X", "name": "k%d", "ts": %d},\n' % (k, 7 * k)
                     for k in range(300_000))  # 12 MB: more than the reader runs ahead
    stream = gzip.compress(plain, compresslevel=1) if packed else plain
    with TraceSource("-", stdin=io.BytesIO(stream)) as source:
        blocks = source.read(ReadStats())
        next(blocks)
        blocks.close()  # the first pass stops after one block
        assert source._spool_write is not None  # the rest of the stream is not spooled yet
        assert _read_all(source) == plain
        assert _read_all(source) == plain


class _Trickle(io.RawIOBase):
    """A stream that hands over its first byte alone, as a slow pipe opened unbuffered may."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, size: int = -1) -> bytes:
        size = 1 if self.pos == 0 else size
        chunk = self.data[self.pos : self.pos + size]
        self.pos += len(chunk)
        return chunk


def test_a_stream_whose_first_read_is_short_is_still_recognised(decode_trace):
    trace, _ = decode_trace
    plain = trace.read_bytes()
    with TraceSource("-", stdin=_Trickle(gzip.compress(plain))) as source:
        assert _read_all(source) == plain and source.compression == "gzip"


class _Failing(io.RawIOBase):
    def read(self, size: int = -1) -> bytes:
        raise OSError(77, "File descriptor in bad state")


def test_a_stream_that_cannot_be_read_is_one_error():
    with TraceSource("-", stdin=_Failing()) as source, pytest.raises(
            TraceError, match="cannot read input <stdin>: File descriptor in bad state"):
        _read_all(source)
