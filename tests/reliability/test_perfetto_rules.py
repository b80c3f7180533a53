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
