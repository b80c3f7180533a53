"""The usual labelling mistakes are refused with their evidence; deliberate overrides are
recorded; `--passes all`; what the selection left unlabelled; the summary in words.

The decode trace of the generator is the issue's trace in small: target passes of 8
layers, an output-head anchor (`_q_rope_store`) after each pass, draft passes
(`_draft_q_rope`) in between.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import (
    ANCHOR,
    TERMINAL,
    TRACESTREAM,
    assert_refused,
    assert_verified,
    events_of,
    load_exact,
    real_trace,
    run,
)

from benchmarks.scale import REAL_ANCHORS as PER_STEP_ANCHORS
from tracestream import LayerSpec, add_layer_guides
from tracestream.engine import name_in_report
from tracestream.errors import TraceError

EVIDENCE = "generator: one _q_rope_store per layer, one extra per pass"


def layers(trace, out, *extra, regex=ANCHOR, num_layers="8", offset="0"):
    return run("layers", "--trace", trace, "--output", out, "--anchor-regex", regex,
               "--num-layers", num_layers, "--anchor-offset", offset, "--phase", "target-verify",
               "--evidence", EVIDENCE, *extra)


def report_of(output: Path) -> dict:
    return json.loads(Path(f"{output}.layers.json").read_text())


def refused(result, fragment: str, out: Path) -> str:
    return assert_refused(result, fragment, out, Path(f"{out}.layers.json"))


# -- several kernel names ----------------------------------------------------------------


def test_a_pattern_matching_the_target_and_the_draft_anchor_is_refused(decode_trace, tmp_path):
    trace, truth = decode_trace
    out = tmp_path / "out.json"
    line = refused(layers(trace, out, "--extra-anchors-per-pass", "1", regex="rope"),
                   "--anchor-regex 'rope' matches 2 different kernel names on pid 0 device 0", out)
    # most frequent first, with counts, and an anchored pattern to copy
    assert (f"'_q_rope_store' ({truth.anchors['0/0']}), '_draft_q_rope' "
            f"({truth.draft_anchors['0/0']})") in line
    assert "--anchor-regex '^_q_rope_store$'" in line
    assert "--allow-several-anchor-names" in line


def test_an_empty_pattern_lists_the_most_frequent_names_and_how_many_more(decode_trace,
                                                                          tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    line = refused(layers(trace, out, regex=""), "matches 12 different kernel names", out)
    assert "'_q_rope_store' (54)" in line and "… and 6 more" in line


def test_allow_several_anchor_names_is_accepted_and_recorded(decode_trace, tmp_path):
    trace, truth = decode_trace
    out = tmp_path / "out.json"
    result = layers(trace, out, "--allow-several-anchor-names", regex="rope")
    assert result.returncode == 0, result.stderr.decode()
    report = report_of(out)
    assert report["allow_several_anchor_names"] is True
    assert report["options"]["layers"]["allow_several_anchor_names"] is True
    assert report["distinct_anchor_names"] == 2
    assert report["anchor_names"] == {"_q_rope_store": truth.anchors["0/0"],
                                      "_draft_q_rope": truth.draft_anchors["0/0"]}
    assert "override --allow-several-anchor-names: the pattern matches 2 kernel names" in (
        result.stderr.decode())
    assert_verified(trace, out)


# -- a pass across a cadence break ------------------------------------------------------


def test_an_offset_in_the_middle_of_a_pass_is_refused_with_the_gap(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    line = refused(layers(trace, out, "--extra-anchors-per-pass", "1", offset="5"),
                   "pass 0 crosses a cadence break", out)
    # matches 5..12: the output head (8) is L3, the next pass starts at 9 (L4)
    assert re.search(r"from match 8 \(L3, ts 1764400\d+\.\d{3} µs\) to match 9 \(L4, ts "
                     r"1764400\d+\.\d{3} µs\) the gap is [\d,.]+ µs, 3\.\d+ x the median layer gap"
                     r" of the selection \(62\.625 µs; a break is > 3 x\)", line), line
    assert "the matches fall into clusters of 9 (6 of 6 clusters, first at index 0): " \
           "--anchor-offset 0 puts each pass on one cluster" in line
    assert "--allow-gaps labels it anyway" in line


def test_a_missing_extra_anchor_per_pass_is_refused_with_the_extra_count(decode_trace,
                                                                          tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    line = refused(layers(trace, out, "--passes", "6"), "pass 1 crosses a cadence break", out)
    assert "from match 8 (L0" in line and "to match 9 (L1" in line
    assert "and 4 more such gap(s)" in line
    assert "either --extra-anchors-per-pass 1, or --num-layers 9, puts each pass on one " \
           "cluster" in line


def test_a_layer_count_that_swallows_the_output_head_is_refused(decode_trace, tmp_path):
    """The issue's `--num-layers 41` with the output head as extra: even one pass shows it,
    because a pass's trailing extra belongs to its cadence."""
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    line = refused(layers(trace, out, "--extra-anchors-per-pass", "1", num_layers="9"),
                   "pass 0 crosses a cadence break", out)
    assert "from match 8 (L8, ts" in line and "to match 9 (extra anchor 1, ts" in line
    assert "check --anchor-offset, --extra-anchors-per-pass and --num-layers" in line
    assert "either --extra-anchors-per-pass 0, or --num-layers 8, puts each pass" in line


def test_allow_gaps_is_accepted_and_recorded(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    result = layers(trace, out, "--extra-anchors-per-pass", "1", "--allow-gaps", offset="5")
    assert result.returncode == 0, result.stderr.decode()
    report = report_of(out)
    assert report["options"]["layers"]["allow_gaps"] is True
    cadence = report["cadence"]
    assert cadence["allow_gaps"] is True and cadence["breaks"] == 1
    assert cadence["median_layer_gap_us"] == 62.625 and cadence["gap_factor"] == 3.0
    assert cadence["first_break"]["pass_index"] == 0
    assert (cadence["first_break"]["from_index"], cadence["first_break"]["to_index"]) == (8, 9)
    assert "override --allow-gaps: 1 layer gap(s) cross a cadence break (first in pass 0" in (
        result.stderr.decode())
    assert_verified(trace, out)


def test_outputs_of_earlier_versions_still_verify(decode_trace, tmp_path):
    """A report without the override options comes from before the checks: verify re-plans
    it without them (it proves the output is its source plus the additions)."""
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    result = layers(trace, out, "--allow-gaps", "--allow-several-anchor-names", regex="rope",
                    offset="5")
    assert result.returncode == 0, result.stderr.decode()
    report = Path(f"{out}.layers.json")
    data = json.loads(report.read_text())
    for key in ("allow_gaps", "allow_several_anchor_names", "gap_factor"):
        del data["options"]["layers"][key]
    report.write_text(json.dumps(data))
    assert_verified(trace, out)


def test_gap_factor_is_the_rule_of_anchors(decode_trace, tmp_path):
    """The sample's pass gap is ~3.7 x the layer gap: a factor of 4 does not see it."""
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    result = layers(trace, out, "--extra-anchors-per-pass", "1", "--gap-factor", "4",
                    offset="5")
    assert result.returncode == 0, result.stderr.decode()
    assert report_of(out)["cadence"]["breaks"] == 0
    assert_refused(layers(trace, tmp_path / "o2.json", "--gap-factor", "1"),
                   "--gap-factor must be > 1")


# -- --passes all and what stays unlabelled ---------------------------------------------


def test_passes_all_labels_every_complete_pass_from_the_offset(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    result = layers(trace, out, "--extra-anchors-per-pass", "1", "--passes", "all",
                    "--end-anchor-regex", TERMINAL, offset="9")
    assert result.returncode == 0, result.stderr.decode()
    report = report_of(out)
    assert report["options"]["layers"]["passes"] == "all"
    assert report["passes"] == 5
    assert [r["anchor_index"] for r in report["layers"]][::8] == [9, 18, 27, 36, 45]
    assert report["selection"] == {"complete_passes": 5, "unlabelled_complete_passes": 0,
                                   "labelled_anchor_count": 40, "matches_outside_selection": 10}
    # 9 before the offset, and the last pass's output head
    assert "labelled 5 of 5 complete passes from offset 9 (10 of 54 matches outside the " \
           "selection" in result.stderr.decode()
    assert_verified(trace, out)


def test_passes_all_still_refuses_too_few_matches(tmp_path):
    from kineto import anchor_trace

    trace = anchor_trace(tmp_path / "t.json", [0, 10, 20])
    out = tmp_path / "out.json"
    refused(run("layers", "--trace", trace, "--output", out, "--anchor-regex", "^a$",
                "--num-layers", "4", "--anchor-offset", "0", "--passes", "all", "--phase", "p",
                "--evidence", "e"), "need 4 anchors from offset 0, found 3", out)
    usage = run("layers", "--trace", trace, "--output", out, "--anchor-regex", "^a$",
                "--num-layers", "1", "--anchor-offset", "0", "--passes", "some", "--phase", "p",
                "--evidence", "e")
    assert usage.returncode == 2 and not out.exists()
    assert "'some' is neither a count nor 'all'" in usage.stderr.decode()


def test_the_summary_says_how_many_complete_passes_stayed_unlabelled(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    result = layers(trace, out, "--extra-anchors-per-pass", "1")
    assert result.returncode == 0, result.stderr.decode()
    assert ("labelled 1 of 6 complete passes from offset 0; 5 complete passes and 46 of 54 "
            "matches stayed unlabelled (`--passes all` labels every one)") in (
        result.stderr.decode())
    assert report_of(out)["selection"] == {
        "complete_passes": 6, "unlabelled_complete_passes": 5, "labelled_anchor_count": 8,
        "matches_outside_selection": 46}


# -- summary wording, elapsed time, next steps ---------------------------------------------


def test_the_summary_accounts_for_every_event_in_words(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    result = layers(trace, out, "--extra-anchors-per-pass", "1", "--passes", "all",
                    "--max-gpu-lanes", "10", "--json")
    assert result.returncode == 0, result.stderr.decode()
    summary = result.stderr.decode()
    data = json.loads(result.stdout)
    read, added = data["original_event_count"], data["added_event_count"]
    relocated = data["compaction"]["relocated_events"]
    retired = len(data["compaction"]["retired_track_metadata"])
    assert relocated > 0 and retired > 0
    unchanged = read - relocated - retired
    assert (f"events: {read:,} read; {unchanged:,} written unchanged, {relocated:,} relocated to "
            f"display lanes, {retired:,} retired (metadata of emptied stream rows, kept in the "
            f"report), {added:,} added ({data['output_event_count']:,} written)") in summary
    assert unchanged + relocated + added == data["output_event_count"]
    assert "anchor_point_only" not in summary and "next_layer_anchor" not in summary
    assert "the last layer's at a zero-length marker at its anchor (no --end-anchor-regex)" in (
        summary)
    assert re.search(r"^elapsed: \d+\.\d s$", summary, re.M)
    assert data["elapsed_seconds"] >= 0
    # every next step runs as printed
    steps = [line.removeprefix("next:").strip() for line in summary.splitlines()
             if line.startswith(("next:", "      tracestream"))]
    assert steps == [f"tracestream verify --trace {shlex.quote(str(trace))} --output "
                     f"{shlex.quote(str(out))}",
                     f"tracestream view --trace {shlex.quote(str(out))}"]
    verify = subprocess.run(TRACESTREAM + shlex.split(steps[0])[1:], capture_output=True)
    assert verify.returncode == 0, verify.stdout.decode() + verify.stderr.decode()


def test_the_report_names_files_relative_to_itself(decode_trace, tmp_path):
    trace, _ = decode_trace
    (tmp_path / "src").mkdir()
    source = tmp_path / "src" / "decode.json"
    source.write_bytes(trace.read_bytes())
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "decode.layers.json"
    report = tmp_path / "reports" / "r.json"
    report.parent.mkdir()
    result = layers(source, out, "--extra-anchors-per-pass", "1", "--report", report)
    assert result.returncode == 0, result.stderr.decode()
    data = json.loads(report.read_text())
    assert data["source_file"] == "../src/decode.json"
    assert data["output_file"] == "../out/decode.layers.json"
    assert data["report_file"] == "r.json"
    assert str(tmp_path) not in report.read_text()
    assert "--report" in result.stderr.decode()  # not the default: verify needs it
    assert_verified(source, out, report)


@pytest.mark.parametrize("path, report, expected", [
    ("/data/runs/t.json.gz", "/data/out/t.layers.json", "../runs/t.json.gz"),
    ("/data/out/t.json", "/data/out/t.layers.json", "t.json"),
    ("/scratch/t.json", "/home/me/out/r.json", "t.json"),  # only the root in common
    ("-", "/home/me/r.json", "-"),
    ("<stdin>", "/home/me/r.json", "<stdin>"),
    ("/dev/fd/63", "/home/me/r.json", "/dev/fd/63"),  # `<(…)`: not `63`
    ("/proc/self/fd/99", "/home/me/r.json", "/proc/self/fd/99"),
])
def test_name_in_report(path, report, expected):
    assert name_in_report(path, report) == expected


def test_name_in_report_follows_a_symlinked_folder_before_dot_dot(tmp_path, monkeypatch):
    """`lk/../o.json` with lk -> real/a/b is real/a/o.json: the report must say so."""
    (tmp_path / "real" / "a" / "b").mkdir(parents=True)
    (tmp_path / "lk").symlink_to(tmp_path / "real" / "a" / "b")
    monkeypatch.chdir(tmp_path)
    assert name_in_report("lk/../o.json", "r.json") == "real/a/o.json"
    assert name_in_report("r.json", "lk/../o.json.layers.json") == "../../r.json"


# -- the library API and batch rows apply the same checks --------------------------------


def test_the_library_names_spec_fields_and_the_cli_names_flags(decode_trace, tmp_path):
    trace, _ = decode_trace
    spec = dict(anchor_regex="rope", num_layers=8, anchor_offset=0, phase="p", evidence="e")
    with pytest.raises(TraceError) as caught:
        add_layer_guides(trace, tmp_path / "a.json", LayerSpec(**spec))
    message = str(caught.value)
    assert message.startswith("anchor_regex 'rope' matches 2 different kernel names")
    assert "anchor_regex='^_q_rope_store$'" in message
    assert "allow_several_anchor_names=True" in message
    with pytest.raises(TraceError, match=r"^num_layers must be >= 1, got 0$"):
        add_layer_guides(trace, tmp_path / "a.json", LayerSpec(**{**spec, "num_layers": 0}))
    with pytest.raises(TraceError, match=r"^pass 1 crosses a cadence break.*"
                                         r"either extra_anchors_per_pass=1, or num_layers=9"):
        add_layer_guides(trace, tmp_path / "a.json",
                         LayerSpec(**{**spec, "anchor_regex": ANCHOR, "passes": "all"}))
    assert not list(tmp_path.iterdir())
    refused(layers(trace, tmp_path / "a.json", num_layers="0"), "--num-layers must be >= 1",
            tmp_path / "a.json")
    done = add_layer_guides(trace, tmp_path / "b.json", LayerSpec(**{
        **spec, "anchor_regex": ANCHOR, "passes": "all", "extra_anchors_per_pass": 1}))
    assert done.data["passes"] == 6 and len(done.data["layers"]) == 48


def test_batch_rows_with_the_mistakes_fail_and_overrides_pass(decode_trace, tmp_path):
    trace, _ = decode_trace
    manifest = tmp_path / "ranks.jsonl"
    rows = [
        {"trace": str(trace), "output": "ok.json", "passes": "all"},
        {"trace": str(trace), "output": "layers9.json", "num_layers": 9},
        {"trace": str(trace), "output": "rope.json", "anchor_regex": "rope"},
        {"trace": str(trace), "output": "rope-allowed.json", "anchor_regex": "rope",
         "allow_several_anchor_names": True},
        {"trace": str(trace), "output": "gaps-allowed.json", "anchor_offset": 5,
         "allow_gaps": True},
    ]
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    done = run("batch", "layers", "--manifest", manifest, "--output-dir", out, "--jobs", "1",
               "--anchor-regex", ANCHOR, "--num-layers", "8", "--anchor-offset", "0",
               "--extra-anchors-per-pass", "1", "--phase", "p", "--evidence", "e")
    assert done.returncode == 1, done.stderr.decode()
    results = {Path(r["output"]).name: r
               for r in map(json.loads, done.stdout.decode().splitlines())}
    assert results["ok.json"]["status"] == "ok" and results["ok.json"]["guides"] == 48
    assert results["layers9.json"]["status"] == "failed"
    assert results["layers9.json"]["error"].startswith("pass 0 crosses a cadence break")
    assert "num_layers" in results["layers9.json"]["error"]
    assert results["rope.json"]["status"] == "failed"
    assert "anchor_regex 'rope' matches 2 different kernel names" in results["rope.json"]["error"]
    assert not (out / "layers9.json").exists() and not (out / "rope.json").exists()
    for name in ("rope-allowed.json", "gaps-allowed.json"):
        assert results[name]["status"] == "ok", results[name]
    assert report_of(out / "rope-allowed.json")["allow_several_anchor_names"] is True
    assert report_of(out / "gaps-allowed.json")["cadence"]["allow_gaps"] is True


# -- real traces: a kernel that runs once per step labels without an override ------------


def per_step_kernel(path: Path) -> tuple[str, int]:
    """The first kernel (in time) that runs exactly once per ProfilerStep, and the steps."""
    events = events_of(load_exact(path))
    steps = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                and str(e.get("name", "")).startswith("ProfilerStep#"))
    kernels = sorted((e for e in events if e.get("ph") == "X"
                      and str(e.get("cat", "")).lower() == "kernel"),
                     key=lambda e: float(e["ts"][1] if isinstance(e["ts"], tuple) else e["ts"]))
    counts: dict[str, int] = {}
    for e in kernels:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
    return next(name for name, n in counts.items() if n == steps), steps


@pytest.mark.parametrize("name", ["hta_train_6streams.json.gz",
                                  "hta_sampled_rank0_5streams.json.gz",
                                  "hta_nccl_gpu_scopes.json.gz", "hta_rocm_mi250.json.gz"])
def test_real_traces_with_a_per_step_kernel_label_without_an_override(name, tmp_path):
    trace = real_trace(name)
    kernel, steps = per_step_kernel(trace)
    pattern = f"^{re.escape(kernel)}$"
    one_pass = tmp_path / "steps.json"
    result = run("layers", "--trace", trace, "--output", one_pass, "--anchor-regex", pattern,
                 "--num-layers", steps, "--anchor-offset", "0", "--phase", "training step",
                 "--evidence", "test: a kernel that runs once per ProfilerStep")
    assert result.returncode == 0, result.stderr.decode()
    report = report_of(one_pass)
    assert report["distinct_anchor_names"] == 1 and report["cadence"]["breaks"] == 0
    assert len(report["layers"]) == steps
    assert_verified(trace, one_pass)
    every_step = tmp_path / "every-step.json"
    result = run("layers", "--trace", trace, "--output", every_step, "--anchor-regex", pattern,
                 "--num-layers", "1", "--passes", "all", "--anchor-offset", "0",
                 "--phase", "training step", "--evidence", "test: once per ProfilerStep")
    assert result.returncode == 0, result.stderr.decode()
    assert report_of(every_step)["passes"] == steps


@pytest.mark.parametrize("name", sorted(PER_STEP_ANCHORS))
def test_the_per_step_anchors_of_the_scale_script_label_every_step(name, tmp_path):
    """The once-per-step kernels the scale benchmark labels real traces with: one kernel
    name each, every step a pass, no override."""
    trace = real_trace(f"{name}.json.gz")
    out = tmp_path / "out.json"
    result = run("layers", "--trace", trace, "--output", out,
                 "--anchor-regex", PER_STEP_ANCHORS[name], "--num-layers", "1",
                 "--anchor-offset", "0", "--passes", "all", "--phase", "training step",
                 "--evidence", "benchmarks/scale.py: a kernel that runs once per step")
    assert result.returncode == 0, result.stderr.decode()
    report = report_of(out)
    assert report["distinct_anchor_names"] == 1
    assert report["passes"] == report["matching_anchor_count"]
    assert report["selection"]["matches_outside_selection"] == 0
