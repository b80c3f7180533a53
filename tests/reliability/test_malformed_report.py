"""An edited or damaged report is refused by `verify` as `restore` refuses it.

Every member verify reads must have the type tracestream writes: a missing pid, a
num_layers given as text, options that are not an object... are one line, exit 2,
"the report is incomplete or malformed (where)" (rows that are not objects: "cannot read
report"), never an internal error (exit 70).
"""

from __future__ import annotations

import json

import pytest

from .support import LAYERS_ARGS, assert_refused, base_events, document, leftovers, sha256

EDITS = {
    "pid missing": (lambda r: r.pop("pid"), "missing required field `pid`"),
    "num_layers as text": (lambda r: r.update(num_layers="4"), "$.num_layers"),
    "num_layers a fraction": (lambda r: r.update(num_layers=1.5), "$.num_layers"),
    "passes null": (lambda r: r.update(passes=None), "$.passes"),
    "a gpu without device": (lambda r: r["gpus"][0].pop("device"), "$.gpus[0]"),
    "options a number": (lambda r: r.update(options=0), "$.options"),
    "end_anchor_regex a number": (
        lambda r: r["options"]["layers"].update(end_anchor_regex=-1),
        "$.options.layers.end_anchor_regex"),
    "an unknown option": (lambda r: r["options"]["layers"].update(colour=1), "colour"),
    "an option out of range": (lambda r: r["options"]["layers"].update(num_layers=0),
                               "num_layers"),
    "max_lanes as text": (lambda r: r["options"]["compact"].update(max_lanes="2"),
                          "$.options.compact.max_lanes"),
    "layers rows a number": (lambda r: r.update(layers=0), '"layers" is a number'),
    "a guide row a number": (lambda r: r["layers"].__setitem__(0, 0),
                             "a `layers` row is 0, not an object"),
    "every guide row a number": (lambda r: r.update(layers=[0] * len(r["layers"])),
                                 "every element of the event array must be a JSON object"),
    "a lane tid an object": (
        lambda r: r["compaction"]["groups"][0]["lane_tids"].__setitem__(0, {}), "lane_tids"),
}


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("annotated")
    trace = folder / "t.json"
    trace.write_bytes(document(base_events()))
    output = folder / "o.json"
    return trace, output, LAYERS_ARGS + ["--max-gpu-lanes", "2"]


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_verify_refuses_a_malformed_report_in_one_line(cli, annotated, tmp_path, edit):
    trace, output, args = annotated
    if not output.exists():
        assert cli("layers", "--trace", trace, "--output", output, "--quiet", *args).rc == 0
    report = json.loads(output.with_name("o.json.layers.json").read_text())
    change, where = EDITS[edit]
    change(report)
    edited = tmp_path / "r.json"
    edited.write_text(json.dumps(report))
    before = sha256(trace), sha256(output), sha256(edited)
    out = cli("verify", "--trace", trace, "--output", output, "--report", edited)
    assert out.stdout == b""
    what = ("cannot read report" if edit.startswith(("layers rows", "every guide row"))
            else "the report is incomplete or malformed (")
    assert_refused(out, what, where, place=False)
    assert (sha256(trace), sha256(output), sha256(edited)) == before
    assert leftovers(tmp_path) == ["r.json"]
