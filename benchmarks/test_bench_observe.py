"""The per-chunk work of the index pass: observing a 4 MB chunk and splitting it into events.

`observe_chunk` is what every worker runs on every chunk (decode with msgspec,
classify, pack GPU facts); `event_spans` is the separator scan that gives each
event's exact bytes. Their MB/s bound the index pass per core.
"""

from tracestream.index.decode import event_spans
from tracestream.index.extract import observe_chunk


def test_observe_chunk(benchmark, chunk, context, record_throughput):
    record_throughput(len(chunk.data))
    facts = benchmark(observe_chunk, chunk.data, chunk.offset, context)
    assert facts.count == chunk.count
    assert len(facts.slices) > 0


def test_event_spans(benchmark, chunk, record_throughput):
    record_throughput(len(chunk.data))
    starts, ends = benchmark(event_spans, chunk.data, chunk.count)
    assert len(starts) == chunk.count
    assert ends[-1] == len(chunk.data)
