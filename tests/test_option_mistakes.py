"""Options that cannot work are refused before anything is read or written: a `--compress`
that contradicts the output's name, and a trace read from stdin while stdin is a terminal."""

from __future__ import annotations

import os
import pty
import subprocess

import pytest
from conftest import ROOT, TRACESTREAM, assert_refused, run

from tracestream.errors import TraceError
from tracestream.read.compression import compression_for


@pytest.mark.parametrize("path, explicit, expected", [
    ("t.json", None, "none"), ("t.json.gz", None, "gzip"), ("t.JSON.ZST", None, "zstd"),
    ("t.json.zstd", None, "zstd"), ("t.json.gz", "gzip", "gzip"), ("t.json", "none", "none"),
    ("t.json.zst", "zstd", "zstd"), ("-", "zstd", "zstd"), ("-", None, "none"),
])
def test_the_output_name_gives_the_compression_and_an_explicit_one_agrees(path, explicit,
                                                                        expected):
    assert compression_for(path, explicit) == expected


@pytest.mark.parametrize("path, explicit, named, rename", [
    ("t.json.gz", "zstd", ".gz is gzip", "t.json.zst"),
    ("t.json.zst", "none", ".zst is zstd", "t.json"),
    ("t.json", "gzip", "no .gz or .zst: uncompressed JSON", "t.json.gz"),
])
def test_an_explicit_compression_the_name_contradicts_is_refused(path, explicit, named, rename):
    with pytest.raises(TraceError) as refused:
        compression_for(path, explicit)
    assert str(refused.value) == (f"--compress {explicit} contradicts the output name {path} "
                                  f"({named}): name it {rename} or leave --compress out")


@pytest.mark.parametrize("command", [
    ["compact", "--max-gpu-lanes", "4"],
    ["layers", "--anchor-regex", "^_q_rope_store$", "--num-layers", "8", "--anchor-offset", "0",
     "--phase", "p", "--evidence", "e"],
])
def test_a_contradicting_compress_writes_nothing(decode_trace, tmp_path, command):
    trace, _ = decode_trace
    out = tmp_path / "out.json.gz"
    result = run(*command[:1], "--trace", trace, "--output", out, "--compress", "zstd",
                 *command[1:])
    assert_refused(result, "--compress zstd contradicts the output name", out,
                   tmp_path / f"out.json.gz.{command[0]}.json")
    assert os.listdir(tmp_path) == []


def test_restore_refuses_a_contradicting_compress(tmp_path):
    sample = ROOT / "samples" / "decode_8layers.trace.json.gz"
    out = tmp_path / "restored.json"
    result = run("restore", "--trace", sample, "--output", out, "--compress", "gzip")
    assert_refused(result, "--compress gzip contradicts the output name", out)


def _with_terminal_stdin(*args: str) -> subprocess.CompletedProcess:
    """The CLI with a pseudo-terminal as its stdin, as when a person forgets the pipe."""
    controller, terminal = pty.openpty()
    try:
        return subprocess.run(TRACESTREAM + list(args), stdin=terminal, capture_output=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    finally:
        os.close(terminal)
        os.close(controller)


@pytest.mark.parametrize("args, option", [
    (["inspect", "--trace", "-"], "--trace -"),
    (["anchors", "--trace", "/dev/stdin", "--anchor-regex", "x"], "--trace /dev/stdin"),
    (["compact", "--trace", "-", "--output", "OUT"], "--trace -"),
    (["verify", "--trace", "SAMPLE", "--output", "-", "--report", "REPORT"], "--output -"),
    (["restore", "--trace", "SAMPLE", "--output", "OUT", "--report", "-"], "--report -"),
    (["batch", "layers", "--manifest", "/dev/stdin", "--output-dir", "OUT"],
     "--manifest /dev/stdin"),
])
def test_a_trace_from_a_terminal_is_refused_instead_of_waiting(tmp_path, args, option):
    sample = str(ROOT / "samples" / "decode_8layers.trace.json.gz")
    out = tmp_path / "out.json"
    args = [str(out) if a == "OUT" else sample if a == "SAMPLE" else
            str(tmp_path / "r.json") if a == "REPORT" else a for a in args]
    result = _with_terminal_stdin(*args)
    line = assert_refused(result, f"{option} reads stdin, which is a terminal", out)
    assert "pipe " in line and "or give a path" in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", [
    ["compact"], ["layers", "--anchor-regex", "^_q_rope_store$", "--num-layers", "8",
                  "--anchor-offset", "0", "--phase", "p", "--evidence", "e"],
    ["restore"],
], ids=["compact", "layers", "restore"])
def test_json_with_the_trace_on_stdout_is_refused(tmp_path, command):
    """--json's object and the trace would share stdout: one of them has to go elsewhere."""
    source = ROOT / "samples" / "decode_8layers.trace.json.gz"
    result = run(*command, "--trace", source, "--output", "-", "--report",
                 tmp_path / "r.json", "--json")
    assert_refused(result, "--output - and --json would both go to stdout; give the output a "
                           "file or drop --json", tmp_path / "r.json")
    assert result.stdout == b""
