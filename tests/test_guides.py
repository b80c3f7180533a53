"""Anchor selection and guide construction (pure functions over matches)."""

import pytest

from tracestream.errors import TraceError
from tracestream.guides import (
    ANCHOR_POINT_ONLY,
    NEXT_LAYER_ANCHOR,
    TERMINAL_KERNEL_END,
    LayerSpec,
    anchor_index,
    build_guides,
    required_matches,
    select_gpu,
)
from tracestream.index import Match


def match(ts: str, dur: str = "1", *, pid=0, device=0, ordinal=0, name="a") -> Match:
    return Match(ordinal, pid, 7, device, name, ts, dur, 7)


def spec(**kw) -> LayerSpec:
    base = dict(anchor_regex="a", num_layers=2, anchor_offset=0, phase="p", evidence="e")
    base.update(kw)
    return LayerSpec(**base)


def test_formula_with_stride_and_extras():
    """Anchors 0,10,20,30,40,100..140; 2 layers, stride 2, 1 extra, 2 passes -> 0,2,5,7."""
    s = spec(num_layers=2, anchor_stride=2, extra_anchors_per_pass=1, passes=2)
    assert [anchor_index(s, p, layer) for p in range(2) for layer in range(2)] == [0, 2, 5, 7]
    anchors = [match(str(t)) for t in (0, 10, 20, 30, 40, 100, 110, 120, 130, 140)]
    guides = build_guides(anchors, None, s)
    assert [g.anchor_index for g in guides] == [0, 2, 5, 7]
    assert [(g.guide_start_us, g.guide_end_us) for g in guides] == [
        (0, 20), (20, 20), (100, 120), (120, 120)]
    assert [g.boundary_kind for g in guides] == [
        NEXT_LAYER_ANCHOR, ANCHOR_POINT_ONLY, NEXT_LAYER_ANCHOR, ANCHOR_POINT_ONLY]


def test_required_matches_counts_extras_only_between_passes():
    s = spec(num_layers=8, extra_anchors_per_pass=1, passes=6)
    assert required_matches(s) == 5 * 9 + 8


def test_too_few_anchors_is_refused_with_counts():
    anchors = [match(str(t)) for t in range(5)]
    with pytest.raises(TraceError, match="need 4 anchors from offset 2, found 3"):
        build_guides(anchors, None, spec(num_layers=2, passes=2, anchor_offset=2))


def test_first_layer_numbers_guides():
    anchors = [match(str(t)) for t in range(4)]
    guides = build_guides(anchors, None, spec(num_layers=4, first_layer=20))
    assert [g.layer_id for g in guides] == [20, 21, 22, 23]


def test_duplicate_anchor_times_are_refused():
    anchors = [match("5"), match("5"), match("9")]
    with pytest.raises(TraceError, match="duplicate anchor times|strictly increasing"):
        build_guides(anchors, None, spec(num_layers=3))


def test_terminal_ends_the_last_layer_and_is_checked_in_every_window():
    anchors = [match("0"), match("10"), match("100")]
    terminals = [match("5", "2"), match("15", "3.5"), match("105", "1")]
    guides = build_guides(anchors, terminals, spec(num_layers=2, extra_anchors_per_pass=0))
    assert guides[1].boundary_kind == TERMINAL_KERNEL_END
    assert guides[1].end_text == "18.5"
    assert guides[1].guide_end_us == 19  # 18.5 rounds up


def test_stride_two_terminal_after_the_skipped_sub_layer_anchor():
    """With stride 2 a layer's window spans the skipped anchor; its terminal may follow it."""
    anchors = [match(t) for t in ("0", "10", "20", "30")]
    terminals = [match("15", "1"), match("35", "1")]
    guides = build_guides(anchors, terminals, spec(num_layers=2, anchor_stride=2))
    assert [g.anchor_index for g in guides] == [0, 2]
    assert guides[1].boundary_kind == TERMINAL_KERNEL_END
    assert guides[1].end_text == "36"


@pytest.mark.parametrize(
    "terminals, message",
    [
        ([match("5"), match("35")], "no terminal kernel"),
        ([match("5"), match("6"), match("12"), match("35")], "2 terminal kernels"),
        ([match("5"), match("12", "9"), match("25"), match("35")], "ends after the next anchor"),
    ],
)
def test_terminal_refusals_name_pass_and_layer(terminals, message):
    anchors = [match(t) for t in ("0", "10", "20", "30")]
    s = spec(num_layers=2, passes=2)
    with pytest.raises(TraceError, match=message) as err:
        build_guides(anchors, terminals, s)
    assert "pass" in str(err.value) and "layer L" in str(err.value)


def test_terminal_crossing_the_next_anchor_is_refused():
    anchors = [match("0"), match("10")]
    terminals = [match("5", "6")]
    with pytest.raises(TraceError, match="pass 0, layer L0.*ends after the next anchor"):
        build_guides(anchors, terminals, spec(num_layers=1, passes=1))


def test_select_gpu_refuses_several_pids_and_devices():
    ms = [match("1", pid=0), match("2", pid=1), match("3", pid=1)]
    with pytest.raises(TraceError, match=r"^anchor_regex .*pid 0: 1, pid 1: 2.*with pid$"):
        select_gpu(ms, None, None, "anchor_regex")
    assert select_gpu(ms, 1, None, "x") == (1, 0)
    ms = [match("1", device=0), match("2", device=1)]
    with pytest.raises(TraceError, match=r"device 0: 1, device 1: 1.*with device$"):
        select_gpu(ms, None, None, "anchor_regex")
    assert select_gpu(ms, None, 1, "x") == (0, 1)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(anchor_offset=-1), "^anchor_offset must be >= 0"),
        (dict(evidence="  "), "^evidence must not be empty"),
        (dict(phase=""), "^phase must not be empty"),
        (dict(num_layers=0), "^num_layers must be >= 1"),
        (dict(anchor_stride=0), "^anchor_stride must be >= 1"),
        (dict(passes=0), "^passes must be >= 1"),
        (dict(passes="some"), "^passes must be a count or 'all'"),
        (dict(gap_factor=1.0), "^gap_factor must be > 1"),
    ],
)
def test_spec_validation_names_the_spec_field(kw, message):
    """The library names the LayerSpec field; the command line names its flag instead."""
    with pytest.raises(TraceError, match=message):
        spec(**kw).validate()
