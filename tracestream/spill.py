"""Packed records that stay within a memory budget: in RAM, or spilled to a temp file.

The index pass appends numpy structured batches. Up to `budget` bytes stay in
memory; past that, batches go to disk as runs (sorted first when the store has
sort keys). The plan reads them back in file order, or in global key order
through a vectorised k-way merge of the runs, a block at a time, so a 10 GB
trace's per-event records never need to fit in memory at once.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import numpy as np

from tracestream.errors import TraceError

DEFAULT_BUDGET = 8 << 20
BLOCK = 1 << 13  # rows read at a time (per run while merging, when there are few runs)
MERGE_BYTES = 8 << 20  # what the merge's read blocks may hold together, however many runs


def take_rows(records: np.ndarray, which: np.ndarray) -> np.ndarray:
    """records[which] (indices or a mask) for a structured array, copied as whole rows.

    numpy gathers structured records field by field; as opaque fixed-size rows
    the same gather is several times faster.
    """
    rows = records.view(np.dtype((np.void, records.dtype.itemsize)))
    return rows[which].view(records.dtype)


class RecordStore:
    def __init__(self, dtype, *, sort_keys: tuple[str, str] | None = None,
                 budget: int = DEFAULT_BUDGET, tmpdir: str | None = None):
        self.dtype = np.dtype(dtype)
        self.sort_keys = sort_keys
        self.budget = budget
        self.tmpdir = tmpdir
        self._pending: list[np.ndarray] = []
        self._pending_bytes = 0
        self._runs: list[tuple[int, int]] = []  # (first record, record count) in the spill
        self._file = None
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def spilled(self) -> bool:
        return bool(self._runs)

    def append(self, batch: np.ndarray) -> None:
        if not len(batch):
            return
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        self._count += len(batch)
        if self._pending_bytes >= self.budget:
            self._spill()

    def _sorted(self, data: np.ndarray) -> np.ndarray:
        if self.sort_keys is None:
            return data
        primary, secondary = self.sort_keys
        return take_rows(data, np.lexsort((data[secondary], data[primary])))

    def _spill(self) -> None:
        data = np.concatenate(self._pending) if len(self._pending) > 1 else self._pending[0]
        self._pending = []
        self._pending_bytes = 0
        data = self._sorted(data)
        try:
            if self._file is None:
                self._file = tempfile.TemporaryFile(prefix="tracestream-spill-", dir=self.tmpdir)
            first = sum(count for _, count in self._runs)
            self._file.seek(first * self.dtype.itemsize)
            self._file.write(np.ascontiguousarray(data).data)
            self._file.flush()
        except OSError as exc:  # a full disk is bad luck, not a bug: say so in one line
            folder = self.tmpdir or tempfile.gettempdir()
            raise TraceError(f"cannot spill index records to a temporary file in {folder}: "
                             f"{exc.strerror or exc}; nothing was written") from None
        self._runs.append((first, len(data)))

    def _read(self, first: int, count: int) -> np.ndarray:
        self._file.seek(first * self.dtype.itemsize)
        raw = self._file.read(count * self.dtype.itemsize)
        return np.frombuffer(raw, dtype=self.dtype)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._pending = []

    def batches(self) -> Iterator[np.ndarray]:
        """All records in append order (only for stores without sort keys)."""
        assert self.sort_keys is None
        for first, count in self._runs:
            for start in range(first, first + count, BLOCK):
                yield self._read(start, min(BLOCK, first + count - start))
        yield from self._pending

    def sorted_blocks(self) -> Iterator[np.ndarray]:
        """All records in (primary, secondary) order, a block at a time."""
        assert self.sort_keys is not None
        if self._pending:
            if self._runs:
                self._spill()
            else:
                data = np.concatenate(self._pending)
                data = self._sorted(data)
                for start in range(0, len(data), BLOCK):
                    yield data[start : start + BLOCK]
                return
        yield from _merge_runs(self, self.sort_keys)


def _merge_runs(store: RecordStore, keys: tuple[str, str]) -> Iterator[np.ndarray]:
    primary, secondary = keys
    cursors = [[first, first + count, None] for first, count in store._runs]
    # a 10 GB trace spills a few hundred runs: their blocks share one budget, so the
    # merge's memory stays flat as the trace grows
    rows = max(64, min(BLOCK, MERGE_BYTES // (max(len(cursors), 1) * store.dtype.itemsize)))

    def load(cursor):
        start, stop, _ = cursor
        cursor[2] = store._read(start, min(rows, stop - start)) if start < stop else None

    for cursor in cursors:
        load(cursor)
    while True:
        active = [c for c in cursors if c[2] is not None and len(c[2])]
        if not active:
            return
        bound = min((c[2][primary][-1], c[2][secondary][-1]) for c in active)
        taken = []
        for cursor in active:
            block = cursor[2]
            n = _count_le(block[primary], block[secondary], bound)
            if n:
                taken.append(block[:n])
                cursor[0] += n
                if n == len(block):
                    load(cursor)
                else:
                    cursor[2] = block[n:]
        merged = np.concatenate(taken)
        yield take_rows(merged, np.lexsort((merged[secondary], merged[primary])))


def _count_le(first: np.ndarray, second: np.ndarray, bound) -> int:
    """How many leading records of a sorted block are <= bound (lexicographic)."""
    bk, bt = bound
    i = int(np.searchsorted(first, bk, "left"))
    j = int(np.searchsorted(first, bk, "right"))
    return i + int(np.searchsorted(second[i:j], bt, "right"))


def temp_dir_for(path) -> str | None:
    """Spill next to the output when possible (same disk the user chose), else the default."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    return folder if os.access(folder, os.W_OK) else None
