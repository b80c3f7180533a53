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

The modules: tasks (output naming, manifest parsing and merging), execute (the task
function), engines (local pool, Dask) and outcome (the orchestrator and its results).
"""

from tracestream.commands.batch.outcome import BatchOutcome, run_batch
from tracestream.commands.batch.tasks import compact_tasks, layers_tasks

__all__ = ["BatchOutcome", "compact_tasks", "layers_tasks", "run_batch"]
