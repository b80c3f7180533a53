"""The batch's outcome: its results in order, the exit code, and the lines and table shown."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from tracestream.commands.batch.engines import (
    ENGINES,
    TaskFn,
    require_distributed,
    run_dask,
    run_local,
)
from tracestream.commands.batch.execute import failed_result
from tracestream.errors import TraceError


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


def result_line(result: dict) -> str:
    """One JSON line for stdout."""
    return orjson.dumps(result).decode()


def progress_note(outcome: BatchOutcome) -> str:
    """`1 failed, 45.3 MB/s`: what the progress bar or log line says after its count."""
    return f"{outcome.count('failed')} failed, {outcome.mb_per_s:,.1f} MB/s"


def final_line(outcome: BatchOutcome, kind: str) -> str:
    return (f"batch {kind}: {outcome.count('ok')} ok, {outcome.count('skipped')} skipped, "
            f"{outcome.count('failed')} failed of {outcome.total} traces in "
            f"{outcome.seconds:,.1f} s ({outcome.mb_per_s:,.1f} MB/s of input)")


def summary_table(outcome: BatchOutcome) -> str:
    """A fixed-width table of every trace, in the order the tasks completed."""
    count_key = "guides" if any("guides" in r for r in outcome.results) else "gpu_lanes"
    rows = [("status", "seconds", "MB", "events", count_key, "trace")]
    traces = [str(r.get("trace")) for r in outcome.results]
    shared = os.path.commonpath([os.path.dirname(t) for t in traces]) if traces else ""
    for r in sorted(outcome.results, key=lambda r: str(r.get("trace"))):
        size = r.get("input_bytes")
        name = os.path.relpath(str(r.get("trace")), shared)  # `r0/trace.json` per rank
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
