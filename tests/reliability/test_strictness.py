"""Strict only where it matters: odd values on events tracestream never reads pass through.

A CPU op with `"dur": -3` (or a `ts` that is a word, an object, far out of range) is
neither moved nor interpreted: `layers`, `compact` and `inspect` accept the trace, the
event's bytes come out as they went in, and `inspect` counts it as a warning. The same
values on events that are moved or read (GPU activity, anchors, flows) are still refused.
"""

from __future__ import annotations

import json

import pytest

from .support import (
    LAYERS_ARGS,
    Raw,
    assert_refused,
    base_events,
    document,
    encode,
    leftovers,
)

CPU_OP = 4  # index of the CPU op in base_events()
ODD = {"dur_negative": {"dur": Raw("-3")}, "dur_word": {"dur": Raw('"long"')},
       "ts_word": {"ts": Raw('"soon"')}, "ts_object": {"ts": Raw('{"us": 190}')},
       "ts_far_out": {"ts": Raw("-1e300")}, "ts_beyond_a_double": {"ts": Raw("1e400")},
       "dur_beyond_a_double": {"dur": Raw("-1e999")},
       "instant_beyond_a_double": {"ph": "i", "s": "t", "ts": Raw("-1e999")}}


def _trace_with(index: int, change: dict) -> tuple[bytes, bytes]:
    """A trace whose event `index` has `change`, and that event's exact bytes."""
    events = base_events()
    events[index] = {**events[index], **change}
    return document(events), encode(events[index]).encode()


@pytest.mark.parametrize("odd", sorted(ODD))
def test_an_unread_event_with_odd_values_passes_through(cli, tmp_path, odd):
    data, event = _trace_with(CPU_OP, ODD[odd])
    trace = tmp_path / "t.json"
    trace.write_bytes(data)
    for kind, extra in (("compact", []), ("layers", LAYERS_ARGS + ["--max-gpu-lanes", "2"])):
        output = tmp_path / f"{kind}.json"
        out = cli(kind, "--trace", trace, "--output", output, "--quiet", *extra)
        assert out.rc == 0, out.describe()
        assert event in output.read_bytes()
        verdict = cli("verify", "--trace", trace, "--output", output)
        assert verdict.rc == 0, verdict.describe()
    inspected = cli("inspect", "--trace", trace, "--json")
    assert inspected.rc == 0, inspected.describe()
    warnings = json.loads(inspected.stdout)["warnings"]
    assert [(w["kind"], w["count"]) for w in warnings] == [("odd_value_passed_through", 1)]
    assert warnings[0]["first"].startswith(f"event {CPU_OP}: ")
    text = cli("inspect", "--trace", trace)
    assert "warning: 1 event(s) with a ts/dur tracestream does not read" in text.stdout.decode()


def test_a_trace_without_odd_values_has_no_warnings(cli, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_bytes(document(base_events()))
    inspected = cli("inspect", "--trace", trace, "--json")
    assert json.loads(inspected.stdout)["warnings"] == []


@pytest.mark.parametrize("index, change, words", [
    (7, {"dur": Raw("-3")}, "event 7 (byte"),  # a GPU kernel: moved by compact
    (6, {"ts": Raw('"soon"')}, "event 6 (byte"),  # an anchor: read by layers
    (9, {"ts": Raw('"soon"')}, "event 9 (byte"),  # a flow on the GPU: bound to a lane
])
@pytest.mark.parametrize("kind", ["compact", "layers", "inspect"])
def test_odd_values_on_events_that_are_read_are_refused(cli, tmp_path, index, change, words,
                                                        kind):
    data, _ = _trace_with(index, change)
    folder = tmp_path / "src"
    folder.mkdir()
    trace = folder / "t.json"
    trace.write_bytes(data)
    args = {"compact": ["compact", "--trace", trace, "--output", tmp_path / "o.json"],
            "layers": ["layers", "--trace", trace, "--output", tmp_path / "o.json", *LAYERS_ARGS],
            "inspect": ["inspect", "--trace", trace]}[kind]
    out = cli(*args)
    assert_refused(out, words)
    assert leftovers(tmp_path) == ["src"]


@pytest.mark.parametrize("kind", ["compact", "layers", "inspect"])
def test_a_gpu_end_past_64_bit_nanoseconds_is_refused(cli, tmp_path, kind):
    """ts and dur each below 9.2e15 µs, their sum not: the end would wrap in int64 ns (and
    two overlapping kernels would share one lane)."""
    data, _ = _trace_with(7, {"ts": Raw("1700000000000000"), "dur": Raw("8000000000000000")})
    folder = tmp_path / "src"
    folder.mkdir()
    trace = folder / "t.json"
    trace.write_bytes(data)
    before = trace.read_bytes()
    args = {"compact": ["compact", "--trace", trace, "--output", tmp_path / "o.json",
                        "--max-gpu-lanes", "1"],
            "layers": ["layers", "--trace", trace, "--output", tmp_path / "o.json", *LAYERS_ARGS],
            "inspect": ["inspect", "--trace", trace]}[kind]
    line = assert_refused(cli(*args), "event 7 (byte", "pid 0 tid 8", "ts 1700000000000000",
                          "ends out of range")
    assert "dur 8000000000000000" in line
    assert leftovers(tmp_path) == ["src"]
    assert trace.read_bytes() == before
