"""The scale script's bookkeeping: which rows run, what they label, how targets are judged."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import baseline
from benchmarks.scale import (
    NIGHTLY_TERMINAL,
    nightly_layers,
    parse_args,
    selected,
    target,
    targets,
    wanted_under,
    without_terminal,
)


def test_a_workload_selects_its_rows_by_name_or_prefix():
    assert selected("nightly", ["nightly"])
    assert not selected("nightly-no-terminal", ["nightly"])
    assert selected("real:hta_x:layers", ["real"])
    assert selected("real:hta_x:layers", ["real:hta_x"])
    assert not selected("real:hta_xy:layers", ["real:hta_x"])


def test_an_input_is_made_when_any_row_under_it_is_selected():
    assert wanted_under("real:hta_x", ["real:hta_x:layers"])
    assert wanted_under("real:hta_x", ["real"])
    assert wanted_under("real", ["real:hta_x:compact"])
    assert not wanted_under("real:hta_x", ["real:hta_xy:layers", "nightly"])


def test_unknown_workloads_are_refused():
    with pytest.raises(SystemExit):
        parse_args(["--size", "1MB", "--workload", "nightlyy"])
    assert parse_args(["--size", "1MB", "--workload", "real:t:compact"]).workload == [
        "real:t:compact"]


def test_the_nightly_job_labels_every_pass_of_the_generated_trace():
    truth = {"iterations": 784, "config": {"layers": 8, "extra_anchor": True}}
    args = nightly_layers(truth, pid=0)
    assert args[args.index("--passes") + 1] == "784"
    assert args[args.index("--extra-anchors-per-pass") + 1] == "1"
    assert args[args.index("--pid") + 1] == "0"
    assert args[args.index("--end-anchor-regex") + 1] == NIGHTLY_TERMINAL
    assert "--end-anchor-regex" not in without_terminal(args)
    assert len(without_terminal(args)) == len(args) - 2


def _row(name, mbps, ok=True, fmt="plain", kind="layers", size=1 << 30):
    ours = {"ok": ok, "mb_per_s": mbps, "best_wall_s": 1e9 / mbps / 1e6 if ok else None,
            "max_rss": 100 << 20, "tree_pss": 120 << 20}
    return {"workload": name, "kind": kind, "size": "1GB", "size_bytes": size, "fmt": fmt,
            "out_fmt": fmt, "ours": ours}


def test_a_target_names_the_worst_row_and_every_row_that_misses_it():
    rows = [_row("compact", 180.0), _row("nightly", 40.0), _row("gpus8", 90.0)]
    judged = target("mb/s", rows, lambda r: r["ours"]["mb_per_s"], lambda v: v >= 100,
                    lambda v: f"{v:.0f}")
    assert judged["holds"] is False
    assert judged["worst"].startswith("nightly ") and judged["value"] == "40"
    assert [m.split()[0] for m in judged["missed"]] == ["nightly", "gpus8"]


def test_a_failed_run_misses_the_target_and_an_unjudged_row_is_listed():
    rows = [_row("compact", 180.0), _row("nightly", 0, ok=False)]
    judged = target("mb/s", rows, lambda r: r["ours"]["mb_per_s"], lambda v: v >= 100, str)
    assert judged["holds"] is False and judged["value"] == "the run failed"
    rows = [_row("compact", 180.0), _row("inspect", 150.0, kind="inspect")]
    judged = target("speed", rows, lambda r: None if r["kind"] == "inspect" else 12.0,
                    lambda v: v >= 10, str)
    assert judged["holds"] is True and [n.split()[0] for n in judged["not_judged"]] == [
        "inspect"]


def test_the_terminal_target_compares_the_nightly_row_with_its_twin_without_terminal():
    with_terminal, without = _row("nightly", 50.0), _row("nightly-no-terminal", 100.0)
    judged = {t["target"].split(" <=")[0]: t for t in targets([with_terminal, without])}
    assert judged["--end-anchor-regex"]["value"] == "2.00x"
    assert judged["--end-anchor-regex"]["holds"] is False


def _kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0}}


def _spec(passes, terminal=True):
    return argparse.Namespace(job="layers", anchor_regex="^A$", num_layers=2, anchor_offset=0,
                              passes=passes, anchor_stride=1, extra_anchors_per_pass=1,
                              end_anchor_regex="^T$" if terminal else None, pid=None,
                              phase="p", max_gpu_lanes=None)


def test_the_baseline_labels_every_pass_and_ends_the_last_layer_at_its_terminal():
    events = []
    for p in range(3):  # A T A T A(extra) per pass
        t0 = 1000 * p
        events += [_kernel("A", t0, 5), _kernel("T", t0 + 10, 5), _kernel("A", t0 + 20, 5),
                   _kernel("T", t0 + 30, 7), _kernel("A", t0 + 50, 5)]
    doc = baseline.annotate({"traceEvents": list(events)}, _spec(3))
    guides = [e for e in doc["traceEvents"] if e.get("cat") == "layer_guide"]
    assert [(g["name"], g["ts"], g["dur"]) for g in guides] == [
        ("L0", 0, 20), ("L1", 20, 17), ("L0", 1000, 20), ("L1", 1020, 17),
        ("L0", 2000, 20), ("L1", 2020, 17)]
    without = baseline.annotate({"traceEvents": list(events)}, _spec(3, terminal=False))
    assert [g["dur"] for g in without["traceEvents"] if g.get("cat") == "layer_guide"][1] == 0


def test_the_baseline_refuses_a_window_without_exactly_one_terminal():
    events = [_kernel("A", 0, 5), _kernel("A", 20, 5), _kernel("T", 30, 5), _kernel("A", 50, 5)]
    with pytest.raises(SystemExit, match="0 terminal kernels in the window of pass 0 L0"):
        baseline.annotate({"traceEvents": events}, _spec(1))
