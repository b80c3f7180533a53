"""No hangs and no internal errors: pipes by any name, odd options, extreme values.

A named pipe, `<(...)` (/dev/fd/N) and /dev/stdin are read like stdin. Every odd
option or value below ends in one line and exit 2 (never 70, never a traceback),
or is simply handled; a zstd stream that opens with a skippable frame is zstd;
`verify` works at every timestamp the index accepts; one event longer than the
single-event limit is refused before it fills memory.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zstandard

from .support import (
    ENV,
    LAYERS_ARGS,
    PYTHON,
    ROOT,
    Outcome,
    Raw,
    assert_refused,
    base_events,
    document,
    leftovers,
    meta,
)

TRACE = document(base_events())


def run(args, *, pass_fds=(), stdin=None, env=None, timeout: float = 60) -> Outcome:
    """The CLI in a new process; `args` may hold bytes (arguments that are not UTF-8)."""
    started = time.monotonic()
    proc = subprocess.run([PYTHON, "-m", "tracestream", *args], cwd=ROOT, pass_fds=pass_fds,
                          stdin=stdin if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, env={**ENV, **(env or {})}, timeout=timeout)
    return Outcome(proc.returncode, proc.stdout, proc.stderr.decode(errors="replace"),
                   time.monotonic() - started, "exec")


def compact_args(trace, output) -> list:
    return ["compact", "--trace", str(trace), "--output", str(output), "--quiet"]


@pytest.fixture
def plain_output(tmp_path) -> bytes:
    """What `compact` writes for TRACE read from a regular file (output named o.json)."""
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "t.json").write_bytes(TRACE)
    assert run(compact_args(folder / "t.json", folder / "o.json")).rc == 0
    return (folder / "o.json").read_bytes()


def _feed(path_or_fd, data: bytes) -> threading.Thread:
    def write():
        if isinstance(path_or_fd, int):
            with os.fdopen(path_or_fd, "wb") as fh:
                fh.write(data)
        else:
            with open(path_or_fd, "wb") as fh:
                fh.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_a_named_pipe_is_read_like_stdin(tmp_path, plain_output):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    writer = _feed(fifo, TRACE)
    result = run(compact_args(fifo, out_dir / "o.json"), timeout=30)
    writer.join(5)
    assert result.rc == 0, result.describe()
    assert (out_dir / "o.json").read_bytes() == plain_output


def test_process_substitution_is_read_like_stdin(tmp_path, plain_output):
    """`--trace <(zcat t.json.gz)`: the shell passes /dev/fd/N of a pipe."""
    read_end, write_end = os.pipe()
    writer = _feed(write_end, TRACE)
    try:
        result = run(compact_args(f"/dev/fd/{read_end}", tmp_path / "o.json"),
                     pass_fds=(read_end,), timeout=30)
    finally:
        os.close(read_end)
    writer.join(5)
    assert result.rc == 0, result.describe()
    assert (tmp_path / "o.json").read_bytes() == plain_output


def test_dev_stdin_from_a_pipe_is_read_like_stdin(tmp_path, plain_output):
    proc = subprocess.run([PYTHON, "-m", "tracestream", *compact_args("/dev/stdin",
                                                                       tmp_path / "o.json")],
                          cwd=ROOT, input=TRACE, capture_output=True, env=ENV, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "o.json").read_bytes() == plain_output


def test_a_pzstd_stream_starting_with_a_skippable_frame_is_zstd(tmp_path, plain_output):
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"pzst"
    trace = tmp_path / "t.json.zst"
    trace.write_bytes(skippable + zstandard.ZstdCompressor().compress(TRACE))
    result = run(compact_args(trace, tmp_path / "o.json"))
    assert result.rc == 0, result.describe()
    assert (tmp_path / "o.json").read_bytes() == plain_output
    inspected = run(["inspect", "--trace", str(trace), "--json"])
    assert inspected.rc == 0, inspected.describe()


# -- odd options: one line, exit 2 ------------------------------------------------------------


@pytest.fixture
def source(tmp_path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    path = folder / "trace.json"
    path.write_bytes(TRACE)
    return path


@pytest.mark.parametrize("suffix, level, words", [
    (".json.gz", "0", "out of range for gzip (1-9)"),
    (".json.gz", "10", "out of range for gzip (1-9)"),
    (".json.zst", "0", "out of range for zstd (1-22)"),
    (".json.zst", "23", "out of range for zstd (1-22)"),
    (".json.zst", "99999999999999999999", "out of range for zstd (1-22)"),
])
@pytest.mark.parametrize("kind", ["compact", "restore"])
def test_compress_level_out_of_range(cli, source, tmp_path, suffix, level, words, kind):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    trace = source
    if kind == "restore":
        trace = tmp_path / "annotated.json"
        assert cli(*compact_args(source, trace)).rc == 0
    out = cli(kind, "--trace", trace, "--output", out_dir / f"o{suffix}", "--compress-level",
              level)
    assert_refused(out, f"--compress-level {level}", words, place=False, empty=out_dir)


@pytest.mark.parametrize("option", ["--first-layer", "--num-layers", "--anchor-offset",
                                    "--passes", "--anchor-stride", "--extra-anchors-per-pass"])
@pytest.mark.parametrize("value", ["2147483648", "99999999999999999999"])
def test_huge_layer_numbers(cli, source, tmp_path, option, value):
    args = list(LAYERS_ARGS)
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    out = cli("layers", "--trace", source, "--output", tmp_path / "o.json", "--quiet", *args)
    assert_refused(out, f"{option} must be <= 2147483647, got {value}", place=False)
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("option", ["--phase", "--evidence", "--anchor-regex", "--output"])
def test_non_utf8_option_text(source, tmp_path, option):
    args = [b"layers", b"--trace", bytes(source), b"--output", bytes(tmp_path / "o.json"),
            b"--quiet", *[a.encode() for a in LAYERS_ARGS]]
    at = args.index(option.encode()) + 1
    args[at] = b"bad-\xff-" + (b"" if option != "--output" else bytes(tmp_path / "x.json"))
    out = run(args)
    assert_refused(out, f"{option} is not valid UTF-8", place=False)
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("folder", ["/proc", "/sys"])
def test_outputs_under_proc_or_sys(cli, source, tmp_path, folder):
    if not Path(folder).is_dir():
        pytest.skip(f"no {folder} here")
    out = cli(*compact_args(source, f"{folder}/tracestream-test.json"), "--report",
              tmp_path / "r.json")
    assert_refused(out, folder, place=False)
    assert leftovers(tmp_path) == ["src"]
    assert not Path(f"{folder}/tracestream-test.json").exists()


@pytest.mark.parametrize("value", ["9223372036854775807", "-9223372036854775808",
                                   "18446744073709551615"])
@pytest.mark.parametrize("name", ["thread_sort_index", "process_sort_index"])
def test_sort_index_at_integer_extremes(cli, tmp_path, name, value):
    """New rows sort next to an existing index at the int64/uint64 extremes without
    overflowing: the written indices stay within int64 and `verify` passes."""
    tid = 7 if name == "thread_sort_index" else 0
    trace = tmp_path / "t.json"
    trace.write_bytes(document(base_events() + [meta(name, 0, tid, Raw(value))]))
    for kind, extra in (("layers", LAYERS_ARGS + ["--max-gpu-lanes", "2"]), ("compact", [])):
        output = tmp_path / f"{kind}.json"
        out = cli(kind, "--trace", trace, "--output", output, "--quiet", *extra)
        assert out.rc == 0, out.describe()
        written = json.loads(output.read_bytes())["traceEvents"]
        indices = [e["args"]["sort_index"] for e in written
                   if e["name"].endswith("sort_index") and (e["pid"], e["tid"]) != (0, tid)]
        assert indices and all(-(2**63) <= i < 2**63 for i in indices), indices
        verdict = cli("verify", "--trace", trace, "--output", output)
        assert verdict.rc == 0, verdict.describe()


def test_verify_at_timestamps_beyond_4_6e15_us(cli, tmp_path):
    """verify sorted flow keys as 2 x ns, which overflowed int64 from 4.6e15 µs."""
    base = 9_000_000_000_000_000  # µs; the index accepts up to 9.2e15
    events = []
    for event in base_events():
        if event.get("ph") != "M":
            event = {**event, "ts": Raw(str(base + int(str(event["ts"]))))}
        events.append(event)
    trace = tmp_path / "t.json"
    trace.write_bytes(document(events))
    for kind, extra in (("compact", []), ("layers", LAYERS_ARGS + ["--max-gpu-lanes", "2"])):
        output = tmp_path / f"{kind}.json"
        assert cli(kind, "--trace", trace, "--output", output, "--quiet", *extra).rc == 0
        verdict = cli("verify", "--trace", trace, "--output", output)
        assert verdict.rc == 0, verdict.describe()
        assert "verified: all checks hold" in verdict.stdout.decode()


def _with_long_event(size: int) -> bytes:
    events = base_events()
    events.insert(4, {"ph": "X", "cat": "cpu_op", "name": "long", "pid": 1, "tid": 1,
                      "ts": Raw("150"), "dur": Raw("1"), "args": {"blob": "x" * size}})
    return document(events)


def test_an_event_longer_than_the_limit_is_refused(cli, tmp_path):
    trace = tmp_path / "src" / "t.json"
    trace.parent.mkdir()
    trace.write_bytes(_with_long_event(4 << 20))
    limit = {"TRACESTREAM_MAX_EVENT_MB": "1"}
    for kind in ("compact", "inspect"):
        args = compact_args(trace, tmp_path / "o.json") if kind == "compact" else [
            "inspect", "--trace", trace]
        out = cli(*args, env=limit)
        assert_refused(out, "is longer than 1 MiB, the limit for one event",
                       "TRACESTREAM_MAX_EVENT_MB")
        assert leftovers(tmp_path) == ["src"]
    out = cli(*compact_args(trace, tmp_path / "o.json"))  # the default limit: 64 MiB
    assert out.rc == 0, out.describe()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400", "1"])
@pytest.mark.parametrize("kind", ["layers", "anchors", "batch layers"])
def test_a_gap_factor_that_is_not_finite_is_refused(cli, tmp_path, kind, value):
    """inf made no gap a break and recorded null in the report (verify then failed)."""
    folder = tmp_path / "src"
    folder.mkdir()
    trace = folder / "t.json"
    trace.write_bytes(document(base_events()))
    manifest = folder / "m.jsonl"
    manifest.write_text(json.dumps({"trace": "t.json"}) + "\n")
    args = {"layers": ["layers", "--trace", trace, "--output", tmp_path / "o.json",
                       *LAYERS_ARGS],
            "anchors": ["anchors", "--trace", trace, "--anchor-regex", "^a$"],
            "batch layers": ["batch", "layers", "--manifest", manifest, "--output-dir",
                             tmp_path / "out", *LAYERS_ARGS]}[kind]
    out = cli(*args, "--gap-factor", value)
    assert out.stdout == b""
    assert_refused(out, "gap-factor must be > 1" if kind != "batch layers" else
                   "gap_factor must be > 1", place=False)
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1", "lots"])
@pytest.mark.parametrize("kind", ["compact", "inspect", "verify"])
def test_a_max_event_setting_that_is_not_a_positive_number_is_refused(cli, tmp_path, kind,
                                                                      value):
    """inf and nan crashed every command (exit 70); 0 and -1 became a 1-byte limit."""
    trace = tmp_path / "src" / "t.json"
    trace.parent.mkdir()
    trace.write_bytes(document(base_events()))
    args = {"compact": compact_args(trace, tmp_path / "o.json"),
            "inspect": ["inspect", "--trace", trace],
            "verify": ["verify", "--trace", trace, "--output", trace]}[kind]
    out = cli(*args, env={"TRACESTREAM_MAX_EVENT_MB": value})
    assert out.stdout == b""
    assert_refused(out, f"TRACESTREAM_MAX_EVENT_MB='{value}'", "takes a positive number",
                   place=False)
    assert leftovers(tmp_path) == ["src"]


def run_with_closed(args, closed: str, *, timeout: float = 60) -> Outcome:
    """The CLI started with a standard stream closed, as `<&-`, `>&-` or `2>&-` do."""
    started = time.monotonic()
    proc = subprocess.run(["sh", "-c", f'exec "$0" -m tracestream "$@" {closed}', PYTHON,
                           *map(str, args)], cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, env=ENV, timeout=timeout)
    return Outcome(proc.returncode, proc.stdout, proc.stderr.decode(errors="replace"),
                   time.monotonic() - started, "exec")


@pytest.fixture
def small_trace(tmp_path) -> Path:
    trace = tmp_path / "src" / "t.json"
    trace.parent.mkdir()
    trace.write_bytes(document(base_events()))
    return trace


@pytest.mark.parametrize("trace", ["-", "/dev/stdin"])
@pytest.mark.parametrize("kind", ["inspect", "compact", "layers"])
def test_reading_a_closed_stdin_is_refused(small_trace, tmp_path, kind, trace):
    """/dev/stdin with fd 0 closed used to open the program's own pipe and wait forever."""
    args = {"inspect": ["inspect", "--trace", trace],
            "compact": ["compact", "--trace", trace, "--output", tmp_path / "o.json"],
            "layers": ["layers", "--trace", trace, "--output", tmp_path / "o.json",
                       *LAYERS_ARGS]}[kind]
    out = run_with_closed(args, "<&-", timeout=30)
    assert_refused(out, f"stdin is closed (<&-): {trace} has nothing to read", place=False)
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("args", [
    ["inspect"], ["compact", "--output", "-", "--report", "{tmp}/r.json"],
    ["compact", "--output", "{tmp}/o.json", "--json-summary"],
    ["restore", "--output", "-"], ["batch", "compact", "--output-dir", "{tmp}/out"],
    ["restore", "--output", "{tmp}/back.json", "--json"],
], ids=["inspect", "output-", "json-summary", "restore-", "batch", "restore-json"])
def test_printing_on_a_closed_stdout_is_refused(small_trace, tmp_path, args):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if args[0] == "batch":
        args.append(small_trace)
    else:
        args[1:1] = ["--trace", small_trace]
    out = run_with_closed(args, ">&-")
    assert_refused(out, "stdout is closed (>&-)", place=False)
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("kind", ["compact", "layers"])
def test_a_closed_stdout_or_stderr_does_not_lose_a_good_run(small_trace, tmp_path, kind):
    for closed, name in ((">&-", "a"), ("2>&-", "b")):
        output = tmp_path / f"{name}.json"
        args = [kind, "--trace", small_trace, "--output", output]
        out = run_with_closed(args + (LAYERS_ARGS if kind == "layers" else []), closed)
        assert out.rc == 0, out.describe()
        assert output.exists() and Path(f"{output}.{kind}.json").exists()


@pytest.mark.parametrize("args, words", [
    (["layers", "--bogus"], "No such option '--bogus'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["--bogus"], "No such option '--bogus'"),
    (["compact", "--trace", "t.json"], "Missing option '--output'"),
    (["batch", "compact", "--max-gpu-lanes", "x", "t.json"], "'x' is not a valid integer"),
])
def test_a_mistyped_command_line_is_one_line(cli, args, words):
    """click prints Usage, Try and Error on three lines; unattended jobs grep for one."""
    line = assert_refused(cli(*args), words, place=False)
    assert "--help" in line
