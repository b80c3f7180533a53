"""How big a trace is before it is read, and the worker pool that size calls for."""

from __future__ import annotations

import os

from tracestream.parallel.pool import SLOTS_PER_WORKER, InlinePool, WorkerPool, default_workers
from tracestream.parallel.slots import WRITER_HOLDS
from tracestream.read.compression import detect_compression
from tracestream.read.document import CHUNK_BYTES
from tracestream.read.source import is_stream_path

SLOT_BYTES = 2 * CHUNK_BYTES
"""A rewritten chunk grows by its relocated events' provenance: twice a chunk holds any
(a larger chunk goes through the pipe)."""
PARALLEL_MIN_BYTES = 48 << 20
"""Inputs smaller than this (decompressed) are processed in one process: forking costs more."""
_COMPRESSION_RATIO = 8  # a gzip/zstd trace file holds roughly this many times its size


def expected_size(path: str | None) -> int | None:
    """Roughly how many bytes the trace holds once decompressed (None: unknown, stdin)."""
    if path in (None, "-") or is_stream_path(path):  # a pipe: opening it would consume it
        return None
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return None
    compressed = detect_compression(head) != "none"
    return size * _COMPRESSION_RATIO if compressed else size


def pool_for(path: str | None, workers: int | None):
    """A worker pool when it pays off: `workers` processes for a large file, else inline.

    `workers=0` forces one process; None picks by the input size (stdin: parallel).
    """
    if workers is None:
        size = expected_size(path)
        workers = default_workers() if (size is None or size >= PARALLEL_MIN_BYTES) else 0
    if workers <= 0:
        return InlinePool()
    return WorkerPool(workers, slots=SLOTS_PER_WORKER * workers + 1 + WRITER_HOLDS,
                      slot_bytes=SLOT_BYTES)
