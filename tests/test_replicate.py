"""The benchmark's replicator: a real trace copied in time keeps its exact text."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.replicate import replicate, shifted, top_level_number

# Kineto's shape in miniature: multi-line objects, integer and three-decimal µs, string
# pids, a "ts" and an "id" inside args that are not the event's own, metadata, a flow.
SOURCE = b"""{
  "schemaVersion": 1,
  "traceEvents": [
  {
    "ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7,
    "ts": 1000, "dur": 40,
    "args": {
      "ts": 5, "id": 99, "note": "\\"ts\\": 1"
    }
  },
  {
    "name": "process_name", "ph": "M", "ts": 0, "pid": 0, "tid": 0,
    "args": {
      "name": "python3"
    }
  },
  {
    "ph": "s", "id": 11, "pid": 7, "tid": 7, "ts": 1001, "cat": "ac2g", "name": "ac2g"
  },
  {
    "ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
    "ts": 1010.125, "dur": 20.5,
    "args": {
      "device": 0, "stream": 7, "correlation": 11
    }
  },
  {
    "ph": "f", "id": 11, "pid": 0, "tid": 7, "ts": 1010.125, "cat": "ac2g", "bp": "e"
  },
  {
    "name": "Record Window End", "ph": "i", "s": "g",
    "pid": "", "tid": "", "ts": 1050
  }
  ],
  "traceName": "tiny"
}
"""
PERIOD = 51  # ts 1000 .. 1050 (the latest end: 1000 + 40, 1010.125 + 20.5, 1050) + 1 µs
NUMBERS = re.compile(rb'("ts": |"id": )[0-9.]+')


@pytest.fixture
def replica(tmp_path):
    source = tmp_path / "tiny.json"
    source.write_bytes(SOURCE)
    output = tmp_path / "big.json"
    info = replicate(source, output, 3 * len(SOURCE))
    return source, output, info


def test_copy_zero_is_the_source_and_the_output_parses(replica):
    source, output, info = replica
    text = output.read_bytes()
    assert info.copies >= 3 and info.bytes == len(text)
    array_end = SOURCE.index(b"\n  ],")
    assert text.startswith(SOURCE[:array_end])
    assert text.endswith(SOURCE[array_end:])
    doc = json.loads(text)
    assert doc["schemaVersion"] == 1 and doc["traceName"] == "tiny"


def test_metadata_once_and_every_other_event_once_per_copy(replica):
    _, output, info = replica
    events = json.loads(output.read_bytes())["traceEvents"]
    assert sum(e["ph"] == "M" for e in events) == 1
    assert len(events) == 1 + 5 * info.copies
    assert info.events_per_copy == 5 and info.metadata_events == 1


def test_ts_and_flow_ids_shift_by_whole_copies_keeping_their_digits(replica):
    _, output, info = replica
    assert info.period_us == PERIOD and info.id_span == 1
    text = output.read_bytes().decode()
    events = json.loads(text)["traceEvents"]
    kernels = [e for e in events if e.get("name") == "gemm"]
    assert [k["ts"] for k in kernels] == [1010.125 + c * PERIOD for c in range(info.copies)]
    assert [f'"ts": {1010 + c * PERIOD}.125' in text for c in range(info.copies)] == [True] * len(
        kernels)
    flows = [e["id"] for e in events if e["ph"] == "f"]
    assert flows == [11 + c for c in range(info.copies)]
    # numbers inside args are not the event's own: never shifted
    assert all(e["args"]["ts"] == 5 and e["args"]["id"] == 99
               for e in events if e.get("name") == "aten::mm")


def test_every_other_byte_of_every_copy_is_the_sources(replica):
    _, output, info = replica
    body = SOURCE[SOURCE.index(b"  {"):SOURCE.index(b"\n  ],")]
    copy_text = NUMBERS.sub(rb"\1N", body)
    without_metadata = re.sub(rb'  \{\n    "name": "process_name".*?\n  \},\n', b"",
                              copy_text, flags=re.S)
    masked = NUMBERS.sub(rb"\1N", output.read_bytes())
    assert masked.count(without_metadata) == info.copies - 1
    assert masked.count(copy_text) == 1


def test_only_the_top_level_key_is_found():
    event = b'{"args": {"ts": 1, "x": "\\"ts\\": 2"}, "ts" : 1234.5, "dur": 3}'
    start, end = top_level_number(event, "ts")
    assert event[start:end] == b"1234.5"
    assert top_level_number(b'{"args": {"id": 4}}', "id") is None


def test_shift_keeps_the_fraction_and_refuses_what_it_cannot_shift():
    assert shifted(b"1710000000000000.125", 3) == b"1710000000000003.125"
    assert shifted(b"0.000", 2) == b"2.000"
    with pytest.raises(ValueError, match="cannot shift"):
        shifted(b"1.5e3", 1)
    with pytest.raises(ValueError, match="cannot shift"):
        shifted(b"-4", 1)
