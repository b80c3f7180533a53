"""Worker processes change nothing: every command gives the same bytes with 2 workers as
with none, on a trace of several 2 MB chunks (plain: workers read their spans; gzip:
chunks travel through shared slots, or pipes when they do not fit)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from conftest import assert_verified

from samples.generate import ANCHOR, TERMINAL, TraceConfig, generate
from tracestream.commands.evidence.anchors import (
    anchors_json_rows,
    anchors_summary_json,
    find_anchors,
)
from tracestream.commands.evidence.inspect import inspect_trace
from tracestream.engine import add_layer_guides, compact
from tracestream.jsontext import dumps
from tracestream.plan.specs import CompactSpec, LayerSpec

SPEC = LayerSpec(anchor_regex=f"^{re.escape(ANCHOR)}$", num_layers=8, anchor_offset=0,
                 phase="x", evidence="generator", passes=40, extra_anchors_per_pass=1)


@pytest.fixture(scope="module", params=["json", "json.gz"])
def several_chunks(request, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chunks") / f"t.{request.param}"
    generate(path, TraceConfig(size_bytes=14 << 20))
    return path


def test_layers_and_compact_write_the_same_bytes_with_workers(several_chunks, tmp_path):
    outputs = {}
    for workers in (0, 2):
        folder = tmp_path / f"workers{workers}"  # same names: the outputs name their report
        folder.mkdir()
        add_layer_guides(several_chunks, folder / "layers.json", SPEC,
                         compact=CompactSpec(max_lanes=10), workers=workers)
        compact(several_chunks, folder / "compact.json", CompactSpec(max_lanes=10),
                workers=workers)
        outputs[workers] = [(folder / name).read_bytes() for name in (
            "layers.json", "layers.json.layers.json", "compact.json")]
    assert outputs[0] == outputs[2]
    assert_verified(several_chunks, tmp_path / "workers2" / "layers.json")


def test_inspect_and_anchors_report_the_same_with_workers(several_chunks):
    inspected = [dumps(inspect_trace(several_chunks, workers=w)) for w in (0, 2)]
    assert inspected[0] == inspected[1]
    found = [find_anchors(several_chunks, f"^{re.escape(ANCHOR)}$", cross_check=TERMINAL,
                          workers=w) for w in (0, 2)]
    assert found[0]["count"] > 500
    for written in (anchors_summary_json, anchors_json_rows):
        assert b"".join(written(found[0])) == b"".join(written(found[1]))


def test_read_only_commands_hash_nothing_and_leave_a_files_bytes_to_the_workers(
        several_chunks, monkeypatch):
    """inspect and anchors report no hash: their one pass computes none (a compressed input
    is still decompressed in full); of a plain file the main process reads only what it
    decodes itself, near the start and the end, while the workers read their chunks."""
    from tracestream.read import source as source_module

    hashed, read_here = [], []
    real_sha256 = source_module.hashlib.sha256

    def counted_sha256(*args):
        hashed.append(1)
        return real_sha256(*args)

    real_read = source_module.TraceSource.read

    def counted_read(self, stats=None):
        for block in real_read(self, stats):
            read_here.append(len(block))
            yield block

    monkeypatch.setattr(source_module.hashlib, "sha256", counted_sha256)
    monkeypatch.setattr(source_module.TraceSource, "read", counted_read)
    inspect_trace(several_chunks, workers=2)
    find_anchors(several_chunks, f"^{re.escape(ANCHOR)}$", cross_check=TERMINAL, workers=2)
    assert not hashed
    if several_chunks.suffix == ".json":
        assert not read_here  # no full read: the scanner reads near its cuts
    else:  # each command decompresses the whole input once
        assert sum(read_here) == 2 * len(gzip.decompress(several_chunks.read_bytes()))


@pytest.mark.parametrize("slot_bytes", [4096, 2_150_000])
def test_chunks_too_big_for_their_slot_go_through_the_pipe(several_chunks, tmp_path,
                                                           monkeypatch, slot_bytes):
    """No chunk fits 4 KB, some fit 2.15 MB (read chunks of gzip input going out, rewritten
    chunks coming back): the output is the same bytes."""
    from tracestream.read import sizing

    outputs = []
    for workers in (0, 2):
        if workers:
            monkeypatch.setattr(sizing, "SLOT_BYTES", slot_bytes)
        folder = tmp_path / f"workers{workers}"
        folder.mkdir()
        compact(several_chunks, folder / "compact.json", CompactSpec(max_lanes=10),
                workers=workers)
        outputs.append((folder / "compact.json").read_bytes())
    assert outputs[0] == outputs[1]


def test_chunk_slots_hand_over_what_was_put_in_them(monkeypatch, tmp_path):
    from tracestream.parallel import slots as slots_module
    from tracestream.parallel.slots import ChunkSlots, deliver, received, write_result
    from tracestream.write.sink import OutputFile

    slots = ChunkSlots(2, 16)
    monkeypatch.setattr(slots_module, "_SLOTS", slots)  # as in a worker
    try:
        first, second = slots.acquire(), slots.acquire()
        assert slots.acquire() is None  # all taken: the next result comes as bytes
        assert deliver(b"0123456789", first) == 10
        assert deliver(b"x" * 17, second) == b"x" * 17  # does not fit
        assert deliver(b"abc", None) == b"abc"
        with OutputFile(str(tmp_path / "out")) as out:
            write_result(out, 10, first, slots)  # written from the slot itself
            write_result(out, b"x" * 17, second, slots)
            out.commit()
        assert (tmp_path / "out").read_bytes() == b"0123456789" + b"x" * 17
        assert sorted([slots.acquire(), slots.acquire()]) == [0, 1]  # both free again
        assert slots.put(1, b"input chunk") and received(1, 11) == b"input chunk"
        assert not slots.put(0, b"y" * 17)  # too big: the chunk goes through the pipe
    finally:
        slots.close()


def test_a_failed_write_still_frees_the_slots_it_was_lent(monkeypatch, tmp_path):
    import errno
    import os
    import time

    from tracestream.errors import TraceError
    from tracestream.parallel.slots import ChunkSlots, write_result
    from tracestream.write import sink

    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    slots = ChunkSlots(2, 16)
    try:
        first, second = slots.acquire(), slots.acquire()
        out = sink.OutputFile(str(tmp_path / "out"))
        monkeypatch.setattr(sink.os, "write", full_disk)
        with out:
            slots.put(first, b"chunk")
            write_result(out, 5, first, slots)  # the writer takes it, fails, frees it
            while not out.failed:
                time.sleep(0.01)
            slots.put(second, b"chunk")
            with pytest.raises(TraceError, match="no space left"):
                write_result(out, 5, second, slots)  # refused at once, freed all the same
        monkeypatch.setattr(sink.os, "write", os.write)
        assert slots.free == 2
        assert not (tmp_path / "out").exists()
    finally:
        slots.close()


@pytest.fixture(scope="module")
def negative_dur(tmp_path_factory) -> dict[str, Path]:
    """A 14 MB trace with one `dur` made negative 9 MB in (a late chunk), plain and gzip."""
    import gzip

    folder = tmp_path_factory.mktemp("broken")
    plain = folder / "source.json"
    generate(plain, TraceConfig(size_bytes=14 << 20))
    data = plain.read_bytes()
    at = data.index(b'"dur": ', 9 << 20) + len(b'"dur": ')
    broken = data[:at] + b"-" + data[at:]
    (folder / "broken.json").write_bytes(broken)
    (folder / "broken.json.gz").write_bytes(gzip.compress(broken, 1))
    return {"json": folder / "broken.json", "json.gz": folder / "broken.json.gz"}


@pytest.mark.parametrize("suffix", ["json", "json.gz"])
def test_malformed_input_is_refused_by_a_worker_as_without_one(negative_dur, suffix):
    """A worker's refusal reaches the parent whole (it used to break the pool: the error
    could not be unpickled), naming the same event and byte as an inline run."""
    from tracestream.errors import TraceError

    messages = []
    for workers in (0, 2):
        with pytest.raises(TraceError) as refused:
            inspect_trace(negative_dur[suffix], workers=workers)
        messages.append(str(refused.value))
    assert messages[0] == messages[1]
    assert re.fullmatch(r"event \d+ \(byte \d+\): dur -\S+ is negative", messages[0])


@pytest.mark.parametrize("suffix", ["json", "json.gz"])
def test_layers_with_workers_refuses_malformed_input_in_one_line(negative_dur, suffix, tmp_path):
    import subprocess
    import sys

    output = tmp_path / "out.json"
    done = subprocess.run(
        [sys.executable, "-m", "tracestream", "layers", "--trace", str(negative_dur[suffix]),
         "--output", str(output), "--anchor-regex", f"^{re.escape(ANCHOR)}$", "--num-layers",
         "8", "--anchor-offset", "0", "--phase", "x", "--evidence", "e", "--workers", "2"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(r"tracestream: error: event \d+ \(byte \d+\): dur -\S+ is negative\n",
                        done.stderr)
    assert list(tmp_path.iterdir()) == []
