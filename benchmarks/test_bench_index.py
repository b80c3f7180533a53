"""The whole index pass over a ~50 MB file in one process (`pool=None`).

Inline on purpose: this is the per-core speed of pass 1 (scanner, observe,
merge into packed records), free of fork and pipe costs, which the scale
script measures end to end.
"""

from tracestream.index.builder import IndexOptions, run_index
from tracestream.read.source import TraceSource


def _index(path, patterns):
    with TraceSource(path) as source:
        index = run_index(source, IndexOptions(patterns=patterns), pool=None)
        index.close()
    return index


def test_index_pass_inline(benchmark, trace_path, context, record_throughput):
    record_throughput(trace_path.stat().st_size)
    index = benchmark.pedantic(_index, args=(trace_path, context.patterns), rounds=2,
                               iterations=1, warmup_rounds=0)
    assert index.event_count > 0
    assert len(index.matches["anchor"]) > 0
