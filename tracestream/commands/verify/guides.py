"""The guides' checks: in order, at the planned times, matching the report's rows."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

from tracestream.commands.verify.verdict import MAX_LISTED


class GuideOrder:
    """The output's guides, checked as they stream by: their count, each one against the
    one before (in time order, no overlap) and against the report's next `layers` row
    (read from the report file alongside); only the first few problems are kept.

    A chunk's guides come as columns (`observe_many`): a nightly output has 10^5-10^6 of
    them, and the main process checked each one in Python."""

    def __init__(self, rows: Iterable[dict] | None = None):
        self.count = 0
        self.problems: list[str] = []
        self.problem_count = 0
        self.row_problems: list[str] = []
        self.row_problem_count = 0
        self._rows = iter(rows) if rows is not None else None
        self._last: tuple[int, int, str] | None = None

    def observe(self, start: int, end: int, name: str) -> None:
        self.count += 1
        last, self._last = self._last, (start, end, name)
        self._compare_row(start, end, name)
        if last is None:
            return
        if start < last[0]:
            self._problem(_order_problem(name, last[2], before=True))
        elif start < last[1]:
            self._problem(_order_problem(name, last[2], before=False))

    def observe_many(self, starts: np.ndarray, ends: np.ndarray, names: list) -> None:
        """`observe` of each guide in turn (int64 start and end columns in ns, their names),
        a column at a time (lists: one at a time)."""
        if not (isinstance(starts, np.ndarray) and isinstance(ends, np.ndarray)) or (
                self._last is not None
                and not _INT64_MIN <= min(self._last[:2]) <= max(self._last[:2]) <= _INT64_MAX):
            for guide in zip(starts, ends, names):
                self.observe(*guide)
            return
        count = len(names)
        if not count:
            return
        self.count += count
        previous_starts, previous_ends = np.empty(count, np.int64), np.empty(count, np.int64)
        previous_starts[1:], previous_ends[1:] = starts[:-1], ends[:-1]
        if self._last is not None:
            previous_starts[0], previous_ends[0] = self._last[0], self._last[1]
        before = starts < previous_starts
        overlaps = ~before & (starts < previous_ends)
        if self._last is None:
            before[0] = overlaps[0] = False
        last = self._last
        for k in np.flatnonzero(before | overlaps).tolist():
            self._problem(_order_problem(names[k], names[k - 1] if k else last[2],
                                         before=bool(before[k])))
        self._last = (int(starts[-1]), int(ends[-1]), names[-1])
        rows = list(itertools.islice(self._rows, count)) if self._rows is not None else []
        if not rows:
            return
        said_starts, starts_ok = _whole_us_in_ns([row.get("guide_start_us") for row in rows])
        said_ends, ends_ok = _whole_us_in_ns([row.get("guide_end_us") for row in rows])
        described = (starts_ok & ends_ok & (said_starts == starts[: len(rows)])
                     & (said_ends == ends[: len(rows)]))
        for k in np.flatnonzero(described).tolist():
            described[k] = names[k] == f"L{rows[k].get('layer_id')}"
        for k in np.flatnonzero(~described).tolist():
            self._row_problem(rows[k], int(starts[k]), int(ends[k]), names[k])

    def _problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) <= MAX_LISTED:
            self.problems.append(text)

    def _compare_row(self, start: int, end: int, name: str) -> None:
        """The report's row of this guide must describe it (whole µs, in order)."""
        row = next(self._rows, None) if self._rows is not None else None
        if row is None:
            return
        said = (row.get("guide_start_us"), row.get("guide_end_us"), f"L{row.get('layer_id')}")
        if (start, end, name) == (said[0] * 1000 if isinstance(said[0], int) else None,
                                  said[1] * 1000 if isinstance(said[1], int) else None, said[2]):
            return
        self._row_problem(row, start, end, name)

    def _row_problem(self, row: dict, start: int, end: int, name: str) -> None:
        self.row_problem_count += 1
        if len(self.row_problems) <= MAX_LISTED:
            self.row_problems.append(
                f"the report's row L{row.get('layer_id')} (pass {row.get('pass_index')}) says "
                f"[{row.get('guide_start_us')}, {row.get('guide_end_us')}] µs, the output's "
                f"guide {name} is [{start / 1000:g}, {end / 1000:g}] µs")


def _order_problem(name: str, previous: str, *, before: bool) -> str:
    return f"guide {name} {'starts before' if before else 'overlaps'} {previous}"


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_NS_LIMIT = ((1 << 63) - 1) // 1000  # whole µs whose ns fit in int64 (either sign)


def _whole_us_in_ns(values: list) -> tuple[np.ndarray, np.ndarray]:
    """The report's whole-µs values in ns as int64, and which are ints (`observe`'s
    isinstance: a bool is one) whose ns fit; the others (absent, floats, text) match no
    guide, as a Python int out of int64 range matches none."""
    try:
        column = np.array(values) if values else np.zeros(0, np.int64)
    except (ValueError, TypeError, OverflowError):  # (ragged arrays)
        column = np.zeros((0, 0))
    if column.ndim == 1 and column.dtype.kind in "biu" and (
            (column <= _NS_LIMIT) & (column >= -_NS_LIMIT)).all():
        return column.astype(np.int64) * 1000, np.ones(len(values), bool)
    ns, ok = np.zeros(len(values), np.int64), np.zeros(len(values), bool)
    for k, value in enumerate(values):
        if isinstance(value, int) and -_NS_LIMIT <= value <= _NS_LIMIT:
            ns[k], ok[k] = value * 1000, True
    return ns, ok
