"""`inspect`'s lane occupancy: per GPU, the most activities running at once in each slice of
its time span (a one-line strip), counted in the same sweep as its peak overlap."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracestream.plan.lanes import PeakOverlap

STRIP_COLUMNS = 60
"""Time slices of a GPU's span in its occupancy strip (one character each in the text)."""


@dataclass
class LaneOccupancy:
    """One GPU's peak overlap (what compaction would need) and, per column of width
    `width_ns` from `start_ns`, the most activities running at once in it (`maxima`).

    Overlap only rises where a slice starts, so a column's maximum is the larger of
    the overlap at the slices that start in it (what the peak sweep counts for each
    slice) and the activities still running at its first nanosecond. The latter is
    counted from the sweep's carried ends at each block, for the columns that start
    up to the block's last start; `finish` counts the columns after the last start.
    Nothing is kept per slice: a block's arrays and one value per column.
    """

    start_ns: int
    width_ns: int
    maxima: np.ndarray
    peak: PeakOverlap = field(default_factory=PeakOverlap)
    counted: int = 0  # columns whose first nanosecond has been counted

    @classmethod
    def over(cls, first_ns: int, last_ns: int, columns: int = STRIP_COLUMNS) -> LaneOccupancy:
        """Columns over [first_ns, last_ns] (a GPU's earliest start and latest end bound), as
        many as `columns`, fewer only where the span has fewer nanoseconds."""
        span = max(last_ns - first_ns, 1)
        columns = min(columns, span)
        return cls(first_ns, -(-span // columns), np.zeros(columns, np.int64))

    def add_block(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Count slices in start order with bounds [lo, hi] (as PeakOverlap.add_block)."""
        if not len(lo):
            return
        carried = len(self.peak.open_ends)
        overlap, ends = self.peak.add_block(lo, hi)
        lo = np.asarray(lo, np.int64)
        column = np.minimum((lo - self.start_ns) // self.width_ns, len(self.maxima) - 1)
        np.maximum.at(self.maxima, column, overlap)
        starts = self._column_starts()
        starts = starts[: int(np.searchsorted(starts, lo[-1], "right"))]
        # at a column's start t: the slices started by t (the carried ones, the block's
        # up to t) less those ended by t (an end <= t; a later start ends after t)
        running = (carried + np.searchsorted(lo, starts, "right")
                   - np.searchsorted(ends, starts, "right"))
        self._raise(running)

    def finish(self) -> LaneOccupancy:
        """Count the columns that start after the last slice's start (what still runs)."""
        starts = self._column_starts()
        ends = self.peak.open_ends
        self._raise(len(ends) - np.searchsorted(ends, starts, "right"))
        return self

    def _column_starts(self) -> np.ndarray:
        """The first nanosecond of each column not yet counted."""
        return self.start_ns + self.width_ns * np.arange(self.counted, len(self.maxima))

    def _raise(self, running: np.ndarray) -> None:
        """Raise the next len(running) uncounted columns to at least `running`."""
        upto = self.counted + len(running)
        np.maximum(self.maxima[self.counted : upto], running, out=self.maxima[self.counted : upto])
        self.counted = upto


def lane_occupancy(sweep, spans: dict[int, tuple[int, int]],
                   columns: int = STRIP_COLUMNS) -> dict[int, LaneOccupancy]:
    """Per activity group, its peak overlap and occupancy strip over its span (`spans`:
    group -> (earliest start, latest end) bound in ns), from the read-only index's sweep
    (slices only, index.PEAK_DTYPE, in start order)."""
    states = {g: LaneOccupancy.over(first, last, columns) for g, (first, last) in spans.items()}
    for block in sweep.sorted_blocks():
        for g, state in states.items():
            mask = block["group"] == g
            if mask.any():
                state.add_block(block["key"][mask], block["hi"][mask])
    return {g: state.finish() for g, state in states.items()}
