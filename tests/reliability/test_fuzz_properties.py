"""Properties of every successful run, on generated and on hand-built random traces.

For each example: `verify` passes; `restore` reproduces the source (byte for
byte when the source is in restore's own layout); the lane count of every
group is exactly the peak overlap computed independently (oracle.py) from the
conservative bounds - and the exact peak when all timestamps are integers; a
group whose peak exceeds --max-gpu-lanes is refused naming that peak; guides
never overlap; guide i of pass p uses anchor match K + p*(N*S+E) + l*S.

Example counts are small for `make test`; `make fuzz` sets
TRACESTREAM_FUZZ_EXAMPLES (e.g. 5000).
"""

from __future__ import annotations

import json
import random
import re
import tempfile
from pathlib import Path

import pytest
from conftest import read_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from samples.generate import ANCHOR, TERMINAL, TraceConfig, generate
from tracestream import CompactSpec, LayerSpec, TraceError, add_layer_guides, compact

from . import oracle
from .checks import assert_verified
from .support import FUZZ_EXAMPLES, TALLY, Raw, document, examples

SETTINGS = dict(deadline=None, derandomize=not FUZZ_EXAMPLES, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                **({} if FUZZ_EXAMPLES else {"database": None}))


def _check_lanes(source: Path, report: dict, max_lanes: int) -> None:
    expected = oracle.expected_lanes(source, read=read_bytes)
    found = oracle.lanes_in_report(report)
    assert set(found) == set(expected), (found, expected)
    for key, want in expected.items():
        assert found[key] == want["peak"], (key, found[key], want)
        assert found[key] <= max_lanes
        if want["integers"]:
            assert want["peak"] == want["exact_peak"]
    TALLY["lane groups checked against the independent peak"] += len(expected)


def _check_guides(output: Path, report: dict, spec: LayerSpec) -> None:
    guides = oracle.guide_slices(read_bytes(output))
    n, s, e, k = spec.num_layers, spec.anchor_stride, spec.extra_anchors_per_pass, \
        spec.anchor_offset
    assert len(guides) == n * spec.passes == len(report["layers"])
    for (start, end, args), row in zip(guides, report["layers"], strict=True):
        p, layer = args["pass_index"], args["layer_id"] - spec.first_layer
        assert args["anchor_index"] == k + p * (n * s + e) + layer * s
        assert row["anchor_index"] == args["anchor_index"]
        assert start <= end
    ordered = sorted((start, end) for start, end, _ in guides)
    for (_, end), (start, _) in zip(ordered, ordered[1:], strict=False):
        assert end <= start, "guides overlap"
    TALLY["guides checked (formula, no overlap)"] += len(guides)


def _report(output: Path, kind: str) -> dict:
    return json.loads(Path(f"{output}.{kind}.json").read_text())


# -- generated traces ------------------------------------------------------------------------

generated = st.fixed_dictionaries({
    "layers": st.integers(1, 8),
    "iterations": st.integers(1, 4),
    "graphs": st.integers(1, 6),
    "streams_per_graph": st.integers(1, 6),
    "draft_passes": st.integers(0, 2),
    "gpus": st.integers(1, 2),
    "shuffle": st.booleans(),
    "decimals": st.booleans(),
    "bare_array": st.booleans(),
    "scopes": st.booleans(),
    "extra_anchor": st.booleans(),
    "sync_on_device_row": st.booleans(),
    "seed": st.integers(0, 1 << 16),
})


@settings(max_examples=examples(25), **SETTINGS)
@given(cfg=generated, suffix=st.sampled_from([".json", ".json.gz", ".json.zst"]),
       data=st.data())
def test_fuzz_generated_traces(cfg, suffix, data):
    with tempfile.TemporaryDirectory(prefix="tracestream-prop-") as tmp:
        folder = Path(tmp)
        source = folder / f"trace{suffix}"
        generate(source, TraceConfig(**cfg))
        n, e, iterations = cfg["layers"], int(cfg["extra_anchor"]), cfg["iterations"]
        passes = data.draw(st.integers(1, iterations), label="passes")
        terminal = data.draw(st.booleans(), label="terminal")
        per_pass = n + e
        if terminal:  # windows must hold exactly one terminal: start at a pass boundary
            offset = per_pass * data.draw(st.integers(0, iterations - passes), label="k")
        else:
            offset = data.draw(st.integers(0, iterations * per_pass - (passes - 1) * per_pass - n),
                               label="offset")
        spec = LayerSpec(anchor_regex=f"^{ANCHOR}$", num_layers=n, anchor_offset=offset,
                         passes=passes, extra_anchors_per_pass=e,
                         end_anchor_regex=TERMINAL if terminal else None,
                         first_layer=data.draw(st.integers(0, 3), label="first"),
                         phase="target-verify", evidence="generator", pid=0,
                         device=0,
                         # any selection must be written faithfully; one that starts inside a
                         # pass crosses its cadence break, so it is chosen deliberately
                         allow_gaps=offset % per_pass != 0)
        lanes = data.draw(st.sampled_from([None, 10]), label="lanes")
        output = folder / f"layers{suffix}"
        add_layer_guides(source, output, spec,
                         compact=CompactSpec(max_lanes=lanes, pid=None) if lanes else None,
                         workers=0)
        report = _report(output, "layers")
        assert_verified(source, output)
        _check_guides(output, report, spec)
        if lanes:
            _check_lanes(source, report, lanes)
        compacted = folder / f"compact{suffix}"
        compact(source, compacted, CompactSpec(max_lanes=10), workers=0)
        assert_verified(source, compacted)
        _check_lanes(source, _report(compacted, "compact"), 10)
        TALLY["property examples (generated traces)"] += 1


# -- hand-built random traces ------------------------------------------------------------------

EPOCHS = [0, 1_000_000, 6_100_000_000_000, 1_764_400_000_000_000]


def _time_text(ns: int, decimals: bool) -> str:
    if not decimals:
        return str(ns // 1000)
    q, r = divmod(ns, 1000)
    return f"{q}.{r:03d}"


@st.composite
def hand_built(draw):
    """Kernels on 1-10 streams of one or two devices, sequential per stream (so the exact
    overlap is at most the stream count), touching or apart, some of zero length (sharing
    their start with kernels of other streams), integer or 3-decimal µs."""
    rng = random.Random(draw(st.integers(0, 1 << 30), label="seed"))
    decimals = draw(st.booleans(), label="decimals")
    epoch = draw(st.sampled_from(EPOCHS), label="epoch") * 1000
    devices = draw(st.integers(1, 2), label="devices")
    streams = draw(st.integers(1, 10), label="streams")
    unit = 1 if decimals else 1000  # integer µs texts need whole-µs times
    events = [{"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": 7,
               "args": {"name": "stream 7 "}}]
    anchors = 0
    flow_id = 1
    for stream in range(streams):
        device = stream % devices
        tid = 7 + stream
        t = epoch + rng.randrange(0, 40) * unit * 50
        for i in range(rng.randrange(0, 10)):
            dur = rng.choice([0, 1, 2, 7, 50, 333]) * unit
            name = "anchor" if stream == 0 and i % 2 == 0 else f"k{rng.randrange(5)}"
            anchors += name == "anchor"
            cats = ["kernel", "Kernel"] if name == "anchor" else ["kernel", "gpu_memcpy", "Kernel"]
            events.append({"ph": "X", "cat": rng.choice(cats),
                           "name": name, "pid": 0, "tid": tid,
                           "ts": Raw(_time_text(t, decimals)),
                           "dur": Raw(_time_text(dur, decimals)),
                           "args": {"device": device, "stream": tid}})
            if rng.random() < 0.3:
                events.append({"ph": "f", "id": flow_id, "pid": 0, "tid": tid,
                               "ts": Raw(_time_text(t, decimals)), "cat": "ac2g",
                               "name": "ac2g", "bp": "e"})
                events.append({"ph": "s", "id": flow_id, "pid": 9, "tid": 9,
                               "ts": Raw(_time_text(t - unit, decimals)), "cat": "ac2g",
                               "name": "ac2g"})
                flow_id += 1
            # a zero-length kernel is apart from the next of its stream (two starting together
            # on one stream would leave a flow there two activities to bind to)
            t += dur + max(rng.choice([0, 0, unit, 17 * unit, 400 * unit]), 0 if dur else unit)
    events.append({"ph": "X", "cat": "cpu_op", "name": "step", "pid": 9, "tid": 9,
                   "ts": Raw(_time_text(epoch, decimals)), "dur": Raw("1"), "args": {}})
    order = draw(st.permutations(range(len(events))), label="order")
    return [events[i] for i in order], anchors


@settings(max_examples=examples(50), **SETTINGS)
@given(built=hand_built(), max_lanes=st.integers(1, 10), bare=st.booleans(), data=st.data())
def test_fuzz_hand_built_traces(built, max_lanes, bare, data):
    events, anchors = built
    with tempfile.TemporaryDirectory(prefix="tracestream-prop-") as tmp:
        folder = Path(tmp)
        source = folder / "trace.json"
        source.write_bytes(document(events, bare=bare))
        expected = oracle.expected_lanes(source)
        worst = max((g["peak"] for g in expected.values()), default=0)
        output = folder / "compact.json"
        if not expected:
            with pytest.raises(TraceError, match="no GPU activity"):
                compact(source, output, CompactSpec(max_lanes=max_lanes), workers=0)
        elif worst > max_lanes:
            with pytest.raises(TraceError, match="display lanes") as refused:
                compact(source, output, CompactSpec(max_lanes=max_lanes), workers=0)
            found = re.search(r"pid (\S+) device (\S+) needs (\d+) display lanes",
                              str(refused.value))
            assert found, refused.value
            group = ("activity", int(found[1]), int(found[2]))
            assert int(found[3]) == expected[group]["peak"] > max_lanes, (expected, refused)
            assert not output.exists()
            TALLY["refusals checked (peak above --max-gpu-lanes)"] += 1
        else:
            compact(source, output, CompactSpec(max_lanes=max_lanes), workers=0)
            assert_verified(source, output)
            _check_lanes(source, _report(output, "compact"), max_lanes)
        _layers_on_hand_built(source, folder, anchors, data)
        TALLY["property examples (hand-built traces)"] += 1


def _layers_on_hand_built(source: Path, folder: Path, anchors: int, data) -> None:
    if anchors < 1:
        return
    n = data.draw(st.integers(1, 3), label="N")
    s = data.draw(st.integers(1, 2), label="S")
    e = data.draw(st.integers(0, 2), label="E")
    need_one = n * s
    if anchors < need_one:
        return
    passes = data.draw(st.integers(1, 1 + (anchors - need_one) // (n * s + e)), label="P")
    need = (passes - 1) * (n * s + e) + n * s
    offset = data.draw(st.integers(0, anchors - need), label="K")
    spec = LayerSpec(anchor_regex="^anchor$", num_layers=n, anchor_offset=offset, passes=passes,
                     anchor_stride=s, extra_anchors_per_pass=e, phase="fuzz",
                     evidence="hand-built: anchors are every other kernel of stream 7",
                     device=0,
                     # random kernel times have no cadence: the selection is deliberate
                     allow_gaps=True)
    output = folder / "layers.json"
    chosen = [offset + p * (n * s + e) + layer * s for p in range(passes) for layer in range(n)]
    if oracle.shared_guide_start(oracle.guide_starts(source, "anchor", chosen)):
        with pytest.raises(TraceError, match="start in the same microsecond once rounded"):
            add_layer_guides(source, output, spec, workers=0)
        assert not output.exists()
        TALLY["refusals checked (guides sharing a rounded start)"] += 1
        return
    add_layer_guides(source, output, spec, workers=0)
    assert_verified(source, output)
    _check_guides(output, _report(output, "layers"), spec)
