"""The C extension's scan of a chunk (`scan_events`), against msgspec, which it stands in
for in the index pass: it must never accept what msgspec refuses, and where it accepts,
every field the index reads must be msgspec's value.

The observe and speedups tests compare whole chunks' facts with the scan (the C path)
and without (the numpy path decodes with msgspec); these test the scan itself.
"""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
from conftest import ROOT, read_bytes
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tracestream import observe, speedups
from tracestream.events import PROVENANCE_KEY

C = speedups.built
pytestmark = pytest.mark.skipif(C is None, reason="tracestream._speedups is not built")

_EVENT_LIST = msgspec.json.Decoder(list[observe.Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
TOP = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp")
INNER = ("device", "stream", "provenance")


def scan(document: bytes, bracketed: bool = True):
    return C.scan_events(document, msgspec.json.decode, observe._EVENT.decode, msgspec.UNSET,
                         bracketed)


def msgspec_events(document: bytes):
    """msgspec's events, or None where it refuses the document."""
    try:
        return _EVENT_LIST.decode(document)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None


def fields_of(events, count: int) -> list[tuple]:
    """Every field the index reads, of every event, as the C functions read them."""
    every = list(range(count))
    columns = [C.event_values(events, every, key) for key in TOP]
    inner = [[getattr(e.args, key) if e.args is not None else None for e in
              (events[i] for i in every)] for key in INNER]
    return [tuple(bytes(v) if key in ("ts", "dur") else (type(v), v)
                  for key, v in zip(TOP, row)) + tuple((type(v), v) for v in more)
            for row, more in zip(zip(*columns), zip(*inner))]


def assert_same_as_msgspec(document: bytes) -> bool:
    """The scan declines or agrees with msgspec on every field; whether it accepted. (Its
    caller has checked the bytes are UTF-8, as decode_chunk does first.)"""
    decoded = msgspec_events(document)
    try:
        document.decode("utf-8")
    except UnicodeDecodeError:  # refused before any decoder reads it
        if document[:1] == b"[" and document[-1:] == b"]":
            with pytest.raises(observe.ChunkError, match="invalid UTF-8"):
                observe.decode_chunk(document[1:-1], 0)
        return False
    scanned = scan(document)
    if decoded is None:
        assert scanned is None, f"the scan accepted what msgspec refuses: {document!r}"
        return False
    if scanned is None:
        return False
    assert len(scanned) == len(decoded)
    assert scanned.ascii == document.isascii()  # else its caller checks the UTF-8
    assert fields_of(scanned, len(decoded)) == fields_of(decoded, len(decoded))
    assert [scanned[i] for i in range(len(decoded))] == decoded  # one by one: msgspec's
    # the chunk as the index pass has it, without the brackets: the same events, and
    # each one's bytes where event_spans finds them
    data = document.strip()[1:-1]
    unbracketed = scan(data, bracketed=False)
    assert unbracketed is not None
    assert fields_of(unbracketed, len(decoded)) == fields_of(decoded, len(decoded))
    starts, ends = (np.frombuffer(b, np.int64) for b in unbracketed.spans())
    assert [bytes(data[s:e]) for s, e in zip(starts, ends)] == [
        bytes(raw) for raw in _RAW_LIST.decode(document)]
    if data.strip() == data and decoded:
        expected = observe.event_spans(data, len(decoded))
        assert starts.tolist() == expected[0].tolist()
        assert ends.tolist() == expected[1].tolist()
    return True


KINEKO_LIKE = (
    b'[{"ph": "X", "cat": "kernel", "name": "void gemm<float, 128>(float*)", "pid": 0, '
    b'"tid": 7, "ts": 1700000000123.456, "dur": 4.5, "args": {"device": 0, "stream": 7, '
    b'"grid": [1, 2, 3], "correlation": 12}},\n  {"ph": "f", "id": 12, "pid": 0, "tid": 7, '
    b'"ts": 1700000000123.456, "cat": "ac2g", "name": "ac2g", "bp": "e"},\n'
    b'  {"ph": "M", "name": "thread_name", "pid": "host", "tid": "stream 7", '
    b'"args": {"name": "stream 7 \\u00e9\\n"}},\n'
    b'  {"ph": "i", "s": "t", "name": "\\"quoted\\"", "pid": -3, "tid": null, "ts": 5e3, '
    b'"args": null, "cat": true, "id": -123456789012345678}]'
)


def test_a_kineto_chunk_is_scanned_with_msgspec_s_values():
    assert assert_same_as_msgspec(KINEKO_LIKE)
    scanned = scan(KINEKO_LIKE)
    assert type(scanned).__name__ == "Scan"
    assert C.event_values(scanned, [0, 3], "name") == ["void gemm<float, 128>(float*)",
                                                       '"quoted"']
    assert C.event_values(scanned, [0, 1, 2], "ts") == [b"1700000000123.456",
                                                         b"1700000000123.456", b""]


def test_the_index_pass_scans_the_shipped_sample():
    """The fast path is taken on a real chunk (a scan that always declined would pass every
    other test, slowly)."""
    data = read_bytes(ROOT / "samples" / "decode_8layers.trace.json.gz")
    document = bytes(msgspec.json.decode(data, type=dict[str, msgspec.Raw])["traceEvents"])
    assert len(msgspec_events(document)) > 1000
    chunk = document[1:-1].strip()
    assert type(observe.decode_chunk(chunk, 0)).__name__ == "Scan"
    assert assert_same_as_msgspec(document)


@pytest.mark.parametrize("document", [
    b'[{"id": 1.5, "cat": [1], "name": {"a": 1}, "args": {"stream": 1e-400}}]',  # decoded
    b'[{"id": 9223372036854775808, "name": 18446744073709551616}]',  # beyond int64
    b'[{"p\\u0069d": 1}]',  # an escaped key may spell a field msgspec reads
    b'[{"pid": 1, "pid": 2}]',  # a field twice: which one wins is msgspec's to say
    b'[{"args": {"device": 1, "device": 2}}]',
    b'[{"args": null, "args": {}}]',
    b'[{"name": "\\ud83d\\ude00"}]',  # a surrogate pair
    b'[{"pid": 12345678901234567890}]',  # no int64
    b'[{"args": {"x": ' + b'[' * 70 + b']' * 70 + b'}}]',  # nested deeper than the scan goes
])
def test_the_scan_declines_what_it_leaves_to_msgspec(document):
    assert msgspec_events(document) is not None
    assert scan(document) is None


@pytest.mark.parametrize("document", [
    b'[{"pid": 1.5}]', b'[{"pid": true}]', b'[{"tid": {}}]', b'[{"ph": 1}]', b'[{"ph": []}]',
    b'[{"args": []}]', b'[{"args": "x"}]', b'[1]', b'["x"]', b'[{"a": 1},]', b'[{"a": 01}]',
    b'[{"a": 1.}]', b'[{"a": .5}]', b'[{"a": 1e}]', b'[{"a": "\x01"}]', b'[{"a": "\\x"}]',
    b'[{"a": "\\u12g4"}]', b'[{"a": tru}]', b'[{"a": nul}]', b'[{"a" 1}]', b'[{"a": 1}',
    b'[{"a": 1}] x', b'[{"a": 1} {"b": 2}]', b'[{"a": [1, 2,]}]', b'[{"a": {"b"}}]',
    b'[{"a": -}]', b'[{"a": "x}]', b'{"a": 1}', b'', b'[', b'[{"a": NaN}]',
    # numbers msgspec decodes (fields of any type) and finds out of range
    b'[{"id": 1e400}]', b'[{"cat": -1e400}]', b'[{"name": ' + b"1" * 5000 + b'}]',
    b'[{"args": {"device": [1e400]}}]', b'[{"bp": {"x": ' + b"2" * 5000 + b'}}]',
])
def test_the_scan_refuses_what_msgspec_refuses(document):
    assert msgspec_events(document) is None
    assert scan(document) is None


def test_absent_fields_read_as_msgspec_s_defaults():
    scanned = scan(b'[{}, {"args": {}}, {"args": {"%b": 0}}]' % PROVENANCE_KEY.encode())
    assert C.event_values(scanned, [0, 1, 2], "ts") == [b"", b"", b""]
    assert C.first_set(scanned, "args", "provenance", msgspec.UNSET) == 2
    assert C.first_set(scan(b'[{"args": {}}, {"args": null}]'), "args", "provenance",
                       msgspec.UNSET) is None


# JSON values of every kind, for the fields msgspec reads and for the others
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, -0, 1, 256, 257]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8),
    st.sampled_from(["X", "f", "s", "M", "e", "kernel", "gpu_memcpy", ""]),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6)
_KEYS = st.sampled_from(TOP + ("args", "s", "x", "grid"))
_ARGS = st.one_of(st.none(), st.dictionaries(
    st.sampled_from(INNER[:2] + (PROVENANCE_KEY, "name", "x")), _VALUES, max_size=4))


def _event_text(members: list[tuple[str, object]], spaced: bool) -> bytes:
    """One event's JSON, spaced with non-ASCII as \\u escapes, or tight with UTF-8."""
    gap = b" " if spaced else b""

    def dumps(value) -> bytes:
        return json.dumps(value, ensure_ascii=spaced).encode()

    return b"{" + (b"," + gap).join(
        dumps(key) + b":" + gap + dumps(value) for key, value in members) + b"}"


_EVENTS = st.lists(st.tuples(
    st.lists(st.tuples(_KEYS, _VALUES), max_size=8),
    st.one_of(st.none(), _ARGS), st.booleans()), max_size=6)


@settings(max_examples=300, deadline=None)
@given(_EVENTS)
@example([([("ph", "X"), ("pid", 1), ("tid", "7"), ("ts", 1.5), ("dur", 2)],
           {"device": 0, "stream": 7}, True)])
def test_generated_events_are_scanned_as_msgspec_decodes_them(events):
    """Any mix of value kinds in the fields msgspec reads (some of which it refuses, such as
    a float pid), repeated fields, args of any shape: the scan declines or agrees."""
    texts = []
    for members, args, spaced in events:
        if args is not None:
            members = members + [("args", args)]
        texts.append(_event_text(members, spaced))
    assert_same_as_msgspec(b"[" + b",\n ".join(texts) + b"]")


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(KINEKO_LIKE) - 1), st.binary(min_size=0, max_size=3),
       st.integers(0, 3))
def test_damaged_chunks_are_declined_or_agreed_on(at, inserted, removed):
    """Bytes inserted into or cut out of a valid chunk: whatever msgspec refuses, the scan
    refuses too (never a different reading of broken JSON)."""
    assert_same_as_msgspec(KINEKO_LIKE[:at] + inserted + KINEKO_LIKE[at + removed:])
