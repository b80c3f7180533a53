"""Click commands for `inspect` and `anchors` (registered on the main group by tracestream.cli).

Thin wrappers: parse options, call `tracestream.commands.evidence`, print. Library
refusals (TraceError) become one stderr line and exit 2 in the main group.
"""

from itertools import islice

import click

_json_option = click.option("--json", "as_json", is_flag=True,
                            help="Print one JSON object instead of tables.")


def register(main) -> None:
    """Add this module's commands to the `tracestream` group."""
    from tracestream.cli.options import event_limit, examples, quiet_option, workers_option

    @main.command("inspect", epilog=examples(
        "tracestream inspect --trace TP-0.trace.json.gz",
        "zcat TP-0.trace.json.gz | tracestream inspect --trace - --json"))
    @click.option("--trace", "trace", required=True, metavar="PATH",
                  help="The trace to read (.json, .json.gz, .json.zst; detected from the "
                       "bytes), or - for stdin.")
    @_json_option
    @click.option("--top", type=int, default=30, show_default=True, metavar="N",
                  help="Most frequent kernel names per GPU and CPU user annotations to show.")
    @workers_option
    @quiet_option
    def inspect_command(trace, as_json, top, workers, quiet):
        """What a trace holds: processes, GPUs (streams, counts, peak overlap), names, flows."""
        from tracestream.cli.guard import refuse_stdout_on_inputs
        from tracestream.cli.progress import progress_for
        from tracestream.commands.evidence.inspect import format_inspect, inspect_trace
        from tracestream.jsontext import dumps
        from tracestream.parallel.memory import collector_paused

        refuse_stdout_on_inputs([trace], "output")

        with collector_paused():
            report = inspect_trace(trace, top=top, progress=progress_for(quiet),
                                   workers=workers, max_event_bytes=event_limit())
            click.echo(dumps(report).decode() if as_json else format_inspect(report))

    @main.command("anchors", epilog=examples(
        "tracestream anchors --trace TP-0.trace.json.gz --anchor-regex '^_q_rope_store$'",
        "tracestream anchors --trace TP-0.trace.json.gz --anchor-regex '^_q_rope_store$' "
        "--cross-check 'all_reduce' --json"))
    @click.option("--trace", "trace", required=True, metavar="PATH",
                  help="The trace to read (.json, .json.gz, .json.zst; detected from the "
                       "bytes), or - for stdin.")
    @click.option("--anchor-regex", required=True, metavar="REGEX",
                  help="Kernel name pattern (Python re.search) of the candidate anchor.")
    @click.option("--pid", default=None, metavar="PID", help="GPU process of the anchors.")
    @click.option("--device", default=None, metavar="D", help="args.device of the anchors.")
    @click.option("--cross-check", default=None, metavar="REGEX",
                  help="Second landmark (e.g. the terminal kernel): count its matches between "
                       "consecutive anchors inside a cluster and flag counts other than one.")
    @click.option("--gap-factor", type=float, default=None, metavar="F",
                  help="A gap larger than F x the median gap starts a new cluster "
                       "[default: 3].")
    @click.option("--all", "all_rows", is_flag=True,
                  help="Show every row of the match, cluster and flagged-window tables "
                       "(default: the first and last rows of a long one).")
    @click.option("--json", "as_json", is_flag=True,
                  help="Print one JSON object: the verdict, counts, clusters and histograms, "
                       "without the per-match rows.")
    @click.option("--json-rows", is_flag=True,
                  help="Print every match as one JSON object a line (times as exact decimal "
                       "text) instead of tables.")
    @workers_option
    @quiet_option
    def anchors_command(trace, anchor_regex, pid, device, cross_check, gap_factor, all_rows,
                        as_json, json_rows, workers, quiet):
        """The verdict, clusters and gap histograms of an anchor's matches on one GPU, then
        the matches in time order (evidence for `layers --anchor-offset/--num-layers`;
        nothing is chosen for you)."""
        from tracestream.cli.guard import refuse_stdout_on_inputs
        from tracestream.cli.options import pid_value
        from tracestream.cli.progress import progress_for
        from tracestream.commands.evidence.anchors import (
            anchors_json_rows,
            anchors_lines,
            anchors_summary_json,
            find_anchors,
        )
        from tracestream.errors import TraceError
        from tracestream.parallel.memory import collector_paused
        from tracestream.plan.cadence import GAP_FACTOR

        if as_json and json_rows:
            raise TraceError("--json prints one summary object and --json-rows one line per "
                             "match: give one of them")
        refuse_stdout_on_inputs([trace], "output")
        with collector_paused():  # thousands of match rows: full collections would walk them all
            report = find_anchors(
                trace, anchor_regex, pid=pid_value(pid), device=pid_value(device),
                cross_check=cross_check, factor=GAP_FACTOR if gap_factor is None else gap_factor,
                progress=progress_for(quiet), workers=workers,
                max_event_bytes=event_limit(),
            )
            if as_json or json_rows:
                pieces = anchors_summary_json(report) if as_json else anchors_json_rows(report)
                for piece in pieces:
                    click.echo(piece, nl=False)  # bytes: written as they are
                if as_json:
                    click.echo()
            else:
                lines = anchors_lines(report, all_rows=all_rows)
                while block := list(islice(lines, 4096)):  # one write per block, not per line
                    click.echo("\n".join(block))
