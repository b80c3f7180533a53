"""Shared fixtures: generated traces, the real traces in ../shared, CLI runs, verification.

Every successful rewrite in the suite goes through `assert_verified`, which runs
the same `verify` code path a user runs, and `restore`, whose output must be the
source's (decompressed) bytes exactly, as `cmp` compares them.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from samples.generate import TraceConfig, generate
from tracestream import _native

ROOT = Path(__file__).resolve().parents[1]
REAL_TRACES = ROOT.parent / "shared" / "real-traces"
TRACESTREAM = [sys.executable, "-m", "tracestream"]
ANCHOR = "^_q_rope_store$"
TERMINAL = r"moe_finalize_all_reduce_kernel<4u, 5120u, 6u>"
REAL_WITH_GPU = [
    "hta_train_6streams.json.gz",
    "hta_sampled_rank0_5streams.json.gz",
    "hta_nccl_gpu_scopes.json.gz",
    "hta_cuda_sync_multistream.json.gz",
    "hta_rocm_mi250.json.gz",
    "hta_legacy_categories.json.gz",
    "hta_triton_single_kernel.json.gz",
]


@pytest.fixture(params=["C", "numpy"])
def backend(request) -> Iterator[str]:
    """Run a test with the C extension, then with the numpy code it mirrors (the
    workers are forked, so they run the same)."""
    if request.param == "C" and _native.built is None:
        # test_speedups.test_the_extension_is_built fails
        pytest.skip("tracestream._native._speedups is not built")
    previous = _native.chosen
    _native.use(_native.built if request.param == "C" else _native.reference)
    try:
        yield request.param
    finally:
        _native.use(previous)


def real_trace(name: str) -> Path:
    path = REAL_TRACES / name
    if not path.exists():
        pytest.skip(f"real trace {name} not available (../shared/real-traces is absent)")
    return path


EXEC_EVERY_RUN = os.environ.get("TRACESTREAM_TESTS_EXEC") == "1"
"""Set to 1 to run every `run` as a fresh `python -m tracestream` (slower: ~0.5 s of
start-up and imports each)."""
_fork_servers = []


def run(*args, stdin: bytes | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run the CLI as a user does (a new process), capturing bytes.

    The process is forked from an interpreter that has imported tracestream already
    (tests/reliability/forkserver.py), with this process's environment and working
    directory; its stdout and stderr are files, read back as bytes. A run given `stdin`
    is a fresh `python -m tracestream` reading a pipe, as `cmd | tracestream ...` does
    (a pipe is read otherwise than a file: spooled). TRACESTREAM_TESTS_EXEC=1: every run
    is a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if stdin is not None or EXEC_EVERY_RUN:
        return subprocess.run(
            TRACESTREAM + [str(a) for a in args], input=stdin, capture_output=True, cwd=cwd,
            env=env, timeout=600,
        )
    if not _fork_servers:
        from reliability.support import ForkServers, scratch_dir

        _fork_servers.append(ForkServers(1, scratch_dir()))
    answer, out, err = _fork_servers[0].run_bytes(
        args, cwd=cwd or os.getcwd(), env=env, whole_env=True, timeout=600)
    command = TRACESTREAM + [str(a) for a in args]
    if answer["rc"] is None:
        raise subprocess.TimeoutExpired(command, 600, out, err)
    return subprocess.CompletedProcess(command, answer["rc"], out, err)


def pytest_sessionfinish(session):
    import shutil

    for servers in _fork_servers:
        servers.close()
        shutil.rmtree(servers._scratch, ignore_errors=True)


def assert_refused(result: subprocess.CompletedProcess, fragment: str, *left_out: Path) -> str:
    """Exit 2, one line on stderr containing `fragment`, no traceback, nothing written."""
    stderr = result.stderr.decode()
    assert result.returncode == 2, (result.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert fragment.lower() in lines[0].lower(), lines[0]
    for path in left_out:
        assert not Path(path).exists(), f"{path} was left behind"
        folder = Path(path).parent
        if folder.is_dir():
            hidden = f".{Path(path).name}"
            leftovers = [p for p in folder.iterdir() if p.name.startswith(hidden)]
            assert not leftovers, leftovers
    return lines[0]


def read_bytes(path: Path) -> bytes:
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        return gzip.decompress(data)
    if data[:4] == b"\x28\xb5\x2f\xfd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    return data


def load_exact(path: Path):
    """The whole trace via the standard library, floats kept as their text."""
    return json.loads(read_bytes(path), parse_float=lambda text: ("float", text))


def events_of(doc):
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def assert_verified(source: Path, output: Path, report: Path | None = None) -> dict:
    """verify exits 0, and restore gives back the source's (decompressed) bytes exactly."""
    from tracestream.commands.restore import restore
    from tracestream.commands.verify import verify

    verdict = verify(source, output, report)
    assert verdict.ok, verdict.summary()
    restored = Path(str(output) + ".restored.json")
    if restored.exists():
        restored.unlink()
    restore(output, restored, report)
    try:
        assert_same_bytes(restored, source)
    finally:
        restored.unlink()
    return verdict.to_json()


def assert_same_bytes(restored: Path, source: Path) -> None:
    """`cmp` of the two, both decompressed, is silent (else: where they first differ)."""
    back, original = read_bytes(restored), read_bytes(source)
    if back != original:
        at = next((i for i, (a, b) in enumerate(zip(back, original)) if a != b),
                  min(len(back), len(original)))
        raise AssertionError(
            f"restored {restored} differs from the source {source} at byte {at} "
            f"({len(back)} vs {len(original)} bytes): {back[at - 40 : at + 40]!r} vs "
            f"{original[at - 40 : at + 40]!r}")


@pytest.fixture(scope="session")
def traces(tmp_path_factory):
    """Generated traces shared by many tests, made once per session."""
    folder = tmp_path_factory.mktemp("generated")
    made = {}

    def make(name: str, **config) -> tuple[Path, object]:
        if name not in made:
            path = folder / name
            made[name] = (path, generate(path, TraceConfig(**config)))
        return made[name]

    return make


@pytest.fixture
def decode_trace(traces):
    """6 decode steps x (8 target layers + 1 extra anchor), draft passes, plain JSON."""
    return traces("decode6.json", iterations=6)


def layers_args(trace, output, *extra, passes=6, offset=0):
    return ["layers", "--trace", trace, "--output", output, "--anchor-regex", ANCHOR,
            "--num-layers", "8", "--anchor-offset", str(offset), "--passes", str(passes),
            "--extra-anchors-per-pass", "1", "--phase", "target-verify",
            "--evidence", "generator: one _q_rope_store per layer, one extra per pass", *extra]
