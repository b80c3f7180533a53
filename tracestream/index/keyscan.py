"""Where keys occur in a chunk of JSON text, found in bulk instead of per-event Python.

Both passes need the positions of a few quoted keys (`"pid": `, `"ts"`, ...) and
of the separators between events, in thousands of events per chunk. The C
extension finds them in one pass each (see `_native`; its numpy twin compares the keys'
first two bytes over the chunk at once). Either way the results are token positions, not
a parse: a key can also appear inside a string or a nested object, so callers
count occurrences per event and take the careful path where the count is not
exactly what a Kineto event has.
"""

from __future__ import annotations

import numpy as np

from tracestream import _native


class EventKeys:
    """Per event [start, end) of a chunk: where quoted keys occur, each key counted once.

    The duplicate check and the splice positions ask about the same keys of the same
    events; the `keys` they will ask about are found in one pass (`_native.event_keys`).
    """

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray,
                 keys: tuple[bytes, ...]):
        self.data = data
        self.starts = np.ascontiguousarray(starts, np.int64)
        self.ends = np.ascontiguousarray(ends, np.int64)
        self._found: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self._find(keys)

    def __call__(self, key: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Per event: (where its first `key` starts, -1 without one; how many it has)."""
        if key not in self._found:
            self._find((key,))
        return self._found[key]

    def _find(self, keys: tuple[bytes, ...]) -> None:
        keys = tuple(dict.fromkeys(keys))
        first, count = _native.event_keys(self.data, self.starts, self.ends, keys)
        first = np.frombuffer(first, np.int64).reshape(len(keys), -1)
        count = np.frombuffer(count, np.int32).reshape(len(keys), -1)
        self._found.update(zip(keys, zip(first, count)))


def continues(data: bytes, positions: np.ndarray, literal: bytes) -> np.ndarray:
    """Per position: does `literal` start there?"""
    ok = _native.continues(data, np.ascontiguousarray(positions, np.int64), literal)
    return np.frombuffer(ok, bool)


def integer_ends(data: bytes, begin: np.ndarray) -> np.ndarray:
    """Per position: the end of the integer literal starting there when a comma follows it
    directly (Kineto's `"tid": 7,`), else -1."""
    return np.frombuffer(_native.integer_ends(data, np.ascontiguousarray(begin, np.int64)),
                         np.int64)


def separators(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every `}` ws* `,` ws* `{` in `data`, as re.finditer would give them."""
    closes, opens = _native.separators(data)
    return np.frombuffer(closes, np.int64), np.frombuffer(opens, np.int64)


SPLICE_FIELDS = [("pid_start", "<i4"), ("pid_end", "<i4"), ("tid_start", "<i4"),
                 ("tid_end", "<i4"), ("args_brace", "<i4")]
"""Where an event's pid and tid values are and where its args object's members begin,
relative to the event's first byte (see `splice_positions`)."""
CAREFUL = -1  # pid_start/tid_start: the keys are not where a splice may trust them
NO_ARGS = -1  # args_brace: the event has no "args" at all
ODD_ARGS = -2  # args_brace: "args" occurs otherwise (twice, or spelled `"args":{`)

_PID = b'"pid": '
_TID = b'"tid": '
_ARGS = b'"args": {'
SPLICE_KEYS = (b'"pid"', b'"tid"', b'"args"')
"""The keys `splice_positions` counts."""


def splice_positions(keys: EventKeys) -> np.ndarray:
    """Per event of `keys`: its SPLICE_FIELDS, relative to its start.

    Compaction rewrites the pid and tid of most GPU events and adds a member to
    their args. The index pass finds where once, a chunk at a time, so the rewrite
    pass only copies bytes. Where "pid", "tid" and "args" occur once in an event of
    a chunk without backslashes, they are its top-level keys (every `"` delimits a
    string); each must then be spelled as Kineto does (`"pid": 0, "tid": 7,`,
    `"args": {`). Anything else is marked for the careful way (write.relocate.relocate).
    """
    starts = keys.starts
    out = np.empty(len(starts), SPLICE_FIELDS)
    out["pid_start"] = out["pid_end"] = out["tid_start"] = out["tid_end"] = CAREFUL
    out["args_brace"] = ODD_ARGS
    if not len(starts) or b"\\" in keys.data:
        return out
    for literal, first, last in ((_PID, "pid_start", "pid_end"), (_TID, "tid_start", "tid_end")):
        found, begin, end = _value_spans(keys, literal)
        out[first][found] = begin - starts[found]
        out[last][found] = end - starts[found]
    brace = _args_braces(keys)
    out["args_brace"] = np.where(brace >= 0, brace - starts, brace)
    return out


def _value_spans(keys: EventKeys, literal: bytes):
    """(events, value starts, value ends) of the events whose only `"key"` is spelled
    `literal` and followed by an integer and a comma.

    The key is counted in every spelling (`"pid"`), so an event whose top-level key
    is spelled otherwise is not fooled by Kineto's spelling in a nested object.
    """
    first, count = keys(literal[: literal.index(b'"', 1) + 1])
    found = np.flatnonzero(count == 1)
    at = first[found]
    spelled = continues(keys.data, at, literal)
    found, at = found[spelled], at[spelled]
    begin = at + len(literal)
    end = integer_ends(keys.data, begin)
    ok = end >= 0
    return found[ok], begin[ok], end[ok]


def _args_braces(keys: EventKeys) -> np.ndarray:
    """Per event: the position after its `"args": {`, NO_ARGS or ODD_ARGS.

    Counting every `"args"` token, not only Kineto's spelling, keeps an event whose
    args are spelled differently from getting a second "args" member.
    """
    first, count = keys(b'"args"')
    braces = np.where(count == 0, NO_ARGS, ODD_ARGS)
    one = np.flatnonzero(count == 1)
    good = one[continues(keys.data, first[one], _ARGS)]
    braces[good] = first[good] + len(_ARGS)
    return braces
