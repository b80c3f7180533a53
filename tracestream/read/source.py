"""Reading a trace: a path or stdin, plain/gzip/zstd, read as often as a pass needs.

Compression is detected from the first bytes, never the file name. stdin, and any
path that is not a regular file (a named pipe, `<(...)` as /dev/fd/N, /dev/stdin),
is read once as a stream and spooled to a temporary file while the first pass reads
it, so later passes read the spool. The spool has no name while it is open
(O_TMPFILE, else unlinked at once), so even SIGKILL leaves nothing behind. Plain JSON
is spooled zstd-compressed at level 1 (about 20x smaller, at ~700 MB/s: a 10 GB stream
needs ~0.5 GB of $TMPDIR, not 10 GB of a tmpfs's RAM); a compressed stream is spooled as it
comes. A `read_once` source (one pass) spools nothing.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard
from isal import isal_zlib

from tracestream.errors import TraceError
from tracestream.read.compression import GzipDecoder, ZstdDecoder, detect_compression
from tracestream.read.hashing import (
    Hashed,
    Hasher,
    PieceChecksum,
    ReadStats,
    bytes_changed,
    unreadable,
)

RAW_BLOCK = 1 << 20
SPOOL_LEVEL = 1
"""zstd's level for a spooled plain stream: JSON shrinks ~20x at ~700 MB/s (level 1 was the
smallest and among the quickest of 1, -1 and -3 on a generated and a real-derived trace)."""
PLAIN_BLOCK = 4 << 20


_QUEUE_DEPTH = 2


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


class TraceSource:
    """A trace input that can be read (decompressed) from the start any number of times."""

    def __init__(self, spec: str | os.PathLike, *, stdin=None, read_once: bool = False,
                 hashes_data: bool = True, max_event_bytes: int | None = None,
                 spool_dir: str | None = None):
        self.spec = str(spec)
        self.spool_dir = spool_dir  # where a stream is spooled (None: $TMPDIR)
        # the longest single event its reads accept (None: read.document's default)
        self.max_event_bytes = max_event_bytes
        self.read_once = read_once  # a read-only command's source: one read, no sha256
        # False: the first read of a compressed input hashes nothing (~0.5 CPU-s per GB of
        # JSON text) where nothing asks for `data_sha256`
        self.hashes_data = hashes_data
        self._hasher: Hasher | None = None
        self._spool: int | None = None  # the spool's file descriptor (it has no name)
        self._spool_packed = False  # whether the spool holds the stream zstd-compressed
        # the spool's writer until the stream's last byte is in the spool (a first pass may
        # stop early: the next read copies the rest first), and the error that stopped it
        self._spool_write = None
        self._spool_error: TraceError | None = None
        # a stream's reads and their copies into the spool, one at a time: a first pass's
        # reader thread still waiting on the stream cannot interleave with `_finish_spool`
        self._stream_lock = threading.Lock()
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
                raise unreadable(self.spec, exc) from None
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
                raise unreadable(path, exc) from None
            self.name = str(path)
            self.path = path
            self.compression = detect_compression(head)
            self.fingerprint = Fingerprint.of(path)

    @property
    def is_stdin(self) -> bool:
        return self._stdin is not None

    @property
    def progress_total(self) -> int | None:
        """What a read's progress counts to (see ReadStats.position): the file's size, the
        stream's once it is spooled, None for the first read of a stream."""
        if self._spool is not None and self.first_stats is not None:
            return self.first_stats.raw_bytes  # (a plain stream's: its decompressed bytes)
        if self.is_stdin:
            return None
        return self.fingerprint.size

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
            if self.first_stats is not None:  # a read_once stream: nothing was kept
                raise TraceError("internal error: a stream read once is read again")
            return self._read_stdin_first(stats)
        if self._spool is not None and (self._spool_write is not None or self._spool_error):
            self._finish_spool()
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
            raise unreadable(self.name, exc) from None
        return SkippingBlocks(fh, stats, self.name)

    def _open_for_reading(self):
        """A new reader from the start: of the spool (its own offset, the stream's bytes as
        they came), else of the file."""
        if self._spool is not None:
            return _UnpackedSpool(self._spool) if self._spool_packed else _SpoolReader(
                self._spool)
        return open(self.path, "rb")

    def _read_stdin_first(self, stats: ReadStats) -> Iterator[bytes]:
        stdin = self._stdin
        folder = self.spool_dir or tempfile.gettempdir()
        if not self.read_once:  # opened before the stream is read: an unusable folder is
            self._spool = anonymous_temp_file(folder, self._spool_remedy)
        first = self._head_block()
        self.compression = detect_compression(first)
        self.fingerprint = None
        if not self.read_once:
            self._spool_write = self._spooling(folder, self.compression == "none")

        def raw_blocks():
            with self._stream_lock:
                self._spooled(first or None)
            block = first
            while block:
                yield block
                with self._stream_lock:
                    block = stdin.read(RAW_BLOCK)
                    self._spooled(block or None)

        return self._decoded(raw_blocks(), stats, self.compression)

    @property
    def _spool_remedy(self) -> str:
        """What a refusal to spool tells the user to change."""
        return ("give --spool-dir a folder with room" if self.spool_dir
                else "set TMPDIR to a folder with room")

    def _head_block(self) -> bytes:
        """The stream's first block, at least the 4 bytes that tell its compression (a
        pipe opened unbuffered may hand over fewer at a time)."""
        try:
            head = self._stdin.read(RAW_BLOCK)
            while head and len(head) < 4:
                more = self._stdin.read(RAW_BLOCK)
                if not more:
                    break
                head += more
        except OSError as exc:
            raise unreadable(self.name, exc) from None
        return head

    def _spooled(self, block: bytes | None) -> None:
        """Copy a block of the stream into the spool (None: the stream ended, the spool is
        complete); a spool that cannot be written keeps its error for the next read."""
        write = self._spool_write
        if write is None:
            return
        try:
            write(block)
        except TraceError as exc:
            self._spool_error, self._spool_write = exc, None
            raise
        if block is None:
            self._spool_write = None

    def _finish_spool(self) -> None:
        """Before the spool is read: the error that stopped it, or the rest of the stream
        copied into it (a first pass that stopped early, e.g. at verify's first
        difference, left it behind)."""
        with self._stream_lock:
            if self._spool_error is not None:
                raise self._spool_error
            try:
                while self._spool_write is not None:
                    self._spooled(self._stdin.read(RAW_BLOCK) or None)
            except OSError as exc:
                raise unreadable(self.name, exc) from None

    def _spooling(self, folder: str, pack: bool):
        """The function that writes a block of the stream to the spool (in `folder`; zstd-
        compressed where `pack`; None: the stream ended)."""
        spool = self._spool
        self._spool_packed = pack
        packer = zstandard.ZstdCompressor(level=SPOOL_LEVEL).compressobj() if pack else None

        def write(block: bytes | None) -> None:
            if packer is not None:
                block = packer.compress(block) if block is not None else packer.flush()
            view = memoryview(block or b"")
            try:
                while view:
                    view = view[os.write(spool, view):]
            except OSError as exc:  # a full disk: the input's second pass needs the spool
                raise TraceError(f"cannot spool the input in {folder}: {exc.strerror or exc} "
                                 f"({self._spool_remedy})") from None

        return write

    def _read_file(self, stats: ReadStats) -> Iterator[bytes]:
        if self.first_stats is not None and not self.first_stats.checksummed:
            raise TraceError("internal error: a source read by skipping is read again")
        if self._spool is None:
            self._check_unchanged()
        try:
            fh = self._open_for_reading()
        except OSError as exc:
            raise unreadable(self.name, exc) from None
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
            raise unreadable(self.name, exc) from None

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
            self._hasher = Hasher(self._open_for_reading, self.first_stats, self.name)

    def adopt_sha256(self, digest: str, size: int, crc32: int) -> bool:
        """Take the sha256 a `FileComparison` of this plain file made (with the size and
        CRC-32 of the bytes it hashed) as `sha256`'s, where no hash was started (whether it
        was taken): those bytes must be the first read's, as `start_hashing`'s thread
        checks its own; TraceError where they are not."""
        if self._hasher is not None or self.first_stats is None or self.plain_path is None:
            return False
        if (size, crc32) != (self.first_stats.raw_bytes, self.first_stats.crc32):
            raise bytes_changed(self.name)
        self._hasher = Hashed(digest)
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
            raise bytes_changed(self.name)
        self._check_unchanged()


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
        decoder = GzipDecoder(source.name)
    elif compression == "zstd":
        decoder = ZstdDecoder(source.name)
    else:
        decoder = None
    stats.compressed = decoder is not None
    for block in raw:
        crc = isal_zlib.crc32(block, crc)  # ISA-L: ~7x zlib's speed, same value
        raw_total += len(block)
        stats.raw_read = raw_total
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


def anonymous_temp_file(folder: str, remedy: str) -> int:
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
            f"cannot spool the input in {folder}: {exc.strerror or exc} ({remedy})"
        ) from None
    os.unlink(name)
    return fd


class _UnpackedSpool:
    """The spool of a plain stream read back from its start: its zstd frame decompressed, so
    a pass reads (and checksums) the stream's bytes as they came."""

    def __init__(self, fd: int):
        self._packed = _SpoolReader(fd)
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            self._packed, read_size=RAW_BLOCK, closefd=False)

    def read(self, size: int) -> bytes:
        return self._reader.read(size)

    def readinto(self, buffer) -> int:
        return self._reader.readinto(buffer)

    def __enter__(self) -> _UnpackedSpool:
        return self

    def __exit__(self, *exc) -> None:
        self._reader.close()
        self._packed.__exit__()


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


def read_span(path: str, offset: int, length: int) -> bytes:
    """`length` bytes of a plain file at `offset` (fewer at its end): what a worker reads of
    its chunk itself, and a speculative cut of the bytes near it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)

