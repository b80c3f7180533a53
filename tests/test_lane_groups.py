"""`compact --lane-groups auto` and `--lane-group NAME=REGEX`: each semantic group of a device
(compute, communication, memory, sync, custom groups) on lanes of its own."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import (
    ROOT,
    assert_refused,
    assert_verified,
    events_of,
    load_exact,
    read_bytes,
    real_trace,
    run,
)
from kineto import kernel, write_trace

SAMPLE = ROOT / "samples" / "decode_8layers.trace.json.gz"


def _mixed(path: Path) -> Path:
    """Three concurrent GEMMs, two concurrent all-reduces, two concurrent copies and one
    memset, each on a stream of its own, every 100 µs (all overlapping within a step), and
    one sync: peaks compute 3, communication 2, memory 2 (the memset after the copies),
    sync 1."""
    events = []
    for step in range(3):
        t = 1_000 + 100 * step
        events += [kernel(f"sm90_gemm_{k}", t + k, 50, tid=10 + k) for k in range(3)]
        events += [kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t + 5, 40, tid=20),
                   kernel("cross_device_reduce_1stage<bf16>", t + 6, 30, tid=21)]
        events += [kernel("Memcpy DtoD (Device -> Device)", t + 2, 20, tid=30, cat="gpu_memcpy"),
                   kernel("Memcpy HtoD (Pinned -> Device)", t + 3, 20, tid=31,
                          cat="gpu_memcpy"),
                   kernel("Memset (Device)", t + 60, 5, tid=30, cat="gpu_memset"),
                   kernel("Event Sync", t + 90, 1, tid=40, cat="cuda_sync")]
    return write_trace(path, events)


def _compact(trace: Path, out: Path, *options) -> dict:
    result = run("compact", "--trace", trace, "--output", out, *options)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(Path(f"{out}.compact.json").read_bytes())


def _lanes(out: Path) -> tuple[dict, dict]:
    """(lane tid -> its name, lane tid -> the lane groups its relocated activity's provenance
    names) of pid 0."""
    names, groups = {}, defaultdict(set)
    for e in events_of(load_exact(out)):
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e["pid"] == 0:
            names[e["tid"]] = e["args"]["name"]
        track = (e.get("args") or {}).get("_compact_gpu_track")
        if track is not None and e.get("ph") == "X" and e["pid"] == 0:
            groups[e["tid"]].add(track.get("group"))
    return names, groups


def test_each_group_gets_its_peak_in_lanes_of_its_own(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    report = _compact(trace, out, "--lane-groups", "auto")
    (device,) = report["groups"]
    rows = {row["group"]: row for row in device["lane_groups"]}
    assert {g: row["lanes"] for g, row in rows.items()} == {
        "compute": 3, "communication": 2, "memory": 2, "sync": 1}
    assert device["lanes"] == 8
    assert device["lane_tids"] == [t for g in ("compute", "communication", "memory", "sync")
                                   for t in rows[g]["lane_tids"]]
    names, groups = _lanes(out)
    for group, row in rows.items():
        for tid in row["lane_tids"]:
            assert groups[tid] == {group}  # one group per lane, and the lane's own
            assert names[tid].endswith(f"; device 0; {group})"), names[tid]
    assert [names[t] for t in device["lane_tids"]][:4] == [
        "GPU lane 0 (synthetic; device 0; compute)", "GPU lane 1 (synthetic; device 0; compute)",
        "GPU lane 2 (synthetic; device 0; compute)",
        "GPU lane 3 (synthetic; device 0; communication)"]
    assert report["options"]["compact"]["lane_groups"] == "auto"
    assert_verified(trace, out)


def test_the_summary_says_each_groups_lanes(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    result = run("compact", "--trace", trace, "--output", tmp_path / "out.json",
                 "--lane-groups", "auto")
    assert result.returncode == 0, result.stderr.decode()
    assert ("compact view: pid 0 device 0: 8 stream rows -> 8 synthetic lanes (compute 3, "
            "communication 2, memory 2, sync 1)") in result.stderr.decode()


def test_empty_groups_get_no_lane(tmp_path):
    trace = write_trace(tmp_path / "t.json", [kernel("gemm", 1, 10, tid=7),
                                              kernel("gemm", 2, 10, tid=8)])
    report = _compact(trace, tmp_path / "out.json", "--lane-groups", "auto")
    (device,) = report["groups"]
    assert [(r["group"], r["lanes"]) for r in device["lane_groups"]] == [("compute", 2)]


def test_groups_above_the_limit_are_refused_with_each_peak(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    line = assert_refused(
        run("compact", "--trace", trace, "--output", out, "--lane-groups", "auto",
            "--max-gpu-lanes", "7"),
        "needs 8 display lanes with its lane groups apart", out, Path(f"{out}.compact.json"))
    for part in ("compute 3 (peak at", "communication 2 (peak at", "memory 2 (peak at",
                 "sync 1 (peak at", "--max-gpu-lanes is 7", "fewer groups"):
        assert part in line, line
    # without groups the same activity fits: its peak overlap (7) is below the groups' sum
    _compact(trace, tmp_path / "shared.json", "--max-gpu-lanes", "7")


def test_custom_groups_apply_in_order_first_match_wins(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    report = _compact(trace, out, "--lane-groups", "auto",
                      "--lane-group", "gemm0=gemm_0", "--lane-group", "gemms=gemm",
                      "--lane-group", "ring=RING")
    (device,) = report["groups"]
    assert [(r["group"], r["lanes"]) for r in device["lane_groups"]] == [
        # the custom groups are tried first: `ring` takes the NCCL kernel from communication
        ("communication", 1), ("memory", 2), ("sync", 1),
        ("gemm0", 1), ("gemms", 2), ("ring", 1)]
    names, groups = _lanes(out)
    assert names[device["lane_tids"][-1]] == "GPU lane 7 (synthetic; device 0; ring)"
    assert report["options"]["compact"]["lane_group"] == [
        ["gemm0", "gemm_0"], ["gemms", "gemm"], ["ring", "RING"]]
    assert_verified(trace, out)


def test_custom_groups_alone_leave_the_rest_compute(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    report = _compact(trace, tmp_path / "out.json", "--lane-group", "comm=(?i)nccl|reduce")
    (device,) = report["groups"]
    assert [(r["group"], r["lanes"]) for r in device["lane_groups"]] == [
        ("compute", 5), ("comm", 2)]  # copies, memsets and syncs are compute here


@pytest.mark.parametrize("options, fragment", [
    (["--lane-group", "gemm=("], "--lane-group '(' is not a valid regular expression"),
    (["--lane-group", "gemm"], "--lane-group 'gemm' must be NAME=REGEX"),
    (["--lane-group", "memory=copy"], "the name of a built-in group"),
    (["--lane-group", "a=x", "--lane-group", "a=y"], "the name of another --lane-group"),
    (["--lane-group", "two words=x"], "a group name is a letter"),
    (["--lane-group", "Compute=x"], "the name of a built-in group"),
    (["--lane-group", "a=x", "--lane-group", "A=y"], "the name of another --lane-group"),
    (["--lane-group", "a="], "--lane-group 'a' has an empty pattern, which matches every "
                             "kernel"),
    ([arg for i in range(7) for arg in ("--lane-group", f"g{i}=x{i}")],
     "--lane-group is given 7 times; at most 6 custom groups fit in 10 lanes"),
])
def test_bad_lane_groups_are_refused_in_one_line(tmp_path, options, fragment):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    assert_refused(run("compact", "--trace", trace, "--output", out, *options), fragment, out)


def test_layers_lane_groups_need_max_gpu_lanes(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    assert_refused(run("layers", "--trace", trace, "--output", out, "--anchor-regex", "gemm_0",
                       "--num-layers", "1", "--anchor-offset", "0", "--phase", "p",
                       "--evidence", "e", "--lane-groups", "auto"),
                   "--lane-groups groups the lanes of compaction: give it with --max-gpu-lanes",
                   out)


def test_verify_catches_an_event_moved_to_another_groups_lane(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    report = _compact(trace, out, "--lane-groups", "auto")
    rows = {r["group"]: r for r in report["groups"][0]["lane_groups"]}
    compute, comm = rows["compute"]["lane_tids"][0], rows["communication"]["lane_tids"][0]
    text = read_bytes(out)
    # an all-reduce moved onto a compute lane (its provenance still says communication)
    at = text.index(b'"group": "communication"')
    tid = text.rindex(b'"tid": %d' % comm, 0, at)
    moved = tmp_path / "moved.json"
    moved.write_bytes(text[:tid] + b'"tid": %d' % compute + text[tid + len(b'"tid": %d' % comm):])
    result = run("verify", "--trace", trace, "--output", moved, "--report",
                 f"{out}.compact.json")
    assert result.returncode == 1, result.stderr.decode()
    assert re.search(rb"FAIL\] output equals the plan: event \d+ .*is at pid 0 tid %d"
                     % compute, result.stdout), result.stdout.decode()
    # the report's lane groups swapped (the output untouched): the lane check, which reads
    # the output alone, finds each lane holding another group's events
    report_text = Path(f"{out}.compact.json").read_bytes()
    swapped = report_text.replace(
        b'"group": "compute",', b'"group": "communicationX",').replace(
        b'"group": "communication",', b'"group": "compute",').replace(
        b'"group": "communicationX",', b'"group": "communication",')
    assert swapped != report_text
    (tmp_path / "swapped.json").write_bytes(swapped)
    result = run("verify", "--trace", trace, "--output", out, "--report",
                 tmp_path / "swapped.json")
    assert result.returncode == 1
    assert b"(lane group communication) holds relocated events of another group (" in (
        result.stdout), result.stdout.decode()


def test_restore_gives_the_source_back(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    _compact(trace, out, "--lane-groups", "auto", "--lane-group", "g=gemm_1")
    back = tmp_path / "back.json"
    result = run("restore", "--trace", out, "--output", back)
    assert result.returncode == 0, result.stderr.decode()
    assert back.read_bytes() == trace.read_bytes()


def test_without_the_options_the_output_is_unchanged(tmp_path):
    """No group member, no group in the lane names or the report's options: what the view
    was before lane groups existed (the other compact tests hold its exact bytes)."""
    out = tmp_path / "out.json"
    report = _compact(SAMPLE, out)
    assert report["options"]["compact"] == {"max_lanes": 10, "pid": None}
    assert b'"group"' not in read_bytes(out)
    assert "lane_groups" not in report["groups"][0]
    names, _ = _lanes(out)
    assert names[report["groups"][0]["lane_tids"][0]] == "GPU lane 0 (synthetic; device 0)"


def test_the_sample_in_lane_groups(tmp_path):
    """The docs' before/after (docs/view.md): the sample's all-reduces and copies apart."""
    out = tmp_path / "out.json"
    report = _compact(SAMPLE, out, "--lane-groups", "auto")
    names, _ = _lanes(out)
    assert [names[t] for t in report["groups"][0]["lane_tids"]] == [
        "GPU lane 0 (synthetic; device 0; compute)",
        "GPU lane 1 (synthetic; device 0; compute)",
        "GPU lane 2 (synthetic; device 0; communication)",
        "GPU lane 3 (synthetic; device 0; memory)",
        "GPU lane 4 (synthetic; device 0; memory)",
        "GPU lane 5 (synthetic; device 0; sync)"]
    assert_verified(SAMPLE, out)


@pytest.mark.parametrize("name", ["hta_nccl_gpu_scopes.json.gz",
                                  "hta_sampled_rank0_5streams.json.gz",
                                  "hta_train_6streams.json.gz"])
def test_real_traces_with_nccl_compact_in_groups_and_verify(name, tmp_path):
    trace = real_trace(name)
    out = tmp_path / "out.json"
    report = _compact(trace, out, "--lane-groups", "auto")
    devices = [g for g in report["groups"] if g["kind"] == "activity"]
    assert any(r["group"] == "communication" for g in devices for r in g["lane_groups"])
    assert_verified(trace, out)


def test_scopes_above_the_limit_are_refused_as_scopes_with_lane_groups(tmp_path):
    """Three overlapping GPU user annotations need three scope lanes: the refusal names the
    pid's scopes, with lane groups as without (it named another device, or failed)."""
    events = [kernel("gemm", 1, 10, tid=7)]
    events += [{"ph": "X", "cat": "gpu_user_annotation", "name": f"scope{i}", "pid": 0,
                "tid": 7, "ts": str(1 + i), "dur": "20", "args": {"device": 0}}
               for i in range(3)]
    trace = write_trace(tmp_path / "scopes.json", events)
    out = tmp_path / "out.json"
    for options in ([], ["--lane-groups", "auto"]):
        line = assert_refused(run("compact", "--trace", trace, "--output", out,
                                  "--max-gpu-lanes", "2", *options),
                              "GPU scopes of pid 0 needs 3", out)
        assert "device" not in line.split("needs")[0], line


def test_a_kernel_named_true_does_not_decide_the_group_of_one_named_1_0(tmp_path):
    """Names are classified by their text: `true` and `1.0` are equal as Python keys, not
    as names, and the order kernels come in must not change a group."""
    numbers = [kernel(1.0, 100 + 20 * i, 5, tid=8) for i in range(3)]
    first = write_trace(tmp_path / "a.json", numbers)
    second = write_trace(tmp_path / "b.json", [kernel(True, 1, 5, tid=7), *numbers])
    groups = []
    for trace in (first, second):
        out = tmp_path / f"{trace.stem}.out.json"
        _compact(trace, out, "--lane-group", "num=^1")
        _, by_lane = _lanes(out)
        groups.append(set().union(*by_lane.values()))
        assert_verified(trace, out)
    assert groups[0] == {"num"} and groups[1] == {"num", "compute"}


def test_a_malformed_lane_groups_row_in_the_report_is_refused(tmp_path):
    trace = _mixed(tmp_path / "mixed.json")
    out = tmp_path / "out.json"
    report = _compact(trace, out, "--lane-groups", "auto")
    for bad in (["x"], {"a": 1}, [{"group": "compute", "lanes": 1, "lane_tids": [[1]]}]):
        report["groups"][0]["lane_groups"] = bad
        Path(f"{out}.compact.json").write_text(json.dumps(report))
        result = run("verify", "--trace", trace, "--output", out)
        assert result.returncode == 2, result.stderr.decode()
        assert b"Traceback" not in result.stderr
        assert result.stderr.decode().count("\n") == 1
        assert "malformed" in result.stderr.decode(), result.stderr.decode()
