"""The rewrite of one chunk: copying unchanged bytes and splicing relocated events.

The plan comes from a real `layers --max-gpu-lanes 10` plan of the generated
trace, so the chunk carries the edits the rewrite pass really makes (most GPU
events relocated, stream metadata retired).
"""

import pytest

from benchmarks.conftest import ANCHOR_REGEX
from tracestream.engine import build_plan
from tracestream.plan.specs import CompactSpec, LayerSpec
from tracestream.read.source import TraceSource, read_span
from tracestream.write.rewrite import chunk_edits, rewrite_chunk


@pytest.fixture(scope="module")
def edited_chunk(trace_path):
    """(data, offset, rows, actions, targets) of the chunk with the most edits among the first."""
    spec = LayerSpec(anchor_regex=ANCHOR_REGEX, num_layers=8, anchor_offset=0, passes=1,
                     extra_anchors_per_pass=1, phase="target-verify", evidence="bench")
    with TraceSource(trace_path) as source:
        index, plan = build_plan(source, spec, CompactSpec(max_lanes=10), output_name="o",
                                 report_name="r", command="layers",
                                 tmpdir=str(trace_path.parent))
        try:
            chunk, rows, actions = max(
                (item for _, item in zip(range(4), chunk_edits(index, plan), strict=False)),
                key=lambda item: len(item[1]))
            data = read_span(str(trace_path), chunk.offset, chunk.length)
        finally:
            index.close()
    return data, chunk.offset, rows, actions, plan.targets


def test_rewrite_chunk(benchmark, edited_chunk, record_throughput):
    data, offset, rows, actions, targets = edited_chunk
    record_throughput(len(data))
    benchmark.extra_info["edits"] = len(rows)
    out, _ = benchmark(rewrite_chunk, data, offset, rows, actions, targets)
    assert len(out) > len(data)  # relocated events gain their provenance
