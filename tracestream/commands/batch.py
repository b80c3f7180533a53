"""`batch`: one independent task per trace, on a local process pool or a Dask cluster.

    from tracestream.commands.batch import compact_tasks, run_batch
    tasks = compact_tasks(["TP-0.trace.json.gz", "TP-1.trace.json.gz"], "out/",
                          CompactSpec(max_lanes=10))
    outcome = run_batch(tasks, engine="local", jobs=4)
    outcome.exit_code  # 0 when every trace succeeded

A task is a small dict of absolute paths and options; `run_task` runs it with the
library API (never a shell) where it lands, reading and writing the paths it is
given, and returns a small result dict: the driver never holds trace data. Every
task gets exactly one result, whatever the others do: a refusal, an exception, a
failed `--verify` or a worker process that dies all become a `failed` result.

Pure helpers (output naming, manifest parsing and merging) come first, then the
task function, the engines and the orchestrator.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tracestream.engine import compile_pattern, default_report_path, name_in_report
from tracestream.errors import SpecError, TraceError
from tracestream.plan.guides import ALL_PASSES, LayerSpec, id_from_text
from tracestream.plan.planner import CompactSpec
from tracestream.plan.report import load_report
from tracestream.read.compression import SUFFIX_OF, SUFFIXES, compression_for

KINDS = ("compact", "layers")
ENGINES = ("local", "dask")
DASK_INSTALL_HINT = (
    "--engine dask needs dask.distributed, which is not installed; "
    "install it with: pip install 'tracestream[dask]'"
)
WORKER_DIED = "the worker process died while processing this trace (killed, or out of memory?)"
_MAX_ERROR = 600
_WORKER_WAIT_SECONDS = 60


# -- output naming --------------------------------------------------------------


def split_trace_name(name: str) -> tuple[str, str, str | None]:
    """(stem, compression suffix, compression) of a file name, without its `.json`.

    `TP-0.trace.json.gz` -> (`TP-0.trace`, `.gz`, `gzip`); `a.json` -> (`a`, ``, None);
    a name without `.json` keeps everything but a compression suffix as its stem.
    """
    stem, suffix, compression = name, "", None
    lower = name.lower()
    for ext, kind in SUFFIXES.items():
        if lower.endswith(ext) and len(name) > len(ext):
            stem, suffix, compression = name[: -len(ext)], name[-len(ext):], kind
            break
    if stem.lower().endswith(".json") and len(stem) > len(".json"):
        stem = stem[: -len(".json")]
    return stem, suffix, compression


def output_name(trace: str, kind: str, compress: str | None = None) -> str:
    """The output file name: `TP-0.trace.json.gz` -> `TP-0.trace.compact.json.gz`.

    `.compact` or `.layers` goes before the `.json` suffix; the compression suffix is
    the input's, or the one of `compress` (none, gzip, zstd) when given.
    """
    if kind not in KINDS:
        raise TraceError(f"unknown batch kind {kind!r} (compact, layers)")
    stem, suffix, compression = split_trace_name(os.path.basename(trace))
    if compress is not None and compress != (compression or "none"):
        if compress not in SUFFIX_OF:
            raise TraceError(f"unknown compression {compress!r} (none, gzip, zstd)")
        suffix = SUFFIX_OF[compress]
    return f"{stem}.{kind}.json{suffix}"


def output_path(trace: str, output_dir: str, kind: str, compress: str | None = None) -> str:
    return os.path.join(os.path.abspath(output_dir), output_name(trace, kind, compress))


# -- manifest -------------------------------------------------------------------

_LAYER_FIELDS = {f.name: f for f in dataclasses.fields(LayerSpec)}
_REQUIRED = [name for name, f in _LAYER_FIELDS.items()
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
_STR_OPTIONS = {"anchor_regex", "phase", "evidence", "end_anchor_regex"}
_INT_OPTIONS = {"num_layers", "anchor_offset", "passes", "anchor_stride",
                "extra_anchors_per_pass", "first_layer", "max_gpu_lanes"}
_FLOAT_OPTIONS = {"gap_factor"}
_BOOL_OPTIONS = {"allow_gaps", "allow_several_anchor_names"}
_ID_OPTIONS = {"pid", "device"}
_NULLABLE = {"end_anchor_regex", "pid", "device", "max_gpu_lanes"}
LAYER_OPTIONS = tuple(_LAYER_FIELDS) + ("max_gpu_lanes",)
"""Per-trace options of `batch layers` (LayerSpec fields, plus the compact view's lanes)."""


def pid_value(value: Any) -> Any:
    """A pid/device as the command line takes it: an integer when it looks like one
    (`'"0"'`: the string "0"; see guides.id_from_text)."""
    return id_from_text(value)


@dataclass
class ManifestEntry:
    """One manifest line: the trace (absolute), its output if given, its own options."""

    line: int
    trace: str
    output: str | None
    options: dict


def _check_option(where: str, key: str, value: Any) -> Any:
    if value is None:
        if key in _NULLABLE:
            return None
        raise TraceError(f"{where}: {key} must not be null")
    if key in _STR_OPTIONS and not isinstance(value, str):
        raise TraceError(f"{where}: {key} must be a string, got {orjson.dumps(value).decode()}")
    if key == "passes" and value == ALL_PASSES:
        return value
    if key in _INT_OPTIONS and (isinstance(value, bool) or not isinstance(value, int)):
        also = " or \"all\"" if key == "passes" else ""
        raise TraceError(
            f"{where}: {key} must be an integer{also}, got {orjson.dumps(value).decode()}")
    if key in _FLOAT_OPTIONS and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TraceError(f"{where}: {key} must be a number, got {orjson.dumps(value).decode()}")
    if key in _BOOL_OPTIONS and not isinstance(value, bool):
        raise TraceError(f"{where}: {key} must be true or false, "
                         f"got {orjson.dumps(value).decode()}")
    if key in _ID_OPTIONS:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise TraceError(f"{where}: {key} must be an integer or a string, "
                             f"got {orjson.dumps(value).decode()}")
        return pid_value(value)
    return value


def parse_manifest(path: str) -> list[ManifestEntry]:
    """JSON lines: `trace`, optional `output`, and `layers` options with underscores.

    Relative `trace` paths are relative to the manifest's folder. Blank lines and
    lines starting with `#` are skipped. Errors name the manifest line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read manifest {path}: {exc}") from None
    folder = os.path.dirname(os.path.abspath(path))
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"manifest {path} line {number}"
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TraceError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(item, dict):
            raise TraceError(f"{where}: expected a JSON object with \"trace\"")
        trace = item.pop("trace", None)
        if not isinstance(trace, str) or not trace:
            raise TraceError(f"{where}: \"trace\" (a path) is missing")
        output = item.pop("output", None)
        if output is not None and (not isinstance(output, str) or not output):
            raise TraceError(f"{where}: \"output\" must be a path")
        unknown = sorted(set(item) - set(LAYER_OPTIONS))
        if unknown:
            raise TraceError(
                f"{where}: unknown option(s) {', '.join(unknown)} "
                f"(known: trace, output, {', '.join(LAYER_OPTIONS)})")
        options = {key: _check_option(where, key, value) for key, value in item.items()}
        entries.append(ManifestEntry(number, os.path.join(folder, trace), output, options))
    if not entries:
        raise TraceError(f"manifest {path} lists no traces")
    return entries


def merge_layer_options(defaults: dict, line: dict,
                        where: str) -> tuple[LayerSpec, CompactSpec | None]:
    """Command-line defaults overlaid by the manifest line: the line wins.

    Missing required options and invalid values are TraceErrors naming `where`.
    """
    merged = {k: v for k, v in defaults.items() if v is not None}
    merged.update(line)
    missing = [name for name in _REQUIRED if merged.get(name) is None]
    if missing:
        raise TraceError(
            f"{where}: missing {', '.join(missing)} (give it on the line or as "
            f"{', '.join('--' + m.replace('_', '-') for m in missing)})")
    lanes = merged.pop("max_gpu_lanes", None)
    spec = LayerSpec(**{k: v for k, v in merged.items() if k in _LAYER_FIELDS})
    compact_spec = CompactSpec(max_lanes=lanes, pid=spec.pid) if lanes is not None else None
    try:
        spec.validate()
        compile_pattern(spec.anchor_regex, "anchor_regex")
        if spec.end_anchor_regex is not None:
            compile_pattern(spec.end_anchor_regex, "end_anchor_regex")
        if compact_spec is not None:
            compact_spec.validate()
    except SpecError as exc:  # named as the manifest's keys
        raise TraceError(f"{where}: {exc.render(manifest_key)}") from None
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None
    return spec, compact_spec


def manifest_key(field: str) -> str:
    """The manifest key of a spec field (the compact view's lanes are `max_gpu_lanes`)."""
    return "max_gpu_lanes" if field == "max_lanes" else field


# -- tasks ----------------------------------------------------------------------


def _task(kind: str, trace: str, output: str, *, layers: LayerSpec | None,
          compact: CompactSpec | None, compress: str | None, compress_level: int | None,
          verify: bool, skip_existing: bool) -> dict:
    if trace == "-":
        raise TraceError("batch reads trace files; stdin (-) is for the single-trace commands")
    compression = compression_for(output, compress)  # the output's name carries the input's
    return {
        "kind": kind,
        "trace": os.path.abspath(trace),
        "output": os.path.abspath(output),
        "report": default_report_path(os.path.abspath(output), kind),
        "layers": dataclasses.asdict(layers) if layers is not None else None,
        "compact": dataclasses.asdict(compact) if compact is not None else None,
        "compress": compression,
        "compress_level": compress_level,
        "verify": verify,
        "skip_existing": skip_existing,
    }


def _refuse_duplicates(tasks: list[dict]) -> None:
    inputs = {task["trace"] for task in tasks}
    for task in tasks:
        for path in (task["output"], task["report"]):
            if path in inputs:
                raise TraceError(f"{task['trace']} would write {path}, which is an input trace")
    seen: dict[str, str] = {}
    for task in tasks:
        for path in (task["output"], task["report"]):
            if path in seen:
                raise TraceError(
                    f"{task['trace']} and {seen[path]} would both write {path}; "
                    "give the traces distinct names")
            seen[path] = task["trace"]


def compact_tasks(traces: Sequence[str], output_dir: str, spec: CompactSpec | None = None, *,
                  compress: str | None = None, compress_level: int | None = None,
                  verify: bool = False, skip_existing: bool = False) -> list[dict]:
    """One `compact` task per trace, the same options for each."""
    spec = spec or CompactSpec()
    spec.validate()
    if not traces:
        raise TraceError("no traces given")
    tasks = [_task("compact", t, output_path(t, output_dir, "compact", compress), layers=None,
                   compact=spec, compress=compress, compress_level=compress_level,
                   verify=verify, skip_existing=skip_existing) for t in traces]
    _refuse_duplicates(tasks)
    return tasks


def layers_tasks(manifest: str, output_dir: str, defaults: dict | None = None, *,
                 compress: str | None = None, compress_level: int | None = None,
                 verify: bool = False, skip_existing: bool = False) -> list[dict]:
    """One `layers` task per manifest line; `defaults` are command-line options.

    A relative `output` on a line is relative to `output_dir`.
    """
    defaults = {k: pid_value(v) if k in _ID_OPTIONS else v for k, v in (defaults or {}).items()}
    unknown = sorted(set(defaults) - set(LAYER_OPTIONS))
    if unknown:
        raise TraceError(f"unknown layers option(s): {', '.join(unknown)}")
    tasks = []
    for entry in parse_manifest(manifest):
        where = f"manifest {manifest} line {entry.line}"
        spec, compact_spec = merge_layer_options(defaults, entry.options, where)
        if entry.output is not None:  # its compression: --compress, else its own suffix
            output = os.path.join(os.path.abspath(output_dir), entry.output)
        else:
            output = output_path(entry.trace, output_dir, "layers", compress)
        tasks.append(_task("layers", entry.trace, output, layers=spec, compact=compact_spec,
                           compress=compress, compress_level=compress_level, verify=verify,
                           skip_existing=skip_existing))
    _refuse_duplicates(tasks)
    return tasks


def one_line(exc: BaseException | str) -> str:
    """An error as one line of bounded length."""
    text = exc if isinstance(exc, str) else (
        str(exc) if isinstance(exc, TraceError) else f"{type(exc).__name__}: {exc}")
    text = " ".join(text.split()) or (type(exc).__name__ if not isinstance(exc, str) else "error")
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 1] + "…"


def new_result(task: dict) -> dict:
    result: dict[str, Any] = {
        "trace": task["trace"],
        "output": task["output"],
        "status": "failed",
        "error": None,
        "seconds": 0.0,
        "events": None,
    }
    if task["kind"] == "layers":
        result["guides"] = None
    if task["kind"] == "compact" or task.get("compact"):
        result["lanes"] = None
    result.update({"report": task["report"], "input_bytes": None, "verified": None})
    return result


def failed_result(task: dict, error: BaseException | str, seconds: float = 0.0) -> dict:
    result = new_result(task)
    result["error"] = one_line(error)
    result["seconds"] = round(seconds, 3)
    return result


def _lanes(section: dict | None) -> int | None:
    if not section:
        return None
    return sum(int(g.get("lanes", 0)) for g in section.get("groups", []))


def _remove(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _fill(task: dict, result: dict, data: dict) -> None:
    """events, guides, lanes from a report's data."""
    result["events"] = data.get("original_event_count")
    if task["kind"] == "layers":
        result["guides"] = len(data.get("layers", []))
        if "lanes" in result:
            result["lanes"] = _lanes(data.get("compaction"))
    else:
        result["lanes"] = _lanes(data)


def _sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _earlier_attempt(task: dict) -> dict | None:
    """The report of an output this very task already wrote, else None.

    Used only when the engine re-runs a task whose earlier attempt was lost (its
    worker died, or the pool broke after the output was committed): the existing
    output is taken when its report records this task's command and options, the
    output's name and the trace's sha256, i.e. it is exactly what the task writes.
    """
    output, report = task["output"], task["report"]
    if not (os.path.isfile(output) and os.path.isfile(report)):
        return None
    try:
        data, _ = load_report(Path(report))  # its `layers` rows are counted, not held
    except TraceError:
        return None
    options = {}
    if task.get("layers"):
        options["layers"] = task["layers"]
    if task.get("compact"):
        options["compact"] = task["compact"]
    if not (isinstance(data, dict) and data.get("tool") == "tracestream"
            and data.get("command") == task["kind"]
            and data.get("output_file") == name_in_report(output, report)
            and data.get("output_compression") == task["compress"]
            and data.get("options") == orjson.loads(orjson.dumps(options))):
        return None
    return data if data.get("source_sha256") == _sha256(task["trace"]) else None


def _execute(task: dict, result: dict) -> None:
    from tracestream import engine

    trace, output, report = task["trace"], task["output"], task["report"]
    with contextlib.suppress(OSError):
        result["input_bytes"] = os.stat(trace).st_size
    earlier = _earlier_attempt(task) if task.get("attempt", 1) > 1 else None
    if earlier is not None:
        _fill(task, result, earlier)
    else:
        if task.get("skip_existing"):
            have_output, have_report = os.path.exists(output), os.path.exists(report)
            if have_output and have_report:
                result["status"] = "skipped"
                return
            if have_output:
                raise TraceError(
                    f"output {output} exists without its report {report} (an interrupted "
                    "run?); remove it to redo this trace")
        os.makedirs(os.path.dirname(output), exist_ok=True)
        compact_spec = CompactSpec(**task["compact"]) if task.get("compact") else None
        # one process per trace: the batch itself runs --jobs traces at once
        common = dict(report=report, compress=task["compress"],
                      compress_level=task["compress_level"], workers=0)
        if task["kind"] == "layers":
            done = engine.add_layer_guides(trace, output, LayerSpec(**task["layers"]),
                                        compact=compact_spec, **common)
        elif task["kind"] == "compact":
            done = engine.compact(trace, output, compact_spec, **common)
        else:
            raise TraceError(f"unknown batch kind {task['kind']!r}")
        _fill(task, result, done.data)
    if task.get("verify"):
        from tracestream.commands.verify import verify

        try:
            verdict = verify(trace, output, report, workers=0)
        except BaseException:
            _remove(output, report)
            raise
        result["verified"] = verdict.ok
        if not verdict.ok:
            _remove(output, report)
            failed = [f"{c.name}: {c.detail}" for c in verdict.checks if not c.ok]
            raise TraceError("verify failed, output removed: " + "; ".join(failed))
    result["status"] = "ok"


def run_task(task: dict) -> dict:
    """Run one task where it lands; a result dict always, never an exception.

    Module-level and picklable, so process pools and Dask workers can run it; the
    worker needs tracestream installed and the task's paths on its file system.
    """
    start = time.monotonic()
    try:
        result = new_result(task)
    except Exception as exc:  # a malformed task: still one result for it
        return {"trace": str(task.get("trace")) if isinstance(task, dict) else None,
                "output": str(task.get("output")) if isinstance(task, dict) else None,
                "status": "failed", "error": one_line(exc), "seconds": 0.0, "events": None}
    try:
        _execute(task, result)
        result["error"] = None
    except Exception as exc:
        result["status"] = "failed"
        result["error"] = one_line(exc)
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


# -- engines ----------------------------------------------------------------------

TaskFn = Callable[[dict], dict]


class _Terminated(SystemExit):
    """SIGTERM in a pool worker: unwind the task (the library discards its temp files), exit."""


def _on_sigterm(signum, frame):
    raise _Terminated(128 + signum)


def _init_worker(parent: int) -> None:
    """Pool worker set-up: SIGTERM unwinds; on Linux, SIGTERM when the driver dies."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
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
                    result = failed_result(task, WORKER_DIED)
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
                        result = failed_result(task, f"{WORKER_DIED} (dask KilledWorker)")
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


# -- orchestration ------------------------------------------------------------------


@dataclass
class BatchOutcome:
    """Every task's result in completion order, and the totals."""

    results: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    total: int = 0

    def count(self, status: str) -> int:
        return sum(r["status"] == status for r in self.results)

    @property
    def ok(self) -> bool:
        return self.count("failed") == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def input_bytes(self) -> int:
        """Input bytes of the traces processed (ok or failed; skipped ones were not read)."""
        return sum(r.get("input_bytes") or 0 for r in self.results if r["status"] != "skipped")

    @property
    def mb_per_s(self) -> float:
        return self.input_bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


def run_batch(tasks: Sequence[dict], *, engine: str = "local", jobs: int = 1,
              scheduler: str | None = None, task_fn: TaskFn | None = None,
              on_result: Callable[[dict, BatchOutcome], None] | None = None) -> BatchOutcome:
    """Run every task on the engine; `on_result(result, outcome)` as each finishes.

    TraceError (exit 2 in the CLI) only before any task ran: an unknown engine,
    Dask not installed, an unreachable scheduler.
    """
    if engine not in ENGINES:
        raise TraceError(f"unknown engine {engine!r} (local, dask)")
    if scheduler and engine != "dask":
        raise TraceError("--scheduler needs --engine dask")
    if jobs < 1:
        raise TraceError(f"--jobs must be >= 1, got {jobs}")
    tasks = list(tasks)
    if engine == "dask":
        require_distributed()
        results = run_dask(tasks, jobs, scheduler, task_fn=task_fn)
    else:
        results = run_local(tasks, jobs, task_fn=task_fn)
    outcome = BatchOutcome(total=len(tasks))
    start = time.monotonic()
    pending = {t["output"]: t for t in tasks}
    try:
        for result in results:
            pending.pop(result.get("output"), None)
            outcome.results.append(result)
            outcome.seconds = time.monotonic() - start
            if on_result is not None:
                on_result(result, outcome)
    finally:
        close = getattr(results, "close", None)
        if close is not None:
            close()
    for task in pending.values():  # an engine that lost a task: still one result for it
        result = failed_result(task, "the engine returned no result for this trace")
        outcome.results.append(result)
        if on_result is not None:
            on_result(result, outcome)
    outcome.seconds = time.monotonic() - start
    return outcome


# -- presentation -----------------------------------------------------------------


def result_line(result: dict) -> str:
    """One JSON line for stdout."""
    return orjson.dumps(result).decode()


def progress_text(outcome: BatchOutcome, width: int = 24) -> str:
    """`[#####-----] 12/64 done, 1 failed, 45.3 MB/s, 0:42` for a terminal."""
    done = len(outcome.results)
    total = max(outcome.total, 1)
    filled = int(width * done / total)
    elapsed = int(outcome.seconds)
    return (f"[{'#' * filled}{'-' * (width - filled)}] {done}/{outcome.total} done, "
            f"{outcome.count('failed')} failed, {outcome.mb_per_s:,.1f} MB/s, "
            f"{elapsed // 60}:{elapsed % 60:02d}")


def final_line(outcome: BatchOutcome, kind: str) -> str:
    return (f"batch {kind}: {outcome.count('ok')} ok, {outcome.count('skipped')} skipped, "
            f"{outcome.count('failed')} failed of {outcome.total} traces in "
            f"{outcome.seconds:,.1f} s ({outcome.mb_per_s:,.1f} MB/s of input)")


def summary_table(outcome: BatchOutcome) -> str:
    """A fixed-width table of every trace, in the order the tasks completed."""
    count_key = "guides" if any("guides" in r for r in outcome.results) else "lanes"
    rows = [("status", "seconds", "MB", "events", count_key, "trace")]
    for r in sorted(outcome.results, key=lambda r: str(r.get("trace"))):
        size = r.get("input_bytes")
        name = os.path.basename(str(r.get("trace")))
        if r.get("error"):
            name = f"{name}: {r['error'][:160]}"
        rows.append((
            r["status"],
            f"{r.get('seconds') or 0:.2f}",
            f"{size / 1e6:,.1f}" if size is not None else "-",
            f"{r['events']:,}" if r.get("events") is not None else "-",
            str(r[count_key]) if r.get(count_key) is not None else "-",
            name,
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [row[i].rjust(widths[i]) for i in range(1, 5)]
        lines.append("  ".join(cells + [row[5]]))
    return "\n".join(lines)
