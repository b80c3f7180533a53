"""The output-only checks read in columns give the per-record rules' findings."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracestream.verify import _NestState, nesting_in_block

DEPTH = np.dtype([("track", "<i8"), ("start", "<i8"), ("end", "<i8")])


def nesting_one_at_a_time(rows) -> list[tuple]:
    """Perfetto's nesting rule a slice at a time, over (track, start, end) in sorted order."""
    found = []
    last_track = None
    before = together = together_end = 0
    for track, start, end in rows:
        if track != last_track:
            last_track, before, together, together_end = track, start, start, end
        elif start != together:
            before = max(before, together_end)
            together, together_end = start, end
            if start < before:
                found.append((track, start, before))
        else:
            if max(together_end, end) > start:
                found.append((track, start, None))
            together_end = max(together_end, end)
    return found


slices = st.lists(st.tuples(st.integers(0, 2), st.integers(-3, 12), st.integers(-2, 6)),
                  max_size=60)


@settings(max_examples=400, deadline=None)
@given(slices, st.lists(st.integers(1, 20), min_size=1, max_size=8))
def test_nesting_in_blocks_is_the_rule_per_slice(raw, cuts):
    """Any records, cut into blocks anywhere (inside a track, inside a group of slices that
    start together), give the same nested slices in the same order as the per-slice rule."""
    rows = sorted(((t, s, s + d) for t, s, d in raw), key=lambda r: (r[0], r[1]))
    records = np.array(rows, DEPTH)
    state, found, at = _NestState(), [], 0
    for size in cuts * (len(rows) + 1):
        if at >= len(rows):
            break
        found += nesting_in_block(records[at:at + size], state)
        at += size
    assert found == nesting_one_at_a_time(rows)


def test_nesting_in_block_finds_both_kinds():
    """An overlap names the earlier slice's end; slices starting together, one longer, are
    named without one; zero-length slices together nest nothing."""
    rows = [(0, 0, 10), (0, 5, 6), (0, 20, 20), (0, 20, 20), (0, 30, 30), (0, 30, 31)]
    assert nesting_in_block(np.array(rows, DEPTH), _NestState()) == [
        (0, 5, 10), (0, 30, None)]
