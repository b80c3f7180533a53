"""Keys spelled twice in an event: refused where the index reads them (Perfetto and msgspec
would read different values), checked only where a duplicate could change a decision."""

from __future__ import annotations

import json

import numpy as np

from tracestream.index.decode import INTERPRETED_KEYS, MOVED_KEYS
from tracestream.index.facts import (
    DuplicateInFlow,
)
from tracestream.index.keyscan import (
    EventKeys,
)


class DuplicateChecks:
    """Methods of the chunk observer (`extract._Observer`), which holds the state they read."""

    def _check_gpu_duplicates(self, slices, cand_of, keys: EventKeys) -> None:
        """Compaction moves GPU events by their pid, tid, ts and dur: a duplicate is refused.

        The keys' positions in the chunk (see keyscan) give each GPU event's count of
        each key; only an event with more than one (a duplicate, or the key nested in
        `args` or inside a string) or with a backslash (a key may be spelled with
        escapes) is looked at with a parser, which decodes every key.
        """
        suspect = self._suspects(slices, cand_of, keys)
        for k in np.flatnonzero(suspect).tolist():
            dup = duplicate_key(self.raw(slices[k]))
            if dup is not None:
                raise self.fail(slices[k], f"duplicate key `{dup}` in a GPU event (which value "
                                           "would a reader take?)")

    def _flow_duplicates(self, flows: list[int], cand_of,
                         keys: EventKeys) -> dict[int, DuplicateInFlow]:
        """Per track, the first flow with a duplicate key: compaction moves flows of GPU
        streams, and refuses one (the plan knows which tracks move; see `_check_gpu_duplicates`
        for how the few suspects are found)."""
        if not flows:
            return {}
        suspect = self._suspects(flows, cand_of, keys)
        found: dict[int, DuplicateInFlow] = {}
        for k in np.flatnonzero(suspect).tolist():
            i = flows[k]
            dup = duplicate_key(self.raw(i))
            track = self.track(self.events[i].pid, self.events[i].tid)
            if dup is not None and track not in found:
                found[track] = DuplicateInFlow(i, dup)
        return found

    def _suspects(self, events: list[int], cand_of, keys: EventKeys) -> np.ndarray:
        """Per event: may it spell a moved key twice? (more than one occurrence of one, or a
        backslash, since `"t\\u0069d"` is "tid")."""
        at = cand_of[events]
        return self._spelled_twice(events, [keys(key)[1][at] for key in MOVED_KEYS])

    def _spelled_twice(self, events: list[int], counts: list[np.ndarray]) -> np.ndarray:
        """Per event: a key counted more than once (`counts`: per key, per event), or a
        backslash in it."""
        suspect = np.zeros(len(events), bool)
        for count in counts:
            suspect |= count > 1
        if b"\\" in self.data:
            if self._backslashes is None:
                self._backslashes = np.flatnonzero(np.frombuffer(self.data, np.uint8) == 0x5C)
            starts, ends = self.spans
            suspect |= _holding(self._backslashes, starts[events], ends[events])
        return suspect

    def _check_duplicates(self, events: list[int]) -> None:
        """Anchors and terminals are interpreted: a duplicate key in one is refused.

        Each interpreted key is counted in each matched event's bytes alone (one pass,
        `_native.event_keys`; see keyscan.EventKeys); only an event that
        holds one more than once (a duplicate, or the key inside a string or a nested
        object) or a backslash (a key may be spelled with escapes) is parsed.
        """
        if not events:
            return
        starts, ends = self.spans
        at = np.array(events, np.int64)  # converted once, not by each index below
        keys = EventKeys(self.data, starts[at], ends[at], INTERPRETED_KEYS)
        counts = [keys(key)[1] for key in INTERPRETED_KEYS]
        for k in np.flatnonzero(self._spelled_twice(at, counts)).tolist():
            dup = duplicate_key(self.raw(events[k]))
            if dup is not None:
                raise self.fail(events[k], f"duplicate key `{dup}` in a kernel that "
                                           "--anchor-regex or --end-anchor-regex matches")


def _holding(positions: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per event [start, end): does one of the (ascending) `positions` lie in it?"""
    return np.searchsorted(positions, ends) > np.searchsorted(positions, starts)


def duplicate_key(raw: bytes) -> str | None:
    """A key that appears twice in one object of an event (exact, for the few that need it)."""
    found: list[str] = []

    def pairs(items):
        seen = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return dict(items)

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    return found[0] if found else None
