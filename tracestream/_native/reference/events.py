"""Fields of a chunk's decoded events, read in Python: the twins of the C extension's
readers of events (`classify`, `event_values`, the key and count functions).

`events` is a list of msgspec structs (`model.Event`, `model.CheckEvent`).
Values are numbered and counted as a dict's keys are (1, 1.0 and True are one key),
except where a function says otherwise; an object or array where a key is needed is a
TypeError, as it is in C, and the caller refuses it with its own message.
"""

from __future__ import annotations

from collections import Counter
from itertools import repeat

import numpy as np

from tracestream.model import binds_next


def scan_events(document, decode_value, decode_event, unset, bracketed, origins=False):
    """None: without the C extension every chunk is left to msgspec's decode, which is what
    the scan is held to."""
    return None


def event_values(events, indices: list[int], key: str) -> list:
    """events[i].<key> for each of the indices."""
    return [getattr(events[i], key) for i in indices]


def classify(events, phase_codes: dict, other_phase: int, kinds
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counter]:
    """Per event: phase_codes.get(ph, other_phase) and kinds[cat] (int8), whether it has a
    pid and a tid (bool), and how often each ph occurs, in order of first appearance."""
    n = len(events)
    phs = [e.ph for e in events]
    phases = np.fromiter(map(phase_codes.get, phs, repeat(other_phase)), np.int8, n)
    kind_codes = np.fromiter(map(kinds.__getitem__, [e.cat for e in events]), np.int8, n)
    owned = np.fromiter((e.pid is not None and e.tid is not None for e in events), bool, n)
    return phases, kind_codes, owned, Counter(phs)


def first_set(events, outer: str, inner: str, unset) -> int | None:
    """The index of the first event whose `outer` is not None and outer.inner not `unset`."""
    for i, e in enumerate(events):
        value = getattr(e, outer)
        if value is not None and getattr(value, inner) is not unset:
            return i
    return None


def track_keys(events, indices: list[int]) -> tuple[np.ndarray, list]:
    """Each event's (pid, tid) as a code into the distinct keys, listed in order of first
    appearance."""
    return _coded([(events[i].pid, events[i].tid) for i in indices])


def slice_keys(events, indices: list[int], scopes, scopes_device) -> tuple:
    """(track codes, track keys, group codes, group keys): `track_keys`, and each event's
    (pid, device) coded alike; the device is args.device (None without args), or
    `scopes_device` where `scopes` is set."""
    picked = [events[i] for i in indices]
    devices = [scopes_device if scope else (e.args.device if e.args is not None else None)
               for e, scope in zip(picked, np.asarray(scopes, bool).tolist())]
    track_codes, track_keys = _coded([(e.pid, e.tid) for e in picked])
    group_codes, group_keys = _coded([(e.pid, device) for e, device in zip(picked, devices)])
    return track_codes, track_keys, group_codes, group_keys


def first_unhashable_device(events, slices: list[int], scopes) -> int | None:
    """The first position k whose event events[slices[k]] has an args.device that cannot be
    a key (an object or array), skipping positions where `scopes` is set."""
    for k, (i, scope) in enumerate(zip(slices, np.asarray(scopes, bool).tolist())):
        args = events[i].args
        if not scope and args is not None and isinstance(args.device, (dict, list)):
            return k
    return None


def name_counts(events, slices: list[int], kernels: list[int], groups) -> dict[int, dict]:
    """{group: {name: count}} of events[slices[k]] for k in `kernels`, each under groups[k]:
    groups and names in order of first appearance."""
    counts: dict = {}
    for k in kernels:
        named = counts.setdefault(groups[k], {})
        name = events[slices[k]].name
        named[name] = named.get(name, 0) + 1
    return counts


def named(events, slices: list[int], kernels: list[int], wanted: dict) -> list[int]:
    """The k in `kernels` (in order) whose event events[slices[k]] has a name in `wanted`."""
    return [k for k in kernels if events[slices[k]].name in wanted]


def match_keys(events, indices: list[int]) -> tuple:
    """(stream codes, stream keys, name codes, name keys) of the events: each one's
    args.stream (None without args) and name as a code into the distinct keys
    (type(value), value), in order of first appearance, so 1, 1.0 and true stay three."""
    picked = [events[i] for i in indices]
    streams = [(type(x), x) for x in (e.args.stream if e.args is not None else None
                                      for e in picked)]
    stream_codes, stream_keys = _coded(streams)
    name_codes, name_keys = _coded([(type(e.name), e.name) for e in picked])
    return stream_codes, stream_keys, name_codes, name_keys


def flow_columns(events, flows: list[int], no_id: int) -> tuple:
    """(track codes, track keys, binds next, ids, category counts) of the flow events:
    `track_keys`; whether each binds to the next slice; its id where that is an int
    strictly between -2**62 and 2**62, else `no_id`; and how often each category occurs."""
    picked = [events[i] for i in flows]
    codes, keys = _coded([(e.pid, e.tid) for e in picked])
    binds = np.array([binds_next(e.ph, e.bp) for e in picked], bool)
    ids = np.array([e.id if type(e.id) is int and -(2**62) < e.id < 2**62 else no_id
                    for e in picked], np.int64)
    return codes, keys, binds, ids, category_counts([e.cat for e in picked])


def category_counts(categories: list) -> Counter:
    """How often each category occurs, its str where it is no string (`1` and `"1"` are
    one category, `1` and `true` two, though they are equal as keys)."""
    try:
        counts = Counter(categories)
    except TypeError:  # an object or array as a category
        counts = None
    if counts is not None and all(type(cat) is str for cat in counts):
        return counts
    return Counter(cat if isinstance(cat, str) else str(cat) for cat in categories)


def _coded(keys: list) -> tuple[np.ndarray, list]:
    """(each key's code, as int32; the distinct keys in order of first appearance)."""
    numbers: dict = {}
    codes = np.fromiter((numbers.setdefault(key, len(numbers)) for key in keys), np.int32,
                        len(keys))
    return codes, list(numbers)
