"""Guards of the standard streams, applied before a command reads or writes anything.

A shell can point stdout or stderr at the very file a command reads (`2<> trace.json`,
`--json >> trace.json`, `batch compact t.json >> t.json`): the text written there
would overwrite or extend that file. These checks compare inodes before any work is done.
"""

from __future__ import annotations

import os
import sys

from tracestream.write.sink import input_identity, refuse_writing_input

PATH_PARAMS = ("trace", "output", "report", "manifest", "traces")
"""Command parameters that name files a command reads (or must never overwrite)."""


def named_files(params: dict) -> list[str]:
    """The file names among a command's parsed parameters (`-` stands for stdin)."""
    names = []
    for key in PATH_PARAMS:
        value = params.get(key)
        if isinstance(value, str):
            names.append(value)
        elif isinstance(value, (list, tuple)):
            names.extend(v for v in value if isinstance(v, str))
    return names


def stderr_is_one_of(names: list[str]) -> bool:
    """Whether stderr is a regular file that is one of `names` (or stdin, for `-`)."""
    try:
        st = os.fstat(2)
    except OSError:  # stderr closed: nothing can be written onto a file through it
        return False
    return any(input_identity(name) == (st.st_dev, st.st_ino) for name in names)


def silence_and_refuse() -> None:
    """stderr is a file the command reads: not one byte may go there, not even the refusal
    (it would overwrite that file), so the exit code 2 says it alone."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.exit(2)


def refuse_stdout_on_inputs(traces, what: str) -> None:
    """stdout carries `what` (a JSON summary, batch's result lines): refused when it is one
    of the traces read, with the message of an output on the input."""
    for trace in traces:
        refuse_writing_input(input_identity(trace), "-", what, trace)


CLOSED: set[str] = set()
"""The standard streams the program was started without (`<&-`, `>&-`, `2>&-`)."""

_STREAMS = (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w"))
_STDIN_NAMES = ("-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")
_SILENT_COMMANDS = {"layers", "compact", "restore"}
"""Commands that print nothing on stdout unless a file is `-` or --json is given."""


def reopen_closed_streams() -> None:
    """Put /dev/null on every standard descriptor the program was started without.

    Otherwise the next pipe or file opened lands on it (a worker's pipe on fd 0 makes
    `--trace /dev/stdin` read the program's own pipe and wait forever). A closed stderr
    then takes the messages silently and the run goes on; stdin and stdout stay None in
    Python, so the commands that need them are refused by `refuse_closed_streams`.
    """
    for name, fd, mode in _STREAMS:
        if getattr(sys, name) is not None:
            continue
        CLOSED.add(name)
        try:
            os.fstat(fd)
            continue  # already taken by something else: left alone
        except OSError:
            pass
        devnull = os.open(os.devnull, os.O_RDWR)
        if devnull != fd:
            os.dup2(devnull, fd)
            os.close(devnull)
        if name == "stderr":
            sys.stderr = open(fd, mode, closefd=False)  # noqa: SIM115 (lives as long as the program)


def _is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):  # closed or detached
        return False


def refuse_closed_streams(command: str, params: dict) -> None:
    """A command that reads stdin or prints on stdout, started with that stream closed, or
    that would read a trace from stdin while a person types there (it would wait silently)."""
    from tracestream.errors import TraceError

    reads = {"--trace": params.get("trace"), "--manifest": params.get("manifest")}
    if command == "verify":
        reads["--output"] = params.get("output")
    if command in ("verify", "restore"):
        reads["--report"] = params.get("report")
    option, named = next(((o, n) for o, n in reads.items() if n in _STDIN_NAMES), (None, None))
    if named is not None and "stdin" in CLOSED:
        raise TraceError(f"stdin is closed (<&-): {named} has nothing to read; "
                         "nothing was read or written")
    if named is not None and _is_terminal(sys.stdin):
        what = "a trace" if option in ("--trace", "--output") else "one"
        raise TraceError(f"{option} {named} reads stdin, which is a terminal: pipe {what} in "
                         f"(... | tracestream {command} {option} - ...) or give a path")
    if "stdout" in CLOSED:
        prints = (command.split()[0] not in _SILENT_COMMANDS
                  or params.get("json_summary") or params.get("as_json")
                  or (command != "restore" and params.get("report") == "-")
                  or (command != "verify" and params.get("output") == "-"))
        if prints:
            raise TraceError(f"stdout is closed (>&-): `{command}` writes there; "
                             "nothing was read or written")
