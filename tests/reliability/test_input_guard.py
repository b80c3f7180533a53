"""The source is never destroyed: no destination may be the input file, by any name.

`1<> trace.json`, `>> trace.json`, a hard link or stdin and stdout on the same file:
each is refused before a byte is read or written, exit 2, one line, the source's
bytes unchanged and nothing left beside it. And the stdin spool has no name, so
even SIGKILL leaves nothing in $TMPDIR.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from .support import (
    ENV,
    LAYERS_ARGS,
    PYTHON,
    ROOT,
    Outcome,
    assert_refused,
    base_events,
    document,
    leftovers,
    sha256,
)


def run_with_stdout(args, stdout_file: Path, mode: str, *, stdin_file: Path | None = None):
    """The CLI with stdout opened on `stdout_file` as a shell would (`r+b`: `1<>`,
    `ab`: `>>`), and stdin from `stdin_file` (`<`) when given."""
    stdin = open(stdin_file, "rb") if stdin_file else subprocess.DEVNULL
    with open(stdout_file, mode) as out:
        started = time.monotonic()
        proc = subprocess.run([PYTHON, "-m", "tracestream", *map(str, args)], cwd=ROOT,
                              stdin=stdin, stdout=out, stderr=subprocess.PIPE, env=ENV,
                              timeout=60)
    if stdin_file:
        stdin.close()
    return Outcome(proc.returncode, b"", proc.stderr.decode(errors="replace"),
                   time.monotonic() - started, "exec")


@pytest.fixture
def source(tmp_path) -> Path:
    """A valid trace alone in its own folder (so leftovers beside it are visible)."""
    folder = tmp_path / "src"
    folder.mkdir()
    path = folder / "trace.json"
    path.write_bytes(document(base_events()))
    return path


def _command(kind: str, trace, output, report) -> list:
    args = [kind, "--trace", trace, "--output", output, "--report", report, "--quiet"]
    return args + LAYERS_ARGS if kind == "layers" else args


def _assert_source_kept(out: Outcome, source: Path, before: str, *fragments: str) -> None:
    assert_refused(out, "is the input trace", "nothing was read or written", *fragments,
                   place=False)
    assert sha256(source) == before


@pytest.mark.parametrize("mode", ["r+b", "ab"], ids=["1<>", ">>"])
@pytest.mark.parametrize("kind", ["compact", "layers"])
def test_stdout_on_the_input_is_refused(source, tmp_path, mode, kind):
    before = sha256(source)
    out = run_with_stdout(_command(kind, source, "-", tmp_path / "r.json"), source, mode)
    _assert_source_kept(out, source, before, "output (stdout)")
    assert not (tmp_path / "r.json").exists()
    assert leftovers(source.parent) == ["trace.json"]


def test_stdout_on_a_hard_link_of_the_input_is_refused(source, tmp_path):
    link = source.parent / "trace-link.json"
    os.link(source, link)
    before = sha256(source)
    out = run_with_stdout(_command("compact", source, "-", tmp_path / "r.json"), link, "ab")
    _assert_source_kept(out, source, before, "output (stdout)")
    assert leftovers(source.parent) == ["trace-link.json", "trace.json"]


def test_stdin_and_stdout_on_the_same_file_are_refused(source, tmp_path):
    before = sha256(source)
    out = run_with_stdout(_command("compact", "-", "-", tmp_path / "r.json"), source, "ab",
                          stdin_file=source)
    _assert_source_kept(out, source, before, "input trace stdin")
    assert leftovers(source.parent) == ["trace.json"]


def test_report_on_stdout_that_is_the_input_is_refused(source, tmp_path):
    before = sha256(source)
    out = run_with_stdout(_command("compact", source, tmp_path / "o.json", "-"), source, "ab")
    _assert_source_kept(out, source, before, "report (stdout)")
    assert leftovers(tmp_path) == ["src"]


def test_report_on_a_hard_link_of_the_input_is_refused(source, tmp_path, cli):
    link = tmp_path / "link.json"
    os.link(source, link)
    before = sha256(source)
    out = cli(*_command("compact", source, tmp_path / "o.json", link))
    _assert_source_kept(out, source, before, f"report ({link})")
    assert leftovers(tmp_path) == ["link.json", "src"]


@pytest.mark.parametrize("kind", ["restore", "inspect", "verify"])
def test_printing_onto_the_trace_read_is_refused(source, tmp_path, cli, kind):
    """restore --output -, inspect and verify print to stdout: never onto what they read."""
    annotated = tmp_path / "o.json"
    assert cli(*_command("compact", source, annotated, tmp_path / "o.json.compact.json")).rc == 0
    before = sha256(annotated)
    args = {"restore": ["restore", "--trace", annotated, "--output", "-"],
            "inspect": ["inspect", "--trace", annotated],
            "verify": ["verify", "--trace", source, "--output", annotated]}[kind]
    out = run_with_stdout(args, annotated, "ab")
    assert_refused(out, "is the input trace", str(annotated), place=False)
    assert sha256(annotated) == before
    assert leftovers(tmp_path) == ["o.json", "o.json.compact.json", "src"]


@pytest.mark.parametrize("mode", ["r+b", "ab"], ids=["1<>", ">>"])
@pytest.mark.parametrize("kind", ["compact", "layers"])
def test_json_summary_onto_the_input_is_refused(source, tmp_path, mode, kind):
    before = sha256(source)
    args = _command(kind, source, tmp_path / "o.json", tmp_path / "r.json") + ["--json"]
    out = run_with_stdout(args, source, mode)
    _assert_source_kept(out, source, before, "JSON summary (stdout)")
    assert leftovers(tmp_path) == ["src"]


def test_batch_result_lines_onto_an_input_are_refused(source, tmp_path):
    before = sha256(source)
    out = run_with_stdout(["batch", "compact", "--output-dir", tmp_path / "out", "--jobs", "1",
                           source], source, "ab")
    _assert_source_kept(out, source, before, "result lines (stdout)")
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("kind", ["compact", "layers"])
@pytest.mark.parametrize("streams", [["--output", "-", "--report", "-"],
                                     ["--report", "-", "--json"]],
                         ids=["output-and-report", "report-and-summary"])
def test_two_documents_on_stdout_are_refused(source, tmp_path, cli, kind, streams):
    """stdout carries one JSON document: the trace, the report or the summary."""
    args = [kind, "--trace", source, "--quiet", *streams]
    if "--output" not in streams:
        args += ["--output", tmp_path / "o.json"]
    out = cli(*args + (LAYERS_ARGS if kind == "layers" else []))
    assert out.stdout == b""
    assert_refused(out, "would both go to stdout", place=False)
    assert leftovers(tmp_path) == ["src"]


def run_with_stderr(args, stderr_file: Path, mode: str) -> int:
    """The CLI's exit code with stderr opened on `stderr_file` (`2<>` or `2>>`)."""
    with open(stderr_file, mode) as err:
        return subprocess.run([PYTHON, "-m", "tracestream", *map(str, args)], cwd=ROOT,
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                              env=ENV, timeout=60).returncode


@pytest.mark.parametrize("mode", ["r+b", "ab"], ids=["2<>", "2>>"])
@pytest.mark.parametrize("kind", ["compact", "layers", "inspect", "batch"])
def test_stderr_onto_the_input_is_refused_without_a_word(source, tmp_path, mode, kind):
    """Even the refusal would overwrite the source: exit 2 says it, nothing is written."""
    before = sha256(source)
    args = {"inspect": ["inspect", "--trace", source],
            "batch": ["batch", "compact", "--output-dir", tmp_path / "out", source]}.get(kind)
    args = args or [a for a in _command(kind, source, tmp_path / "o.json", tmp_path / "r.json")
                    if a != "--quiet"]
    assert run_with_stderr(args, source, mode) == 2
    assert sha256(source) == before
    assert leftovers(tmp_path) == ["src"]


def _spool_descriptor(pid: int, folder: Path) -> bool:
    """Whether process `pid` holds a file in `folder` open (the stdin spool)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith(str(folder) + "/"):
                return True
        except OSError:
            continue
    return False


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_sigkill_while_spooling_stdin_leaves_nothing_in_tmpdir(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    data = document(base_events())
    proc = subprocess.Popen(
        [PYTHON, "-m", "tracestream", "compact", "--trace", "-", "--output", tmp_path / "o.json",
         "--quiet"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, env={**ENV, "TMPDIR": str(tmpdir)})
    try:
        proc.stdin.write(data[: len(data) // 2])  # the rest never comes: the spool stays open
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while not _spool_descriptor(proc.pid, tmpdir):
            assert time.monotonic() < deadline, "the spool was never opened"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
    assert proc.returncode == -signal.SIGKILL
    assert leftovers(tmpdir) == []
    assert leftovers(tmp_path) == ["tmp"]
