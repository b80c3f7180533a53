"""`tracestream compact` and `layers --max-gpu-lanes`: the compact GPU view."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import (
    ANCHOR,
    REAL_WITH_GPU,
    TERMINAL,
    assert_refused,
    assert_verified,
    events_of,
    layers_args,
    load_exact,
    read_bytes,
    real_trace,
    run,
)
from kineto import flow, kernel, thread_name, write_trace
from test_layers import raw_events

ACTIVITY = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "Kernel", "Memcpy", "Memset"}


# -- an independent model of Perfetto's JSON import ---------------------------------------


def _number(value) -> tuple[str, bool]:
    """(text, is_integer_literal) of a number parsed by load_exact."""
    if isinstance(value, tuple):
        return value[1], False
    return str(value), True


def _imported_ns(value) -> int:
    text, integer = _number(value)
    if integer:
        return int(text) * 1000
    x = float(text) * 1000.0  # current Perfetto: llround(double(value) * 1000)
    f = math.floor(x)
    return int(f) + (1 if x - f >= 0.5 else 0)


def depth_per_track(events) -> dict[tuple, int]:
    """Maximum nesting depth per (pid, tid) after Perfetto's ns conversion.

    Slices on one track must be disjoint or strictly nested; a partial overlap
    is also counted as depth (Perfetto pushes it down or drops it).
    """
    tracks = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            start = _imported_ns(e["ts"])
            tracks[(e["pid"], e["tid"])].append((start, start + _imported_ns(e["dur"])))
    depth = {}
    for key, slices in tracks.items():
        slices.sort(key=lambda s: (s[0], -s[1]))
        stack: list[int] = []
        worst = 0
        for start, end in slices:
            while stack and stack[-1] <= start:
                stack.pop()
            worst = max(worst, len(stack))
            stack.append(end)
        depth[key] = worst
    return depth


def synthetic_tracks(report: dict) -> set[tuple]:
    section = report.get("compaction", report)
    tracks = {(g["display_pid"], tid) for g in section["groups"] for tid in g["lane_tids"]}
    if "guide_tid" in report:
        tracks.add((report["pid"], report["guide_tid"]))
    return tracks


def assert_depth_zero(output: Path, report: dict) -> None:
    depth = depth_per_track(events_of(load_exact(output)))
    for track in synthetic_tracks(report):
        assert depth.get(track, 0) == 0, (track, depth.get(track))


def compact_report(output: Path) -> dict:
    return json.loads(Path(f"{output}.compact.json").read_text())


# -- acceptance -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graphs_trace(tmp_path_factory):
    """40 graphs x 8 private streams + the default stream: 321 stream rows, peak overlap 3."""
    from samples.generate import TraceConfig, generate

    path = tmp_path_factory.mktemp("graphs") / "graphs.json"
    truth = generate(path, TraceConfig(iterations=14))
    assert truth.streams == {"0/0": 321}
    return path, truth


def test_321_stream_rows_become_3_lanes(graphs_trace, tmp_path):
    trace, truth = graphs_trace
    out = tmp_path / "compact.json"
    result = run("compact", "--trace", trace, "--output", out, "--max-gpu-lanes", "10")
    assert result.returncode == 0, result.stderr.decode()
    report = compact_report(out)
    (gpu,) = [g for g in report["groups"] if g["kind"] == "activity"]
    assert gpu["original_streams"] == 321 and gpu["lanes"] == 3
    assert gpu["kernel_count"] == truth.kernels["0/0"]
    assert_depth_zero(out, report)

    source = events_of(load_exact(trace))
    output = events_of(load_exact(out))
    lanes = {(0, tid) for tid in gpu["lane_tids"]}
    activity_out = [e for e in output if e.get("ph") == "X" and e.get("cat") in ACTIVITY]
    assert len(activity_out) == truth.activity["0/0"]
    for e in activity_out:
        prov = e["args"]["_compact_gpu_track"]
        original = source[prov["source_event_index"]]
        assert (e["pid"], e["tid"]) in lanes
        moved_back = dict(e, pid=prov["pid"], tid=prov["tid"])
        moved_back["args"] = {k: v for k, v in e["args"].items() if k != "_compact_gpu_track"}
        assert moved_back == original
        assert e["args"]["stream"] == original["args"]["stream"]

    # every GPU flow end lands on the lane of the kernel starting at its ts on its stream
    kernel_lane = {}
    for e in activity_out:
        prov = e["args"]["_compact_gpu_track"]
        kernel_lane[(prov["pid"], prov["tid"], e["ts"])] = e["tid"]
    gpu_flows = [e for e in output if e.get("ph") == "f" and e["pid"] == 0]
    assert len(gpu_flows) == truth.gpu_flows[0]
    for f in gpu_flows:
        prov = f["args"]["_compact_gpu_track"]
        assert kernel_lane[(prov["pid"], prov["tid"], f["ts"])] == f["tid"]

    # GPU scopes live in their own process, with their own lanes
    scopes = [e for e in output if e.get("cat") == "gpu_user_annotation"]
    names = {e["pid"]: e["args"]["name"] for e in output
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert {names[e["pid"]] for e in scopes} == {"GPU scopes (original PID 0)"}
    (scope_group,) = [g for g in report["groups"] if g["kind"] == "scopes"]
    assert scope_group["lanes"] == 2  # decode_step contains the pass scopes

    # CPU events are byte-identical, in order
    cpu_source = [r for r in raw_events(trace) if b'"pid": 4242' in r]
    cpu_output = [r for r in raw_events(out) if b'"pid": 4242' in r]
    assert cpu_output == cpu_source

    # the emptied stream rows' metadata left the trace and is in the report
    retired = report["retired_track_metadata"]
    assert len(retired) == 2 * 321
    assert all(source[r["source_event_index"]] == _exactly(r["event"]) for r in retired[:5])
    assert not [e for e in output if e.get("ph") == "M" and e.get("name") == "thread_name"
                and e["pid"] == 0 and e["args"]["name"].startswith("stream")]
    assert_verified(trace, out)


def _exactly(event: dict) -> dict:
    return json.loads(json.dumps(event), parse_float=lambda text: ("float", text))


def test_touching_19_digit_kernels_import_at_depth_zero(tmp_path):
    """Kernels that touch exactly can overlap after Perfetto rounds through doubles."""
    events, t = [], 1764400000005000
    for i in range(200):
        ts = f"{t + i * 3}.{(i * 37) % 1000:03d}"
        end_next = f"{t + (i + 1) * 3}.{((i + 1) * 37) % 1000:03d}"
        dur = _sub(end_next, ts)
        events.append(kernel(f"k{i}", ts, dur, tid=100 + i % 5))
    trace = write_trace(tmp_path / "touching.json", events)
    naive = depth_per_track([dict(e, tid=0) for e in events_of(load_exact(trace))])
    assert naive[(0, 0)] > 0, "test data must overlap when put on one naive track"
    out = tmp_path / "out.json"
    assert run("compact", "--trace", trace, "--output", out).returncode == 0
    report = compact_report(out)
    assert_depth_zero(out, report)
    assert_verified(trace, out)


def _sub(a: str, b: str) -> str:
    from decimal import Decimal

    return str(Decimal(a) - Decimal(b))


def test_peak_overlap_above_the_limit_is_refused_with_its_place(tmp_path):
    events = [kernel(f"k{i}", f"1764400000005{i:03d}.500", "1000", tid=100 + i) for i in range(12)]
    events.append(kernel("first", "1764400000000000", "1", tid=7))
    trace = write_trace(tmp_path / "wide.json", events)
    out = tmp_path / "out.json"
    line = assert_refused(run("compact", "--trace", trace, "--output", out, "--max-gpu-lanes",
                              "10"), "needs 12 display lanes", out, Path(f"{out}.compact.json"))
    assert "pid 0 device 0" in line and "peak overlap 12" in line
    assert "5011.500" in line  # absolute µs of the peak
    assert "5.011" in line  # relative ms from the trace start
    assert "narrower" in line


def test_layers_with_lanes_gzip_in_zstd_out(graphs_trace, tmp_path):
    trace, _ = graphs_trace
    import gzip

    source = tmp_path / "in.json.gz"
    source.write_bytes(gzip.compress(trace.read_bytes()))
    out = tmp_path / "both.json.zst"
    result = run(*layers_args(source, out, "--max-gpu-lanes", "10", "--end-anchor-regex",
                              TERMINAL, passes=14))
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(Path(f"{out}.layers.json").read_text())
    assert report["compaction"]["groups"][0]["lanes"] == 3
    events = events_of(load_exact(out))
    guides = [e for e in events if e.get("cat") == "layer_guide"]
    assert len(guides) == 8 * 14
    order = [e["args"]["name"] for e in events if e.get("ph") == "M"
             and e.get("name") == "thread_name" and e["pid"] == 0]
    sort = {e["tid"]: e["args"]["sort_index"] for e in events if e.get("ph") == "M"
            and e.get("name") == "thread_sort_index" and e["pid"] == 0}
    guide_tid = report["guide_tid"]
    assert sort[guide_tid] < min(v for k, v in sort.items() if k != guide_tid)
    assert any(name.startswith("Layer guide") for name in order)
    assert_depth_zero(out, report)
    assert_verified(source, out)


def test_compacting_a_layers_output_keeps_its_guides_once(graphs_trace, tmp_path):
    trace, _ = graphs_trace
    layered = tmp_path / "layers.json"
    assert run(*layers_args(trace, layered, passes=14)).returncode == 0
    out = tmp_path / "compact.json"
    result = run("compact", "--trace", layered, "--output", out)
    assert result.returncode == 0, result.stderr.decode()
    guides_before = [e for e in events_of(load_exact(layered)) if e.get("cat") == "layer_guide"]
    guides_after = [e for e in events_of(load_exact(out)) if e.get("cat") == "layer_guide"]
    assert guides_after == guides_before
    assert_verified(layered, out)
    again = tmp_path / "again.json"
    assert_refused(run("compact", "--trace", out, "--output", again),
                   "start from the source trace", again)


def test_foreign_or_incomplete_guides_are_refused(tmp_path):
    guide = {"ph": "X", "cat": "layer_guide", "name": "L0", "pid": 0, "tid": 99, "ts": 0,
             "dur": 5, "args": {"layer_id": 0}}
    trace = write_trace(tmp_path / "g.json", [kernel("k", "1", "1"), guide])
    out = tmp_path / "out.json"
    assert_refused(run("compact", "--trace", trace, "--output", out), "regenerate", out)


@pytest.mark.parametrize("name", REAL_WITH_GPU)
def test_real_traces_compact_and_verify(name, tmp_path):
    trace = real_trace(name)
    out = tmp_path / "out.json"
    result = run("compact", "--trace", trace, "--output", out)
    assert result.returncode == 0, result.stderr.decode()
    report = compact_report(out)
    assert_depth_zero(out, report)
    for group in report["groups"]:
        assert 1 <= group["lanes"] <= group["original_streams"] or group["kind"] == "scopes"
    assert_verified(trace, out)


def test_real_trace_without_gpu_is_refused(tmp_path):
    trace = real_trace("hta_mtia_no_gpu.json.gz")
    out = tmp_path / "out.json"
    assert_refused(run("compact", "--trace", trace, "--output", out), "no GPU activity", out)


@pytest.mark.parametrize(
    "intruder, what",
    [
        ({"ph": "B", "name": "b", "pid": 0, "tid": 7, "ts": "5"}, "begin (B)"),
        ({"ph": "E", "name": "b", "pid": 0, "tid": 7, "ts": "5"}, "end (E)"),
        ({"ph": "i", "name": "mark", "pid": 0, "tid": 7, "ts": "5", "s": "t"}, "instant"),
        ({"ph": "C", "name": "mem", "pid": 0, "tid": 7, "ts": "5", "args": {"v": 1}}, "counter"),
    ],
)
def test_other_events_on_a_relocated_stream_are_refused(tmp_path, intruder, what):
    trace = write_trace(tmp_path / "t.json", [kernel("k", "1", "10"), intruder])
    out = tmp_path / "out.json"
    line = assert_refused(run("compact", "--trace", trace, "--output", out), what, out)
    assert "pid 0 tid 7" in line and "event 1" in line


@pytest.mark.parametrize(
    "events, fragment",
    [
        ([kernel("k", "10", "5"), flow("f", 1, "50")], "binds to no GPU activity"),
        ([kernel("k", "10", "5"), kernel("k2", "10", "3"), flow("f", 1, "10")],
         "starts exactly at 2 activities"),
        ([kernel("k", "10", "50"), kernel("k2", "20", "5"), flow("f", 1, "22")],
         "lies inside 2 activities"),
    ],
)
def test_flows_that_bind_to_nothing_or_two_kernels_are_refused(tmp_path, events, fragment):
    trace = write_trace(tmp_path / "t.json", events)
    out = tmp_path / "out.json"
    line = assert_refused(run("compact", "--trace", trace, "--output", out), fragment, out)
    assert "id 1" in line


def test_flows_bind_to_the_containing_kernel_and_cpu_flows_stay(tmp_path):
    events = [
        kernel("k", "10", "5", tid=7), kernel("k2", "12", "5", tid=8),
        flow("s", 1, "9", pid=4242, tid=4242), flow("f", 1, "11", tid=7),
        thread_name(0, 7, "stream 7 "), thread_name(0, 8, "stream 8 "),
    ]
    trace = write_trace(tmp_path / "t.json", events)
    out = tmp_path / "out.json"
    assert run("compact", "--trace", trace, "--output", out).returncode == 0
    output = events_of(load_exact(out))
    moved_kernel = next(e for e in output if e.get("name") == "k")
    gpu_flow = next(e for e in output if e.get("ph") == "f")
    cpu_flow = next(e for e in output if e.get("ph") == "s")
    assert gpu_flow["tid"] == moved_kernel["tid"]
    assert cpu_flow == events_of(load_exact(trace))[2]
    assert len(compact_report(out)["retired_track_metadata"]) == 2
    assert_verified(trace, out)


def test_pid_limits_compaction_to_one_process(traces, tmp_path):
    trace, _ = traces("two_gpus.json", iterations=2, gpus=2)
    out = tmp_path / "out.json"
    assert run("compact", "--trace", trace, "--output", out, "--pid", "1").returncode == 0
    report = compact_report(out)
    assert {g["pid"] for g in report["groups"]} == {1}
    source = events_of(load_exact(trace))
    output = events_of(load_exact(out))
    untouched = [e for e in output if e.get("pid") == 0]
    assert untouched == [e for e in source if e.get("pid") == 0]
    assert_verified(trace, out)
    missing = tmp_path / "none.json"
    assert_refused(run("compact", "--trace", trace, "--output", missing, "--pid", "7"),
                   "no GPU activity in pid 7", missing)


def test_several_devices_in_one_pid_get_lanes_each(traces, tmp_path):
    trace, _ = traces("two_devices.json", iterations=2, devices_per_pid=2)
    out = tmp_path / "out.json"
    assert run("compact", "--trace", trace, "--output", out).returncode == 0
    report = compact_report(out)
    activity = [g for g in report["groups"] if g["kind"] == "activity"]
    assert sorted(g["device"] for g in activity) == [0, 1]
    tids = [tid for g in activity for tid in g["lane_tids"]]
    assert len(tids) == len(set(tids))
    assert_depth_zero(out, report)
    assert_verified(trace, out)


@pytest.mark.parametrize("lanes", ["0", "11"])
def test_lane_limit_range(decode_trace, tmp_path, lanes):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    assert_refused(run("compact", "--trace", trace, "--output", out, "--max-gpu-lanes", lanes),
                   "between 1 and 10", out)


def test_cuda_sync_on_the_device_row_is_compacted(traces, tmp_path):
    trace, _ = traces("sync_row.json", iterations=2, sync_on_device_row=True)
    out = tmp_path / "out.json"
    assert run("compact", "--trace", trace, "--output", out).returncode == 0
    syncs = [e for e in events_of(load_exact(out)) if e.get("cat") == "cuda_sync"]
    assert syncs and all(e["args"]["_compact_gpu_track"]["tid"] == -1 for e in syncs)
    assert_verified(trace, out)


def test_top_level_labels_the_compact_view(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    assert run("compact", "--trace", trace, "--output", out).returncode == 0
    doc = load_exact(out)
    assert doc["tracestream"]["view"] == (
        "compact view — synthetic GPU display lanes, not CUDA streams"
    )
    assert doc["tracestream"]["report"] == "out.json.compact.json"
    lane_names = [e["args"]["name"] for e in events_of(doc) if e.get("name") == "thread_name"
                  and "synthetic" in e["args"]["name"]]
    assert lane_names and all("lane" in n for n in lane_names)
    source = load_exact(trace)
    assert [k for k in doc if k != "tracestream"] == list(source)
    assert read_bytes(out).count(b'"tracestream":') == 1
    assert ANCHOR  # the shared constants are importable for other modules
