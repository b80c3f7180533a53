"""The greedy lane allocator and the record store it reads from."""

import heapq
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracestream.index.builder import SWEEP_DTYPE
from tracestream.index.records import RecordStore, concat_rows, key_order, same_rows
from tracestream.plan.lanes import (
    FLOW_KIND,
    NEXT_FLOW_KIND,
    GroupLanes,
    PeakOverlap,
    Sweep,
    is_member,
    member_table,
    occupied_end,
)


def allocate(lo: Iterable[int], hi: Iterable[int]) -> tuple[list[int], int, int | None]:
    """The allocator on plain lists: lanes for slices given in start order (lane per slice,
    lane count, peak time)."""
    group = GroupLanes()
    lanes = group.place_block(np.fromiter(lo, np.int64), np.fromiter(hi, np.int64))
    return lanes.tolist(), group.lanes, group.peak_at_ns


def peak_overlap(lo: np.ndarray, hi: np.ndarray) -> int:
    """An independent count: most slices alive at one time, each occupying
    [lo, occupied_end); touching slices do not overlap."""
    if not len(lo):
        return 0
    times = np.concatenate([lo, occupied_end(lo, hi)])
    delta = np.concatenate([np.ones(len(lo), np.int64), -np.ones(len(hi), np.int64)])
    order = np.lexsort((delta, times))  # ends before starts at equal times
    return int(np.cumsum(delta[order]).max())


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


def test_a_zero_length_slice_occupies_its_start():
    """Perfetto sorts equal starts longest first and closes a slice only when end <= the
    next start: a zero-length slice sharing its start with another on a lane would nest."""
    lanes, count, _ = allocate([5, 5, 5], [5, 5, 5])
    assert count == 3
    lanes, count, _ = allocate([5, 5], [5, 9])  # zero-length first: still its own lane
    assert count == 2 and lanes == [0, 1]
    lanes, count, _ = allocate([0, 5, 5], [5, 5, 9])  # touching the end before it is fine
    assert count == 2 and lanes[:2] == [0, 0]
    assert peak_overlap(np.array([5, 5]), np.array([5, 9])) == 2


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


def _heap_greedy(lo, hi):
    """The allocator as one would write it per slice: a heap of (end, placed, lane)."""
    heap, lanes, count, peak_at = [], [], 0, None
    for placed, (s, e) in enumerate(zip(lo, hi)):
        e = max(e, s + 1)  # a slice occupies at least its first nanosecond
        if heap and heap[0][0] <= s:
            lane = heapq.heapreplace(heap, (e, placed, heap[0][2]))[2]
        else:
            lane, count, peak_at = count, count + 1, s
            heapq.heappush(heap, (e, placed, lane))
        lanes.append(lane)
    return lanes, count, peak_at


def _random_slices(rng, n):
    """Sorted slices with many equal starts, touching ends and zero-length slices."""
    lo = np.sort(rng.integers(0, n * 3, n))
    hi = lo + rng.choice([0, 0, 1, 2, 3, 5, 40], n)
    return lo, hi


@pytest.mark.parametrize("seed", range(30))
def test_blockwise_lanes_equal_the_per_slice_heap(seed):
    """The numpy allocator, fed in blocks of any size, places every slice where the heap does."""
    rng = np.random.default_rng(seed)
    lo, hi = _random_slices(rng, 600)
    cuts = np.sort(rng.choice(np.arange(1, 600), rng.integers(0, 12), replace=False))
    group, lanes = GroupLanes(), []
    for block_lo, block_hi in zip(np.split(lo, cuts), np.split(hi, cuts)):
        lanes += group.place_block(block_lo, block_hi).tolist()
    assert (lanes, group.lanes, group.peak_at_ns) == _heap_greedy(lo.tolist(), hi.tolist())


@pytest.mark.parametrize("seed", range(30))
def test_peak_overlap_counts_what_the_allocator_reaches(seed):
    """inspect's counting sweep, fed in other blocks than the allocator, reports the same
    lane count and the same time the last lane opened."""
    rng = np.random.default_rng(seed)
    lo, hi = _random_slices(rng, 600)
    allocator = GroupLanes()
    allocator.place_block(lo, hi)
    counter = PeakOverlap()
    cuts = np.sort(rng.choice(np.arange(1, 600), rng.integers(0, 12), replace=False))
    for block_lo, block_hi in zip(np.split(lo, cuts), np.split(hi, cuts)):
        counter.add_block(block_lo, block_hi)
    assert (counter.lanes, counter.peak_at_ns) == (allocator.lanes, allocator.peak_at_ns)
    assert counter.lanes == peak_overlap(lo, hi)
    assert len(counter.open_ends) <= counter.lanes  # only the slices alive are carried


def test_peak_overlap_of_nested_and_touching_slices():
    counter = PeakOverlap()
    counter.add_block(np.array([0, 0, 10, 10]), np.array([10, 0, 20, 30]))
    # the zero-length slice occupies its start; touching slices do not overlap
    assert (counter.lanes, counter.peak_at_ns) == (2, 0)
    counter.add_block(np.array([15, 25]), np.array([40, 26]))  # 20 and 30 still open at 15
    assert (counter.lanes, counter.peak_at_ns) == (3, 15)


def _reference_binding(kernels, flows, lane_of):
    """Flow -> kernel per the rule: the one starting exactly at its time, else the one
    containing it, unless it ends there and another kernel on its lane (`lane_of`) starts
    there (Perfetto would bind the flow to that one); None when there are several or none,
    or when an `f` without bp "e" starts at none."""
    bound = []
    for track, t, binds_next in flows:
        exact = [k for k, (kt, s, e) in enumerate(kernels) if kt == track and s == t]
        inside = [k for k, (kt, s, e) in enumerate(kernels) if kt == track and s <= t <= e]
        hit = (exact[0] if len(exact) == 1 else
               inside[0] if not binds_next and not exact and len(inside) == 1 else None)
        if hit is not None and not exact and kernels[hit][2] == t and any(
                s == t and lane_of[k] == lane_of[hit] for k, (_, s, _) in enumerate(kernels)):
            hit = None
        bound.append(hit)
    return bound


@pytest.mark.parametrize("seed", range(20))
def test_flows_bind_like_the_rule_says_across_blocks(seed):
    rng = np.random.default_rng(seed)
    lo, hi = _random_slices(rng, 300)
    kernels = list(zip(rng.integers(0, 3, 300).tolist(), lo.tolist(), hi.tolist()))
    flows = [(int(rng.integers(0, 3)), int(t), bool(rng.integers(0, 4) == 0))
             for t in rng.integers(0, 900, 60)]
    rows = np.zeros(len(kernels) + len(flows), SWEEP_DTYPE)
    rows["track"] = [k[0] for k in kernels] + [f[0] for f in flows]
    rows["key"] = rows["start"] = [k[1] for k in kernels] + [f[1] for f in flows]
    rows["end"] = rows["hi"] = [k[2] for k in kernels] + [f[1] for f in flows]
    rows["kind"] = [1] * len(kernels) + [NEXT_FLOW_KIND if f[2] else FLOW_KIND for f in flows]
    rows["group"] = [0] * len(kernels) + [-1] * len(flows)
    rows["cand"] = np.arange(len(rows))
    rows["tie"] = rows["cand"] + np.where(rows["group"] < 0, 1 << 62, 0)
    rows = rows[np.lexsort((rows["tie"], rows["key"]))]
    cuts = np.sort(rng.choice(np.arange(1, len(rows)), rng.integers(0, 15), replace=False))
    actions = np.zeros(len(rows), np.uint16)
    sweep = Sweep(compacted_groups={0})
    sweep.run(np.split(rows, cuts), actions, {0: 1}, {0, 1, 2})
    sweep.at_ends(np.split(rows, cuts), actions)
    expected = _reference_binding(kernels, flows, actions[:len(kernels)].tolist())
    problems = {p.cand for p in sweep.flow_problems}
    for f, kernel in enumerate(expected):
        cand = len(kernels) + f
        if kernel is None:
            assert cand in problems and actions[cand] == 0
        else:
            assert cand not in problems and actions[cand] == actions[kernel]
    assert len(problems) == expected.count(None)


@pytest.mark.parametrize("shape", ["ties in row order", "ties never falling",
                                   "flows filed after slices",
                                   "random ties", "one key", "wide keys", "tiny",
                                   "tracks by start"])
def test_key_order_equals_lexsort(shape):
    """The packed sort gives lexsort's order, equal keys and equal ties included."""
    rng = np.random.default_rng(len(shape))
    count = 2 if shape == "tiny" else 5000
    keys = 1_764_400_000_000_000_000 + rng.integers(0, 3000, count)  # many equal keys
    ties = np.arange(count, dtype=np.int64)
    if shape == "flows filed after slices":  # as the index pass appends them, chunk by chunk
        flows = rng.random(count) < 0.2
        ties = np.where(flows, ties + (1 << 62), ties)
    elif shape == "random ties":
        ties = rng.integers(0, 50, count)
    elif shape == "ties never falling":  # equal ties keep their rows' order, as in lexsort
        ties = np.sort(rng.integers(0, 50, count))
    elif shape == "one key":
        keys[:] = 7
        ties = rng.permutation(count)
    elif shape == "tracks by start":  # a few tracks, starts out of order: one packed sort
        keys = rng.integers(0, 12, count)
        ties = 1_764_400_000_000_000_000 + rng.integers(0, 10**10, count)
        ties[::3] = ties[1::3]
    elif shape == "wide keys":  # too far apart to pack: lexsort itself
        keys = rng.integers(-(1 << 62), 1 << 62, count)
        keys[::2] = keys[1::2]
    assert np.array_equal(key_order(keys, ties), np.lexsort((ties, keys)))
    assert len(key_order(keys[:0], ties[:0])) == 0


def test_concat_rows_equals_numpy_concatenate():
    """Whole-row copies keep every field of packed records, from slices and strided views."""
    rng = np.random.default_rng(5)
    parts = []
    for size in (0, 1, 700, 33):
        part = np.zeros(size, SWEEP_DTYPE)
        for name in SWEEP_DTYPE.names:
            part[name] = rng.integers(-1000, 10**12 if SWEEP_DTYPE[name].itemsize == 8 else 100,
                                      size)
        parts.append(part)
    parts.append(parts[2][::3])  # strided
    parts.append(parts[2][10:20])
    assert np.array_equal(concat_rows(parts), np.concatenate(parts))
    with pytest.raises(ValueError, match="one dtype"):
        concat_rows([parts[1], np.zeros(1, [("key", "<i8")])])


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


def test_record_store_merges_runs_that_follow_each_other_in_time():
    """A trace's runs cover successive stretches of time, overlapping a little at their
    edges, where equal keys across runs must still come out in tie order."""
    dtype = np.dtype([("key", "<i8"), ("tie", "<i8")])
    store = RecordStore(dtype, sort_keys=("key", "tie"), budget=4096)  # 256 rows per run
    rng = np.random.default_rng(3)
    everything = []
    for run in range(60):
        batch = np.zeros(256, dtype=dtype)
        batch["key"] = run * 1000 + rng.integers(-50, 1000, 256)  # edges overlap
        batch["key"][:8] = (run // 2) * 2000  # and some keys recur across runs
        batch["tie"] = rng.permutation(10**6)[:256]
        store.append(batch)
        everything.append(batch)
    assert len(store._runs) == 60
    blocks = list(store.sorted_blocks())
    full = np.concatenate(everything)
    assert np.array_equal(np.concatenate(blocks), full[np.lexsort((full["tie"], full["key"]))])
    assert len(blocks) <= 4  # merged in blocks of ~8K records, not one per loaded block
    store.close()


def test_merging_many_runs_reads_within_one_budget(monkeypatch):
    """A 10 GB trace spills hundreds of runs; the merge must not hold a block of each."""
    from tracestream.index import records

    dtype = np.dtype([("key", "<i8"), ("tie", "<i8")])
    monkeypatch.setattr(records, "MERGE_BYTES", 64 * 1024)
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


def test_a_small_store_merges_within_its_own_budget():
    """A store kept small (the split's linked events, 2 MB) merges in blocks of its own
    budget, not the default merge's: its keys are hashes, so every run reaches each step
    and a step holds a block of each run, merged and sorted again."""
    dtype = np.dtype([("key", "<i8"), ("tie", "<i8")])
    budget = 256 << 10
    store = RecordStore(dtype, sort_keys=("key", "tie"), budget=budget)
    rng = np.random.default_rng(3)
    for _ in range(4):  # four runs of 16K records (256 KB each), keys all over
        batch = np.zeros(budget // dtype.itemsize, dtype=dtype)
        batch["key"] = rng.integers(0, 2**62, len(batch))
        store.append(batch)
    assert len(store._runs) == 4
    blocks = list(store.sorted_blocks())
    merged = np.concatenate(blocks)
    assert len(merged) == 4 * budget // dtype.itemsize
    assert np.all(np.diff(merged["key"]) >= 0)
    assert max(b.nbytes for b in blocks) <= budget
    store.close()


def test_record_store_keeps_file_order():
    dtype = np.dtype([("x", "<i8")])
    store = RecordStore(dtype, budget=64)
    for start in range(0, 1000, 10):
        store.append(np.arange(start, start + 10, dtype=np.int64).view(dtype))
    assert np.concatenate(list(store.batches()))["x"].tolist() == list(range(1000))
    store.close()


@pytest.mark.parametrize("budget", [1 << 30, 480])
def test_record_store_takes_records_by_position(budget, monkeypatch):
    """Spilled (read a span at a time; 480 bytes: every third batch, the last one kept)
    or not, `take` gives the records asked for, in the order asked, repeats included."""
    from tracestream.index import records

    monkeypatch.setattr(records, "TAKE_SPAN", 50)  # several spans per take
    dtype = np.dtype([("x", "<i8"), ("y", "<i4")])
    store = RecordStore(dtype, budget=budget)
    for start in range(0, 1000, 10):
        batch = np.zeros(10, dtype)
        batch["x"] = np.arange(start, start + 10)
        batch["y"] = -batch["x"]
        store.append(batch)
    assert store.spilled == (budget == 480)
    which = np.random.default_rng(4).integers(0, 1000, 300)
    which[:3] = [999, 0, 999]
    taken = store.take(which)
    assert taken["x"].tolist() == which.tolist() and taken["y"].tolist() == (-which).tolist()
    with pytest.raises(IndexError):
        store.take(np.array([1000]))
    store.close()


def _sweep_rows(kernels, flows):
    """SWEEP_DTYPE rows in sweep order: kernels (track, start, end) of group 0, then flows
    (track, ts) with bp "e"; cand k is the k-th given."""
    rows = np.zeros(len(kernels) + len(flows), SWEEP_DTYPE)
    rows["track"] = [k[0] for k in kernels] + [f[0] for f in flows]
    rows["key"] = rows["start"] = [k[1] for k in kernels] + [f[1] for f in flows]
    rows["end"] = rows["hi"] = [k[2] for k in kernels] + [f[1] for f in flows]
    rows["kind"] = [1] * len(kernels) + [FLOW_KIND] * len(flows)
    rows["group"] = [0] * len(kernels) + [-1] * len(flows)
    rows["cand"] = np.arange(len(rows))
    rows["tie"] = rows["cand"] + np.where(rows["group"] < 0, 1 << 62, 0)
    return rows[np.lexsort((rows["tie"], rows["key"]))]


@pytest.mark.parametrize("c_start, taken", [(10, True), (11, False)])
def test_a_flow_at_its_activitys_end_is_refused_only_where_its_lane_takes_it(c_start, taken):
    """a [0, 10] on stream 0 and c on stream 1 share a lane; a flow at 10 on stream 0 binds to
    a by its end, and to c on the lane when c starts at 10."""
    rows = _sweep_rows([(0, 0, 10), (1, c_start, 14)], [(0, 10)])
    actions = np.zeros(3, np.uint16)
    sweep = Sweep(compacted_groups={0})
    sweep.run([rows], actions, {0: 1}, {0, 1})
    sweep.at_ends([rows], actions)
    assert actions[0] == actions[1] == 1
    assert [p.cand for p in sweep.flow_problems] == ([2] if taken else [])
    assert actions[2] == (0 if taken else 1)


@pytest.mark.parametrize("seed", range(6))
def test_inspect_peaks_from_spilled_rows_of_several_groups(seed):
    """`inspect`'s peak rows (index.PEAK_DTYPE, in index.PEAK_SORT order: ties within a
    group in no particular order), spilled in many runs and interleaved across GPUs, give
    each GPU the lane count and peak time the allocator reaches on its slices alone, and
    the occupancy strip counted from them, each column's most slices at once."""
    from tracestream.commands.evidence.occupancy import lane_occupancy
    from tracestream.index.builder import PEAK_DTYPE, PEAK_SORT

    rng = np.random.default_rng(seed)
    store = RecordStore(PEAK_DTYPE, sort_keys=PEAK_SORT, budget=2000)  # 100 rows per run
    slices = {g: _random_slices(rng, 400) for g in range(3)}
    rows = np.concatenate([np.rec.fromarrays([lo // 4 * 4, hi, np.full(len(lo), g)],
                                             dtype=PEAK_DTYPE)  # many shared starts
                           for g, (lo, hi) in slices.items()]).view(np.ndarray)
    rows = rows[rng.permutation(len(rows))]  # file order is not time order
    for part in np.array_split(rows, 25):
        store.append(part)
    assert store.spilled
    spans = {g: (int(lo.min() // 4 * 4), int(hi.max())) for g, (lo, hi) in slices.items()}
    found = lane_occupancy(store, spans, columns=int(rng.integers(1, 90)))
    for g in slices:
        mine = np.sort(rows[rows["group"] == g], order=["key", "hi"])
        allocator = GroupLanes()
        allocator.place_block(mine["key"], mine["hi"])
        peak = found[g].peak
        assert (peak.lanes, peak.peak_at_ns) == (allocator.lanes, allocator.peak_at_ns)
        assert found[g].maxima.tolist() == _strip_by_hand(mine["key"], mine["hi"], found[g])
        assert found[g].maxima.max() == peak.lanes
    store.close()


def _strip_by_hand(lo, hi, strip) -> list[int]:
    """Each column's most slices occupying one nanosecond at once (a slice occupies
    [lo, max(hi, lo + 1))), counted at the column's start and at each start inside it."""
    ends = np.maximum(hi, lo + 1)
    maxima = []
    for k in range(len(strip.maxima)):
        first = strip.start_ns + k * strip.width_ns
        last = first + strip.width_ns if k < len(strip.maxima) - 1 else max(ends.max(), first + 1)
        times = [first, *lo[(lo >= first) & (lo < last)].tolist()]
        maxima.append(max(int(((lo <= t) & (ends > t)).sum()) for t in times))
    return maxima


@pytest.mark.parametrize("seed", range(20))
def test_occupancy_strip_in_any_blocks_is_each_columns_most_at_once(seed):
    """Fed in blocks of any size, the strip's columns are the most slices at once in each
    slice of the span (activity running across a column's start counts there), its
    maximum the peak."""
    from tracestream.commands.evidence.occupancy import LaneOccupancy

    rng = np.random.default_rng(seed)
    lo, hi = _random_slices(rng, 300)
    hi = np.where(rng.random(300) < 0.05, hi + 600, hi)  # a few long ones cross many columns
    strip = LaneOccupancy.over(int(lo.min()), int(hi.max()), int(rng.integers(1, 120)))
    cuts = np.sort(rng.choice(np.arange(1, 300), rng.integers(0, 12), replace=False))
    for block_lo, block_hi in zip(np.split(lo, cuts), np.split(hi, cuts)):
        strip.add_block(block_lo, block_hi)
    strip.finish()
    assert strip.maxima.tolist() == _strip_by_hand(lo, hi, strip)
    assert strip.maxima.max() == strip.peak.lanes == peak_overlap(lo, hi)


def test_same_rows_compares_whole_records_byte_for_byte():
    dtype = np.dtype([("track", "<i8"), ("start", "<i8"), ("end", "<i8")])
    a = np.array([(1, 2, 3), (1, 5, 9)], dtype)
    assert same_rows(a, a.copy())
    changed = a.copy()
    changed["end"][1] = 8
    assert not same_rows(a, changed)
    assert not same_rows(a, a[:1])
    renamed = np.array([(1, 2, 3), (1, 5, 9)], [("a", "<i8"), ("b", "<i8"), ("c", "<i8")])
    assert not same_rows(a, renamed)
    assert same_rows(a[::-1], a[::-1].copy())  # (not contiguous: compared all the same)


@given(st.sets(st.integers(-1, 60)), st.lists(st.integers(-1, 127), max_size=50),
       st.sampled_from([np.int8, np.int32, np.int64]))
def test_membership_by_table_is_isin(members, values, dtype):
    """The sweep tests every record's kind, group (-1: a flow's) and track against small
    sets by indexing a table: the answer is np.isin's, for values above the largest member
    and for no members at all too."""
    column = np.array(values, dtype)
    expected = np.isin(column, np.array(sorted(members), np.int64))
    assert is_member(member_table(members), column).tolist() == expected.tolist()
