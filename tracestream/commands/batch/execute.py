"""One task where it lands: the library API run on its paths (never a shell), and exactly
one small result dict, whatever happens."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import orjson

from tracestream.engine import name_in_report
from tracestream.errors import TraceError
from tracestream.plan.report import load_report
from tracestream.plan.specs import CompactSpec, LayerSpec

_MAX_ERROR = 600


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
        result["gpu_lanes"] = result["scope_lanes"] = None
    result.update({"report": task["report"], "input_bytes": None, "verified": None})
    return result


def failed_result(task: dict, error: BaseException | str, seconds: float = 0.0) -> dict:
    result = new_result(task)
    result["error"] = one_line(error)
    result["seconds"] = round(seconds, 3)
    return result


def _lanes(section: dict | None, kind: str) -> int | None:
    """The synthetic lanes of a compaction report's groups of one kind: `activity` (the GPU
    lanes, per device) or `scopes` (the GPU user-annotation lanes, per process)."""
    if not section:
        return None
    return sum(int(g.get("lanes", 0)) for g in section.get("groups", [])
               if g.get("kind") == kind)


def _remove(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _fill(task: dict, result: dict, data: dict) -> None:
    """events, guides, GPU and scope lanes from a report's data."""
    result["events"] = data.get("original_event_count")
    if task["kind"] == "layers":
        result["guides"] = len(data.get("layers", []))
    section = data.get("compaction") if task["kind"] == "layers" else data
    if "gpu_lanes" in result:
        result["gpu_lanes"] = _lanes(section, "activity")
        result["scope_lanes"] = _lanes(section, "scopes")


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
                      compress_level=task["compress_level"], workers=0,
                      max_event_bytes=task.get("max_event_bytes"))
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
            verdict = verify(trace, output, report, workers=0,
                             max_event_bytes=task.get("max_event_bytes"))
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
