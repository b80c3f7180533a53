"""Keys, integer values and separators found at byte level in a chunk, as str.find and
regular expressions would find them, by the C extension and by its numpy twin."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tracestream._native.reference import keys as numpy_keys
from tracestream.index.keyscan import (
    CAREFUL,
    NO_ARGS,
    ODD_ARGS,
    SPLICE_KEYS,
    EventKeys,
    continues,
    integer_ends,
    separators,
    splice_positions,
)

pytestmark = pytest.mark.usefixtures("backend")  # the C extension, then numpy

CHUNK = (b'{"ph": "X", "pid": 0, "tid": 7, "args": {"pid": "x"}},\n'
         b'{"pid": -12, "tid": 123456789012, "name": "\\"pid\\": 3"},'
         b'{"pid":1,"tid": 2}, {"tid": 99')


def _find_all(literal: bytes, data: bytes = CHUNK) -> list[int]:
    return [m.start() for m in re.finditer(b"(?=" + re.escape(literal) + b")", data)]


def positions(data: bytes, *literals: bytes) -> list[list[int]]:
    """Where each literal starts in `data`, as EventKeys finds them in one pass: with an
    event per byte, the events that count it."""
    starts = np.arange(len(data), dtype=np.int64)
    keys = EventKeys(data, starts, starts + 1, literals)
    return [np.flatnonzero(keys(literal)[1]).tolist() for literal in literals]


def test_positions_are_every_occurrence():
    literals = (b'"pid": ', b'"tid": ', b'"args"', b'"pid"', b'"x"', b'"tid": 99')
    assert positions(CHUNK, *literals) == [_find_all(literal) for literal in literals]


def test_continues_keeps_the_longer_spelling():
    pid = np.array(_find_all(b'"pid"'), np.int64)
    assert pid[continues(CHUNK, pid, b'"pid": ')].tolist() == _find_all(b'"pid": ')


def test_integer_ends_accepts_only_integers_followed_by_a_comma():
    begin = np.array(_find_all(b'"tid": '), np.int64) + len(b'"tid": ')
    ends = integer_ends(CHUNK, begin).tolist()
    # 7, and 123456789012 end at their comma; `"tid": 2}` and the cut `99` have none
    assert [CHUNK[b:e] for b, e in zip(begin.tolist(), ends) if e >= 0] == [b"7", b"123456789012"]
    assert ends[2:] == [-1, -1]
    minus = np.array(_find_all(b'"pid": '), np.int64) + len(b'"pid": ')
    assert [CHUNK[b:e] for b, e in zip(minus.tolist(), integer_ends(CHUNK, minus).tolist())
            if e >= 0] == [b"0", b"-12"]


def test_positions_at_either_alignment_and_in_tiny_chunks():
    for data in (b"", b'"', b'"t', b'x"t', b'"t"t', b'x"tx"t"'):
        assert positions(data, b'"t') == [_find_all(b'"t', data)], data


@pytest.mark.parametrize("block", [1, 2, 3, 5, 64])
def test_prefixes_across_block_edges(monkeypatch, block):
    """numpy compares the chunk a block at a time: a `"` that ends one block and the
    letter that starts the next are still a prefix, found once."""
    monkeypatch.setattr(numpy_keys, "_BLOCK", block)
    data = b'"t"tx""d"' + CHUNK + b'"a'
    literals = (b'"t', b'"d', b'"a', b'"pid"', b'"tid": ')
    assert positions(data, *literals) == [_find_all(literal, data) for literal in literals]


def test_prefixes_found_together_are_those_found_one_by_one():
    data = CHUNK + b' "d"a"p "t' + CHUNK[1:]
    literals = (b'"p', b'"t', b'"d', b'"a', b'"pid"', b'"args"', b'"x')
    together = positions(data, *literals)
    assert together == [positions(data, literal)[0] for literal in literals]
    assert together == [_find_all(literal, data) for literal in literals]


def test_event_keys_count_each_key_per_event():
    second = CHUNK.index(b'{"pid": -12')
    starts = np.array([0, second])
    ends = np.array([CHUNK.index(b"},") + 1, CHUNK.index(b"},", second) + 1])
    keys = EventKeys(CHUNK, starts, ends, (b'"pid"', b'"tid"'))
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
    got = splice_positions(EventKeys(data, starts, starts + [len(e) for e in events],
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
    keys = EventKeys(data, np.array([0]), np.array([len(data)]), SPLICE_KEYS)
    got = splice_positions(keys)
    assert got["pid_start"][0] == got["tid_start"][0] == CAREFUL
    assert got["args_brace"][0] == ODD_ARGS
