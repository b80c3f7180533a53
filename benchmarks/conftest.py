"""Shared inputs for the micro-benchmarks: one generated ~50 MB trace and pieces of it.

Everything is built once per session in a temporary directory (the trace takes
a few seconds to generate). Benchmarks that process bytes record their input
size with `record_throughput`, and a summary of MB/s (best round) is printed at
the end, because pytest-benchmark's table shows only times.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from samples.generate import ANCHOR, TraceConfig, generate

TRACE_BYTES = 50 << 20
CHUNK_BYTES = 4 << 20
ANCHOR_REGEX = f"^{ANCHOR}$"
_THROUGHPUT: list[tuple[str, int, float]] = []


@pytest.fixture(scope="session")
def trace_path(tmp_path_factory):
    """A generated plain-JSON trace of ~50 MB (8 layers, CUDA Graph replays, flows)."""
    path = tmp_path_factory.mktemp("bench") / "bench50.trace.json"
    generate(path, TraceConfig(size_bytes=TRACE_BYTES))
    return path


@dataclass
class Chunk:
    offset: int
    data: bytes
    count: int  # events in the chunk


@pytest.fixture(scope="session")
def chunk(trace_path) -> Chunk:
    """The first ~4 MB chunk of events, cut exactly as the index pass cuts it."""
    from tracestream.read.document import DocumentScanner
    from tracestream.read.source import TraceSource

    with TraceSource(trace_path) as source:
        scanner = DocumentScanner(source.read(), chunk_bytes=CHUNK_BYTES)
        first = next(iter(scanner.chunks()))
    return Chunk(first.offset, first.data, len(first.events))


@pytest.fixture(scope="session")
def context():
    """What the `layers` command asks each chunk to look for: the anchor pattern."""
    from tracestream.index.facts import Context

    return Context(patterns={"anchor": re.compile(ANCHOR_REGEX)})


@pytest.fixture
def record_throughput(request, benchmark):
    """Call with the bytes one round processes; MB/s of the best round is summarised."""
    holder: dict = {}

    def record(nbytes: int) -> None:
        holder["bytes"] = nbytes
        benchmark.extra_info["bytes"] = nbytes

    yield record
    stats = getattr(benchmark, "stats", None)
    if "bytes" in holder and stats is not None:
        best = stats.stats.min
        benchmark.extra_info["MB_per_s"] = holder["bytes"] / best / 1e6
        _THROUGHPUT.append((request.node.name, holder["bytes"], best))


def pytest_terminal_summary(terminalreporter):
    if not _THROUGHPUT:
        return
    terminalreporter.section("throughput (best round)")
    for name, nbytes, best in _THROUGHPUT:
        terminalreporter.write_line(
            f"{name:55s} {nbytes / 1e6:8.1f} MB in {best:7.3f} s = {nbytes / best / 1e6:7.1f} MB/s")
