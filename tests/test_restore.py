"""`restore` gives back the source byte for byte (`cmp` is silent), whatever its layout.

The sources here are laid out as no earlier restore wrote them: Kineto's multi-line
objects, CRLF and tabs, spaces before commas, no whitespace at all, members after
the event array, no final newline; events without `args` or with an empty one;
retired stream metadata first, in the middle and last; relocated events first and
last. Each goes through `layers`, `layers --max-gpu-lanes` and `compact`, plain and
compressed, and must come back exactly.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import pytest
import zstandard
from conftest import assert_refused, assert_same_bytes, assert_verified, read_bytes, run

from tracestream.engine import CompactSpec, add_layer_guides, compact
from tracestream.plan.specs import LayerSpec

_STYLES = (
    lambda e: json.dumps(e, indent=2).replace("\n", "\n  "),  # Kineto-like multi-line
    lambda e: json.dumps(e, separators=(",", ":")),
    lambda e: json.dumps(e, indent="\t").replace("\n", "\r\n"),
    lambda e: json.dumps(e, separators=(" , ", " : ")),
)
_SEPARATORS = (",\n  ", " ,\r\n\t", ",", "\n,\n")


def kernel(name, ts, tid, **args):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": 4,
            "args": {"device": 0, "stream": tid, **args}}


def meta(tid):
    return {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": tid,
            "args": {"name": f"stream {tid} "}}


def gpu_events() -> list[dict]:
    """Four `a` anchors on stream 7, work on streams 8 and 9 beside them, a flow into each
    `a` (its `f` has no args), a memset with an empty args object."""
    events = []
    for i in range(4):
        t = 100 + 20 * i
        events.append(kernel("a", t, 7))
        events.append(kernel("b", t + 1, 8 + i % 2, note="x"))
        events.append({"ph": "s", "id": i, "pid": 1, "tid": 1, "ts": t - 1, "cat": "ac2g",
                       "name": "ac2g"})
        events.append({"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": t, "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})
    events.append({"ph": "X", "cat": "gpu_memset", "name": "Memset", "pid": 0, "tid": 9,
                   "ts": 190, "dur": 2, "args": {}})
    return events


def cpu_events() -> list[dict]:
    return [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 95,
         "dur": 90, "args": {"External id": 3}},
        {"ph": "i", "s": "t", "name": "no args at all", "pid": 1, "tid": 1, "ts": 96},
    ]


PLACES = {
    "metadata first": lambda g, c, m: m + g + c,
    "metadata in the middle": lambda g, c, m: c + g[:5] + m + g[5:],
    "metadata last": lambda g, c, m: c + g + m,
    "relocated events first and last": lambda g, c, m: g[:1] + c + m + g[1:],
}


def source_text(place: str, *, bare: bool) -> bytes:
    events = PLACES[place](gpu_events(), cpu_events(), [meta(7), meta(8), meta(9)])
    body = "".join(
        (_SEPARATORS[i % len(_SEPARATORS)] if i else "") + _STYLES[i % len(_STYLES)](e)
        for i, e in enumerate(events))
    if bare:
        return (" \t[\r\n" + body + "\n ]\n\n").encode()
    return ('{\r\n "schemaVersion" :1 ,\n\t"traceEvents":[\n' + body
            + ']  ,"deviceProperties": [ {"id" : 0} ],\n"traceName":"t"}').encode()


def write(path: Path, data: bytes) -> Path:
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def annotate(command: str, source: Path, output: Path):
    spec = LayerSpec(anchor_regex="^a$", num_layers=2, anchor_offset=0, passes=2, phase="p",
                     evidence="e")
    if command == "compact":
        return compact(source, output, CompactSpec(), workers=0)
    lanes = CompactSpec() if command == "layers --max-gpu-lanes" else None
    return add_layer_guides(source, output, spec, compact=lanes, workers=0)


@pytest.mark.parametrize("command", ["layers", "layers --max-gpu-lanes", "compact"])
@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("bare", [False, True], ids=["object", "bare array"])
def test_restore_gives_back_every_byte(tmp_path, command, place, bare):
    source = write(tmp_path / "source.json", source_text(place, bare=bare))
    output = tmp_path / "out.json"
    report = annotate(command, source, output)
    if command != "layers":
        assert len(report.data.get("compaction", report.data)["retired_track_metadata"]) == 3
    assert_verified(source, output)


@pytest.mark.parametrize("suffix", [".json.gz", ".json.zst"])
def test_restore_of_a_compressed_source_is_its_decompressed_bytes(tmp_path, suffix):
    text = source_text("metadata last", bare=False)
    source = write(tmp_path / f"source{suffix}", text)
    output = tmp_path / f"out{suffix}"
    report = annotate("layers --max-gpu-lanes", source, output)
    assert report.data["source_data_sha256"] == hashlib.sha256(text).hexdigest()
    assert report.data["source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    restored = tmp_path / "restored.json"
    result = run("restore", "--trace", output, "--output", restored)
    assert result.returncode == 0, result.stderr
    assert restored.read_bytes() == text


def test_restore_to_a_compressed_output(tmp_path):
    source = write(tmp_path / "source.json", source_text("metadata first", bare=False))
    output = tmp_path / "out.json.zst"
    annotate("compact", source, output)
    restored = tmp_path / "restored.json.gz"
    assert run("restore", "--trace", output, "--output", restored).returncode == 0
    assert_same_bytes(restored, source)


def test_an_older_tracestream_member_comes_back_as_it_was(tmp_path):
    text = source_text("metadata in the middle", bare=False).replace(
        b'"schemaVersion" :1', b'"tracestream" : {"tool":  "someone else"},"schemaVersion" :1')
    source = write(tmp_path / "source.json", text)
    output = tmp_path / "out.json"
    annotate("layers --max-gpu-lanes", source, output)
    assert b'"someone else"' not in output.read_bytes()
    assert_verified(source, output)


def _annotated(tmp_path, command="layers --max-gpu-lanes", place="metadata in the middle"):
    source = write(tmp_path / "source.json", source_text(place, bare=False))
    output = tmp_path / "out.json"
    annotate(command, source, output)
    return source, output


def _refused_restore(tmp_path, output, report, fragment):
    restored = tmp_path / "restored.json"
    assert_refused(run("restore", "--trace", output, "--output", restored, "--report", report),
                   fragment, restored)


def test_a_whitespace_edit_of_the_output_is_refused_by_the_hash(tmp_path):
    """Values equal, bytes not: the sha256 of the source's bytes catches it."""
    _, output = _annotated(tmp_path)
    report = Path(f"{output}.layers.json")
    edited = tmp_path / "edited.json"
    edited.write_bytes(output.read_bytes().replace(b'"aten::mm"', b'"aten::mm" ', 1))
    _refused_restore(tmp_path, edited, report, "the restored bytes differ from the source")


def _with_hash_zeroed(data):
    data["source_data_sha256"] = "0" * 64


def _without_hash(data):
    del data["source_data_sha256"]


def _without_counts(data):
    del data["original_event_count"]


@pytest.mark.parametrize("edit, fragment", [
    (_with_hash_zeroed, "the restored bytes differ from the source"),
    (_without_hash, "written by an older tracestream"),
    (_without_counts, "the report is incomplete or malformed"),
], ids=["another hash", "no hash", "no counts"])
def test_an_edited_report_is_refused(tmp_path, edit, fragment):
    _, output = _annotated(tmp_path)
    data = json.loads(Path(f"{output}.layers.json").read_text())
    edit(data)
    report = tmp_path / "edited.layers.json"
    report.write_text(json.dumps(data))
    _refused_restore(tmp_path, output, report, fragment)


_LOOKALIKE = {"pid": 0, "tid": 7, "source_event_index": 5, "had_args": True}


@pytest.mark.parametrize("where", [
    "cpu name", "cpu nested args", "kernel nested args", "kernel member before args",
])
def test_the_provenance_key_elsewhere_is_not_provenance(tmp_path, where):
    """Only the first member of an event's own `args` is provenance: the key's text in a
    name, or an object shaped like it nested deeper, passes through untouched."""
    events = gpu_events() + cpu_events()
    cpu, gpu = events[-2], events[0]
    text = json.dumps({"_compact_gpu_track": _LOOKALIKE})
    if where == "cpu name":
        cpu["name"] = text
    elif where == "cpu nested args":
        cpu["args"] = {"x": {"_compact_gpu_track": _LOOKALIKE}}
    elif where == "kernel nested args":
        gpu["args"]["x"] = {"_compact_gpu_track": _LOOKALIKE}
    else:
        gpu = {**{k: v for k, v in gpu.items() if k != "args"}, "extra": {
            "_compact_gpu_track": _LOOKALIKE}, "args": gpu["args"]}
        events[0] = gpu
    lines = ",\n".join(json.dumps(e, separators=(", ", ": ")) for e in events)
    source = tmp_path / "source.json"
    source.write_text('{"traceEvents": [\n' + lines + "\n]}\n")
    output = tmp_path / "out.json"
    annotate("layers --max-gpu-lanes", source, output)
    assert_verified(source, output)


def test_a_cpu_event_given_a_provenance_member_is_refused(tmp_path):
    """A provenance member put into a CPU event's own args (by hand) does not pass as a
    relocated event: restore refuses, one line, nothing written."""
    _, output = _annotated(tmp_path)
    member = (b'"_compact_gpu_track": {"pid": 1, "tid": 1, "source_event_index": 3, '
              b'"had_args": true}, ')
    edited = tmp_path / "edited.json"
    data = output.read_bytes()
    at = data.rindex(b"{", 0, re.search(rb'"External id"', data).start()) + 1
    edited.write_bytes(data[:at] + member + data[at:])
    _refused_restore(tmp_path, edited, Path(f"{output}.layers.json"), "does not match its report")


def test_a_source_whose_event_holds_the_member_in_its_args_is_refused(tmp_path):
    """Such a source looks compacted already: planning it would make restore ambiguous."""
    events = gpu_events() + cpu_events()
    events[-2]["args"] = {"_compact_gpu_track": "mine"}
    source = tmp_path / "source.json"
    source.write_text(json.dumps({"traceEvents": events}))
    output = tmp_path / "out.json"
    assert_refused(run("compact", "--trace", source, "--output", output),
                   "already carries `_compact_gpu_track`", output)


def test_read_bytes_is_the_decompressed_source(tmp_path):
    """The helper every test compares with (a test that cannot fail is a defect)."""
    text = source_text("metadata first", bare=True)
    assert read_bytes(write(tmp_path / "s.json.gz", text)) == text
    with pytest.raises(AssertionError, match="differs from the source"):
        assert_same_bytes(write(tmp_path / "r.json", text + b" "), tmp_path / "s.json.gz")


def test_an_added_member_moved_first_is_refused(tmp_path):
    _, output = _annotated(tmp_path)
    data = output.read_bytes()
    member = re.search(rb',\n  ("tracestream": \{[^}]*\})', data)
    edited = tmp_path / "edited.json"
    edited.write_bytes(b"{" + member.group(1) + b"," + data[1 : member.start()]
                       + data[member.end():])
    _refused_restore(tmp_path, edited, Path(f"{output}.layers.json"),
                     "the added top-level `tracestream` member is the first one")


@pytest.mark.parametrize("quick, speculative", [(False, False), (True, False), (True, True)],
                         ids=["exact", "quick", "speculative"])
@pytest.mark.parametrize("command", ["layers", "compact"])
@pytest.mark.parametrize("place", list(PLACES))
def test_every_chunk_boundary_restores_exactly(tmp_path, command, place, quick, speculative):
    """Chunks of a few hundred bytes put a chunk boundary next to every edit: before the
    first added event, at a retired event, at a relocated one. The quick splice (verify's,
    a chunk's relocations undone at once) gives back the same bytes and counts, also from
    chunks cut where events seem to end and counted, not decoded (`speculative`)."""
    from tracestream.commands.restore import HashingWriter, Undo, splice_back
    from tracestream.plan.report import load_report
    from tracestream.read.source import TraceSource

    text = source_text(place, bare=False)
    source = write(tmp_path / "source.json", text)
    output = tmp_path / "out.json"
    annotate(command, source, output)
    undo = Undo.from_report(*load_report(Path(f"{output}.{command}.json")), name="out")
    for chunk_bytes in (1, 100, 300, 700, 1500, 1 << 20):
        writer = HashingWriter()
        with TraceSource(output) as annotated:
            counts = splice_back(annotated, undo, writer, chunk_bytes=chunk_bytes, quick=quick,
                                 speculative=speculative)
        assert writer.hexdigest() == hashlib.sha256(text).hexdigest(), chunk_bytes
        with TraceSource(output) as annotated:
            assert counts == splice_back(annotated, undo, HashingWriter(),
                                         chunk_bytes=chunk_bytes)


@pytest.mark.parametrize("speculative", [False, True], ids=["quick", "speculative"])
def test_a_lookalike_among_relocated_events_restores_exactly(tmp_path, speculative):
    """The provenance key's text in a CPU event's name, in a chunk that holds nothing else
    to undo but relocations: the quick undo leaves it (the key is still there) and the
    chunk's events are read exactly, also where the chunk was cut speculatively and not
    decoded."""
    from tracestream.commands.restore import HashingWriter, Undo, splice_back
    from tracestream.plan.report import load_report
    from tracestream.read.source import TraceSource

    events = []
    for step in range(12):
        for event in gpu_events():
            event = {**event, "ts": event["ts"] + 1000 * step}
            if "id" in event:
                event["id"] += 10 * step
            events.append(event)
        if step == 6:
            events.append({"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "dur": 1,
                           "ts": 1000 * step + 5,
                           "name": json.dumps({"_compact_gpu_track": _LOOKALIKE})})
    text = ('{"traceEvents": [\n' + ",\n".join(
        json.dumps(e, separators=(", ", ": ")) for e in events) + "\n]}\n").encode()
    source = write(tmp_path / "source.json", text)
    output = tmp_path / "out.json"
    annotate("compact", source, output)
    undo = Undo.from_report(*load_report(Path(f"{output}.compact.json")), name="out")
    for chunk_bytes in (100, 300, 700, 1500):
        writer = HashingWriter()
        with TraceSource(output) as annotated:
            splice_back(annotated, undo, writer, chunk_bytes=chunk_bytes, quick=True,
                        speculative=speculative)
        assert writer.hexdigest() == hashlib.sha256(text).hexdigest(), chunk_bytes
    assert_verified(source, output)


def test_verify_catches_a_change_between_events(tmp_path):
    """Whitespace between events is not part of any event: only the byte comparison of the
    restored output with the source sees it (one failed check, the plan's still holds)."""
    from tracestream.commands.verify import verify

    source, output = _annotated(tmp_path)
    edited = tmp_path / "edited.json"
    edited.write_bytes(output.read_bytes().replace(b" ,\r\n\t", b" ,\n\t", 1))
    verdict = verify(source, edited, Path(f"{output}.layers.json"))
    failed = {c.name: c.detail for c in verdict.checks if not c.ok}
    assert list(failed) == ["restored events equal the source"], verdict.summary()
    assert "the restored bytes differ from the source's" in failed[
        "restored events equal the source"]


def test_hashing_writer_hashes_and_writes_pieces_of_any_size_in_order():
    """Small pieces are joined into blocks, a piece of a block or more goes as it is: the
    hash and the bytes written are those of everything, in the order written."""
    from tracestream.commands.restore import _BLOCK, HashingWriter

    class Out:
        def __init__(self):
            self.parts = []

        def write(self, data):
            self.parts.append(bytes(data))

    pieces = [b"a" * 10, b"b" * _BLOCK, b"c", b"d" * (_BLOCK - 1), b"e" * 2, b"f" * (3 * _BLOCK)]
    out = Out()
    writer = HashingWriter(out)
    for piece in pieces:
        writer.write(piece)
    whole = b"".join(pieces)
    assert writer.hexdigest() == hashlib.sha256(whole).hexdigest()
    assert b"".join(out.parts) == whole


def test_verify_restores_exactly_where_events_hold_what_looks_like_a_cut(tmp_path, monkeypatch):
    """Events holding `}, {` (an array of objects, a name) make the quick restore's
    uncut count of events too high: its digest is not the source's, and verify's restore
    check then cuts the events exactly and gets the source's bytes back."""
    from functools import partial

    from tracestream.commands.restore import Undo, splice_back
    from tracestream.commands.verify import restored as module
    from tracestream.plan.report import load_report
    from tracestream.read.source import TraceSource

    events = PLACES["metadata last"](gpu_events(), cpu_events(), [meta(7), meta(8), meta(9)])
    events += [{"ph": "i", "s": "t", "name": f"odd}}, {{name {k}", "pid": 1, "tid": 1,
                "ts": 97 + k, "args": {"shapes": [{"a": k}, {"b": k}]}} for k in range(40)]
    text = ('{"traceEvents": [\n' + ",\n".join(map(json.dumps, events)) + "\n]}").encode()
    source = write(tmp_path / "source.json", text)
    output = tmp_path / "out.json"
    annotate("layers", source, output)
    undo = Undo.from_report(*load_report(Path(f"{output}.layers.json")), name="out")
    monkeypatch.setattr(module, "splice_back", partial(splice_back, chunk_bytes=300))
    with TraceSource(output) as annotated:
        problem, digest = module.restored_from(annotated, undo, quick=True, speculative=True)
    assert problem or digest != undo.sha256  # the uncut count went wrong
    assert module.restored_sha256(str(output), undo) == ("", hashlib.sha256(text).hexdigest())
    assert_verified(source, output)

