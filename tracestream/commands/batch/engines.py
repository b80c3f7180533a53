"""The engines that run tasks: a local process pool, or a Dask cluster (dask.distributed)."""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator

from tracestream.commands.batch.execute import failed_result, one_line, run_task
from tracestream.errors import TraceError
from tracestream.parallel.memory import LIBC

ENGINES = ("local", "dask")
DASK_INSTALL_HINT = (
    "--engine dask needs dask.distributed, which is not installed; "
    "install it with: pip install 'tracestream[dask]'"
)
TASK_DIED = "the worker process died while processing this trace (killed, or out of memory?)"


_WORKER_WAIT_SECONDS = 60


TaskFn = Callable[[dict], dict]


class _Terminated(SystemExit):
    """SIGTERM in a pool worker: unwind the task (the library discards its temp files), exit."""


def _on_sigterm(signum, frame):
    raise _Terminated(128 + signum)


def _init_worker(parent: int) -> None:
    """Pool worker set-up: SIGTERM unwinds; on Linux, SIGTERM when the driver dies."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    LIBC.die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:  # the driver died before prctl
        os._exit(128 + signal.SIGTERM)


def _call(fn: TaskFn, task: dict) -> dict:
    try:
        return fn(task)
    except _Terminated as exc:  # the pool's own handler would keep the process alive
        os._exit(exc.code)


def _executor(workers: int):
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                               initargs=(os.getpid(),))


def run_local(tasks: Iterable[dict], jobs: int, *, task_fn: TaskFn | None = None) -> Iterator[dict]:
    """Results as tasks complete, `jobs` at a time, each task in a worker process of its own.

    A one-worker ProcessPoolExecutor per task: when a worker dies (killed, out of
    memory) only its own pool breaks, so that trace gets a `failed` result and no
    other task is disturbed or loses its result. A fresh process per trace also
    gives every multi-GB trace a clean heap.
    """
    from concurrent.futures import FIRST_COMPLETED, wait
    from concurrent.futures.process import BrokenProcessPool

    fn = task_fn or run_task
    jobs = max(1, int(jobs))
    queue = deque(tasks)
    inflight: dict = {}  # future -> (task, executor)
    try:
        while queue or inflight:
            while queue and len(inflight) < jobs:
                task = queue.popleft()
                executor = _executor(1)
                try:
                    inflight[executor.submit(_call, fn, task)] = (task, executor)
                except Exception as exc:  # no process could be started
                    executor.shutdown(wait=False, cancel_futures=True)
                    yield failed_result(task, exc)
            if not inflight:
                continue
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            for future in done:
                task, executor = inflight.pop(future)
                try:
                    result = future.result()
                except BrokenProcessPool:
                    result = failed_result(task, TASK_DIED)
                except Exception as exc:  # e.g. a task or result that cannot be pickled
                    result = failed_result(task, exc)
                executor.shutdown(wait=True)
                if not isinstance(result, dict):
                    result = failed_result(task, f"the task returned {type(result).__name__}")
                yield result
    finally:  # only left with tasks in flight on an interrupt or an error of the caller
        for _task, executor in inflight.values():
            _terminate(executor)
            executor.shutdown(wait=False, cancel_futures=True)


def _terminate(executor) -> None:
    """SIGTERM the executor's workers: their tasks unwind (temporary files go) and exit."""
    terminate = getattr(executor, "terminate_workers", None)  # Python 3.14+
    if terminate is not None:
        with contextlib.suppress(Exception):
            terminate()
        return
    for process in list((getattr(executor, "_processes", None) or {}).values()):
        with contextlib.suppress(Exception):
            process.terminate()


def require_distributed():
    """The `distributed` module, or a TraceError saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise TraceError(DASK_INSTALL_HINT) from None
    return distributed


_METADATA = "tracestream-batch"


def _dask_call(fn: TaskFn, task: dict, path: list) -> dict:
    """A task on a Dask worker, its result kept on the scheduler before it is returned.

    A worker holds a finished task's result until the driver gathers it; if the
    worker dies in between, Dask runs the task again, which would find its own
    output and fail. The re-run returns the kept result instead.
    """
    client = None
    with contextlib.suppress(Exception):
        from distributed import get_client

        client = get_client()
        kept = client.get_metadata(path, None)
        if isinstance(kept, dict):
            return kept
        if kept is not None:  # an earlier attempt started: it may have written the output
            task = {**task, "attempt": 2}
        client.set_metadata(path, "started")
    result = fn(task)
    if client is not None:
        with contextlib.suppress(Exception):
            client.set_metadata(path, result)
    return result


def run_dask(tasks: Iterable[dict], jobs: int, scheduler: str | None = None, *,
             task_fn: TaskFn | None = None) -> Iterator[dict]:
    """Results as tasks complete, from Dask workers.

    With `scheduler` (e.g. tcp://10.0.0.5:8786) every task goes to that cluster at
    once (its scheduler places them, an adaptive cluster can scale), whose workers
    need tracestream installed and the traces' paths on shared storage. Without it
    a LocalCluster of `jobs` single-threaded worker processes runs for this call
    only, fed at most `jobs` tasks at a time. A task whose worker dies becomes
    `failed` (on a cluster, after the retries its scheduler's `allowed-failures`
    grants, default 3; a retry takes over the output an earlier attempt completed).
    """
    distributed = require_distributed()
    import logging

    import dask

    fn = task_fn or run_task
    queue = deque(enumerate(tasks))
    with contextlib.ExitStack() as stack:
        if scheduler:
            try:
                client = stack.enter_context(distributed.Client(scheduler, timeout="30s"))
            except (OSError, TimeoutError) as exc:
                raise TraceError(
                    f"cannot connect to the Dask scheduler at {scheduler}: {one_line(exc)}"
                ) from None
            try:
                client.wait_for_workers(1, timeout=_WORKER_WAIT_SECONDS)
            except (OSError, TimeoutError):
                raise TraceError(
                    f"no Dask worker joined the scheduler at {scheduler} within "
                    f"{_WORKER_WAIT_SECONDS} s") from None
            limit = None
        else:
            limit = max(1, int(jobs))
            with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
                cluster = stack.enter_context(distributed.LocalCluster(
                    n_workers=limit, threads_per_worker=1, processes=True,
                    dashboard_address=None, silence_logs=logging.CRITICAL,
                ))
                client = stack.enter_context(distributed.Client(cluster))
        token = os.urandom(4).hex()
        futures: dict = {}
        running = distributed.as_completed()

        def submit_next() -> None:
            i, task = queue.popleft()
            key = f"tracestream-{task['kind']}-{token}-{i}-{os.path.basename(task['trace'])}"
            future = client.submit(_dask_call, fn, task, [_METADATA, token, key], key=key,
                                   pure=False, retries=0)
            futures[future] = task
            running.add(future)

        try:
            while queue and (limit is None or len(futures) < limit):
                submit_next()
            for future in running:
                task = futures.pop(future)
                try:
                    result = future.result()
                except Exception as exc:  # KilledWorker, a lost connection, …
                    if type(exc).__name__ == "KilledWorker":
                        result = failed_result(task, f"{TASK_DIED} (dask KilledWorker)")
                    else:
                        result = failed_result(task, f"dask: {one_line(exc)}")
                future.release()
                if not isinstance(result, dict):
                    result = failed_result(task, f"the task returned {type(result).__name__}")
                if queue:
                    submit_next()
                yield result
        finally:
            with contextlib.suppress(Exception):
                if futures:
                    client.cancel(list(futures))
                client.set_metadata([_METADATA, token], None)
