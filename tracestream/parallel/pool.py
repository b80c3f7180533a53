"""Worker processes for the per-chunk work of both passes (or none, for small inputs).

msgspec and the per-event Python work hold the GIL, so parallelism needs
processes. The pool forks all its workers when it is created, before the
reader and writer threads exist, and is reused by both passes. `InlinePool` has
the same interface and runs everything in the calling process.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import multiprocessing
import os
import signal
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tracestream.errors import TraceError
from tracestream.read.document import CHUNK_BYTES
from tracestream.read.source import detect_compression, is_stream_path
from tracestream.write.sink import WRITER_HOLDS

SLOTS_PER_WORKER = 2  # each pass keeps this many chunks per worker in flight, each in a slot
SLOT_BYTES = 2 * CHUNK_BYTES
"""A rewritten chunk grows by its relocated events' provenance: twice a chunk holds any
(a larger chunk goes through the pipe)."""
PARALLEL_MIN_BYTES = 48 << 20
"""Inputs smaller than this (decompressed) are processed in one process: forking costs more."""
_COMPRESSION_RATIO = 8  # a gzip/zstd trace file holds roughly this many times its size


class _Libc:
    """glibc's malloc_trim, when there is a glibc."""

    def __init__(self):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6")
            self.trim = libc.malloc_trim
            self.prctl = libc.prctl
            self.mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc: nothing to do
            self.trim = None
            self.prctl = None
            self.mallopt = None

    def keep_freed_memory(self) -> None:
        """Serve multi-MB buffers from the heap and keep freed memory for reuse.

        A worker handles one chunk after another with buffers of the same few
        sizes; glibc would map each one fresh (page faults on every touch) and
        unmap it when freed.
        """
        if self.mallopt is not None:
            self.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
            self.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD

    def die_with_parent(self) -> None:
        """Linux: SIGKILL this process when its parent dies (a killed run leaves no workers)."""
        if self.prctl is not None:
            self.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_LIBC = _Libc()


def release_memory() -> None:
    """Give freed heap memory back to the system.

    glibc raises its mmap threshold after large frees, so later multi-MB chunk
    buffers come from the heap, where freed memory stays resident. Trimming after
    each few chunks keeps a 1 GB run's peak near 180 MB instead of 260 MB, at a
    far lower cost than forcing every large buffer through mmap.
    """
    if _LIBC.trim is not None:
        _LIBC.trim(0)


def _ready() -> int:
    return os.getpid()


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _worker_start(parent: int, slots: ChunkSlots | None) -> None:
    global _SLOTS
    _SLOTS = slots  # the pool's shared memory, mapped before this process was forked
    # chunk work makes many short-lived acyclic objects: the cycle collector only costs
    gc.disable()
    # Ctrl-C and SIGTERM reach the whole process group: the parent stops the pool; a
    # worker that died of them would break it (a traceback, or a hung shutdown)
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    _LIBC.die_with_parent()
    _LIBC.keep_freed_memory()
    if os.getppid() != parent:  # the parent died before that took effect
        os._exit(1)


@contextlib.contextmanager
def collector_paused():
    """Pause the cycle collector for a pass (its objects are not cyclic); restore after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ChunkSlots:
    """Shared memory for the chunks passed between the parent and its workers, by slot.

    Mapped before the workers are forked, so they share it. The parent puts a
    chunk of decompressed input in a slot for the index pass; a worker puts its
    rewritten chunk in the slot it was given. Only slot numbers and lengths go
    through the pipes, instead of megabytes pickled on one side and unpickled on
    the other.
    """

    def __init__(self, count: int, size: int):
        self.size = size
        self.memory = mmap.mmap(-1, count * size)  # anonymous and shared with children
        self._free = list(range(count))

    @property
    def free(self) -> int:
        """How many slots no chunk holds."""
        return len(self._free)

    def acquire(self) -> int | None:
        """A free slot, or None when all are taken (the chunk then goes as bytes)."""
        return self._free.pop() if self._free else None

    def put(self, slot: int, data: bytes) -> bool:
        """Copy `data` into `slot` (for the other side); False if it does not fit."""
        return self.put_pieces(slot, (data,))

    def put_pieces(self, slot: int, pieces) -> bool:
        """Copy the bytes-like `pieces` one after the other into `slot`; False if they do
        not fit."""
        if sum(map(len, pieces)) > self.size:
            return False
        at = slot * self.size
        for piece in pieces:
            self.memory[at : at + len(piece)] = piece
            at += len(piece)
        return True

    def read(self, slot: int, length: int) -> bytes:
        """The `length` bytes in `slot` (copied out)."""
        start = slot * self.size
        return self.memory[start : start + length]

    def view(self, slot: int, length: int) -> memoryview:
        """The `length` bytes in `slot`, not copied (valid until the slot is released)."""
        start = slot * self.size
        return memoryview(self.memory)[start : start + length]

    def release(self, slot: int | None) -> None:
        if slot is not None:
            self._free.append(slot)

    def close(self) -> None:
        try:
            self.memory.close()
        except BufferError:  # a failed write's traceback still holds a view: unmapped with it
            pass


_SLOTS: ChunkSlots | None = None  # the slots of the pool that forked this worker


def received(slot: int, length: int) -> bytes:
    """In a worker: the chunk the parent `put` in `slot` (copied out)."""
    return _SLOTS.read(slot, length)


def received_view(slot: int, length: int) -> memoryview:
    """In a worker: the `length` bytes the parent `put` in `slot`, not copied (the parent
    leaves the slot alone until the task's result is back)."""
    return _SLOTS.view(slot, length)


def slot_buffer(slot: int | None) -> memoryview | None:
    """In a worker: all of shared slot `slot` to write a result into (None without one)."""
    if slot is None or _SLOTS is None:
        return None
    return _SLOTS.view(slot, _SLOTS.size)


def deliver(data: bytes, slot: int | None) -> bytes | int:
    """In a worker: `data` put in its slot (its length returned), or `data` itself if it
    has no slot or does not fit."""
    if slot is not None and _SLOTS is not None and _SLOTS.put(slot, data):
        return len(data)
    return data


def write_result(out, result: bytes | int, slot: int | None, slots: ChunkSlots | None) -> None:
    """In the parent: write what `deliver` handed back to `out` (an OutputFile).

    A result in a slot is written from the shared memory itself; the writer frees
    the slot once the bytes are out, so no copy is made of a GB of rewritten chunks.
    """
    if isinstance(result, int):
        out.write_then(slots.view(slot, result), lambda: slots.release(slot))
        return
    if slots is not None:
        slots.release(slot)
    out.write(result)


class WorkerPool:
    """A fixed set of forked worker processes with an executor's submit()."""

    def __init__(self, workers: int, *, slots: int = 0, slot_bytes: int = 0):
        self.workers = workers
        self.slots = ChunkSlots(slots, slot_bytes) if slots else None
        context = multiprocessing.get_context("fork")
        gc.freeze()  # the workers share these pages; do not let collections copy them
        self._executor = ProcessPoolExecutor(max_workers=workers, mp_context=context,
                                             initializer=_worker_start,
                                             initargs=(os.getpid(), self.slots))
        # the first submit forks every worker (fork context), while we are single-threaded;
        # workers start with Ctrl-C/SIGTERM held until they ignore them (the parent gets
        # any that arrive meanwhile when they are released here)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        try:
            self._executor.submit(_ready).result()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)

    def submit(self, fn, *args) -> Future:
        try:
            return self._executor.submit(fn, *args)
        except BrokenProcessPool:
            raise TraceError(WORKER_DIED) from None

    def close(self) -> None:
        executor = self._executor
        workers = list((executor._processes or {}).values())
        stopped = threading.Event()

        def kill_if_broken() -> None:
            # a worker died: the executor stops the others with SIGTERM, which they ignore
            # (_worker_start), and would wait for them forever (spinning a core)
            while not executor._broken and not stopped.wait(0.05):
                pass
            if executor._broken:
                for process in workers:
                    process.kill()

        watchdog = threading.Thread(target=kill_if_broken, name="pool watchdog", daemon=True)
        watchdog.start()
        try:
            executor.shutdown(wait=True, cancel_futures=True)
        finally:
            stopped.set()
            watchdog.join()
        if self.slots is not None:
            self.slots.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


WORKER_DIED = "a worker process died (killed, or out of memory?)"


def outcome(task):
    """`task.result()`; a pool that a dead worker broke is the same TraceError as at submit."""
    try:
        return task.result()
    except BrokenProcessPool:
        raise TraceError(WORKER_DIED) from None


class _Done:
    """A computed result with the Future methods the passes use."""

    def __init__(self, fn, args):
        try:
            self._value, self._error = fn(*args), None
        except Exception as exc:  # handed back from result(), like a Future
            self._value, self._error = None, exc

    def result(self):
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self) -> bool:
        return False


class InlinePool:
    """Runs submitted work immediately in this process."""

    workers = 0
    slots = None

    def submit(self, fn, *args) -> _Done:
        return _Done(fn, args)

    def close(self) -> None:
        pass

    def __enter__(self) -> InlinePool:
        return self

    def __exit__(self, *exc) -> None:
        pass


def default_workers() -> int:
    """One worker per CPU the process may use (the main process mostly waits on I/O)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _expected_size(path: str | None) -> int | None:
    """Roughly how many bytes the trace holds once decompressed (None: unknown, stdin)."""
    if path in (None, "-") or is_stream_path(path):  # a pipe: opening it would consume it
        return None
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return None
    compressed = detect_compression(head) != "none"
    return size * _COMPRESSION_RATIO if compressed else size


def pool_for(path: str | None, workers: int | None):
    """A worker pool when it pays off: `workers` processes for a large file, else inline.

    `workers=0` forces one process; None picks by the input size (stdin: parallel).
    """
    if workers is None:
        size = _expected_size(path)
        workers = default_workers() if (size is None or size >= PARALLEL_MIN_BYTES) else 0
    if workers <= 0:
        return InlinePool()
    return WorkerPool(workers, slots=SLOTS_PER_WORKER * workers + 1 + WRITER_HOLDS,
                      slot_bytes=SLOT_BYTES)
