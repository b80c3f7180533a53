"""A report's guide rows are made with the guides' events, in one read of each block of
guides (issue 23: labelling every match of a kernel is 10^5 guides on a replicated real
trace, and the run made every guide's columns twice: once for its event, once for its row).
"""

from __future__ import annotations

import json

from conftest import ANCHOR, TERMINAL, layers_args, run
from test_guide_memory import EPOCH_NS, GUIDE_PID, GUIDE_TID, labelled

from tracestream import LayerSpec, add_layer_guides
from tracestream.jsontext import PrettyWriter, write_pretty
from tracestream.plan.guides import GuideTable, build_guides
from tracestream.plan.guidetext import GuideEvents, GuideRows


def _report(rows: GuideRows) -> dict:
    """A report's shape: members before the rows, the rows, members filled in later."""
    return {"tool": "tracestream", "options": {"layers": {"num_layers": 8}},
            "layers": rows, "source_sha256": None, "compaction": {"groups": [1, 2]}}


def test_a_report_written_in_steps_is_the_report_written_at_once():
    """The members before the rows go out first; the rows are handed in a block at a time
    as the guides' events are made; the members after them are read only at the end (the
    source's sha256 is known only then). The bytes are those of writing it all at once."""
    anchors, terminals, spec = labelled(3_000)  # three blocks of guides
    guides = build_guides(anchors, terminals, spec)
    rows = GuideRows(guides, EPOCH_NS)
    report = _report(rows)
    written: list[bytes] = []
    steps = PrettyWriter(report, written.append)
    assert steps.head() is rows
    head = b"".join(written)
    assert head.endswith(b'"layers": [\n') and b"source_sha256" not in head
    events = GuideEvents(guides, GUIDE_PID, GUIDE_TID, spec)
    texts = [text for text, row_text in events.texts_with_rows(rows)
             if steps.rows(row_text) is None]
    report["source_sha256"] = "ab" * 32  # filled in after the rows
    steps.finish()

    at_once: list[bytes] = []
    write_pretty(_report(GuideRows(guides, EPOCH_NS)) | {"source_sha256": "ab" * 32},
                 at_once.append)
    assert b"".join(written) == b"".join(at_once)
    assert texts == list(events.texts())
    parsed = json.loads(b"".join(written))["layers"]
    exact = json.loads(b"".join(written), parse_float=str)["layers"]  # µs as written
    assert len(parsed) == 3_000
    for k, kept in ((0, rows.first), (-1, rows.last)):  # the summary's first and last guide
        assert {**parsed[k], "start_us": exact[k]["start_us"],
                "end_us": exact[k]["end_us"]} == kept


def test_a_report_without_rows_to_hand_in_is_written_whole_at_the_end():
    """`head()` of a report with no streamed rows (compact's) writes nothing: every member
    is read when the run is through."""
    written: list[bytes] = []
    report = {"tool": "tracestream", "source_sha256": None}
    steps = PrettyWriter(report, written.append)
    assert steps.head() is None and not written
    report["source_sha256"] = "cd" * 32
    steps.finish()
    assert json.loads(b"".join(written)) == report
    empty: list[bytes] = []
    PrettyWriter({}, empty.append).finish()
    assert b"".join(empty) == b"{}\n"


def test_each_guide_is_read_once_for_its_event_and_its_report_row(decode_trace, tmp_path,
                                                                   monkeypatch):
    """A run reads each block of guides once (anchor rows from the match store, their times
    and texts formatted) and writes its events and its report rows from it; the report's
    rows are the output's guides."""
    reads = []
    blocks = GuideTable.blocks

    def counted(self, *args, **kwargs):
        reads.append(len(self))
        return blocks(self, *args, **kwargs)

    monkeypatch.setattr(GuideTable, "blocks", counted)
    trace, _ = decode_trace
    out = tmp_path / "out.json"
    report = add_layer_guides(trace, out, LayerSpec(
        anchor_regex=ANCHOR, num_layers=8, anchor_offset=0, phase="target-verify",
        evidence="test", passes=6, extra_anchors_per_pass=1, end_anchor_regex=TERMINAL))
    assert reads == [48]
    rows = list(report.layer_rows())
    assert [(r["pass_index"], r["layer_id"]) for r in rows] == [
        (p, layer) for p in range(6) for layer in range(8)]
    for kept, row in ((report.first_guide, rows[0]), (report.last_guide, rows[-1])):
        assert {**kept, "start_us": None, "end_us": None} == {**row, "start_us": None,
                                                              "end_us": None}


def test_a_report_on_stdout_is_the_report_a_file_gets(decode_trace, tmp_path):
    """A report written to stdout is written when the run is through (nothing goes out
    before it is), and holds the same bytes as the report file of the same run."""
    trace, _ = decode_trace
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    to_file = run(*layers_args(trace, "out.json", "--end-anchor-regex", TERMINAL,
                               "--report", "out.json.layers.json"), cwd=tmp_path / "a")
    to_stdout = run(*layers_args(trace, "out.json", "--end-anchor-regex", TERMINAL,
                                 "--report", "-"), cwd=tmp_path / "b")
    assert to_file.returncode == to_stdout.returncode == 0, to_stdout.stderr.decode()

    def named(text: bytes) -> bytes:  # the report's name, where the files give it
        return text.replace(b'"-"', b'"out.json.layers.json"')

    assert named(to_stdout.stdout) == (tmp_path / "a" / "out.json.layers.json").read_bytes()
    assert named((tmp_path / "b" / "out.json").read_bytes()) == (
        tmp_path / "a" / "out.json").read_bytes()
