"""The document scanner: exact event bytes, top-level keys, and malformed input."""

import json

import pytest

from tracestream.errors import TraceError
from tracestream.read.document import DocumentScanner
from tracestream.write.relocate import member_spans, relocate, unrelocate


def scan(data: bytes, chunk_bytes: int = 64, block: int = 7):
    blocks = [data[i : i + block] for i in range(0, len(data), block)]
    scanner = DocumentScanner(blocks, chunk_bytes=chunk_bytes)
    events = [bytes(raw) for chunk in scanner.chunks() for raw in chunk.events]
    return scanner.layout, events


TRICKY = [
    {"ph": "X", "name": "a},{b", "pid": 0, "tid": 1, "ts": 1, "dur": 1},
    {"ph": "X", "name": "c}, {\"d\": [{}]}", "pid": 0, "tid": 1, "ts": 2, "dur": 1},
    {"ph": "X", "args": {"list": [{"x": 1}, {"y": 2}], "s": "}]"}, "pid": 0, "tid": 2},
    {"ph": "i", "name": "\u00e9\u4e2d\U0001f600", "pid": "Spans", "tid": "x", "ts": 3},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "]}"}},
]


@pytest.mark.parametrize("chunk_bytes", [1, 16, 64, 4096])
@pytest.mark.parametrize("indent", [None, 2])
def test_events_come_back_byte_for_byte(chunk_bytes, indent):
    doc = {"schemaVersion": 1, "traceEvents": TRICKY, "traceName": "x", "z": [1, {"a": "}"}]}
    data = json.dumps(doc, indent=indent, ensure_ascii=False).encode()
    layout, events = scan(data, chunk_bytes)
    assert [json.loads(e) for e in events] == TRICKY
    assert all(e in data for e in events)
    assert [v.key for v in layout.values] == ["schemaVersion", "traceName", "z"]
    assert layout.events_key_index == 1
    assert data[layout.events_open : layout.events_open + 1] == b"["
    assert data[layout.events_close : layout.events_close + 1] == b"]"
    assert data[layout.close : layout.close + 1] == b"}"
    assert layout.event_count == len(TRICKY)


def test_bare_array_and_empty_arrays():
    layout, events = scan(b' [ {"a": 1} ,{"b": 2}] \n')
    assert layout.shape == "array" and events == [b'{"a": 1}', b'{"b": 2}']
    layout, events = scan(b'{"traceEvents": [ ]}')
    assert events == [] and layout.event_count == 0
    layout, events = scan(b"[]")
    assert events == [] and layout.shape == "array"


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "input is empty"),
        (b"   \n", "input is empty"),
        (b"42", "top level is a number"),
        (b'"trace"', "top level is a string"),
        (b"null", "top level is null"),
        (b'{"schemaVersion": 1}', "no \"traceEvents\" array"),
        (b'{"traceEvents": {"a": 1}}', "\"traceEvents\" is an object"),
        (b'{"traceEvents": [{"a": 1}]} xyz', "trailing data"),
        (b'{"traceEvents": [{"a": 1},', "truncated"),
        (b'{"traceEvents": [{"a": 1}', "truncated"),
        (b'{"traceEvents": [{"a": NaN}]}', "malformed JSON"),
        (b'{"traceEvents": [{"a": "\xff"}]}', "invalid UTF-8"),
        (b'{"traceEvents": [{"a": "\\ud800"}]}', "surrogate"),
        (b'{"traceEvents": [{"a": 1}], "traceEvents": []}', "appears twice"),
        (b'{"traceEvents": [{"a": 1},]}', "malformed JSON"),
    ],
)
def test_malformed_documents_are_refused_with_a_place(data, message):
    with pytest.raises(TraceError) as err:
        scan(data)
    assert message.lower() in str(err.value).lower()


def test_deep_nesting_is_refused_without_recursion_error():
    deep = b'{"traceEvents": [{"args": ' + b"[" * 200_000 + b"]" * 200_000 + b"}]}"
    with pytest.raises(TraceError, match="nested too deeply|depth"):
        scan(deep, chunk_bytes=1 << 20, block=1 << 20)


def test_member_spans_find_top_level_keys_only():
    raw = b'{"args": {"tid": 5, "x": [1, {"pid": 2}]}, "tid": 7, "pid": "P", "name": "tid"}'
    spans = member_spans(raw)
    assert raw[slice(*spans["tid"])] == b"7"
    assert raw[slice(*spans["pid"])] == b'"P"'
    assert raw[slice(*spans["args"])].startswith(b'{"tid": 5')


@pytest.mark.parametrize(
    "raw",
    [
        b'{"ph": "X", "pid": 0, "tid": 7, "ts": 1764400000005000.125, "dur": 1.5,\n'
        b' "args": {\n "device": 0\n }\n}',
        b'{"ph":"X","pid":0,"tid":7,"ts":1,"dur":2}',
        b'{"ph":"X","pid":0,"tid":7,"ts":1,"dur":2,"args":{}}',
        b'{"ph":"X","name":"a\\"tid\\"","pid":"Spans","tid":"7","args":{"x":{"tid":1}}}',
        b'{"args":{"a":[1,{"b":"}"}]},"tid":-1,"pid":0,"name":"tid"}',
    ],
)
def test_relocation_is_exactly_reversible(raw):
    moved = relocate(raw, b"1000001", 42, new_pid=b"1000000")
    parsed = json.loads(moved)
    assert parsed["tid"] == 1000001 and parsed["pid"] == 1000000
    original = json.loads(raw)
    provenance = parsed["args"]["_compact_gpu_track"]
    assert provenance == {"pid": original["pid"], "tid": original["tid"],
                          "source_event_index": 42, "had_args": "args" in original}
    assert unrelocate(moved) == (raw, 42)


@pytest.mark.parametrize("workers,compressed", [(0, False), (2, False), (2, True)])
@pytest.mark.parametrize("chunk_bytes", [1, 40, 200])
def test_speculative_cuts_rewind_to_the_same_events(tmp_path, chunk_bytes, workers, compressed):
    """Cuts inside strings and nested values are found by the workers and re-cut exactly,
    also with several chunks in flight (a plain file's scanner reads only the bytes near
    each cut, and re-reads them on a rewind)."""
    import gzip

    from tracestream.index.builder import IndexOptions, run_index
    from tracestream.parallel.slots import WRITER_HOLDS
    from tracestream.read.sizing import pool_for
    from tracestream.read.source import TraceSource

    events = TRICKY * 20 + [{"ph": "X", "cat": "kernel", "name": "k},{", "pid": 0, "tid": 7,
                             "ts": 5, "dur": 1, "args": {"device": 0}}]
    text = json.dumps({"traceEvents": events, "z": [{"a": 1}, {"b": "}]"}]}, indent=1).encode()
    path = tmp_path / "t.json"
    path.write_bytes(gzip.compress(text) if compressed else text)
    with TraceSource(path) as source, pool_for(str(path), workers) as pool:
        slots = pool.slots.free if pool.slots is not None else 0
        index = run_index(source, IndexOptions(chunk_bytes=chunk_bytes), pool=pool)
        if pool.slots is not None:  # every chunk's slot is free again, rewound ones too
            assert slots == workers * 2 + 1 + WRITER_HOLDS
            assert pool.slots.free == slots
    try:
        assert index.event_count == len(events)
        assert sum(c.count for c in index.chunks) == len(events)
        assert [v.key for v in index.layout.values] == ["z"]
        assert len(index.spans) == 20 + 1  # thread_name metadata and the one kernel
    finally:
        index.close()


@pytest.mark.parametrize("big", [10_000, 100_000])
def test_a_speculative_cut_goes_before_an_event_spanning_the_target(big):
    """The cut is looked for in the 64 KB before the chunk's target; when one event covers
    all of them, the chunk still ends at the last boundary before it (not decoded here)."""
    small = [{"ph": "i", "name": f"e{i}", "pid": 0, "tid": 1, "ts": i} for i in range(1500)]
    events = small + [{"ph": "i", "name": "x" * big, "pid": 0, "tid": 1, "ts": 0}] + small * 8
    data = json.dumps({"traceEvents": events}).encode()
    target = data.index(b"x" * big) + big - 1000  # the chunk target lies near its end
    first = data.index(b"{", 1)
    blocks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    scanner = DocumentScanner(blocks, chunk_bytes=target - first, speculative=True)
    chunks = scanner.chunks()
    chunk = next(chunks)
    assert chunk.events is None  # speculative: a worker decodes it
    assert chunk.offset == first
    assert data[chunk.offset + chunk.length - 1 :].startswith(b'}, {"ph": "i", "name": "xxx')
    assert chunk.data is None and len(chunk.pieces) > 1  # the blocks' slices, not joined
    next(chunks)  # the scanner moves on: the pieces still hold the chunk's bytes
    assert chunk.content() == data[chunk.offset : chunk.offset + chunk.length]


@pytest.mark.parametrize("suffix", ["gz", "zst"])
def test_compressed_input_is_read_whole_in_small_pieces(tmp_path, suffix):
    """A multi-member/multi-frame file of very compressible JSON comes back byte for byte,
    and gzip never hands over more than OUT_BLOCK at once (memory stays flat)."""
    import gzip

    import zstandard

    from tracestream.read import compression
    from tracestream.read.source import TraceSource

    text = b'{"traceEvents": [' + b", ".join(
        b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": %d, "dur": 1}' % i
        for i in range(200_000)) + b"]}"
    half = len(text) // 2
    path = tmp_path / f"t.json.{suffix}"
    if suffix == "gz":
        path.write_bytes(gzip.compress(text[:half], 6) + gzip.compress(text[half:], 6))
    else:
        cctx = zstandard.ZstdCompressor(level=3)
        path.write_bytes(cctx.compress(text[:half]) + cctx.compress(text[half:]))
    with TraceSource(path) as src:
        pieces = list(src.read())
    assert b"".join(pieces) == text
    if suffix == "gz":
        assert max(map(len, pieces)) <= compression.OUT_BLOCK
