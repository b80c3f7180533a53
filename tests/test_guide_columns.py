"""Guides as columns write what one guide at a time wrote (issue 23).

The guide events and the report's `layers` rows are made from packed columns a
block at a time, and the report is streamed to its file. A reference made the old
way (one Match object, one dict per guide, the report written whole by
`dumps_pretty`) must equal them: the events byte for byte, the report as JSON.
"""

import json
import re

import numpy as np
import orjson
import pytest
from conftest import ANCHOR, TERMINAL, layers_args, run
from hypothesis import example, given
from hypothesis import strategies as st

from tracestream.engine import add_layer_guides
from tracestream.index.builder import IndexOptions, run_index
from tracestream.jsontext import RawNumber, dumps, dumps_pretty
from tracestream.plan.guidetext import relative_ms_column
from tracestream.plan.report import LayerRows
from tracestream.plan.selection import on_gpu, select_gpu
from tracestream.plan.specs import GUIDE_NOTICE, LayerSpec
from tracestream.read.source import TraceSource


def reference_guides(trace, spec: LayerSpec) -> list[dict]:
    """The guides one at a time from Match objects and exact decimals (the old way)."""
    patterns = {"anchor": re.compile(spec.anchor_regex), "terminal": re.compile(TERMINAL)}
    with TraceSource(str(trace)) as source:
        index = run_index(source, IndexOptions(patterns=patterns))
    try:
        pid, device = select_gpu(index.matches["anchor"], None, None, "anchor_regex",
                                 spec.anchor_regex, index.kernel_vocabulary)
        anchors = list(on_gpu(index.matches["anchor"], pid, device))
        terminals = list(on_gpu(index.matches["terminal"], pid, device))
        origin = index.origin.floor_ns()
    finally:
        index.close()
    per_pass = spec.num_layers + spec.extra_anchors_per_pass
    passes = (len(anchors) - spec.num_layers) // per_pass + 1
    rows = []
    for p in range(passes):
        for layer in range(spec.num_layers):
            index = p * per_pass + layer
            anchor = anchors[index]
            if layer < spec.num_layers - 1:
                end, end_text, kind = anchors[index + 1].ts, anchors[index + 1].ts_text, (
                    "next_layer_anchor")
            elif spec.end_anchor_regex is not None:
                upper = anchors[index + 1].ts if index + 1 < len(anchors) else None
                (terminal,) = [t for t in terminals
                               if anchor.ts <= t.ts and (upper is None or t.ts < upper)]
                end = terminal.end
                end_text, kind = end.to_text(), "terminal_kernel_end"
            else:
                end, end_text, kind = anchor.ts, anchor.ts_text, "anchor_point_only"
            rows.append({
                "pass_index": p, "layer_id": layer, "anchor_index": index,
                "anchor_name": anchor.name, "anchor_tid": anchor.tid,
                "start_us": RawNumber(anchor.ts_text), "end_us": RawNumber(end_text),
                "guide_start_us": anchor.ts.round_us(), "guide_end_us": end.round_us(),
                "start_relative_ms": round((anchor.ts.floor_ns() - origin) / 1e6, 6),
                "end_relative_ms": round((end.floor_ns() - origin) / 1e6, 6),
                "boundary_kind": kind,
            })
    return rows


def reference_event(row: dict, pid, tid, spec: LayerSpec) -> bytes:
    """A guide event as the planner wrote it from one dict."""
    args = {key: row[key] for key in ("pass_index", "layer_id", "anchor_index", "anchor_name",
                                      "anchor_tid", "start_us", "end_us", "boundary_kind")}
    args.update(phase=spec.phase, evidence=spec.evidence, notice=GUIDE_NOTICE)
    start = row["guide_start_us"]
    return dumps({"ph": "X", "cat": "layer_guide", "name": f"L{row['layer_id']}", "pid": pid,
                  "tid": tid, "ts": start, "dur": row["guide_end_us"] - start, "args": args})


@pytest.mark.parametrize("name, config", [
    ("every-pass.json", dict(iterations=40)),  # Kineto's three decimals
    ("every-pass-integers.json", dict(iterations=30, decimals=False)),  # integer µs
])
@pytest.mark.parametrize("terminal", [True, False])
def test_events_and_report_equal_one_guide_at_a_time(traces, tmp_path, name, config,
                                                      terminal):
    trace, _ = traces(name, **config)
    spec = LayerSpec(anchor_regex=ANCHOR, num_layers=8, anchor_offset=0, passes="all",
                     extra_anchors_per_pass=1, phase="decode", evidence="generator",
                     end_anchor_regex=TERMINAL if terminal else None)
    out = tmp_path / "out.json"
    done = add_layer_guides(trace, out, spec)
    rows = reference_guides(trace, spec)
    assert len(rows) > 8 * 20  # every pass

    text = (tmp_path / "out.json.layers.json").read_bytes()
    whole = {key: (rows if key == "layers" else value)
             for key, value in orjson.loads(text).items()}
    assert json.loads(text) == json.loads(dumps_pretty(whole))  # the rows, as JSON
    assert [row["anchor_index"] for row in done.layer_rows()] == [
        row["anchor_index"] for row in rows]

    pid, tid = done.data["pid"], done.data["guide_tid"]
    events = [line.rstrip(b",") for line in out.read_bytes().splitlines()
              if b'"cat": "layer_guide"' in line]
    assert events == [reference_event(row, pid, tid, spec) for row in rows]  # byte for byte


def test_json_summary_is_a_summary_not_the_rows(traces, tmp_path):
    """`--json` prints counts, the first and last guide, lanes per device, paths
    and elapsed seconds; its size does not grow with the guides (the rows are in the
    report file)."""
    trace, _ = traces("every-pass.json", iterations=40)
    lines = {}
    for passes in ("1", "all"):
        out = tmp_path / f"out-{passes}.json"
        result = run(*layers_args(trace, out, "--end-anchor-regex", TERMINAL, "--max-gpu-lanes",
                                  "10", "--json", "--quiet", passes=passes))
        assert result.returncode == 0, result.stderr.decode()
        lines[passes] = result.stdout
    data = json.loads(lines["all"])
    report = json.loads((tmp_path / "out-all.json.layers.json").read_bytes())
    assert "layers" not in data
    assert data["guide_count"] == len(report["layers"]) == 8 * data["passes"] > 8 * 20
    assert data["first_guide"] == report["layers"][0]
    assert data["last_guide"] == report["layers"][-1]
    assert data["lanes_per_device"] == [
        {"pid": 0, "device": 0, "kind": "activity", "lanes": g["lanes"]}
        for g in report["compaction"]["groups"] if g["kind"] == "activity"] + [
        {"pid": g["pid"], "device": None, "kind": "scopes", "lanes": g["lanes"]}
        for g in report["compaction"]["groups"] if g["kind"] == "scopes"]
    assert data["output"] == str(tmp_path / "out-all.json")
    assert data["report"] == str(tmp_path / "out-all.json.layers.json")
    assert data["elapsed_seconds"] >= 0
    for key in ("num_layers", "original_event_count", "added_event_count",
                "output_event_count", "pid", "device"):
        assert data[key] == report[key]
    assert len(lines["all"]) - len(lines["1"]) < 200  # digits of counts, not rows


def test_the_library_reads_the_rows_from_the_report_file(traces, tmp_path):
    trace, _ = traces("every-pass.json", iterations=40)
    spec = LayerSpec(anchor_regex=ANCHOR, num_layers=8, anchor_offset=0, passes="all",
                     extra_anchors_per_pass=1, phase="decode", evidence="generator")
    done = add_layer_guides(trace, tmp_path / "out.json", spec)
    report = json.loads((tmp_path / "out.json.layers.json").read_bytes())
    assert isinstance(done.data["layers"], LayerRows)  # a reader, not the rows
    assert list(done.layer_rows()) == report["layers"]
    assert len(done.data["layers"]) == len(report["layers"])
    assert done.data["layers"][-1] == report["layers"][-1]
    assert f"= {len(report['layers'])} guides on pid 0 device 0" in done.summary()
    assert "the last layer's at a zero-length marker at its anchor" in done.summary()


_NS = st.integers(-(1 << 63), (1 << 63) - 1)


@given(st.lists(_NS, max_size=50), _NS)
@example([0, 1, -1, (1 << 50) - 1, -(1 << 50) + 1, 999_999_500, 123_456_789_012_345], 0)
@example([1764400000000000000 + (1 << 50) + 5, 1764400000000000001], 1764400000000000000)
def test_relative_ms_columns_are_the_rounded_quotients(values, origin):
    """The report's *_relative_ms: round((ns - origin) / 1e6, 6) exactly, as floats, also
    far from the origin and at int64's limits (where each value is rounded in Python)."""
    ns = np.array(values, np.int64)
    assert relative_ms_column(ns, origin) == [round((n - origin) / 1e6, 6) for n in values]


@given(st.lists(st.integers(-(1 << 50) + 1, (1 << 50) - 1), min_size=1, max_size=200),
       st.integers(0, 1 << 61))
def test_relative_ms_near_the_origin_need_no_rounding(offsets, origin):
    ns = np.array([origin + k for k in offsets], np.int64)
    assert relative_ms_column(ns, origin) == [round(k / 1e6, 6) for k in offsets]
