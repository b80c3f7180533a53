"""Where separators and quoted keys lie in a chunk's bytes, in numpy: the twins of the C
extension's byte scans (`separators`, `event_keys`, `continues`, `integer_ends`).

The keys' first two bytes are found together, by OR-ed comparisons over the chunk a
cache-sized block at a time, the rest checked at the few places left; whitespace is
stepped over for all candidates at once.
"""

from __future__ import annotations

import numpy as np

from tracestream.jsontext import SKIP_WS

_QUOTE = 0x22
_COMMA = 0x2C
_MINUS = 0x2D
_MAX_DIGITS = 19
_BLOCK = 256 << 10
"""Bytes compared at a time by whole-chunk scans (a few such blocks fit in a core's L2)."""
_MAX_LITERALS = 32  # the C extension's limit (a bit per literal)
_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[list(b" \t\r\n")] = True
_WS_STEPS = 32  # whitespace runs longer than this are finished with a regex


def separators(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of every `}` ws* `,` ws* `{` in `data`, as re.finditer would give them:
    from every `}`, the whitespace, comma and whitespace after it are stepped over for all
    candidates at once."""
    view = np.frombuffer(data, np.uint8)
    closes = np.flatnonzero(view == 0x7D)
    after = skip_whitespace(data, view, closes + 1)
    closes, after = _where_byte(view, closes, after, 0x2C)
    opens = skip_whitespace(data, view, after + 1)
    closes, opens = _where_byte(view, closes, opens, 0x7B)
    return closes.astype(np.int64), (opens + 1).astype(np.int64)


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


def continues(data: bytes, positions: np.ndarray, literal: bytes) -> np.ndarray:
    """Per position: does `literal` start there?"""
    view = np.frombuffer(data, np.uint8)
    ok = (positions >= 0) & (positions <= len(view) - len(literal))
    if not len(view):
        return ok
    for k, byte in enumerate(literal):
        ok &= view[np.clip(positions + k, 0, len(view) - 1)] == byte
    return ok


def integer_ends(data: bytes, begin: np.ndarray) -> np.ndarray:
    """Per position: the end of the integer literal starting there when a comma follows it
    directly (Kineto's `"tid": 7,`), else -1."""
    view = np.frombuffer(data, np.uint8)
    last = len(view) - 1
    inside = (begin >= 0) & (begin <= last)
    if not len(view):
        return np.full(len(begin), -1, np.int64)
    pos = begin + (inside & (view[np.clip(begin, 0, last)] == _MINUS))
    first = pos.copy()
    for _ in range(_MAX_DIGITS + 1):
        byte = view[np.clip(pos, 0, last)]
        digit = inside & (byte >= 0x30) & (byte <= 0x39) & (pos <= last)
        if not digit.any():
            break
        pos = pos + digit
    ok = inside & (pos > first) & (pos <= last) & (view[np.clip(pos, 0, last)] == _COMMA)
    return np.where(ok, pos, -1).astype(np.int64)


def event_keys(data: bytes, starts: np.ndarray, ends: np.ndarray, literals: tuple[bytes, ...]
               ) -> tuple[np.ndarray, np.ndarray]:
    """Per literal and per event [starts[i], ends[i]): where its first occurrence starts (-1
    without one) and how many start in the event, laid out [literal][event]. Each literal
    starts with `"`: their first two bytes are found in one pass over the chunk."""
    if len(literals) > _MAX_LITERALS:
        raise ValueError(f"at most {_MAX_LITERALS} literals at a time")
    for literal in literals:
        if type(literal) is not bytes or literal[:1] != b'"' or len(literal) < 2:
            raise ValueError("literals are bytes of two or more that start with `\"`")
    outside = (starts < 0) | (ends > len(data)) | (starts > ends)
    if outside.any():
        raise ValueError(f"event {int(np.argmax(outside))} lies outside the data")
    if not literals:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    view = np.frombuffer(data, np.uint8)
    prefixes = _quoted_prefixes(view, bytes(literal[1] for literal in literals))
    first = np.empty((len(literals), len(starts)), np.int64)
    count = np.empty((len(literals), len(starts)), np.int32)
    for k, literal in enumerate(literals):
        at = prefixes[literal[1]]
        positions = at[continues(data, at, literal)]
        index = np.searchsorted(positions, starts)
        count[k] = np.searchsorted(positions, ends) - index
        found = positions[np.minimum(index, len(positions) - 1)] if len(positions) else index
        first[k] = np.where(count[k] > 0, found, -1)
    return first.reshape(-1), count.reshape(-1)


def _quoted_prefixes(view: np.ndarray, letters: bytes) -> dict[int, np.ndarray]:
    """{letter: ascending positions of `"` followed by it}, for every letter in one pass.

    The chunk is compared a block at a time, so the comparisons' temporaries stay in the
    core's cache instead of streaming megabytes through memory.
    """
    todo = list(dict.fromkeys(letters))
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
    return {byte: positions[values == byte] for byte in todo}
