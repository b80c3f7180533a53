"""Worker processes for the per-chunk work of both passes (or none, for small inputs).

msgspec and the per-event Python work hold the GIL, so parallelism needs
processes. The pool forks all its workers when it is created, before the
reader and writer threads exist, and is reused by both passes. `InlinePool` has
the same interface and runs everything in the calling process.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tracestream.errors import TraceError
from tracestream.parallel.memory import LIBC, release_memory
from tracestream.parallel.slots import ChunkSlots, attach

SLOTS_PER_WORKER = 2  # each pass keeps this many chunks per worker in flight, each in a slot


def _ready() -> int:
    return os.getpid()


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _worker_start(parent: int, slots: ChunkSlots | None) -> None:
    attach(slots)
    # chunk work makes many short-lived acyclic objects: the cycle collector only costs
    gc.disable()
    # Ctrl-C and SIGTERM reach the whole process group: the parent stops the pool; a
    # worker that died of them would break it (a traceback, or a hung shutdown)
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    LIBC.die_with_parent()
    LIBC.keep_freed_memory()
    if os.getppid() != parent:  # the parent died before that took effect
        os._exit(1)


class WorkerPool:
    """A fixed set of forked worker processes with an executor's submit()."""

    def __init__(self, workers: int, *, slots: int = 0, slot_bytes: int = 0):
        self.workers = workers
        self.slots = ChunkSlots(slots, slot_bytes) if slots else None
        context = multiprocessing.get_context("fork")
        # what the heap holds when the workers fork stays in each of them: freed memory is
        # given back first (verify of a split's manifest reads the pieces' reports before:
        # its workers started at 26 MiB PSS instead of 21 at 1 GB)
        release_memory()
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
