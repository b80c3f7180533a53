"""Helpers of the reliability suite: CLI runs, the refusal contract, traces built byte by byte.

The contract every refusal is held to (`assert_refused`): exit code 2, exactly one
non-empty stderr line `tracestream: error: ...` that contains the expected words
and names a place (event index, byte offset, pid/tid or ts), no traceback, and an
output directory that is still empty - no output, no report, no hidden temporary
file. Every run also checks that the source's bytes did not change.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TIMEOUT = 60
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("TRACESTREAM_DEBUG", None)

FUZZ_EXAMPLES = int(os.environ.get("TRACESTREAM_FUZZ_EXAMPLES") or 0)
EXEC_EVERY_RUN = os.environ.get("TRACESTREAM_RELIABILITY_EXEC") == "1"
"""Set to 1 to run every CLI call as a fresh `python -m tracestream` (slow, thorough)."""

PLACE = re.compile(r"\b(?:event \d+|byte \d+|pid \S+ (?:tid|device) \S+|ts \S+)")
ERROR_LINE = "tracestream: error: "

TALLY: Counter = Counter()
"""What the suite did (printed at the end of the run)."""


def examples(default: int) -> int:
    """Hypothesis example count: small for `make test`, TRACESTREAM_FUZZ_EXAMPLES for fuzzing."""
    return FUZZ_EXAMPLES or default


@dataclass
class Outcome:
    rc: int | None  # None: killed after the timeout
    stdout: bytes
    stderr: str
    seconds: float
    how: str  # "exec" or "fork"

    def describe(self) -> str:
        return f"rc={self.rc} ({self.how}, {self.seconds:.2f}s) stderr={self.stderr!r}"


# -- running the CLI ------------------------------------------------------------------------


def exec_cli(args, *, cwd=None, stdin: bytes | None = None, env=None,
             timeout: float = TIMEOUT) -> Outcome:
    """`python -m tracestream ARGS` in a new process (its own session, killed on timeout)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [PYTHON, "-m", "tracestream", *map(str, args)], cwd=cwd or ROOT,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**ENV, **(env or {})},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    TALLY["cli runs (fresh process)"] += 1
    return Outcome(rc, out, err.decode(errors="replace"), time.monotonic() - started, "exec")


class ForkServers:
    """A few pre-imported interpreters that fork one child per CLI run (see forkserver.py)."""

    def __init__(self, count: int, scratch: Path):
        self._scratch = scratch
        self._idle: queue.Queue = queue.Queue()
        self._all = []
        self._seq = 0
        self._lock = threading.Lock()
        for _ in range(count):
            proc = subprocess.Popen(
                [PYTHON, str(Path(__file__).with_name("forkserver.py"))], cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV, text=True,
                start_new_session=True,
            )
            self._all.append(proc)
            self._idle.put(proc)

    def run(self, args, *, cwd=None, stdin: bytes | None = None, env=None,
            timeout: float = TIMEOUT) -> Outcome:
        answer, out, err = self.run_bytes(args, cwd=cwd, stdin=stdin, env=env, timeout=timeout)
        TALLY["cli runs (forked from a pre-imported interpreter)"] += 1
        return Outcome(answer["rc"], out, err.decode(errors="replace"), answer["seconds"],
                       "fork")

    def run_bytes(self, args, *, cwd=None, stdin: bytes | None = None, env=None,
                  timeout: float = TIMEOUT, whole_env: bool = False
                  ) -> tuple[dict, bytes, bytes]:
        """(the server's answer, stdout, stderr) of one run; `whole_env`: `env` is the
        child's whole environment, not additions to the server's."""
        with self._lock:
            self._seq += 1
            base = self._scratch / f"run{self._seq}"
        request = {"args": [str(a) for a in args], "cwd": str(cwd or ROOT),
                   "stdout": f"{base}.out", "stderr": f"{base}.err", "env": env or {},
                   "whole_env": whole_env, "timeout": timeout}
        if stdin is not None:
            Path(f"{base}.in").write_bytes(stdin)
            request["stdin"] = f"{base}.in"
        proc = self._idle.get()
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            answer = json.loads(proc.stdout.readline())
        finally:
            self._idle.put(proc)
        out = Path(f"{base}.out").read_bytes()
        err = Path(f"{base}.err").read_bytes()
        for suffix in (".out", ".err", ".in"):
            Path(f"{base}{suffix}").unlink(missing_ok=True)
        return answer, out, err

    def close(self) -> None:
        for proc in self._all:
            proc.stdin.close()
        for proc in self._all:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


class Cli:
    """The CLI as the suite runs it: forked children by default, fresh processes on request."""

    def __init__(self, servers: ForkServers | None):
        self.servers = servers

    def __call__(self, *args, fresh: bool = False, **kw) -> Outcome:
        if fresh or EXEC_EVERY_RUN or self.servers is None:
            return exec_cli(args, **kw)
        return self.servers.run(args, **kw)


# -- the refusal contract ---------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def leftovers(folder: Path) -> list[str]:
    """Everything in `folder`, hidden files included."""
    return sorted(p.name for p in Path(folder).iterdir())


def error_line(out: Outcome) -> str:
    """The single stderr line of a refusal (asserts the shape, not the exit code)."""
    assert "Traceback" not in out.stderr, out.describe()
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected exactly one stderr line: {out.describe()}"
    assert lines[0].startswith(ERROR_LINE), out.describe()
    return lines[0]


def assert_refused(out: Outcome, *fragments: str, place: bool = True,
                   empty: Path | None = None) -> str:
    """Exit 2 with one clear line naming the problem (and its place); nothing left in `empty`."""
    assert out.rc == 2, out.describe()
    line = error_line(out)
    for fragment in fragments:
        assert fragment.lower() in line.lower(), (fragment, line)
    if place:
        assert PLACE.search(line), f"the message names no place (event/byte/pid/ts): {line}"
    if empty is not None:
        assert leftovers(empty) == [], f"left behind in {empty}: {leftovers(empty)}"
    TALLY["refusals checked (exit 2, one line, nothing left)"] += 1
    return line


# -- traces written byte by byte ---------------------------------------------------------------


class Raw(str):
    """JSON text written verbatim (a number's exact digits, or something invalid on purpose)."""


class Pairs(list):
    """An object as (key, value) pairs: the only way to write duplicate keys."""


def encode(value) -> str:
    """Compact JSON with Kineto's separators; `Raw` verbatim, `Pairs` as an object."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {encode(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(encode(v) for v in value) + "]"
    return json.dumps(value)


def document(events, *, top: dict | None = None, bare: bool = False) -> bytes:
    """A trace laid out one event per line, top-level members one per line."""
    body = b",\n".join(e if isinstance(e, bytes) else encode(e).encode() for e in events)
    body = (b"\n" + body) if events else b""
    if bare:
        return b"[" + body + b"\n]\n"
    head = {"schemaVersion": 1, **(top or {})}
    members = b"".join(b"\n  " + encode(k).encode() + b": " + encode(v).encode() + b","
                       for k, v in head.items())
    tail = b'\n  ],\n  "traceName": "reliability"\n}\n'
    return b"{" + members + b'\n  "traceEvents": [' + body + tail


def kernel(name, ts, dur, *, pid=0, tid=7, device=0, cat="kernel", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": Raw(str(ts)),
            "dur": Raw(str(dur)), "args": {"device": device, "stream": tid, **args}}


def flow(ph: str, fid, ts, *, pid=0, tid=7) -> dict:
    event = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": Raw(str(ts)), "cat": "ac2g",
             "name": "ac2g"}
    if ph == "f":
        event["bp"] = "e"
    return event


def meta(name: str, pid, tid, value) -> dict:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": {key: value}}


def base_events() -> list:
    """A small valid GPU trace: 3 anchors `a`, kernels on a second stream, a CPU op, a flow.

    `layers` (LAYERS_ARGS) and `compact` both succeed on it.
    """
    return [
        meta("process_name", 0, 0, "GPU 0"),
        meta("thread_name", 0, 7, "stream 7 "),
        meta("thread_name", 0, 8, "stream 8 "),
        meta("thread_name", 1, 1, "python3"),
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": Raw("190"),
         "dur": Raw("15"), "args": {"External id": 1}},
        flow("s", 5, 195, pid=1, tid=1),
        kernel("a", 100, 10),
        kernel("b", 115, 10, tid=8),
        kernel("a", 200, 10),
        flow("f", 5, 200),
        kernel("b", 215, 10, tid=8),
        kernel("a", 300, 10),
    ]


LAYERS_ARGS = ["--anchor-regex", "^a$", "--num-layers", "2", "--anchor-offset", "0",
               "--phase", "reliability", "--evidence", "hand-built: one `a` per layer"]


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="tracestream-reliability-"))
