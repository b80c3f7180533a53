"""Reading a trace: a path or stdin, plain/gzip/zstd, read as often as a pass needs.

Compression is detected from the first bytes, never the file name. stdin, and any
path that is not a regular file (a named pipe, `<(...)` as /dev/fd/N, /dev/stdin),
is read once as a stream and spooled to a temporary file while the first pass reads
it, so later passes read the spool. The spool has no name while it is open
(O_TMPFILE, else unlinked at once), so even SIGKILL leaves nothing behind.

Every read checksums the raw bytes (CRC-32, cheap) in a background thread together with
decompression, so a file that changes between passes is detected and refused. The first
read of a compressed input also hashes the decompressed bytes (sha256, the JSON text that
`restore` gives back), unless the source is made with `hashes_data=False` (an annotated
trace, whose own hash nothing asks for: `verify` and `restore` read its bytes to restore
the source's, hashed as they are written). The report's sha256 of the raw bytes is
computed on request, in a thread of its own, by a further read
(`TraceSource.start_hashing`); for an uncompressed input, whose raw bytes are its
decompressed bytes, that one hash is both. `verify` hashes an uncompressed source where it
compares restore's bytes with it (`FileComparison`), and that hash stands for the thread's
when it was made of the first read's bytes (`TraceSource.adopt_sha256`). A source made
with `read_once=True` (read-only commands: one pass, no hash in their output) hashes
nothing, and when worker processes read an uncompressed file's bytes, its one read skips
them (`read_skipping`). A pass whose workers read an uncompressed file's chunks themselves
is checksummed by parts (`PieceChecksum`): each worker's CRC-32 of the bytes it used and
the bytes between them read here, combined in file order, so the main process reads no
byte a worker reads and the pass's CRC is still the file's.
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard
from isal import isal_zlib

from tracestream.errors import TraceError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SKIPPABLE_MAGIC = (b"\x2a\x4d\x18", 0x50, 0x5F)
"""A zstd skippable frame: magic 0x184D2A5? little-endian (pzstd starts with one)."""
RAW_BLOCK = 1 << 20
PLAIN_BLOCK = 4 << 20
HASH_BLOCK = 256 << 10
"""The hash thread's reads go into one buffer of this size, reused: fresh 4 MB blocks
cost page faults, and a block this small is still in the cache when sha256 and CRC-32
read it (1.17 instead of 1.32 CPU-s per GB, measured on a 1 GB trace)."""
OUT_BLOCK = 1 << 20  # decompressed bytes per piece: trace JSON compresses 10-20x
ZSTD_FEED = 64 << 10  # zstd input per call (its decompressobj has no output limit)
_QUEUE_DEPTH = 2


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


def is_stream_path(path) -> bool:
    """Whether `path` names something that can be read only once (a pipe, a terminal,
    /dev/fd/N of a process substitution): it is read like stdin, never reopened."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode) and not os.path.isdir(path)
    except OSError:
        return False


@dataclass(frozen=True)
class Fingerprint:
    """What identifies the bytes of a file between two passes."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> Fingerprint:
        st = os.stat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class ReadStats:
    """Filled in by a completed read: raw bytes, decompressed bytes, checksums."""

    raw_bytes: int = 0
    data_bytes: int = 0
    crc32: int = 0
    data_sha256: str = ""  # of the decompressed bytes; the first read only
    checksummed: bool = True  # False: a skipping read (`TraceSource.read_skipping`)


class TraceSource:
    """A trace input that can be read (decompressed) from the start any number of times."""

    def __init__(self, spec: str | os.PathLike, *, stdin=None, read_once: bool = False,
                 hashes_data: bool = True):
        self.spec = str(spec)
        self.read_once = read_once  # a read-only command's source: one read, no sha256
        # False: the first read of a compressed input hashes nothing (~0.5 CPU-s per GB of
        # JSON text) where nothing asks for `data_sha256`
        self.hashes_data = hashes_data
        self._hasher: _Hasher | None = None
        self._spool: int | None = None  # the spool's file descriptor (it has no name)
        self._stdin = None
        self._opened = None  # a stream path we opened ourselves (closed with the source)
        self.first_stats: ReadStats | None = None
        if self.spec == "-":
            self._stdin = stdin if stdin is not None else sys.stdin.buffer
            self.name = "<stdin>"
            self.path = None
            self.compression = None
        elif is_stream_path(self.spec):
            try:
                self._opened = self._stdin = open(self.spec, "rb", buffering=0)
            except OSError as exc:
                raise TraceError(f"cannot read input {self.spec}: {exc.strerror}") from None
            self.name = self.spec
            self.path = None
            self.compression = None
        else:
            path = Path(self.spec)
            if not path.exists():
                raise TraceError(f"input not found: {path}")
            if path.is_dir():
                raise TraceError(f"input is a directory, not a trace file: {path}")
            try:
                with open(path, "rb") as fh:
                    head = fh.read(4)
            except OSError as exc:
                raise TraceError(f"cannot read input {path}: {exc.strerror}") from None
            self.name = str(path)
            self.path = path
            self.compression = detect_compression(head)
            self.fingerprint = Fingerprint.of(path)

    @property
    def is_stdin(self) -> bool:
        return self._stdin is not None

    @property
    def plain_path(self) -> str | None:
        """The path of an uncompressed file on disk (worker processes can read spans of it
        themselves), else None."""
        if self.is_stdin or self.compression != "none":
            return None
        return str(self.path)

    def close(self) -> None:
        if self._hasher is not None:
            self._hasher.stop()
        if self._spool is not None:
            os.close(self._spool)
            self._spool = None
        if self._opened is not None:
            self._opened.close()
            self._opened = None

    def __enter__(self) -> TraceSource:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, stats: ReadStats | None = None) -> Iterator[bytes]:
        """Decompressed blocks of the whole input; fills `stats` when the read completes.

        The first read of stdin spools it; every later read uses the spool. A
        file whose bytes differ from the first read's raises TraceError.
        """
        stats = stats if stats is not None else ReadStats()
        if self._stdin is not None and self._spool is None:
            return self._read_stdin_first(stats)
        return self._read_file(stats)

    def read_skipping(self, stats: ReadStats) -> SkippingBlocks | None:
        """The first read of an uncompressed file whose bytes are mostly read elsewhere (by
        worker processes, see `plain_path`): its blocks, read on demand, with `skip_to`
        to pass bytes without reading them. Nothing is checksummed here: a `read_once`
        source needs no checksum (and cannot be read again); for any other, the caller
        completes `stats` with `checksum_by_parts` before `finish_read`. None unless the
        source is a plain file not yet read."""
        if self.plain_path is None or self.first_stats is not None:
            return None
        try:
            fh = open(self.path, "rb")
        except OSError as exc:
            raise TraceError(f"cannot read input {self.name}: {exc.strerror}") from None
        return SkippingBlocks(fh, stats, self.name)

    def _open_for_reading(self):
        """A new reader from the start: of the spool (its own offset), else of the file."""
        if self._spool is not None:
            return _SpoolReader(self._spool)
        return open(self.path, "rb")

    def _read_stdin_first(self, stats: ReadStats) -> Iterator[bytes]:
        self._spool = anonymous_temp_file(tempfile.gettempdir())
        spool = self._spool
        stdin = self._stdin

        def raw_blocks():
            while True:
                block = stdin.read(RAW_BLOCK)
                if not block:
                    break
                view = memoryview(block)
                try:
                    while view:
                        view = view[os.write(spool, view):]
                except OSError as exc:  # a full $TMPDIR: the input's second pass needs it
                    raise TraceError(
                        f"cannot spool the input in {tempfile.gettempdir()}: "
                        f"{exc.strerror or exc} (set TMPDIR to a folder with room)"
                    ) from None
                yield block

        blocks = raw_blocks()
        first = next(blocks, b"")
        self.compression = detect_compression(first)
        self.fingerprint = None

        def with_first():
            if first:
                yield first
            yield from blocks

        return self._decoded(with_first(), stats, self.compression)

    def _read_file(self, stats: ReadStats) -> Iterator[bytes]:
        if self.first_stats is not None and not self.first_stats.checksummed:
            raise TraceError("internal error: a source read by skipping is read again")
        if self._spool is None:
            self._check_unchanged()
        try:
            fh = self._open_for_reading()
        except OSError as exc:
            raise TraceError(f"cannot read input {self.name}: {exc.strerror}") from None
        block = PLAIN_BLOCK if self.compression == "none" else RAW_BLOCK

        def raw_blocks():
            with fh:
                while True:
                    data = fh.read(block)
                    if not data:
                        return
                    yield data

        return self._decoded(raw_blocks(), stats, self.compression)

    def checksum_by_parts(self, stats: ReadStats, parts) -> None:
        """Complete a skipping read's `stats` (see read_skipping) as a checksummed read of
        the whole file: `parts` are (offset, length, CRC-32) of the spans other processes
        read and checksummed, in file order; the bytes around them are read here. A file
        that no longer holds those bytes (it shrank) is refused."""
        checksum = PieceChecksum()
        fd = self.open_plain(first=True)
        try:
            pos = 0
            for offset, length, crc in parts:
                while pos < offset:
                    pos += self._read_part(fd, pos, min(PLAIN_BLOCK, offset - pos), checksum)
                number = checksum.span(length)
                checksum.fill(number, crc)
                pos = offset + length
            while data := os.pread(fd, PLAIN_BLOCK, pos):
                checksum.read(data)
                pos += len(data)
        finally:
            os.close(fd)
        checksum.finish(stats)
        stats.checksummed = True

    def _read_part(self, fd: int, pos: int, length: int, checksum: PieceChecksum) -> int:
        data = os.pread(fd, length, pos)
        if len(data) < length:
            raise TraceError(f"input {self.name} changed while being read (it ends at byte "
                             f"{pos + len(data)}); nothing was written")
        checksum.read(data)
        return length

    def open_plain(self, *, first: bool = False) -> int:
        """A read-only descriptor of an uncompressed input file for a pass that reads parts
        of it by offset (worker processes read the rest); a later pass's is checked
        unchanged first (`first`: the first pass's, see checksum_by_parts). The caller
        checksums every byte of the pass (`PieceChecksum`) and hands the result to
        `finish_read`, which compares it with the first read's."""
        if self.plain_path is None or (not first and (
                self.first_stats is None or not self.first_stats.checksummed)):
            raise TraceError("internal error: only a checksummed plain file is read by parts")
        self._check_unchanged()
        try:
            return os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise TraceError(f"cannot read input {self.name}: {exc.strerror}") from None

    def _check_unchanged(self) -> None:
        if self.path is None or self.first_stats is None:
            return
        try:
            now = Fingerprint.of(self.path)
        except OSError:
            raise TraceError(f"input {self.path} disappeared between passes") from None
        if now != self.fingerprint:
            raise TraceError(
                f"input {self.path} changed between passes (size/mtime/inode differ); "
                "nothing was written"
            )

    def start_hashing(self) -> None:
        """Start hashing the raw bytes (sha256) in a background thread, after the first read.

        hashlib releases the GIL, so the hash (~0.8 CPU-s per GB) costs no time where a
        core is idle: run after the index pass, it goes on while the plan keeps one core
        busy, instead of taking a share of the cores the index pass keeps busy. That is
        also why the first read of an uncompressed input hashes nothing: this hash of its
        raw bytes is the hash of its decompressed bytes too (`data_sha256`).
        """
        if self.first_stats is None:
            raise TraceError("internal error: the source is hashed after its first read")
        if self._hasher is None:
            self._hasher = _Hasher(self._open_for_reading, self.first_stats, self.name)

    def adopt_sha256(self, digest: str, size: int, crc32: int) -> bool:
        """Take the sha256 a `FileComparison` of this plain file made (with the size and
        CRC-32 of the bytes it hashed) as `sha256`'s, where no hash was started (whether it
        was taken): those bytes must be the first read's, as `start_hashing`'s thread
        checks its own; TraceError where they are not."""
        if self._hasher is not None or self.first_stats is None or self.plain_path is None:
            return False
        if (size, crc32) != (self.first_stats.raw_bytes, self.first_stats.crc32):
            raise _bytes_changed(self.name)
        self._hasher = _Hashed(digest)
        return True

    def sha256(self) -> str:
        """The raw bytes' sha256 (hex), from `start_hashing`'s thread (started if need be).

        TraceError if those bytes are not the first read's.
        """
        self.start_hashing()
        return self._hasher.result()

    def data_sha256(self) -> str:
        """The sha256 (hex) of the decompressed bytes: from the first complete read of a
        compressed input, the raw bytes' `sha256` of an uncompressed one."""
        if self.first_stats is None:
            raise TraceError("internal error: the source is hashed during its first read")
        if self.compression == "none":
            return self.sha256()
        if self.read_once or not self.hashes_data:
            raise TraceError("internal error: a source read without a hash was hashed")
        return self.first_stats.data_sha256

    def _hashes_first_read(self, compression: str) -> bool:
        """Whether the read about to start hashes the decompressed bytes (see data_sha256)."""
        return (self.first_stats is None and self.hashes_data and not self.read_once
                and compression != "none")

    def _decoded(self, raw: Iterator[bytes], stats: ReadStats, compression: str):
        """Checksum and decompress in a background thread; yield decompressed blocks."""
        digest = hashlib.sha256() if self._hashes_first_read(compression) else None
        return _threaded(_decode_blocks(raw, stats, compression, self, digest), name=self.name)

    def finish_read(self, stats: ReadStats) -> None:
        """Record the first complete read, or compare a later one with it."""
        if self.first_stats is None:
            self.first_stats = stats
            return
        first = self.first_stats
        if (stats.raw_bytes, stats.data_bytes, stats.crc32) != (
            first.raw_bytes,
            first.data_bytes,
            first.crc32,
        ):
            raise _bytes_changed(self.name)
        self._check_unchanged()


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


class SkippingBlocks:
    """The blocks of an uncompressed file, read in the calling thread only where they are
    iterated (see TraceSource.read_skipping); `stats` gets the sizes at the end, no
    checksum."""

    def __init__(self, fh, stats: ReadStats, name: str):
        self._fh = fh
        self._stats = stats
        self._name = name
        self._pos = 0
        stats.checksummed = False

    def __iter__(self) -> SkippingBlocks:
        return self

    def __next__(self) -> bytes:
        if self._fh.closed:
            raise StopIteration
        try:
            data = self._fh.read(PLAIN_BLOCK)
        except OSError as exc:
            self._fh.close()
            raise TraceError(f"cannot read {self._name}: {exc}") from None
        if not data:
            self._fh.close()
            self._stats.raw_bytes = self._stats.data_bytes = self._pos
            raise StopIteration
        self._pos += len(data)
        return data

    def skip_to(self, offset: int) -> None:
        """Go on reading at `offset` (at or after what was read), passing the bytes before."""
        if not self._fh.closed:
            self._fh.seek(offset)
            self._pos = offset


def _decode_blocks(raw: Iterator[bytes], stats: ReadStats, compression: str, source,
                   digest=None):
    """Decompressed blocks; `stats` filled in at the end (`digest`, a sha256 object when
    given, hashes the decompressed bytes in this thread: hashlib releases the GIL)."""
    crc = 0
    raw_total = 0
    data_total = 0
    if compression == "gzip":
        decoder = _GzipDecoder(source.name)
    elif compression == "zstd":
        decoder = _ZstdDecoder(source.name)
    else:
        decoder = None
    for block in raw:
        crc = isal_zlib.crc32(block, crc)  # ISA-L: ~7x zlib's speed, same value
        raw_total += len(block)
        if decoder is None:
            data_total += len(block)
            if digest is not None:
                digest.update(block)
            yield block
            continue
        for out in decoder.feed(block, raw_total - len(block)):
            data_total += len(out)
            if digest is not None:
                digest.update(out)
            yield out
    if decoder is not None:
        decoder.finish(raw_total)
    stats.raw_bytes = raw_total
    stats.data_bytes = data_total
    stats.crc32 = crc
    if digest is not None:
        stats.data_sha256 = digest.hexdigest()


def _unreadable(name: str, exc: OSError) -> TraceError:
    return TraceError(f"cannot read input {name}: {exc.strerror or exc}")


def _bytes_changed(name: str) -> TraceError:
    return TraceError(f"input {name} changed between passes (the bytes read differ); "
                      "nothing was written")


class _Hasher:
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
            self._error = _unreadable(self._name, exc)
            return
        if self._stopped.is_set():
            return
        if (total, crc) != (self._expected.raw_bytes, self._expected.crc32):
            self._error = _bytes_changed(self._name)
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


class _Hashed:
    """A hash made elsewhere (`TraceSource.adopt_sha256`), in place of a `_Hasher`."""

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
            raise _unreadable(self._name, exc) from None
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
                raise _unreadable(self._name, exc) from None
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
            raise _unreadable(self._name, exc) from None
        return self.equal

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def close(self) -> None:
        self._fh.close()


def zstd_blocks(raw: Iterator[bytes], name: str) -> Iterator[bytes]:
    """Decompressed blocks of a zstd stream (every frame); TraceError naming the compressed
    byte where it is corrupt, or that it is truncated (a stream reader just stops there)."""
    decoder = _ZstdDecoder(name)
    offset = 0
    for block in raw:
        yield from decoder.feed(block, offset)
        offset += len(block)
    decoder.finish(offset)


def anonymous_temp_file(folder: str) -> int:
    """A read-write file descriptor of a new file in `folder` that has no name.

    O_TMPFILE where the file system has it, else a named file unlinked at once: either
    way the kernel frees it when the descriptor closes, also when the process is killed.
    """
    flags = getattr(os, "O_TMPFILE", 0)
    if flags:
        try:
            return os.open(folder, flags | os.O_RDWR, 0o600)
        except OSError:
            pass
    try:
        fd, name = tempfile.mkstemp(prefix="tracestream-stdin-", suffix=".spool", dir=folder)
    except OSError as exc:
        raise TraceError(
            f"cannot spool the input in {folder}: {exc.strerror or exc} (set TMPDIR)"
        ) from None
    os.unlink(name)
    return fd


class _SpoolReader:
    """Reads the spool from its start with pread, through a descriptor of its own (so a
    reader thread that outlives its TraceSource never reads a reused descriptor number)."""

    def __init__(self, fd: int):
        self._fd = os.dup(fd)
        self._offset = 0

    def read(self, size: int) -> bytes:
        data = os.pread(self._fd, size, self._offset)
        self._offset += len(data)
        return data

    def readinto(self, buffer) -> int:
        size = os.preadv(self._fd, [buffer], self._offset)
        self._offset += size
        return size

    def __enter__(self) -> _SpoolReader:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._fd)


class _GzipDecoder:
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


class _ZstdDecoder:
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


_DONE = object()


def _threaded(blocks: Iterator[bytes], name: str) -> Iterator[bytes]:
    """Run a block producer in a thread (decompression and the CRC release the GIL)."""
    q: queue.Queue = queue.Queue(maxsize=_QUEUE_DEPTH)
    stop = threading.Event()

    def produce():
        try:
            for block in blocks:
                while not stop.is_set():
                    try:
                        q.put(block, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            q.put(exc)
        finally:
            blocks.close()

    thread = threading.Thread(target=produce, name=f"read {name}", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                if isinstance(item, OSError):
                    raise TraceError(f"cannot read {name}: {item}") from None
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)
