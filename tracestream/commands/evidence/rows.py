"""The per-match, per-cluster and flagged rows of `anchors`, kept as columns and written as
JSON text a block at a time (millions of matches never become dicts)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat

import numpy as np
import orjson

from tracestream import _native
from tracestream.commands.evidence.readings import NO_GAP
from tracestream.commands.evidence.tables import cell_text
from tracestream.index.matches import AS_TEXT, INTEGER, THREE_DECIMALS, MatchView
from tracestream.jsontext import RawNumber, dumps, template_parts


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
    so `anchors` streams them to its output instead of holding them.
    """

    def __init__(self, anchors: MatchView, first: np.ndarray, origin_ns: int):
        self.anchors = anchors
        self.first = first  # each cluster's first index
        self.origin_ns = origin_ns

    def __len__(self) -> int:
        return len(self.anchors)

    def rows(self, start: int, stop: int) -> list[dict]:
        columns = self.columns(start, stop)
        rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
        for row in rows:
            row["ts_us"] = RawNumber(row["ts_us"].decode())
            row["dur_us"] = RawNumber(row["dur_us"].decode())
        return rows

    def columns(self, start: int, stop: int) -> dict[str, list]:
        """Rows start..stop a column at a time, exact times as bytes: no dict, Match or
        RawNumber per row (`self[i]` is row i of this)."""
        table = self.anchors.table
        rows, c = self._columns(start, stop)
        return {**{k: c[k] for k in ("index", "ts_us", "dur_us", "rel_ms", "gap_us")},
                "stream": [table.streams[s] for s in rows["stream"].tolist()],
                "tid": [table.tid_of(t) for t in rows["track"].tolist()],
                "cluster": c["cluster"], "event": c["event"]}

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
        """The packed rows start..stop, and every column but stream and tid."""
        table = self.anchors.table
        picked = self.anchors.order[start:stop]
        rows = table.take(picked)
        ts_texts, dur_texts = table.texts_of(picked, rows)
        times = self._times(start, stop)
        gaps = self._gaps(start, stop)
        first = 0 if start else 1  # the first match has no gap
        return rows, {
            "index": list(range(start, stop)),
            "ts_us": ts_texts,
            "dur_us": dur_texts,
            "rel_ms": list(map(round, ((times - self.origin_ns) / 1e6).tolist(), repeat(6))),
            "gap_us": [None] * first + list(
                map(round, (gaps[first:] / 1000).tolist(), repeat(3))),
            "cluster": self._clusters(start, stop).tolist(),
            "event": rows["ordinal"].tolist(),
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

    def json_rows(self, start: int, stop: int) -> list[bytes]:
        """Rows start..stop as JSON objects (`self[i]` with its exact numbers spliced in as
        their text)."""
        if start >= stop:
            return []
        table = self.anchors.table
        rows, c = self._columns(start, stop)
        return list(map(_ROW.__mod__, zip(
            c["index"], c["ts_us"], c["dur_us"], _floats(c["rel_ms"]), _floats(c["gap_us"]),
            _dumped(rows["stream"], table.streams.__getitem__),
            _dumped(rows["track"], table.tid_of), c["cluster"], c["event"])))

    def json_text(self, start: int, stop: int) -> bytes:
        """Rows start..stop as JSON text, `b", ".join(self.json_rows(start, stop))`: in one
        call of `_native.json_rows` where it writes them (a 10 GB trace has millions of
        rows)."""
        if start < stop:
            text = _native.json_rows(stop - start, _ROW_PARTS, self._row_columns(start, stop),
                                     b", ")
            if text is not None:
                return text
        return b", ".join(self.json_rows(start, stop))

    def _row_columns(self, start: int, stop: int) -> tuple:
        """`json_rows`' columns as `_native.json_rows` takes them.

        rel_ms and gap_us go as their integer ns: `round(k / 1e6, 6)` of an integer k is
        the double nearest k / 10**6 (the division already is, and rounding it to six
        decimals gives it back while |k| < 2**53), so orjson's shortest text of it is
        that decimal itself wherever the C extension writes it (see its json_rows).
        """
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
        return (
            (_native.INTEGERS, np.arange(start, stop, dtype=np.int64)), ts, dur,
            (_native.SHORTEST, self._times(start, stop) - self.origin_ns, 6),
            (_native.SHORTEST, self._gaps(start, stop), 3),  # NO_GAP is written as null
            _coded(rows["stream"], table.streams.__getitem__),
            _coded(rows["track"], table.tid_of),
            (_native.INTEGERS, self._clusters(start, stop).astype(np.int64)),
            (_native.INTEGERS, np.ascontiguousarray(rows["ordinal"], np.int64)),
        )


_ROW = (b'{"index": %d, "ts_us": %b, "dur_us": %b, "rel_ms": %b, "gap_us": %b, "stream": %b, '
        b'"tid": %b, "cluster": %d, "event": %d}')
_ROW_PARTS = template_parts(_ROW)


def _coded(codes: np.ndarray, value_of) -> tuple:
    """`_dumped` as a column for `_native.json_rows`: the texts by code."""
    inverse, texts = _distinct_texts(codes, lambda code: orjson.dumps(value_of(code)))
    return _native.CODED, inverse.astype(np.int64).reshape(-1), texts


def _floats(values: list) -> list[bytes]:
    """JSON text of each float (or None), as orjson writes it: one call for the column."""
    return orjson.dumps(values)[1:-1].split(b",") if values else []


def _dumped(codes: np.ndarray, value_of) -> list[bytes]:
    """JSON text of the value behind each code; each distinct code is dumped once."""
    return _texts(codes, lambda code: orjson.dumps(value_of(code)))


def _texts(codes: np.ndarray, text_of) -> list:
    """`text_of(code)` for each code, computed once per distinct code."""
    inverse, texts = _distinct_texts(codes, text_of)
    return list(map(texts.__getitem__, inverse.tolist()))


def _distinct_texts(codes: np.ndarray, text_of) -> tuple[np.ndarray, list]:
    """(each code's position among the distinct codes, `text_of` each distinct code)."""
    distinct, inverse = np.unique(codes, return_inverse=True)
    return inverse, [text_of(code) for code in distinct.tolist()]


class ClusterRows(StreamedRows):
    """One row per cluster: its first match's start and its last match's exact end (a
    nightly trace has hundreds of thousands of passes: rows are made a batch at a time)."""

    def __init__(self, anchors: MatchView, first: np.ndarray, sizes: np.ndarray,
                 origin_ns: int):
        self.anchors = anchors
        self.first = first
        self.sizes = sizes
        self.origin_ns = origin_ns

    def __len__(self) -> int:
        return len(self.first)

    def _packed(self, start: int, stop: int) -> tuple:
        """(first index, size, start text, end text, start ns, end ns) of clusters
        start..stop, a column each (numbers as int64 arrays)."""
        first = self.first[start:stop]
        sizes = self.sizes[start:stop]
        table = self.anchors.table
        starts = self.anchors.order[first]
        starts_ns = table.starts[starts]  # the floor ns of each ts
        start_texts = table.start_texts(starts)
        end_texts, ends_ns = table.ends_of(self.anchors.order[first + sizes - 1])
        return first, sizes, start_texts, end_texts, starts_ns, np.asarray(ends_ns, np.int64)

    def _columns(self, start: int, stop: int) -> tuple:
        """(first index, size, start text, end text, start ms, span ms) of clusters
        start..stop, a column each."""
        first, sizes, start_texts, end_texts, starts_ns, ends_ns = self._packed(start, stop)
        start_ms = list(map(round, ((starts_ns - self.origin_ns) / 1e6).tolist(), repeat(6)))
        span_ms = list(map(round, ((ends_ns - starts_ns) / 1e6).tolist(), repeat(6)))
        return first.tolist(), sizes.tolist(), start_texts, end_texts, start_ms, span_ms

    def rows(self, start: int, stop: int) -> list[dict]:
        return [
            {"start_index": index, "count": n, "start_us": RawNumber(start_text.decode()),
             "end_us": RawNumber(end_text.decode()), "start_ms": rel, "span_ms": span}
            for index, n, start_text, end_text, rel, span in zip(*self._columns(start, stop))
        ]

    def json_text(self, start: int, stop: int) -> bytes:
        """Rows start..stop as `dumps` writes them: in one call of `_native.json_rows` where
        it writes them (the ms columns as their integer ns, see MatchRows._row_columns),
        else one template per row."""
        if start < stop:
            first, sizes, start_texts, end_texts, starts_ns, ends_ns = self._packed(start, stop)
            text = _native.json_rows(stop - start, _CLUSTER_ROW_PARTS, (
                (_native.INTEGERS, np.ascontiguousarray(first, np.int64)),
                (_native.INTEGERS, np.ascontiguousarray(sizes, np.int64)),
                (_native.TEXTS, start_texts), (_native.TEXTS, end_texts),
                (_native.SHORTEST, starts_ns - self.origin_ns, 6),
                (_native.SHORTEST, ends_ns - starts_ns, 6)), b", ")
            if text is not None:
                return text
        first, sizes, start_texts, end_texts, start_ms, span_ms = self._columns(start, stop)
        return b", ".join(map(_CLUSTER_ROW.__mod__, zip(
            first, sizes, start_texts, end_texts, _floats(start_ms), _floats(span_ms))))

    def table_columns(self, start: int, stop: int) -> list[list[str]]:
        """Rows start..stop as the text table's cells (cluster, first index, count,
        start ms, span ms), a column at a time."""
        first, sizes, _, _, start_ms, span_ms = self._columns(start, stop)
        return [list(map(str, range(start, stop))), list(map(str, first)),
                list(map(str, sizes)), [f"{v:,.3f}" for v in start_ms],
                [f"{v:,.3f}" for v in span_ms]]


_CLUSTER_ROW = (b'{"start_index": %d, "count": %d, "start_us": %b, "end_us": %b, '
                b'"start_ms": %b, "span_ms": %b}')
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
        windows = self.windows[start:stop]
        table = self.anchors.table
        from_texts = table.start_texts(self.anchors.order[windows])
        to_texts = table.start_texts(self.anchors.order[windows + 1])
        return [
            {"from_index": i, "to_index": i + 1, "count": n,
             "start_us": RawNumber(a.decode()), "end_us": RawNumber(b.decode())}
            for i, n, a, b in zip(windows.tolist(), self.counts[start:stop].tolist(),
                                  from_texts, to_texts)
        ]
