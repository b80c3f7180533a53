"""The output-only checks read in columns give the per-record rules' findings."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REAL_WITH_GPU, real_trace, run
from hypothesis import given, settings
from hypothesis import strategies as st

from tracestream.commands.verify.bindings import (
    BIND_ACTIVITY,
    BIND_DTYPE,
    _TrackBindings,
    perfetto_bindings,
)
from tracestream.commands.verify.guides import GuideOrder
from tracestream.commands.verify.nesting import NestState, nesting_in_block
from tracestream.commands.verify.planned import Sequential

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
    state, found, at = NestState(), [], 0
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
    assert nesting_in_block(np.array(rows, DEPTH), NestState()) == [
        (0, 5, 10), (0, 30, None)]


def bindings_one_at_a_time(records) -> dict[int, int]:
    """`_TrackBindings` fed one (track, key) group at a time, the whole records at once."""
    out: list = []
    state = _TrackBindings(out)
    groups: dict = {}
    for track, key, end, mode, ordinal in records:
        activities, flows = groups.setdefault((track, key), ([], []))
        if mode == BIND_ACTIVITY:
            activities.append((end, ordinal))
        else:
            flows.append((ordinal, mode))
    for at, (activities, flows) in groups.items():
        state.take(at, activities, flows)
    state.end_track()
    return dict(out)


bind_records = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(-1, 8), st.integers(0, 2)),
    max_size=50)


@settings(max_examples=500, deadline=None)
@given(bind_records, st.lists(st.integers(1, 20), min_size=1, max_size=8), st.booleans())
def test_bindings_in_blocks_are_the_rule_per_record(raw, cuts, apart):
    """Flows and activities, cut into blocks anywhere, bind as `_TrackBindings` binds them
    a record at a time: overlapping or not (`apart` spaces each track's activities so that
    the columns take most blocks), several activities at one start or none."""
    rows, last_end = [], {}
    for ordinal, (track, key, length, mode) in enumerate(raw):
        rows.append([track, key, key + length, mode, ordinal])
    rows.sort(key=lambda r: (r[0], r[1]))
    if apart:
        for row in rows:  # an activity starts after the previous one on its track ends
            if row[3] == BIND_ACTIVITY:
                row[1] = max(row[1], last_end.get(row[0], row[1]) + 1)
                row[2] = row[1] + abs(row[2] - row[1])
                last_end[row[0]] = row[2]
            else:
                row[1] = max(row[1], last_end.get(row[0], row[1]) - 3)
        rows.sort(key=lambda r: (r[0], r[1]))
    records = np.array([tuple(r) for r in rows], BIND_DTYPE)
    blocks, at = [], 0
    for size in cuts * (len(rows) + 1):
        if at >= len(rows):
            break
        blocks.append(records[at:at + size])
        at += size
    found = {flow: bound for block in perfetto_bindings(iter(blocks))
             for flow, bound in zip(block["flow"].tolist(), block["bound"].tolist())}
    assert found == bindings_one_at_a_time(r for r in records.tolist())


@given(st.lists(st.binary(max_size=6), max_size=6), st.lists(st.integers(0, 8), max_size=6),
       st.integers(-1, 20))
def test_planned_bytes_match_where_they_lie_as_they_would_once_taken(pieces, cuts, flip):
    """`Sequential.matches` (no copy) answers what comparing `take`'s bytes would, for
    chunks cut anywhere across the planned pieces, with a byte changed or not (the
    comparison stops at the first chunk that differs)."""
    whole = b"".join(pieces)
    chunks, at = [], 0
    for cut in cuts:
        chunks.append(whole[at : at + cut])
        at += cut
    if 0 <= flip < at:
        chunks = [bytes(c) for c in chunks]
        position = flip
        for k, c in enumerate(chunks):
            if position < len(c):
                chunks[k] = c[:position] + bytes([c[position] ^ 1]) + c[position + 1 :]
                break
            position -= len(c)
    matching, taking = Sequential(iter(pieces)), Sequential(iter(pieces))
    viewing = Sequential(iter(map(memoryview, pieces)))  # a slot's or block's bytes
    for chunk in chunks:
        equal = taking.take(len(chunk)) == chunk
        assert matching.matches(chunk) == equal
        assert viewing.matches(memoryview(chunk)) == equal  # a speculative chunk's piece
        if not equal:
            return
    assert matching.ended() == taking.ended() == viewing.ended()


def _merged(facts_list) -> dict:
    """The records a main process's checks hold after merging chunks' facts, per store."""
    from tracestream.commands.verify.output_checks import OutputChecks

    checks = OutputChecks({}, None)
    try:
        for facts in facts_list:
            checks.merge(facts)
        stores = {**{f"depth {v}": s for v, s in checks.depth_stores().items()},
                  **{f"binding {v}": s for v, s in checks.binding.items()}}
        return {name: np.concatenate(list(store.sorted_blocks())).tolist()
                for name, store in stores.items()}
    finally:
        checks.close()


def test_a_chunk_read_event_by_event_hands_back_one_batch_per_store():
    """A chunk whose numbers are not all in Kineto's shapes goes through `observe` event by
    event, yet its facts hold one batch per record store (thousands of small arrays would
    be pickled, merged and spilled one by one), with the records those events make."""
    from tracestream.commands.verify.planned import _facts_of
    from tracestream.write.relocate import relocate

    synthetic = {(1, 100): "lane tid 100 of pid 1"}
    events = []
    for k in range(400):
        ts = f"{1000 + 10 * k}.{'5' if k % 2 else '500'}"  # every other one not Kineto's
        raw = (f'{{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 7, "ts": {ts}, '
               f'"dur": 2, "args": {{"device": 0}}}}').encode()
        events.append(relocate(raw, b"100", k))
    content = b",\n".join(events)
    facts = _facts_of(content, 0, synthetic)
    depth, binding = facts[1], facts[2]
    assert all(len(batches) == 1 for batches in [*depth.values(), *binding.values()])
    one_by_one = [_facts_of(event, k, synthetic) for k, event in enumerate(events)]
    assert _merged([facts]) == _merged(one_by_one)
    assert len(_merged([facts])["depth exact"]) == 400


def _facts_one_at_a_time(events: list[bytes], first: int, synthetic: dict) -> tuple:
    """A chunk's facts as `observe` makes them, an event at a time (the reference)."""
    from tracestream.commands.verify.output_checks import OutputChecks

    checks = OutputChecks.of_chunk(synthetic)
    for k, raw in enumerate(events):
        checks.observe(first + k, raw)
    return checks.facts()


def _comparable(facts: tuple) -> tuple:
    """A chunk's facts with every record batch as plain rows (tracks in the order met)."""
    (tracks, depth, binding, guides, kernels, streams, lanes, lane_groups, problems, moved,
     flows) = facts
    rows = {f"{side} {v}": np.concatenate(batches).tolist() if batches else []
            for side, kept in (("depth", depth), ("binding", binding))
            for v, batches in kept.items()}
    starts, ends, names = guides
    return (tracks, rows, list(zip(np.asarray(starts).tolist(), np.asarray(ends).tolist(), names)),
            kernels, streams, lanes, lane_groups, problems, moved, flows)


def test_a_chunk_read_in_columns_has_the_facts_of_its_events_one_at_a_time():
    """`observe_chunk`'s columns (each track a number, streams and lane slices counted in
    numpy) hand back what `observe` finds an event at a time: the tracks in the order
    met, every record, guide, kernel and stream count, for moved kernels and flows (`bp`
    or not), string and integer pids and tids, several devices, events without `args`,
    moved events with and without a lane group in their provenance."""
    from tracestream.commands.verify.planned import _facts_of
    from tracestream.write.relocate import relocate

    synthetic = {(1, 100): "lane tid 100 of pid 1", (1, 101): "lane tid 101 of pid 1",
                 ("Spans", "guides"): "the guide track"}
    events = []
    for k in range(60):
        stream = [7, 9, "s3"][k % 3]
        device = [0, 1, None][k % 3 if k % 5 else 2]
        shown = "null" if device is None else device
        args = "" if device is None and k % 2 else f', "args": {{"device": {shown}}}'
        raw = (f'{{"ph": "X", "cat": "{["kernel", "gpu_memcpy", "cpu_op"][k % 4 % 3]}", '
               f'"name": "k{k}", "pid": 1, "tid": {stream!r}, "ts": {1000 + 10 * k}.250, '
               f'"dur": 2.5{args}}}').replace("'", '"').encode()
        group = [None, b', "group": "compute"', b', "group": "memory"'][k % 3]
        events.append(relocate(raw, b"100" if k % 4 else b"101", k, group=group)
                      if k % 7 else raw)
        if k % 6 == 0:  # a flow finishing on the kernel, moved with it
            bp = ', "bp": "e"' if k % 12 else ""
            flow = (f'{{"ph": "f", "id": {k}, "pid": 1, "tid": {stream!r}, '
                    f'"ts": {1000 + 10 * k}.250, "cat": "ac2g", "name": "ac2g"{bp}}}'
                    ).replace("'", '"').encode()
            events.append(relocate(flow, b"100" if k % 4 else b"101", k))
        if k % 10 == 0:  # guides, and slices on the guide track that are none
            cat = ["layer_guide", "tracestream_guide", "Layer_Guide", "layer_guide"][k // 10 % 4]
            events.append(f'{{"ph": "X", "cat": "{cat}", "name": "L{k // 10}", '
                          f'"pid": "Spans", "tid": "guides", "ts": {1000 + 10 * k}, '
                          f'"dur": 10}}'.encode())
            events.append(b'{"ph": "M", "name": "thread_name", "pid": 2, "tid": 3, '
                          b'"args": {"name": "x"}}')
    for first, cut in ((0, len(events)), (17, 25), (3, 1)):
        chunk = events[:cut]
        assert _comparable(_facts_of(b",\n".join(chunk), first, synthetic)) == _comparable(
            _facts_one_at_a_time(chunk, first, synthetic))
    whole = _facts_of(b",\n".join(events), 0, synthetic)
    assert len(whole[4]) == len(whole[5]) == 3 and whole[10] == 10  # devices, flows
    assert set(whole[7][(1, 100)]) == {"compute", "memory"}  # lane groups seen on a lane
    assert whole[3][2] == ["L0", "L3", "L4"]  # guides


@pytest.mark.parametrize("name", REAL_WITH_GPU)
def test_real_layers_output_read_in_columns_has_the_facts_one_at_a_time(name, tmp_path):
    """The same on `layers` outputs of the real traces (lanes, relocated flows and
    scopes as Kineto writes them), a few hundred events at a time; with the C extension
    the scan reads every one of those chunks (none is left to msgspec)."""
    from tracestream import _native
    from tracestream.commands.verify.events import scanned_chunk
    from tracestream.commands.verify.output_checks import OutputChecks
    from tracestream.commands.verify.planned import _facts_of
    from tracestream.read.document import DocumentScanner, iter_events

    trace = real_trace(name)
    out = tmp_path / "out.json"
    result = run("compact", "--trace", trace, "--output", out, "--quiet")
    assert result.returncode == 0, result.stderr
    report = json.loads(next(tmp_path.glob("out.json.*.json")).read_text())
    synthetic = OutputChecks(report, None).synthetic
    with open(out, "rb") as fh:
        raws = [bytes(raw) for _, raw in iter_events(DocumentScanner([fh.read()]).chunks())]
    assert synthetic and raws
    for first in range(0, len(raws), 300):
        chunk = raws[first:first + 300]
        assert _comparable(_facts_of(b",\n".join(chunk), first, synthetic)) == _comparable(
            _facts_one_at_a_time(chunk, first, synthetic))
        if _native.chosen is _native.built:
            assert scanned_chunk(b",\n".join(chunk)) is not None


def test_interned_values_share_a_number_as_a_dicts_keys_do():
    """Values numbered in their table as check_columns numbers them (its twin's `numbered`),
    tracks read back from their codes."""
    from tracestream._native.reference.columns import numbered
    from tracestream.commands.verify.columns import Interned, TrackCodes

    interned = Interned()
    assert numbered(interned.table, [7, "s", 7, None]).tolist() == [0, 1, 0, 2]
    assert numbered(interned.table, [1.0, "s", 7.0]).tolist() == [3, 1, 0]  # 7.0 == 7
    assert [interned.value(k) for k in range(4)] == [7, "s", None, 1.0]
    codes = TrackCodes()
    tracks = ((numbered(codes.pids.table, [0, 0, "Spans"]) << 32)
              | numbered(codes.tids.table, [7, "s3", 7]))
    assert len(set(tracks.tolist())) == 3
    assert [codes.key(c) for c in tracks.tolist()] == [(0, 7), (0, "s3"), ("Spans", 7)]
    # pid 1 was never met; ("Spans", "s3") has a code (both were met) that no event holds
    known = codes.known([(0, 7), ("Spans", "s3"), (1, 7)]).tolist()
    assert len(known) == 2 and known[0] == tracks[0] and known[1] not in tracks.tolist()
    assert codes.key(known[1]) == ("Spans", "s3")


def _lane_checks(durations: list, flush_each: bool):
    """verify's output-only checks of slices on one lane, (ts, dur) texts each: one batch
    of rows per slice (`flush_each`, as chunks come) or all in one."""
    from tracestream.commands.verify.output_checks import OutputChecks

    checks = OutputChecks({"options": {}, "groups": [
        {"display_pid": 0, "lane_tids": [100]}]}, None)
    for ordinal, (ts, dur) in enumerate(durations):
        checks.observe(ordinal, (f'{{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                                 f'"tid": 100, "ts": {ts}, "dur": {dur}}}').encode())
        if flush_each:
            checks._flush()
    return checks


def test_truncating_rows_are_held_once_while_they_are_the_rounding_ones():
    """Perfetto's rounding and truncating imports of three-decimal µs agree (Kineto's
    shape): their depth rows are held once, and each problem is still named for every
    import, in the order exact, round, trunc."""
    checks = _lane_checks([("100", "5"), ("101", "1"), ("110.5", "4.25")], flush_each=True)
    try:
        assert len(checks.depth["round"]) == 3 and len(checks.depth["trunc"]) == 0
        assert checks.depth_problems() == [
            f"lane tid 100 of pid 0: a slice starting at 101000 ns overlaps one ending at "
            f"105000 ns ({variant} import) -> depth 1" for variant in ("exact", "round", "trunc")]
    finally:
        checks.close()


def test_truncating_rows_kept_apart_from_the_first_batch_that_differs():
    """A `dur` whose double ×1000 lands below its integer (1.005 µs -> 1004.999… ns) makes
    the truncating rows differ: from that batch on they are held apart, with the rows
    before it, and the truncating import's problems are its own (the nesting in the first
    batch, found only with those earlier rows, included)."""
    slices = [("100", "5"), ("101", "1"), ("110", "1.005"), ("111.004", "1")]
    checks = _lane_checks(slices, flush_each=True)
    try:
        assert len(checks.depth["trunc"]) == 4
        problems = checks.depth_problems()
    finally:
        checks.close()
    where = "lane tid 100 of pid 0: a slice starting at"
    assert problems == [
        *(f"{where} {start} ns overlaps one ending at {end} ns ({v} import) -> depth 1"
          for v in ("exact", "round") for start, end in ((101000, 105000), (111004, 111005))),
        f"{where} 101000 ns overlaps one ending at 105000 ns (trunc import) -> depth 1"]
    whole = _lane_checks(slices, flush_each=False)  # one batch: apart from the start
    try:
        assert whole.depth_problems() == problems
    finally:
        whole.close()


def _moved(tid: int, ordinal: int, raw: str) -> bytes:
    from tracestream.write.relocate import relocate

    return relocate(raw.encode(), b"100", ordinal) if tid else raw.encode()


def test_binding_rows_kept_only_on_tracks_whose_flows_moved():
    """With `bind_only_on` (the source's tracks with GPU flows), moved activities from
    other tracks are not stored for the binding check (they bind no flow), flows always
    are; a moved flow from another track says the check cannot be trusted."""
    from tracestream.commands.verify.output_checks import OutputChecks
    from tracestream.commands.verify.planned import _facts_of

    synthetic = {(1, 100): "lane tid 100 of pid 1"}
    kernel = ('{{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": {tid}, '
              '"ts": {ts}, "dur": 2, "args": {{"device": 0}}}}')
    flow = '{{"ph": "f", "bp": "e", "id": 1, "pid": 1, "tid": {tid}, "ts": {ts}, "cat": "ac2g"}}'
    events = [_moved(7, 0, kernel.format(tid=7, ts=10)), _moved(7, 1, flow.format(tid=7, ts=10)),
              _moved(8, 2, kernel.format(tid=8, ts=20))]
    facts = _facts_of(b",\n".join(events), 0, synthetic)

    def merged(sources):
        checks = OutputChecks({}, None)
        checks.synthetic = synthetic
        if sources is not None:
            checks.bind_only_on(sources)
        checks.merge(facts)
        try:
            return ([len(checks.binding[side]) for side in ("source", "lane")],
                    checks.binding_problems(), checks.sources_complete)
        finally:
            checks.close()

    assert merged(None) == ([3, 3], [], True)
    assert merged({(1, 7)}) == ([2, 3], [], True)  # the activity from tid 8 is not kept
    sizes, _, complete = merged({(1, 8)})  # the flow from tid 7: not to be trusted
    assert sizes == [2, 3] and not complete


def test_the_checks_memo_of_categories_stays_bounded():
    """`verify` compares an output event by event where it differs from the plan: an output
    of ever new categories does not grow its memo of category kinds past the bound, and a
    kernel met after the bound is still counted as one."""
    from tracestream.commands.verify.output_checks import OutputChecks

    checks = OutputChecks({}, None)
    limit = checks.kinds.limit
    for k in range(limit + 500):
        checks.observe(k, (f'{{"ph": "X", "cat": "odd{k}", "name": "n", "pid": 1, "tid": 1, '
                           f'"ts": {k}, "dur": 1}}').encode())
    assert len(checks.kinds) <= limit
    checks.observe(limit + 500, b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                                b'"tid": 7, "ts": 1, "dur": 2, "args": {"device": 0}}')
    assert checks.kernels == {(0, 0): 1}
    checks.close()


_REPORT_VALUE = st.one_of(st.integers(0, 40), st.none(), st.booleans(), st.just(2.0),
                          st.just("3"), st.just([1, [2]]), st.just(1 << 62), st.just(1 << 70))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30), st.sampled_from(["L0", "L1"])),
                max_size=25),
       st.lists(st.fixed_dictionaries({"guide_start_us": _REPORT_VALUE,
                                       "guide_end_us": _REPORT_VALUE,
                                       "layer_id": st.sampled_from([0, 1, "x", None]),
                                       "pass_index": st.integers(0, 3)}), max_size=25),
       st.lists(st.integers(1, 9), max_size=6))
def test_guides_checked_a_chunk_at_a_time_find_what_one_at_a_time_finds(guides, rows, cuts):
    """The main process checks each chunk's guides as columns: the order problems, the
    report rows that do not describe their guide (odd values in the rows included) and
    their counts are those found a guide at a time."""
    guides = [(start * 1000, (start + length) * 1000, name) for start, length, name in guides]
    rows = [dict(row) for row in rows]
    for k, row in enumerate(rows[: len(guides)]):  # most rows describe their guide
        if k % 3:
            row.update(guide_start_us=guides[k][0] // 1000, guide_end_us=guides[k][1] // 1000,
                       layer_id=int(guides[k][2][1]))
    one, batched = GuideOrder(rows), GuideOrder(rows)
    for guide in guides:
        one.observe(*guide)
    at = 0
    for size in [*cuts, len(guides)]:
        part = guides[at : at + size]
        at += len(part)
        batched.observe_many(np.array([g[0] for g in part], np.int64),
                             np.array([g[1] for g in part], np.int64), [g[2] for g in part])
    for found in (one, batched):
        assert found.count == len(guides)
    assert (batched.problems, batched.problem_count) == (one.problems, one.problem_count)
    assert (batched.row_problems, batched.row_problem_count) == (one.row_problems,
                                                                 one.row_problem_count)
