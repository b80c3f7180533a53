"""Where keys occur in a chunk of JSON text, found in bulk instead of per-event Python.

Both passes need the positions of a few quoted keys (`"pid": `, `"ts"`, ...) and
of the separators between events, in thousands of events per chunk. The C
extension (see _native) finds them in one pass each. In numpy, the keys' first
two bytes are found together, by OR-ed comparisons over the chunk a cache-sized
block at a time, the rest checked at the few places left; whitespace is stepped
over for all candidates at once. Either way the results are token positions, not
a parse: a key can also appear inside a string or a nested object, so callers
count occurrences per event and take the careful path where the count is not
exactly what a Kineto event has.
"""

from __future__ import annotations

import numpy as np

from tracestream import _native
from tracestream.read.jsonbytes import SKIP_WS

_QUOTE = 0x22
_COMMA = 0x2C
_MINUS = 0x2D
_MAX_DIGITS = 19
_BLOCK = 256 << 10
"""Bytes compared at a time by whole-chunk scans (a few such blocks fit in a core's L2)."""


class KeyScan:
    """One chunk's bytes as a numpy array, and literal lookups in it."""

    def __init__(self, data: bytes):
        self.data = data
        self.view = np.frombuffer(data, np.uint8)
        self._prefixes: dict[int, np.ndarray] = {}
        self._literals: dict[bytes, np.ndarray] = {}

    def positions(self, literal: bytes) -> np.ndarray:
        """Ascending start offsets of every occurrence of `literal` (which starts with `"`).

        In numpy, the first two bytes are compared over the whole chunk at once (and
        the result shared by keys with the same first letter); the rest only at the
        few places left.
        """
        if literal[:1] != b'"' or len(literal) < 2:
            raise ValueError("KeyScan finds literals of two or more bytes that start with `\"`")
        found = self._literals.get(literal)
        if found is None:
            found = self._literals[literal] = self.followed_by(self._starting(literal[1]),
                                                               literal)
        return found

    def find_literals(self, literals: tuple[bytes, ...]) -> None:
        """Get ready to give the positions of each of `literals`: their first two bytes are
        found in one pass. (With the C extension, `EventKeys` finds keys in C and this
        numpy path is not taken.)"""
        todo = tuple(literal for literal in dict.fromkeys(literals)
                     if literal not in self._literals)
        self.find_prefixes(bytes(literal[1] for literal in todo))

    def _starting(self, byte: int) -> np.ndarray:
        """Positions of `"` followed by `byte` (kept: keys share their first letters)."""
        if byte not in self._prefixes:
            self.find_prefixes(bytes([byte]))
        return self._prefixes[byte]

    def find_prefixes(self, letters: bytes) -> None:
        """Find `"` followed by each of `letters` in one pass over the chunk.

        The chunk is compared a block at a time, so the comparisons' temporaries stay
        in the core's cache instead of streaming megabytes through memory.
        """
        todo = [byte for byte in dict.fromkeys(letters) if byte not in self._prefixes]
        if not todo:
            return
        view = self.view
        found = [np.zeros(0, np.intp)]
        for start in range(0, len(view) - 1, _BLOCK):
            window = view[start : start + _BLOCK + 1]
            follows = window[1:]
            hit = follows == todo[0]
            for byte in todo[1:]:
                hit |= follows == byte
            hit &= window[:-1] == _QUOTE
            found.append(np.flatnonzero(hit) + start)
        positions = np.concatenate(found)
        values = view[positions + 1]
        for byte in todo:
            self._prefixes[byte] = positions[values == byte]

    def continues(self, positions: np.ndarray, literal: bytes) -> np.ndarray:
        """Per position: does `literal` start there?"""
        if _native.native is not None:
            ok = _native.native.continues(self.data, np.ascontiguousarray(positions, np.int64),
                                           literal)
            return np.frombuffer(ok, bool)
        view = self.view
        last = len(view) - 1
        ok = positions <= len(view) - len(literal)
        for k, byte in enumerate(literal):
            ok &= view[np.minimum(positions + k, last)] == byte
        return ok

    def followed_by(self, positions: np.ndarray, literal: bytes) -> np.ndarray:
        """The positions (of a `literal` found before) that also continue with `literal`."""
        return positions[self.continues(positions, literal)]

    def integer_ends(self, begin: np.ndarray) -> np.ndarray:
        """Per position: the end of the integer literal starting there when a comma follows
        it directly (Kineto's `"tid": 7,`), else -1."""
        if _native.native is not None:
            ends = _native.native.integer_ends(self.data, np.ascontiguousarray(begin, np.int64))
            return np.frombuffer(ends, np.int64)
        view = self.view
        last = len(view) - 1
        pos = begin + (view[np.minimum(begin, last)] == _MINUS)
        first = pos.copy()
        for _ in range(_MAX_DIGITS + 1):
            byte = view[np.minimum(pos, last)]
            digit = (byte >= 0x30) & (byte <= 0x39) & (pos <= last)
            if not digit.any():
                break
            pos = pos + digit
        ok = (pos > first) & (pos <= last) & (view[np.minimum(pos, last)] == _COMMA)
        return np.where(ok, pos, -1)


def per_event(positions: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Per event [start, end): (index of its first occurrence, number of occurrences)."""
    first = np.searchsorted(positions, starts)
    return first, np.searchsorted(positions, ends) - first


class EventKeys:
    """Per event [start, end) of a chunk: where quoted keys occur, each key counted once.

    The duplicate check and the splice positions ask about the same keys of the same
    events; the `keys` they will ask about are found in one pass (numpy finds their
    first two bytes in one).
    """

    def __init__(self, scan: KeyScan, starts: np.ndarray, ends: np.ndarray,
                 keys: tuple[bytes, ...]):
        self.scan = scan
        self.starts = starts
        self.ends = ends
        self._found: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self._find(keys)

    def __call__(self, key: bytes) -> tuple[np.ndarray, np.ndarray]:
        """Per event: (where its first `key` starts, -1 without one; how many it has)."""
        if key not in self._found:
            self._find((key,))
        return self._found[key]

    def _find(self, keys: tuple[bytes, ...]) -> None:
        keys = tuple(dict.fromkeys(keys))
        if _native.native is not None:
            first, count = _native.native.event_keys(
                self.scan.data, np.ascontiguousarray(self.starts, np.int64),
                np.ascontiguousarray(self.ends, np.int64), keys)
            first = np.frombuffer(first, np.int64).reshape(len(keys), -1)
            count = np.frombuffer(count, np.int32).reshape(len(keys), -1)
            self._found.update(zip(keys, zip(first, count)))
            return
        self.scan.find_literals(keys)
        for key in keys:
            positions = self.scan.positions(key)
            index, count = per_event(positions, self.starts, self.ends)
            first = positions[np.minimum(index, len(positions) - 1)] if len(positions) else index
            self._found[key] = (np.where(count > 0, first, -1), count)


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
    if not len(starts) or b"\\" in keys.scan.data:
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
    spelled = keys.scan.continues(at, literal)
    found, at = found[spelled], at[spelled]
    begin = at + len(literal)
    end = keys.scan.integer_ends(begin)
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
    good = one[keys.scan.continues(first[one], _ARGS)]
    braces[good] = first[good] + len(_ARGS)
    return braces


_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[list(b" \t\r\n")] = True
_WS_STEPS = 32  # whitespace runs longer than this are finished with a regex


def separators(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every `}` ws* `,` ws* `{` in `data`, as re.finditer would give them.

    In numpy: from every `}`, the whitespace, comma and whitespace after it are
    stepped over for all candidates at once.
    """
    if _native.native is not None:
        closes, opens = _native.native.separators(data)
        return np.frombuffer(closes, np.int64), np.frombuffer(opens, np.int64)
    view = np.frombuffer(data, np.uint8)
    closes = np.flatnonzero(view == 0x7D)
    after = skip_whitespace(data, view, closes + 1)
    closes, after = _where_byte(view, closes, after, 0x2C)
    opens = skip_whitespace(data, view, after + 1)
    closes, opens = _where_byte(view, closes, opens, 0x7B)
    return closes, opens + 1


def _where_byte(view: np.ndarray, keys: np.ndarray, pos: np.ndarray, byte: int):
    inside = pos < len(view)
    keys, pos = keys[inside], pos[inside]
    hit = view[pos] == byte
    return keys[hit], pos[hit]


def skip_whitespace(data: bytes, view: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Per position: the first position at or after it that is not JSON whitespace."""
    pos = pos.copy()
    active = np.flatnonzero(pos < len(view))
    for _ in range(_WS_STEPS):
        if not len(active):
            return pos
        active = active[_WHITESPACE[view[pos[active]]]]
        pos[active] += 1
        active = active[pos[active] < len(view)]
    for k in active.tolist():
        pos[k] = SKIP_WS.match(data, int(pos[k])).end()
    return pos
