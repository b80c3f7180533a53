"""The per-match, per-cluster and flagged rows of `anchors`, kept as columns and written as
JSON text or table cells a block at a time (millions of matches never become dicts)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat

import numpy as np
import orjson

from tracestream import _native
from tracestream.commands.evidence.readings import NO_GAP
from tracestream.commands.evidence.tables import cell_text, cell_texts
from tracestream.index.matches import AS_TEXT, INTEGER, THREE_DECIMALS, MatchView
from tracestream.index.timebase import Decimal10
from tracestream.jsontext import dumps, template_parts


class StreamedRows(Sequence):
    """Rows of a report made a batch at a time from packed columns, never held as a whole:
    `rows(start, stop)` gives rows start..stop as dicts, `json_text` their JSON text."""

    def rows(self, start: int, stop: int) -> list[dict]:
        raise NotImplementedError

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            return self.rows(start, stop)[::step] if start < stop else []
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.rows(i, i + 1)[0]

    def __iter__(self):
        for start, stop in self.batches():
            yield from self.rows(start, stop)

    def batches(self, size: int = 4096) -> Iterator[tuple[int, int]]:
        """(start, stop) of consecutive row ranges: output is streamed a batch at a time."""
        for start in range(0, len(self), size):
            yield start, min(start + size, len(self))

    def json_text(self, start: int, stop: int) -> bytes:
        """Rows start..stop as JSON text, as `dumps` writes them in a list."""
        return dumps(self.rows(start, stop))[1:-1] if start < stop else b""


class MatchRows(StreamedRows):
    """The anchors report's match rows, made a batch at a time from the packed matches.

    A 10 GB trace holds millions of anchor matches: as dicts they would take GBs,
    so `anchors` streams them to its output instead of holding them. A row is what
    `anchors --json-rows` writes on its line: every time as exact decimal text.
    """

    def __init__(self, anchors: MatchView, first: np.ndarray, origin: Decimal10 | None):
        self.anchors = anchors
        self.first = first  # each cluster's first index
        self.origin = origin if origin is not None else Decimal10(0, 0)
        self.origin_ns = self.origin.floor_ns()
        below_ns = _minus(self.origin, Decimal10(self.origin_ns, -3))
        # an origin with digits below a ns (a CPU event's ts may have them): a whole-ns
        # time is then 1 ns less than its floor difference, plus these digits below the ns
        rest = _minus(Decimal10(1, -3), below_ns)
        self._origin_complement = (decimal_text(Decimal10(rest.mantissa, rest.exponent - 3), 6)
                                   [len("0.000000"):] if below_ns.mantissa else None)

    def __len__(self) -> int:
        return len(self.anchors)

    def rows(self, start: int, stop: int) -> list[dict]:
        """Rows start..stop as dicts: each line of `json_lines` read back."""
        if start >= stop:
            return []
        return list(map(orjson.loads, self.json_lines(start, stop).split(b"\n")))

    def _times(self, start: int, stop: int) -> np.ndarray:
        """Floor ns of the starts of rows start..stop."""
        return self.anchors.table.starts[self.anchors.order[start:stop]]

    def _gaps(self, start: int, stop: int) -> np.ndarray:
        """Start-to-start gaps (ns) of rows start..stop; the first match's is NO_GAP."""
        if start:
            return np.diff(self._times(start - 1, stop))
        times = self._times(start, stop)
        gaps = np.empty(len(times), np.int64)
        gaps[1:] = np.diff(times)
        gaps[:1] = NO_GAP
        return gaps

    def _clusters(self, start: int, stop: int) -> np.ndarray:
        """The cluster of each of rows start..stop."""
        return np.searchsorted(self.first, np.arange(start, stop), "right") - 1

    def _columns(self, start: int, stop: int) -> tuple[np.ndarray, dict[str, list]]:
        """The packed rows start..stop, and the text table's columns but stream (times
        from the trace origin to the ns, as floats: the table shows them to the µs)."""
        picked = self.anchors.order[start:stop]
        rows = self.anchors.table.take(picked)
        times = self._times(start, stop)
        gaps = self._gaps(start, stop)
        first = 0 if start else 1  # the first match has no gap
        return rows, {
            "index": list(range(start, stop)),
            "dur_us": self.anchors.table.texts_of(picked, rows)[1],
            "rel_ms": list(map(round, ((times - self.origin_ns) / 1e6).tolist(), repeat(6))),
            "gap_us": [None] * first + list(
                map(round, (gaps[first:] / 1000).tolist(), repeat(3))),
            "cluster": self._clusters(start, stop).tolist(),
        }

    def table_columns(self, start: int, stop: int) -> list[list[str]]:
        """Rows start..stop as the text table's cells, a column at a time (index, t ms,
        stream, dur us, gap us, cluster)."""
        rows, c = self._columns(start, stop)
        streams = self.anchors.table.streams
        return [list(map(str, c["index"])), [f"{v:,.3f}" for v in c["rel_ms"]],
                _texts(rows["stream"], lambda code: cell_text(streams[code])),
                [t.decode() for t in c["dur_us"]],
                ["-" if v is None else f"{v:,.3f}" for v in c["gap_us"]],
                list(map(str, c["cluster"]))]

    def widest_rows(self, start: int, stop: int) -> np.ndarray:
        """Of rows start..stop, a few that hold the widest text-table cell of each column.

        A number's cell grows with its magnitude on each side of zero, so the widest
        are at the smallest and largest start (t ms), gap and duration (each number
        form apart); the last row has the largest index and cluster; one row per
        stream, and every row kept as text, make up the rest.
        """
        rows = self.anchors.table.take(self.anchors.order[start:stop])
        times, gaps = self._times(start, stop), self._gaps(start, stop)
        found = [len(rows) - 1, times.argmin(), times.argmax(), gaps.argmin(), gaps.argmax(),
                 *np.flatnonzero(rows["form"] == AS_TEXT).tolist(),
                 *np.unique(rows["stream"], return_index=True)[1].tolist()]
        for form in (THREE_DECIMALS, INTEGER):
            at = np.flatnonzero(rows["form"] == form)
            if len(at):
                durs = rows["dur"][at]
                found += [at[durs.argmin()], at[durs.argmax()]]
        return start + np.unique(np.array(found, np.int64))

    def widest_columns(self) -> Iterator[list[list[str]]]:
        """`table_columns` of only the `widest_rows` of each batch (the widths pass)."""
        for start, stop in self.batches():
            for row in self.widest_rows(start, stop).tolist():
                yield self.table_columns(row, row + 1)

    def json_lines(self, start: int, stop: int) -> bytes:
        """Rows start..stop as JSON objects, one a line (joined by newlines, none after the
        last), in one call of `_native.json_rows` (a 10 GB trace has millions of rows).

        Every time is exact decimal text: ts_us and dur_us the trace's own digits,
        rel_ms (from the trace origin) and gap_us (from the previous match) the exact
        differences, with 6 and 3 decimals (to the ns), more where the trace's digits
        go below a ns. The first match's gap_us is null.
        """
        if start >= stop:
            return b""
        if start == 0:
            head = _native.json_rows(1, _FIRST_LINE_PARTS, self._line_columns(0, 1), b"")
            return head if stop == 1 else head + b"\n" + self.json_lines(1, stop)
        return _native.json_rows(stop - start, _LINE_PARTS, self._line_columns(start, stop),
                                 b"\n")

    def _line_columns(self, start: int, stop: int) -> tuple:
        """`json_lines`' columns as `_native.json_rows` takes them (no gap column for the
        first match)."""
        table = self.anchors.table
        picked = self.anchors.order[start:stop]
        rows = table.take(picked)
        if (rows["form"] == THREE_DECIMALS).all():
            ts = (_native.FIXED, np.ascontiguousarray(rows["start"]), 3)
            dur = (_native.FIXED, np.ascontiguousarray(rows["dur"]), 3)
        elif (rows["form"] == INTEGER).all():  # whole µs: written as integers
            ts = (_native.INTEGERS, rows["start"] // 1000)
            dur = (_native.INTEGERS, rows["dur"] // 1000)
        else:
            ts_texts, dur_texts = table.texts_of(picked, rows)
            ts, dur = (_native.TEXTS, ts_texts), (_native.TEXTS, dur_texts)
        gap = () if start == 0 else (self._gap_column(start, stop),)
        return (
            (_native.INTEGERS, np.arange(start, stop, dtype=np.int64)), ts, dur,
            self._since_origin_column(start, stop),
            *gap,
            _coded(rows["stream"], table.streams.__getitem__),
            _coded(rows["track"], table.tid_of),
            (_native.INTEGERS, self._clusters(start, stop).astype(np.int64)),
            (_native.INTEGERS, np.ascontiguousarray(rows["ordinal"], np.int64)),
        )

    def _since_origin_column(self, start: int, stop: int) -> tuple:
        """rel_ms of rows start..stop: from the floor ns where the row and the origin are
        whole ns, exact where the row is kept as text (it may have digits below a ns)."""
        since = self._times(start, stop) - self.origin_ns
        as_text = self.anchors.table.as_text(self.anchors.order[start:stop])
        if self._origin_complement is None:
            if not as_text.any():
                return _native.FIXED, np.ascontiguousarray(since), 6
            texts = fixed_texts(since, 6)
        else:
            texts = [text + self._origin_complement
                     for text in fixed_texts(since - 1, 6)]
        for k in np.flatnonzero(as_text).tolist():
            texts[k] = decimal_text(self._exact_ms(start + k), 6)
        return _native.TEXTS, texts

    def _gap_column(self, start: int, stop: int) -> tuple:
        """gap_us of rows start..stop (start > 0): from the floor ns where both matches
        are whole ns, exact where either is kept as text."""
        gaps = self._gaps(start, stop)
        as_text = self.anchors.table.as_text(self.anchors.order[start - 1 : stop])
        inexact = np.flatnonzero(as_text[1:] | as_text[:-1])
        if not len(inexact):
            return _native.FIXED, np.ascontiguousarray(gaps), 3
        texts = fixed_texts(gaps, 3)
        for k in inexact.tolist():
            texts[k] = decimal_text(
                _minus(self._exact_start(start + k), self._exact_start(start + k - 1)), 3)
        return _native.TEXTS, texts

    def _exact_start(self, k: int) -> Decimal10:
        """The exact ts of match k."""
        return self.anchors[k].ts

    def _exact_ms(self, k: int) -> Decimal10:
        """The exact time of match k from the trace origin, in ms."""
        since = _minus(self._exact_start(k), self.origin)
        return Decimal10(since.mantissa, since.exponent - 3)


_LINE = (b'{"index":%d,"ts_us":"%b","dur_us":"%b","rel_ms":"%b","gap_us":"%b","stream":%b,'
         b'"tid":%b,"cluster":%d,"event":%d}')
_LINE_PARTS = template_parts(_LINE)
_FIRST_LINE_PARTS = template_parts(_LINE.replace(b'"gap_us":"%b"', b'"gap_us":null'))


def _minus(a: Decimal10, b: Decimal10) -> Decimal10:
    return a + Decimal10(-b.mantissa, b.exponent)


def decimal_text(value: Decimal10, decimals: int) -> bytes:
    """The exact text of `value` with `decimals` decimals, more only where its digits go
    further (what `fixed_texts` writes for a whole number of 10**-decimals)."""
    mantissa, exponent = value.mantissa, value.exponent
    while exponent < -decimals and mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    if exponent > -decimals:
        mantissa *= 10 ** (exponent + decimals)
        exponent = -decimals
    return Decimal10(mantissa, exponent).to_text().encode()


def fixed_texts(values: np.ndarray, decimals: int) -> list[bytes]:
    """Each integer of `values` / 10**decimals with exactly `decimals` decimals, as
    `_native.json_rows` writes a FIXED column: one formatting call for all values."""
    if not len(values):
        return []
    pairs = np.empty(2 * len(values), np.int64)
    pairs[0::2], pairs[1::2] = np.divmod(np.abs(values), 10**decimals)
    texts = ((b"%%d.%%0%dd," % decimals * len(values)) % tuple(pairs.tolist()))[:-1].split(b",")
    for k in np.flatnonzero(values < 0).tolist():
        texts[k] = b"-" + texts[k]
    return texts


def _coded(codes: np.ndarray, value_of) -> tuple:
    """A column for `_native.json_rows` of the JSON text of the value behind each code:
    each distinct code is dumped once."""
    inverse, texts = _distinct_texts(codes, lambda code: orjson.dumps(value_of(code)))
    return _native.CODED, inverse.astype(np.int64).reshape(-1), texts


def _floats(values: list) -> list[bytes]:
    """JSON text of each float (or None), as orjson writes it: one call for the column."""
    return orjson.dumps(values)[1:-1].split(b",") if values else []


def _texts(codes: np.ndarray, text_of) -> list:
    """`text_of(code)` for each code, computed once per distinct code."""
    inverse, texts = _distinct_texts(codes, text_of)
    return list(map(texts.__getitem__, inverse.tolist()))


def _distinct_texts(codes: np.ndarray, text_of) -> tuple[np.ndarray, list]:
    """(each code's position among the distinct codes, `text_of` each distinct code)."""
    distinct, inverse = np.unique(codes, return_inverse=True)
    return inverse, [text_of(code) for code in distinct.tolist()]


class ClusterRows(StreamedRows):
    """One row per cluster: its first and last match, its first match's start and its
    last match's exact end (as text: 19 digits are more than a double holds), and the
    median gap between its matches (a nightly trace has hundreds of thousands of passes:
    rows are made a batch at a time)."""

    def __init__(self, anchors: MatchView, first: np.ndarray, sizes: np.ndarray,
                 medians: np.ndarray, origin_ns: int):
        self.anchors = anchors
        self.first = first
        self.sizes = sizes
        self.medians = medians  # ns, NO_GAP for a cluster of one match
        self.origin_ns = origin_ns

    def __len__(self) -> int:
        return len(self.first)

    def _packed(self, start: int, stop: int) -> tuple:
        """(first index, last index, size, start text, end text, start ns, end ns, median
        gap ns) of clusters start..stop, a column each (numbers as int64 arrays)."""
        first = self.first[start:stop]
        sizes = self.sizes[start:stop]
        table = self.anchors.table
        starts = self.anchors.order[first]
        starts_ns = table.starts[starts]  # the floor ns of each ts
        start_texts = table.start_texts(starts)
        end_texts, ends_ns = table.ends_of(self.anchors.order[first + sizes - 1])
        return (first, first + sizes - 1, sizes, start_texts, end_texts, starts_ns,
                np.asarray(ends_ns, np.int64), self.medians[start:stop])

    def _columns(self, start: int, stop: int) -> tuple:
        """(first index, last index, size, start text, end text, start ms, span ms, median
        gap us or None) of clusters start..stop, a column each."""
        first, last, sizes, start_texts, end_texts, starts_ns, ends_ns, medians = \
            self._packed(start, stop)
        start_ms = list(map(round, ((starts_ns - self.origin_ns) / 1e6).tolist(), repeat(6)))
        span_ms = list(map(round, ((ends_ns - starts_ns) / 1e6).tolist(), repeat(6)))
        median_us = [None if v == NO_GAP else round(v / 1000, 3) for v in medians.tolist()]
        return (first.tolist(), last.tolist(), sizes.tolist(), start_texts, end_texts,
                start_ms, span_ms, median_us)

    def rows(self, start: int, stop: int) -> list[dict]:
        return [
            {"start_index": index, "last_index": last, "count": n,
             "start_us": start_text.decode(), "end_us": end_text.decode(), "start_ms": rel,
             "span_ms": span, "median_gap_us": median}
            for index, last, n, start_text, end_text, rel, span, median
            in zip(*self._columns(start, stop))
        ]

    def json_text(self, start: int, stop: int) -> bytes:
        """Rows start..stop as `dumps` writes them: in one call of `_native.json_rows` where
        it writes them (the ms and us columns as their integer ns, see
        `_native.reference.json_rows`), else one template per row."""
        if start < stop:
            first, last, sizes, start_texts, end_texts, starts_ns, ends_ns, medians = \
                self._packed(start, stop)
            text = _native.json_rows(stop - start, _CLUSTER_ROW_PARTS, (
                (_native.INTEGERS, np.ascontiguousarray(first, np.int64)),
                (_native.INTEGERS, np.ascontiguousarray(last, np.int64)),
                (_native.INTEGERS, np.ascontiguousarray(sizes, np.int64)),
                (_native.TEXTS, start_texts), (_native.TEXTS, end_texts),
                (_native.SHORTEST, starts_ns - self.origin_ns, 6),
                (_native.SHORTEST, ends_ns - starts_ns, 6),
                (_native.SHORTEST, np.ascontiguousarray(medians, np.int64), 3)), b",")
            if text is not None:
                return text
        first, last, sizes, start_texts, end_texts, start_ms, span_ms, median_us = \
            self._columns(start, stop)
        return b",".join(map(_CLUSTER_ROW.__mod__, zip(
            first, last, sizes, start_texts, end_texts, _floats(start_ms), _floats(span_ms),
            _floats(median_us))))

    def table_columns(self, start: int, stop: int) -> list[list[str]]:
        """Rows start..stop as the text table's cells (cluster, first index, last index,
        count, start ms, end ms, span ms, median gap us), a column at a time."""
        first, last, sizes, _, _, start_ms, span_ms, median_us = self._columns(start, stop)
        return [list(map(str, range(start, stop))), list(map(str, first)),
                list(map(str, last)), list(map(str, sizes)), [f"{v:,.3f}" for v in start_ms],
                [f"{a + b:,.3f}" for a, b in zip(start_ms, span_ms)],
                [f"{v:,.3f}" for v in span_ms],
                ["-" if v is None else f"{v:,.3f}" for v in median_us]]


_CLUSTER_ROW = (b'{"start_index":%d,"last_index":%d,"count":%d,"start_us":"%b","end_us":"%b",'
                b'"start_ms":%b,"span_ms":%b,"median_gap_us":%b}')
_CLUSTER_ROW_PARTS = template_parts(_CLUSTER_ROW)


class FlaggedRows(StreamedRows):
    """The cross-check's windows without exactly one match, one row each (made a batch at
    a time: with the wrong landmark, every window of millions is flagged)."""

    def __init__(self, anchors: MatchView, windows: np.ndarray, counts: np.ndarray):
        self.anchors = anchors
        self.windows = windows  # each flagged window's first anchor
        self.counts = counts

    def __len__(self) -> int:
        return len(self.windows)

    def rows(self, start: int, stop: int) -> list[dict]:
        """Rows start..stop: the window's anchors (indices, starts as exact text) and its
        count."""
        windows = self.windows[start:stop]
        table = self.anchors.table
        from_texts = table.start_texts(self.anchors.order[windows])
        to_texts = table.start_texts(self.anchors.order[windows + 1])
        return [
            {"from_index": i, "to_index": i + 1, "count": n,
             "start_us": a.decode(), "end_us": b.decode()}
            for i, n, a, b in zip(windows.tolist(), self.counts[start:stop].tolist(),
                                  from_texts, to_texts)
        ]

    def table_columns(self, start: int, stop: int) -> list[list[str]]:
        """Rows start..stop as the text table's cells (from index, to index, count, window
        start us, window end us), a column at a time."""
        batch = self.rows(start, stop)
        return [cell_texts(r[key] for r in batch)
                for key in ("from_index", "to_index", "count", "start_us", "end_us")]
