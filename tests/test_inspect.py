"""`inspect` and `anchors`: evidence for layer guides, checked against generator ground truth
and against counts computed independently from real traces."""

from __future__ import annotations

import gzip
import json
import math
import re
import subprocess
import sys
import tracemalloc
from collections import Counter, defaultdict
from decimal import Decimal
from itertools import chain
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from conftest import events_of
from kineto import anchor_trace, kernel, write_trace

from samples.generate import ANCHOR, DRAFT_ANCHOR, TERMINAL, TraceConfig, generate
from tracestream.cli import main
from tracestream.commands.evidence.anchors import (
    HEAD_ROWS,
    TAIL_ROWS,
    _anchors_report,
    anchors_json_rows,
    anchors_lines,
    anchors_summary_json,
    find_anchors,
)
from tracestream.commands.evidence.histograms import (
    cluster_median_gaps,
    gap_histogram,
    size_histogram,
)
from tracestream.commands.evidence.readings import (
    NO_GAP,
    after_last_anchor,
    cross_verdict,
    matches_before,
    outside_windows,
    verdict_text,
    window_counts,
)
from tracestream.commands.evidence.tables import format_table, table_lines
from tracestream.index.matches import MATCH_DTYPE, MatchTable
from tracestream.index.timebase import parse_decimal
from tracestream.index.vocabulary import KernelVocabulary
from tracestream.jsontext import dumps
from tracestream.plan.cadence import cluster_starts

REAL = Path(__file__).resolve().parents[2] / "shared" / "real-traces"
SCRIPT = Path(sys.executable).with_name("tracestream")
ANCHOR_RX = f"^{re.escape(ANCHOR)}$"
TERMINAL_RX = re.escape(TERMINAL)


def run(*args: str, ok: bool = True):
    result = CliRunner().invoke(main, list(args))
    if ok:
        assert result.exit_code == 0, result.output
    return result


def run_json(*args: str) -> dict:
    return json.loads(run(*args, "--json").stdout)


def run_json_rows(*args: str) -> list[dict]:
    """`anchors --json-rows`: one object a line, each line parsed on its own."""
    return [json.loads(line) for line in run(*args, "--json-rows").stdout.splitlines()]


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    """6 decode steps of 8 target layers + 1 extra anchor per pass, with draft passes."""
    folder = tmp_path_factory.mktemp("decode")
    path = folder / "decode.json"
    truth = generate(path, TraceConfig(layers=8, iterations=6))
    return path, truth


# -- pure functions ------------------------------------------------------------


def test_cluster_rule_splits_on_gaps_larger_than_factor_times_median():
    times = [0, 10, 20, 30, 100, 110, 120, 130, 500, 510]
    first, median = cluster_starts(times, factor=3)
    assert median == 10
    assert first.tolist() == [0, 4, 8]
    assert cluster_starts([5])[0].tolist() == [0] and cluster_starts([5])[1] is None
    assert cluster_starts([])[0].tolist() == []


def test_cross_check_counts_only_windows_inside_clusters():
    anchors = np.array([0, 10, 20, 100, 110])
    cross = np.array([5, 15, 16, 50, 105])  # 50 sits in the gap between the clusters
    first, sizes = np.array([0, 3]), np.array([3, 2])
    before = matches_before(anchors, cross)
    counts, inside = window_counts(before, first)
    assert counts.tolist() == [1, 2, 1, 1] and inside.tolist() == [True, True, False, True]
    assert outside_windows(before, first, sizes, len(cross)) == 1
    assert after_last_anchor(before, first, sizes, len(cross)).tolist() == [1, 0]


def test_cross_verdict_reads_the_match_after_the_last_anchor():
    sizes = np.array([3, 3])
    assert "2 layers + 1 extra" in cross_verdict(np.ones(4), np.array([0, 0]), sizes)
    assert "3 layers per pass" in cross_verdict(np.ones(4), np.array([1, 1]), sizes)
    assert cross_verdict(np.array([1, 0, 1, 1]), np.array([0, 0]), sizes).startswith(
        "1 window(s)")


def test_verdict_states_readings_and_never_an_offset():
    text = verdict_text(54, np.arange(6) * 9, np.full(6, 9))
    assert text.startswith("6 clusters of 9: consistent with 9 layers per pass, or 8 layers + 1")
    assert "verify in the model config" in text
    assert "--anchor-offset" not in text
    uneven = verdict_text(23, np.array([0, 5, 14]), np.array([5, 9, 9]))
    assert "unequal size" in uneven and "5 at index 0" in uneven
    tied = verdict_text(20, np.array([0, 5, 10, 14]), np.array([5, 5, 4, 4]))
    assert "2 of 5" in tied and "4 at index 10" in tied  # a tie: the size seen first


@pytest.mark.parametrize("seed", range(6))
def test_cluster_median_gaps_are_each_clusters_own_median(seed):
    """Each cluster's median gap, clusters sorted together a block at a time (blocks much
    smaller than some clusters here), is the median of its own gaps, halves up."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 40, 300)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    between = rng.integers(0, 10**12, int(sizes.sum()) - 1)
    found = cluster_median_gaps(between, first, sizes, block=int(rng.integers(1, 100)))
    for c, (lo, n) in enumerate(zip(first.tolist(), sizes.tolist())):
        inner = between[lo : lo + n - 1]
        assert found[c] == (NO_GAP if n == 1 else math.floor(np.median(inner) + 0.5))


@pytest.mark.parametrize("seed", range(6))
def test_gap_histogram_counts_each_gap_once_and_splits_at_the_threshold(seed):
    rng = np.random.default_rng(seed)
    between = np.concatenate([rng.integers(0, 3, 5), rng.integers(50_000, 70_000, 400),
                              rng.integers(10**5, 10**9, 40)])
    median = float(np.median(between))
    histogram = gap_histogram(between, median, 3.0)
    buckets = histogram["buckets"]
    assert sum(b["count"] for b in buckets) == histogram["gaps"] == len(between)
    for b in buckets:
        low, high = round(b["from_us"] * 1000), round(b["to_us"] * 1000)
        inside = (between <= high) & ((between > low) if high else (between == 0))
        assert b["count"] == int(inside.sum()) > 0
        breaks = between[inside] > 3 * median
        assert bool(breaks.all()) if b["breaks"] else not breaks.any()
    assert [b["to_us"] for b in buckets] == sorted(b["to_us"] for b in buckets)
    assert sum(b["count"] for b in buckets if b["breaks"]) == int((between > 3 * median).sum())


def test_cluster_sizes_are_grouped_by_powers_of_two_only_when_there_are_many():
    assert size_histogram(np.array([9, 9, 4, 9]))["buckets"] == [
        {"from_size": 4, "to_size": 4, "clusters": 1}, {"from_size": 9, "to_size": 9,
                                                         "clusters": 3}]
    many = size_histogram(np.arange(1, 41))
    assert many["clusters"] == 40
    assert [(b["from_size"], b["to_size"], b["clusters"]) for b in many["buckets"]] == [
        (1, 1, 1), (2, 3, 2), (4, 7, 4), (8, 15, 8), (16, 31, 16), (32, 63, 9)]


def test_format_table_aligns_columns():
    text = format_table(["n", "name"], [[1, "a"], [100, "bb"]], [True, False])
    assert text.splitlines() == ["    n  name", "    1  a", "  100  bb"]


def test_table_lines_align_every_batch_to_the_widest_cell_of_all():
    batches = [[["1", "2"], ["a", "-"]], [["12345"], ["{x}"]]]  # the widest come last
    lines = list(table_lines(["n", "name"], lambda: iter(batches), [True, False]))
    assert lines == ["      n  name", "      1  a", "      2  -", "  12345  {x}"]


def test_inspect_counts_object_names_by_their_json_text(tmp_path):
    """A kernel or annotation named by an object or array is reported, not a crash."""
    path = tmp_path / "object-names.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": {"a": 1}, "pid": 0, "tid": 7, "ts": 1.0,
         "dur": 2.0, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 4.0,
         "dur": 2.0, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "user_annotation", "name": ["step", 1], "pid": 1, "tid": 1,
         "ts": 1.0, "dur": 2.0},
    ]}))
    report = run_json("inspect", "--trace", str(path))
    assert {k["name"]: k["count"] for k in report["gpus"][0]["top_kernels"]} == {
        '{"a":1}': 1, "gemm": 1}
    assert report["cpu_annotations"]["top"] == [{"name": '["step",1]', "count": 1}]


@pytest.mark.parametrize("key", ["_compact_gpu_track", "\\u005fcompact_gpu_track"])
def test_inspect_finds_compaction_provenance_however_its_key_is_spelled(tmp_path, key):
    path = tmp_path / "compacted.json"
    other = '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}'
    marked = ('{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1, '
              f'"args": {{"{key}": {{"pid": 0, "tid": 7, "source_event_index": 1, '
              '"had_args": false}}}')
    path.write_text('{"traceEvents": [' + ", ".join([other, marked]) + "]}")
    report = run_json("inspect", "--trace", str(path))
    assert report["compaction_provenance"] == {"present": True, "first_event": 1}


# -- anchors --------------------------------------------------------------------


def test_anchors_find_passes_as_clusters(decode):
    path, truth = decode
    report = run_json("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX)
    assert report["count"] == truth.anchors["0/0"] == 54
    assert (report["pid"], report["device"]) == (0, 0)
    assert [(c["start_index"], c["last_index"], c["count"]) for c in report["clusters"]] == [
        (i * 9, i * 9 + 8, 9) for i in range(6)
    ]
    assert report["rule"].startswith("a gap > 3 x the median gap")
    assert report["verdict"].startswith("6 clusters of 9")
    assert report["median_gap_us"] == pytest.approx(62.625)
    assert all(c["median_gap_us"] == pytest.approx(62.625) for c in report["clusters"])
    matches = run_json_rows("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX)
    assert [m["index"] for m in matches] == list(range(54))
    ts = [Decimal(m["ts_us"]) for m in matches]
    assert ts == sorted(ts)


def test_anchors_exact_timestamps_in_json(decode):
    """--json-rows and the clusters of --json give every ts as the trace's own digits, in
    a string (a double holds 16 of its 19)."""
    path, _ = decode
    out = run("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX,
              "--json-rows").stdout
    texts = re.findall(r'"ts_us":"([0-9.]+)"', out)
    raw = path.read_text()
    assert len(texts) == 54
    assert all(re.fullmatch(r"\d{16}\.\d{3}", t) for t in texts)
    assert all(f'"ts": {t},' in raw for t in texts)
    clusters = run_json("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX)["clusters"]
    assert [c["start_us"] for c in clusters] == texts[::9]


def test_draft_anchor_reports_its_own_count(decode):
    path, truth = decode
    report = run_json("anchors", "--trace", str(path), "--anchor-regex", f"^{DRAFT_ANCHOR}$")
    assert report["count"] == truth.draft_anchors["0/0"]


def test_cross_check_with_terminal_flags_nothing(decode):
    path, truth = decode
    report = run_json("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX,
                      "--cross-check", TERMINAL_RX)
    cross = report["cross_check"]
    assert cross["matches"] == truth.terminals["0/0"] == 48
    assert cross["windows"] == 6 * 8
    assert cross["flagged"] == []
    assert cross["counts"] == {"1": 48}
    assert cross["outside_windows"] == 0
    assert cross["after_last_anchor"] == {"0": 6}
    assert "8 layers + 1 extra anchor per pass" in cross["verdict"]
    text = run("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX,
               "--cross-check", TERMINAL_RX).stdout
    assert "inside a cluster" in text and "not a layer" in text


def _without_terminal(source: Path, target: Path, k: int) -> None:
    """Copy the trace without the k-th terminal kernel in time order (number text untouched)."""
    text = source.read_text()
    spans = []
    for hit in re.finditer(re.escape(f'"name": "{TERMINAL}"'), text):
        start = text.rfind("\n  {", 0, hit.start())
        end = text.find("\n  }", hit.end()) + len("\n  }")
        ts = re.search(r'"ts": ([0-9.]+)', text[start:end]).group(1)
        spans.append((float(ts), start, end))
    spans.sort()
    _, start, end = spans[k]
    if text[start - 1] == ",":  # drop the separator before the event
        start -= 1
    else:  # first event of the array: drop the separator after it
        end += 1
    target.write_text(text[:start] + text[end:])
    json.loads(target.read_text())


def test_cross_check_flags_exactly_the_window_missing_its_terminal(decode, tmp_path):
    path, _ = decode
    k = 19  # third pass (cluster 2), fourth layer
    broken = tmp_path / "broken.json"
    _without_terminal(path, broken, k)
    report = run_json("anchors", "--trace", str(broken), "--anchor-regex", ANCHOR_RX,
                      "--cross-check", TERMINAL_RX)
    first = 9 * (k // 8) + k % 8
    cross = report["cross_check"]
    flagged = [(f["from_index"], f["to_index"], f["count"]) for f in cross["flagged"]]
    assert flagged == [(first, first + 1, 0)]
    assert report["count"] == 54


# -- inspect --------------------------------------------------------------------


def test_inspect_generated_trace(decode):
    path, truth = decode
    report = run_json("inspect", "--trace", str(path))
    assert len(report["gpus"]) == 1
    gpu = report["gpus"][0]
    assert (gpu["pid"], gpu["device"]) == (0, 0)
    assert gpu["streams"] == truth.streams["0/0"]
    assert gpu["max_overlap"] == truth.peak_overlap == 3
    assert gpu["kernels"] == truth.kernels["0/0"]
    assert gpu["memcpy"] == truth.memcpy["0/0"]
    assert gpu["memset"] == truth.memset["0/0"]
    assert gpu["sync"] == truth.sync["0/0"]
    top = {k["name"]: k["count"] for k in gpu["top_kernels"]}
    assert top[ANCHOR] == truth.anchors["0/0"]
    assert top[TERMINAL] == truth.terminals["0/0"]
    assert report["events"] == truth.events
    kinds = {p["pid"]: p["kind"] for p in report["processes"]}
    assert kinds[0] == "GPU" and kinds[4242] == "CPU"
    flows = 2 * sum(truth.gpu_flows.values())  # an s and an f event per launch
    assert report["flow_categories"] == [{"category": "ac2g", "count": flows}]
    assert report["guides"]["count"] == 0 and not report["compaction_provenance"]["present"]
    text = run("inspect", "--trace", str(path), "--top", "3").stdout
    assert "peak overlap" in text and ANCHOR in text


def test_inspect_shows_each_gpus_occupancy_strip_up_to_its_peak(tmp_path):
    """Per GPU, a strip of the most activities at once per column of its span: in the
    JSON its columns (their maximum is the peak overlap), their width and first start as
    exact µs text; in the text one line per GPU, its peak drawn as a full block."""
    path = tmp_path / "two.json"
    generate(path, TraceConfig(gpus=2, iterations=3, layers=4))
    report = run_json("inspect", "--trace", str(path))
    assert len(report["gpus"]) == 2
    text = run("inspect", "--trace", str(path)).stdout.splitlines()
    for gpu in report["gpus"]:
        strip = gpu["occupancy"]
        assert len(strip["columns"]) == 60
        assert max(strip["columns"]) == gpu["max_overlap"] == 3
        assert re.fullmatch(r"\d+\.\d{3}", strip["start_us"])
        assert re.fullmatch(r"\d+\.\d{3}", strip["column_us"])
        span_us = Decimal(strip["column_us"]) * 60
        assert span_us >= Decimal(str(gpu["span_ms"])) * 1000 - 1
        title = next(i for i, line in enumerate(text)
                     if line.startswith(f"  pid {gpu['pid']} device {gpu['device']}: peak 3"))
        drawn = text[title + 1].strip()
        assert len(drawn) == 62 and drawn[0] == drawn[-1] == "|"
        assert [c == "█" for c in drawn[1:-1]] == [n == 3 for n in strip["columns"]]
        assert all((c == " ") == (n == 0) for c, n in zip(drawn[1:-1], strip["columns"]))


_GPU_CATS = {"kernel": "kernels", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
             "cuda_sync": "sync", "Kernel": "kernels", "Memcpy": "memcpy", "Memset": "memset"}


def _independent_gpu_counts(path: Path) -> dict:
    with gzip.open(path) as fh:
        doc = json.load(fh)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    counts: dict = defaultdict(Counter)
    tids: dict = defaultdict(set)
    for ev in events:
        kind = _GPU_CATS.get(ev.get("cat")) if ev.get("ph") == "X" else None
        if kind is None:
            continue
        key = (ev["pid"], (ev.get("args") or {}).get("device"))
        counts[key][kind] += 1
        tids[key].add(ev["tid"])
    return {key: {**{k: counts[key][k] for k in ("kernels", "memcpy", "memset", "sync")},
                  "streams": len(tids[key])} for key in counts}


def _real_traces() -> list[Path]:
    return sorted(REAL.glob("*.json.gz")) if REAL.is_dir() else []


@pytest.mark.parametrize("path", _real_traces() or [None], ids=lambda p: p.name if p else "none")
def test_inspect_counts_match_real_traces(path):
    if path is None:
        pytest.skip(f"{REAL} is absent")
    report = run_json("inspect", "--trace", str(path))
    got = {(g["pid"], g["device"]): {k: g[k] for k in ("kernels", "memcpy", "memset", "sync",
                                                      "streams")}
           for g in report["gpus"]}
    assert got == _independent_gpu_counts(path)
    if "mtia" in path.name:
        assert report["gpus"] == []
        assert "none: no kernel" in run("inspect", "--trace", str(path)).stdout


# -- refusals -------------------------------------------------------------------


def _refused(args: list[str], message: str) -> None:
    result = run(*args, ok=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracestream: error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_refuses_several_pids_without_pid(tmp_path):
    path = tmp_path / "two.json"
    generate(path, TraceConfig(gpus=2, iterations=2, layers=2))
    _refused(["anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX], "--pid")
    report = run_json("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX,
                      "--pid", "1")
    assert (report["pid"], report["device"], report["count"]) == (1, 1, 2 * 3)


def test_refuses_several_devices_without_device(tmp_path):
    path = tmp_path / "devices.json"
    generate(path, TraceConfig(devices_per_pid=2, iterations=2, layers=2))
    _refused(["anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX], "--device")
    report = run_json("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX,
                      "--device", "1")
    assert report["device"] == 1


def test_refuses_invalid_regex_and_no_match(decode):
    path, _ = decode
    _refused(["anchors", "--trace", str(path), "--anchor-regex", "(_q"],
             "not a valid regular expression")
    _refused(["anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX,
              "--cross-check", "[x"], "--cross-check")
    _refused(["anchors", "--trace", str(path), "--anchor-regex", "^no_such_kernel$"],
             "no kernel matches --anchor-regex")


def test_refusal_through_console_script(decode):
    path, _ = decode
    done = subprocess.run([str(SCRIPT), "anchors", "--trace", str(path), "--anchor-regex", "(_q"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.fixture(scope="module")
def long_decode(tmp_path_factory):
    """500 decode steps: 4,500 anchor matches, a few hundred KB of anchors output."""
    path = tmp_path_factory.mktemp("long") / "long.json"
    generate(path, TraceConfig(layers=8, iterations=500))
    return path


def test_thousands_of_matches_stream_whole_and_in_order(long_decode):
    """Rows are written in batches of 4096: every row arrives once, in order, valid JSON."""
    path = long_decode
    matches = run_json_rows("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX)
    assert [m["index"] for m in matches] == list(range(500 * 9))
    assert 500 * 9 > 4096
    text = run("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX, "--all").stdout
    table = _table_after(text, "matches:")
    assert [int(row[0]) for row in table] == list(range(500 * 9))


def _table_after(text: str, title: str) -> list[list[str]]:
    """The cells of the table that follows the line `title` (up to the first blank line),
    without its header; the line saying how many rows are left out is kept whole."""
    lines = text.splitlines()
    start = lines.index(title) + 2
    stop = lines.index("", start) if "" in lines[start:] else len(lines)
    return [[line.strip()] if "…" in line else line.split() for line in lines[start:stop]]


def test_long_tables_show_their_first_and_last_rows_and_all_shows_every_one(long_decode):
    """A long match or cluster table shows its first HEAD_ROWS and last TAIL_ROWS rows
    around one line that says how many are left out; --all shows them all."""
    args = ("anchors", "--trace", str(long_decode), "--anchor-regex", ANCHOR_RX)
    capped = run(*args).stdout
    matches = _table_after(capped, "matches:")
    count = 500 * 9
    assert [int(row[0]) for row in matches if len(row) > 1] == [
        *range(HEAD_ROWS), *range(count - TAIL_ROWS, count)]
    hidden = count - HEAD_ROWS - TAIL_ROWS
    assert matches[HEAD_ROWS] == [f"… {hidden:,} more matches (--all shows every one)"]
    clusters = [line for line in capped.splitlines() if "more clusters" in line]
    assert clusters == [f"  … {500 - HEAD_ROWS - TAIL_ROWS:,} more clusters (--all shows "
                        "every one)"]
    every = run(*args, "--all").stdout
    assert "more matches" not in every and "more clusters" not in every
    assert [int(row[0]) for row in _table_after(every, "matches:")] == list(range(count))
    assert len(every.splitlines()) > count + 500 > len(capped.splitlines()) + 4000


def test_anchors_text_puts_the_verdict_and_clusters_before_the_matches(decode):
    path, _ = decode
    text = run("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX,
               "--cross-check", TERMINAL_RX).stdout
    lines = text.splitlines()
    assert lines[0].startswith(f"anchor {ANCHOR_RX!r} on pid 0 device 0: 54 matches")
    assert lines[1].startswith("verdict: 6 clusters of 9")
    assert lines[2].startswith("cross-check verdict: every cluster has 8 windows")
    order = [next(i for i, line in enumerate(lines) if line.startswith(title))
             for title in ("verdict:", "clusters:", "gaps between consecutive matches:",
                           "cluster sizes (", "cross-check '", "matches:")]
    assert order == sorted(order)
    assert lines[lines.index("matches:") + 1].split() == [
        "index", "t", "ms", "stream", "dur", "us", "gap", "us", "cluster"]


def test_anchors_histograms_count_every_gap_and_every_cluster(decode):
    """The gap histogram holds each of the count - 1 gaps once; the rows above the rule's
    threshold hold exactly the gaps that start a cluster; the size histogram holds each
    cluster once. The text shows the same counts."""
    path, _ = decode
    args = ("anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX)
    report = run_json(*args)
    gaps = report["gap_histogram"]
    assert gaps["gaps"] == sum(b["count"] for b in gaps["buckets"]) == 53
    assert gaps["break_above_us"] == pytest.approx(3 * 62.625, abs=0.001)
    assert sum(b["count"] for b in gaps["buckets"] if b["breaks"]) == 5  # 6 clusters
    assert all(b["from_us"] < b["to_us"] for b in gaps["buckets"])
    assert report["cluster_sizes"] == {
        "clusters": 6, "buckets": [{"from_size": 9, "to_size": 9, "clusters": 6}]}
    text = run(*args).stdout.splitlines()
    start = text.index("gaps between consecutive matches: 53 (a row counts the gaps above "
                       "its first bound, up to and including its second)")
    rows = text[start + 1 : text.index("", start)]
    counts = [int(row.split()[-1]) for row in rows if not row.lstrip().startswith("--")]
    assert counts == [b["count"] for b in gaps["buckets"]] and sum(counts) == 53
    assert any("a gap starts a new cluster" in row for row in rows)
    assert "█" in rows[0]
    sizes = text[text.index("cluster sizes (matches in a cluster): 6 cluster(s)") + 1]
    assert sizes.split()[0] == "9" and sizes.split()[-1] == "6"


def test_json_is_one_summary_object_without_match_rows(long_decode):
    out = run("anchors", "--trace", str(long_decode), "--anchor-regex", ANCHOR_RX,
              "--json").stdout
    assert out.count("\n") == 1
    report = json.loads(out)
    assert "matches" not in report and '"index"' not in out
    assert report["count"] == 500 * 9
    assert len(report["clusters"]) == 500
    assert {"verdict", "gap_histogram", "cluster_sizes", "separation"} <= set(report)


def test_json_rows_write_every_time_as_the_traces_own_digits(tmp_path):
    """ts and dur as the trace wrote them, rel_ms and gap_us as the exact differences (to
    the ns at least, further where the trace's digits go), all in strings."""
    times = ["1700000000123.4567", "1700000000131.111", "1700000000200", "1700000000250.25"]
    trace = anchor_trace(tmp_path / "t.json", times, dur="2.0001")
    lines = run("anchors", "--trace", str(trace), "--anchor-regex", "^a$",
                "--json-rows").stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(rows) == len(times)
    assert [r["ts_us"] for r in rows] == times
    assert {r["dur_us"] for r in rows} == {"2.0001"}
    assert [r["rel_ms"] for r in rows] == ["0.000000", "0.0076543", "0.0765433", "0.1267933"]
    assert [r["gap_us"] for r in rows] == [None, "7.6543", "68.889", "50.250"]
    assert all(isinstance(r[key], str) for r in rows for key in ("ts_us", "dur_us", "rel_ms"))


def test_json_and_json_rows_together_are_refused(decode):
    path, _ = decode
    _refused(["anchors", "--trace", str(path), "--anchor-regex", ANCHOR_RX, "--json",
              "--json-rows"], "--json prints one summary object and --json-rows one line")


@pytest.mark.parametrize("json_flag", ["--all", "--json", "--json-rows"])
def test_printing_into_a_closed_pipe_is_quiet(long_decode, json_flag):
    """`anchors ... | head`: far more than a pipe holds; exit 141 like any Unix tool, no noise."""
    done = subprocess.run(
        f"set -o pipefail; '{SCRIPT}' anchors --trace '{long_decode}' "
        f"--anchor-regex '{ANCHOR_RX}' {json_flag} | head -c 100",
        shell=True, capture_output=True, text=True, executable="/bin/bash")
    assert len(done.stdout) == 100
    assert done.returncode == 141
    assert done.stderr == ""


# -- inputs ---------------------------------------------------------------------


def test_gzip_zstd_and_stdin_give_the_same_json(tmp_path):
    cfg = TraceConfig(layers=4, iterations=3)
    paths = {}
    for suffix in ("json", "json.gz", "json.zst"):
        paths[suffix] = tmp_path / f"t.{suffix}"
        generate(paths[suffix], cfg)
    anchors_args = ["anchors", "--anchor-regex", ANCHOR_RX, "--cross-check", TERMINAL_RX, "--json"]
    outputs = set()
    for path in paths.values():
        outputs.add(run(*anchors_args[:1], "--trace", str(path), *anchors_args[1:]).stdout)
    for suffix in ("json.gz", "json.zst"):  # stdin through the real console script
        with open(paths[suffix], "rb") as fh:
            done = subprocess.run([str(SCRIPT), *anchors_args[:1], "--trace", "-",
                                   *anchors_args[1:]], stdin=fh, capture_output=True, check=True)
        outputs.add(done.stdout.decode())
    assert len(outputs) == 1

    def comparable(report: dict) -> dict:
        return {k: v for k, v in report.items() if k not in ("trace", "compression", "bytes")}

    inspected = [comparable(run_json("inspect", "--trace", str(p))) for p in paths.values()]
    with open(paths["json.zst"], "rb") as fh:
        result = CliRunner().invoke(main, ["inspect", "--trace", "-", "--json"], input=fh.read())
    assert result.exit_code == 0, result.output
    inspected.append(comparable(json.loads(result.stdout)))
    assert all(r == inspected[0] for r in inspected)


def _exact_text(value: Decimal, decimals: int) -> str:
    """`value`'s exact digits with at least `decimals` decimals."""
    whole, _, fraction = format(value.normalize(), "f").partition(".")
    return f"{whole}.{fraction.ljust(decimals, '0')}"


def _expected_lines(path: Path, name: str, report: dict) -> list[bytes]:
    """`--json-rows`' lines worked out from the trace itself: the matches in exact time
    order (ties in file order), each with its event's ts/dur digits, tid and stream,
    rel_ms from the origin and gap_us from the previous match in exact decimals, and the
    cluster that holds its index."""
    with open(path, "rb") as fh:
        raw = gzip.decompress(fh.read()) if str(path).endswith(".gz") else fh.read()
    events = events_of(json.loads(raw, parse_float=str, parse_int=str))
    found = sorted((Decimal(e["ts"]), k) for k, e in enumerate(events) if e.get("name") == name)
    origin = Decimal(report["origin_us"])
    members = {i: c for c, r in enumerate(report["clusters"])
               for i in range(r["start_index"], r["start_index"] + r["count"])}
    lines = []
    for i, (ts, k) in enumerate(found):
        event = events[k]
        lines.append(orjson.dumps({
            "index": i, "ts_us": event["ts"], "dur_us": event["dur"],
            "rel_ms": _exact_text((ts - origin) / 1000, 6),
            "gap_us": _exact_text(ts - found[i - 1][0], 3) if i else None,
            "stream": int(event["args"]["stream"]), "tid": int(event["tid"]),
            "cluster": members[i], "event": k}))
    return lines


@pytest.mark.parametrize("bounds", [(0, 1), (0, 4096), (1, 7), (4090, 4500)])
def test_json_lines_are_the_matches_the_trace_holds(long_decode, backend, bounds):
    """What `anchors --json-rows` writes per batch (one call of `_native.json_rows`), read
    against the trace itself; `rows()` are the same lines read back."""
    report = find_anchors(long_decode, ANCHOR_RX, workers=0)
    rows = report["matches"]
    start, stop = bounds
    expected = _expected_lines(long_decode, ANCHOR, report)[start:stop]
    assert rows.json_lines(start, stop).split(b"\n") == expected
    assert rows[start:stop] == [json.loads(line) for line in expected]


@pytest.mark.parametrize("times", [
    ["1764400000005000", "1764400000005012", "1764400000005030"],  # integers
    ["1764400000005000.5", "1764400000005000.5000001", "1764400000005001.25"],  # as text
    ["-0.004", "0", "0.000", "0.003", "5.5"],  # around 0, mixed forms
    ["5.000", "5.001", "5.009", "5.019"],  # rel_ms below 1e-5
    ["10.5", "1000000000.75", "3000000000.125"],  # rel_ms of more than 15 digits
], ids=["integers", "long-decimals", "near-zero", "tiny-ms", "long-ms"])
def test_json_lines_write_every_number_form_exactly(tmp_path, backend, times):
    trace = anchor_trace(tmp_path / "t.json", times, dur="2")
    report = find_anchors(trace, "^a$", workers=0)
    rows = report["matches"]
    assert rows.json_lines(0, len(rows)).split(b"\n") == _expected_lines(trace, "a", report)
    assert json.loads(rows.json_lines(0, 1))["ts_us"] == times[0]


def test_json_lines_from_an_origin_with_digits_below_a_ns(tmp_path, backend):
    """A CPU op's ts sets the origin, 0.1 ns past a whole ns: every rel_ms has its digits
    below the ns, whole-ns matches (written a column at a time) and others alike."""
    cpu_op = {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 9, "tid": 9, "ts": "99.0000001",
              "dur": "0.5"}
    times = ["100", "100.5", "101.125", "101.0000005", "5000"]
    trace = anchor_trace(tmp_path / "t.json", times, dur="2", extra=[cpu_op])
    report = find_anchors(trace, "^a$", workers=0)
    assert report["origin_us"] == "99.0000001"
    rows = report["matches"]
    assert rows.json_lines(0, len(rows)).split(b"\n") == _expected_lines(trace, "a", report)
    assert [row["rel_ms"] for row in rows] == [
        "0.0009999999", "0.0014999999", "0.0020000004", "0.0021249999", "4.9009999999"]


@pytest.mark.parametrize("times", [
    ["1764400000005000", "1764400000005012", "1764400000009030", "1764400000009031"],
    ["1764400000005000.5", "1764400000005000.5000001", "1764400000009001.25", "1764400000009002"],
    ["-0.004", "0.003", "5.5", "900.000", "900.25"],  # around 0, mixed forms
    ["5.000", "5.001", "5.009", "905.019"],  # three decimals
    ["10.5", "11.5", "1764400000005000.125", "1764400000005001.125"],  # ms of > 15 digits
], ids=["integers", "long-decimals", "near-zero", "three-decimals", "long-ms"])
def test_cluster_rows_are_written_as_dumps_writes_them(tmp_path, backend, times):
    """`anchors --json`'s cluster rows (one C call per batch where the extension is built)
    are the rows as `dumps` writes them, whatever form the times take."""
    trace = anchor_trace(tmp_path / "t.json", times, dur="2")
    clusters = find_anchors(trace, "^a$", workers=0)["clusters"]
    assert len(clusters) == 2
    assert clusters.json_text(0, len(clusters)) == dumps(clusters.rows(0, len(clusters)))[1:-1]


@pytest.mark.parametrize("bounds", [(0, 1), (0, 400), (7, 500)])
def test_cluster_rows_of_a_long_trace_are_written_as_dumps_writes_them(long_decode, backend,
                                                                       bounds):
    clusters = find_anchors(long_decode, ANCHOR_RX, workers=0)["clusters"]
    assert clusters.json_text(*bounds) == dumps(clusters.rows(*bounds))[1:-1]


def test_match_rows_agree_with_the_events_they_name(long_decode):
    """Every row `anchors --json-rows` writes, read against the trace itself: its event's
    exact ts/dur text, tid and stream; rel_ms from the origin, gap_us from the previous
    row, its cluster's range."""
    report = find_anchors(long_decode, ANCHOR_RX, workers=0)
    written = b"".join(anchors_json_rows(report))
    assert written.endswith(b"\n")
    assert written[:-1].split(b"\n") == _expected_lines(long_decode, ANCHOR, report)


# -- memory in kind: packed matches, rows made a batch at a time ------------------


def _index_of(count: int, cross: bool) -> SimpleNamespace:
    """An index holding `count` anchor matches (9 a pass) in packed tables, and as many
    cross-check matches between them; nothing else is read by the anchors report."""
    tracks, groups = [(0, 7)], [(0, 0)]

    def table(offset: int) -> MatchTable:
        packed = MatchTable(tracks, groups)
        packed.intern_name("a"), packed.intern_stream(7)
        rows = np.zeros(count, MATCH_DTYPE)
        k = np.arange(count)
        rows["ordinal"] = 2 * k + (offset > 0)
        rows["start"] = 1764400000000000000 + k * 62625 + (k // 9) * 400000 + offset
        rows["dur"] = 3125
        packed.extend(rows, {})
        assert len(packed.starts) == count  # joined before memory is measured, as the index is
        return packed

    matches = {"anchor": table(0)}
    if cross:
        matches["cross"] = table(5000)
    return SimpleNamespace(matches=matches, origin=parse_decimal("1764400000000000"),
                           origin_text="1764400000000000", close=lambda: None,
                           kernel_vocabulary=KernelVocabulary())


def _report_peak(count: int, cross: bool, text: bool) -> int:
    """Peak bytes allocated while the anchors report is made and written, beyond its
    packed tables."""
    index = _index_of(count, cross)
    tracemalloc.start()
    try:
        report = _anchors_report(index, "^a$", None, None, "^c$" if cross else None, 3.0)
        pieces = (anchors_lines(report, all_rows=True) if text else
                  chain(anchors_summary_json(report), anchors_json_rows(report)))
        for _ in pieces:
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("cross, text, count, per_match", [
    (False, False, 200_000, 32), (True, False, 200_000, 40), (True, True, 50_000, 40)],
    ids=["json", "cross-check-json", "cross-check-text"])
def test_anchors_memory_does_not_grow_by_an_object_per_match(cross, text, count, per_match):
    """200,000 matches (a 1 GB nightly trace) cost the report a few packed bytes each
    beyond the match tables (the sort's order, the gaps while clustering), never a row,
    key or tuple per match or cluster (those took 168 bytes a match, 722 with the
    cross-check): the bound 10,000 matches meet (rows are written 4,096 at a time) grows
    by at most `per_match` bytes a match. (The text is checked on fewer matches:
    tracemalloc slows its many strings.)"""
    small = _report_peak(10_000, cross, text)
    large = _report_peak(count, cross, text)
    assert large < small + count * per_match, (small, large)


@pytest.mark.parametrize("widest_duration", ["kept as text", "three decimals"])
def test_anchors_table_widths_come_from_its_widest_rows_alone(widest_duration, tmp_path,
                                                              monkeypatch):
    """The text table's widths pass formats only the few rows that can be widest (the
    extremes of each number column, per number form; one row per stream; rows kept as
    text), and the table is what formatting every row twice gave. Each column's widest
    cell sits in the middle of a batch (50 rows) and at no other extreme: a stream
    name (row 70), a gap (40), and a duration kept as text (90) or one with three
    decimals smaller than an integer one of the same batch (110, 112)."""
    from tracestream.commands.evidence import rows as evidence

    events = []
    for k in range(120):
        ns = k * 62_625 + (10**9 if k >= 40 else 0)
        ts, dur, stream = f"{1764400000000000 + ns // 1000}.{ns % 1000:03d}", "3.125", 7
        if k == 70:
            stream = "a long stream name"
        if k == 90 and widest_duration == "kept as text":
            dur = "3.1250000"
        if k == 110 and widest_duration == "three decimals":
            dur = "999.125"
        if k == 112:
            ts, dur = ts[:-4], "50000"  # whole µs
        events.append(kernel("a", ts, dur, stream=stream))
    trace = write_trace(tmp_path / "t.json", events)
    report = find_anchors(trace, "^a$", workers=0)
    monkeypatch.setattr(evidence.StreamedRows, "batches",
                        lambda self, size=50: _ranges(len(self), size))
    formatted = []
    table_columns = evidence.MatchRows.table_columns

    def counted(self, start, stop):
        formatted.append(stop - start)
        return table_columns(self, start, stop)

    monkeypatch.setattr(evidence.MatchRows, "table_columns", counted)
    lines = list(anchors_lines(report, all_rows=True))
    assert sum(formatted) - 120 < 120 // 3  # the widths pass: a few rows a batch, not all
    monkeypatch.setattr(evidence.MatchRows, "widest_columns", lambda self: (
        table_columns(self, start, stop) for start, stop in self.batches()))
    assert lines == list(anchors_lines(report, all_rows=True))


def _ranges(count: int, size: int):
    return ((start, min(start + size, count)) for start in range(0, count, size))


def test_cross_check_counts_in_exact_time_below_a_nanosecond(tmp_path):
    """Anchors and cross-check matches in the same ns are ordered by their exact digits:
    5.0004 is before the anchor at 5.0005, 5.0006 after it; a match at exactly an
    anchor's time opens that anchor's window (counts come from arrays, ties from the
    exact values)."""
    anchors = ["5.0005", "10", "15.5", "20", "400", "405.5000001", "410"]
    cross = ["5.0004", "5.0006", "10.000", "15.4999999", "15.5000001", "405.5", "405.5000001"]
    trace = anchor_trace(tmp_path / "t.json", anchors, terminals=[(t, "0.5") for t in cross])
    report = find_anchors(trace, "^a$", cross_check="^t$", workers=0)
    assert [(c["start_index"], c["count"]) for c in report["clusters"]] == [(0, 4), (4, 3)]
    exact = [Decimal(t) for t in anchors]
    expected = [sum(exact[i] <= Decimal(c) < exact[i + 1] for c in cross)
                for i in (0, 1, 2, 4, 5)]
    assert expected == [1, 2, 1, 1, 1]
    check = report["cross_check"]
    assert check["counts"] == {"1": 4, "2": 1}
    assert [(f["from_index"], f["count"]) for f in check["flagged"]] == [(1, 2)]
    assert check["outside_windows"] == 1  # 5.0004, before the first anchor
    assert check["after_last_anchor"] == {"0": 2}


def test_matches_in_one_ns_are_ordered_by_their_exact_digits(tmp_path):
    """Starts equal in ns but apart below it are put in exact order (file order only
    breaks exact ties): the packed ns alone would keep the file's order."""
    times = ["7.0002", "7.0001", "3", "7", "7.000", "12"]
    trace = anchor_trace(tmp_path / "t.json", times)
    rows = find_anchors(trace, "^a$", workers=0)["matches"]
    assert [(str(r["ts_us"]), r["event"]) for r in rows] == [
        ("3", 2), ("7", 3), ("7.000", 4), ("7.0001", 1), ("7.0002", 0), ("12", 5)]


@pytest.mark.parametrize("times, factor", [
    ((0, 10, 20, 500), "1e15"),  # a threshold past every gap
    ((0, 10, 20, 500), "1e308"),  # a threshold past every number (inf)
    ((0, 5e15), "3"),  # a gap of 5e18 ns: the next decade of buckets is past int64
    ((-4e15, 4e15), "3"),  # 8e18 ns
], ids=["factor-1e15", "factor-1e308", "gap-5e18-ns", "gap-8e18-ns"])
def test_anchors_gap_histogram_at_the_edges_of_int64(tmp_path, times, factor):
    trace = anchor_trace(tmp_path / "t.json", [f"{t:.0f}" for t in times])
    result = CliRunner().invoke(main, ["anchors", "--trace", str(trace), "--anchor-regex", "^a$",
                                       "--gap-factor", factor, "--quiet"])
    assert result.exit_code == 0, result.output
    summary = CliRunner().invoke(main, ["anchors", "--trace", str(trace), "--anchor-regex",
                                        "^a$", "--gap-factor", factor, "--json", "--quiet"])
    histogram = orjson.loads(summary.stdout)["gap_histogram"]
    assert sum(b["count"] for b in histogram["buckets"]) == len(times) - 1
    # no gap is above a threshold that is past them all
    assert not any(b["breaks"] for b in histogram["buckets"]) or factor == "3"
