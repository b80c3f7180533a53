"""Windows of a trace (`--pass-window`, `--time-window`): the output holds exactly the
events the membership rule admits (checked against a brute-force oracle that reads the
whole trace), verify proves it, restore refuses it, and every mistake is refused."""

from __future__ import annotations

import gzip
import json
import subprocess
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import ROOT, assert_refused, layers_args, read_bytes
from tests.conftest import run as run_process
from tests.kineto import kernel, thread_name, write_trace
from tracestream.cli import main
from tracestream.index.window import FOREVER, Window
from tracestream.plan.window import Pieces, decide_linked, pass_window, time_window

SAMPLE = ROOT / "samples" / "decode_8layers.trace.json.gz"
SAMPLE_LAYERS = ["--anchor-regex", "^_q_rope_store$", "--num-layers", "8", "--anchor-offset",
                 "0", "--extra-anchors-per-pass", "1", "--phase", "decode", "--evidence", "e",
                 "--passes", "all"]
LINKED = {"s": "flow", "t": "flow", "f": "flow", **dict.fromkeys("benSTpF", "async"),
          "B": "B", "E": "E"}


def run(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process (click's runner): as `tests.conftest.run` reports it, without
    a new interpreter for each of this file's many runs."""
    result = CliRunner().invoke(main, [str(a) for a in args], input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout_bytes,
                                       result.stderr_bytes)


# -- the oracle: the rule, read straight from the issue, over the whole trace ----------


def _time(value) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        return None
    return Decimal(value)


def _perfetto_id(value) -> str:
    """A flow id as Perfetto's importer reads it: a number as an unsigned 64-bit integer, a
    string as hexadecimal."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, Decimal)) and value == int(value):
        return str(int(value) % 2**64)
    if isinstance(value, str):
        try:
            return str(int(value, 16) % 2**64)
        except ValueError:
            return "text " + value
    return "other " + repr(value)


def expected_members(events: list[dict], start_ns, end_ns) -> set[int]:
    """Indices of the source events a window [start_ns, end_ns) holds (None: unbounded)."""
    lo = Decimal(-(10**30)) if start_ns is None else Decimal(start_ns)
    hi = Decimal(10**30) if end_ns is None else Decimal(end_ns)

    def point(t):
        return lo <= t < hi

    def span(a, b):
        return (a < hi and b > lo) if b > a else point(a)

    keep: set[int] = set()
    groups: dict = {}
    tracks: dict = {}
    for i, e in enumerate(events):
        ph = e.get("ph")
        ts = _time(e.get("ts"))
        ns = None if ts is None else ts * 1000
        kind = LINKED.get(ph) if isinstance(ph, str) else None
        if ph == "M":
            keep.add(i)
        elif kind in ("flow", "async"):
            groups.setdefault((kind, json.dumps([e.get("cat"), _perfetto_id(e.get("id"))])),
                              []).append((i, ns))
        elif kind in ("B", "E") and ns is not None:
            tracks.setdefault(json.dumps([e.get("pid"), e.get("tid")]), []).append(
                (ns, i, kind))
        elif ns is None:
            keep.add(i)
        elif ph == "X":
            dur = _time(e.get("dur"))
            usable = dur is not None and 0 <= dur < Decimal("9.2e15")
            end = ns + dur * 1000 if usable else ns
            if span(ns, end):
                keep.add(i)
        elif point(ns):
            keep.add(i)
    for (kind, _), members in groups.items():
        times = [t for _, t in members if t is not None]
        if kind == "flow":
            whole = len(times) == len(members) and all(point(t) for t in times)
        else:
            whole = not times or span(min(times), max(times))
        if whole:
            keep.update(i for i, _ in members)
    for rows in tracks.values():
        stack = []
        for ns, i, kind in sorted(rows):
            if kind == "B":
                stack.append((ns, i))
            elif stack:
                start, begin = stack.pop()
                if span(start, ns):
                    keep.update((begin, i))
            elif point(ns):
                keep.add(i)
        keep.update(begin for start, begin in stack if start < hi)
    return keep


def expected_for(report: dict, source: list[dict], start_ns, end_ns) -> list[int]:
    """The oracle's members, less the metadata of stream rows compaction emptied (retired:
    kept in the report, in no output)."""
    compaction = report.get("compaction", report)
    retired = {row["source_event_index"]
               for row in compaction.get("retired_track_metadata", ())}
    return sorted(expected_members(source, start_ns, end_ns) - retired)


def load_decimal(path: Path):
    return json.loads(read_bytes(path), parse_float=Decimal)


def source_indices(output: Path, report: dict, source_events: list[dict]) -> list[int]:
    """The source index of each source event in the output, in order: a moved one by its
    provenance, an unchanged one by finding it (equal as parsed) after the one before."""
    out_events = load_decimal(output)
    out_events = out_events["traceEvents"] if isinstance(out_events, dict) else out_events
    written = out_events[: len(out_events) - report["added_event_count"]]
    found, at = [], 0
    for e in written:
        origin = e.get("args", {}).get("_compact_gpu_track") if isinstance(
            e.get("args"), dict) else None
        if origin is not None:
            at = origin["source_event_index"]
        else:
            while source_events[at] != e:
                at += 1
        found.append(at)
        at += 1
    return found


# -- a hand-made trace with every kind of edge -------------------------------------------


def edge_trace(path: Path) -> Path:
    """Two layers per pass, anchor `a`, passes at 1000 µs steps (pass p's L0 at 1000p +
    100); around the cut at pass 1 (1100 µs) and pass 3 (3100 µs): slices and events of
    every kind, on both sides and across."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        thread_name(0, 7, "stream 7"),
        {"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "CPU"}},
    ]
    for p in range(5):
        events += [kernel("a", f"{1000 * p + 100}.000", "5"),
                   kernel("a", f"{1000 * p + 400}.000", "5")]
    events += [
        kernel("k_cross_start", "1090.5", "20", tid=8),  # crosses 1100
        kernel("k_ends_at_cut", "1080", "20", tid=8),  # ends exactly at 1100: out
        kernel("k_before", "1000", "10", tid=8),
        kernel("k_cross_end", "3095", "10", tid=8),  # crosses 3100: in
        kernel("k_after", "3100", "1", tid=8),  # starts at 3100: out
        kernel("k_zero_at_start", "1100", "0", tid=8),  # a point at the start: in
        kernel("k_sub_ns", "3099.9999", "0", tid=8),  # just before the end: in
        kernel("k_flow_1", "1600", "5"), kernel("k_flow_2", "1200", "5"),
        kernel("k_flow_3", "3150", "5"),
        {"ph": "X", "name": "cpu_op_spans_all", "pid": 9, "tid": 1, "ts": 50, "dur": 5000},
        {"ph": "i", "name": "at_start", "pid": 9, "tid": 1, "ts": 1100, "s": "t"},
        {"ph": "i", "name": "at_end", "pid": 9, "tid": 1, "ts": 3100, "s": "t"},
        {"ph": "C", "name": "mem", "pid": 9, "ts": 2000, "args": {"v": 1}},
        {"ph": "C", "name": "mem", "pid": 9, "ts": 4000, "args": {"v": 2}},
        {"ph": "i", "name": "no_ts", "pid": 9, "tid": 1, "s": "t"},
        {"ph": "i", "name": "odd_ts", "pid": 9, "tid": 1, "ts": "\"soon\"", "s": "t"},
        # flows: inside, across the start, across the end, one without a ts
        {"ph": "s", "id": 1, "cat": "ac2g", "name": "ac2g", "pid": 9, "tid": 1, "ts": 1500},
        {"ph": "f", "id": 1, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 1600,
         "bp": "e"},
        {"ph": "s", "id": 2, "cat": "ac2g", "name": "ac2g", "pid": 9, "tid": 1, "ts": 1050},
        {"ph": "f", "id": 2, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 1200,
         "bp": "e"},
        {"ph": "s", "id": 3, "cat": "ac2g", "name": "ac2g", "pid": 9, "tid": 1, "ts": 3000},
        {"ph": "t", "id": 3, "cat": "ac2g", "name": "ac2g", "pid": 9, "tid": 1, "ts": 3050},
        {"ph": "f", "id": 3, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 3150,
         "bp": "e"},
        {"ph": "s", "id": 4, "cat": "ac2g", "name": "ac2g", "pid": 9, "tid": 1, "ts": 2000},
        {"ph": "f", "id": 4, "cat": "ac2g", "name": "ac2g", "pid": 9, "tid": 6, "bp": "e"},
        {"ph": "s", "id": 1, "cat": "other", "name": "x", "pid": 9, "tid": 1, "ts": 1300},
        {"ph": "f", "id": 1, "cat": "other", "name": "x", "pid": 9, "tid": 1, "ts": 1400},
        # B/E: a pair spanning the window, one inside, an orphan E inside, an open B
        {"ph": "B", "name": "span_all", "pid": 9, "tid": 2, "ts": 500},
        {"ph": "B", "name": "inside", "pid": 9, "tid": 2, "ts": 2000},
        {"ph": "E", "pid": 9, "tid": 2, "ts": 2100},
        {"ph": "E", "pid": 9, "tid": 2, "ts": 4500},
        {"ph": "E", "pid": 9, "tid": 3, "ts": 2500},
        {"ph": "E", "pid": 9, "tid": 3, "ts": 4600},
        {"ph": "B", "name": "open", "pid": 9, "tid": 4, "ts": 1000},
        {"ph": "B", "name": "before", "pid": 9, "tid": 5, "ts": 100},
        {"ph": "E", "pid": 9, "tid": 5, "ts": 200},
        # async: a slice across the start, one wholly after
        {"ph": "b", "id": 7, "cat": "req", "name": "r", "pid": 9, "tid": 1, "ts": 900},
        {"ph": "e", "id": 7, "cat": "req", "name": "r", "pid": 9, "tid": 1, "ts": 1200},
        {"ph": "b", "id": 8, "cat": "req", "name": "r", "pid": 9, "tid": 1, "ts": 3500},
        {"ph": "e", "id": 8, "cat": "req", "name": "r", "pid": 9, "tid": 1, "ts": 3600},
    ]
    return write_trace(path, events)


EDGE_LAYERS = ["--anchor-regex", "^a$", "--num-layers", "2", "--anchor-offset", "0",
               "--phase", "p", "--evidence", "e", "--passes", "all"]


def _layers(trace, output, *extra):
    result = run("layers", "--trace", trace, "--output", output, *EDGE_LAYERS, *extra)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(Path(f"{output}.layers.json").read_text())


@pytest.mark.parametrize("extra", [[], ["--max-gpu-lanes", "6"], ["--workers", "2"]],
                         ids=["plain", "compacted", "workers"])
def test_a_pass_window_holds_exactly_the_rules_events(tmp_path, extra):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "w.json"
    report = _layers(trace, output, "--pass-window", "1:3", *extra)
    source = load_decimal(trace)["traceEvents"]
    expected = expected_for(report, source, 1_100_000, 3_100_000)
    assert source_indices(output, report, source) == expected
    names = {source[i].get("name") for i in expected}
    assert {"k_cross_start", "k_cross_end", "k_zero_at_start", "k_sub_ns", "cpu_op_spans_all",
            "at_start", "span_all", "open", "inside", "no_ts", "odd_ts"} <= names
    assert not {"k_ends_at_cut", "k_after", "k_before", "at_end", "before"} & names
    window = report["window"]
    assert window["passes"] == [1, 3]
    assert window["guides"] == 4 and (window["first_guide"], window["last_guide"]) == (
        "pass 1 L0", "pass 2 L1")
    # flows 2 and 3 cross the edges, 4 has an event without a time (dropped too)
    assert (window["flows_kept"], window["flows_dropped"], window["flows_without_time"]) == (
        2, 3, 1)
    out = load_decimal(output)
    guides = [e for e in out["traceEvents"] if e.get("cat") == "layer_guide"]
    assert sorted({(g["args"]["pass_index"], g["name"]) for g in guides}) == [
        (1, "L0"), (1, "L1"), (2, "L0"), (2, "L1")]
    assert out["tracestream"]["window"] == "--pass-window 1:3"
    assert report["output_event_count"] == len(out["traceEvents"])


def test_a_time_window_holds_exactly_the_rules_events(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "w.json"
    # the origin is the smallest ts: 50 µs; 1.05:2.95 ms from it is [1100, 3000) µs
    report = _layers(trace, output, "--time-window", "1.05:2.95")
    source = load_decimal(trace)["traceEvents"]
    assert source_indices(output, report, source) == sorted(
        expected_members(source, 1_100_000, 3_000_000))
    assert report["window"]["start_us"] == "1100.000"
    assert report["window"]["end_us"] == "3000.000"
    # guides that overlap the window: pass 1 and pass 2 (pass 3's L0 starts at 3100)
    assert (report["window"]["first_guide"], report["window"]["last_guide"]) == (
        "pass 1 L0", "pass 2 L1")


def test_open_ended_windows_run_to_the_edges_of_the_trace(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    source = load_decimal(trace)["traceEvents"]
    tail = _layers(trace, tmp_path / "tail.json", "--pass-window", "3:")
    assert tail["window"]["passes"] == [3, 5] and tail["window"]["end_us"] is None
    assert source_indices(tmp_path / "tail.json", tail, source) == sorted(
        expected_members(source, 3_100_000, None))
    head = _layers(trace, tmp_path / "head.json", "--time-window", ":1")
    assert head["window"]["start_us"] is None
    assert source_indices(tmp_path / "head.json", head, source) == sorted(
        expected_members(source, None, 1_050_000))


def test_the_samples_pass_window_ends_before_the_next_passes_anchor(tmp_path):
    """The edges are the anchors' exact ts, not the guides' whole µs."""
    output = tmp_path / "w.json"  # a new process, as a user runs it
    result = run_process("layers", "--trace", SAMPLE, "--output", output, *SAMPLE_LAYERS,
                         "--max-gpu-lanes", "10", "--pass-window", "2:4")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(Path(f"{output}.layers.json").read_text())
    source = load_decimal(SAMPLE)["traceEvents"]
    start = Decimal(report["window"]["start_us"]) * 1000
    end = Decimal(report["window"]["end_us"]) * 1000
    anchors = sorted(Decimal(e["ts"]) for e in source if e.get("name") == "_q_rope_store")
    assert (anchors[18] * 1000, anchors[36] * 1000) == (start, end)  # 9 matches per pass
    kept = source_indices(output, report, source)
    retired = {row["source_event_index"]
               for row in report["compaction"]["retired_track_metadata"]}
    assert kept == expected_for(report, source, int(start), int(end))
    kept_anchors = [source[i] for i in kept if source[i].get("name") == "_q_rope_store"]
    assert len(kept_anchors) == 18
    metadata = [i for i, e in enumerate(source) if e.get("ph") == "M"]
    assert set(metadata) - retired <= set(kept)
    verified = run("verify", "--trace", SAMPLE, "--output", output)
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()
    assert b"[ok] output as planned" in verified.stdout


def test_verify_finds_a_window_that_is_not_as_planned(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "w.json"
    _layers(trace, output, "--pass-window", "1:3", "--max-gpu-lanes", "6")
    assert run("verify", "--trace", trace, "--output", output).returncode == 0
    text = output.read_bytes()
    cut = output.with_name("cut.json")
    # an event left out (the first crossing kernel), the report unchanged
    start = text.index(b'"name": "k_cross_start"')
    begin, end = text.rindex(b"{", 0, start), text.index(b"}", start) + 1
    cut.write_bytes(text[:begin] + text[end + 2:])
    Path(f"{cut}.layers.json").write_bytes(Path(f"{output}.layers.json").read_bytes())
    result = run("verify", "--trace", trace, "--output", cut)
    assert result.returncode == 1
    assert b"[FAIL] output as planned" in result.stdout
    # the report's counts edited
    report = json.loads(Path(f"{output}.layers.json").read_text())
    report["window"]["flows_dropped"] = 0
    Path(f"{output}.layers.json").write_text(json.dumps(report))
    result = run("verify", "--trace", trace, "--output", output)
    assert result.returncode == 1
    assert b"[FAIL] window: the report's window flows_dropped is 0, the plan's 3" in (
        result.stdout)


def test_restore_refuses_a_window(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "w.json"
    _layers(trace, output, "--time-window", "1:2")
    restored = tmp_path / "back.json"
    assert_refused(run("restore", "--trace", output, "--output", restored),
                   "holds a window of its source (--time-window 1:2), not the whole trace",
                   restored)


def test_a_window_compresses_and_comes_from_stdin(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    plain = tmp_path / "plain.json"
    _layers(trace, plain, "--pass-window", "1:3")
    packed = tmp_path / "w.json.gz"
    result = run("layers", "--trace", "-", "--output", packed, *EDGE_LAYERS,
                 "--pass-window", "1:3", stdin=gzip.compress(trace.read_bytes()))
    assert result.returncode == 0, result.stderr.decode()
    assert gzip.decompress(packed.read_bytes()).replace(b"w.json.gz", b"plain.json") == (
        plain.read_bytes())


def test_compact_takes_a_time_window(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "c.json"
    result = run("compact", "--trace", trace, "--output", output, "--time-window", "2:3")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(Path(f"{output}.compact.json").read_text())
    source = load_decimal(trace)["traceEvents"]
    assert source_indices(output, report, source) == expected_for(
        report, source, 2_050_000, 3_050_000)
    assert run("verify", "--trace", trace, "--output", output).returncode == 0


@pytest.mark.parametrize(("args", "fragment"), [
    (["--pass-window", "²:³"], "--pass-window '²:³' must be FIRST:STOP"),
    (["--pass-window", "١:٢"], "must be FIRST:STOP"),
    (["--pass-window", "3:2"], "holds no pass: STOP must be above FIRST"),
    (["--pass-window", "2"], "must be FIRST:STOP"),
    (["--pass-window", "5:6"], "--pass-window 5:6: the labelled selection has 5 pass(es), "
                               "0 … 4 (STOP may be 5)"),
    (["--pass-window", "1:9"], "the labelled selection has 5 pass(es)"),
    (["--time-window", "2:1"], "--time-window '2:1' is empty: END must be above START"),
    (["--time-window", "1e3:"], "must be START:END in milliseconds"),
    (["--time-window", ":"], "must be START:END"),
    (["--time-window", "100:200"], "--time-window 100:200 holds no event: the trace's events "
                                   "lie between 0 and 5 ms from its origin"),
    (["--time-window", "1:2", "--pass-window", "1:2"], "give one"),
])
def test_window_mistakes_are_refused(tmp_path, args, fragment):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "w.json"
    result = run("layers", "--trace", trace, "--output", output, *EDGE_LAYERS, *args)
    assert_refused(result, fragment, output, Path(f"{output}.layers.json"))


def test_compact_has_no_pass_window(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    result = run("compact", "--trace", trace, "--output", tmp_path / "c.json",
                 "--pass-window", "1:2")
    assert result.returncode == 2
    assert b"No such option '--pass-window'" in result.stderr
    assert not (tmp_path / "c.json").exists()


def _window_with_report_window(tmp_path, window) -> tuple[Path, Path]:
    """(the edge trace, its --pass-window 1:3 output) whose report's options.window is
    edited to `window`."""
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "w.json"
    _layers(trace, output, "--pass-window", "1:3")
    report_path = Path(f"{output}.layers.json")
    report = json.loads(report_path.read_text())
    report["options"]["window"] = window
    report_path.write_text(json.dumps(report))
    return trace, output


@pytest.mark.parametrize("window", [5, {"passes": "1:3"}, {"passes": [3, 1]},
                                    {"times": [1, 2]}])
def test_a_hand_edited_window_in_the_report_is_refused(tmp_path, window):
    trace, output = _window_with_report_window(tmp_path, window)
    for args in (["verify", "--trace", trace, "--output", output],
                 ["restore", "--trace", output, "--output", tmp_path / "back.json"]):
        result = run(*args)
        assert result.returncode == 2, (args, result.stderr.decode())
        assert b"Traceback" not in result.stderr
        assert len(result.stderr.decode().strip().splitlines()) == 1
    assert not (tmp_path / "back.json").exists()


# -- the pure parts ------------------------------------------------------------------


def test_a_pieces_end_is_found_past_the_first_block_of_candidates():
    """The split estimates its candidate cuts a block at a time (memory): the first one
    over the limit is found wherever it lies, in the first block, past it, or nowhere."""
    from tracestream.plan.window import _ESTIMATE_BLOCK, _first_over

    class Sizes:  # a piece's estimate: its length
        @staticmethod
        def estimate(start, ends):
            return ends - start

    candidates = np.arange(0, 3 * _ESTIMATE_BLOCK, dtype=np.int64)
    for limit, at, start, expected in ((10, 0, 0, 11), (_ESTIMATE_BLOCK + 5, 3, 0,
                                                        _ESTIMATE_BLOCK + 6),
                                       (_ESTIMATE_BLOCK, 7, 7, _ESTIMATE_BLOCK + 8),
                                       (10**9, 0, 0, len(candidates))):
        assert _first_over(limit, Sizes, start, candidates, at) == expected


def test_windows_are_half_open():
    w = Window(10, 20)
    ts = np.array([9, 10, 19, 20, 5, 5, 19, 20])
    end = np.array([9, 10, 19, 20, 10, 11, 30, 30])
    assert w.spans(ts, end).tolist() == [False, True, True, False, False, True, True, False]
    assert Window(10).points(np.array([FOREVER - 1])).tolist() == [True]


def test_window_texts_parse_exactly():
    assert pass_window("2:4").passes == (2, 4)
    assert pass_window("2:").passes == (2, None)
    assert time_window("1.000001:").times == ("1.000001", None)
    assert time_window("-1:2").times == ("-1", "2")


def test_linked_groups_are_decided_whole():
    from tracestream.index.records import RecordStore
    from tracestream.index.window import BEGIN, END, FLOW, LINKED_DTYPE

    rows = np.zeros(7, LINKED_DTYPE)
    # a flow inside, a flow across the end, a B/E pair spanning, a lone E outside
    rows[:] = [(0, 1 << 61 | 5, 12, 12, FLOW, True), (1, 1 << 61 | 5, 14, 14, FLOW, True),
               (2, 1 << 61 | 6, 15, 15, FLOW, True), (3, 1 << 61 | 6, 25, 25, FLOW, True),
               (4, 3, 1, 1, BEGIN, True), (5, 3, 40, 40, END, True), (6, 3, 50, 50, END, True)]
    store = RecordStore(LINKED_DTYPE, sort_keys=("key", "ts"), budget=3 * LINKED_DTYPE.itemsize)
    for k in range(0, 7, 2):  # spilled in runs: groups span blocks
        store.append(rows[k:k + 2])
    decided = decide_linked(store, Pieces(np.array([10, 20])))  # piece 1 is [10, 20)
    rows = np.concatenate(list(decided.kept.sorted_blocks()))
    assert [tuple(r) for r in rows.tolist()] == [(0, 1, 1), (1, 1, 1), (4, 0, 2), (5, 0, 2),
                                                 (6, 2, 2)]
    assert decided.flows_kept.tolist() == [0, 1, 0]
    assert decided.flows_dropped.tolist() == [0, 1, 1]  # flow 6 has an event in each
    store.close()
    decided.close()


def test_linked_rows_are_decided_a_block_of_whole_groups_at_a_time(monkeypatch):
    """The decisions take the merged rows a block of whole groups at a time (their arrays
    are several per row): no group is split across blocks, a group larger than a block
    comes whole, every row comes once, in order."""
    from tracestream.plan import window as plan_window

    monkeypatch.setattr(plan_window, "BLOCK", 4)
    keys = [1, 1, 2, 3, 3, 3, 3, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9]
    rows = np.zeros(len(keys), [("key", "<i8"), ("n", "<i8")])
    rows["key"], rows["n"] = keys, np.arange(len(keys))
    merged = [rows[:5], rows[5:8], rows[8:]]  # the merge's blocks cut group 3 twice
    blocks = list(plan_window._groups(iter(merged)))
    assert np.concatenate(blocks)["n"].tolist() == list(range(len(keys)))
    seen: set[int] = set()
    for block in blocks:
        groups = set(block["key"].tolist())
        assert not groups & seen  # each group in one block
        seen |= groups
        assert len(block) <= 4 or len(groups) == 1  # a block's worth, or one large group
    assert [b["key"].tolist() for b in blocks if len(b) > 4] == [[3] * 6]


def test_both_backends_cut_the_same_window(tmp_path, backend):
    """The library call, in this process, with the C extension and with its numpy twin."""
    from tracestream.engine import add_layer_guides
    from tracestream.plan.specs import LayerSpec

    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / f"w-{backend}.json"
    spec = LayerSpec(anchor_regex="^a$", num_layers=2, anchor_offset=0, phase="p",
                     evidence="e", passes="all")
    report = add_layer_guides(trace, output, spec, workers=0, window=pass_window("1:3"))
    source = load_decimal(trace)["traceEvents"]
    assert source_indices(output, report.data, source) == expected_for(
        report.data, source, 1_100_000, 3_100_000)


# -- pieces (--split-mb) ------------------------------------------------------------------


def _ns(text):
    return None if text is None else int(Decimal(text) * 1000)


def _check_pieces(source_path: Path, manifest_path: Path, limit_bytes: int) -> dict:
    """Each piece: at most the limit, a trace, exactly its range's members (the oracle);
    together: every source event (but retired metadata) and the flows whole or counted."""
    manifest = json.loads(manifest_path.read_text())
    source = load_decimal(source_path)
    source = source["traceEvents"] if isinstance(source, dict) else source
    seen: set[int] = set()
    for row in manifest["pieces"]:
        piece = manifest_path.parent / row["file"]
        report = json.loads((manifest_path.parent / row["report"]).read_text())
        assert len(read_bytes(piece)) == row["json_bytes"] <= limit_bytes, row
        assert json.loads(read_bytes(piece))  # a document of its own
        kept = source_indices(piece, report, source)
        assert kept == expected_for(report, source, _ns(row["start_us"]), _ns(row["end_us"]))
        seen.update(kept)
    compaction = report.get("compaction", report)
    retired = {r["source_event_index"] for r in compaction.get("retired_track_metadata", ())}
    flows: dict = {}
    for i, e in enumerate(source):
        if e.get("ph") in ("s", "t", "f"):
            flows.setdefault(json.dumps([e.get("cat"), e.get("id")]), []).append(i)
    dropped = [f for f in flows.values() if not set(f) <= seen]
    assert all(not set(f) & seen for f in dropped)  # a flow is whole or nowhere
    assert manifest["flows_dropped"] == sum(
        any(_time(source[i].get("ts")) is not None for i in f) for f in dropped)
    missing = set(range(len(source))) - seen - retired - {i for f in dropped for i in f}
    assert not missing, [source[i] for i in sorted(missing)][:5]
    return manifest


def test_pieces_hold_every_event_within_the_limit_cut_between_passes(tmp_path):
    output = tmp_path / "sp" / "o.json.gz"
    output.parent.mkdir()
    result = run("layers", "--trace", SAMPLE, "--output", output, *SAMPLE_LAYERS,
                 "--max-gpu-lanes", "10", "--split-mb", "0.3")
    assert result.returncode == 0, result.stderr.decode()
    manifest_path = tmp_path / "sp" / "o.json.gz.pieces.json"
    manifest = _check_pieces(SAMPLE, manifest_path, 300_000)
    rows = manifest["pieces"]
    assert [row["file"] for row in rows] == [f"o.part-{k:04d}.json.gz"
                                             for k in range(1, len(rows) + 1)]
    assert len(rows) > 2
    # cut at passes: each piece's passes follow the last's, all 14 once
    passes = [tuple(row["passes"]) for row in rows]
    assert passes[0][0] == 0 and passes[-1][1] == 14
    assert all(a[1] == b[0] for a, b in zip(passes, passes[1:]))
    source = load_decimal(SAMPLE)["traceEvents"]
    anchors = sorted(Decimal(e["ts"]) for e in source if e.get("name") == "_q_rope_store")
    for row in rows[1:]:  # every cut is a pass's L0 anchor (9 matches per pass)
        assert Decimal(row["start_us"]) == anchors[row["passes"][0] * 9]
    lines = result.stderr.decode().splitlines()
    assert lines[0] == (f"pieces: {len(rows)} of at most 0.3 MB of JSON each, listed in "
                        f"{manifest_path}")
    verified = run("verify", "--trace", SAMPLE, "--output", manifest_path)
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()
    assert b"[ok] pieces as planned" in verified.stdout
    one = run("verify", "--trace", SAMPLE, "--output", tmp_path / "sp" / rows[1]["file"])
    assert one.returncode == 0, one.stdout.decode()
    restored = tmp_path / "back.json"
    assert_refused(run("restore", "--trace", tmp_path / "sp" / rows[1]["file"], "--output",
                       restored), "(piece 2 of", restored)


def test_pieces_of_many_chunks_with_workers_hold_every_event(tmp_path, traces):
    """Six chunks of 2 MB, pieces of 5 MB, two workers: a chunk wholly inside one piece is
    rewritten through a worker's shared slot (as the full rewrite's are), one that a cut
    crosses is cut by a worker; the pieces hold every event, and verify (with workers
    too) finds them as planned."""
    trace, _ = traces("pieces-of-chunks.json", size_bytes=12 << 20)
    output = tmp_path / "o.json"
    result = run(*layers_args(trace, output, "--max-gpu-lanes", "10", "--split-mb", "5",
                              "--workers", "2", passes="all"))
    assert result.returncode == 0, result.stderr.decode()
    manifest = _check_pieces(trace, tmp_path / "o.json.pieces.json", 5_000_000)
    assert len(manifest["pieces"]) >= 3
    verified = run("verify", "--trace", trace, "--output", tmp_path / "o.json.pieces.json",
                   "--workers", "2")
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()
    assert b"[ok] pieces as planned" in verified.stdout


def test_zstd_pieces_have_a_small_window(tmp_path):
    """Every piece is open (and compressing) through the one pass: a zstd piece's window is
    256 KB at most (a compressor then holds ~0.7 MiB, not ~3), a whole output's is zstd's
    own; the pieces decode and verify."""
    import zstandard

    whole = tmp_path / "whole.json.zst"
    assert run("layers", "--trace", SAMPLE, "--output", whole, *SAMPLE_LAYERS).returncode == 0
    assert zstandard.get_frame_parameters(whole.read_bytes()[:18]).window_size > 1 << 18
    output = tmp_path / "o.json.zst"
    result = run("layers", "--trace", SAMPLE, "--output", output, *SAMPLE_LAYERS,
                 "--split-mb", "0.3")
    assert result.returncode == 0, result.stderr.decode()
    manifest = _check_pieces(SAMPLE, tmp_path / "o.json.zst.pieces.json", 300_000)
    for row in manifest["pieces"]:
        head = (tmp_path / row["file"]).read_bytes()[:18]
        assert zstandard.get_frame_parameters(head).window_size <= 1 << 18, row["file"]
    verified = run("verify", "--trace", SAMPLE, "--output", tmp_path / "o.json.zst.pieces.json")
    assert verified.returncode == 0, verified.stdout.decode() + verified.stderr.decode()


def test_pieces_without_guides_are_cut_by_time(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "c.json"
    result = run("compact", "--trace", trace, "--output", output, "--split-mb", "0.0045")
    assert result.returncode == 0, result.stderr.decode()
    manifest = _check_pieces(trace, tmp_path / "c.json.pieces.json", 4_500)
    assert len(manifest["pieces"]) >= 2
    assert "passes" not in manifest["pieces"][0]
    assert run("verify", "--trace", trace, "--output",
               tmp_path / "c.json.pieces.json").returncode == 0


def test_verify_finds_a_piece_that_is_not_as_planned(tmp_path):
    output = tmp_path / "o.json"
    assert run("layers", "--trace", SAMPLE, "--output", output, *SAMPLE_LAYERS,
               "--split-mb", "0.3").returncode == 0
    manifest = tmp_path / "o.json.pieces.json"
    piece = tmp_path / json.loads(manifest.read_text())["pieces"][1]["file"]
    piece.write_bytes(piece.read_bytes().replace(b'"_q_rope_store"', b'"_q_rope_stor3"', 1))
    result = run("verify", "--trace", SAMPLE, "--output", manifest)
    assert result.returncode == 1
    assert f"[FAIL] pieces as planned: {piece.name}: byte ".encode() in result.stdout


@pytest.mark.parametrize(("args", "fragment"), [
    (["--split-mb", "0"], "--split-mb '0' must be a positive number of MB"),
    (["--split-mb", "-1"], "must be a positive number of MB"),
    (["--split-mb", "1", "--pass-window", "1:2"], "--pass-window and --split-mb each choose"),
    (["--split-mb", "1", "--report", "r.json"], "--split-mb 1 writes a report beside each "
                                               "piece: drop --report"),
])
def test_split_mistakes_are_refused(tmp_path, args, fragment):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / "w.json"
    result = run("layers", "--trace", trace, "--output", output, *EDGE_LAYERS, *args)
    assert_refused(result, fragment, Path(f"{output}.pieces.json"),
                   tmp_path / "w.part-0001.json")


def test_a_split_into_too_many_pieces_is_refused(tmp_path):
    from tests.kineto import anchor_trace

    trace = anchor_trace(tmp_path / "many.json", [100 * k for k in range(600)])
    output = tmp_path / "w.json"
    result = run("layers", "--trace", trace, "--output", output, *EDGE_LAYERS,
                 "--split-mb", "0.000001")
    assert_refused(result, "--split-mb 0.000001 would cut more than 256 pieces: give a "
                           "larger size", Path(f"{output}.pieces.json"),
                   tmp_path / "w.part-0001.json")


def test_a_split_refuses_to_overwrite_a_piece(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    (tmp_path / "w.part-0002.json").write_text("mine")
    result = run("layers", "--trace", trace, "--output", tmp_path / "w.json", *EDGE_LAYERS,
                 "--split-mb", "0.006")
    assert_refused(result, "w.part-0002.json already exists",
                   tmp_path / "w.json.pieces.json", tmp_path / "w.part-0001.json")
    assert (tmp_path / "w.part-0002.json").read_text() == "mine"


# -- what an outside attack found -----------------------------------------------------


def test_a_pass_window_of_a_narrower_selection_ends_at_the_next_passes_anchor(tmp_path):
    output = tmp_path / "w.json"
    args = [a for a in SAMPLE_LAYERS if a != "all"][:-1] + ["--passes", "5"]
    result = run("layers", "--trace", SAMPLE, "--output", output, *args, "--pass-window", "4:5")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(Path(f"{output}.layers.json").read_text())
    source = load_decimal(SAMPLE)["traceEvents"]
    anchors = sorted(Decimal(e["ts"]) for e in source if e.get("name") == "_q_rope_store")
    assert Decimal(report["window"]["end_us"]) == anchors[45]  # pass 5's L0, unlabelled
    assert run("verify", "--trace", SAMPLE, "--output", output).returncode == 0


def test_untimed_b_and_e_are_in_every_window_and_sub_ns_ends_round_up(tmp_path):
    events = [kernel("k", "0", "1"), kernel("k", "3000", "1"),
              {"ph": "B", "name": "untimed", "pid": 9, "tid": 1},
              {"ph": "E", "pid": 9, "tid": 1, "ts": 20},
              {"ph": "B", "name": "sub_ns_end", "pid": 9, "tid": 2, "ts": 900},
              {"ph": "E", "pid": 9, "tid": 2, "ts": "1000.0005"},
              {"ph": "b", "id": 3, "cat": "a", "name": "x", "pid": 9, "tid": 3, "ts": 900},
              {"ph": "e", "id": 3, "cat": "a", "name": "x", "pid": 9, "tid": 3,
               "ts": "1000.0005"},
              {"ph": "i", "name": "sub_ns_with_dur", "pid": 9, "tid": 4, "ts": "40.0001",
               "dur": 20, "s": "t"}]
    trace = write_trace(tmp_path / "t.json", events)
    source = load_decimal(trace)["traceEvents"]
    for window, edges in (("1:2", (1_000_000, 2_000_000)), ("0.045:", (45_000, None)),
                          (":0.5", (None, 500_000)), ("-1:", (-1_000_000, None))):
        output = tmp_path / f"w{window.replace(':', '_')}.json"
        result = run("compact", "--trace", trace, "--output", output, "--time-window", window)
        assert result.returncode == 0, result.stderr.decode()
        report = json.loads(Path(f"{output}.compact.json").read_text())
        kept = source_indices(output, report, source)
        assert kept == expected_for(report, source, *edges), window
        assert 2 in kept  # the untimed B
    assert {4, 5, 6, 7} <= set(source_indices(
        tmp_path / "w1_2.json", json.loads(Path(f"{tmp_path / 'w1_2.json'}.compact.json")
                                            .read_text()), source))
    assert 8 not in source_indices(
        tmp_path / "w0.045_.json",
        json.loads(Path(f"{tmp_path / 'w0.045_.json'}.compact.json").read_text()), source)


def test_flow_ids_are_one_flow_as_perfetto_reads_them(tmp_path):
    events = [kernel("k", "0", "1"), kernel("k", "3000", "1")]
    for fid, other in ((1, "1"), (2, 2.0), (26, "1a")):
        events += [{"ph": "s", "id": fid, "cat": "c", "name": "n", "pid": 9, "tid": 1,
                    "ts": 1500},
                   {"ph": "f", "id": other, "cat": "c", "name": "n", "pid": 9, "tid": 1,
                    "ts": 2500, "bp": "e"}]
    trace = write_trace(tmp_path / "t.json", events)
    output = tmp_path / "w.json"
    assert run("compact", "--trace", trace, "--output", output, "--time-window",
               "1:2").returncode == 0
    report = json.loads(Path(f"{output}.compact.json").read_text())
    assert report["window"]["flows_dropped"] == 3
    names = [e.get("ph") for e in load_decimal(output)["traceEvents"]]
    assert "s" not in names and "f" not in names


@pytest.mark.parametrize(("path", "value"), [
    (("output_event_count",), 1), (("gpus", 0, "kernel_count"), 1),
    (("compaction", "relocated_events"), 1), (("window", "start_ms"), "0"),
    (("passes",), 3),
])
def test_verify_finds_an_edited_window_report(tmp_path, path, value):
    output = tmp_path / "w.json"
    assert run("layers", "--trace", SAMPLE, "--output", output, *SAMPLE_LAYERS,
               "--max-gpu-lanes", "10", "--pass-window", "2:4").returncode == 0
    report_path = Path(f"{output}.layers.json")
    report = json.loads(report_path.read_text())
    place = report
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    report_path.write_text(json.dumps(report, indent=2))
    result = run("verify", "--trace", SAMPLE, "--output", output)
    assert result.returncode == 1, result.stdout.decode()
    assert b"[FAIL] report as planned: byte " in result.stdout


@pytest.mark.parametrize("window", [{}, [], 0, False, {"passes": [1, 3], "times": ["1", "2"]}])
def test_a_report_window_that_is_no_window_is_refused(tmp_path, window):
    trace, output = _window_with_report_window(tmp_path, window)
    assert_refused(run("verify", "--trace", trace, "--output", output),
                   "the report's options.window is not one of")
    assert_refused(run("restore", "--trace", output, "--output", tmp_path / "b.json"),
                   "holds a window of its source (--pass-window 1:3)", tmp_path / "b.json")


def test_a_time_window_finer_than_a_nanosecond_is_refused(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    assert_refused(run("layers", "--trace", trace, "--output", tmp_path / "w.json",
                       *EDGE_LAYERS, "--time-window", ":0.0000001"),
                   "to the nanosecond at most", tmp_path / "w.json")


def test_pieces_of_a_real_trace_stay_within_the_limit(tmp_path):
    """Compaction moves GPU flows too, and they grow: the estimate counts it."""
    from tests.conftest import real_trace

    trace = real_trace("hta_nccl_gpu_scopes.json.gz")
    output = tmp_path / "o.json"
    result = run("compact", "--trace", trace, "--output", output, "--split-mb", "0.5")
    assert result.returncode == 0, result.stderr.decode()
    manifest = _check_pieces(trace, tmp_path / "o.json.pieces.json", 500_000)
    assert len(manifest["pieces"]) > 5 and not manifest["over_limit"]


def test_pieces_count_long_guides_and_spanning_pairs(tmp_path):
    events = [kernel("a", str(100 * k), "1") for k in range(400)]
    events += [{"ph": "B", "name": "long" * 20, "pid": 9, "tid": k % 7, "ts": 30 * k}
               for k in range(60)]
    events += [{"ph": "E", "pid": 9, "tid": k % 7, "ts": 30 * k + 20_000} for k in range(60)]
    trace = write_trace(tmp_path / "t.json", events)
    output = tmp_path / "o.json"
    result = run("layers", "--trace", trace, "--output", output, "--anchor-regex", "^a$",
                 "--num-layers", "2", "--anchor-offset", "0", "--phase", "p",
                 "--evidence", "x" * 2000, "--passes", "all", "--split-mb", "0.1")
    assert result.returncode == 0, result.stderr.decode()
    manifest = _check_pieces(trace, tmp_path / "o.json.pieces.json", 100_000)
    assert len(manifest["pieces"]) > 2 and not manifest["over_limit"]


@pytest.mark.parametrize(("edit", "fragment"), [
    (lambda m: m["pieces"][0].update(source_events=1), "the manifest's pieces[0].source_events"),
    (lambda m: m.update(flows_dropped=0), "the manifest's flows_dropped is 0"),
    (lambda m: m["pieces"][1].update(file="/etc/hostname"), "piece 2: the manifest names"),
    (lambda m: m["pieces"][1].update(file="../o.part-0002.json"), "piece 2: the manifest names"),
])
def test_verify_finds_an_edited_manifest(tmp_path, edit, fragment):
    output = tmp_path / "o.json"
    assert run("layers", "--trace", SAMPLE, "--output", output, *SAMPLE_LAYERS,
               "--split-mb", "0.3").returncode == 0
    manifest_path = tmp_path / "o.json.pieces.json"
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    manifest_path.write_text(json.dumps(manifest))
    result = run("verify", "--trace", SAMPLE, "--output", manifest_path)
    assert result.returncode == 1, result.stdout.decode() + result.stderr.decode()
    assert fragment.encode() in result.stdout


@pytest.mark.parametrize(("value", "fragment"), [
    ("01", "--split-mb '01' must be a positive number"),
    ("1e3", "must be a positive number"),
])
def test_split_sizes_in_no_plain_decimal_are_refused(tmp_path, value, fragment):
    trace = edge_trace(tmp_path / "edge.json")
    assert_refused(run("compact", "--trace", trace, "--output", tmp_path / "c.json",
                       "--split-mb", value), fragment, tmp_path / "c.json.pieces.json")


@pytest.mark.parametrize("output", ["", "folder"])
def test_a_split_needs_an_output_file_name(tmp_path, output):
    trace = edge_trace(tmp_path / "edge.json")
    (tmp_path / "folder").mkdir()
    result = run("compact", "--trace", trace, "--output", tmp_path / output if output else "",
                 "--split-mb", "1")
    assert_refused(result, "writes files: give --output a file name")


def test_a_split_whose_piece_names_are_too_long_is_refused(tmp_path):
    trace = edge_trace(tmp_path / "edge.json")
    output = tmp_path / ("a" * 240 + ".json")
    assert_refused(run("compact", "--trace", trace, "--output", output, "--split-mb",
                       "0.002"), "File name too long")


def test_a_malformed_piece_window_in_a_report_is_refused(tmp_path):
    trace, output = _window_with_report_window(
        tmp_path, {"piece": [2, 1, "0.3"], "range_us": [None, None], "passes": None})
    assert_refused(run("verify", "--trace", trace, "--output", output),
                   "the report's window piece is not [NUMBER, COUNT, MB]")


@pytest.mark.parametrize(("content", "fragment"), [
    (b"{", "cannot read manifest"),
    (b'{"kind": "pieces", "split_mb": "1", "command": "layers", "pieces": []}',
     "is not a tracestream pieces manifest"),
    (b'{"kind": "trace"}', "is not a tracestream pieces manifest"),
])
def test_verify_refuses_a_manifest_that_is_none(tmp_path, content, fragment):
    manifest = tmp_path / "o.json.pieces.json"
    manifest.write_bytes(content)
    assert_refused(run("verify", "--trace", SAMPLE, "--output", manifest), fragment)


def test_a_pass_window_without_guides_is_refused_by_the_library(tmp_path):
    from tracestream import TraceError, compact

    trace = edge_trace(tmp_path / "edge.json")
    with pytest.raises(TraceError, match=r"--pass-window 1:2 needs layer guides"):
        compact(trace, tmp_path / "c.json", window=pass_window("1:2"))
    assert not list(tmp_path.glob("c.json*"))



@pytest.mark.parametrize("spread", [1 << 20, 1 << 40, 1 << 62])
def test_sizes_are_binned_as_a_sort_bins_them(spread):
    """The bins of a chunk's times and their bytes, counted over the chunk's range (near
    times) or sorted (far apart, negative, at the int64 edges), are the sort's."""
    from tracestream.index.window import SIZE_BIN_SHIFT, binned

    rng = np.random.default_rng(spread % 997)
    ns = rng.integers(-spread, spread, 5000, dtype=np.int64)
    ns[:3] = [np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0] if spread > 1 << 61 else 0
    weights = rng.integers(1, 4000, len(ns))
    keys, sums = binned(ns, weights)
    expected_keys, at = np.unique(ns >> SIZE_BIN_SHIFT, return_inverse=True)
    assert keys.tolist() == expected_keys.tolist()
    assert sums.tolist() == np.bincount(at, weights=weights).astype(np.int64).tolist()
    assert sums.dtype == np.int64 and sums.sum() == weights.sum()
    empty_keys, empty_sums = binned(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(empty_keys) == len(empty_sums) == 0


def test_each_flow_key_is_its_own_events_key_when_made_once_per_chunk():
    """Keys are made once per category and id in a chunk: `true` and `1` stay two ids
    (Perfetto reads `1`, `1.0` and `"1"` alike, not `true`), and an id or category that is
    an array or object still gets its key."""
    from types import SimpleNamespace

    from tracestream.index.window import ASYNC, FLOW, _group_keys, group_key

    pairs = [("c", 1), ("c", True), ("c", 1.0), ("c", "1"), ("c", 1), ("c", True),
             ("c", [1]), ("c", [1]), ({"a": 1}, 2), ("d", 1), ("c", 1)]
    events = [SimpleNamespace(cat=cat, id=id_) for cat, id_ in pairs]
    roles = [FLOW] * (len(pairs) - 1) + [ASYNC]
    keys = _group_keys(events, list(range(len(events))), roles)
    assert keys == [group_key(role, e.cat, e.id) for role, e in zip(roles, events)]
    assert keys[0] == keys[2] == keys[3] == keys[4] != keys[1] == keys[5]
    assert keys[6] == keys[7] and keys[9] != keys[0] and keys[10] != keys[0]
