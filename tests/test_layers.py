"""`tracestream layers`: verified layer guides, end to end through the CLI and the API."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
from pathlib import Path

import pytest
import zstandard
from conftest import (
    ANCHOR,
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
from kineto import anchor_trace, kernel, write_trace

from samples.generate import DRAFT_ANCHOR, TraceConfig, generate
from tracestream import LayerSpec, add_layer_guides
from tracestream.plan.guidetext import GuideEvents
from tracestream.read.document import DocumentScanner


def raw_events(path: Path) -> list[bytes]:
    scanner = DocumentScanner([read_bytes(path)])
    return [bytes(r) for chunk in scanner.chunks() for r in chunk.events]


def report_of(output: Path, kind: str = "layers") -> dict:
    return json.loads(Path(f"{output}.{kind}.json").read_text())


def guides_in(output: Path) -> list[dict]:
    return [e for e in events_of(load_exact(output)) if e.get("cat") == "layer_guide"]


def test_guides_label_every_pass_and_verify(decode_trace, tmp_path):
    trace, truth = decode_trace
    out = tmp_path / "out.json"
    result = run(*layers_args(trace, out, "--end-anchor-regex", TERMINAL))
    assert result.returncode == 0, result.stderr.decode()
    summary = result.stderr.decode()
    assert not result.stdout
    assert "L0 … L7" in summary and "6 pass(es)" in summary and "54 matches" in summary
    report = report_of(out)
    assert report["matching_anchor_count"] == truth.anchors["0/0"] == 54
    rows = report["layers"]
    assert [r["layer_id"] for r in rows] == list(range(8)) * 6
    assert [r["anchor_index"] for r in rows] == [
        p * 9 + layer for p in range(6) for layer in range(8)
    ]
    assert {r["boundary_kind"] for r in rows[7::8]} == {"terminal_kernel_end"}
    guides = guides_in(out)
    assert [g["name"] for g in guides] == [f"L{i}" for i in range(8)] * 6
    track = [e for e in events_of(load_exact(out)) if e.get("name") == "thread_name"
             and e["args"]["name"].startswith("Layer guide")]
    assert track[0]["args"]["name"] == "Layer guide (target-verify) — anchor intervals"
    assert_verified(trace, out)


def test_draft_kernels_between_passes_stay_unlabelled(decode_trace, tmp_path):
    """Guides never stretch across the draft passes between two target passes."""
    trace, _ = decode_trace
    for extra in ([], ["--end-anchor-regex", TERMINAL]):
        out = tmp_path / f"out{len(extra)}.json"
        assert run(*layers_args(trace, out, *extra, passes=2)).returncode == 0
        events = events_of(load_exact(out))
        drafts = [float(e["ts"][1]) for e in events if e.get("name") == DRAFT_ANCHOR]
        for g in guides_in(out):
            start, end = g["ts"], g["ts"] + g["dur"]
            assert not any(start < t < end for t in drafts), g["name"]
        last = [g for g in guides_in(out) if g["name"] == "L7"]
        if not extra:
            assert all(g["dur"] == 0 for g in last)
            assert all(g["args"]["boundary_kind"] == "anchor_point_only" for g in last)
        assert_verified(trace, out)


def test_unchanged_events_are_a_byte_identical_prefix(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    assert run(*layers_args(trace, out)).returncode == 0
    source, output = raw_events(trace), raw_events(out)
    assert output[: len(source)] == source
    report = report_of(out)
    assert len(output) == len(source) + report["added_event_count"]


def test_bare_array_input(traces, tmp_path):
    trace, _ = traces("bare.json", iterations=2, bare_array=True)
    out = tmp_path / "out.json"
    assert run(*layers_args(trace, out, passes=2)).returncode == 0
    assert isinstance(load_exact(out), list)
    assert_verified(trace, out)


def test_first_layer_numbers_a_pipeline_partition(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    assert run(*layers_args(trace, out, "--first-layer", "20", passes=1)).returncode == 0
    assert [g["name"] for g in guides_in(out)] == [f"L{i}" for i in range(20, 28)]
    assert [r["layer_id"] for r in report_of(out)["layers"]] == list(range(20, 28))


def test_fractional_6e12_timestamps_give_integer_non_overlapping_guides(traces, tmp_path):
    trace, _ = traces("since_boot.json", iterations=2, epoch_us=6_123_456_789_012)
    out = tmp_path / "out.json"
    assert run(*layers_args(trace, out, passes=2)).returncode == 0
    guides = guides_in(out)
    assert all(isinstance(g["ts"], int) and isinstance(g["dur"], int) for g in guides)
    for a, b in zip(guides, guides[1:]):
        assert a["ts"] + a["dur"] <= b["ts"]
    # the exact anchor values are kept in the report and in the guide args, digit for digit
    rows = report_of(out)["layers"]
    source_text = read_bytes(trace).decode()
    raw_report = Path(f"{out}.layers.json").read_text()
    for row in rows:
        text = re.search(r'"start_us": ([0-9.]+)', raw_report[raw_report.index(
            f'"anchor_index": {row["anchor_index"]},'):]).group(1)
        assert f'"ts": {text},' in source_text
        assert re.fullmatch(r"61234\d{8}\.\d{3}", text)
    assert raw_events(out)[: len(raw_events(trace))] == raw_events(trace)
    assert_verified(trace, out)


def test_pid_and_device_selection(traces, tmp_path):
    trace, _ = traces("two_gpus.json", iterations=2, gpus=2)
    out = tmp_path / "refused.json"
    line = assert_refused(run(*layers_args(trace, out, passes=2)), "several processes", out)
    assert "pid 0: 18" in line and "pid 1: 18" in line
    out = tmp_path / "pid1.json"
    assert run(*layers_args(trace, out, "--pid", "1", passes=2)).returncode == 0
    assert {g["pid"] for g in guides_in(out)} == {1}
    assert report_of(out)["pid"] == 1
    assert_verified(trace, out)

    trace, _ = traces("two_devices.json", iterations=2, devices_per_pid=2)
    out = tmp_path / "refused2.json"
    assert_refused(run(*layers_args(trace, out, passes=2)), "several devices", out)
    out = tmp_path / "dev1.json"
    assert run(*layers_args(trace, out, "--device", "1", passes=2)).returncode == 0
    assert report_of(out)["device"] == 1
    assert_verified(trace, out)


def test_stride_two_with_one_extra_anchor_per_pass(tmp_path):
    trace = anchor_trace(tmp_path / "t.json", [0, 10, 20, 30, 40, 100, 110, 120, 130, 140])
    out = tmp_path / "out.json"
    result = run("layers", "--trace", trace, "--output", out, "--anchor-regex", "^a$",
                 "--num-layers", "2", "--anchor-offset", "0", "--passes", "2",
                 "--anchor-stride", "2", "--extra-anchors-per-pass", "1",
                 "--phase", "p", "--evidence", "e")
    assert result.returncode == 0, result.stderr
    assert [r["anchor_index"] for r in report_of(out)["layers"]] == [0, 2, 5, 7]
    assert [(g["ts"], g["dur"]) for g in guides_in(out)] == [(0, 20), (20, 0), (100, 20), (120, 0)]
    assert_verified(trace, out)


def test_stride_two_terminal_after_the_skipped_sub_layer_anchor(tmp_path):
    trace = anchor_trace(tmp_path / "t.json", [0, 10, 20, 30],
                         terminals=[("15", "1"), ("35", "2.5")])
    out = tmp_path / "out.json"
    result = run("layers", "--trace", trace, "--output", out, "--anchor-regex", "^a$",
                 "--num-layers", "2", "--anchor-offset", "0", "--anchor-stride", "2",
                 "--end-anchor-regex", "^t$", "--phase", "p", "--evidence", "e")
    assert result.returncode == 0, result.stderr
    rows = report_of(out)["layers"]
    assert rows[1]["boundary_kind"] == "terminal_kernel_end" and rows[1]["end_us"] == 37.5
    assert rows[1]["guide_end_us"] == 38
    assert_verified(trace, out)


def _layers(trace, out, *extra, layers="2", offset="0", evidence="e", regex="^a$"):
    return run("layers", "--trace", trace, "--output", out, "--anchor-regex", regex,
               "--num-layers", layers, "--anchor-offset", offset, "--phase", "p",
               "--evidence", evidence, *extra)


@pytest.mark.parametrize(
    "times, terminals, extra, fragment",
    [
        ([0, 10], [], ["--passes", "2"], "need 4 anchors from offset 0, found 2"),
        ([0, 10, 20], [("1", "1")], ["--end-anchor-regex", "^t$"], "no terminal kernel"),
        ([0, 10, 20], [("1", "1"), ("2", "1"), ("11", "1")], ["--end-anchor-regex", "^t$"],
         "2 terminal kernels"),
        ([0, 10, 20], [("1", "12"), ("11", "1")], ["--end-anchor-regex", "^t$"],
         "ends after the next anchor"),
        ([0, 10, 10, 20], [], ["--passes", "1"], "duplicate anchor times"),
    ],
)
def test_anchor_refusals(tmp_path, times, terminals, extra, fragment):
    trace = anchor_trace(tmp_path / "t.json", times, terminals=terminals)
    out = tmp_path / "out.json"
    if fragment == "duplicate anchor times":
        extra = ["--num-layers", "4"]
        result = run("layers", "--trace", trace, "--output", out, "--anchor-regex", "^a$",
                     "--anchor-offset", "0", "--phase", "p", "--evidence", "e", *extra)
    else:
        result = _layers(trace, out, *extra)
    assert_refused(result, fragment, out, Path(f"{out}.layers.json"))


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(regex="^nothing$"),
         "no kernel matches --anchor-regex '^nothing$'; closest kernel names: 'a'"),
        (dict(regex="(unclosed"), "not a valid regular expression"),
        (dict(offset="-1"), "--anchor-offset must be >= 0"),
        (dict(evidence=""), "--evidence must not be empty"),
        (dict(evidence="   "), "--evidence must not be empty"),
    ],
)
def test_option_refusals(tmp_path, kwargs, fragment):
    trace = anchor_trace(tmp_path / "t.json", [0, 10, 20])
    out = tmp_path / "out.json"
    assert_refused(_layers(trace, out, **kwargs), fragment, out, Path(f"{out}.layers.json"))


def test_already_annotated_trace_is_refused(tmp_path):
    trace = anchor_trace(tmp_path / "t.json", [0, 10, 20])
    first = tmp_path / "first.json"
    assert _layers(trace, first).returncode == 0
    again = tmp_path / "again.json"
    assert_refused(_layers(first, again), "start from the original trace", again)


def test_output_refusals(tmp_path):
    trace = anchor_trace(tmp_path / "t.json", [0, 10, 20])
    before = trace.read_bytes()
    existing = tmp_path / "exists.json"
    existing.write_text("keep me")
    assert_refused(_layers(trace, existing), "already exists")
    assert existing.read_text() == "keep me"
    assert_refused(_layers(trace, trace), "is the input trace")
    link = tmp_path / "link.json"
    link.symlink_to(trace)
    assert_refused(_layers(trace, link), "is the input trace")
    hard = tmp_path / "hard.json"
    os.link(trace, hard)
    assert_refused(_layers(trace, hard), "is the input trace")
    missing = tmp_path / "no" / "such" / "dir.json"
    assert_refused(_layers(trace, missing), "does not exist", missing)
    out = tmp_path / "out.json"
    Path(f"{out}.layers.json").write_text("{}")
    assert_refused(_layers(trace, out), "report", out)
    assert_refused(_layers(trace, "-"), "needs --report")
    assert trace.read_bytes() == before


@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".json.zst"])
def test_compressed_round_trips(decode_trace, tmp_path, suffix):
    trace, _ = decode_trace
    source = tmp_path / f"in{suffix}"
    data = trace.read_bytes()
    if suffix == ".json.gz":
        data = gzip.compress(data)
    elif suffix == ".json.zst":
        data = zstandard.ZstdCompressor().compress(data)
    source.write_bytes(data)
    for out_suffix in (".json", ".json.gz", ".json.zst"):
        out = tmp_path / f"out{suffix}{out_suffix}"
        assert run(*layers_args(source, out, passes=1)).returncode == 0
        head = out.read_bytes()[:4]
        assert (head[:2] == b"\x1f\x8b") == out_suffix.endswith(".gz")
        assert (head == b"\x28\xb5\x2f\xfd") == out_suffix.endswith(".zst")
        assert_verified(source, out)


def test_gzip_output_levels(decode_trace, tmp_path):
    """Default: ISA-L's fast level; `--compress-level N` is zlib's. Both are plain gzip."""
    trace, _ = decode_trace
    outputs = {}
    for level in (None, 1, 9):
        (tmp_path / str(level)).mkdir()
        out = tmp_path / str(level) / "out.json.gz"  # the name goes into the trace
        extra = () if level is None else ("--compress-level", str(level))
        assert run(*layers_args(trace, out, *extra, passes=1)).returncode == 0
        outputs[level] = out.read_bytes()
    plain = {level: gzip.decompress(data) for level, data in outputs.items()}
    assert plain[None] == plain[1] == plain[9]
    assert outputs[1] != outputs[None]  # zlib's level 1 is not what the default writes
    assert len(outputs[9]) < len(outputs[None])


def test_stdin_and_stdout(decode_trace, tmp_path):
    trace, _ = decode_trace
    report = tmp_path / "r.json"
    result = run(*layers_args("-", "-", "--report", report, passes=1), stdin=trace.read_bytes())
    assert result.returncode == 0, result.stderr.decode()
    out = tmp_path / "out.json"
    out.write_bytes(result.stdout)
    assert len(guides_in(out)) == 8
    data = json.loads(report.read_text())
    assert data["source_file"] == "<stdin>"
    assert data["source_sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert_verified(trace, out, report)


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
def test_report_names_the_sha256_of_the_bytes_read(decode_trace, tmp_path, compression):
    """The hash is of the file as it lies on disk (compressed or not), as `sha256sum` gives it,
    from a file or from a pipe."""
    trace, _ = decode_trace
    data = {"none": lambda b: b, "gzip": gzip.compress,
            "zstd": zstandard.ZstdCompressor().compress}[compression](trace.read_bytes())
    source = tmp_path / f"trace.json.{compression}"
    source.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    spec = LayerSpec(anchor_regex=ANCHOR, num_layers=8, anchor_offset=0, phase="target-verify",
                     evidence="test", passes=1)
    report = add_layer_guides(source, tmp_path / "from-file.json", spec)
    assert report.data["source_sha256"] == expected
    assert report_of(tmp_path / "from-file.json")["source_sha256"] == expected
    report = add_layer_guides("-", tmp_path / "from-pipe.json", spec, stdin=io.BytesIO(data))
    assert report.data["source_sha256"] == expected


def test_json_summary_is_one_line(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    result = run(*layers_args(trace, out, "--json", "--quiet", passes=1))
    lines = result.stdout.decode().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["num_layers"] == 8


def test_library_api_from_a_notebook(decode_trace, tmp_path):
    trace, _ = decode_trace
    out = tmp_path / "nb.json"
    report = add_layer_guides(trace, out, LayerSpec(
        anchor_regex=ANCHOR, num_layers=8, anchor_offset=9, phase="target-verify",
        evidence="checked in the model config", passes=2, extra_anchors_per_pass=1))
    assert report.data["layers"][0]["anchor_index"] == 9
    assert "L0 … L7" in report.summary()


def test_guide_events_go_out_as_the_blocks_of_text_they_are_made_as(decode_trace, tmp_path,
                                                                    monkeypatch):
    """The rewrite writes each block of guide events as the one text it is made as, never
    split into a bytes object per guide and joined again (a nightly job writes 10^5-10^6
    guides); the events are those of the one-by-one blocks."""
    monkeypatch.setattr(GuideEvents, "blocks", lambda self: pytest.fail(
        "the guide events were split one by one"))
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    add_layer_guides(trace, out, LayerSpec(
        anchor_regex=ANCHOR, num_layers=8, anchor_offset=0, phase="target-verify",
        evidence="test", passes=6, extra_anchors_per_pass=1, end_anchor_regex=TERMINAL))
    guides = guides_in(out)
    assert [g["name"] for g in guides] == [f"L{i}" for i in range(8)] * 6
    monkeypatch.undo()
    assert_verified(trace, out)


REAL_ANCHORS = {  # name: (a pattern of one kernel name, layers: its first matches in one pass)
    "hta_train_6streams.json.gz": (
        "at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add", 4
    ),
    "hta_sampled_rank0_5streams.json.gz": ("permute_2D_lengths_kernel", 3),  # 3 in step 1
    "hta_nccl_gpu_scopes.json.gz": ("cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512,", 3),
    "hta_cuda_sync_multistream.json.gz": (".", 3),
    "hta_rocm_mi250.json.gz": ("FillFunctor<float>", 2),
    "hta_legacy_categories.json.gz": ("elementwise_kernel<128, 4, .*BinaryFunctor", 1),
    "hta_triton_single_kernel.json.gz": ("triton_poi_fused_add_cos_sin_0", 1),
}


@pytest.mark.parametrize("name", sorted(REAL_ANCHORS))
def test_real_traces_get_guides(name, tmp_path):
    trace = real_trace(name)
    pattern, layers = REAL_ANCHORS[name]
    doc = load_exact(trace)
    count = sum(1 for e in events_of(doc) if e.get("ph") == "X"
                and str(e.get("cat", "")).lower() == "kernel" and re.search(pattern, e["name"]))
    out = tmp_path / "out.json.gz"
    result = run("layers", "--trace", trace, "--output", out, "--anchor-regex", pattern,
                 "--num-layers", layers, "--anchor-offset", "0", "--phase", "training step",
                 "--evidence", "test: first matches of a kernel chosen from the trace")
    assert result.returncode == 0, result.stderr.decode()
    assert report_of(out)["matching_anchor_count"] == count
    assert report_of(out)["distinct_anchor_names"] == 1
    assert len(guides_in(out)) == layers
    assert_verified(trace, out)


def test_mtia_trace_without_gpu_has_no_anchor(tmp_path):
    trace = real_trace("hta_mtia_no_gpu.json.gz")
    out = tmp_path / "out.json"
    assert_refused(_layers(trace, out, regex="."),
                   "no kernel matches --anchor-regex '.'; the trace has no kernels", out)


def test_kernels_named_like_anchors_outside_kernel_category_do_not_count(tmp_path):
    events = [kernel("a", "0", "1"), kernel("a", "5", "1", cat="cpu_op"), kernel("a", "10", "1")]
    trace = write_trace(tmp_path / "t.json", events)
    out = tmp_path / "out.json"
    assert _layers(trace, out).returncode == 0
    assert report_of(out)["matching_anchor_count"] == 2


def test_generated_trace_matches_its_ground_truth(tmp_path):
    truth = generate(tmp_path / "g.json.zst", TraceConfig(iterations=3, layers=4))
    out = tmp_path / "out.json"
    result = run("layers", "--trace", tmp_path / "g.json.zst", "--output", out,
                 "--anchor-regex", ANCHOR, "--num-layers", "4", "--anchor-offset", "0",
                 "--passes", "3", "--extra-anchors-per-pass", "1", "--phase", "p",
                 "--evidence", "e")
    assert result.returncode == 0, result.stderr.decode()
    assert report_of(out)["matching_anchor_count"] == truth.anchors["0/0"] == 15
