"""KeyScan finds quoted keys and integer values at byte level, as str.find would."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tracestream.index import keyscan
from tracestream.index.keyscan import (
    CAREFUL,
    NO_ARGS,
    ODD_ARGS,
    SPLICE_KEYS,
    EventKeys,
    KeyScan,
    per_event,
    separators,
    splice_positions,
)

pytestmark = pytest.mark.usefixtures("backend")  # the C extension, then numpy

CHUNK = (b'{"ph": "X", "pid": 0, "tid": 7, "args": {"pid": "x"}},\n'
         b'{"pid": -12, "tid": 123456789012, "name": "\\"pid\\": 3"},'
         b'{"pid":1,"tid": 2}, {"tid": 99')


def _find_all(literal: bytes) -> list[int]:
    return [m.start() for m in re.finditer(re.escape(literal), CHUNK)]


def test_positions_are_every_occurrence():
    scan = KeyScan(CHUNK)
    for literal in (b'"pid": ', b'"tid": ', b'"args"', b'"pid"', b'"x"', b'"tid": 99'):
        assert scan.positions(literal).tolist() == _find_all(literal)


def test_followed_by_keeps_the_longer_spelling():
    scan = KeyScan(CHUNK)
    pid = scan.positions(b'"pid"')
    assert scan.followed_by(pid, b'"pid": ').tolist() == _find_all(b'"pid": ')


def test_integer_ends_accepts_only_integers_followed_by_a_comma():
    scan = KeyScan(CHUNK)
    begin = scan.positions(b'"tid": ') + len(b'"tid": ')
    ends = scan.integer_ends(begin).tolist()
    # 7, and 123456789012 end at their comma; `"tid": 2}` and the cut `99` have none
    assert [CHUNK[b:e] for b, e in zip(begin.tolist(), ends) if e >= 0] == [b"7", b"123456789012"]
    assert ends[2:] == [-1, -1]
    minus = scan.positions(b'"pid": ') + len(b'"pid": ')
    assert [CHUNK[b:e] for b, e in zip(minus.tolist(), scan.integer_ends(minus).tolist())
            if e >= 0] == [b"0", b"-12"]


def test_per_event_counts_occurrences_inside_each_span():
    positions = np.array([3, 10, 12, 40])
    first, count = per_event(positions, np.array([0, 11, 20]), np.array([11, 20, 50]))
    assert count.tolist() == [2, 1, 1] and first.tolist() == [0, 2, 3]


def test_positions_at_either_alignment_and_in_tiny_chunks():
    for data in (b"", b'"', b'"t', b'x"t', b'"t"t', b'x"tx"t"'):
        expected = [m.start() for m in re.finditer(b'"t', data)]
        assert KeyScan(data).positions(b'"t').tolist() == expected, data


@pytest.mark.parametrize("block", [1, 2, 3, 5, 64])
def test_prefixes_across_block_edges(monkeypatch, block):
    """The chunk is compared a block at a time: a `"` that ends one block and the
    letter that starts the next are still a prefix, found once."""
    monkeypatch.setattr(keyscan, "_BLOCK", block)
    data = b'"t"tx""d"' + CHUNK + b'"a'
    scan = KeyScan(data)
    scan.find_prefixes(b"tda")
    for literal in (b'"t', b'"d', b'"a', b'"pid"', b'"tid": '):
        assert scan.positions(literal).tolist() == [
            m.start() for m in re.finditer(re.escape(literal), data)], literal


def test_prefixes_found_together_are_those_found_one_by_one():
    data = CHUNK + b' "d"a"p "t' + CHUNK[1:]
    together = KeyScan(data)
    together.find_prefixes(b"ptda")
    for literal in (b'"p', b'"t', b'"d', b'"a', b'"pid"', b'"args"', b'"x'):
        assert together.positions(literal).tolist() == KeyScan(data).positions(literal).tolist()
        assert together.positions(literal).tolist() == [
            m.start() for m in re.finditer(re.escape(literal), data)]


def test_event_keys_count_each_key_per_event():
    second = CHUNK.index(b'{"pid": -12')
    starts = np.array([0, second])
    ends = np.array([CHUNK.index(b"},") + 1, CHUNK.index(b"},", second) + 1])
    keys = EventKeys(KeyScan(CHUNK), starts, ends, (b'"pid"', b'"tid"'))
    first, count = keys(b'"pid"')
    assert count.tolist() == [2, 1]  # the first event's args hold another "pid"
    assert first.tolist() == [CHUNK.index(b'"pid"'), second + 1]
    first, count = keys(b'"args"')  # not asked for up front: found all the same
    assert (first.tolist(), count.tolist()) == ([CHUNK.index(b'"args"'), -1], [1, 0])


SEPARATOR = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")


@pytest.mark.parametrize("data", [
    b'{"a": 1},\n  {"b": {"c": 2}}, {"d": "}, {"}',
    b'{},{}' + b" " * 100 + b",{}",
    b'{}  ' + b"\n" * 70 + b', ' + b"\t" * 40 + b'{}},{',
    b'}', b'},', b'}, ', b'', b'{"x": "}\\t,\\n{"}',
])
def test_separators_are_the_regex_matches(data):
    starts, ends = separators(data)
    assert list(zip(starts.tolist(), ends.tolist())) == [m.span() for m in SEPARATOR.finditer(data)]


def test_splice_positions_trust_only_kineto_spelled_keys_that_occur_once():
    events = [
        b'{"ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 1, "args": {"stream": 7}}',
        b'{"ph": "f", "id": 3, "pid": 0, "tid": -12, "ts": 1, "bp": "e"}',
        b'{"ph": "X", "pid":0, "tid":7, "meta": {"pid": 5, "tid": 6}, "args": {}}',
        b'{"ph": "X", "pid": 0, "tid": "7", "ts": 1}',
        b'{"ph": "X", "pid": 0, "tid": 7, "args": {"args": 1}}',
        b'{"ph": "X", "pid": 0, "tid": 7, "args":{"stream": 7}}',
    ]
    data = b", ".join(events)
    starts = np.array([data.index(e) for e in events])
    got = splice_positions(EventKeys(KeyScan(data), starts, starts + [len(e) for e in events],
                                     SPLICE_KEYS))
    first = events[0]
    assert first[got["pid_start"][0]:got["pid_end"][0]] == b"0"
    assert first[got["tid_start"][0]:got["tid_end"][0]] == b"7"
    assert first[got["args_brace"][0]:].startswith(b'"stream"')
    flow = events[1]
    assert flow[got["tid_start"][1]:got["tid_end"][1]] == b"-12"
    assert got["args_brace"][1] == NO_ARGS
    # "pid" twice (once nested), a string tid, "args" twice, args spelled without a space
    assert got["pid_start"][2] == got["tid_start"][2] == CAREFUL
    assert got["pid_start"][3] >= 0 and got["tid_start"][3] == CAREFUL
    assert got["args_brace"][4] == got["args_brace"][5] == ODD_ARGS
    assert got["pid_start"][4] >= 0 and got["pid_start"][5] >= 0


def test_splice_positions_trust_nothing_in_a_chunk_with_backslashes():
    data = b'{"ph": "X", "name": "a\\"b", "pid": 0, "tid": 7, "args": {}}'
    keys = EventKeys(KeyScan(data), np.array([0]), np.array([len(data)]), SPLICE_KEYS)
    got = splice_positions(keys)
    assert got["pid_start"][0] == got["tid_start"][0] == CAREFUL
    assert got["args_brace"][0] == ODD_ARGS
