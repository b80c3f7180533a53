"""Writing outputs: never over an existing file, never a partial file left behind.

An output is written to an anonymous file in the target's directory (Linux
O_TMPFILE; a named hidden temporary file elsewhere), compressed in a background
thread, flushed and fsync'd, and only then linked into place with a call that
fails if the target exists, so two writers cannot both win and a crash leaves
nothing behind. stdout is streamed directly (it cannot be made atomic).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import queue
import signal
import stat
import sys
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

import zstandard
from isal import isal_zlib

from tracestream.errors import TraceError
from tracestream.parallel.slots import WRITER_HOLDS

GZIP_LEVEL = 1
"""Default gzip level, ISA-L's level 1: JSON deflates as well as with zlib's level 1 (~12x on
Kineto traces) at ~4x its speed. An explicit level is zlib's (1-9, as gzip's own)."""
ZSTD_LEVEL = 3
SMALL_ZSTD_LOGS = {"window_log": 18, "hash_log": 15, "chain_log": 14}
"""The most zstd's window and match tables take in an output among many (each piece of a
split keeps its compressor through the pass): at level 3 a compressor then holds ~0.7 MiB
instead of ~3 MiB, with the same ratio on Kineto JSON (20.2x on 8 MB of a piece, 20.0x
with level 3's own 2 MB window and tables); 33 pieces of a 10 GB trace save ~75 MiB."""
_BLOCK = 4 << 20
SMALL_BLOCK = 64 << 10
"""The block of an output among many written at once (see OutputFile)."""
_QUEUE_DEPTH = WRITER_HOLDS - 1
"""Blocks queued for the writer thread; with the one it writes, WRITER_HOLDS (the slots a
worker pool keeps for them)."""
_SYNC_EVERY = 32 << 20
"""The writer thread starts the disk write of every 32 MB written (Linux: sync_file_range).

The commit must fsync anyway; a GB of dirty pages left for then costs more, as the kernel
throttles writers that pile them up: writing and syncing 1 GB here took 1.4-1.6 s longer
(writes) plus 0.5 s (the final fsync) than with the writes started as they go."""


def _writeback_starter():
    """glibc's sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE), or a no-op."""
    try:
        import ctypes

        call = ctypes.CDLL("libc.so.6").sync_file_range
    except (OSError, AttributeError):  # not Linux/glibc: the final fsync does it all
        return lambda fd, offset, length: None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return lambda fd, offset, length: call(fd, offset, length, 2)  # does not wait


_start_writeback = _writeback_starter()


def check_new_path(path: str, what: str) -> Path:
    """Refuse an existing file or a missing directory before any work is done."""
    target = Path(path)
    try:
        exists = target.exists() or target.is_symlink()
    except OSError as exc:  # a name too long for the file system, a loop of links
        raise TraceError(f"{what} {str(target)[:120]}: {exc.strerror or exc}") from None
    if exists:
        raise TraceError(f"{what} {target} already exists; tracestream never overwrites a file")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise TraceError(f"{what} directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise TraceError(f"{what} directory {parent} is not writable")
    return target


def input_identity(trace: str, stdin=None) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the input trace's file: the path's, or stdin's when `trace` is
    "-" and stdin is a file (`< trace.json`); None for a pipe or what cannot be stat'ed."""
    try:
        if trace == "-":
            stream = stdin if stdin is not None else sys.stdin
            st = os.fstat(stream.fileno())
        else:
            st = os.stat(trace)
    except (OSError, ValueError, AttributeError):  # no descriptor (an in-memory stream)
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return st.st_dev, st.st_ino


def refuse_writing_input(identity: tuple[int, int] | None, path: str, what: str,
                         trace: str) -> None:
    """Refuse a destination that is the input file, before anything is read or written.

    "-" is checked through stdout's descriptor (`1<> trace.json`, `>> trace.json`), a path
    through its inode (a hard link, a symlink, any other path to the same file).
    """
    if identity is None:
        return
    try:
        st = os.fstat(sys.stdout.fileno()) if path == "-" else os.stat(path)
    except (OSError, ValueError, AttributeError):  # nothing there yet, or no real stdout
        return
    if (st.st_dev, st.st_ino) == identity:
        where = "stdout" if path == "-" else path
        name = "stdin" if trace == "-" else trace
        raise TraceError(
            f"{what} ({where}) is the input trace {name} itself (device {st.st_dev} inode "
            f"{st.st_ino}); writing it would destroy the source: nothing was read or written"
        )


def check_compress_level(compression: str, level: int | None) -> None:
    """gzip takes zlib's levels 1-9, zstd 1-22; refused before any work is done."""
    if level is None or compression not in COMPRESS_LEVELS:  # none: nothing to compress
        return
    low, high = COMPRESS_LEVELS[compression]
    if not low <= level <= high:
        raise TraceError(
            f"--compress-level {level} is out of range for {compression} ({low}-{high})")


COMPRESS_LEVELS = {"gzip": (1, 9), "zstd": (1, 22)}


class _Encoder:
    """Compression of a byte stream (identity, gzip or zstd)."""

    def __init__(self, compression: str, level: int | None, *, small: bool = False):
        """`small`: one of many outputs written at once (a smaller zstd window)."""
        self.compression = compression
        if compression == "gzip":
            self._obj = (isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 31) if level is None
                         else zlib.compressobj(level, zlib.DEFLATED, 31))
        elif compression == "zstd":
            level = ZSTD_LEVEL if level is None else level
            if small:
                own = zstandard.ZstdCompressionParameters.from_level(level)
                ctx = zstandard.ZstdCompressor(
                    compression_params=zstandard.ZstdCompressionParameters.from_level(
                        level, **{name: min(getattr(own, name), most)
                                  for name, most in SMALL_ZSTD_LOGS.items()}))
            else:
                ctx = zstandard.ZstdCompressor(level=level)
            self._obj = ctx.compressobj()
        elif compression == "none":
            self._obj = None
        else:
            raise TraceError(f"unknown compression {compression!r} (none, gzip, zstd)")

    def encode(self, data: bytes) -> bytes:
        return data if self._obj is None else self._obj.compress(data)

    def finish(self) -> bytes:
        return b"" if self._obj is None else self._obj.flush()


_STOP = object()


class OutputFile:
    """A new file being written; `commit()` makes it appear, `discard()` removes every trace.

    Used as a context manager: leaving it without `commit()` discards it.
    """

    def __init__(self, path: str, *, compression: str = "none", level: int | None = None,
                 what: str = "output", block: int = _BLOCK):
        """`block`: the bytes joined before the writer thread gets them, which holds two
        such blocks at most (a run that writes many files at once, the pieces of
        --split-mb, gives each a small one: their buffers add up; a small block also
        means a small zstd window and tables, SMALL_ZSTD_LOGS)."""
        self.what = what
        self._block = block
        self.stdout = path == "-"
        self.path = None if self.stdout else check_new_path(path, what)
        self._encoder = _Encoder(compression, level, small=block < _BLOCK)
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._error: BaseException | None = None
        self._fd = -1
        self._temp_name: str | None = None
        self.bytes_written = 0
        self._synced = 0  # bytes_written at the last sync
        self._abandoned = threading.Event()  # discarded: the writer thread writes no more
        if self.stdout:
            self._fd = sys.stdout.buffer.fileno()
            self._writer_fd = self._fd
            sys.stdout.flush()
        else:
            self._open_temp()
            # the writer thread's own descriptor, closed by that thread: a write it makes
            # after a discard can never land in a file that reused the number of ours
            self._writer_fd = os.dup(self._fd)
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_DEPTH if block >= _BLOCK else 1)
        self._thread = threading.Thread(target=self._drain, name=f"write {path}", daemon=True)
        self._thread.start()

    def _open_temp(self) -> None:
        folder = str(self.path.parent) or "."
        flags = getattr(os, "O_TMPFILE", 0)
        if flags:
            try:
                self._fd = os.open(folder, flags | os.O_WRONLY, 0o644)
                return
            except OSError:
                self._fd = -1
        import tempfile

        try:
            fd, name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        except OSError as exc:  # /proc, /sys: a directory that holds no new files
            raise TraceError(
                f"cannot create {self.what} {self.path}: {exc.strerror or exc} "
                f"(the directory {folder} takes no new files); nothing was written"
            ) from None
        self._fd, self._temp_name = fd, name

    # -- writing ----------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not data:
            return
        if len(data) >= self._block >> 2:  # big enough on its own: no copy into a joined block
            self._flush_pending()
            self._put(data)
            return
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= self._block:
            self._flush_pending()

    def write_then(self, data: memoryview, done) -> None:
        """Write `data` (not copied), then call `done()` from the writer thread.

        For bytes the caller must keep as they are until written (a worker's
        result in shared memory); `done` frees them, also when writing fails.
        """
        try:
            self._flush_pending()
            self._put((data, done))
        except BaseException:  # refused before the writer took it: free it here
            done()
            raise

    def _flush_pending(self) -> None:
        if self._error is not None:
            self._raise()
        if self._pending:
            block = b"".join(self._pending)
            self._pending = []
            self._pending_size = 0
            self._put(block)

    def _put(self, item) -> None:
        while True:
            if self._error is not None:
                self._raise()
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _drain(self) -> None:
        try:
            self._write_items()
        finally:
            if not self.stdout:
                os.close(self._writer_fd)

    def _write_items(self) -> None:
        item = None
        try:
            while True:
                item = self._queue.get()
                if self._abandoned.is_set():
                    raise TraceError(f"{self.what} discarded")
                if item is _STOP:
                    self._write_all(self._encoder.finish())
                    return
                data, done = item if isinstance(item, tuple) else (item, None)
                self._write_all(self._encoder.encode(data))
                if done is not None:
                    done()
                item = data = None
        except BaseException as exc:  # reported to the writer at its next call
            # without its frames, which hold the block being written (maybe lent memory)
            self._error = exc.with_traceback(None)
            data = None
            # keep the producer from blocking on a full queue and free what it lent, up to
            # its last item (already taken when the failure came while finishing: a full
            # disk met at the last write would otherwise leave this thread waiting)
            while item is not _STOP:
                if isinstance(item, tuple):
                    item[1]()
                item = self._queue.get()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._writer_fd, view)
            view = view[written:]
            self.bytes_written += written
        if self.bytes_written - self._synced >= _SYNC_EVERY and not self.stdout:
            _start_writeback(self._writer_fd, self._synced, self.bytes_written - self._synced)
            self._synced = self.bytes_written

    def _raise(self):
        exc = self._error
        if isinstance(exc, BrokenPipeError) or (
            isinstance(exc, OSError) and exc.errno == errno.EPIPE
        ):
            raise TraceError(f"{self.what}: the reader closed the pipe before the end") from None
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                reason = "no space left on the device"
            elif exc.errno == errno.EFBIG:
                reason = "file size limit exceeded"
            raise TraceError(
                f"cannot write {self.what}: {reason}; nothing was left behind"
            ) from None
        raise exc

    @property
    def failed(self) -> bool:
        """Writing failed (a full disk, a closed pipe): the output's fault, not the input's."""
        return self._error is not None

    def close_stream(self) -> None:
        """Finish compression and wait for the writer thread."""
        self._flush_pending()
        self._put(_STOP)
        self._thread.join()
        if self._error is not None:
            self._raise()

    # -- finishing ----------------------------------------------------------

    def commit(self) -> None:
        """Make the file appear at its path, unless something else is there now."""
        self.close_stream()
        if self.stdout:
            return
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._error = exc
            self._raise()
        if self._temp_name is None:
            try:
                _link_anonymous(self._fd, self.path)
            except FileExistsError:
                raise TraceError(
                    f"{self.what} {self.path} appeared while writing (another process?); "
                    "left it untouched"
                ) from None
        else:
            try:
                os.link(self._temp_name, self.path)
            except FileExistsError:
                raise TraceError(
                    f"{self.what} {self.path} appeared while writing (another process?); "
                    "left it untouched"
                ) from None
            os.unlink(self._temp_name)
            self._temp_name = None
        os.close(self._fd)
        self._fd = -1
        _fsync_dir(self.path.parent)

    def discard(self) -> None:
        """Remove the temporary file; safe to call at any time, also twice."""
        self._abandoned.set()
        while self._thread.is_alive():  # it drains the queue without writing, then stops
            try:
                self._queue.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                continue
        if self.stdout:
            return
        if self._temp_name is not None:
            try:
                os.unlink(self._temp_name)
            except FileNotFoundError:
                pass
            self._temp_name = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(self, *exc) -> None:
        if self._fd >= 0 or self._temp_name is not None:
            self.discard()


def _link_anonymous(fd: int, path: Path) -> None:
    """Give an O_TMPFILE file a name; fails with FileExistsError if the name is taken.

    A directory fd makes CPython use linkat(AT_SYMLINK_FOLLOW), which follows
    /proc/self/fd/N to the open file instead of linking the symlink itself.
    """
    folder = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
    try:
        os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=folder, follow_symlinks=True)
    finally:
        os.close(folder)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_committed(path: Path) -> None:
    """Undo a commit of ours (used when a later file of the same job cannot be written)."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass


_ENDS_AFTER_COMMIT = contextvars.ContextVar("tracestream_ends_after_commit", default=False)


@contextlib.contextmanager
def process_ends_after_commit():
    """For a program that is the whole process and ends once its outputs are committed (the
    CLI): inside this block a commit leaves Ctrl-C/SIGTERM ignored, so a late signal neither
    kills it (exit 143 with complete outputs) nor makes it say that nothing was written; the
    process exits 0 right after. Outside it (a notebook, any library caller) the caller's
    handlers come back after a commit and a late signal is delivered to them."""
    token = _ENDS_AFTER_COMMIT.set(True)
    try:
        yield
    finally:
        _ENDS_AFTER_COMMIT.reset(token)


class _HeldSignals:
    """SIGINT/SIGTERM that arrived while files were being linked into place."""

    def __init__(self):
        self.received: list[int] = []
        self.committed = False  # set once the files stay: later signals do not undo them


@contextlib.contextmanager
def _signals_held():
    """Hold SIGINT/SIGTERM while files are linked into place; report what arrived.

    The caller decides from `received` whether the commit stands and says so in
    `committed`; the handlers that come back follow that decision, not a second
    look at `received` (a signal between the two would otherwise undo a commit the
    caller had kept).
    """
    held = _HeldSignals()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    wanted = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in wanted}

    def hold(signum, frame):
        held.received.append(signum)

    for signum in wanted:
        signal.signal(signum, hold)
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            if held.committed and _ENDS_AFTER_COMMIT.get():
                handler = signal.SIG_IGN
            signal.signal(signum, handler)


def commit_together(files: Sequence[OutputFile]) -> None:
    """Commit several files as one: all appear, or none (also when interrupted meanwhile).

    An interrupt that arrives during the commits is held until they finish, then
    the committed files are removed again and the interrupt is delivered. One that
    arrives after that decision leaves the files in place; the CLI ignores it, a
    library caller gets it delivered.
    """
    done: list[OutputFile] = []
    with _signals_held() as held:
        try:
            for f in files:
                f.commit()
                done.append(f)
        except BaseException:
            for f in done:
                if f.path is not None:
                    remove_committed(f.path)
            raise
        interrupted = list(held.received)
        if interrupted:
            for f in done:
                if f.path is not None:
                    remove_committed(f.path)
        else:
            held.committed = True
    late = held.received[len(interrupted):]
    if interrupted or (late and not _ENDS_AFTER_COMMIT.get()):
        _deliver((interrupted or late)[0])


def _deliver(signum: int) -> None:
    """Act on a held signal now, through its handler (restored by now).

    The handler is called directly: a re-sent signal's Python handler runs only at
    the interpreter's next check, which a `raise` right after it can beat (a SIGTERM
    then exited as an interrupt, 130 instead of 143).
    """
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    os.kill(os.getpid(), signum)  # the default action (or none, when ignored)
    raise KeyboardInterrupt  # if the handler returned without raising
