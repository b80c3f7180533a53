"""Click commands for `verify` and `restore`: the checks of an annotated trace."""

import sys

import click

from tracestream.cli.options import (
    compress_option,
    event_limit,
    examples,
    level_option,
    orjson_dumps,
    quiet_option,
    workers_option,
)


def register(main) -> None:
    """Add the commands to the `tracestream` group."""

    @main.command(epilog=examples(
        "tracestream verify --trace TP-0.trace.json.gz --output TP-0.layers.trace.json.gz",
        "tracestream verify --trace TP-0.trace.json.gz --output TP-0.layers.trace.json.gz "
        "--json"))
    @click.option("--trace", "trace", required=True, metavar="PATH",
                  help="The source trace (an input: read, never written), or - for stdin.")
    @click.option("--output", "output", required=True, metavar="PATH",
                  help="The annotated trace tracestream wrote from it (an input too: verify "
                       "reads it and writes nothing).")
    @click.option("--report", "report", metavar="PATH", default=None,
                  help="The report to read (an input; default: <output>.layers.json, else "
                       "<output>.compact.json).")
    @workers_option
    @click.option("--json", "as_json", is_flag=True,
                  help="Print the verdict and each check as one JSON object.")
    @quiet_option
    def verify(trace, output, report, workers, as_json, quiet):
        """Prove an annotated trace is its source plus tracestream's additions (exit 0/1/2)."""
        from tracestream.cli.guard import refuse_stdout_on_inputs
        from tracestream.cli.progress import progress_for
        from tracestream.commands.verify import verify as verify_trace

        refuse_stdout_on_inputs([trace, output], "output")
        verdict = verify_trace(trace, output, report, workers=workers,
                               max_event_bytes=event_limit(), progress=progress_for(quiet))
        if as_json:
            click.echo(orjson_dumps(verdict.to_json()))
        else:
            click.echo(verdict.summary())
        sys.exit(0 if verdict.ok else 1)


    @main.command(epilog=examples(
        "tracestream restore --trace TP-0.layers.trace.json.gz --output TP-0.restored.json",
        "tracestream restore --trace TP-0.layers.trace.json.gz --output "
        "TP-0.restored.json.gz"))
    @click.option("--trace", "trace", required=True, metavar="PATH",
                  help="An annotated trace written by `layers` or `compact` (the input).")
    @click.option("--output", "output", required=True, metavar="PATH",
                  help="Where the restored source trace goes (never overwritten).")
    @click.option("--report", "report", metavar="PATH", default=None,
                  help="The annotated trace's report (an input; default: next to --trace).")
    @compress_option
    @level_option
    @click.option("--json", "as_json", is_flag=True,
                  help="Print the counts as one JSON object on stdout (not with --output -).")
    @quiet_option
    def restore(trace, output, report, compress, compress_level, as_json, quiet):
        """Write the source trace back from an annotated one, byte for byte (decompressed)."""
        from tracestream.cli.options import refuse_json_with_trace_on_stdout
        from tracestream.cli.progress import progress_for
        from tracestream.commands.restore import restore as restore_trace

        if as_json:
            refuse_json_with_trace_on_stdout(output)
        result = restore_trace(trace, output, report, compress=compress,
                               compress_level=compress_level, max_event_bytes=event_limit(),
                               progress=progress_for(quiet))
        if as_json:
            click.echo(orjson_dumps({**result, "output": output}))
        elif not quiet:
            click.echo(
                f"restored {result['events']:,} events to {output} ({result['relocated']:,} "
                f"moved back, {result['retired']} metadata events re-inserted, "
                f"{result['dropped']} added events dropped)", err=output == "-")
