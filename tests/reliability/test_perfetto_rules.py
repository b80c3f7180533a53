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
    from .checks import parts

    return parts(output)[0]


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
    assert_verified(tmp_path / "trace.json", output, byte_exact=True)


def test_an_escaped_tid_key_is_the_one_relocated(cli, tmp_path):
    data = sub(D, ANCHOR_200, ANCHOR_200.replace(b'"tid"', b'"t\\u0069d"'))
    out, output, _ = run(cli, tmp_path, data, "compact")
    assert out.rc == 0, out.describe()
    (moved,) = [e for e in output_events(output) if b'"source_event_index": 8' in e]
    assert keys_of(moved).count("tid") == 1
    assert json.loads(moved)["tid"] >= 1_000_000
    assert_verified(tmp_path / "trace.json", output, byte_exact=True)


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
    assert_verified(tmp_path / "trace.json", output, byte_exact=True)


def test_verify_finds_a_zero_length_slice_nested_at_a_shared_start(cli, tmp_path):
    """The same trace with z moved by hand onto b's lane: Perfetto nests z at depth 1."""
    events = base_events()
    events[10:10] = [ZERO_AT_215]
    out, output, _ = run(cli, tmp_path, document(events), "compact")
    assert out.rc == 0, out.describe()
    text = output.read_bytes()
    lane_of = {}
    for raw in output_events(output):
        event = json.loads(raw)
        lane_of[event.get("name")] = event.get("tid")
    z_lane, b_lane = lane_of["z"], lane_of["b"]
    assert z_lane != b_lane
    z_event = next(raw for raw in output_events(output) if b'"name": "z"' in raw)
    moved = z_event.replace(b'"tid": %d' % z_lane, b'"tid": %d' % b_lane, 1)
    output.write_bytes(sub(text, z_event, moved))
    from tracestream.verify import verify

    checks = {c.name: c for c in verify(tmp_path / "trace.json", output, workers=0).checks}
    depth = checks["depth zero on synthetic tracks"]
    assert not depth.ok and "215000 ns" in depth.detail and "depth 1" in depth.detail, depth


def test_two_guides_rounding_to_one_start_are_refused(cli, tmp_path):
    """Anchors 0.4 µs apart round to the same whole-µs start: L0 (zero length) would nest
    under L1 on the guide track."""
    data = sub(D, ANCHOR_200, ANCHOR_200.replace(b'"ts": 200', b'"ts": 100.4'))
    out, _, folder = run(cli, tmp_path, data, "layers")
    assert_refused(out, "L0", "L1", "same microsecond", "ts 100.4", empty=folder)
