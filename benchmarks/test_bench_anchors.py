"""`anchors --json-rows` writing its match rows: the part of the command that runs after
the workers are done (a 1 GB trace has ~213,000 rows; 10 GB, millions).

The report is built once from the 50 MB trace (its index pass is measured elsewhere);
each round writes every row, as the CLI does, a batch at a time: with the C extension,
and with its numpy twin.
"""

import pytest

from tracestream import _native
from tracestream.commands.evidence.anchors import anchors_json_rows, find_anchors

from .conftest import ANCHOR_REGEX


@pytest.fixture(scope="module")
def anchors_report(trace_path):
    return find_anchors(trace_path, ANCHOR_REGEX, workers=0)


@pytest.mark.parametrize("rows", ["C", "Python"])
def test_anchors_json_rows(benchmark, anchors_report, record_throughput, monkeypatch, rows):
    if rows == "Python":
        monkeypatch.setattr(_native, "json_rows", _native.reference.json_rows)
    elif _native.built is None:
        pytest.skip("tracestream._native._speedups is not built")
    text = benchmark(lambda: b"".join(anchors_json_rows(anchors_report)))
    assert text.count(b'{"index":') == anchors_report["count"] > 10_000
    record_throughput(len(text))
