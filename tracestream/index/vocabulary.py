"""The distinct kernel names of a trace per process, with their counts: what a refusal of a
pattern that matches nothing suggests instead (`plan.hints`).

The chunks count their kernels' names anyway to match the patterns (`extract_matches`), so
each sends its distinct names per pid and the main process merges them here: no second pass
over the trace (a trace on stdin is read once), and nothing per event or per match.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

MAX_NAMES = 50_000
"""At most this many (pid, name) pairs are kept, the first ones met in file order. A trace's
kernel vocabulary is a few hundred names; the cap only stops a trace with millions of
distinct names from growing memory with its size. Counts of kept names stay exact."""


class KernelVocabulary:
    """{pid: Counter of kernel names}, merged in file order and capped at `limit` names."""

    def __init__(self, limit: int = MAX_NAMES):
        self.limit = limit
        self.by_pid: dict[Any, Counter] = {}
        self.kept = 0
        self.full = False  # a name was left out: the hint says it chose among the kept ones

    def add(self, counts_by_pid: dict[Any, dict]) -> None:
        """Merge one chunk's {pid: {name: count}}."""
        for pid, counts in counts_by_pid.items():
            kept = self.by_pid.setdefault(pid, Counter())  # a pid with kernels, named or not
            before = len(kept)
            if self.kept + len(counts) <= self.limit:  # the usual case: all fit
                kept.update(counts)
            else:
                for name, n in counts.items():
                    if name in kept or len(kept) - before + self.kept < self.limit:
                        kept[name] += n
                    else:
                        self.full = True
            self.kept += len(kept) - before

    def pids(self) -> list:
        """The pids with kernels, in order of first appearance."""
        return list(self.by_pid)

    def names(self, pids=None) -> Counter:
        """The kept names and their counts on the given pids (all by default)."""
        if pids is None:
            pids = self.by_pid
        merged: Counter = Counter()
        for pid in pids:
            merged.update(self.by_pid.get(pid, ()))
        return merged
