"""A pattern that matches no kernel is refused with the closest kernel names on the trace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import assert_refused, run
from kineto import kernel, write_trace

from tracestream.errors import SpecError
from tracestream.index.builder import IndexOptions, run_index
from tracestream.index.vocabulary import KernelVocabulary
from tracestream.plan.hints import closest_names, literal_parts, no_match
from tracestream.read.source import TraceSource

NAMES = ["_q_rope_store", "_k_rope_store", "_draft_q_rope", "gemm_bf16_kernel",
         "ncclDevKernel_AllReduce_Sum"]


def two_gpus(path: Path) -> Path:
    """pid 0 runs the rope kernels 3 times (the anchors); pid 1 runs other kernels only."""
    events = []
    for step in range(3):
        t = step * 100
        events += [kernel("_q_rope_store", str(t), "5"), kernel("_k_rope_store", str(t + 10), "5"),
                   kernel("gemm_bf16_kernel", str(t + 20), "5"),
                   kernel("flash_fwd_kernel", str(t + 1), "5", pid=1, device=1),
                   kernel("_k_norm_store", str(t + 11), "5", pid=1, device=1)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "_q_rope_stored_on_cpu", "pid": 9,
                   "tid": 1, "ts": "0", "dur": "1"})
    return write_trace(path, events)


def _layers(trace, out: Path, regex: str, *extra):
    return run("layers", "--trace", trace, "--output", out, "--anchor-regex", regex,
               "--num-layers", "1", "--anchor-offset", "0", "--phase", "p", "--evidence", "e",
               *extra)


@pytest.fixture(params=["C", "pure"])
def pure(request, monkeypatch) -> str:
    """The CLI with the C extension, then with its Python twins (TRACESTREAM_PURE=1)."""
    if request.param == "pure":
        monkeypatch.setenv("TRACESTREAM_PURE", "1")
    else:
        monkeypatch.delenv("TRACESTREAM_PURE", raising=False)
    return request.param


# -- the command line ------------------------------------------------------------------------


def test_layers_names_the_kernel_a_near_miss_meant(tmp_path, pure):
    trace = two_gpus(tmp_path / "t.json")
    out = tmp_path / "out.json"
    line = assert_refused(_layers(trace, out, "^_q_rope_stor$", "--pid", "0"),
                          "no kernel matches", out, Path(f"{out}.layers.json"))
    assert line == ("tracestream: error: no kernel matches --anchor-regex '^_q_rope_stor$' in "
                    "pid 0; closest kernel names: '_q_rope_store', '_k_rope_store'")


def test_anchors_names_the_kernel_a_near_miss_meant(tmp_path, pure):
    trace = two_gpus(tmp_path / "t.json")
    result = run("anchors", "--trace", trace, "--anchor-regex", "Q_ROPE_STOR$")
    line = assert_refused(result, "no kernel matches")
    assert result.stdout == b""
    # the CPU op that contains the text is not a kernel; both GPUs' kernels are candidates
    assert line == ("tracestream: error: no kernel matches --anchor-regex 'Q_ROPE_STOR$'; "
                    "closest kernel names: '_q_rope_store', '_k_rope_store'")


def test_a_trace_on_stdin_is_read_once_and_still_gets_its_hint(tmp_path, pure):
    trace = two_gpus(tmp_path / "t.json")
    result = run("anchors", "--trace", "-", "--anchor-regex", "flash_fwd_kernal",
                 stdin=trace.read_bytes())
    line = assert_refused(result, "no kernel matches")
    assert line.endswith("closest kernel names: 'flash_fwd_kernel'"), line


@pytest.mark.parametrize("command", ["layers", "anchors"])
def test_with_pid_the_hint_names_kernels_of_that_pid(tmp_path, command):
    trace = two_gpus(tmp_path / "t.json")
    out = tmp_path / "out.json"
    if command == "layers":
        result = _layers(trace, out, "_q_rope_store", "--pid", "1")
    else:
        result = run("anchors", "--trace", trace, "--anchor-regex", "_q_rope_store",
                     "--pid", "1")
    line = assert_refused(result, "no kernel matches", out, Path(f"{out}.layers.json"))
    # nothing on pid 1 is close: its nearest names, so the line still shows what is there
    assert line.endswith("--anchor-regex '_q_rope_store' in pid 1; closest kernel names: "
                         "'_k_norm_store', 'flash_fwd_kernel'"), line


def test_with_a_pid_without_kernels_the_hint_says_so(tmp_path):
    trace = two_gpus(tmp_path / "t.json")
    line = assert_refused(run("anchors", "--trace", trace, "--anchor-regex", "rope",
                              "--pid", "9"), "no kernel matches")
    assert line.endswith("--anchor-regex 'rope' in pid 9; pid 9 has no kernels"), line


@pytest.mark.parametrize("command", ["layers", "anchors"])
def test_a_trace_without_kernels_says_so(tmp_path, command):
    trace = write_trace(tmp_path / "cpu.json", [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 9, "tid": 1, "ts": "0",
         "dur": "1"}])
    out = tmp_path / "out.json"
    result = (_layers(trace, out, "mm") if command == "layers" else
              run("anchors", "--trace", trace, "--anchor-regex", "mm"))
    line = assert_refused(result, "no kernel matches", out, Path(f"{out}.layers.json"))
    assert line == ("tracestream: error: no kernel matches --anchor-regex 'mm'; the trace has "
                    "no kernels")


def test_an_end_anchor_that_matches_nothing_on_the_gpu_gets_a_hint(tmp_path):
    trace = two_gpus(tmp_path / "t.json")
    out = tmp_path / "out.json"
    line = assert_refused(_layers(trace, out, "^_q_rope_store$", "--pid", "0",
                                  "--end-anchor-regex", "^gemm_bf16$"),
                          "no kernel matches", out, Path(f"{out}.layers.json"))
    assert line.endswith(
        "no kernel matches --end-anchor-regex '^gemm_bf16$' on device 0 of pid 0 (the anchors' "
        "GPU); closest kernel names: 'gemm_bf16_kernel'"), line


@pytest.mark.parametrize("command", ["layers", "anchors"])
def test_a_device_without_the_match_says_where_it_matches(tmp_path, command):
    """The name is right and the device is not: naming kernels would suggest the very name
    the pattern matches."""
    trace = two_gpus(tmp_path / "t.json")
    out = tmp_path / "out.json"
    if command == "layers":
        result = _layers(trace, out, "^_q_rope_store$", "--pid", "0", "--device", "1")
    else:
        result = run("anchors", "--trace", trace, "--anchor-regex", "^_q_rope_store$",
                     "--pid", "0", "--device", "1")
    line = assert_refused(result, "no kernel matches", out, Path(f"{out}.layers.json"))
    assert line == ("tracestream: error: no kernel matches --anchor-regex '^_q_rope_store$' on "
                    "device 1 of pid 0; it matches on device 0 of pid 0 (3 matches)")


def test_an_end_anchor_on_another_gpu_says_where_it_matches(tmp_path):
    trace = two_gpus(tmp_path / "t.json")
    out = tmp_path / "out.json"
    line = assert_refused(_layers(trace, out, "^_q_rope_store$", "--pid", "0",
                                  "--end-anchor-regex", "^flash_fwd_kernel$"),
                          "no kernel matches", out, Path(f"{out}.layers.json"))
    assert line == (
        "tracestream: error: no kernel matches --end-anchor-regex '^flash_fwd_kernel$' on "
        "device 0 of pid 0 (the anchors' GPU); it matches on device 1 of pid 1 (3 matches)")


# -- the index: names per pid, the same with both backends, capped ---------------------------


def test_the_index_keeps_kernel_names_per_pid_with_both_backends(tmp_path, backend):
    trace = two_gpus(tmp_path / "t.json")
    for options in (IndexOptions(patterns={"anchor": re.compile("x")}),
                    IndexOptions(patterns={"anchor": re.compile("x")},
                                 records=False, sweep=False, stats=False, track_facts=False)):
        with TraceSource(str(trace)) as source:
            index = run_index(source, options)
        try:
            assert index.kernel_vocabulary.by_pid == {
                0: {"_q_rope_store": 3, "_k_rope_store": 3, "gemm_bf16_kernel": 3},
                1: {"flash_fwd_kernel": 3, "_k_norm_store": 3}}
        finally:
            index.close()


def test_the_vocabulary_is_capped_and_says_so():
    vocabulary = KernelVocabulary(limit=3)
    vocabulary.add({0: {"a": 1, "b": 1}})
    vocabulary.add({0: {"a": 2, "c": 1, "d": 1}, 1: {"e": 1}})
    assert vocabulary.by_pid == {0: {"a": 3, "b": 1, "c": 1}, 1: {}}
    assert vocabulary.full and vocabulary.kept == 3
    message = str(no_match("anchor_regex", "x", vocabulary))
    assert message.endswith("closest kernel names (among the first 3 kept): 'a', 'b', 'c'")
    message = str(no_match("anchor_regex", "x", vocabulary, [1], " in pid 1"))
    assert message.endswith("in pid 1; no kernel names kept (at most 3 are kept)")


def test_a_number_as_a_kernel_name_is_suggested_as_its_text():
    vocabulary = KernelVocabulary()
    vocabulary.add({0: {7: 2, "gemm": 1}})
    error = no_match("anchor_regex", "^7x$", vocabulary)
    assert isinstance(error, SpecError)
    assert error.render(lambda field: "--anchor-regex") == (
        "no kernel matches --anchor-regex '^7x$'; closest kernel names: '7', 'gemm'")


# -- the ranking -----------------------------------------------------------------------------


def test_names_holding_the_text_come_before_closer_spellings():
    # `_k_rope_store` is one letter from the pattern, but `_q_rope_store_fused` holds it
    names = ["_k_rope_store", "_q_rope_store_fused", "unrelated"]
    assert closest_names("_q_rope_store", names) == ["_q_rope_store_fused", "_k_rope_store"]


def test_names_holding_the_text_go_shortest_first_then_most_frequent():
    counts = {"rope_long_variant": 9, "rope_a": 1, "rope_b": 5}
    assert closest_names("rope", counts) == ["rope_b", "rope_a", "rope_long_variant"]


def test_the_others_go_by_edit_distance():
    assert closest_names("^k_rop_store$", NAMES, limit=2) == ["_k_rope_store", "_q_rope_store"]
    assert closest_names("gem_bf16", NAMES, limit=1) == ["gemm_bf16_kernel"]


def test_long_names_and_patterns_are_compared_by_their_first_characters():
    """A thousand-character pattern against long template names: the first COMPARED
    characters decide (difflib's cost grows with both lengths)."""
    from tracestream.plan.hints import COMPARED

    stem = "k" * COMPARED
    names = [stem + "_a" * 5000, stem + "_b" * 5000]
    # equal in what is compared: the tie goes to name order, whatever follows
    assert closest_names("y" * 3000, names, limit=2) == sorted(names)


def test_a_short_pattern_is_not_close_to_a_long_name_by_a_few_letters():
    # `roup` in `warpgroupsize` is 3 of `rope`'s 4 letters: not close
    names = ["_q_rope_store", "gemm_tn_warpgroupsize1x1x1"]
    assert closest_names("ROPE", names) == ["_q_rope_store"]


def test_far_names_are_left_out_unless_nothing_is_close():
    # a close name is named alone: the others would only pad the line
    assert closest_names("gem_bf16", NAMES) == ["gemm_bf16_kernel"]
    # nothing close: the nearest three, so the line still shows what the trace holds
    assert closest_names("x", NAMES) == ["_draft_q_rope", "_k_rope_store", "_q_rope_store"]


def test_at_most_limit_names():
    assert len(closest_names("rope", NAMES + [f"rope_{i}" for i in range(9)])) == 5
    assert closest_names("rope", NAMES, limit=2) == ["_draft_q_rope", "_k_rope_store"]
    assert closest_names("rope", [], limit=2) == []


def test_case_does_not_matter():
    assert closest_names("Q_ROPE", ["_q_rope_store", "gemm"], limit=1) == ["_q_rope_store"]
    assert closest_names("q_rope", ["_Q_ROPE_STORE", "gemm"], limit=1) == ["_Q_ROPE_STORE"]


def test_regex_metacharacters_are_not_literal_text():
    assert closest_names(r"^_q_rope_stor(e|age)\d+$", NAMES, limit=1) == ["_q_rope_store"]
    assert closest_names(r"nccl.*All[Rr]educe", NAMES, limit=1) == [
        "ncclDevKernel_AllReduce_Sum"]
    assert closest_names(r"gemm_bf16\.x", ["gemm_bf16.x_kernel", "gemm_bf16_x"],
                         limit=1) == ["gemm_bf16.x_kernel"]
    assert closest_names("draft|norm", NAMES, limit=1) == ["_draft_q_rope"]


@pytest.mark.parametrize("pattern, parts", [
    ("^_q_rope_store$", [["_q_rope_store"]]),
    (r"\bflash\.fwd\d+", [["flash.fwd"]]),
    ("a|b.c", [["a"], ["b", "c"]]),
    ("[abc]x(?:yz)+", [["x", "yz"]]),
    ("(?P<n>Foo)bars?", [["foo", "bar"]]),
    ("ab{0,2}c", [["a", "c"]]),
    ("x[^]]y", [["x", "y"]]),
    (".*", [[]]),
])
def test_literal_parts(pattern, parts):
    assert literal_parts(pattern) == parts


def test_without_literal_text_the_most_frequent_names_come_first():
    assert closest_names(".", {"rare": 1, "often": 9, "sometimes": 3}, limit=2) == [
        "often", "sometimes"]


def test_many_names_are_ranked_quickly_and_still_find_the_near_miss():
    names = {f"kernel_{i:05d}_" + "x" * 150: 1 for i in range(20_000)}
    names["_q_rope_store"] = 1
    assert closest_names("_q_rop_store", names, limit=1) == ["_q_rope_store"]
