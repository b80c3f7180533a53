"""How a match's (ts, dur) is written back: decided per column must equal per match."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tracestream.index import matches, timebase
from tracestream.index.matches import (
    AS_TEXT,
    INTEGER,
    MATCH_DTYPE,
    THREE_DECIMALS,
    FileOrder,
    MatchTable,
    _three,
    number_form,
    number_forms,
    threes,
)

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


def test_one_differently_written_value_is_the_only_one_read_apart(monkeypatch):
    """One value written otherwise (`"ts": 0` next to three-decimal epoch values, an integer
    µs next to fractional ones) does not send its chunk's matches through the per-match
    reading: forms are decided a column at a time."""
    ts = [b"1764400000000003.432", b"0", b"-12.000", b"1e3", b"1764400000000004"]
    dur = [b"12.125", b"0", b"0.500", b"1.000", b"3"]
    start, length = _ns(ts), _ns(dur)
    expected = [number_form(t, d, s, n) for t, d, s, n in
                zip(ts, dur, start.tolist(), length.tolist())]

    def one_at_a_time(*_):
        raise AssertionError("a match's form decided one at a time")

    monkeypatch.setattr(matches, "number_form", one_at_a_time)
    monkeypatch.setattr(matches, "_three", one_at_a_time)
    monkeypatch.setattr(matches, "_integer", one_at_a_time)
    assert number_forms(ts, dur, start, length).tolist() == expected == [
        THREE_DECIMALS, INTEGER, THREE_DECIMALS, AS_TEXT, INTEGER]


def test_matches_in_file_order_are_viewed_without_an_order_array():
    """Matches that came in time order need no stored order: `FileOrder` answers every
    index the row-number array would, and refuses the same positions."""
    table = _table([b"1.000", b"2.000", b"2.000", b"7.000"], [b"0.500"] * 4)
    view = table.on_gpu(0, 0)
    assert isinstance(view.order, FileOrder)
    rows = np.arange(4)
    for at in (0, 3, -1, slice(1, 3), slice(None, None, 2), np.array([3, 0, 2]),
               np.array([-1]), np.array([], np.int64)):
        assert np.array_equal(view.order[at], rows[at]), at
    for outside in (4, -5, np.array([4]), np.array([-5])):
        with pytest.raises(IndexError):
            rows[outside]
        with pytest.raises(IndexError):
            view.order[outside]
    assert view.order.tolist() == rows.tolist()
    assert [m.ts_text for m in view] == ["1.000", "2.000", "2.000", "7.000"]
    assert view.starts is table.starts  # the column itself, not a copy


def _table(ts: list[bytes], dur: list[bytes]) -> MatchTable:
    """A table of one match per (ts, dur), each in the form the index pass would give it."""
    table = MatchTable([(0, 7)], [(0, 0)])
    rows = np.zeros(len(ts), MATCH_DTYPE)
    rows["ordinal"] = np.arange(len(ts))
    rows["start"], rows["dur"] = _ns(ts), _ns(dur)
    rows["form"] = number_forms(ts, dur, rows["start"], rows["dur"])
    rows["name"] = table.intern_name("k")
    rows["stream"] = table.intern_stream(7)
    texts = {k: (t.decode(), d.decode()) for k, (t, d, form) in
             enumerate(zip(ts, dur, rows["form"].tolist())) if form == AS_TEXT}
    table.extend(rows, texts)
    return table


def test_column_texts_and_ends_equal_each_match():
    pairs = list(itertools.product(TS, DUR))
    mixed = _table([t for t, _ in pairs], [d for _, d in pairs])
    kineto = _table([b"1764400000000003.432", b"0.000", b"12.999", b"7.001"],
                    [b"12.125", b"0.000", b"0.001", b"1000.000"])
    whole = _table([b"1764400000000003", b"0", b"-12", b"7"], [b"12", b"0", b"1", b"1000"])
    for table in (mixed, kineto, whole):
        which = np.arange(len(table), dtype=np.int32)[::-1]  # any order, as a view's
        ts_texts, dur_texts = table.texts_of(which)
        assert table.start_texts(which) == ts_texts
        end_texts, end_ceils = table.ends_of(which)
        for k, row in enumerate(which.tolist()):
            match = table.match(row)
            assert (ts_texts[k], dur_texts[k]) == (match.ts_text.encode(),
                                                   match.dur_text.encode())
            assert end_texts[k] == match.end.to_text().encode()
            assert end_ceils[k] == match.end.ceil_ns()


def test_start_texts_of_integer_rows_write_one_column_at_once(monkeypatch):
    """Guides show their anchors' starts only: for matches written as integer µs (many real
    Kineto traces), the starts are written in one call, no duration and no per-form object
    column on the way."""
    table = _table([b"1764400000000003", b"0", b"1764400000000005"], [b"12", b"0", b"1"])
    written = []
    integers = matches.integers
    monkeypatch.setattr(matches, "integers", lambda ns: written.append(len(ns)) or integers(ns))
    monkeypatch.setattr(matches, "_by_form", lambda *a: pytest.fail("written a form at a time"))
    assert table.start_texts(np.arange(3)) == [b"1764400000000003", b"0", b"1764400000000005"]
    assert written == [3]


def test_texts_of_kineto_forms_are_written_a_column_at_a_time(monkeypatch):
    """Integer-µs rows among three-decimal ones (or alone, as in real Kineto traces) are
    not written one row at a time: neither per-value writer runs."""
    table = _table([b"1764400000000003.432", b"1764400000000004", b"1764400000000005.000"],
                   [b"12.125", b"3", b"0.500"])
    assert table.take(np.arange(3))["form"].tolist() == [THREE_DECIMALS, INTEGER, THREE_DECIMALS]

    def one_at_a_time(ns):
        raise AssertionError("a value written one at a time")

    monkeypatch.setitem(matches._WRITE, THREE_DECIMALS, one_at_a_time)
    monkeypatch.setitem(matches._WRITE, INTEGER, one_at_a_time)
    assert table.texts_of(np.arange(3)) == (
        [b"1764400000000003.432", b"1764400000000004", b"1764400000000005.000"],
        [b"12.125", b"3", b"0.500"])
    assert table.ends_of(np.arange(3))[0] == [
        b"1764400000000015.557", b"1764400000000007", b"1764400000000005.500"]


def test_threes_writes_each_value_as_three_decimals():
    ns = np.array([0, 1, 999, 1000, 1001, 1764400000000003432, 12345], np.int64)
    assert threes(ns) == [_three(v) for v in ns.tolist()]
    assert threes(np.array([-1, 5], np.int64)) == [b"-0.001", b"0.005"]
    assert threes(np.zeros(0, np.int64)) == []
