"""The C extension against the numpy code it mirrors: the same positions and the same
output bytes, on shapes built to trip one or the other and on whole traces.

The unit tests of keyscan, observe and rewrite run with both as well (their
`backend` fixture); these compare the two directly.
"""

from __future__ import annotations

import os
import re
import subprocess

import msgspec
import numpy as np
import orjson
import pytest
from conftest import (
    REAL_TRACES,
    REAL_WITH_GPU,
    ROOT,
    TRACESTREAM,
    layers_args,
    read_bytes,
    real_trace,
)
from hypothesis import example, given
from hypothesis import strategies as st

from tracestream import _native
from tracestream.index import extract, keyscan
from tracestream.index import facts as chunk_facts
from tracestream.model import CheckEvent, Event
from tracestream.write import relocate

C = _native.built
C_KIND = _native  # json_rows' column kinds (the same numbers in C)


def test_the_extension_is_built():
    """`make install` builds it; without it every pass runs the slower numpy code (and the
    comparisons below, and the C halves of the keyscan, observe and rewrite tests, are
    skipped: this test is the one that fails)."""
    assert C is not None, ("tracestream._native._speedups is missing (is a C compiler "
                          "installed?) or older than its sources (reinstall)")


needs_c = pytest.mark.skipif(C is None, reason="tracestream._native._speedups is not built")


@needs_c
def test_the_twins_are_every_c_function_with_the_same_column_kinds():
    """`_native` binds each function of the extension to its twin where it is not built:
    every one has one, and json_rows' column kinds are the same numbers."""
    c_functions = {name for name in dir(C) if not name.startswith("_") and name.islower()}
    assert c_functions == set(_native.FUNCTIONS)
    assert [getattr(C, kind) for kind in _native.COLUMN_KINDS] == [
        getattr(_native.reference, kind) for kind in _native.COLUMN_KINDS]


def _numpy(function, *args):
    """`function(*args)` with the numpy twins (`_native.reference`) chosen."""
    saved = _native.chosen
    _native.use(_native.reference)
    try:
        return function(*args)
    finally:
        _native.use(saved)


def _over(alphabet: bytes, max_size: int, min_size: int = 0):
    """Byte strings made of `alphabet`, so that its patterns come up often."""
    return st.binary(min_size=min_size, max_size=max_size).map(
        lambda b: bytes(alphabet[c % len(alphabet)] for c in b))


json_bytes = _over(b'{} ,\t\r\n"x', 80)


@needs_c
@given(json_bytes)
def test_separators_are_those_numpy_finds(data):
    closes, opens = C.separators(data)
    expected = _numpy(keyscan.separators, data)
    assert np.frombuffer(closes, np.int64).tolist() == expected[0].tolist()
    assert np.frombuffer(opens, np.int64).tolist() == expected[1].tolist()


keyish = _over(b'"tdpanc: {x', 120)
literals = st.lists(st.sampled_from([b'"t', b'"ts"', b'"tid": ', b'"d"', b'"pid"', b'"args": {',
                                     b'"a"', b'"n"', b'"c', b'"x"', b'""', b'"{x', b'" ',
                                     b'":']),
                    min_size=1, max_size=12, unique=True)


@given(keyish, literals)
def test_event_keys_count_every_occurrence(data, wanted):
    """Every start, overlapping ones too, in numpy and in C: with an event per byte, the
    events that count a literal are where it starts."""
    starts = np.arange(len(data), dtype=np.int64)
    for functions in (_native.reference, C) if C is not None else (_native.reference,):
        _, count = functions.event_keys(data, starts, starts + 1, tuple(wanted))
        count = np.frombuffer(count, np.int32).reshape(len(wanted), -1)
        for k, literal in enumerate(wanted):
            expected = [m.start() for m in re.finditer(b"(?=" + re.escape(literal) + b")", data)]
            assert np.flatnonzero(count[k]).tolist() == expected, (functions, literal)


@needs_c
@given(keyish, literals, st.lists(st.integers(0, 120), max_size=8))
def test_event_keys_are_those_numpy_counts(data, wanted, cuts):
    """Per event: the first occurrence and the count of each literal that starts in it
    (the events are the spans between sorted cuts)."""
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    starts, ends = np.array(bounds[:-1], np.int64), np.array(bounds[1:], np.int64)
    first, count = C.event_keys(data, starts, ends, tuple(wanted))
    first = np.frombuffer(first, np.int64).reshape(len(wanted), -1)
    count = np.frombuffer(count, np.int32).reshape(len(wanted), -1)
    expected = _numpy(keyscan.EventKeys, data, starts, ends, tuple(wanted))
    for k, literal in enumerate(wanted):
        want_first, want_count = _numpy(expected, literal)
        assert first[k].tolist() == want_first.tolist(), literal
        assert count[k].tolist() == want_count.tolist(), literal


@needs_c
def test_event_keys_refuse_literals_they_cannot_find():
    none = np.zeros(0, np.int64)
    with pytest.raises(ValueError, match="start with"):
        C.event_keys(b'"ts"', none, none, (b"ts",))
    with pytest.raises(ValueError, match="at most"):
        C.event_keys(b"", none, none, tuple(b'"%d' % k for k in range(33)))


@needs_c
@given(_over(b"0123456789-, x", 60, min_size=1), st.lists(st.integers(0, 70), max_size=12))
def test_integer_ends_are_those_numpy_finds(data, begin):
    begin = np.array(begin, np.int64)
    ends = np.frombuffer(C.integer_ends(data, begin), np.int64)
    assert ends.tolist() == _numpy(keyscan.integer_ends, data, begin).tolist()


# ts/dur texts of every shape: Kineto's, their near misses, and what is read one by one
number_texts = st.one_of(
    _over(b"0123456789", 18, min_size=1).map(lambda t: t.lstrip(b"0") or b"0"),
    st.builds(lambda w, f, neg: b"-" * neg + (w.lstrip(b"0") or b"0") + b"." + f,
              _over(b"0123456789", 17, min_size=1), _over(b"0123456789", 5, min_size=1),
              st.booleans()),
    st.sampled_from([b"", b"", b"null", b'"1.000"', b"1e3", b"-0", b"-0.000", b"[1,2]",
                     b"8999999999999999.999", b"9000000000000000", b"1.5"]),
)


@needs_c
@given(st.lists(number_texts, max_size=10), st.booleans())
def test_decimal_column_reads_each_value_as_numpy_does(texts, signed):
    """Each value by its own shape, in C and in numpy: the same ns and the same shape
    (absent, integer, three decimals, other), however the shapes mix in a chunk."""
    events = [Event(ts=msgspec.Raw(t)) for t in texts]
    ns, shapes = C.decimal_column(events, "ts", signed)
    ns_np, shapes_np = _native.reference.decimal_column(events, "ts", signed)
    assert np.frombuffer(shapes, np.int8).tolist() == shapes_np.tolist()
    assert np.frombuffer(ns, np.int64).tolist() == ns_np.tolist()


@needs_c
@given(_over(b'"tdpanc: {x', 120, min_size=1), st.lists(st.integers(0, 130), max_size=12),
       literals)
def test_continues_is_what_numpy_finds(data, at, wanted):
    at = np.array(at, np.int64)
    for literal in wanted:
        ok = np.frombuffer(C.continues(data, at, literal), bool)
        assert ok.tolist() == _numpy(keyscan.continues, data, at, literal).tolist()


@needs_c
def test_splice_refuses_ranges_out_of_order():
    """The ranges come from the index pass; bytes past the chunk are never copied."""
    data = b'{"pid": 0, "tid": 7, "args": {"a": 1}}'
    columns = [np.array([v], np.int64) for v in (0, 8, 9, 18, 19, 30, 1)]
    parts = (b"<", b"|", b"|", b">")
    spliced = C.splice(data, tuple(columns), np.array([True]), [b"99"], [None], parts, parts)
    assert spliced == b'{"pid": 0, "tid": 99, "args": {<0|7|1>, "a": 1}}'
    columns[5] = np.array([len(data) + 5], np.int64)
    with pytest.raises(ValueError, match="out of order"):
        C.splice(data, tuple(columns), np.array([True]), [b"99"], [None], parts, parts)


@needs_c
@pytest.mark.parametrize("ordinal", [0, 7, 9, 10, 99, 100, 1_234_567, 2**63 - 1, -1, -2**63])
def test_splice_writes_the_ordinal_in_decimal(ordinal):
    """The provenance member's ordinal is its decimal text (what `%d` writes), at every
    width; the size summed first and the bytes written agree."""
    data = b'{"pid": 0, "tid": 7, "args": {"a": 1}}'
    columns = tuple(np.array([v], np.int64) for v in (0, 8, 9, 18, 19, 30, ordinal))
    parts = (b"<", b"|", b"|", b">")
    spliced = C.splice(data, columns, np.array([True]), [b"99"], [None], parts, parts)
    assert spliced == b'{"pid": 0, "tid": 99, "args": {<0|7|%d>, "a": 1}}' % ordinal


@needs_c
def test_splice_writes_into_a_slot_that_holds_the_chunk():
    """A worker's shared slot: the spliced chunk goes there (its length returned) when it
    fits, else it comes back as bytes; the slot's bytes past it stay as they were."""
    data = b'{"pid": 0, "tid": 7, "args": {"a": 1}}'
    columns = tuple(np.array([v], np.int64) for v in (0, 8, 9, 18, 19, 30, 1))
    parts = (b"<", b"|", b"|", b">")
    spliced = b'{"pid": 0, "tid": 99, "args": {<0|7|1>, "a": 1}}'
    slot = bytearray(b"#" * (len(spliced) + 3))
    written = C.splice(data, columns, np.array([True]), [b"99"], [None], parts, parts, None, slot)
    assert written == len(spliced)
    assert slot == spliced + b"###"
    small = bytearray(len(spliced) - 1)
    assert C.splice(data, columns, np.array([True]), [b"99"], [None], parts, parts, None,
                    small) == spliced
    assert small == bytearray(len(spliced) - 1)


def _misaligned(values: list[int]) -> np.ndarray:
    """`values` as an int64 column at an odd address that numpy still calls contiguous (as
    it calls a one-row field of a packed record array, such as the index's span rows)."""
    column = np.frombuffer(b"\0" + np.array(values, np.int64).tobytes(), np.int64, offset=1)
    assert column.ctypes.data % 8 and column.flags.c_contiguous
    return column


@needs_c
def test_columns_at_odd_addresses_are_read_as_aligned_ones():
    """A one-row slice of a packed record array hands the C functions an int64 column
    at an odd address (the window rewrite splices such rows): each reads it as it reads an
    aligned copy (without an unaligned load, which `make test-native` reports)."""
    data = b'{"pid": 0, "tid": 7, "args": {"a": 1}}'
    values = (0, 8, 9, 18, 19, 30, 1)
    parts = (b"<", b"|", b"|", b">")
    aligned = tuple(np.array([v], np.int64) for v in values)
    odd = tuple(_misaligned([v]) for v in values)
    assert (C.splice(data, odd, np.array([True]), [b"99"], [None], parts, parts)
            == C.splice(data, aligned, np.array([True]), [b"99"], [None], parts, parts))
    starts, ends = [0, 20], [20, len(data)]
    assert (C.event_keys(data, _misaligned(starts), _misaligned(ends), (b'"tid"', b'"a"'))
            == C.event_keys(data, np.array(starts, np.int64), np.array(ends, np.int64),
                            (b'"tid"', b'"a"')))
    begin = [8, 17, 36]
    assert (C.integer_ends(data, _misaligned(begin))
            == C.integer_ends(data, np.array(begin, np.int64)))
    assert (C.continues(data, _misaligned(begin), b"0")
            == C.continues(data, np.array(begin, np.int64), b"0"))
    row = ((C_KIND.INTEGERS, _misaligned([12])), (C_KIND.INTEGERS, _misaligned([-3])))
    assert (C.json_rows(1, (b"[", b", ", b"]"), row, b"")
            == C.json_rows(1, (b"[", b", ", b"]"),
                           tuple((kind, np.array(v, np.int64)) for kind, v in row), b""))


# Events as the rewrite splices them: Kineto's `"pid": P, "tid": T, ... "args": {...}` with
# args of members, empty args, no args; and a key between the pid and tid values that is
# nine bytes as `, "tid": ` is, but not it (the splice's shortcut must not take it)
_SPLICED = (
    (b'{"ph": "X", "pid": 0, "tid": 7, "ts": 1, "args": {"a": 1}}', True),
    (b'{"ph": "X", "pid": 12, "tid": 345, "args": { }}', True),
    (b'{"ph": "X", "pid": "GPU 1", "tid": "s 3", "ts": 2}', False),
    (b'{"ph": "X", "pid": 0, "xyz": 7, "args": {"a": 1}}', True),
)


def _splice_columns(chunk_events: list[int]) -> tuple:
    """A chunk of `_SPLICED` events joined by `, `, and splice's arguments for each."""
    data, columns, with_args = b"", [[] for _ in range(7)], []
    for ordinal, k in enumerate(chunk_events):
        event, has_args = _SPLICED[k]
        start = len(data) + (2 if data else 0)
        data += (b", " if data else b"") + event
        pid = event.index(b'"pid": ') + 7
        pid_end = event.index(b",", pid)
        tid = pid_end + 9
        tid_end = next(i for i in range(tid, len(event)) if event[i:i + 1] in b",}")
        resume = event.index(b"{", event.index(b'"args"')) + 1 if has_args else len(event) - 1
        for column, value in zip(columns[1:], (pid, pid_end, tid, tid_end, resume, ordinal)):
            column.append(start + value if column is not columns[6] else value)
        with_args.append(has_args)
    columns[0] = [0] + columns[5][:-1]
    return data, tuple(np.array(c, np.int64) for c in columns), np.array(with_args, bool)


@needs_c
@given(st.lists(st.integers(0, len(_SPLICED) - 1), min_size=1, max_size=6),
       st.lists(st.one_of(st.none(), st.sampled_from([b"1000001", b'"lane"'])), min_size=6,
                max_size=6),
       st.one_of(st.none(), st.lists(st.sampled_from(
           [None, b', "group": "communication"', b', "group": "x%"']), min_size=6, max_size=6)))
def test_the_splice_twin_writes_the_c_splice_bytes(chunk_events, new_pids, groups):
    """The numpy twin (what verify rebuilds the planned output with) writes the C splice's
    bytes: members with and without args, empty args, moved pids, a key where the tid
    usually is, and lane groups' members (a `%` in one is not a template's)."""
    from tracestream.write.rewrite import _MEMBER_PARTS, _NO_ARGS_MEMBER_PARTS

    data, columns, with_args = _splice_columns(chunk_events)
    n = len(chunk_events)
    args = (data, columns, with_args, [b"%d" % (900 + k) for k in range(n)], new_pids[:n],
            _MEMBER_PARTS, _NO_ARGS_MEMBER_PARTS, None if groups is None else groups[:n])
    assert _native.reference.splice(*args) == C.splice(*args)
    # restore's quick undo and its twin agree on it, group members and all (where the undo
    # declines, e.g. the key where the tid usually is, both decline)
    spliced = C.splice(*args)
    assert C.undo_relocations(spliced) == _native.reference.undo_relocations(spliced)
    if 3 not in chunk_events:
        assert C.undo_relocations(spliced)[0] == data


_ODD_ROWS = [
    (2, (b"<", b">"), ((C_KIND.CODED, np.array([-1, 0], np.int64), [b"a", b"b"]),), b","),
    (1, (b"<", b">"), ((C_KIND.FIXED, np.array([5], np.int64), 0),), b","),
    (1, (b"<", b">"), ((C_KIND.FIXED, np.array([5], np.int64), 10),), b","),
    (2, (b"%",), (), b","),
    (1, (b"<", b">"), ((C_KIND.TEXTS, (b"x",)),), b","),
    (1, (b"<", b">"), ((C_KIND.TEXTS, [bytearray(b"x")]),), b","),
    (1, (b"<", b">"), ((C_KIND.SHORTEST, np.array([5], np.int32), 3),), b","),
    (0, (b"<", b">"), ((C_KIND.SHORTEST, np.array([], np.int64), 3),), b","),
    (2, (b"<", b">"), ((C_KIND.INTEGERS, np.array([1, 2], np.int32)),), b""),
    (1, (b"<", b">"), ((C_KIND.INTEGERS, np.array([1], np.int64), 3),), b""),
    (1, (b"<", "x"), ((C_KIND.INTEGERS, np.array([1], np.int64)),), b""),
    (3, (b"a",), (), b"|"),
]
_I = lambda *values: np.array(values, np.int64)  # noqa: E731
_ODD_KEYS = [
    ("integer_ends", (b"12,x", _I(-4, -1, 0, 2, 3, 4, 9))),
    ("integer_ends", (b"", _I(0, 1, -1))),
    ("continues", (b'"p"p', _I(-2, -1, 0, 2, 3, 9), b'"p')),
    ("continues", (b"", _I(0, -1), b'"p')),
    ("event_keys", (b'"a"', _I(0), _I(3), ())),
    ("event_keys", (b'"a"', _I(0), _I(4), (b'"a',))),
    ("event_keys", (b'"a"', _I(-1), _I(2), (b'"a',))),
    ("event_keys", (b'"a"', _I(2), _I(1), (b'"a',))),
    ("event_keys", (b'"a"', _I(0), _I(3), (b"a",))),
    ("event_keys", (b'"a"', _I(0), _I(3), tuple(b'"%d' % k for k in range(33)))),
    ("separators", (b"",)),
]


def _outcome(function, *args):
    """What a call gives, its arrays as lists of int64 or bool, or the type of its error."""
    try:
        result = function(*args)
    except Exception as exc:  # noqa: BLE001 - the error's type is the outcome compared
        return type(exc)
    parts = result if isinstance(result, tuple) else (result,)
    return tuple(part if isinstance(part, (bytes, type(None))) else bytes(memoryview(
        np.ascontiguousarray(part))) for part in parts)


@needs_c
@pytest.mark.parametrize("row", range(len(_ODD_ROWS)))
def test_json_rows_twin_refuses_and_declines_as_the_c_one(row):
    """Odd columns (a code naming no text, a scale out of range, texts that are no list of
    bytes, no int64s) are refused with the same error; no rows and no columns alike."""
    args = _ODD_ROWS[row]
    assert _outcome(_native.reference.json_rows, *args) == _outcome(C.json_rows, *args)


@needs_c
@pytest.mark.parametrize("case", range(len(_ODD_KEYS)))
def test_key_scan_twins_take_odd_positions_as_the_c_ones(case):
    """Positions before or past the data, empty data, no literals, spans outside the data
    and literals that cannot be keys: the same answers or errors."""
    name, args = _ODD_KEYS[case]
    assert _outcome(getattr(_native.reference, name), *args) == _outcome(getattr(C, name),
                                                                         *args)


_KEY_MEMBERS = st.one_of(st.integers(-3, 400), st.sampled_from(
    [b"1.0", b"0.0", b"-0.0", b"true", b"9223372036854775807", b"-9223372036854775808",
     b"9223372036854775808", b"123456789012345678901234567890", b'"1"', b'"gpu"', b"null"]))


def _member(value) -> bytes:
    return value if isinstance(value, bytes) else b"%d" % value


def _int_or_text(member) -> bool:
    """What a pid or tid may be."""
    return not isinstance(member, bytes) or member.lstrip(b"-").isdigit() or member[:1] == b'"'


@needs_c
@given(st.lists(st.tuples(_KEY_MEMBERS.filter(_int_or_text), _KEY_MEMBERS.filter(_int_or_text),
                          _KEY_MEMBERS, st.booleans()),
                min_size=1, max_size=700))
@example([(k % 3, k % 450, [k % 5, b"1.0", b"true"][k % 3], k % 7 == 0) for k in range(900)])
def test_slice_keys_number_tracks_and_groups_as_a_dict_does(members):
    """(pid, tid) and (pid, device) codes, as observe numbers them: ints by value however
    large, and 1, 1.0 and true one key, as in a dict; past 256 distinct keys too."""
    events = b", ".join(
        b'{"ph": "X", "cat": "%b", "name": "k", "pid": %b, "tid": %b, "ts": 1, "dur": 1, '
        b'"args": {"device": %b}}' % (b"gpu_user_annotation" if scope else b"kernel",
                                      _member(pid), _member(tid), _member(device))
        for pid, tid, device, scope in members)
    context = chunk_facts.Context(count_names=True, records=False)
    with_c = extract.observe_chunk(events, 0, context)
    with_numpy = _numpy(extract.observe_chunk, events, 0, context)
    assert with_c.tracks == with_numpy.tracks
    assert with_c.groups == with_numpy.groups
    assert [type(x) for key in with_c.groups for x in key] == [
        type(x) for key in with_numpy.groups for x in key]
    assert with_c.slices.tobytes() == with_numpy.slices.tobytes()


_NAMES = st.sampled_from([b'"k"', b'"\\u006b"', b'"gemm"', b'"g\\u00e9mm"', b"1", b"1.0", b"true",
                          b"null", b'""', b'{"a": 1}', b"[1]"])


@needs_c
@given(st.lists(st.tuples(_NAMES, st.integers(0, 3), st.sampled_from([b"kernel", b"gpu_memcpy"])),
                min_size=1, max_size=60))
def test_kernel_names_are_counted_as_a_counter_counts(kernels):
    """Per group and in order of first appearance: equal names one key ("k" and its
    escape, 1 and 1.0 and true), and an object or array as a name counted by its text."""
    events = b", ".join(
        b'{"ph": "X", "cat": "%b", "name": %b, "pid": 0, "tid": 7, "ts": 1, "dur": 1, '
        b'"args": {"device": %d}}' % (cat, name, device) for name, device, cat in kernels)
    context = chunk_facts.Context(count_names=True, records=False)
    with_c = extract.observe_chunk(events, 0, context).kernel_names
    with_numpy = _numpy(extract.observe_chunk, events, 0, context).kernel_names
    assert [(g, list(c.items())) for g, c in with_c.items()] == [
        (g, list(c.items())) for g, c in with_numpy.items()]
    assert [type(name) for c in with_c.values() for name in c] == [
        type(name) for c in with_numpy.values() for name in c]


_DEVICES = st.sampled_from([b"0", b"1", b'"0"', b"null", b"[0]", b'{"d": 0}'])


def _observed(events: bytes, context: chunk_facts.Context):
    """The chunk's facts, or the refusal (message and event) instead."""
    try:
        facts = extract.observe_chunk(events, 0, context)
    except chunk_facts.ChunkError as exc:
        return exc.message, exc.local
    return (facts.tracks, facts.groups, {
        pattern: (rows.tobytes(), names, streams, texts)
        for pattern, (rows, names, streams, texts) in facts.matches.items()})


@needs_c
@given(st.lists(st.tuples(_NAMES, _DEVICES,
                          st.sampled_from([b"kernel", b"gpu_memcpy", b"gpu_user_annotation"])),
                min_size=1, max_size=40))
def test_anchor_kernels_are_picked_and_refused_alike(kernels):
    """`anchors` keeps only the kernels its patterns match, after refusing an object or
    array as any GPU event's device, and as a matched name: the same facts, or the same
    refusal at the same event, either way."""
    events = b", ".join(
        b'{"ph": "X", "cat": "%b", "name": %b, "pid": 0, "tid": 7, "ts": %d, "dur": 1, '
        b'"args": {"device": %b, "stream": 7}}' % (cat, name, k, device)
        for k, (name, device, cat) in enumerate(kernels))
    context = chunk_facts.Context(patterns={"k": re.compile("k"), "one": re.compile("^1")},
                              records=False, bounds=False)
    assert _observed(events, context) == _numpy(_observed, events, context)


@needs_c
@given(st.lists(st.integers(0, 44), min_size=1, max_size=200))
def test_kernels_of_many_long_names_are_picked_alike(picks):
    """The C extension finds a name seen before by comparing it, among the first 32 it
    saw, instead of hashing it again (kernel names are long templated C++): names beyond
    those, names of one length that differ in their last character, and non-string names
    are picked as a dict lookup picks them."""
    names = [b'"void gemm<%s, %02d>(float*)"' % (b"x" * 300, k) for k in range(40)]
    names += [b"1", b"1.0", b'"void gemm<%s, 07>(float)"' % (b"x" * 300), b'"k"', b'"\\u006b"']
    events = b", ".join(
        b'{"ph": "X", "cat": "kernel", "name": %b, "pid": 0, "tid": 7, "ts": %d, "dur": 1, '
        b'"args": {"device": 0, "stream": 7}}' % (names[n], k) for k, n in enumerate(picks))
    patterns = {"odd": re.compile(r"[13579]>\(float\*"), "k": re.compile("^k$|^1$")}
    for context in (chunk_facts.Context(patterns=patterns, records=False, bounds=False),
                    chunk_facts.Context(patterns=patterns)):
        assert _observed(events, context) == _numpy(_observed, events, context)


_STREAMS = st.sampled_from([b"7", b"7.0", b"true", b'"7"', b"null", b"[7]", b'{"s": 7}', None])


@needs_c
@given(st.lists(st.tuples(_NAMES, _STREAMS, st.booleans()), min_size=1, max_size=40),
       st.booleans())
def test_matched_kernels_get_the_same_stream_and_name_codes_either_way(kernels, anchors):
    """Streams and names of matched kernels are numbered by (type, value), so 7, 7.0 and
    true are three streams and "k" and its escape one name; an object or array as a
    matched kernel's stream is refused at the same event; `layers` (every slice kept) and
    `anchors` (only the matched kernels) alike."""
    events = b", ".join(
        b'{"ph": "X", "cat": "kernel", "name": %b, "pid": 0, "tid": 7, "ts": %d, "dur": 1%b}'
        % (name, k, b"" if stream is None else
           b', "args": {"device": 0%b}' % (b', "stream": %b' % stream if has_stream else b""))
        for k, (name, stream, has_stream) in enumerate(kernels))
    context = chunk_facts.Context(patterns={"k": re.compile("k"), "one": re.compile("^1")},
                              records=not anchors, bounds=not anchors)
    with_c, with_numpy = _observed(events, context), _numpy(_observed, events, context)
    assert with_c == with_numpy
    if len(with_c) == 3:  # not refused; equal values of other types (7 == 7.0) are not equal keys
        assert [[type(x) for x in names + streams] for _, names, streams, _ in with_c[2].values()
                ] == [[type(x) for x in names + streams]
                      for _, names, streams, _ in with_numpy[2].values()]


_FLOW_IDS = st.one_of(st.integers(-(2**63), 2**63), st.sampled_from(
    [b"4611686018427387903", b"4611686018427387904", b"-4611686018427387904", b"1.0", b"true",
     b'"7"', b"null", b"[7]", None]))
_CATEGORIES = st.sampled_from([b'"ac2g"', b'"async_gpu"', b'"\\u0061c2g"', b"1", b"1.0", b"true",
                               b"null", b"[1]", b'{"c": 1}', None])


def _flow_member(key: bytes, value) -> bytes:
    if value is None:
        return b""
    return b', "%b": %b' % (key, value if isinstance(value, bytes) else b"%d" % value)


@needs_c
@given(st.lists(st.tuples(st.sampled_from([b"s", b"t", b"f"]),
                          st.sampled_from([b'"e"', b'"\\u0065"', b'"n"', b"1", b"null", None]),
                          _FLOW_IDS, _CATEGORIES, _KEY_MEMBERS.filter(_int_or_text),
                          st.integers(0, 3)),
                min_size=1, max_size=40),
       st.booleans())
@example([(b"f", None, b"4611686018427387903", b'"ac2g"', 0, 0),  # 19 digits, packed
          (b"s", None, b"-4611686018427387904", b'"ac2g"', 0, 0),  # just out of range
          (b"t", None, b"12345678901234567890123", b'"ac2g"', 0, 0)], True)
def test_flows_are_kept_alike_either_way(flows, records):
    """A chunk's flows: tracks numbered in order of first appearance, which bind to the
    next slice (`f` without "bp": "e", however `e` is spelled), ids packed where they are
    integers within +-2**62 (the others kept as they are) and the categories counted by
    their text, the same with the C extension and without."""
    events = b", ".join(
        b'{"ph": "%b", "pid": %b, "tid": %d, "ts": %d%b%b%b}'
        % (ph, _member(pid), tid, k, _flow_member(b"bp", bp), _flow_member(b"id", fid),
           _flow_member(b"cat", cat))
        for k, (ph, bp, fid, cat, pid, tid) in enumerate(flows))
    context = chunk_facts.Context(records=records)

    def facts(events, context):
        found = extract.observe_chunk(events, 0, context)
        return (found.tracks, found.flows.tobytes(), found.flow_ids,
                list(found.flow_categories.items()))

    assert facts(events, context) == _numpy(facts, events, context)


@needs_c
@given(st.lists(st.tuples(st.sampled_from([b"i", b"X", b"B", b"C"]),
                          _KEY_MEMBERS.filter(_int_or_text), st.integers(0, 3)),
                min_size=1, max_size=60))
def test_the_first_event_on_each_track_is_found_alike_either_way(events):
    """Events that are neither GPU activity, flows nor metadata: the first one on each
    track, and the tracks numbered in the same order, with the C extension and without."""
    chunk = b", ".join(b'{"ph": "%b", "cat": "cpu_op", "name": "n%d", "pid": %b, "tid": %d, '
                       b'"ts": %d}' % (ph, k, _member(pid), tid, k)
                       for k, (ph, pid, tid) in enumerate(events))

    def facts(chunk):
        found = extract.observe_chunk(chunk, 0, chunk_facts.Context())
        return found.tracks, list(found.other_on_track.items())

    assert facts(chunk) == _numpy(facts, chunk)


def _both_ways(*args) -> tuple[bytes, bytes]:
    """The output and then the report of one CLI run with the C extension and one with
    numpy (each in its own folder: the output names its report)."""
    outputs = []
    at = args.index("--output") + 1
    for name, env in (("c", {}), ("numpy", {"TRACESTREAM_PURE": "1"})):
        output = args[at].parent / name / args[at].name
        output.parent.mkdir()
        result = subprocess.run(
            TRACESTREAM + [str(a) for a in (*args[:at], output, *args[at + 1:])],
            capture_output=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
        assert result.returncode == 0, result.stderr.decode()
        report, = output.parent.glob(f"{output.name}.*.json")
        outputs.append(output.read_bytes() + report.read_bytes())
    return outputs[0], outputs[1]


@needs_c
def test_layers_and_lanes_write_the_same_bytes_either_way(traces, tmp_path):
    trace, _ = traces("decode6.json", iterations=6)
    c_bytes, numpy_bytes = _both_ways(*layers_args(trace, tmp_path / "out.json",
                                                   "--max-gpu-lanes", "10"))
    assert b'"_compact_gpu_track"' in c_bytes
    assert c_bytes == numpy_bytes


@needs_c
@pytest.mark.parametrize("name", REAL_WITH_GPU)
def test_real_traces_compact_to_the_same_bytes_either_way(name, tmp_path):
    c_bytes, numpy_bytes = _both_ways("compact", "--trace", real_trace(name),
                                      "--output", tmp_path / "out.json")
    assert b'"_compact_gpu_track"' in c_bytes
    assert c_bytes == numpy_bytes


_INT64 = st.integers(-(2**63), 2**63 - 1)
_NEAR_LIMITS = st.sampled_from([0, 1, 9, 10, 11, 99, 100, 999, 1000, 10**15 - 1, 10**15,
                                2**53, -1, -10, -(10**15), -(2**63), 2**63 - 1])


@needs_c
@given(st.lists(st.one_of(_INT64, _NEAR_LIMITS, st.integers(-(10**16), 10**16)), min_size=1,
                max_size=40), st.sampled_from([3, 6]))
@example([0, 9, 10, 10**15 - 1], 6)
def test_json_rows_write_numbers_as_the_python_rows_do(values, decimals):
    """INTEGERS as %d, FIXED as matches.threes, SHORTEST as orjson writes round(k / 10**d, d)
    (or declined, only where orjson would use exponents or more than 15 digits)."""
    from tracestream.index.matches import _three

    column = np.array(values, np.int64)
    parts = (b"[", b"|", b"]")
    integers = C.json_rows(len(values), parts[::2], ((C.INTEGERS, column),), b",")
    assert integers == b",".join(b"[%d]" % v for v in values)
    if decimals == 3:
        fixed = C.json_rows(len(values), parts[::2], ((C.FIXED, column, 3),), b",")
        assert fixed == b",".join(b"[" + _three(v) + b"]" for v in values)
    shortest = C.json_rows(len(values), parts, ((C.SHORTEST, column, decimals),
                                                (C.TEXTS, [b"x"] * len(values))), b",")
    written = [b"null" if v == -(2**63) else
               orjson.dumps(round(float(np.float64(v) / 10**decimals), decimals)) for v in values]
    if shortest is None:
        assert any(v != -(2**63) and (abs(v) >= 10**15 or 0 < abs(v) < 10 ** (decimals - 5))
                   for v in values)
    else:
        assert shortest == b",".join(b"[" + w + b"|x]" for w in written)


@needs_c
@given(st.lists(st.tuples(_INT64, st.integers(0, 2)), max_size=30), st.integers(1, 9))
def test_json_rows_of_the_numpy_twin_are_the_c_ones(rows, decimals):
    """The twin writes the same rows from the same columns (integers, fixed decimals at any
    scale, texts, texts by code), and leaves a SHORTEST column to its caller."""
    values = np.array([v for v, _ in rows], np.int64)
    codes = np.array([c for _, c in rows], np.int64)
    texts = [b"%d" % (v % 7) for v in values.tolist()]
    parts = (b"{", b", ", b" | ", b"; ", b"}")
    columns = ((C.INTEGERS, values), (C.FIXED, values, decimals), (C.TEXTS, texts),
               (C.CODED, codes, [b'"a"', b"null", b"[1]"]))
    assert _native.reference.json_rows(len(rows), parts, columns, b",\n") == C.json_rows(
        len(rows), parts, columns, b",\n")
    shortest = ((C.SHORTEST, values, decimals),)
    written = _native.reference.json_rows(len(rows), (b"", b""), shortest, b",")
    assert written is None if rows else written == b""  # no rows: nothing to decline


@needs_c
def test_json_rows_take_texts_by_code_and_refuse_odd_columns():
    codes = np.array([2, 0, 2], np.int64)
    assert C.json_rows(3, (b"<", b">"), ((C.CODED, codes, [b"a", b"b", b"c"]),), b" ") == \
        b"<c> <a> <c>"
    assert C.json_rows(0, (b"<", b">"), ((C.CODED, codes[:0], [b"a"]),), b" ") == b""
    with pytest.raises(IndexError):
        C.json_rows(1, (b"", b""), ((C.CODED, np.array([3], np.int64), [b"a"]),), b"")
    with pytest.raises(TypeError):
        C.json_rows(2, (b"", b""), ((C.TEXTS, [b"only one"]),), b"")
    with pytest.raises(TypeError):
        C.json_rows(1, (b"", b""), ((C.TEXTS, ["not bytes"]),), b"")
    with pytest.raises(ValueError):
        C.json_rows(2, (b"", b""), ((C.INTEGERS, np.array([1, 2], np.int32)),), b"")


# Source events in the shapes the quick undo meets: Kineto's one-line and multi-line
# layouts, args with members, empty args, no args, escaped strings, string and negative
# pids, members it does not read between the tid and the args.
_UNDO_SOURCES = (
    b'{"ph": "X", "cat": "kernel", "name": "k<1, 2>", "pid": 0, "tid": 7, "ts": 10.5, '
    b'"dur": 2, "args": {"device": 0, "stream": 7}}',
    b'{\n    "ph": "X", "cat": "kernel", "name": "a \\"quoted\\" name", "pid": 1, "tid": 13,'
    b'\n    "ts": 1764400000000004.432, "dur": 9.750,\n    "args": {\n      "stream": 13\n    }'
    b'\n  }',
    b'{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy", "pid": "GPU 2", "tid": "stream 3", '
    b'"ts": 5, "dur": 1e2, "args": {}}',
    b'{"ph": "f", "id": 4, "pid": -3, "tid": 8, "ts": 11, "cat": "ac2g", "name": "ac2g", '
    b'"bp": "e"}',
    b'{"ph":"s","id":9,"pid":0,"tid":7,"ts":12,"s":"t","cat":"ac2g","name":"ac2g"}',
    b'{"ph": "X", "cat": "kernel", "name": "_compact_gpu_track", "pid": 0, "tid": 7, '
    b'"ts": 1, "dur": 1}',
    b'{"ph": "X", "name": "args after", "args": {"x": 1}, "pid": 0, "tid": 7, "ts": 1}',
    b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, '
    b'"args": {"a": {"b": "}, {"}}}',
)


def _relocated(index: int, source: bytes) -> bytes:
    """The source event as the rewrite moves it to a lane (its pid too, for some)."""
    return relocate.relocate(source, b"%d" % (1000000 + index), index,
                         None if index % 3 else b"%d" % (100 + index))


@needs_c
@given(st.lists(st.tuples(st.integers(0, len(_UNDO_SOURCES) - 1), st.booleans()),
                min_size=1, max_size=8),
       st.sampled_from((b", ", b",\n  ", b",")))
@example([(6, True)], b", ")
@example([(5, True), (0, False)], b", ")
def test_the_quick_undo_is_the_regular_expressions_one(events, separator):
    """The C undo gives the reference's bytes and count, or None where it does, on chunks of
    relocated and untouched events in every layout, cut at any event; where both undo a
    chunk, the result is the source's bytes (the sha256 its caller compares holds)."""
    source = [_UNDO_SOURCES[k] for k, _ in events]
    output = [_relocated(i, raw) if moved else raw
              for i, (raw, (_, moved)) in enumerate(zip(source, events))]
    for first in range(len(output)):
        for last in range(first + 1, len(output) + 1):
            chunk = separator.join(output[first:last])
            undone = C.undo_relocations(chunk)
            assert undone == _native.reference.undo_relocations(chunk)
            if undone is not None:
                assert undone[0] == separator.join(source[first:last])
                assert undone[1] == sum(moved for _, moved in events[first:last])


@needs_c
@pytest.mark.parametrize("chunk", [
    b"",
    b'{"ph": "X", "pid": 0, "tid": 1}',
    b'{"args": {"_compact_gpu_track": {"pid": 0, "tid": 1, "source_event_index": 2, '
    b'"had_args": true}}}',  # no pid and tid before the member
    b'{"pid": 0, "tid": 1, "args": {"_compact_gpu_track": {"pid": 0, "tid": 1, '
    b'"source_event_index": 2, "had_args": false}}',  # the chunk ends inside the event
    b'{"pid": 0, "tid": 1, "args": {"_compact_gpu_track": {"pid": 0, "tid": 1, "source_event_'
    b'index": 2, "had_args": true}, "_compact_gpu_track": 3}}',
    b'{"pid": 0, "tid": 1, "args": {"_compact_gpu_track": {"pid": 0, "tid": "a\\"", '
    b'"source_event_index": 2, "had_args": true}}}',  # an escaped quote in a value
])
def test_the_quick_undo_refuses_as_the_reference(chunk):
    assert C.undo_relocations(chunk) == _native.reference.undo_relocations(chunk)


@needs_c
@pytest.mark.parametrize("distinct", [31, 32, 33, 100])
def test_kernel_names_past_the_c_tally_are_counted_as_a_counter_counts(distinct):
    """The C count buffers a few dozen distinct names at a time: past that, between groups
    and around names that are not strings, counts, order and types stay a Counter's."""
    names = [b'"name %d"' % (k % distinct) for k in range(3 * distinct)]
    names[distinct // 2] = b"7"
    names[distinct] = b'"\\u006eame 1"'  # "name 1", escaped
    events = b", ".join(
        b'{"ph": "X", "cat": "kernel", "name": %b, "pid": 0, "tid": 7, "ts": 1, "dur": 1, '
        b'"args": {"device": %d}}' % (name, (k // 40) % 2) for k, name in enumerate(names))
    context = chunk_facts.Context(count_names=True, records=False)
    with_c = extract.observe_chunk(events, 0, context).kernel_names
    with_numpy = _numpy(extract.observe_chunk, events, 0, context).kernel_names
    assert [(g, list(c.items())) for g, c in with_c.items()] == [
        (g, list(c.items())) for g, c in with_numpy.items()]
    assert sum(sum(c.values()) for c in with_c.values()) == len(names)


@needs_c
@given(st.lists(number_texts, max_size=10))
def test_verify_reads_number_columns_in_c_as_in_numpy(texts):
    """verify's ts/dur columns of a chunk's events, read by the C extension, are those its
    numpy twin parses (values whose double needs their text included)."""
    from tracestream.commands.verify.events import NumberColumn

    events = [CheckEvent(ts=msgspec.Raw(t)) for t in texts]
    with_c = NumberColumn.of_events(events, "ts")
    with_numpy = _numpy(NumberColumn.of_events, events, "ts")
    for name in ("exact", "rounded", "truncated", "regular"):
        assert getattr(with_c, name).tolist() == getattr(with_numpy, name).tolist(), name


@needs_c
def test_the_c_extension_reads_inherited_fields_from_their_slots():
    """model.Event extends ReadEvent, so its fields live in a base's slots: the C
    extension must find them there, not fall back to a getattr per event (that made the
    index pass of `compact` 40% slower per chunk)."""
    reads = []

    class Counting(Event, gc=False):
        def __getattribute__(self, name):
            reads.append(name)
            return object.__getattribute__(self, name)

    events = msgspec.json.Decoder(list[Counting]).decode(
        b'[{"ph": "X", "ts": 1.5, "dur": 2, "pid": 1, "tid": 2, "cat": "kernel", "name": "k"}]')
    reads.clear()
    ns, shapes = C.decimal_column(events, "ts", False)
    assert np.frombuffer(ns, np.int64).tolist() == [1500] and reads == []


_CHECK_SCALARS = st.sampled_from([b"0", b"7", b"-1", b"1.0", b"true", b"null", b'"7"',
                                  b'"stream 7 "', b"9223372036854775808"])
_CHECK_PHASES = st.sampled_from([b'"X"', b'"s"', b'"t"', b'"f"', b'"i"', b'"M"', b'"XX"',
                                 b'"x"', b"null", None])
_CHECK_CATS = st.sampled_from([b'"kernel"', b'"gpu_memcpy"', b'"Memset"', b'"cuda_sync"',
                               b'"cpu_op"', b'"layer_guide"', b'"gpu_user_annotation"',
                               b'"Kernel, cpu_op"', b"3", b"null", None])
_CHECK_MEMBERS = st.sampled_from([b"0", b"7", b'"7"', b"-3", b"null", b"9223372036854775808",
                                  None])


def _check_event(ph, cat, pid, tid, device, origin) -> bytes:
    """An event as verify's checks decode it, with the members given (None: left out)."""
    members = [b'"%b": %b' % (key, value) for key, value in
               ((b"ph", ph), (b"cat", cat), (b"pid", pid), (b"tid", tid)) if value is not None]
    inside = [] if device is None else [b'"device": %b' % device]
    if origin is not None:
        inside.append(b'"_compact_gpu_track": {"pid": %b, "tid": %b, "source_event_index": 1,'
                      b' "had_args": true}' % origin)
    if device is not None or origin is not None:
        members.append(b'"args": {%b}' % b", ".join(inside))
    return b"{%b}" % b", ".join(members + [b'"ts": 1, "dur": 1'])


def _check_columns_both_ways(events: list) -> None:
    """verify's check columns of `events`, by the C extension and its Python twin: the same
    columns, and the same values numbered the same way (their types too)."""
    from tracestream.commands.verify.columns import Interned, TrackCodes, check_chunk_columns
    from tracestream.model import CategoryKinds

    results = []
    for way in (lambda f, *a: f(*a), _numpy):
        codes, devices, kinds = TrackCodes(), Interned(), CategoryKinds()
        columns = way(check_chunk_columns, events, kinds, codes, devices)
        tables = [table.table for table in (codes.pids, codes.tids, devices)]
        results.append(([column.tolist() for column in columns],
                        [(list(numbers.items()), [(type(v), v) for v in values])
                         for numbers, values in tables], dict(kinds)))
    assert results[0] == results[1]


@needs_c
@given(st.lists(st.tuples(_CHECK_PHASES, _CHECK_CATS, _CHECK_MEMBERS, _CHECK_MEMBERS,
                          st.one_of(st.none(), _CHECK_SCALARS),
                          st.one_of(st.none(), st.tuples(_CHECK_SCALARS, _CHECK_SCALARS))),
                max_size=40))
@example([(b'"X"', b'"kernel"', b"0", b"7", b"0", (b"0", b"1.0")),
          (b'"f"', b'"ac2g"', b"0", b"1000001", None, (b"0", b"7")),
          (b'"X"', b'"kernel"', b"0", b"1000001", b"true", (b"0", b"7"))])
def test_verify_check_columns_are_those_of_the_python_twin(events):
    """Per event its phase, kind, track, original track (moved flows and activities only),
    whether it moved and its device, and the pids, tids and devices numbered in the same
    order, equal values (1, 1.0 and true) as one, the first one met kept."""
    from tracestream.commands.verify.events import CHECK_EVENTS

    document = b"[%b]" % b", ".join(_check_event(*event) for event in events)
    try:
        decoded = CHECK_EVENTS.decode(document)
    except msgspec.ValidationError:  # (a pid or tid that is not an int or a string)
        return
    _check_columns_both_ways(decoded)


@needs_c
@pytest.mark.parametrize("device", [b"[0]", b'{"a": 1}'])
def test_verify_check_columns_refuse_an_unhashable_device_alike(device):
    from tracestream.commands.verify.columns import Interned, TrackCodes, check_chunk_columns
    from tracestream.commands.verify.events import CHECK_EVENTS
    from tracestream.model import CategoryKinds

    events = CHECK_EVENTS.decode(b"[%b]" % _check_event(b'"X"', b'"kernel"', b"0", b"7",
                                                          device, None))
    for way in (lambda f, *a: f(*a), _numpy):
        with pytest.raises(TypeError):
            way(check_chunk_columns, events, CategoryKinds(), TrackCodes(), Interned())


@needs_c
def test_verify_check_columns_of_layers_outputs_are_those_of_the_python_twin(traces,
                                                                            tmp_path):
    """On a whole output (relocated kernels and flows, guides, lanes) and on each real trace
    with GPU activity compacted, a few events at a time."""

    trace, _ = traces("decode6.json", iterations=6)
    outputs = [tmp_path / "layers.json"]
    subprocess.run(TRACESTREAM + [str(a) for a in layers_args(
        trace, outputs[0], "--max-gpu-lanes", "10")], check=True, capture_output=True,
        timeout=600)
    for name in REAL_WITH_GPU:
        if (REAL_TRACES / name).exists():
            outputs.append(tmp_path / f"{name}.json")
            subprocess.run(TRACESTREAM + ["compact", "--trace", str(REAL_TRACES / name),
                                          "--output", str(outputs[-1])],
                           check=True, capture_output=True, timeout=600)
    trace_type = msgspec.defstruct("Trace", [("traceEvents", list[CheckEvent])])
    for output in outputs:
        events = msgspec.json.decode(read_bytes(output), type=trace_type).traceEvents
        assert any(e.args is not None and e.args.origin is not None for e in events)
        for at in range(0, len(events), 97):
            _check_columns_both_ways(events[at : at + 97])
