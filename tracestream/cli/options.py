"""Options and helpers shared by the commands: one definition of each flag and its help."""

import math

import click

from tracestream.errors import TraceError

MAX_EVENT_KEY = "tracestream.max_event_bytes"
"""Where the group keeps the event-size limit for its commands (click's context meta)."""


def examples(*commands: str) -> str:
    """A command's --help epilog: real command lines, kept as written (click's \\b)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {command}" for command in commands)


def max_event_bytes_from(environ) -> int | None:
    """The longest single event the commands read, in bytes, from TRACESTREAM_MAX_EVENT_MB
    (None: unset, the library's default). The library itself reads no environment."""
    text = environ.get("TRACESTREAM_MAX_EVENT_MB")
    if not text:
        return None
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not math.isfinite(mb) or mb <= 0:
        from tracestream.read.document import MAX_EVENT_MB

        raise TraceError(f"TRACESTREAM_MAX_EVENT_MB={text[:40]!r} is not a limit: it takes a "
                         f"positive number of MiB (default {MAX_EVENT_MB})")
    return max(1, int(min(mb, 1 << 40) * (1 << 20)))  # 1 EiB: no limit, and no overflow


def event_limit() -> int | None:
    """The running command's event-size limit (see `max_event_bytes_from`)."""
    return click.get_current_context().meta.get(MAX_EVENT_KEY)


def pid_value(value: str | None):
    """--pid/--device as given: an integer when it looks like one, else the string
    (`'"0"'`: the string "0"; see plan.selection.id_from_text)."""
    from tracestream.plan.selection import id_from_text

    return id_from_text(value)


def emit_summary(report, json_summary: bool, quiet: bool) -> None:
    """The human summary goes to stderr; stdout carries only the trace or the JSON line
    (the report without its per-guide rows, see Report.json_summary)."""
    from tracestream.jsontext import dumps

    if json_summary:  # (not with --output -: refused before the run)
        click.echo(dumps(report.json_summary()).decode())
    if not quiet:
        click.echo(report.summary(), err=True)


def refuse_summary_on_input(trace: str, json_summary: bool, report: str | None,
                            output: str) -> None:
    """`--json 1<> trace.json` would overwrite the source with the summary; with `--report -`
    or `--output -` stdout would carry two documents."""
    from tracestream.cli.guard import refuse_stdout_on_inputs

    if json_summary:
        if report == "-":
            raise TraceError("--report - and --json would both go to stdout; "
                             "give the report a file or drop --json")
        refuse_json_with_trace_on_stdout(output)
        refuse_stdout_on_inputs([trace], "JSON summary")


def refuse_json_with_trace_on_stdout(output: str) -> None:
    """--json prints on stdout, which `--output -` gives to the trace."""
    if output == "-":
        raise TraceError("--output - and --json would both go to stdout; "
                         "give the output a file or drop --json")


class PassesType(click.ParamType):
    """--passes: a count, or `all` (every complete pass from the offset)."""

    name = "passes"

    def convert(self, value, param, ctx):
        from tracestream.plan.specs import ALL_PASSES

        if isinstance(value, int) or value == ALL_PASSES:
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a count nor 'all'", param, ctx)


trace_option = click.option(
    "--trace", "trace", required=True, metavar="PATH",
    help="Input trace (.json, .json.gz, .json.zst; compression is detected from the bytes), "
         "or - for stdin.",
)
output_option = click.option(
    "--output", "output", required=True, metavar="PATH",
    help="New trace to write (never overwritten), or - for stdout (needs --report).",
)
report_option = click.option(
    "--report", "report", metavar="PATH", default=None,
    help="Where the report goes (default: <output>.layers.json or <output>.compact.json).",
)
compress_option = click.option(
    "--compress", type=click.Choice(["none", "gzip", "zstd"]), default=None,
    help="Output compression; it must agree with the output's suffix (.gz: gzip, .zst: zstd, "
         "else none), which gives it when left out.",
)
level_option = click.option(
    "--compress-level", type=int, default=None, metavar="N",
    help="gzip level, zlib's 1-9 (default: ISA-L's fast level 1) or zstd level (default 3).",
)
spool_option = click.option(
    "--spool-dir", default=None, metavar="DIR", type=click.Path(file_okay=False),
    help="Where a trace read from stdin or a pipe is kept for the second pass "
         "(zstd-compressed when it is plain JSON, ~1/20 of its size; default: $TMPDIR).",
)
quiet_option = click.option(
    "--quiet", is_flag=True,
    help="Show no progress and no summary on stderr (errors still appear, and what the "
         "command prints on stdout).")
workers_option = click.option(
    "--workers", type=click.IntRange(0, 64), default=None, metavar="N",
    help="Worker processes for the per-chunk work (default: one per CPU for inputs of 48 MB "
         "or more; 0: none).",
)
json_summary_option = click.option(
    "--json", "--json-summary", "json_summary", is_flag=True,
    help="Print the report summary as one JSON object on stdout (not when stdout is the "
         "trace; --json-summary is its former name).",
)


def orjson_dumps(value) -> str:
    import orjson

    return orjson.dumps(value).decode()
