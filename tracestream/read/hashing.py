"""Checksums and hashes of what a pass reads: CRC-32 by parts, the sha256 of the raw or
decompressed bytes in a thread of its own, and a byte-for-byte comparison with a file."""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from dataclasses import dataclass

from isal import isal_zlib

from tracestream.errors import TraceError

HASH_BLOCK = 256 << 10
"""The hash thread's reads go into one buffer of this size, reused: fresh 4 MB blocks
cost page faults, and a block this small is still in the cache when sha256 and CRC-32
read it (1.17 instead of 1.32 CPU-s per GB, measured on a 1 GB trace)."""


@dataclass
class ReadStats:
    """Filled in by a completed read: raw bytes, decompressed bytes, checksums."""

    raw_bytes: int = 0
    data_bytes: int = 0
    crc32: int = 0
    data_sha256: str = ""  # of the decompressed bytes; the first read only
    checksummed: bool = True  # False: a skipping read (`TraceSource.read_skipping`)
    # while the read goes on: the raw bytes decompressed so far (a compressed read only)
    raw_read: int = 0
    compressed: bool = False

    def position(self, data_offset: int) -> int:
        """How far the read is in its raw bytes, given the decompressed offset a consumer
        reached (progress counts the bytes on disk: for a compressed read, the raw bytes
        its decoder took so far, a block or two ahead of the consumer)."""
        return self.raw_read if self.compressed else data_offset


class PieceChecksum:
    """The CRC-32 of a file's bytes in file order, made of pieces: bytes read here
    (`read`), and spans that another process read, whose CRC comes later (`span`, then
    `fill`). Known pieces at the front are folded at once, so only the pieces after the
    first span still unknown are held (a few per chunk in flight)."""

    def __init__(self) -> None:
        self.crc = 0
        self.length = 0
        self._pieces: deque = deque()  # [crc or None, length], after the folded prefix
        self._spans = 0  # spans handed out so far (their numbers)
        self._first_span = 0  # the number of the first span in self._pieces

    def read(self, data: bytes) -> None:
        """Bytes read here, next in file order."""
        self._pieces.append([isal_zlib.crc32(data), len(data), None])
        self._fold()

    def span(self, length: int) -> int:
        """A span of `length` bytes, next in file order, whose CRC is not known yet: its
        number for `fill`."""
        number = self._spans
        self._spans += 1
        self._pieces.append([None, length, number])
        return number

    def fill(self, number: int, crc: int) -> None:
        """The CRC of span `number`."""
        for piece in self._pieces:
            if piece[2] == number:
                piece[0] = crc
                break
        else:
            raise TraceError(f"internal error: no open span {number} in the checksum")
        self._fold()

    @property
    def complete(self) -> bool:
        return not self._pieces

    def _fold(self) -> None:
        while self._pieces and self._pieces[0][0] is not None:
            crc, length, _ = self._pieces.popleft()
            self.crc = isal_zlib.crc32_combine(self.crc, crc, length)
            self.length += length

    def finish(self, stats: ReadStats) -> None:
        """Fill in `stats` as a complete checksummed read of these bytes would."""
        if not self.complete:
            raise TraceError("internal error: a span of the read has no checksum")
        stats.raw_bytes = stats.data_bytes = self.length
        stats.crc32 = self.crc


def unreadable(name, exc: OSError) -> TraceError:
    """The one line for an input that cannot be opened or read."""
    return TraceError(f"cannot read input {name}: {exc.strerror or exc}")


def bytes_changed(name: str) -> TraceError:
    return TraceError(f"input {name} changed between passes (the bytes read differ); "
                      "nothing was written")


class Hasher:
    """sha256 of a file's bytes in a daemon thread, checked against a read's size and CRC."""

    def __init__(self, opener, expected: ReadStats, name: str):
        self._opener = opener
        self._expected = expected
        self._name = name
        self._stopped = threading.Event()
        self._digest: str | None = None
        self._error: TraceError | None = None
        self._thread = threading.Thread(target=self._run, name=f"hash {name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        digest = hashlib.sha256()
        crc = 0
        total = 0
        buffer = bytearray(HASH_BLOCK)
        view = memoryview(buffer)
        try:
            with self._opener() as fh:
                while not self._stopped.is_set():
                    size = fh.readinto(buffer)
                    if not size:
                        break
                    block = view[:size]
                    digest.update(block)
                    crc = isal_zlib.crc32(block, crc)
                    total += size
        except OSError as exc:
            self._error = unreadable(self._name, exc)
            return
        if self._stopped.is_set():
            return
        if (total, crc) != (self._expected.raw_bytes, self._expected.crc32):
            self._error = bytes_changed(self._name)
            return
        self._digest = digest.hexdigest()

    def result(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._digest is None:
            raise TraceError(f"internal error: hashing {self._name} was stopped")
        return self._digest

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


class Hashed:
    """A hash made elsewhere (`TraceSource.adopt_sha256`), in place of a `Hasher`."""

    def __init__(self, digest: str):
        self._digest = digest

    def result(self) -> str:
        return self._digest

    def stop(self) -> None:
        pass


class FileComparison:
    """A writer that compares what it is given with a file's bytes, in order (`equal`),
    and hashes those bytes as `TraceSource.sha256` does (sha256, size, CRC-32).

    verify checks that restore gives back the source's bytes: compared with the file as
    they are made, the file is hashed once (its hash is the report's to check), instead
    of the restored copy hashed too (~0.8 CPU-s per GB). Once the bytes differ nothing
    more is read."""

    def __init__(self, path: str):
        self._name = str(path)
        try:
            self._fh = open(path, "rb", buffering=0)
        except OSError as exc:
            raise unreadable(self._name, exc) from None
        self._digest = hashlib.sha256()
        self._buffer = memoryview(bytearray(HASH_BLOCK))
        self.size = 0
        self.crc32 = 0
        self.equal = True

    def write(self, data) -> None:
        data = data if type(data) is bytes else bytes(data)
        at = 0
        while self.equal and at < len(data):
            try:
                read = self._fh.readinto(self._buffer[: min(len(self._buffer), len(data) - at)])
            except OSError as exc:
                raise unreadable(self._name, exc) from None
            block = self._buffer[:read]
            if not read or not data.startswith(block, at):
                self.equal = False
                return
            self._digest.update(block)
            self.crc32 = isal_zlib.crc32(block, self.crc32)
            self.size += read
            at += read

    def ended(self) -> bool:
        """Whether every byte of the file was written, equal."""
        try:
            self.equal = self.equal and not self._fh.read(1)
        except OSError as exc:
            raise unreadable(self._name, exc) from None
        return self.equal

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def close(self) -> None:
        self._fh.close()
