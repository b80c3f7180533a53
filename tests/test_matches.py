"""How a match's (ts, dur) is written back: decided per column must equal per match."""

from __future__ import annotations

import itertools

import numpy as np

from tracestream import timebase
from tracestream.matches import AS_TEXT, INTEGER, THREE_DECIMALS, number_form, number_forms

TS = [b"0.000", b"-0.000", b"-0.001", b"12.345", b"5", b"-5", b"0", b"-0",
      b"1764400000000003.432", b"1.5", b"1.2345", b"-12.000", b"1e3", b"7.0"]
DUR = [b"0.000", b"1.500", b"3", b"0", b"2.5"]


def _ns(texts: list[bytes]) -> np.ndarray:
    return np.array([timebase.parse_decimal(t).floor_ns() for t in texts], np.int64)


def test_column_forms_equal_one_by_one_forms():
    pairs = list(itertools.product(TS, DUR))
    for size in (1, 2, 3):
        for chosen in itertools.islice(itertools.combinations(pairs, size), 3000):
            ts, dur = [t for t, _ in chosen], [d for _, d in chosen]
            expected = [number_form(t, d, s, n) for t, d, s, n in
                        zip(ts, dur, _ns(ts).tolist(), _ns(dur).tolist())]
            assert number_forms(ts, dur, _ns(ts), _ns(dur)).tolist() == expected, chosen


def test_kineto_columns_take_the_fast_answer():
    ts, dur = [b"1764400000000003.432", b"-0.001"], [b"12.125", b"0.000"]
    assert number_forms(ts, dur, _ns(ts), _ns(dur)).tolist() == [THREE_DECIMALS] * 2
    ts, dur = [b"17", b"-4"], [b"0", b"3"]
    assert number_forms(ts, dur, _ns(ts), _ns(dur)).tolist() == [INTEGER] * 2
    ts, dur = [b"-0.000"], [b"1.000"]
    assert number_forms(ts, dur, _ns(ts), _ns(dur)).tolist() == [AS_TEXT]
