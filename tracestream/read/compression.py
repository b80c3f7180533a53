"""Compression, the one place that knows it: detected from a trace's first bytes (never its
name), decoded in blocks (gzip members, zstd frames and skippable frames), and the
file-name suffixes that choose an output's."""

from __future__ import annotations

from collections.abc import Iterator

import zstandard
from isal import isal_zlib

from tracestream.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SKIPPABLE_MAGIC = (b"\x2a\x4d\x18", 0x50, 0x5F)
"""A zstd skippable frame: magic 0x184D2A5? little-endian (pzstd starts with one)."""


OUT_BLOCK = 1 << 20  # decompressed bytes per piece: trace JSON compresses 10-20x
ZSTD_FEED = 64 << 10  # zstd input per call (its decompressobj has no output limit)


def detect_compression(head: bytes) -> str:
    """gzip, zstd or none, from the first four bytes."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC) or is_zstd_skippable(head):
        return "zstd"
    return "none"


def is_zstd_skippable(head: bytes) -> bool:
    """Whether `head` starts a zstd skippable frame (a zstd stream may begin with one)."""
    tail, low, high = ZSTD_SKIPPABLE_MAGIC
    return len(head) >= 4 and low <= head[0] <= high and head[1:4] == tail


def zstd_blocks(raw: Iterator[bytes], name: str) -> Iterator[bytes]:
    """Decompressed blocks of a zstd stream (every frame); TraceError naming the compressed
    byte where it is corrupt, or that it is truncated (a stream reader just stops there)."""
    decoder = ZstdDecoder(name)
    offset = 0
    for block in raw:
        yield from decoder.feed(block, offset)
        offset += len(block)
    decoder.finish(offset)


class GzipDecoder:
    """Multi-member gzip, with errors that name the compressed byte offset."""

    def __init__(self, name: str):
        self.name = name
        self._obj = isal_zlib.decompressobj(wbits=31)
        self._started = False

    def feed(self, data: bytes, offset: int):
        while data:
            try:
                out = self._obj.decompress(data, OUT_BLOCK)
                pieces = [out]
                # output held back at the limit, with no input left: drain it before more input
                while len(out) == OUT_BLOCK and not self._obj.unconsumed_tail \
                        and not self._obj.eof:
                    out = self._obj.decompress(b"", OUT_BLOCK)
                    pieces.append(out)
            except isal_zlib.error as exc:
                raise TraceError(
                    f"{self.name}: corrupt gzip data near compressed byte {offset}: {exc}"
                ) from None
            self._started = True
            for out in pieces:
                if out:
                    yield out
            if self._obj.unconsumed_tail and not self._obj.eof:
                offset += len(data) - len(self._obj.unconsumed_tail)
                data = self._obj.unconsumed_tail
                continue
            if self._obj.eof:
                rest = self._obj.unused_data
                offset += len(data) - len(rest)
                data = rest
                self._obj = isal_zlib.decompressobj(wbits=31)
                self._started = False
                if data and not data.startswith(GZIP_MAGIC):
                    if data.strip(b"\0"):
                        raise TraceError(
                            f"{self.name}: trailing bytes after gzip data at compressed byte "
                            f"{offset}"
                        )
                    return
            else:
                data = b""

    def finish(self, total: int) -> None:
        if self._started and not self._obj.eof:
            raise TraceError(f"{self.name}: gzip data is truncated (ends at byte {total})")


class ZstdDecoder:
    """Multi-frame zstd, with errors that name the compressed byte offset."""

    def __init__(self, name: str):
        self.name = name
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._started = False

    def feed(self, data: bytes, offset: int):
        while len(data) > ZSTD_FEED:  # small inputs keep each output piece small
            yield from self.feed(data[:ZSTD_FEED], offset)
            data = data[ZSTD_FEED:]
            offset += ZSTD_FEED
        while data:
            try:
                out = self._obj.decompress(data)
            except zstandard.ZstdError as exc:
                raise TraceError(
                    f"{self.name}: corrupt zstd data near compressed byte {offset}: {exc}"
                ) from None
            self._started = True
            if out:
                yield out
            if self._obj.eof:
                rest = self._obj.unused_data
                offset += len(data) - len(rest)
                data = rest
                self._obj = self._dctx.decompressobj()
                self._started = False
            else:
                data = b""

    def finish(self, total: int) -> None:
        if self._started and not self._obj.eof:
            raise TraceError(f"{self.name}: zstd data is truncated (ends at byte {total})")


SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
"""File-name suffixes that name a compression: an output's, when none is given."""
SUFFIX_OF = {"gzip": ".gz", "zstd": ".zst", "none": ""}
"""The suffix an output name gets for each compression."""


def compression_for(path: str, explicit: str | None) -> str:
    """The output's compression: the one its suffix names (none without one), or `explicit`
    (none/gzip/zstd), which must be that one unless the output is stdout (`-`): a viewer
    and every tool after it go by the name, so a `.gz` holding zstd opens nowhere."""
    lower = path.lower()
    suffix, named = next(((suffix, compression) for suffix, compression in SUFFIXES.items()
                          if lower.endswith(suffix)), ("", "none"))
    if explicit is None or explicit == named or path == "-":
        return explicit or named
    what = f"{suffix} is {named}" if suffix else "no .gz or .zst: uncompressed JSON"
    stem = path[: len(path) - len(suffix)]
    raise TraceError(f"--compress {explicit} contradicts the output name {path} ({what}): "
                     f"name it {stem}{SUFFIX_OF[explicit]} or leave --compress out")
