"""The `tracestream` group: library refusals become one stderr line and exit 2, signals and
closed streams are handled before a command runs, a bug is exit 70 with one line.

Commands are added by tracestream.cli (the package), each from its own module.
"""

import os
import signal
import sys

import click

from tracestream._version import __version__
from tracestream.cli.options import MAX_EVENT_KEY, max_event_bytes_from
from tracestream.errors import SpecError, TraceError, flag_of, one_line, require_utf8


class Group(click.Group):
    """Turns library refusals into one stderr line and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            _check_utf8_arguments(ctx._protected_args + ctx.args)
            # a bad TRACESTREAM_MAX_EVENT_MB is refused before any command reads a byte
            ctx.meta[MAX_EVENT_KEY] = max_event_bytes_from(os.environ)
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
        except Terminated:
            click.echo("tracestream: terminated; no output was left behind", err=True)
            sys.exit(143)
        except Exception as exc:  # a bug: one line for unattended jobs, details on request
            if os.environ.get("TRACESTREAM_DEBUG"):
                raise
            text = one_line(exc)
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
        as_program = (args[0] if args else kwargs.get("args")) is None
        if not as_program:
            return super().main(*args, **kwargs)
        from tracestream.cli.guard import reopen_closed_streams
        from tracestream.parallel.memory import LIBC
        from tracestream.write.sink import process_ends_after_commit

        LIBC.share_arenas()  # (before any thread starts)
        reopen_closed_streams()
        with process_ends_after_commit():
            return super().main(*args, **kwargs)


def _usage_error(exc: click.exceptions.UsageError):
    """A mistyped command line is one line too, naming where the help is (click prints
    Usage, Try and Error on three)."""
    text = one_line(exc.format_message())
    where = f" (see: {exc.ctx.command_path} --help)" if exc.ctx is not None else ""
    click.echo(f"tracestream: error: {text}{where}", err=True)
    sys.exit(exc.exit_code)


def _check_utf8_arguments(args: list[str]) -> None:
    """Option text and file names end in JSON (report, trace, summary), which is UTF-8: a
    non-UTF-8 argument is refused up front, naming the option it belongs to."""
    for i, arg in enumerate(args):
        before = str(args[i - 1]) if i else ""
        require_utf8(arg, before if before.startswith("-") else f"argument {i + 1}")


class GuardedCommand(click.Command):
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


Group.command_class = GuardedCommand
Group.group_class = type  # `batch` is a Group too: its commands are guarded the same way


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so every cleanup handler runs."""


def _install_signal_handlers() -> None:
    def terminate(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, terminate)
    # a file size limit (RLIMIT_FSIZE) must fail the write, not kill the process
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # a closed stdout pipe must fail the write (EPIPE), not kill the process silently
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracestream")
def main():
    """Stream PyTorch Profiler traces; add verified layer guides and a compact GPU view."""
