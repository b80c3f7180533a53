"""Outputs Perfetto would read differently from what tracestream meant: each class is refused
or written right, and `verify` judges by the same rules Perfetto imports by.

* escaped key names: `"t\\u0069d"` is "tid", in every event tracestream interprets or moves;
* equal starts: slices that start together import longest first, so a zero-length slice on a
  lane or the guide track would nest under a longer one starting at the same nanosecond;
* flow binding: each relocated flow binds, under Perfetto's rules, to the activity it bound
  to in the source;
* `verify` reads the output as Perfetto does: raw added events, the report against the output.

Events of the base trace (support.base_events), by index:
0-3 metadata, 4 CPU op, 5 flow start, 6 anchor a@100 (tid 7), 7 b@115 (tid 8),
8 anchor a@200, 9 flow finish @200, 10 b@215 (tid 8), 11 anchor a@300.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .checks import assert_verified, assert_written
from .support import LAYERS_ARGS, assert_refused, base_events, document

D = document(base_events())
ANCHOR_200 = b'"name": "a", "pid": 0, "tid": 7, "ts": 200, "dur": 10, "args": {'
B_215 = b'"name": "b", "pid": 0, "tid": 8, "ts": 215, "dur": 10'


def sub(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, (old, data.count(old))
    return data.replace(old, new)


def run(cli, tmp_path: Path, data: bytes, command: str, *extra):
    """(outcome, output path, output folder) of one CLI run on `data`; the source unchanged."""
    source = tmp_path / "trace.json"
    source.write_bytes(data)
    folder = tmp_path / "out"
    folder.mkdir()
    output = folder / "out.json"
    args = [command, "--trace", source, "--output", output, "--quiet", *extra]
    if command == "layers":
        args += LAYERS_ARGS
    out = cli(*args)
    assert source.read_bytes() == data, "the source changed"
    return out, output, folder


def keys_of(raw: bytes) -> list[str]:
    """Top-level keys of one JSON object, decoded, duplicates kept."""
    found = []
    json.loads(raw, object_pairs_hook=lambda pairs: found.append([k for k, _ in pairs]) or {})
    return found[-1]


def output_events(output: Path) -> list[bytes]:
    from tracestream.read.document import DocumentScanner
    from tracestream.read.source import TraceSource

    with TraceSource(str(output)) as source:
        return [bytes(raw) for chunk in DocumentScanner(source.read()).chunks()
                for raw in chunk.events]


# -- escaped key names ----------------------------------------------------------------------


def test_an_escaped_args_key_gets_no_second_args_when_moved(cli, tmp_path):
    """`"\\u0061rgs"` is "args": the provenance goes inside it, not into a second `args`."""
    data = sub(D, ANCHOR_200, ANCHOR_200.replace(b'"args"', b'"\\u0061rgs"'))
    out, output, folder = run(cli, tmp_path, data, "compact")
    assert out.rc == 0, out.describe()
    assert_written(folder, output, "compact")
    moved = [e for e in output_events(output) if b'"source_event_index": 8' in e]
    assert len(moved) == 1
    assert keys_of(moved[0]).count("args") == 1, moved[0]
    assert json.loads(moved[0])["args"]["device"] == 0
    assert_verified(tmp_path / "trace.json", output)


def test_an_escaped_tid_key_is_the_one_relocated(cli, tmp_path):
    data = sub(D, ANCHOR_200, ANCHOR_200.replace(b'"tid"', b'"t\\u0069d"'))
    out, output, _ = run(cli, tmp_path, data, "compact")
    assert out.rc == 0, out.describe()
    (moved,) = [e for e in output_events(output) if b'"source_event_index": 8' in e]
    assert keys_of(moved).count("tid") == 1
    assert json.loads(moved)["tid"] >= 1_000_000
    assert_verified(tmp_path / "trace.json", output)


@pytest.mark.parametrize("command, literal, escaped, key", [
    ("compact", b'"tid": 7', b'"tid": 7, "t\\u0069d": 7', "tid"),
    ("compact", b'"ts": 200', b'"ts": 200, "t\\u0073": 200', "ts"),
    ("layers", b'"ts": 200', b'"ts": 200, "t\\u0073": 250', "ts"),
    ("layers", b'"pid": 0', b'"p\\u0069d": 0, "pid": 0', "pid"),
], ids=["compact-tid", "compact-ts", "layers-ts", "layers-pid"])
def test_a_duplicate_after_decoding_is_refused_like_a_literal_one(cli, tmp_path, command,
                                                                 literal, escaped, key):
    data = sub(D, ANCHOR_200, ANCHOR_200.replace(literal, escaped))
    out, _, folder = run(cli, tmp_path, data, command)
    assert_refused(out, "event 8", f"duplicate key `{key}`", empty=folder)


# -- Perfetto's order at equal start ----------------------------------------------------------


def perfetto_depths(events: list[dict], tracks: set) -> dict[tuple, list[int]]:
    """Depth of every slice on `tracks` as Perfetto's importer nests them (rounding variant).

    Slices are sorted by start, those starting together longest first; a slice on the
    stack closes only when its end <= the next start.
    """
    from .oracle import _imported, _plain

    by_track: dict[tuple, list[tuple[int, int]]] = {}
    for e in events:
        key = (_plain(e.get("pid")), _plain(e.get("tid")))
        if e.get("ph") == "X" and key in tracks:
            ts, dur = _imported(str(e["ts"]))[0], _imported(str(e["dur"]))[0]
            by_track.setdefault(key, []).append((ts, ts + dur))
    depths = {}
    for key, slices in by_track.items():
        stack: list[int] = []
        found = []
        for start, end in sorted(slices, key=lambda s: (s[0], -(s[1] - s[0]))):
            while stack and stack[-1] <= start:
                stack.pop()
            found.append(len(stack))
            stack.append(end)
        depths[key] = found
    return depths


def synthetic_tracks(output: Path) -> set:
    report = json.loads(Path(f"{output}.compact.json").read_text())
    return {(g["display_pid"], tid) for g in report["groups"] for tid in g["lane_tids"]}


def loads(output: Path) -> list[dict]:
    from .oracle import events_of, load

    return events_of(load(output.read_bytes()))


ZERO_AT_215 = {"ph": "X", "cat": "kernel", "name": "z", "pid": 0, "tid": 9, "ts": 215,
               "dur": 0, "args": {"device": 0, "stream": 9}}


def test_a_zero_length_kernel_never_shares_a_lane_start_with_a_longer_one(cli, tmp_path):
    """z (zero length, first in the file) and b both start at 215 µs: one lane would import
    b first and nest z under it."""
    events = base_events()
    events[10:10] = [ZERO_AT_215]
    data = document(events)
    out, output, folder = run(cli, tmp_path, data, "compact")
    assert out.rc == 0, out.describe()
    depths = perfetto_depths(loads(output), synthetic_tracks(output))
    assert depths and all(d == 0 for found in depths.values() for d in found), depths
    assert_verified(tmp_path / "trace.json", output)


def lane_checks(events: list[dict]):
    """verify's output-only checks fed `events`, on lane tid 1000000 of pid 0 (a planner
    that put them there); each event dict may carry `moved_from` (its original tid)."""
    from tracestream.commands.verify.output_checks import OutputChecks

    checks = OutputChecks({"options": {}, "groups": [
        {"display_pid": 0, "lane_tids": [1_000_000]}]}, None)
    for ordinal, event in enumerate(events):
        event = dict(event)
        origin = event.pop("moved_from", None)
        if origin is not None:  # as the rewrite writes it: the args member last
            event["tid"] = 1_000_000
            event["args"] = {"_compact_gpu_track": {"pid": 0, "tid": origin,
                                                    "source_event_index": ordinal,
                                                    "had_args": False}}
        checks.observe(ordinal, json.dumps(event).encode())
    return checks


def test_verify_finds_a_zero_length_slice_nested_at_a_shared_start():
    """z (zero length) and b both start at 215 µs on one lane: Perfetto imports b first and
    nests z under it, whichever comes first in the file."""
    z = {**ZERO_AT_215, "moved_from": 9}
    b = {"ph": "X", "cat": "kernel", "name": "b", "pid": 0, "ts": 215, "dur": 10,
         "moved_from": 8}
    for events in ([z, b], [b, z]):
        checks = lane_checks(events)
        problems = checks.depth_problems()
        checks.close()
        assert len(problems) == 3 and all("215000 ns" in p and "depth 1" in p
                                          for p in problems), problems
    checks = lane_checks([z, {**z, "name": "z2"}])  # zero-length together: both at depth 0
    assert checks.depth_problems() == []
    checks.close()


def test_two_guides_rounding_to_one_start_are_refused(cli, tmp_path):
    """Anchors 0.4 µs apart round to the same whole-µs start: L0 (zero length) would nest
    under L1 on the guide track."""
    data = sub(D, ANCHOR_200, ANCHOR_200.replace(b'"ts": 200', b'"ts": 100.4'))
    out, _, folder = run(cli, tmp_path, data, "layers")
    assert_refused(out, "L0", "L1", "same microsecond", "ts 100.4", empty=folder)


# -- flow binding as Perfetto binds -------------------------------------------------------------

FLOW_200 = b'{"ph": "f", "id": 5, "pid": 0, "tid": 7, "ts": 200, "cat": "ac2g", "name": "ac2g", ' \
           b'"bp": "e"}'


def test_an_f_without_bp_inside_an_activity_is_refused(cli, tmp_path):
    """Without "bp": "e" Perfetto binds the flow to the next slice of its stream (a@300), not
    to a@200 around it; on a lane the next slice is another one."""
    data = sub(D, FLOW_200, FLOW_200.replace(b'"ts": 200', b'"ts": 205')
               .replace(b', "bp": "e"', b""))
    out, _, folder = run(cli, tmp_path, data, "compact")
    assert_refused(out, "flow event 9", 'without "bp": "e"', "ts 205.000", empty=folder)


def test_an_f_without_bp_at_its_activitys_start_is_kept(cli, tmp_path):
    data = sub(D, FLOW_200, FLOW_200.replace(b', "bp": "e"', b""))
    out, output, _ = run(cli, tmp_path, data, "compact")
    assert out.rc == 0, out.describe()
    assert_verified(tmp_path / "trace.json", output)


C_210 = {"ph": "X", "cat": "kernel", "name": "c", "pid": 0, "tid": 8, "ts": 210, "dur": 4,
         "args": {"device": 0, "stream": 8}}


def test_a_flow_at_the_end_of_its_activity_taken_on_its_lane_is_refused(cli, tmp_path):
    """At 210 µs the flow is inside a@200 [200, 210] only by its end: on the lane, c starting
    at 210 (another stream; one lane holds every kernel) would take it."""
    data = sub(document(base_events() + [C_210]), FLOW_200,
               FLOW_200.replace(b'"ts": 200', b'"ts": 210'))
    out, _, folder = run(cli, tmp_path, data, "compact")
    assert_refused(out, "flow event 9", "exactly at the end of its activity, where another "
                   "activity on its lane starts", "ts 210.000", empty=folder)


def test_a_flow_at_the_end_of_its_activity_alone_on_its_lane_is_kept(cli, tmp_path):
    """c starts at 211 µs: nothing on the lane starts where a@200 ends."""
    c_211 = {**C_210, "ts": 211}
    data = sub(document(base_events() + [c_211]), FLOW_200,
               FLOW_200.replace(b'"ts": 200', b'"ts": 210'))
    out, output, _ = run(cli, tmp_path, data, "compact")
    assert out.rc == 0, out.describe()
    assert_verified(tmp_path / "trace.json", output)


def _bindings(records) -> dict[int, int]:
    import numpy as np

    from tracestream.commands.verify.bindings import BIND_DTYPE, perfetto_bindings

    rows = np.array(records, BIND_DTYPE)
    return {flow: bound for block in perfetto_bindings(iter([rows]))
            for flow, bound in zip(block["flow"].tolist(), block["bound"].tolist())}


def test_verify_binds_flows_as_perfetto_does():
    """(track, key = start or ts in ns, end, mode 0 activity / 1 enclosing / 2 next,
    ordinal), in (track, key) order; at one key, flows may come before activities."""
    from tracestream.commands.verify.bindings import BOUND_MANY, BOUND_NONE

    # a [0, 10] then b [10, 20]: a flow at 10 binds to b, which starts there
    assert _bindings([(0, 0, 10, 0, 1), (0, 10, 10, 1, 9), (0, 10, 20, 0, 2)]) == {9: 2}
    # alone, a [0, 10] keeps a flow at its end
    assert _bindings([(0, 0, 10, 0, 1), (0, 10, 10, 1, 9)]) == {9: 1}
    # an f without bp at 5 binds to the next slice (b at 12), not to a around it
    assert _bindings([(0, 0, 10, 0, 1), (0, 5, 5, 2, 9), (0, 12, 20, 0, 2)]) == {9: 2}
    # ... to none after the last slice, to several when two begin together
    assert _bindings([(0, 0, 10, 0, 1), (0, 11, 11, 2, 9)]) == {9: BOUND_NONE}
    assert _bindings([(0, 5, 5, 2, 9), (0, 12, 20, 0, 2), (0, 12, 12, 0, 3)]) == {9: BOUND_MANY}
    # the next slice is looked for on the flow's own track only
    assert _bindings([(0, 5, 5, 2, 9), (1, 12, 20, 0, 2)]) == {9: BOUND_NONE}
    # epoch nanoseconds near the int64 limit (9.2e15 µs) bind like any others
    big = 9_100_000_000_000_000_000
    assert _bindings([(0, big, big + 10, 0, 1), (0, big, big, 1, 9)]) == {9: 1}


def test_verify_finds_a_flow_that_an_activity_on_its_lane_captures():
    """a [200, 210] from stream 7 and c [210, 214] from stream 8 share a lane; the flow at
    210 µs binds to a on stream 7 (it ends there) and to c on the lane (it starts there)."""
    a = {"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "ts": 200, "dur": 10,
         "moved_from": 7}
    c = {"ph": "X", "cat": "kernel", "name": "c", "pid": 0, "ts": 210, "dur": 4,
         "moved_from": 8}
    flow = {"ph": "f", "id": 5, "pid": 0, "ts": 210, "cat": "ac2g", "name": "ac2g", "bp": "e",
            "moved_from": 7}
    checks = lane_checks([a, c, flow])
    assert checks.binding_problems() == [
        "flow event 2 binds on its lane to output event 1, not to event 0 it binds to on its "
        "original stream"]
    checks.close()
    checks = lane_checks([a, {**c, "ts": 211}, flow])
    assert checks.binding_problems() == []
    checks.close()


def test_one_tampered_value_is_named_once(cli, tmp_path):
    """A relocated flow's ts edited in the output: the plan check names it, the restore check
    (by hash, without the planner) fails as it must, and nothing else fails (the output-only
    checks see the planned event, and every later one)."""
    out, output, _ = run(cli, tmp_path, D, "compact")
    assert out.rc == 0, out.describe()
    (flow,) = [raw for raw in output_events(output) if b'"ph": "f"' in raw]
    edited = flow.replace(b'"ts": 200', b'"ts": 205').replace(b', "bp": "e"', b"")
    output.write_bytes(sub(output.read_bytes(), flow, edited))
    from tracestream.commands.verify import verify

    failed = {c.name: c.detail for c in verify(tmp_path / "trace.json", output,
                                                workers=0).checks if not c.ok}
    assert list(failed) == ["restored events equal the source", "output equals the plan"]
    assert failed["output equals the plan"] == (
        "source event 9 (f 'ac2g' pid 0 tid 7 ts 200) != output event 7 restored: "
        "field ts: 200 vs 205")


# -- verify reads what Perfetto reads ---------------------------------------------------------


def _verify_failures(source: Path, output: Path, report: Path | None = None) -> dict[str, str]:
    from tracestream.commands.verify import verify

    verdict = verify(source, output, report, workers=0)
    return {c.name: c.detail for c in verdict.checks if not c.ok}


def test_an_added_event_with_a_duplicate_key_fails_verify(cli, tmp_path):
    """`"ts": 150, "t\\u0073": 100` decodes (last wins) to the planned guide; Perfetto may
    read 150."""
    out, output, _ = run(cli, tmp_path, D, "layers")
    assert out.rc == 0, out.describe()
    text = output.read_bytes()
    guide = b'"name": "L0", "pid": 0, "tid": 1000000, "ts": 100, "dur": 100'
    output.write_bytes(sub(text, guide, guide.replace(b'"ts": 100',
                                                      b'"ts": 150, "t\\u0073": 100')))
    failures = _verify_failures(tmp_path / "trace.json", output)
    assert list(failures) == ["output equals the plan"], failures
    assert "duplicate key `ts`" in failures["output equals the plan"]


def test_a_report_whose_guide_rows_are_not_the_output_fails_verify(cli, tmp_path):
    out, output, _ = run(cli, tmp_path, D, "layers")
    assert out.rc == 0, out.describe()
    report = Path(f"{output}.layers.json")
    data = json.loads(report.read_text())
    data["layers"][1]["guide_end_us"] = 333
    report.write_text(json.dumps(data))
    failures = _verify_failures(tmp_path / "trace.json", output)
    assert failures == {"guides": "the report's row L1 (pass 0) says [200, 333] µs, the "
                                  "output's guide L1 is [200, 200] µs"}


def test_a_report_whose_lane_count_is_not_the_output_fails_verify(cli, tmp_path):
    out, output, _ = run(cli, tmp_path, D, "compact")
    assert out.rc == 0, out.describe()
    report = Path(f"{output}.compact.json")
    data = json.loads(report.read_text())
    data["groups"][0]["lanes"] += 1
    data["relocated_flows"] += 1
    report.write_text(json.dumps(data))
    failures = _verify_failures(tmp_path / "trace.json", output)
    assert list(failures) == ["lanes"], failures
    assert "the report says 2 lanes (tids [1000000]), the output has slices on 1 of them" \
        in failures["lanes"]
    assert "the report's relocated_flows is 2, the output holds 1" in failures["lanes"]


@pytest.mark.parametrize("spelled", [b'"tid": 7, "t\\u0069d": 7', b'"tid": 7, "tid": 7'],
                         ids=["escaped", "literal"])
def test_a_moved_flow_with_a_duplicate_key_is_refused(cli, tmp_path, spelled):
    """Compaction moves the flow by its tid: which of the two would Perfetto read?"""
    data = sub(D, FLOW_200, FLOW_200.replace(b'"tid": 7', spelled))
    out, _, folder = run(cli, tmp_path, data, "compact")
    assert_refused(out, "event 9", "duplicate key `tid`", "flow event on GPU stream pid 0 tid 7",
                   empty=folder)


def test_a_flow_compaction_does_not_move_may_spell_a_key_twice(cli, tmp_path):
    cpu_flow = b'"id": 5, "pid": 1, "tid": 1, "ts": 195'
    data = sub(D, cpu_flow, cpu_flow.replace(b'"tid": 1', b'"tid": 1, "t\\u0069d": 1'))
    out, output, _ = run(cli, tmp_path, data, "compact")
    assert out.rc == 0, out.describe()
    assert_verified(tmp_path / "trace.json", output)


def test_an_output_out_of_step_is_named_once(cli, tmp_path):
    """The CPU op dropped from the output: every later event is one off. verify says where it
    lost the step, and runs no output-only check on what it could not line up."""
    out, output, _ = run(cli, tmp_path, D, "compact")
    assert out.rc == 0, out.describe()
    (cpu_op,) = [raw for raw in output_events(output) if b'"cat": "cpu_op"' in raw]
    output.write_bytes(sub(output.read_bytes(), cpu_op + b",\n", b""))
    from tracestream.commands.verify import verify

    checks = verify(tmp_path / "trace.json", output, workers=0).checks
    assert [(c.name, c.ok) for c in checks] == [("source sha256", True),
                                               ("restored events equal the source", False),
                                               ("output equals the plan", False)]
    assert checks[2].detail.startswith("the output is out of step with the source from output "
                                       "event 2 on")
    assert "source event 4 (X 'op' pid 1 tid 1 ts 190) != output event 2 restored" \
        in checks[2].detail


def _escaped(key: str) -> bytes:
    """`"key"` with its first letter written as a \\u escape."""
    return b'"\\u%04x%s"' % (ord(key[0]), key[1:].encode())


@pytest.mark.parametrize("key", ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id",
                                 "bp", "device", "stream"])
def test_escaping_a_key_everywhere_changes_nothing_perfetto_reads(tmp_path, key):
    """Every occurrence of one key escaped: compact and layers write what they write for the
    plain trace, once both outputs are decoded (the escapes themselves are kept)."""
    from tracestream import CompactSpec, LayerSpec, add_layer_guides, compact

    plain = document(base_events())
    escaped = plain.replace(b'"%s":' % key.encode(), _escaped(key) + b":")
    assert escaped != plain
    spec = LayerSpec(anchor_regex="^a$", num_layers=2, anchor_offset=0, phase="reliability",
                     evidence="hand-built: one `a` per layer")
    for name, data in (("plain", plain), ("escaped", escaped)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "trace.json").write_bytes(data)
        compact(folder / "trace.json", folder / "compact.json", CompactSpec(), workers=0)
        add_layer_guides(folder / "trace.json", folder / "layers.json", spec, workers=0)
        assert_verified(folder / "trace.json", folder / "compact.json")
        assert_verified(folder / "trace.json", folder / "layers.json")
    for output in ("compact.json", "layers.json"):
        decoded = [json.loads((tmp_path / name / output).read_bytes())["traceEvents"]
                   for name in ("plain", "escaped")]
        assert decoded[0] == decoded[1], output
