"""Guide events and report rows, written from the guide columns a block at a time.

A nightly job labels every pass (10^5-10^6 guides). The plan keeps them as
columns (`guides.GuideTable`); the rewrite pass writes their events and the
report writer their rows from those columns, a block at a time, so nothing
per guide stays in memory. The bytes are those `jsontext.dumps` and
`jsontext.dumps_pretty` write for the same values: the templates below are made
by those very functions, with placeholders for the values.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import numpy as np
import orjson

from tracestream import _native
from tracestream.jsontext import RawNumber, dumps, pretty_item, template_parts
from tracestream.plan.guides import BOUNDARY_KINDS, GuideBlock, GuideTable
from tracestream.plan.specs import GUIDE_NOTICE, LayerSpec

REPORT_ROW_FIELDS = ("pass_index", "layer_id", "anchor_index", "anchor_name", "anchor_tid",
                     "start_us", "end_us", "guide_start_us", "guide_end_us",
                     "start_relative_ms", "end_relative_ms", "boundary_kind")
"""The fields of a report's `layers` rows, in order."""
_INTEGERS = {"pass_index", "layer_id", "anchor_index", "guide_start_us", "guide_end_us"}
ROWS_DEPTH = 2
"""How deep the `layers` rows sit in the report (report object, `layers` list, row)."""

_EVENT = dumps({
    "ph": "X", "cat": "layer_guide", "name": RawNumber('"L%d"'), "pid": RawNumber("%b"),
    "tid": RawNumber("%b"), "ts": RawNumber("%d"), "dur": RawNumber("%d"),
    "args": {
        "pass_index": RawNumber("%d"), "layer_id": RawNumber("%d"),
        "anchor_index": RawNumber("%d"), "anchor_name": RawNumber("%b"),
        "anchor_tid": RawNumber("%b"), "start_us": RawNumber("%b"),
        "end_us": RawNumber("%b"), "boundary_kind": RawNumber("%b"),
        "phase": RawNumber("%b"), "evidence": RawNumber("%b"), "notice": RawNumber("%b"),
    },
})
"""A guide event as `dumps` writes it, values left open."""

_ROW = pretty_item({field: RawNumber("%d" if field in _INTEGERS else "%b")
                    for field in REPORT_ROW_FIELDS}, ROWS_DEPTH)
"""A report row as `dumps_pretty` writes it inside the report, values left open."""

_KINDS = [orjson.dumps(kind) for kind in BOUNDARY_KINDS]
_ROW_PAD = b"  " * ROWS_DEPTH
_EVENT_PARTS = template_parts(_EVENT)
_ROW_PARTS = template_parts(_ROW)
_ROW_PARTS_PADDED = (_ROW_PAD + _ROW_PARTS[0], *_ROW_PARTS[1:])
"""The templates around their values, for the C extension's json_rows (a row indented
as it sits in the report)."""


class _Labels:
    """The JSON text of each anchor's name and tid, made once per distinct value."""

    def __init__(self, guides: GuideTable):
        self.table = guides.anchors.table
        self._names: dict[int, bytes] = {}
        self._tids: dict[int, bytes] = {}

    def name(self, i: int) -> bytes:
        text = self._names.get(i)
        if text is None:
            text = self._names[i] = orjson.dumps(self.table.names[i])
        return text

    def tid(self, track: int) -> bytes:
        text = self._tids.get(track)
        if text is None:
            text = self._tids[track] = orjson.dumps(self.table.tid_of(track))
        return text

    def names(self, block: GuideBlock) -> list[bytes]:
        return list(map(self.name, block.anchor_name.tolist()))

    def tids(self, block: GuideBlock) -> list[bytes]:
        return list(map(self.tid, block.anchor_track.tolist()))

    def coded_names(self, block: GuideBlock) -> tuple[np.ndarray, list[bytes]]:
        """`names` as the C extension's CODED column takes them: a code per guide into
        the texts of the block's distinct names (no list entry per guide)."""
        ids, codes = np.unique(block.anchor_name, return_inverse=True)
        return _int64(codes), list(map(self.name, ids.tolist()))

    def coded_tids(self, block: GuideBlock) -> tuple[np.ndarray, list[bytes]]:
        """`tids` as a CODED column (see coded_names)."""
        ids, codes = np.unique(block.anchor_track, return_inverse=True)
        return _int64(codes), list(map(self.tid, ids.tolist()))


class GuideEvents:
    """The guide events of one plan (`Plan.appended` writes them after the metadata)."""

    def __init__(self, guides: GuideTable, pid: Any, tid: Any, spec: LayerSpec):
        self.guides = guides
        self._fixed = (orjson.dumps(pid), orjson.dumps(tid), orjson.dumps(spec.phase),
                       orjson.dumps(spec.evidence), orjson.dumps(GUIDE_NOTICE))

    def __len__(self) -> int:
        return len(self.guides)

    def texts(self) -> Iterator[bytes]:
        """Each block's events as the trace holds them, joined by ",\\n" (never split
        into one object per guide)."""
        labels = _Labels(self.guides)
        for block in self.guides.blocks():
            yield self.block_text(block, labels)

    def texts_with_rows(self, rows: GuideRows) -> Iterator[tuple[bytes, bytes]]:
        """Each block's events (as `texts`) and its report rows (as `rows.pretty_blocks`),
        both made from one read of the block's columns: a run that writes the two at once
        reads and formats each guide's anchor rows, times and texts once, not twice."""
        if rows.guides is not self.guides:
            raise ValueError("the report rows are not of these guides")
        labels = _Labels(self.guides)
        for block in self.guides.blocks():
            yield self.block_text(block, labels), rows.block_text(block, labels)

    def block_text(self, block: GuideBlock, labels: _Labels) -> bytes:
        """One block's events, joined by ",\\n"."""
        return _native.json_rows(len(block.kind), _EVENT_PARTS, self._event_columns(block, labels),
                                 b",\n")

    def blocks(self) -> Iterator[list[bytes]]:
        """Each block's events, one bytes each (a raw newline is never inside a JSON
        string, so the events split at theirs; the joined text is freed once split)."""
        return map(_split_events, self.texts())

    def _event_columns(self, block: GuideBlock, labels: _Labels) -> tuple:
        """The columns of _EVENT's values, as `_native.json_rows` takes them."""
        same = np.zeros(len(block.kind), np.int64)  # the code of a value every guide shares
        pid, tid, phase, evidence, notice = ((_native.CODED, same, [text]) for text in self._fixed)
        layer = (_native.INTEGERS, _int64(block.layer_id))
        start, end = _int64(block.guide_start_us), _int64(block.guide_end_us)
        return (layer, pid, tid, (_native.INTEGERS, start), (_native.INTEGERS, end - start),
                (_native.INTEGERS, _int64(block.pass_index)), layer,
                (_native.INTEGERS, _int64(block.anchor_index)),
                (_native.CODED, *labels.coded_names(block)),
                (_native.CODED, *labels.coded_tids(block)),
                (_native.TEXTS, block.start_text), (_native.TEXTS, block.end_text),
                (_native.CODED, _int64(block.kind), _KINDS), phase, evidence, notice)


_split_events = operator.methodcaller("split", b",\n")


def _int64(column: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(column, np.int64)


class GuideRows:
    """The report's `layers` rows, written a block at a time as the report is written
    (see jsontext.write_pretty); keeps the first and the last row for the summary."""

    def __init__(self, guides: GuideTable, origin_ns: int):
        self.guides = guides
        self.origin_ns = origin_ns
        self.first: dict | None = None
        self.last: dict | None = None

    def __len__(self) -> int:
        return len(self.guides)

    def pretty_blocks(self, depth: int) -> Iterator[bytes]:
        """The rows of each block, indented for `depth` and joined by ",\\n"."""
        if depth != ROWS_DEPTH:
            raise ValueError(f"report rows sit at depth {ROWS_DEPTH}, not {depth}")
        labels = _Labels(self.guides)
        for block in self.guides.blocks():
            yield self.block_text(block, labels)

    def block_text(self, block: GuideBlock, labels: _Labels) -> bytes:
        """One block's rows, indented for ROWS_DEPTH and joined by ",\\n"; keeps the first
        row of the first block and the last row of the last (the blocks come in order)."""
        text = self._joined_rows(block, labels)
        if self.first is None:
            self.first = self._row_at(block, labels, 0)
        if self._ends_the_table(block):
            self.last = self._row_at(block, labels, len(block.kind) - 1)
        return text

    def _ends_the_table(self, block: GuideBlock) -> bool:
        """Whether the block's last guide is the last guide (its row is the summary's)."""
        spec, guides = self.guides.spec, self.guides
        number = (int(block.pass_index[-1]) * spec.num_layers
                  + int(block.layer_id[-1]) - spec.first_layer)
        return number == guides.first + len(guides) - 1

    def _joined_rows(self, block: GuideBlock, labels: _Labels) -> bytes:
        """The block's rows joined, by `_native.json_rows`. Where it cannot write a relative
        ms itself (it declines one, or the times lie too far from the origin: see
        relative_ms_column), it takes them as the texts Python writes."""
        starts, ends = _offsets(block.start_floor_ns, self.origin_ns), _offsets(
            block.end_floor_ns, self.origin_ns)
        columns = [
            (_native.INTEGERS, _int64(block.pass_index)),
            (_native.INTEGERS, _int64(block.layer_id)),
            (_native.INTEGERS, _int64(block.anchor_index)),
            (_native.CODED, *labels.coded_names(block)),
            (_native.CODED, *labels.coded_tids(block)),
            (_native.TEXTS, block.start_text),
            (_native.TEXTS, block.end_text), (_native.INTEGERS, _int64(block.guide_start_us)),
            (_native.INTEGERS, _int64(block.guide_end_us)), (_native.SHORTEST, starts, 6),
            (_native.SHORTEST, ends, 6), (_native.CODED, _int64(block.kind), _KINDS)]
        text = None
        if starts is not None and ends is not None:
            text = _native.json_rows(len(block.kind), _ROW_PARTS_PADDED, tuple(columns), b",\n")
        if text is None:
            columns[9] = (_native.TEXTS, self._relative_ms(block.start_floor_ns))
            columns[10] = (_native.TEXTS, self._relative_ms(block.end_floor_ns))
            text = _native.json_rows(len(block.kind), _ROW_PARTS_PADDED, tuple(columns), b",\n")
        return text

    def _row_at(self, block: GuideBlock, labels: _Labels, k: int) -> dict:
        """Row k of the block, as the report holds it (for the summary)."""
        at = slice(k, k + 1)
        one = GuideBlock(*(getattr(block, f.name)[at] for f in fields(GuideBlock)))
        return _row((int(one.pass_index[0]), int(one.layer_id[0]), int(one.anchor_index[0]),
                     labels.names(one)[0], labels.tids(one)[0], one.start_text[0],
                     one.end_text[0], int(one.guide_start_us[0]), int(one.guide_end_us[0]),
                     *self._relative_ms(one.start_floor_ns), *self._relative_ms(one.end_floor_ns),
                     _KINDS[int(one.kind[0])]))

    def _relative_ms(self, ns) -> list[bytes]:
        """Planner.relative_ms of a column, as orjson writes each float."""
        return orjson.dumps(relative_ms_column(ns, self.origin_ns))[1:-1].split(b",")


_ROUND_IS_EXACT_NS = 1 << 50
"""Below this many ns from the origin (13 days), round(k / 1e6, 6) is k / 1e6 itself."""
_INT64_SAFE = 1 << 62  # values whose differences fit in int64


def _offsets(ns: np.ndarray, origin_ns: int) -> np.ndarray | None:
    """ns - origin_ns as int64 where every value lies within 2^50 ns of the origin (where
    the C extension's SHORTEST writes round(k / 1e6, 6) as relative_ms_column does)."""
    if not (len(ns) and -_INT64_SAFE < origin_ns < _INT64_SAFE
            and -_INT64_SAFE < int(ns.min()) and int(ns.max()) < _INT64_SAFE):
        return None
    offsets = ns.astype(np.int64) - origin_ns
    return offsets if int(np.abs(offsets).max()) < _ROUND_IS_EXACT_NS else None


def relative_ms_column(ns: np.ndarray, origin_ns: int) -> list[float]:
    """[Planner.relative_ms(n) for n in ns], i.e. round((n - origin) / 1e6, 6), divided
    in numpy where the rounding cannot change the quotient.

    For an integer k below 2^53, k / 1e6 is the double nearest the decimal k/10^6
    (k converts exactly, the division rounds once). Below 2^50 ns (2^30 ms) it is
    within half an ulp, at most 2^-23 ms, of that decimal, so rounding it to 6
    decimals gives back the decimal, whose nearest double is the quotient. Further
    from the origin each value is rounded as before.
    """
    offsets = _offsets(ns, origin_ns)
    if offsets is not None:
        return (offsets / 1e6).tolist()
    return [round((n - origin_ns) / 1e6, 6) for n in ns.tolist()]


def _row(values: tuple) -> dict:
    """One row's values as the report holds them (for the summary)."""
    row = {}
    for field, value in zip(REPORT_ROW_FIELDS, values):
        if isinstance(value, bytes):
            value = RawNumber(value.decode()) if field in ("start_us", "end_us") else (
                orjson.loads(value))
        row[field] = value
    return row
