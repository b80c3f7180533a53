"""Lane allocation on 10 M intervals: the plan's time sweep.

Intervals are made a block at a time (sorted by start, peak overlap 3 like a
GEMM with a concurrent all-reduce and copy), so memory stays at one block
instead of 10 M Python ints. Two forms are measured: `GroupLanes.place_block`
(the allocator itself) and `Sweep.run` over sweep records (what the plan runs,
record filtering, action codes and flow-binding state included).
"""

import numpy as np

from tracestream.index.builder import SWEEP_DTYPE
from tracestream.plan.lanes import GroupLanes, Sweep

INTERVALS = 10_000_000
BLOCK = 1 << 13  # rows per block, as the spill store's merge yields them
_PATTERN_START = np.array([0, 3_125, 5_750, 26_000, 31_000, 34_000, 56_375], np.int64)
_PATTERN_DUR = np.array([3_125, 2_500, 20_250, 30_000, 20_000, 10_000, 6_000], np.int64)
_PERIOD = 63_000


def interval_blocks(total: int = INTERVALS, block: int = BLOCK):
    """(lo, hi) int64 arrays, in start order, `block` intervals at a time."""
    per = len(_PATTERN_START)
    for first in range(0, total, block):
        k = np.arange(first, min(first + block, total))
        lo = (k // per) * _PERIOD + _PATTERN_START[k % per]
        yield lo, lo + _PATTERN_DUR[k % per]


def place_all() -> GroupLanes:
    group = GroupLanes()
    for lo, hi in interval_blocks():
        group.place_block(lo, hi)
    return group


def test_lanes_place_10m(benchmark):
    group = benchmark.pedantic(place_all, rounds=2, iterations=1, warmup_rounds=0)
    assert group.count == INTERVALS
    assert group.lanes == 3


def sweep_blocks():
    """The same intervals as sweep records of one compacted group on a few tracks."""
    cand = 0
    for lo, hi in interval_blocks():
        rows = np.zeros(len(lo), SWEEP_DTYPE)
        rows["key"] = rows["start"] = lo
        rows["hi"] = rows["end"] = hi
        rows["cand"] = rows["tie"] = np.arange(cand, cand + len(lo))
        rows["track"] = rows["cand"] % 8
        rows["kind"] = 1  # a kernel
        cand += len(lo)
        yield rows


def sweep_all() -> Sweep:
    actions = np.zeros(INTERVALS, np.uint16)
    sweep = Sweep(compacted_groups={0})
    sweep.run(sweep_blocks(), actions, {0: 1}, set())
    assert int(actions.max()) == 3
    return sweep


def test_lanes_sweep_10m(benchmark):
    sweep = benchmark.pedantic(sweep_all, rounds=2, iterations=1, warmup_rounds=0)
    assert sweep.groups[0].lanes == 3
