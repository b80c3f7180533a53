"""Anchor selection and guide construction (pure functions over matches)."""

import dataclasses
import json

import numpy as np
import pytest

from tracestream.errors import Option, SpecError, TraceError, flag_of
from tracestream.index.builder import Match
from tracestream.index.vocabulary import KernelVocabulary
from tracestream.plan.anchors import (
    anchor_names,
    anchored_pattern,
    cadence,
    check_anchor_names,
    check_cadence,
    layer_gaps,
    match_starts,
)
from tracestream.plan.cadence import cluster_starts, is_break, starts_at_breaks
from tracestream.plan.guides import build_guides
from tracestream.plan.guidetext import GuideRows
from tracestream.plan.selection import select_gpu
from tracestream.plan.specs import (
    ANCHOR_POINT_ONLY,
    NEXT_LAYER_ANCHOR,
    TERMINAL_KERNEL_END,
    LayerSpec,
    anchor_index,
    complete_passes,
    coverage,
    required_matches,
    with_passes,
)


def match(ts: str, dur: str = "1", *, pid=0, device=0, ordinal=0, name="a") -> Match:
    return Match(ordinal, pid, 7, device, name, ts, dur, 7)


def rows(guides) -> list[dict]:
    """The guides' report rows, as the report file holds them (exact times as text)."""
    text = b"[" + b",\n".join(GuideRows(guides, 0).pretty_blocks(2)) + b"]"
    return json.loads(text, parse_float=str)


def spec(**kw) -> LayerSpec:
    base = dict(anchor_regex="a", num_layers=2, anchor_offset=0, phase="p", evidence="e")
    base.update(kw)
    return LayerSpec(**base)


def test_formula_with_stride_and_extras():
    """Anchors 0,10,20,30,40,100..140; 2 layers, stride 2, 1 extra, 2 passes -> 0,2,5,7."""
    s = spec(num_layers=2, anchor_stride=2, extra_anchors_per_pass=1, passes=2)
    assert [anchor_index(s, p, layer) for p in range(2) for layer in range(2)] == [0, 2, 5, 7]
    anchors = [match(str(t)) for t in (0, 10, 20, 30, 40, 100, 110, 120, 130, 140)]
    guides = rows(build_guides(anchors, None, s))
    assert [g["anchor_index"] for g in guides] == [0, 2, 5, 7]
    assert [(g["guide_start_us"], g["guide_end_us"]) for g in guides] == [
        (0, 20), (20, 20), (100, 120), (120, 120)]
    assert [g["boundary_kind"] for g in guides] == [
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
    guides = rows(build_guides(anchors, None, spec(num_layers=4, first_layer=20)))
    assert [g["layer_id"] for g in guides] == [20, 21, 22, 23]


def test_duplicate_anchor_times_are_refused():
    anchors = [match("5"), match("5"), match("9")]
    with pytest.raises(TraceError, match="duplicate anchor times|strictly increasing"):
        build_guides(anchors, None, spec(num_layers=3))


def test_terminal_ends_the_last_layer_and_is_checked_in_every_window():
    anchors = [match("0"), match("10"), match("100")]
    terminals = [match("5", "2"), match("15", "3.5"), match("105", "1")]
    guides = rows(build_guides(anchors, terminals, spec(num_layers=2, extra_anchors_per_pass=0)))
    assert guides[1]["boundary_kind"] == TERMINAL_KERNEL_END
    assert guides[1]["end_us"] == "18.5"
    assert guides[1]["guide_end_us"] == 19  # 18.5 rounds up


def test_stride_two_terminal_after_the_skipped_sub_layer_anchor():
    """With stride 2 a layer's window spans the skipped anchor; its terminal may follow it."""
    anchors = [match(t) for t in ("0", "10", "20", "30")]
    terminals = [match("15", "1"), match("35", "1")]
    guides = rows(build_guides(anchors, terminals, spec(num_layers=2, anchor_stride=2)))
    assert [g["anchor_index"] for g in guides] == [0, 2]
    assert guides[1]["boundary_kind"] == TERMINAL_KERNEL_END
    assert guides[1]["end_us"] == 36


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
    names = KernelVocabulary()
    ms = [match("1", pid=0), match("2", pid=1), match("3", pid=1)]
    with pytest.raises(TraceError, match=r"^anchor_regex .*pid 0: 1, pid 1: 2.*with pid$"):
        select_gpu(ms, None, None, "anchor_regex", "a", names)
    assert select_gpu(ms, 1, None, "x", "a", names) == (1, 0)
    ms = [match("1", device=0), match("2", device=1)]
    with pytest.raises(TraceError, match=r"device 0: 1, device 1: 1.*with device$"):
        select_gpu(ms, None, None, "anchor_regex", "a", names)
    assert select_gpu(ms, None, 1, "x", "a", names) == (0, 1)


def test_select_gpu_names_the_closest_kernels_of_the_pid_without_a_match():
    names = KernelVocabulary()
    names.add({0: {"a": 2, "attn": 1}, 1: {"ab": 3, "other": 1}})
    ms = [match("1", pid=0)]
    with pytest.raises(TraceError, match=r"^no kernel matches anchor_regex 'a' in pid 1; "
                                         r"closest kernel names: 'ab'$"):
        select_gpu(ms, 1, None, "anchor_regex", "a", names)
    with pytest.raises(TraceError, match=r"^no kernel matches anchor_regex 'a' in pid 7; "
                                         r"pid 7 has no kernels$"):
        select_gpu(ms, 7, None, "anchor_regex", "a", names)
    # the pattern matches on the pid, on another device: that is said, not names
    with pytest.raises(TraceError, match=r"^no kernel matches anchor_regex 'a' on device 3 of "
                                         r"pid 0; it matches on device 0 of pid 0 \(1 match\)$"):
        select_gpu(ms, None, 3, "anchor_regex", "a", names)
    with pytest.raises(TraceError, match=r"^no kernel matches anchor_regex 'a'; the trace has "
                                         r"no kernels$"):
        select_gpu([], None, None, "anchor_regex", "a", KernelVocabulary())


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
        (dict(gap_factor=float("inf")), "^gap_factor must be > 1 and finite, got inf"),
        (dict(gap_factor=float("nan")), "^gap_factor must be > 1 and finite, got nan"),
        (dict(gap_factor="3"), "^gap_factor must be a number"),
    ],
)
def test_spec_validation_names_the_spec_field(kw, message):
    """The library names the LayerSpec field; the command line names its flag instead."""
    with pytest.raises(TraceError, match=message):
        spec(**kw).validate()


# -- passes, coverage -----------------------------------------------------------------


@pytest.mark.parametrize("count, offset, expected", [
    (54, 0, 6), (54, 9, 5), (53, 0, 6), (52, 0, 5), (8, 0, 1), (7, 0, 0), (54, 50, 0),
])
def test_complete_passes_need_extras_only_between_passes(count, offset, expected):
    """8 layers + 1 extra per pass: the last pass needs no extra after it."""
    assert complete_passes(spec(num_layers=8, extra_anchors_per_pass=1,
                                anchor_offset=offset), count) == expected


def test_passes_all_becomes_every_complete_pass_and_coverage_counts_the_rest():
    every = with_passes(spec(num_layers=8, extra_anchors_per_pass=1, passes="all"), 54)
    assert every.passes == 6
    assert with_passes(spec(passes="all", num_layers=8), 3).passes == 1  # refused later
    assert coverage(spec(num_layers=8, extra_anchors_per_pass=1), 54) == {
        "complete_passes": 6, "unlabelled_complete_passes": 5, "labelled_anchor_count": 8,
        "matches_outside_selection": 46}
    assert coverage(every, 54)["matches_outside_selection"] == 1  # the last output head


# -- several kernel names ------------------------------------------------------------------


def test_several_names_are_listed_most_frequent_first_with_an_anchored_pattern():
    ms = [match("1", name="draft"), match("2", name="t(x)"), match("3", name="t(x)")]
    names = anchor_names(ms)
    assert list(names.items()) == [("t(x)", 2), ("draft", 1)]
    with pytest.raises(SpecError) as caught:
        check_anchor_names(names, spec(anchor_regex="t|d"), 0, 0)
    assert str(caught.value).startswith(
        "anchor_regex 't|d' matches 2 different kernel names on pid 0 device 0: 't(x)' (2), "
        "'draft' (1).")
    assert r"anchor_regex='^t\\(x\\)$'" in str(caught.value)
    assert r"--anchor-regex '^t\(x\)$'" in caught.value.render(flag_of)
    assert anchored_pattern("t(x)") == r"^t\(x\)$"
    check_anchor_names(names, spec(allow_several_anchor_names=True), 0, 0)
    check_anchor_names({"t(x)": 2}, spec(), 0, 0)


def test_option_text_for_the_library_and_the_command_line():
    assert Option("num_layers").text() == "num_layers"
    assert Option("anchor_offset", 9).text() == "anchor_offset=9"
    assert Option("anchor_offset", 9).text(flag_of) == "--anchor-offset 9"
    assert Option("allow_gaps", True).text(flag_of) == "--allow-gaps"
    assert Option("max_lanes").text(flag_of) == "--max-gpu-lanes"
    error = SpecError("need ", Option("num_layers"), " >= 1")
    assert str(error) == "need num_layers >= 1" and isinstance(error, TraceError)
    assert error.render(flag_of) == "need --num-layers >= 1"


# -- cadence breaks ----------------------------------------------------------------------


def decode_starts(passes: int, layers: int = 8, extra: int = 1, layer_ns: int = 62_625,
                  pass_gap_ns: int = 229_179) -> np.ndarray:
    """Anchor starts of passes of `layers` + `extra` anchors, a longer gap between passes."""
    per = layers + extra
    k = np.arange(passes * per, dtype=np.int64)
    return k * layer_ns + (k // per) * (pass_gap_ns - layer_ns)


def test_the_rule_is_the_one_of_anchors():
    times = decode_starts(3)
    first, median = cluster_starts(times)
    assert first.tolist() == [0, 9, 18] and median == 62_625
    assert starts_at_breaks(np.diff(times), 62_625).tolist() == [0, 9, 18]
    assert cluster_starts([])[0].tolist() == [] and cluster_starts([5])[0].tolist() == [0]
    assert is_break(188_000, 62_625) and not is_break(187_875, 62_625)


def test_layer_gaps_are_taken_inside_each_pass_only():
    times = decode_starts(3)
    gaps = layer_gaps(times, spec(num_layers=8, extra_anchors_per_pass=1, passes=3))
    assert gaps.shape == (3, 7) and (gaps == 62_625).all()
    evidence = cadence(times, spec(num_layers=8, extra_anchors_per_pass=1, passes=3))
    assert evidence["breaks"] == 0 and evidence["median_layer_gap_us"] == 62.625
    assert evidence["threshold_us"] == 187.875


def test_a_pass_across_a_break_names_both_anchors_the_gap_and_the_aligned_settings():
    times = decode_starts(4)
    anchors = [match(f"{t / 1000:.3f}") for t in times.tolist()]
    assert (match_starts(anchors) == times).all()
    wrong = spec(num_layers=8, extra_anchors_per_pass=1, anchor_offset=5)
    evidence = cadence(times, wrong)
    assert evidence["breaks"] == 1
    assert evidence["first_break"] == {"pass_index": 0, "from_index": 8, "from": "L3",
                                       "to_index": 9, "to": "L4", "gap_us": 229.179,
                                       "median_ratio": 3.66}
    with pytest.raises(SpecError) as caught:
        check_cadence(anchors, times, wrong, evidence)
    text = caught.value.render(flag_of)
    assert text.startswith(
        "pass 0 crosses a cadence break: from match 8 (L3, ts 501.000 µs) to match 9 (L4, ts "
        "730.179 µs) the gap is 229.179 µs, 3.66 x the median layer gap of the selection "
        "(62.625 µs; a break is > 3 x)")
    assert ("the matches fall into clusters of 9 (4 of 4 clusters, first at index 0): "
            "--anchor-offset 0 puts each pass on one cluster") in text
    check_cadence(anchors, times, spec(num_layers=8, extra_anchors_per_pass=1, anchor_offset=5,
                                       allow_gaps=True), evidence)
    missing = spec(num_layers=8, passes=3)
    with pytest.raises(SpecError, match=r"^pass 1 .*: either extra_anchors_per_pass=1, or "
                                        r"num_layers=9, puts each pass on one cluster"):
        check_cadence(anchors, times, missing, cadence(times, missing))
    too_many = spec(num_layers=10, passes=2, anchor_offset=9)
    with pytest.raises(SpecError, match=r"clusters of 9 .*: num_layers=9 puts each pass"):
        check_cadence(anchors, times, too_many, cadence(times, too_many))
    odd = spec(num_layers=5, anchor_stride=2, anchor_offset=13)
    far = decode_starts(4, pass_gap_ns=600_000)  # a stride of 2 doubles the layer gap
    with pytest.raises(SpecError, match="clusters of 9 .*fewer than the 10 matches of a pass's "
                                        "layers: check num_layers and anchor_stride"):
        check_cadence(anchors, far, odd, cadence(far, odd))


def test_a_pass_whose_trailing_extra_lies_after_a_break_is_refused():
    """9 layers + 1 extra on passes of 8 + 1: the 9th "layer" is the output head, the "extra"
    the next pass's first anchor (the issue's `num_layers: 41`), even with one pass."""
    times = decode_starts(3)
    anchors = [match(f"{t / 1000:.3f}") for t in times.tolist()]
    swallowed = spec(num_layers=9, extra_anchors_per_pass=1)
    evidence = cadence(times, swallowed)
    assert evidence["first_break"]["from"] == "L8"
    assert evidence["first_break"]["to"] == "extra anchor 1"
    with pytest.raises(SpecError, match=r"from match 8 \(L8, .* to match 9 \(extra anchor 1, .*"
                                        r"either extra_anchors_per_pass=0, or num_layers=8, "):
        check_cadence(anchors, times, swallowed, evidence)
    # the last pass's extras may lie past the end of the trace
    last = spec(num_layers=8, extra_anchors_per_pass=2, passes=3, anchor_offset=0)
    assert cadence(times[:26], dataclasses.replace(last, extra_anchors_per_pass=1,
                                                   passes=3))["breaks"] == 0


def test_no_suggestion_when_the_clusters_show_none():
    """One pass's layers with one slow layer: a break, but no clusters of a common size."""
    times = np.array([0, 10, 20, 100, 110], np.int64)
    anchors = [match(str(t)) for t in times.tolist()]
    wrong = spec(num_layers=5)
    with pytest.raises(SpecError) as caught:
        check_cadence(anchors, times, wrong, cadence(times, wrong))
    assert "clusters of" not in str(caught.value)
    assert "allow_gaps=True labels it anyway" in str(caught.value)


def test_one_layer_per_pass_has_no_layer_gaps_to_check():
    evidence = cadence(np.array([0, 10, 1000], np.int64), spec(num_layers=1, passes=3))
    assert evidence["median_layer_gap_us"] is None and evidence["breaks"] == 0


def test_terminal_windows_compare_exact_times_below_a_nanosecond():
    """A terminal 0.1 ns before its anchor is outside the window, though both floor to the
    same ns (times kept as text are compared as exact decimals)."""
    anchors = [match("0.0004"), match("10")]
    terminals = [match("0.0003"), match("5", "2"), match("12", "1")]
    guides = rows(build_guides(anchors, terminals, spec(num_layers=2)))
    assert [g["boundary_kind"] for g in guides] == [NEXT_LAYER_ANCHOR, TERMINAL_KERNEL_END]
    assert guides[1]["end_us"] == 13
    with pytest.raises(TraceError, match=r"2 terminal kernels in the window of pass 0, layer L0"):
        build_guides([match("0.0003"), match("10")], terminals, spec(num_layers=2))


def test_the_first_failing_guide_is_named_among_many():
    """Windows are checked a block at a time; the refusal names the first guide (in pass
    and layer order) that fails, as one guide at a time did."""
    count = 5000  # guides over several blocks
    anchors = [match(str(10 * k)) for k in range(count)]
    terminals = [match(str(10 * k + 5)) for k in range(count) if k not in (3001, 4500)]
    with pytest.raises(TraceError, match=r"no terminal kernel .* of pass 1500, layer L1: "
                                         r"\[30010, 30020\) µs$"):
        build_guides(anchors, terminals, spec(num_layers=2, passes=count // 2))


def test_pass_boundary_breaks_finds_passes_inside_an_iteration():
    """3 iterations of 8 anchors (10 µs apart, 210 µs between) read as 6 passes of 4."""
    from tracestream.plan.anchors import pass_boundary_breaks

    starts = np.array([it * 280_000 + 10_000 * i for it in range(3) for i in range(8)], np.int64)
    before, breaks, median = pass_boundary_breaks(starts, spec(num_layers=4, passes=6))
    assert median == 10_000
    assert before.tolist() == [10_000, 210_000, 10_000, 210_000, 10_000]
    assert breaks.tolist() == [False, True, False, True, False]
    before, breaks, _ = pass_boundary_breaks(starts, spec(num_layers=8, passes=3))
    assert breaks.tolist() == [True, True]


@pytest.mark.parametrize("typed, value", [
    ("0", 0), ('"0"', "0"), ("GPU 0", "GPU 0"), ('"', '"'), ('"a\\"b"', 'a"b'), ('""', ""),
    ("-3", -3), (None, None),
])
def test_id_from_text(typed, value):
    from tracestream.plan.selection import id_from_text

    assert id_from_text(typed) == value and type(id_from_text(typed)) is type(value)
