"""What one chunk's observation decides: `ts`/`dur` columns read at once decide exactly
as one value at a time; provenance is a key of `args`, not a string anywhere."""

from __future__ import annotations

import re

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracestream._native.reference.columns import (
    SHAPE_DECIMAL,
    SHAPE_INTEGER,
    SHAPE_OTHER,
    kineto_column,
)
from tracestream.index import decode, extract, timebase
from tracestream.index.extract import _Observer, observe_chunk
from tracestream.index.facts import FLOW, META, ChunkError, Context
from tracestream.model import KERNEL, MEMCPY, OTHER, Event

pytestmark = pytest.mark.usefixtures("backend")  # the C extension, then numpy

# what the column fast path accepts, written out as the regular expressions it replaces
_DECIMAL = re.compile(rb"-?(?:[0-9]{1,15}|[1-8][0-9]{15})\.[0-9]{1,3}")
_INTEGER = re.compile(rb"-?(?:[0-9]{1,15}|[1-8][0-9]{15})")


def reference(text: bytes, signed: bool) -> int:
    """The shape of one text, by regular expression."""
    if not signed and text.startswith(b"-"):
        return SHAPE_OTHER
    if _DECIMAL.fullmatch(text):
        return SHAPE_DECIMAL
    if _INTEGER.fullmatch(text):
        return SHAPE_INTEGER
    return SHAPE_OTHER


def shapes_of(texts: list[bytes], signed: bool) -> list[int]:
    return kineto_column(texts, signed=signed)[1].tolist()


def json_number(draw_int: int, decimals: int, negative: bool) -> bytes:
    text = str(draw_int).encode()
    if decimals:
        text += b"." + str(draw_int % 10 ** decimals).zfill(decimals).encode()
    return (b"-" if negative else b"") + text


numbers = st.builds(
    json_number,
    st.one_of(st.integers(0, 10 ** 3), st.integers(0, 10 ** 17),
              st.integers(8 * 10 ** 15, 10 ** 16)),
    st.sampled_from([0, 1, 2, 3, 3, 3, 4, 6]),
    st.booleans(),
)
other_json = st.sampled_from([b'"1.000"', b"1e3", b"1.5e3", b"null", b"true", b"[1,2]",
                              b'{"a":1}', b"-0.000", b"0", b"9000000000000000"])


@given(st.lists(st.one_of(numbers, numbers, numbers, other_json), min_size=1, max_size=8),
       st.booleans())
def test_each_value_shape_matches_one_value_at_a_time(texts, signed):
    assert shapes_of(texts, signed) == [reference(t, signed) for t in texts]


@given(st.lists(st.one_of(numbers, numbers, st.just(b"")), min_size=1, max_size=8),
       st.sampled_from(["ts", "dur"]), st.booleans())
def test_a_column_read_at_once_holds_each_exact_value(texts, key, strict):
    """Whichever code reads the column (the C extension, numpy, or one value at a time),
    each value is its floor in ns, whether it is an integer literal, and whether it is
    there at all, as timebase gives them one by one; a value out of range is refused
    where the column is read (`strict`), else absent and noted as odd."""
    events = [Event(**{key: msgspec.Raw(t)}) for t in texts]
    observer = _Observer(b",".join([b"{}"] * len(texts)), 0, Context(), events)
    expected, refused = [], False
    for text in texts:
        if not text:
            expected.append((0, False, False))
            continue
        low = 0 if key == "dur" else -timebase.MAX_ABS_US
        refused |= not low <= float(text) < timebase.MAX_ABS_US
        expected.append((timebase.parse_decimal(text).floor_ns(),
                         timebase.is_integer_text(text), True))
    try:
        ns, integer, present = observer._column(key, np.full(len(texts), strict))
    except ChunkError:
        assert refused and strict
        return
    assert not (refused and strict)
    odd = [i for i, row in enumerate(expected) if row[2] and not low_enough(texts[i], key)]
    assert sorted(observer.odd) == odd
    for i in odd:
        expected[i] = (0, False, False)
    assert list(zip(ns.tolist(), integer.tolist(), present.tolist())) == expected


def low_enough(text: bytes, key: str) -> bool:
    """Whether a number text is within what the index accepts for `key`."""
    low = 0 if key == "dur" else -timebase.MAX_ABS_US
    return low <= float(text) < timebase.MAX_ABS_US


def test_kineto_shapes():
    ts = [b"1764400000000000.000", b"1764400000000012.345", b"-5.000"]
    assert shapes_of(ts, signed=True) == [SHAPE_DECIMAL] * 3
    assert shapes_of(ts, signed=False) == [SHAPE_DECIMAL, SHAPE_DECIMAL, SHAPE_OTHER]  # a dur < 0
    ints = [b"17", b"8999999999999999"]
    assert shapes_of(ints, signed=False) == [SHAPE_INTEGER] * 2
    too_big = [b"9000000000000000.000"]  # 9e15 µs: past int64 nanoseconds' safe range
    assert shapes_of(too_big, signed=True) == [SHAPE_OTHER]
    mixed = [b"1.000", b"2", b"[1,2]", b"1.2345", b"3"]
    assert shapes_of(mixed, signed=True) == [SHAPE_DECIMAL, SHAPE_INTEGER, SHAPE_OTHER,
                                             SHAPE_OTHER, SHAPE_INTEGER]
    floats = [b"68.0", b"0.25", b"-1.5", b"8999999999999999.9", b"1.", b".5", b"1.5.0"]
    assert shapes_of(floats, signed=True) == [SHAPE_DECIMAL] * 4 + [SHAPE_OTHER] * 3


@pytest.mark.parametrize("odd", [b"0", b"12", b"1764400000000001.5",
                                 b"1764400000000001.5000", b"null"])
def test_one_odd_ts_in_a_chunk_is_read_alone(odd, monkeypatch):
    """`"ts": 0` on metadata among three-decimal epoch values (or integer µs among
    fractional ones, or an odd value) is read by its own shape: the regular values are
    parsed as a column, only values of no Kineto shape one by one, and every value is
    the same as if each had been read alone."""
    regular = [b"1764400000000%03d.125" % k for k in range(200)]
    texts = [*regular[:100], odd, *regular[100:]]
    events = [Event(ts=msgspec.Raw(t)) for t in texts]
    observer = _Observer(b",".join([b"{}"] * len(texts)), 0, Context(), events)
    one_by_one = []
    real = extract.time_value
    monkeypatch.setattr(extract, "time_value",
                        lambda text, key: one_by_one.append(text) or real(text, key))
    ns, integer, present = observer._column("ts", np.zeros(len(texts), bool))
    assert one_by_one == ([] if reference(odd, True) != SHAPE_OTHER else [odd])
    expected = [(timebase.parse_decimal(t).floor_ns(), timebase.is_integer_text(t), True)
                if t != b"null" else (0, False, False) for t in texts]
    assert list(zip(ns.tolist(), integer.tolist(), present.tolist())) == expected


def test_float_durations_are_read_as_a_column(monkeypatch):
    """Older exporters write `dur` as a float (`"dur": 68.0` next to integer `ts`): one to
    three decimals are exact in ns, so such a chunk is parsed as columns, none of its
    values one by one, and each value is the one timebase reads."""
    texts = [b"68.0", b"0.5", b"1346.25", b"7", b"12.125"] * 40
    events = [Event(dur=msgspec.Raw(t)) for t in texts]
    observer = _Observer(b",".join([b"{}"] * len(texts)), 0, Context(), events)
    monkeypatch.setattr(extract, "time_value", lambda text, key: pytest.fail(
        f"{text!r} read one by one"))
    ns, integer, present = observer._column("dur", np.ones(len(texts), bool))
    expected = [(timebase.parse_decimal(t).floor_ns(), timebase.is_integer_text(t), True)
                for t in texts]
    assert list(zip(ns.tolist(), integer.tolist(), present.tolist())) == expected


def test_provenance_is_the_first_event_with_the_key_in_its_args():
    """A tracestream output carries `_compact_gpu_track` in the args of moved events; the
    same words in a name, a string value or a nested object are not provenance."""
    events = [
        b'{"ph": "X", "name": "_compact_gpu_track", "pid": 1, "tid": 1, "ts": 1, "dur": 1}',
        b'{"ph": "X", "name": "k", "args": {"note": "\\"_compact_gpu_track\\": 1"}}',
        b'{"ph": "i", "name": "k", "args": {"nested": {"_compact_gpu_track": 1}}}',
        b'{"ph": "X", "name": "k", "args": {"_compact_gpu_track": null}}',
        b'{"ph": "X", "name": "k", "args": {"_compact_gpu_track": {"pid": 0}}}',
    ]
    assert observe_chunk(b", ".join(events), 0, Context()).provenance == 3
    assert observe_chunk(b", ".join(events[:3]), 0, Context()).provenance is None


def test_provenance_spelled_with_an_escape_is_still_provenance():
    """JSON may spell the key with a `\\u` escape: the decoded key is the same, so the
    event is provenance even though its bytes never spell `_compact_gpu_track`."""
    events = [
        b'{"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {}}',
        b'{"ph": "X", "name": "k", "args": {"_compact_gpu\\u005ftrack": {"pid": 0}}}',
    ]
    assert observe_chunk(b", ".join(events), 0, Context()).provenance == 1
    assert observe_chunk(events[0], 0, Context()).provenance is None


def test_anchors_context_skips_the_other_events_and_provenance_and_keeps_the_rest():
    """`anchors` reports neither the first other event per track nor provenance, so its
    workers do not look for them; slices, their tracks and matches are what they were."""
    events = b", ".join([
        b'{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 9, "tid": 9, "ts": 1, "dur": 1}',
        b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1,'
        b' "args": {"_compact_gpu_track": {"pid": 0}}}',
        b'{"ph": "i", "name": "mark", "pid": 0, "tid": 7, "ts": 3}',
    ])
    patterns = {"anchor": re.compile("^k$")}
    full = observe_chunk(events, 0, Context(patterns=patterns, records=False, bounds=False))
    lean = observe_chunk(events, 0, Context(patterns=patterns, records=False, bounds=False,
                                            track_facts=False))
    assert (full.provenance, sorted(full.other_on_track)) == (1, [0, 1])
    assert (lean.provenance, lean.other_on_track) == (None, {})
    assert lean.tracks == [(0, 7)] and full.tracks[0] == (0, 7)
    assert lean.slices.tobytes() == full.slices.tobytes()
    assert lean.matches["anchor"][0].tobytes() == full.matches["anchor"][0].tobytes()


def test_only_complete_events_are_activity_and_odd_categories_are_other():
    """Kinds come from `cat` for `X` events only; an object or array category is no
    activity (and no refusal), and flows and thread metadata are candidates by phase."""
    events = [
        b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}',
        b'{"ph": "i", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2}',
        b'{"ph": "X", "cat": {"a": 1}, "name": "k", "pid": 0, "tid": 7, "ts": 3, "dur": 1}',
        b'{"ph": "s", "cat": ["ac2g"], "id": 1, "pid": 0, "tid": 7, "ts": 4}',
        b'{"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "t"}}',
        b'{"ph": "X", "cat": "gpu_memcpy", "name": "m", "pid": 0, "tid": 8, "ts": 5, "dur": 1}',
    ]
    facts = observe_chunk(b", ".join(events), 0, Context())
    assert facts.candidates["index"].tolist() == [0, 3, 4, 5]
    assert facts.candidates["kind"].tolist() == [KERNEL, FLOW, META, MEMCPY]
    assert facts.slices["cand"].tolist() == [0, 3]
    assert facts.flow_categories == {"['ac2g']": 1}
    assert facts.phase_counts == {"X": 3, "i": 1, "s": 1, "M": 1}


@pytest.mark.parametrize("lacking, missing", [
    (b'"pid": 0, "ts": 3, "dur": 1', "tid"),
    (b'"tid": 7, "ts": 3, "dur": 1', "pid"),
    (b'"pid": null, "tid": 7, "ts": 3, "dur": 1', "pid"),
    (b'"pid": 0, "tid": 7, "dur": 1', "ts"),
    (b'"pid": 0, "tid": 7, "ts": 3', "dur"),
    (b'"tid": 7, "dur": 1', "ts"),
])
def test_the_first_gpu_event_without_a_place_is_refused_by_what_it_lacks(lacking, missing):
    """A GPU slice needs pid, tid, ts and dur (named in that order of checking); host
    events and flows may lack them, and a flow without them binds nothing."""
    events = [
        b'{"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 1}',
        b'{"ph": "s", "cat": "ac2g", "id": 1, "pid": 0, "ts": 2}',
        b'{"ph": "f", "cat": "ac2g", "id": 1, "pid": 0, "tid": 7, "ts": 2}',
        b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 2, "dur": 1}',
    ]
    facts = observe_chunk(b", ".join(events), 0, Context())
    assert facts.candidates["index"].tolist() == [2, 3]
    assert facts.candidates["kind"].tolist() == [FLOW, KERNEL]
    placeless = b'{"ph": "X", "cat": "kernel", "name": "k", %b}' % lacking
    later = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "ts": 4}'
    with pytest.raises(ChunkError, match=f"GPU activity event has no `{missing}`") as refused:
        observe_chunk(b", ".join([*events, placeless, later]), 0, Context())
    assert refused.value.local == 4


def test_flow_ids_are_packed_where_they_are_small_integers_and_kept_otherwise():
    """A flow's id goes in its packed row when it is an integer within ±2**62; any other id
    (text, a big number, none) is kept as it is, by candidate, for messages."""
    ids = [b"5", b'"abc"', b"4611686018427387904", b"-7", None, b"1.0"]
    events = [b'{"ph": "s", "cat": "ac2g", %b"pid": 0, "tid": 7, "ts": %d}' % (
        b'"id": %b, ' % i if i is not None else b"", k) for k, i in enumerate(ids)]
    facts = observe_chunk(b", ".join(events), 0, Context())
    no_id = -(2**63)
    assert facts.flows["id"].tolist() == [5, no_id, no_id, -7, no_id, no_id]
    assert facts.flows["ts"].tolist() == [0, 1000, 2000, 3000, 4000, 5000]
    assert facts.flow_ids == {1: "abc", 2: 2**62, 4: None, 5: 1.0}
    assert facts.flow_categories == {"ac2g": 6}


def test_a_matched_kernel_with_a_duplicate_key_is_refused():
    """The anchors' ts, dur, name... are read: a second value for one is refused, while the
    same words as values (counted at first, then parsed) are no duplicate."""
    ctx = Context(patterns={"a": re.compile("^anchor$")})
    kernel = (b'{"ph": "X", "cat": "kernel", "name": "anchor", "pid": 0, "tid": 7, '
              b'"ts": %d, "dur": 1%s}')
    quiet = [kernel % (k, b"") for k in range(3)]
    wordy = kernel % (5, b', "args": {"note": "ts", "name": "dur"}')
    facts = observe_chunk(b", ".join([*quiet, wordy]), 0, ctx)
    assert len(facts.matches["a"][0]) == 4
    doubled = kernel % (9, b', "ts": 10')
    with pytest.raises(ChunkError, match="duplicate key `ts`") as refused:
        observe_chunk(b", ".join([*quiet, doubled]), 100, ctx)
    assert refused.value.local == 3


@pytest.mark.parametrize("ctx", [Context(patterns={"a": re.compile("^anchor$")}),
                                 Context(patterns={"a": re.compile("^anchor$")}, records=False,
                                         bounds=False)], ids=["layers", "anchors"])
def test_a_key_spelled_with_escapes_in_a_matched_kernel_is_a_duplicate_too(backend, ctx):
    """Keys are counted in each matched kernel's own bytes: an escaped spelling of a key
    it already has is found by the parse (the backslash makes it a suspect), while a
    backslash in another event, or a key word in an unmatched one, refuses nothing."""
    kernel = (b'{"ph": "X", "cat": "kernel", "name": "%s", "pid": 0, "tid": 7, '
              b'"ts": %d, "dur": 1%s}')
    others = [kernel % (b"other", 1, b', "ts": 2'),  # not matched: never interpreted
              kernel % (b"anchor", 3, b', "args": {"note": "a \\"quoted\\" ts"}')]
    facts = observe_chunk(b", ".join(others + [kernel % (b"anchor", 5, b"")]), 0, ctx)
    assert len(facts.matches["a"][0]) == 2
    escaped = kernel % (b"anchor", 9, b', "t\\u0073": 10')
    with pytest.raises(ChunkError, match="duplicate key `ts`") as refused:
        observe_chunk(b", ".join(others + [escaped]), 100, ctx)
    assert refused.value.local == 2


def test_slices_get_tracks_and_groups_in_order_of_first_appearance():
    """Tracks are (pid, tid), groups (pid, device) with scopes a group of their own; an
    object as a device is refused at its event."""
    def event(cat, pid, tid, args=b""):
        return (b'{"ph": "X", "cat": "%b", "name": "k", "pid": %b, "tid": %b, "ts": 1, '
                b'"dur": 1%b}' % (cat, pid, tid, args))
    events = [
        event(b"kernel", b"1", b"7", b', "args": {"device": 0}'),
        event(b"gpu_user_annotation", b"1", b"9", b', "args": {"device": 0}'),
        event(b"kernel", b'"gpu"', b"7"),
        event(b"gpu_memcpy", b"1", b"8", b', "args": {"device": "0"}'),
        event(b"kernel", b"1", b"7", b', "args": {"device": 0.0}'),
    ]
    facts = observe_chunk(b", ".join(events), 0, Context(count_names=True, records=False))
    assert facts.tracks == [(1, 7), (1, 9), ("gpu", 7), (1, 8)]
    assert facts.groups == [(1, 0), (1, "scopes"), ("gpu", None), (1, "0")]
    assert facts.slices["track"].tolist() == [0, 1, 2, 3, 0]
    assert facts.slices["group"].tolist() == [0, 1, 2, 3, 0]  # 0.0 == 0, as a dict has it
    odd = event(b"kernel", b"1", b"7", b', "args": {"device": {"id": 0}}')
    with pytest.raises(ChunkError, match="`args.device` of a GPU event") as refused:
        observe_chunk(b", ".join([*events, odd]), 0, Context(count_names=True, records=False))
    assert refused.value.local == 5


def test_phases_and_kinds_are_counted_in_order_of_first_appearance():
    """Phase counts keep the first-seen order of `ph` (None included); categories are
    classified once each, and a chunk of many distinct phases is counted all the same."""
    def event(ph, cat):
        return b'{"ph": %b, "cat": %b, "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}' % (
            ph, cat)
    events = [event(b'"i"', b'"cpu_op"'), event(b'"X"', b'"kernel"'), event(b"null", b"7"),
              event(b'"X"', b'"gpu_memcpy"'), event(b'"i"', b'"kernel"')]
    facts = observe_chunk(b", ".join(events), 0, Context())
    assert list(facts.phase_counts.items()) == [("i", 2), ("X", 2), (None, 1)]
    assert facts.slices["kind"].tolist() == [KERNEL, MEMCPY]
    many = [event(b'"p%d"' % k, b'"cpu_op"') for k in range(40)]
    facts = observe_chunk(b", ".join(many + events), 0, Context())
    assert len(facts.phase_counts) == 43 and facts.phase_counts["X"] == 2


def test_end_out_of_range_is_found_without_overflowing():
    from tracestream.index.numbers import end_out_of_range

    limit = 9_200_000_000_000_000_000
    start = np.array([1_700_000_000_000_000_000, -limit + 1, 0, limit - 1, 5], np.int64)
    dur = np.array([8_000_000_000_000_000_000, limit - 1, limit - 1, 1, 0], np.int64)
    assert end_out_of_range(start, dur).tolist() == [True, False, False, True, False]


_MALFORMED_CHUNKS = [
    b'{"ph": "s", "cat": "ac2g", "id": [1, {"a": }], "pid": 0, "tid": 7, "ts": 1}',
    b'{"ph": "f", "cat": "ac2g", "id": 1, "bp": "e\\x", "pid": 0, "tid": 7, "ts": 1}',
    b'{"ph": "s", "cat": "ac2g", "id": ' + b"[" * 2000 + b"]" * 2000 + b', "pid": 0}',
    b'{"ph": "s", "cat": "ac2g", "id": 1, "pid": 1.5, "tid": 7, "ts": 1}',
    b'{"ph": "X", "cat": "kernel", "id": 1, "pid": 0, "tid": 7, "ts": 1, "dur": 2, '
    b'"args": {"device": 0}, "bp": nul}',
    b'{"ph": 5, "id": {"bp": "e"}}',
    b'{"ph": "s", "id": "\xff"}',
]


@pytest.mark.parametrize("chunk", _MALFORMED_CHUNKS)
def test_read_only_decode_refuses_what_the_full_decode_refuses(chunk):
    """The read-only commands skip `id` and `bp` (decode.decoder_for) yet refuse the same
    malformed events with the same message, event and byte."""
    good = b'{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "x"}}'
    refusals = []
    for ctx in (Context(), Context(count_names=True, records=False)):
        with pytest.raises(ChunkError) as refused:
            observe_chunk(b", ".join([good, chunk]), 100, ctx)
        refusals.append((refused.value.message, refused.value.offset, refused.value.local))
    assert refusals[0] == refusals[1]


def test_read_only_decode_reads_flows_whatever_their_id_and_bp():
    events = [b'{"ph": "f", "cat": "ac2g", "id": %b, "bp": %b, "pid": 0, "tid": 7, "ts": %d}'
              % (i, bp, k) for k, (i, bp) in enumerate([(b'{"x": [1]}', b"[]"), (b"3", b'"e"')])]
    facts = observe_chunk(b", ".join(events), 0, Context(count_names=True, records=False))
    assert facts.flow_categories == {"ac2g": 2} and facts.phase_counts == {"f": 2}
    assert decode.decoder_for(Context(records=False)) is not decode.decoder_for(Context())


@pytest.mark.parametrize("categories, counted", [
    ([b'"ac2g"', b'"ac2g"', b'"fwdbwd"'], {"ac2g": 2, "fwdbwd": 1}),
    # equal as keys, apart as text: 1 and true; 1 and "1" are one category
    ([b'"ac2g"', b"1", b"true", b'"1"', b"1.0", b"null"],
     {"ac2g": 1, "1": 2, "True": 1, "1.0": 1, "None": 1}),
    ([b'["ac2g"]', b'"ac2g"'], {"['ac2g']": 1, "ac2g": 1}),
])
def test_flow_categories_are_counted_alike_by_the_read_only_path_and_the_rewrite_path(
        categories, counted):
    """`inspect` counts flow categories itself (its decode has no flow ids); it must count
    them as the rewrite's index pass does, in the same order; `anchors` reports none."""
    events = b", ".join(b'{"ph": "s", "cat": %b, "id": 1, "pid": 0, "tid": 7, "ts": %d}'
                        % (cat, k) for k, cat in enumerate(categories))
    read_only = observe_chunk(events, 0, Context(count_names=True, records=False))
    assert list(read_only.flow_categories.items()) == list(counted.items())
    assert observe_chunk(events, 0, Context()).flow_categories == read_only.flow_categories
    assert not observe_chunk(events, 0, Context(records=False)).flow_categories


def test_the_category_memo_is_shared_by_chunks_and_bounded(monkeypatch):
    """A process classifies each category once for all its chunks (not once per chunk), and
    a trace of ever new categories cannot grow the memo past its bound, even in one chunk."""
    monkeypatch.setattr(extract, "_CATEGORY_KINDS", extract.CategoryKinds(limit=10))
    odd = [b'{"ph": "X", "cat": "odd%d", "name": "n", "pid": 1, "tid": 1, "ts": %d, "dur": 1}'
           % (k, k) for k in range(50)]
    observe_chunk(b", ".join(odd), 0, Context(count_names=True, records=False))
    assert 1 <= len(extract._CATEGORY_KINDS) <= 10
    extract._CATEGORY_KINDS.clear()
    kernel = (b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2, '
              b'"args": {"device": 0}}')
    facts = observe_chunk(kernel, 0, Context(count_names=True, records=False))
    assert facts.slices["kind"].tolist() == [KERNEL]
    observe_chunk(b", ".join(odd[:3]), 0, Context(count_names=True, records=False))
    assert len(extract._CATEGORY_KINDS) == 4  # kept across chunks below the bound
    with_new = [*odd[3:12], kernel]  # the bound is met, the memo emptied, `kernel` still a kernel
    facts = observe_chunk(b", ".join(with_new), 0, Context(count_names=True, records=False))
    assert facts.slices["kind"].tolist()[-1] == KERNEL
    assert len(extract._CATEGORY_KINDS) <= 10


def test_events_without_a_category_are_classified_once(monkeypatch):
    """Kineto writes instants and metadata without `cat`: a chunk of them asks the memo's
    classifier once, not once per event (each a Python call in the C extension's loop)."""
    monkeypatch.setattr(extract, "_CATEGORY_KINDS", extract.CategoryKinds())
    asked = []
    classify = extract.CategoryKinds.__missing__
    monkeypatch.setattr(extract.CategoryKinds, "__missing__",
                        lambda memo, cat: asked.append(cat) or classify(memo, cat))
    instants = [b'{"ph": "i", "s": "t", "name": "sync", "pid": 1, "tid": 1, "ts": %d}' % k
                for k in range(20)]
    kernel = (b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2, '
              b'"args": {"device": 0}}')
    facts = observe_chunk(b", ".join([*instants, kernel, kernel]), 0, Context())
    assert asked == [None, "kernel"]
    assert facts.slices["kind"].tolist() == [KERNEL, KERNEL]
    assert dict(extract._CATEGORY_KINDS) == {None: OTHER, "kernel": KERNEL}
