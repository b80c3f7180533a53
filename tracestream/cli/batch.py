"""Click commands for `batch` (registered on the main group by tracestream.cli).

    tracestream batch compact --output-dir out/ --jobs 4 traces/*.json.gz
    tracestream batch layers --manifest ranks.jsonl --output-dir out/ --jobs 4
    tracestream batch compact --engine dask --scheduler tcp://HOST:8786 --output-dir /shared/out ...

Thin: options -> `tracestream.commands.batch` -> one JSON line per trace on stdout, progress
and a summary table on stderr, exit 0 when every trace succeeded and 1 otherwise.
"""

from __future__ import annotations

import os
import sys

import click

from tracestream.cli.options import event_limit, examples, quiet_option


def _default_jobs() -> int:
    return os.cpu_count() or 1


def _engine_options(f):
    options = [
        click.option("--output-dir", required=True, metavar="DIR",
                     type=click.Path(file_okay=False),
                     help="Where outputs and reports go (created if missing; on shared storage "
                          "for a Dask cluster)."),
        click.option("--jobs", "-j", type=int, default=_default_jobs, show_default="CPU count",
                     metavar="N",
                     help="Traces run at once, one process each (a local pool, or the "
                          "LocalCluster of --engine dask); each trace runs on one core, unlike "
                          "the --workers of layers and compact, which share one trace's chunks "
                          "among processes."),
        click.option("--engine", type=click.Choice(["local", "dask"]), default="local",
                     show_default=True,
                     help="local: a process pool here; dask: dask.distributed workers."),
        click.option("--scheduler", default=None, metavar="ADDRESS",
                     help="An existing Dask scheduler (tcp://host:8786); without it --engine "
                          "dask starts a LocalCluster of --jobs processes."),
        click.option("--compress", type=click.Choice(["none", "gzip", "zstd"]), default=None,
                     help="Output compression (default: the input's, from its name)."),
        click.option("--compress-level", type=int, default=None, metavar="N",
                     help="gzip level (default 1) or zstd level (default 3)."),
        click.option("--verify", "verify", is_flag=True,
                     help="Verify each output in its task; a failure removes output and report."),
        click.option("--skip-existing", is_flag=True,
                     help="Skip traces whose output and report both exist (status skipped)."),
        quiet_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f

def _layer_defaults():
    from tracestream.cli.options import PassesType

    return [
        ("--anchor-regex", str, "REGEX"), ("--num-layers", int, "N"),
        ("--anchor-offset", int, "K"), ("--passes", PassesType(), "P|all"),
        ("--anchor-stride", int, "S"), ("--extra-anchors-per-pass", int, "E"),
        ("--first-layer", int, "F"), ("--end-anchor-regex", str, "REGEX"),
        ("--phase", str, "TEXT"), ("--evidence", str, "TEXT"), ("--pid", str, "PID"),
        ("--device", str, "D"), ("--gap-factor", float, "F"),
    ]


_LAYER_FLAGS = ["--allow-gaps", "--allow-several-anchor-names"]


def _layer_default_options(f):
    """The `layers` options, all optional here: defaults for every manifest line."""
    for flag in reversed(_LAYER_FLAGS):
        key = flag[2:].replace("-", "_")
        f = click.option(flag, is_flag=True, default=None,
                         help=f"Default {key}: true for lines that do not set it.")(f)
    for flag, kind, metavar in reversed(_layer_defaults()):
        key = flag[2:].replace("-", "_")
        f = click.option(flag, type=kind, default=None, metavar=metavar,
                         help=f"Default {key} for lines that do not set it.")(f)
    return f


def _run(kind: str, tasks, engine: str, jobs: int, scheduler: str | None, quiet: bool) -> None:
    from tracestream.cli.guard import refuse_stdout_on_inputs, silence_and_refuse, stderr_is_one_of
    from tracestream.cli.progress import progress_for
    from tracestream.commands.batch import run_batch
    from tracestream.commands.batch.outcome import (
        final_line,
        progress_note,
        result_line,
        summary_table,
    )

    traces = [task["trace"] for task in tasks]  # a manifest's traces are known only now
    if stderr_is_one_of(traces):
        silence_and_refuse()
    refuse_stdout_on_inputs(traces, "result lines")
    progress = progress_for(quiet)
    meter = progress.phase(f"batch {kind}", len(tasks), "traces") if progress else None

    def on_result(result, outcome):
        if meter is None:
            click.echo(result_line(result))
            return
        meter.note = progress_note(outcome)
        meter.advance_to(len(outcome.results))
        meter.echo(result_line(result))

    try:
        outcome = run_batch(tasks, engine=engine, jobs=jobs, scheduler=scheduler,
                            on_result=on_result)
    finally:
        if meter is not None:
            meter.close()
    if not quiet:
        click.echo(final_line(outcome, kind), err=True)
        click.echo(summary_table(outcome), err=True)
    sys.exit(outcome.exit_code)


def register(main) -> None:
    """Add this module's commands to the `tracestream` group."""

    @main.group(epilog=examples(
        "tracestream batch compact --output-dir out/ --jobs 4 TP-0.trace.json.gz "
        "TP-1.trace.json.gz",
        "tracestream batch layers --manifest ranks.jsonl --output-dir out/ --jobs 4"))
    def batch():
        """Run compact or layers over many traces (one task per file), locally or on Dask.

        Prints one JSON line per trace as it finishes (trace, output, status, error,
        seconds, events, guides, gpu_lanes and scope_lanes); exit 0 when all succeeded, 1
        when any failed.
        """

    @batch.command("compact", epilog=examples(
        "tracestream batch compact --output-dir out/ --jobs 4 TP-0.trace.json.gz "
        "TP-1.trace.json.gz",
        "tracestream batch compact --engine dask --scheduler tcp://scheduler:8786 "
        "--output-dir /shared/out /shared/traces/TP-0.trace.json.gz"))
    @click.argument("traces", nargs=-1, required=True, metavar="TRACE...")
    @click.option("--max-gpu-lanes", type=int, default=10, show_default=True, metavar="N",
                  help="Display lanes per device (1-10).")
    @click.option("--pid", default=None, metavar="PID", help="Compact only this GPU process.")
    @_engine_options
    def batch_compact(traces, max_gpu_lanes, pid, output_dir, jobs, engine, scheduler, compress,
                      compress_level, verify, skip_existing, quiet):
        """Compact every TRACE with the same options: OUT/<name>.compact.json[.gz]."""
        from tracestream.cli.options import pid_value
        from tracestream.commands.batch import compact_tasks
        from tracestream.plan.specs import CompactSpec

        tasks = compact_tasks(traces, output_dir,
                              CompactSpec(max_lanes=max_gpu_lanes, pid=pid_value(pid)),
                              compress=compress, compress_level=compress_level, verify=verify,
                              skip_existing=skip_existing, max_event_bytes=event_limit())
        _run("compact", tasks, engine, jobs, scheduler, quiet)

    @batch.command("layers", epilog=examples(
        "tracestream batch layers --manifest ranks.jsonl --output-dir out/ --jobs 4",
        "tracestream batch layers --manifest ranks.jsonl --output-dir out/ --num-layers 40 "
        "--anchor-offset 0 --passes all --max-gpu-lanes 10"))
    @click.option("--manifest", required=True, metavar="PATH", type=click.Path(dir_okay=False),
                  help="JSON lines: {\"trace\": ..., \"output\": ... (optional), and layers "
                       "options with underscores, e.g. \"pid\": 1, \"anchor_offset\": 9}. "
                       "Relative traces are relative to the manifest's folder.")
    @_layer_default_options
    @click.option("--max-gpu-lanes", type=int, default=None, metavar="N",
                  help="Also compact GPU activity into at most N (1-10) display lanes.")
    @_engine_options
    def batch_layers(manifest, output_dir, jobs, engine, scheduler, compress, compress_level,
                     verify, skip_existing, quiet, **layer_options):
        """Add layer guides to every trace of a manifest: OUT/<name>.layers.json[.gz].

        The layers options (see `tracestream layers --help`) given here are defaults;
        the same option on a manifest line (with underscores) wins for that trace.
        """
        from tracestream.commands.batch import layers_tasks

        tasks = layers_tasks(manifest, output_dir, layer_options, compress=compress,
                             compress_level=compress_level, verify=verify,
                             skip_existing=skip_existing, max_event_bytes=event_limit())
        _run("layers", tasks, engine, jobs, scheduler, quiet)
