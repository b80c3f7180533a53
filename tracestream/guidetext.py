"""Guide events and report rows, written from the guide columns a block at a time.

A nightly job labels every pass (10^5-10^6 guides). The plan keeps them as
columns (`guides.GuideTable`); the rewrite pass writes their events and the
report writer their rows from those columns, a block at a time, so nothing
per guide stays in memory. The bytes are those `jsontext.dumps` and
`jsontext.dumps_pretty` write for the same values: the templates below are made
by those very functions, with placeholders for the values.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from tracestream.guides import BOUNDARY_KINDS, GUIDE_NOTICE, GuideBlock, GuideTable, LayerSpec
from tracestream.jsontext import RawNumber, dumps, pretty_item

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


class _Labels:
    """The JSON text of each anchor's name and tid, made once per distinct value."""

    def __init__(self, guides: GuideTable):
        self.table = guides.anchors.table
        self._names: dict[int, bytes] = {}
        self._tids: dict[int, bytes] = {}

    def names(self, block: GuideBlock) -> list[bytes]:
        ids = block.anchor_name.tolist()
        return [self._names.get(i) or self._names.setdefault(
            i, orjson.dumps(self.table.names[i])) for i in ids]

    def tids(self, block: GuideBlock) -> list[bytes]:
        tracks = block.anchor_track.tolist()
        return [self._tids.get(t) or self._tids.setdefault(
            t, orjson.dumps(self.table.tid_of(t))) for t in tracks]


class GuideEvents:
    """The guide events of one plan (`Plan.appended` writes them after the metadata)."""

    def __init__(self, guides: GuideTable, pid: Any, tid: Any, spec: LayerSpec):
        self.guides = guides
        self._fixed = (orjson.dumps(pid), orjson.dumps(tid), orjson.dumps(spec.phase),
                       orjson.dumps(spec.evidence), orjson.dumps(GUIDE_NOTICE))

    def __len__(self) -> int:
        return len(self.guides)

    def blocks(self) -> Iterator[list[bytes]]:
        pid, tid, phase, evidence, notice = self._fixed
        labels = _Labels(self.guides)
        for block in self.guides.blocks():
            columns = zip(block.layer_id.tolist(), block.guide_start_us.tolist(),
                          block.guide_end_us.tolist(), block.pass_index.tolist(),
                          block.anchor_index.tolist(), labels.names(block), labels.tids(block),
                          block.start_text, block.end_text, block.kind.tolist())
            yield [_EVENT % (layer, pid, tid, start, end - start, p, layer, index, name,
                             anchor_tid, start_text, end_text, _KINDS[kind], phase, evidence,
                             notice)
                   for (layer, start, end, p, index, name, anchor_tid, start_text, end_text,
                        kind) in columns]


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
        pad = b"  " * depth
        for block in self.guides.blocks():
            columns = list(zip(
                block.pass_index.tolist(), block.layer_id.tolist(), block.anchor_index.tolist(),
                labels.names(block), labels.tids(block), block.start_text, block.end_text,
                block.guide_start_us.tolist(), block.guide_end_us.tolist(),
                self._relative_ms(block.start_floor_ns), self._relative_ms(block.end_floor_ns),
                [_KINDS[k] for k in block.kind.tolist()]))
            if self.first is None:
                self.first = _row(columns[0])
            self.last = _row(columns[-1])
            yield b",\n".join([pad + _ROW % values for values in columns])

    def _relative_ms(self, ns) -> list[bytes]:
        """Planner.relative_ms of a column, as orjson writes each float."""
        return orjson.dumps(relative_ms_column(ns, self.origin_ns))[1:-1].split(b",")


_ROUND_IS_EXACT_NS = 1 << 50
"""Below this many ns from the origin (13 days), round(k / 1e6, 6) is k / 1e6 itself."""
_INT64_SAFE = 1 << 62  # values whose differences fit in int64


def relative_ms_column(ns: np.ndarray, origin_ns: int) -> list[float]:
    """[Planner.relative_ms(n) for n in ns], i.e. round((n - origin) / 1e6, 6), divided
    in numpy where the rounding cannot change the quotient.

    For an integer k below 2^53, k / 1e6 is the double nearest the decimal k/10^6
    (k converts exactly, the division rounds once). Below 2^50 ns (2^30 ms) it is
    within half an ulp, at most 2^-23 ms, of that decimal, so rounding it to 6
    decimals gives back the decimal, whose nearest double is the quotient. Further
    from the origin each value is rounded as before.
    """
    if len(ns) and -_INT64_SAFE < origin_ns < _INT64_SAFE and (
            -_INT64_SAFE < int(ns.min()) and int(ns.max()) < _INT64_SAFE):
        offsets = ns.astype(np.int64) - origin_ns
        if int(np.abs(offsets).max()) < _ROUND_IS_EXACT_NS:
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
