"""The greedy lane allocator and the record store it reads from."""

import numpy as np
import pytest

from tracestream.lanes import allocate, peak_overlap
from tracestream.spill import RecordStore


def _sorted(lo, hi):
    order = np.argsort(lo, kind="stable")
    return lo[order], hi[order]


def test_touching_slices_share_a_lane():
    lanes, count, _ = allocate([0, 10, 20], [10, 20, 30])
    assert count == 1 and lanes == [0, 0, 0]


def test_lane_is_the_one_that_ended_earliest():
    # three overlapping, then one starting after all ended -> the earliest-ending lane
    lanes, count, peak_at = allocate([0, 1, 2, 50], [40, 10, 30, 60])
    assert count == 3 and peak_at == 2
    assert lanes[3] == 1  # lane 1 ended at 10, the earliest


def test_nested_slices_take_separate_lanes():
    lanes, count, _ = allocate([0, 5, 6], [100, 50, 7])
    assert count == 3 and len(set(lanes)) == 3


def test_zero_length_slices():
    lanes, count, _ = allocate([5, 5, 5], [5, 5, 5])
    assert count == 1


@pytest.mark.parametrize("seed", range(20))
def test_lane_count_equals_peak_overlap_and_lanes_never_overlap(seed):
    rng = np.random.default_rng(seed)
    n = 400
    lo = rng.integers(0, 10_000, n)
    hi = lo + rng.integers(0, 300, n)
    lo, hi = _sorted(lo, hi)
    lanes, count, _ = allocate(lo.tolist(), hi.tolist())
    assert count == peak_overlap(lo, hi)
    by_lane = {}
    for s, e, lane in zip(lo.tolist(), hi.tolist(), lanes):
        by_lane.setdefault(lane, []).append((s, e))
    for slices in by_lane.values():
        for (_s0, e0), (s1, _e1) in zip(slices, slices[1:]):
            assert e0 <= s1


@pytest.mark.parametrize("budget", [1 << 30, 4096])
def test_record_store_sorted_blocks_equal_a_full_sort(budget):
    dtype = np.dtype([("key", "<i8"), ("tie", "<i8"), ("payload", "<i4")])
    store = RecordStore(dtype, sort_keys=("key", "tie"), budget=budget)
    rng = np.random.default_rng(1)
    everything = []
    for _ in range(30):
        batch = np.zeros(500, dtype=dtype)
        batch["key"] = rng.integers(0, 200, 500)  # many equal keys: ties must stay ordered
        batch["tie"] = rng.integers(0, 10**6, 500)
        batch["payload"] = rng.integers(0, 9, 500)
        store.append(batch)
        everything.append(batch)
    assert store.spilled == (budget == 4096)
    merged = np.concatenate(list(store.sorted_blocks()))
    full = np.concatenate(everything)
    full = full[np.lexsort((full["tie"], full["key"]))]
    assert np.array_equal(merged, full)
    store.close()


def test_merging_many_runs_reads_within_one_budget(monkeypatch):
    """A 10 GB trace spills hundreds of runs; the merge must not hold a block of each."""
    from tracestream import spill

    dtype = np.dtype([("key", "<i8"), ("tie", "<i8")])
    monkeypatch.setattr(spill, "MERGE_BYTES", 64 * 1024)
    store = RecordStore(dtype, sort_keys=("key", "tie"), budget=4096)  # 256 rows per run
    rng = np.random.default_rng(2)
    for _ in range(400):
        batch = np.zeros(256, dtype=dtype)
        batch["key"] = rng.integers(0, 10**6, 256)
        batch["tie"] = np.arange(256)
        store.append(batch)
    assert len(store._runs) == 400
    blocks = list(store.sorted_blocks())
    merged = np.concatenate(blocks)
    assert len(merged) == 400 * 256
    assert np.all(np.diff(merged["key"]) >= 0)
    # 400 runs x 64 rows (the floor) x 16 bytes: what one merged block can hold at most
    assert max(b.nbytes for b in blocks) <= 400 * 64 * 16
    store.close()


def test_record_store_keeps_file_order():
    dtype = np.dtype([("x", "<i8")])
    store = RecordStore(dtype, budget=64)
    for start in range(0, 1000, 10):
        store.append(np.arange(start, start + 10, dtype=np.int64).view(dtype))
    assert np.concatenate(list(store.batches()))["x"].tolist() == list(range(1000))
    store.close()
