"""Guards of the standard streams, applied before a command reads or writes anything.

A shell can point stdout or stderr at the very file a command reads (`2<> trace.json`,
`--json-summary >> trace.json`, `batch compact t.json >> t.json`): the text written there
would overwrite or extend that file. These checks compare inodes before any work is done.
"""

from __future__ import annotations

import os
import sys

from tracestream.sink import input_identity, refuse_writing_input

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
