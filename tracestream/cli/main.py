"""Command-line layer: parses options, calls the library, maps errors to exit codes.

No trace logic lives here; every command is a thin wrapper over `tracestream.engine`.
"""

import os
import signal
import sys

import click

from tracestream._version import __version__
from tracestream.errors import SpecError, TraceError, flag_of, require_utf8


class _Group(click.Group):
    """Turns library refusals into one stderr line and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            _check_utf8_arguments(ctx._protected_args + ctx.args)
            _check_environment()
            return super().invoke(ctx)
        except click.exceptions.UsageError as exc:
            _usage_error(exc)
        except (click.exceptions.Exit, click.exceptions.ClickException, click.exceptions.Abort):
            raise
        except SpecError as exc:
            click.echo(f"tracestream: error: {exc.render(flag_of)}", err=True)
            sys.exit(2)
        except TraceError as exc:
            click.echo(f"tracestream: error: {exc}", err=True)
            sys.exit(2)
        except BrokenPipeError:  # `tracestream anchors ... | head`: the reader has had enough
            # (outputs written to stdout report a closed pipe in the sink, with exit 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except KeyboardInterrupt:
            click.echo("tracestream: interrupted; no output was left behind", err=True)
            sys.exit(130)
        except _Terminated:
            click.echo("tracestream: terminated; no output was left behind", err=True)
            sys.exit(143)
        except Exception as exc:  # a bug: one line for unattended jobs, details on request
            if os.environ.get("TRACESTREAM_DEBUG"):
                raise
            text = " ".join(str(exc).splitlines())
            click.echo(
                f"tracestream: internal error: {type(exc).__name__}: {text} (nothing was written;"
                " rerun with TRACESTREAM_DEBUG=1 for the traceback and please report it)",
                err=True,
            )
            sys.exit(70)

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.UsageError as exc:
            _usage_error(exc)

    def main(self, *args, **kwargs):
        _install_signal_handlers()
        # as a program (arguments from sys.argv, not an in-process call such as click's
        # test runner), a signal after the outputs are committed is ignored until exit
        from tracestream.write import sink

        as_program = (args[0] if args else kwargs.get("args")) is None
        sink.IGNORE_SIGNALS_AFTER_COMMIT = as_program
        if as_program:
            from tracestream.cli.guard import reopen_closed_streams

            reopen_closed_streams()
        return super().main(*args, **kwargs)


def _usage_error(exc: click.exceptions.UsageError):
    """A mistyped command line is one line too, naming where the help is (click prints
    Usage, Try and Error on three)."""
    text = " ".join(exc.format_message().splitlines())
    where = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
    click.echo(f"tracestream: error: {text}{where}", err=True)
    sys.exit(exc.exit_code)


def _check_utf8_arguments(args: list[str]) -> None:
    """Option text and file names end in JSON (report, trace, summary), which is UTF-8: a
    non-UTF-8 argument is refused up front, naming the option it belongs to."""
    for i, arg in enumerate(args):
        before = str(args[i - 1]) if i else ""
        require_utf8(arg, before if before.startswith("-") else f"argument {i + 1}")


def _check_environment() -> None:
    """A bad TRACESTREAM_MAX_EVENT_MB is refused before any command reads a byte."""
    from tracestream.read.document import max_event_bytes

    max_event_bytes()


class _GuardedCommand(click.Command):
    """A command that refuses, before it starts, a stderr that is one of its files."""

    def invoke(self, ctx):
        from tracestream.cli.guard import (
            named_files,
            refuse_closed_streams,
            silence_and_refuse,
            stderr_is_one_of,
        )

        if stderr_is_one_of(named_files(ctx.params)):
            silence_and_refuse()
        refuse_closed_streams(_command_name(ctx), ctx.params)
        return super().invoke(ctx)


def _command_name(ctx) -> str:
    """`inspect`, `batch compact`: the command as typed after the program's name."""
    names = []
    while ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(reversed(names))


_Group.command_class = _GuardedCommand
_Group.group_class = type  # `batch` is a _Group too: its commands are guarded the same way


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so every cleanup handler runs."""


def _install_signal_handlers() -> None:
    def terminate(signum, frame):
        raise _Terminated()

    signal.signal(signal.SIGTERM, terminate)
    # a file size limit (RLIMIT_FSIZE) must fail the write, not kill the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # a closed stdout pipe must fail the write (EPIPE), not kill the process silently
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracestream")
def main():
    """Stream PyTorch Profiler traces; add verified layer guides and a compact GPU view."""


def _pid_value(value: str | None):
    """--pid/--device as given: an integer when it looks like one, else the string
    (`'"0"'`: the string "0"; see guides.id_from_text)."""
    from tracestream.plan.guides import id_from_text

    return id_from_text(value)


def _emit_summary(report, json_summary: bool, quiet: bool) -> None:
    """The human summary goes to stderr; stdout carries only the trace or the JSON line
    (the report without its per-guide rows, see Report.json_summary)."""
    from tracestream.jsontext import dumps

    if json_summary and report.output != "-":
        click.echo(dumps(report.json_summary()).decode())
    if not quiet:
        click.echo(report.summary(), err=True)


def _refuse_summary_on_input(trace: str, json_summary: bool, report: str | None) -> None:
    """`--json-summary 1<> trace.json` would overwrite the source with the summary, and
    with `--report -` stdout would carry two JSON documents."""
    from tracestream.cli.guard import refuse_stdout_on_inputs

    if json_summary:
        if report == "-":
            raise TraceError("--report - and --json-summary would both go to stdout; "
                             "give the report a file or drop --json-summary")
        refuse_stdout_on_inputs([trace], "JSON summary")


class PassesType(click.ParamType):
    """--passes: a count, or `all` (every complete pass from the offset)."""

    name = "passes"

    def convert(self, value, param, ctx):
        from tracestream.plan.guides import ALL_PASSES

        if isinstance(value, int) or value == ALL_PASSES:
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is neither a count nor 'all'", param, ctx)


_trace_option = click.option(
    "--trace", "trace", required=True, metavar="PATH",
    help="Input trace (.json, .json.gz, .json.zst; compression is detected from the bytes), "
         "or - for stdin.",
)
_output_option = click.option(
    "--output", "output", required=True, metavar="PATH",
    help="New trace to write (never overwritten), or - for stdout (needs --report).",
)
_report_option = click.option(
    "--report", "report", metavar="PATH", default=None,
    help="Where the report goes (default: <output>.layers.json or <output>.compact.json).",
)
_compress_option = click.option(
    "--compress", type=click.Choice(["none", "gzip", "zstd"]), default=None,
    help="Output compression (default: from the output suffix .gz/.zst, else none).",
)
_level_option = click.option(
    "--compress-level", type=int, default=None, metavar="N",
    help="gzip level, zlib's 1-9 (default: ISA-L's fast level 1) or zstd level (default 3).",
)
_quiet_option = click.option(
    "--quiet", is_flag=True, help="No progress and no summary on stderr (errors still appear).")
_workers_option = click.option(
    "--workers", type=click.IntRange(0, 64), default=None, metavar="N",
    help="Worker processes for the per-chunk work (default: one per CPU for inputs of 48 MB "
         "or more; 0: none).",
)
_json_summary_option = click.option(
    "--json-summary", is_flag=True,
    help="Print the report summary as one JSON line on stdout (not when stdout is the trace).",
)


@main.command()
@_trace_option
@_output_option
@click.option("--anchor-regex", required=True, metavar="REGEX",
              help="Kernel name pattern (Python re.search) of the verified once-per-layer anchor.")
@click.option("--num-layers", type=int, required=True, metavar="N", help="Layers per pass.")
@click.option("--anchor-offset", type=int, required=True, metavar="K",
              help="Index (in time order) of the match that starts the verified first layer.")
@click.option("--passes", type=PassesType(), default=1, show_default=True, metavar="P|all",
              help="Complete passes to label; all: every complete pass from the offset.")
@click.option("--anchor-stride", type=int, default=1, show_default=True, metavar="S",
              help="Anchor matches per layer (keep every S-th).")
@click.option("--extra-anchors-per-pass", type=int, default=0, show_default=True, metavar="E",
              help="Matches after each pass's last layer to skip before the next pass.")
@click.option("--first-layer", type=int, default=0, show_default=True, metavar="F",
              help="Number of the first labelled layer (pipeline partitions).")
@click.option("--end-anchor-regex", default=None, metavar="REGEX",
              help="Terminal kernel that ends each layer (once per layer); the last layer's "
                   "guide ends at its end.")
@click.option("--phase", required=True, help="Which phase the guides label, e.g. target-verify.")
@click.option("--evidence", required=True,
              help="How you verified the anchor and L0 (kept in every guide and the report).")
@click.option("--pid", default=None, metavar="PID", help="GPU process of the anchors.")
@click.option("--device", default=None, metavar="D", help="args.device of the anchors.")
@click.option("--max-gpu-lanes", type=int, default=None, metavar="N",
              help="Also compact GPU activity into at most N (1-10) display lanes.")
@click.option("--gap-factor", type=float, default=None, metavar="F",
              help="A gap between two layers of a pass longer than F x the median layer gap is "
                   "a cadence break (the rule of `anchors`) [default: 3].")
@click.option("--allow-gaps", is_flag=True,
              help="Label passes that cross a cadence break anyway (recorded in the report).")
@click.option("--allow-several-anchor-names", is_flag=True,
              help="Accept a pattern that matches several kernel names (recorded in the report).")
@_report_option
@_compress_option
@_level_option
@_workers_option
@_quiet_option
@_json_summary_option
def layers(trace, output, anchor_regex, num_layers, anchor_offset, passes, anchor_stride,
           extra_anchors_per_pass, first_layer, end_anchor_regex, phase, evidence, pid, device,
           max_gpu_lanes, gap_factor, allow_gaps, allow_several_anchor_names, report, compress,
           compress_level, workers, quiet, json_summary):
    """Add verified L0, L1, … layer guides to a trace (optionally with the compact GPU view)."""
    from tracestream.engine import add_layer_guides
    from tracestream.plan.guides import LayerSpec
    from tracestream.plan.planner import CompactSpec

    spec = LayerSpec(
        anchor_regex=anchor_regex, num_layers=num_layers, anchor_offset=anchor_offset,
        phase=phase, evidence=evidence, passes=passes, anchor_stride=anchor_stride,
        extra_anchors_per_pass=extra_anchors_per_pass, first_layer=first_layer,
        end_anchor_regex=end_anchor_regex, pid=_pid_value(pid), device=_pid_value(device),
        allow_gaps=allow_gaps, allow_several_anchor_names=allow_several_anchor_names,
        **({} if gap_factor is None else {"gap_factor": gap_factor}),
    )
    compact_spec = (
        CompactSpec(max_lanes=max_gpu_lanes, pid=_pid_value(pid))
        if max_gpu_lanes is not None else None
    )
    _refuse_summary_on_input(trace, json_summary, report)
    result = add_layer_guides(trace, output, spec, report=report, compact=compact_spec,
                              compress=compress, compress_level=compress_level, quiet=quiet,
                              workers=workers)
    _emit_summary(result, json_summary, quiet)


@main.command()
@_trace_option
@_output_option
@click.option("--max-gpu-lanes", type=int, default=10, show_default=True, metavar="N",
              help="Display lanes per device (1-10); refused if the peak overlap is higher.")
@click.option("--pid", default=None, metavar="PID", help="Compact only this GPU process.")
@_report_option
@_compress_option
@_level_option
@_workers_option
@_quiet_option
@_json_summary_option
def compact(trace, output, max_gpu_lanes, pid, report, compress, compress_level, workers, quiet,
            json_summary):
    """Pack GPU activity into at most N synthetic display lanes per device (a compact view)."""
    from tracestream.engine import compact as compact_trace
    from tracestream.plan.planner import CompactSpec

    _refuse_summary_on_input(trace, json_summary, report)
    result = compact_trace(trace, output, CompactSpec(max_lanes=max_gpu_lanes, pid=_pid_value(pid)),
                           report=report, compress=compress, compress_level=compress_level,
                           quiet=quiet, workers=workers)
    _emit_summary(result, json_summary, quiet)


@main.command()
@click.option("--trace", "trace", required=True, metavar="PATH", help="The source trace.")
@click.option("--output", "output", required=True, metavar="PATH",
              help="The annotated trace tracestream wrote from it.")
@_report_option
@_workers_option
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and each check as JSON.")
def verify(trace, output, report, workers, as_json):
    """Prove an annotated trace is its source plus tracestream's additions (exit 0/1/2)."""
    from tracestream.cli.guard import refuse_stdout_on_inputs
    from tracestream.commands.verify import verify as verify_trace

    refuse_stdout_on_inputs([trace, output], "output")
    verdict = verify_trace(trace, output, report, workers=workers)
    if as_json:
        click.echo(orjson_dumps(verdict.to_json()))
    else:
        click.echo(verdict.summary())
    sys.exit(0 if verdict.ok else 1)


@main.command()
@click.option("--trace", "trace", required=True, metavar="PATH",
              help="An annotated trace written by `layers` or `compact`.")
@click.option("--output", "output", required=True, metavar="PATH",
              help="Where the restored source trace goes (never overwritten).")
@click.option("--report", "report", metavar="PATH", default=None,
              help="The annotated trace's report (default: next to --trace).")
@_compress_option
@_level_option
def restore(trace, output, report, compress, compress_level):
    """Write the source trace back from an annotated one, byte for byte (decompressed)."""
    from tracestream.commands.restore import restore as restore_trace

    result = restore_trace(trace, output, report, compress=compress,
                           compress_level=compress_level)
    click.echo(
        f"restored {result['events']:,} events to {output} ({result['relocated']:,} moved back, "
        f"{result['retired']} metadata events re-inserted, {result['dropped']} added events "
        f"dropped)", err=output == "-")


def orjson_dumps(value) -> str:
    import orjson

    return orjson.dumps(value).decode()


def _register_feature_commands() -> None:
    from tracestream.cli import batch, evidence, view

    for module in (evidence, batch, view):
        module.register(main)


_register_feature_commands()
