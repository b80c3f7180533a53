"""Runs the tracestream CLI in a fresh child process per request, forked from one import.

Each request (a JSON line on stdin) forks a child that redirects its stdin,
stdout and stderr to files, changes directory, and enters `tracestream.cli:main`
exactly as the console script does; the child's exit status is the answer (a
JSON line on stdout). Only interpreter start-up and the imports are shared,
which is what makes a corpus of hundreds of CLI runs take seconds instead of
minutes. The imports include the modules the commands load lazily (the engine,
verify, restore, the evidence and batch commands): the CLI alone left every child
~0.4 s of importing (numpy, the index builder) before it read a byte. A child
that outlives its timeout is killed with its process group.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback


def _child(request: dict) -> int:
    os.setpgid(0, 0)  # the server kills the whole group (the child's workers too) on timeout
    for name, path, flags in (("stdin", request.get("stdin") or os.devnull, os.O_RDONLY),
                              ("stdout", request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                              ("stderr", request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        fd = os.open(path, flags, 0o644)
        os.dup2(fd, {"stdin": 0, "stdout": 1, "stderr": 2}[name])
        os.close(fd)
    os.chdir(request["cwd"])
    if request.get("whole_env"):
        os.environ.clear()
    os.environ.update(request.get("env") or {})
    import tempfile

    from tracestream import _native

    tempfile.tempdir = None  # TMPDIR may have changed
    # the backend as a fresh import would choose it under this run's environment
    _native.use(_native.reference if _native.built is None or os.environ.get(
        "TRACESTREAM_PURE") else _native.built)
    from tracestream.cli import main

    sys.argv = ["tracestream", *request["args"]]
    try:
        main()  # arguments from sys.argv, as the console script does
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # what an uncaught exception does to a real process
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


PRELOADED = ("tracestream.cli", "tracestream.engine", "tracestream.commands.verify",
             "tracestream.commands.restore", "tracestream.commands.evidence.inspect",
             "tracestream.commands.evidence.anchors", "tracestream.commands.batch")
"""The imports every child would otherwise repeat: the CLI, and what its commands import
when they run."""


def serve() -> None:
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)

    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(request)
            finally:
                os._exit(code)
        deadline = started + request.get("timeout", 60)
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.002)
        answer = {"rc": None if timed_out else os.waitstatus_to_exitcode(status),
                  "timed_out": timed_out, "seconds": time.monotonic() - started}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
