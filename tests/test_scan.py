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

from tracestream import _native
from tracestream.commands.verify import columns as verify_columns
from tracestream.commands.verify import events as verify_events
from tracestream.index import decode, facts
from tracestream.model import PROVENANCE_KEY, CategoryKinds, CheckEvent, Event

C = _native.built
pytestmark = pytest.mark.skipif(C is None, reason="tracestream._native._speedups is not built")

_EVENT_LIST = msgspec.json.Decoder(list[Event])
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
TOP = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "bp")
INNER = ("device", "stream", "provenance")


def scan(document: bytes, bracketed: bool = True):
    return C.scan_events(document, msgspec.json.decode, decode._EVENT.decode, msgspec.UNSET,
                         bracketed)


def msgspec_events(document: bytes, decoder=_EVENT_LIST):
    """msgspec's events, or None where it refuses the document."""
    try:
        return decoder.decode(document)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None


def accepted_alike(document: bytes, decoded, scanned):
    """The scan of a document msgspec decoded (or refused, None): None where either one
    does not accept it (the scan never accepts what msgspec refuses), else the scan, of
    msgspec's events one by one."""
    if decoded is None:
        assert scanned is None, f"the scan accepted what msgspec refuses: {document!r}"
        return None
    if scanned is not None:
        assert len(scanned) == len(decoded)
        assert [scanned[i] for i in range(len(decoded))] == decoded  # one by one: msgspec's
    return scanned


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
            with pytest.raises(facts.ChunkError, match="invalid UTF-8"):
                decode.decode_chunk(document[1:-1], 0)
        return False
    scanned = accepted_alike(document, decoded, scan(document))
    if scanned is None:
        return False
    assert scanned.ascii == document.isascii()  # else its caller checks the UTF-8
    assert fields_of(scanned, len(decoded)) == fields_of(decoded, len(decoded))
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
        expected = decode.event_spans(data, len(decoded))
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
    assert type(decode.decode_chunk(chunk, 0)).__name__ == "Scan"
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
FIELD_ARGS = st.one_of(st.none(), st.dictionaries(
    st.sampled_from(INNER[:2] + (PROVENANCE_KEY, "name", "x")), _VALUES, max_size=4))


def _event_text(members: list[tuple[str, object]], spaced: bool) -> bytes:
    """One event's JSON, spaced with non-ASCII as \\u escapes, or tight with UTF-8."""
    gap = b" " if spaced else b""

    def dumps(value) -> bytes:
        return json.dumps(value, ensure_ascii=spaced).encode()

    return b"{" + (b"," + gap).join(
        dumps(key) + b":" + gap + dumps(value) for key, value in members) + b"}"


def _chunk_text(events: list) -> bytes:
    """A bracketed chunk of generated events: (members, args or None, spaced) each."""
    texts = []
    for members, args, spaced in events:
        if args is not None:
            members = members + [("args", args)]
        texts.append(_event_text(members, spaced))
    return b"[" + b",\n ".join(texts) + b"]"


_EVENTS = st.lists(st.tuples(
    st.lists(st.tuples(_KEYS, _VALUES), max_size=8),
    st.one_of(st.none(), FIELD_ARGS), st.booleans()), max_size=6)


@settings(max_examples=300, deadline=None)
@given(_EVENTS)
@example([([("ph", "X"), ("pid", 1), ("tid", "7"), ("ts", 1.5), ("dur", 2)],
           {"device": 0, "stream": 7}, True)])
def test_generated_events_are_scanned_as_msgspec_decodes_them(events):
    """Any mix of value kinds in the fields msgspec reads (some of which it refuses, such as
    a float pid), repeated fields, args of any shape: the scan declines or agrees."""
    assert_same_as_msgspec(_chunk_text(events))


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(KINEKO_LIKE) - 1), st.binary(min_size=0, max_size=3),
       st.integers(0, 3))
def test_damaged_chunks_are_declined_or_agreed_on(at, inserted, removed):
    """Bytes inserted into or cut out of a valid chunk: whatever msgspec refuses, the scan
    refuses too (never a different reading of broken JSON)."""
    assert_same_as_msgspec(KINEKO_LIKE[:at] + inserted + KINEKO_LIKE[at + removed:])


# -- the scan in verify's mode: the provenance read as model.Origin (`origins`) -----------

_CHECK_LIST = msgspec.json.Decoder(list[CheckEvent])
CHECK_TOP = ("ph", "cat", "pid", "tid", "ts", "dur", "bp", "name")


def check_scan(document: bytes):
    return C.scan_events(document, msgspec.json.decode, verify_events._CHECK_EVENT.decode, None,
                         True, True)


def check_columns(events) -> tuple:
    """verify's check columns of the events, and the values they number, in order."""
    codes, devices = verify_columns.TrackCodes(), verify_columns.Interned()
    columns = C.check_columns(events, CategoryKinds(), verify_columns._ACTIVITY_MASK,
                              codes.pids.table, codes.tids.table, devices.table)
    return (tuple(bytes(column) for column in columns),
            [[(type(v), v) for v in table[1]]
             for table in (codes.pids.table, codes.tids.table, devices.table)])


def check_fields_of(events, count: int) -> list[tuple]:
    every = list(range(count))
    columns = [C.event_values(events, every, key) for key in CHECK_TOP]
    return [tuple(bytes(v) if key in ("ts", "dur") else
                  (type(v), v) if key != "name" else verify_events.decoded_name(v)
                  for key, v in zip(CHECK_TOP, row)) for row in zip(*columns)]


def assert_checked_as_msgspec(document: bytes) -> bool:
    """verify's scan declines or agrees with its msgspec decode (`CheckEvent`) on every
    field verify reads and on its check columns; whether it accepted."""
    decoded = msgspec_events(document, _CHECK_LIST)
    try:
        document.decode("utf-8")
    except UnicodeDecodeError:  # (verify checks the UTF-8 first)
        return False
    scanned = accepted_alike(document, decoded, check_scan(document))
    if scanned is None:
        return False
    assert check_fields_of(scanned, len(decoded)) == check_fields_of(decoded, len(decoded))
    try:
        expected = check_columns(decoded)
    except TypeError:  # an unhashable category or device
        with pytest.raises(TypeError):
            check_columns(scanned)
        return True
    assert check_columns(scanned) == expected
    return True


MOVED = (
    b'[{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 1000001, "ts": 10.5, '
    b'"dur": 2, "args": {"%b": {"pid": 3, "tid": 7, "source_event_index": 3, '
    b'"had_args": true}, "device": 0, "stream": 7}},\n'
    b'  {"ph": "f", "id": 12, "pid": 0, "tid": 1000001, "ts": 10.5, "cat": "ac2g", '
    b'"name": "ac2g", "bp": "e", "args": {"%b": {"pid": "gpu 2", "tid": "s 7", '
    b'"source_event_index": 4, "had_args": false}}},\n'
    b'  {"ph": "X", "cat": "layer_guide", "name": "L0", "pid": "Spans", "tid": 1000000, '
    b'"ts": 9, "dur": 4, "args": {"%b": null}},\n'
    b'  {"ph": "X", "cat": "cpu_op", "name": "\\u00e9", "pid": 1, "tid": 1, "ts": 9}]'
) % ((PROVENANCE_KEY.encode(),) * 3)


def test_verify_s_scan_reads_provenance_as_msgspec_does():
    assert assert_checked_as_msgspec(MOVED)
    assert scan(MOVED) is None  # the index pass's mode: a provenance object is any value
    pids, tids, _ = ([v for _, v in table] for table in check_columns(check_scan(MOVED))[1])
    assert pids == [0, "Spans", 1, 3, "gpu 2"]  # the events', then their provenances'
    assert tids == [1000001, 1000000, 1, 7, "s 7"]


@pytest.mark.parametrize("provenance, refused", [
    (b'"x"', True), (b"[1]", True), (b"7", True),  # not model.Origin: a ValidationError
    (b'{"pid": 1e400}', True),  # out of range where msgspec decodes any value
    (b'{"pid": 1.5, "tid": 2}', False), (b'{"pid": [1], "tid": 2}', False),  # any value
    (b'{"pid": 1, "pid": 2}', False), (b'{"p\\u0069d": 1}', False),  # which one is msgspec's
    (b'{"pid": 12345678901234567890}', False),
])
def test_verify_s_scan_declines_a_provenance_it_cannot_read_as_msgspec(provenance, refused):
    document = b'[{"ph": "X", "args": {"%b": %b}}]' % (PROVENANCE_KEY.encode(), provenance)
    assert check_scan(document) is None
    try:
        _CHECK_LIST.decode(document)
    except msgspec.DecodeError:
        assert refused
    else:
        assert not refused


_ORIGINS = st.one_of(_VALUES, st.dictionaries(
    st.sampled_from(["pid", "tid", "source_event_index", "x"]), _VALUES, max_size=4))
_CHECK_ARGS = st.one_of(st.none(), st.dictionaries(
    st.sampled_from(["device", "stream", PROVENANCE_KEY, "x"]), _ORIGINS, max_size=4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.tuples(_KEYS, _VALUES), max_size=8),
                          st.one_of(st.none(), _CHECK_ARGS), st.booleans()), max_size=6))
@example([([("ph", "X"), ("cat", "kernel"), ("pid", 1), ("tid", 2)],
           {PROVENANCE_KEY: {"pid": 5, "tid": "s"}, "device": 0}, True),
          ([("ph", "f"), ("pid", 1), ("tid", 2), ("bp", "e")],
           {PROVENANCE_KEY: {"tid": 7, "x": [1.5]}}, False),
          ([("ph", "X"), ("cat", "gpu_memcpy"), ("pid", 1), ("tid", 2)],
           {PROVENANCE_KEY: None, "device": "d"}, True)])
def test_generated_outputs_are_checked_as_msgspec_decodes_them(events):
    assert_checked_as_msgspec(_chunk_text(events))


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(MOVED) - 1), st.binary(min_size=0, max_size=3), st.integers(0, 3))
def test_damaged_outputs_are_declined_or_checked_alike(at, inserted, removed):
    assert_checked_as_msgspec(MOVED[:at] + inserted + MOVED[at + removed:])


def test_verify_scans_an_output_chunk_and_only_in_its_mode():
    """The fast path is taken on an output chunk (a scan that always declined would pass
    every other test of verify, slowly; real outputs: tests/test_verify_columns.py), and
    verify's check columns refuse a scan made in the index pass's mode, which never read a
    provenance's pid and tid."""
    assert type(verify_events.scanned_chunk(MOVED[1:-1])).__name__ == "Scan"
    document = b'[{"ph": "X", "pid": 1, "tid": 2, "args": {"device": 0}}]'
    with pytest.raises(ValueError, match="origins"):
        check_columns(scan(document))
    assert check_columns(check_scan(document)) == check_columns(_CHECK_LIST.decode(document))
