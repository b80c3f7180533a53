"""Anchor matches and kernel names of a chunk: the part of the observer the patterns drive."""

from __future__ import annotations

from collections import Counter

import numpy as np
import orjson

from tracestream import _native
from tracestream.index.facts import (
    SCOPES,
)
from tracestream.index.matches import AS_TEXT, MATCH_DTYPE, number_forms
from tracestream.index.records import take_rows
from tracestream.model import GPU_SCOPE, KERNEL


class MatchFinding:
    """Methods of the chunk observer (`extract._Observer`), which holds the state they read."""

    def _kernel_names(self, slices, kernels, groups) -> dict[int, Counter]:
        """How often each kernel name occurs, per (chunk-local) group."""
        try:
            counted = _native.name_counts(self.events, slices, kernels, groups)
            return {group: Counter(counts) for group, counts in counted.items()}
        except TypeError:  # an object or array as a name: counted by its JSON text below
            pass
        names = [self.events[slices[k]].name for k in kernels]
        kernel_groups = [groups[k] for k in kernels]
        distinct = dict.fromkeys(kernel_groups)
        return {group: name_counts_of(names if len(distinct) == 1 else [  # mostly one group
                    name for name, g in zip(names, kernel_groups) if g == group])
                for group in distinct}

    def _lane_group_codes(self, slices: list[int], kinds: np.ndarray) -> np.ndarray:
        """Each slice's lane group (ctx.lane_groups' code): by its category, and a kernel's
        by its name. Each distinct name is classified once; the kernels of a group are then
        picked by name in one pass (`_native.named`), not one Python step per kernel."""
        groups = self.ctx.lane_groups
        codes = groups.kind_codes()[kinds]
        kernels = np.flatnonzero(kinds == KERNEL).tolist()
        if not kernels:
            return codes
        try:
            counted = _native.name_counts(self.events, slices, kernels, [0] * len(slices))
        except TypeError:  # an object or array as a name: no pattern matches it (compute)
            counted = None
        if counted is None or not all(isinstance(n, str) for n in counted.get(0, ())):
            # one by one: an object is no key, and a dict of names takes True for 1 and 1.0
            for k in kernels:
                name = self.events[slices[k]].name
                codes[k] = groups.of_kernel(name) if hashable(name) else 0
            return codes
        wanted: dict[int, dict] = {}
        for name in counted.get(0, {}):
            code = groups.of_kernel(name)
            if code:
                wanted.setdefault(code, {})[name] = True
        for code, names in wanted.items():
            codes[_native.named(self.events, slices, kernels, names)] = code
        return codes

    def _slice_ids(self, slices: list[int], kinds: np.ndarray) -> tuple[list, list] | None:
        """The slices' track and group ids, as `_intern` gives them (`kinds`: their category
        kinds; None where a device cannot be a key: the caller refuses it)."""
        try:
            track_codes, track_keys, group_codes, group_keys = _native.slice_keys(
                self.events, slices, kinds == GPU_SCOPE, SCOPES)
        except TypeError:
            return None
        tracks, groups = self.tracks, self.groups  # numbered as track() and group() do
        track_ids = np.array([tracks.setdefault(key, len(tracks)) for key in track_keys],
                             np.int64)
        group_ids = np.array([groups.setdefault(key, len(groups)) for key in group_keys],
                             np.int64)
        return (track_ids[np.frombuffer(track_codes, np.int32)].tolist(),
                group_ids[np.frombuffer(group_codes, np.int32)].tolist())

    def _hits(self, slices, sev, kernels, names) -> dict:
        """The patterns each distinct kernel name matches (names that match none left out)."""
        try:
            unique = set(names)
        except TypeError:  # an object or array as a kernel name
            k = kernels[next(j for j, name in enumerate(names) if not hashable(name))]
            raise self.fail(slices[k], "a kernel `name` must be a string (--anchor-regex "
                                       f"matches names), not {json_type(sev[k].name)}") from None
        return self._pattern_hits(unique)

    def _pattern_hits(self, unique) -> dict:
        hits = {}
        for name in unique:
            text = name if isinstance(name, str) else str(name)
            found = [p for p, rx in self.ctx.patterns.items() if rx.search(text)]
            if found:
                hits[name] = found
        return hits

    def _anchor_kernels(self, slices, kind_a) -> list[int] | None:
        """`_matching`, once every slice's device is known to be a key; None where a device
        or name is odd (the caller's path one by one refuses it)."""
        if not self.ctx.patterns:
            return None
        events = self.events
        if _native.first_unhashable_device(events, slices, kind_a == GPU_SCOPE) is not None:
            return None
        kernels = np.flatnonzero(kind_a == KERNEL).tolist()
        picked = [slices[k] for k in kernels]
        # counted per pid (the hint of a pattern that matches nothing on a --pid names that
        # pid's kernels): reading the pids costs what the one count over every slice saved
        try:
            counted = _native.name_counts(events, picked, list(range(len(picked))),
                                          _native.event_values(events, picked, "pid"))
        except TypeError:
            return None
        self.vocabulary = counted
        self._kernel_hits = self._pattern_hits(distinct_names(counted))
        return _native.named(events, slices, kernels, self._kernel_hits)

    def _matching(self, slices, sev, kind_list) -> list[int]:
        """Positions (among the slices) of the kernels whose name matches a pattern."""
        if not self.ctx.patterns:
            return []
        kernels = [k for k, kind in enumerate(kind_list) if kind == KERNEL]
        names = [sev[k].name for k in kernels]
        hits = self._hits(slices, sev, kernels, names)
        return [k for k, name in zip(kernels, names) if name in hits]

    def _matched_kernels(self, slices, kernels, groups) -> tuple[list[int], dict]:
        """The kernels whose name matches a pattern (positions among the slices, in order),
        and the patterns each distinct name matches (see `_hits`); the names per pid go to
        `self.vocabulary` (`groups`: the slices' chunk-local group ids)."""
        if self._kernel_hits is not None:  # `_anchor_kernels` kept the matched kernels only
            return kernels, self._kernel_hits
        try:
            counted = _native.name_counts(self.events, slices, kernels, groups)
        except TypeError:  # an object or array as a name: refused below
            pass
        else:
            self.vocabulary = by_pid(counted, list(self.groups))
            hits = self._pattern_hits(distinct_names(counted))
            return _native.named(self.events, slices, kernels, hits), hits
        sev = [self.events[slices[k]] for k in kernels]
        names = [e.name for e in sev]
        hits = self._hits([slices[k] for k in kernels], sev, range(len(kernels)), names)
        return [k for k, name in zip(kernels, names) if name in hits], hits

    def _values(self, events: list[int], key: str) -> list:
        """The `key` field of each of the events (a scan's read where they lie, see
        decode_chunk)."""
        return _native.event_values(self.events, events, key)

    def _match_keys(self, events: list[int]) -> tuple:
        """(stream codes, streams, name codes, names) of the matched events: each one's
        args.stream and name as a code into the distinct (type, value) keys, in order of
        first appearance; an object or array as a stream is refused."""
        try:
            stream_codes, stream_keys, name_codes, name_keys = _native.match_keys(
                self.events, events)
        except TypeError:  # an object or array as args.stream (names were refused before)
            args = (self.events[i].args for i in events)
            streams = [a.stream if a is not None else None for a in args]
            j = next((j for j, x in enumerate(streams) if not hashable(x)), None)
            if j is None:
                raise
            raise self.fail(events[j], "`args.stream` of a matched kernel must be a number or "
                                       f"a string, not {json_type(streams[j])}") from None
        return (np.frombuffer(stream_codes, np.int32), [x for _, x in stream_keys],
                np.frombuffer(name_codes, np.int32), [x for _, x in name_keys])

    def _matches(self, slices, kernels, start, dur, tracks, groups) -> dict[str, tuple]:
        """Kernels whose name matches a pattern, packed (see matches.MatchTable)."""
        patterns = self.ctx.patterns
        found, hits = self._matched_kernels(slices, kernels, groups)  # among the slices
        events = [slices[k] for k in found]
        self._check_duplicates(events)
        stream_codes, streams_list, name_codes, names_list = self._match_keys(events)
        at = np.array(found, np.int64)
        ts_of = list(map(bytes, self._values(events, "ts")))
        dur_of = list(map(bytes, self._values(events, "dur")))
        forms = number_forms(ts_of, dur_of, start[at], dur[at])
        packed = np.empty(len(found), MATCH_DTYPE)
        packed["ordinal"] = events
        packed["track"] = [tracks[k] for k in found]
        packed["group"] = [groups[k] for k in found]
        packed["start"] = start[at]
        packed["dur"] = dur[at]
        packed["form"] = forms
        packed["stream"] = stream_codes
        packed["name"] = name_codes
        as_text = {j: (ts_of[j].decode(), dur_of[j].decode())
                   for j in np.flatnonzero(forms == AS_TEXT).tolist()}
        out = {}
        everywhere = all(len(hits[n]) == len(patterns) for n in names_list)
        for p in patterns:
            if everywhere:
                rows, texts = packed, as_text  # every match is a match of every pattern
            else:
                keep = np.flatnonzero(np.array([p in hits[n] for n in names_list],
                                               bool)[packed["name"]])
                rows = take_rows(packed, keep)
                texts = {new: as_text[old] for new, old in enumerate(keep.tolist())
                         if old in as_text} if as_text else {}
            out[p] = (rows, names_list, streams_list, texts)
        return out


def distinct_names(counted: dict[object, dict]) -> dict | set:
    """The names of `name_counts`' {group: {name: count}}, each once."""
    if len(counted) == 1:
        return next(iter(counted.values()))
    return set().union(*counted.values())


def by_pid(counted: dict[int, dict], groups: list[tuple]) -> dict:
    """`name_counts`' {local group: {name: count}} as {pid: {name: count}} (`groups`: the
    chunk's (pid, device) per local group id); devices of one pid are merged."""
    merged: dict = {}
    for group, counts in counted.items():
        pid = groups[group][0]
        if pid in merged:
            merged[pid] = Counter(merged[pid]) + Counter(counts)
        else:
            merged[pid] = counts
    return merged


def name_counts_of(names: list) -> Counter:
    """How often each name occurs; an object or array as a name is counted by its JSON text."""
    try:
        return Counter(names)
    except TypeError:
        return Counter(name if hashable(name) else orjson.dumps(name).decode()
                       for name in names)


def hashable(value) -> bool:
    """False for the JSON objects and arrays msgspec decodes into dicts and lists."""
    return not isinstance(value, (dict, list))


def json_type(value) -> str:
    return "an object" if isinstance(value, dict) else "an array"
