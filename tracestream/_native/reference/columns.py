"""The ts/dur columns of a chunk's events, read from their exact decimal text in numpy: the
twin of the C extension's `decimal_column`; and verify's columns of a chunk (`check_columns`).
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, is_not

import numpy as np

_NUMBER_BYTES = np.zeros(256, bool)
_NUMBER_BYTES[list(b"0123456789.-")] = True
_MAX_DIGITS = 16  # integer digits of a value below 9e15 µs (the first of 16 at most 8)


SHAPE_ABSENT, SHAPE_INTEGER, SHAPE_DECIMAL, SHAPE_OTHER = 0, 1, 2, 3
"""The shape of one ts/dur text, as the C extension's decimal_column codes it."""
MAX_FAST_DECIMALS = 3
"""Decimals a value may have and still be read as a column: 1 to 3 are exact in ns (Kineto
writes three; older exporters write floats such as `68.0`)."""


def _shapes_and_decimals(blob: bytes, lengths: np.ndarray, *,
                         signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per text (JSON values of `lengths` bytes each, joined by commas in `blob`): its shape,
    SHAPE_DECIMAL for a number with one to three decimals, SHAPE_INTEGER for an integer,
    both below 9e15 µs (and not negative unless `signed`), else SHAPE_OTHER; and its number
    of decimals (0 for the other shapes).

    The texts are valid JSON, so a text of only digits, `.` and `-` is a number
    without an exponent; counting its bytes of each kind and indexing its first
    byte and the bytes where a dot may stand settles the rest, for every text at once.
    """
    view = np.frombuffer(blob, np.uint8)
    ends = np.cumsum(lengths + 1) - 1  # each text's comma (or the blob's end)
    starts = ends - lengths

    def per_text(mask: np.ndarray) -> np.ndarray:
        counts = np.zeros(len(view) + 1, np.int64)
        np.cumsum(mask, out=counts[1:])
        return counts[ends] - counts[starts]

    odd_bytes = per_text(~_NUMBER_BYTES[view])
    dots = per_text(view == 0x2E)
    minus = per_text(view == 0x2D)
    negative = view[starts] == 0x2D
    decimals = np.zeros(len(lengths), np.int64)
    for d in range(MAX_FAST_DECIMALS, 0, -1):  # the first dot from the end wins, as in C
        dot = (lengths >= d + 2) & (view[np.maximum(ends - d - 1, 0)] == 0x2E)
        decimals[dot] = d
    decimal = (decimals > 0) & (dots == 1)
    digits = lengths - negative - np.where(decimal, decimals + 1, 0)
    first_digit = view[np.minimum(starts + negative, len(view) - 1)]
    regular = ((odd_bytes == 0) & (minus == negative) & ((dots == 0) | decimal)
               & (digits >= 1) & (digits <= _MAX_DIGITS)
               & ~((digits == _MAX_DIGITS) & (first_digit > ord("8"))))
    if not signed:
        regular &= ~negative
    shapes = np.where(regular, np.where(decimal, SHAPE_DECIMAL, SHAPE_INTEGER), SHAPE_OTHER)
    return shapes.astype(np.int8), np.where(regular & decimal, decimals, 0)


def kineto_column(texts: list, *, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """The numpy twin of the C extension's decimal_column: (ns, shape) per text (empty
    where absent), the values of each regular shape parsed a group at a time."""
    lengths = np.fromiter(map(len, texts), np.int64, len(texts))
    shapes = np.zeros(len(texts), np.int8)  # SHAPE_ABSENT
    ns = np.zeros(len(texts), np.int64)
    present = np.flatnonzero(lengths)
    if not len(present):
        return ns, shapes
    whole = len(present) == len(texts)
    chosen = texts if whole else list(map(texts.__getitem__, present.tolist()))
    blob = b",".join(chosen)
    shapes[present], decimals_present = _shapes_and_decimals(blob, lengths[present],
                                                             signed=signed)
    decimals = np.zeros(len(texts), np.int64)
    decimals[present] = decimals_present
    for places in range(MAX_FAST_DECIMALS + 1):  # 0: the integers
        at = np.flatnonzero((shapes == (SHAPE_DECIMAL if places else SHAPE_INTEGER))
                            & (decimals == places))
        if not len(at):
            continue
        group = blob if len(at) == len(chosen) else b",".join(map(texts.__getitem__, at.tolist()))
        ns[at] = _ints(group.replace(b".", b"") if places else group) * 10 ** (3 - places)
    return ns, shapes


def _ints(blob: bytes) -> np.ndarray:
    """Comma-separated decimal integers (already validated) as int64, in C."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return np.fromstring(blob, dtype=np.int64, sep=",")


def decimal_column(events, key: str, signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(ns, shape) of the events' `key` texts (msgspec.Raw, empty where absent): see
    `kineto_column`."""
    return kineto_column(list(map(attrgetter(key), events)), signed=signed)


PH_OTHER, PH_X, PH_FLOW = range(3)
"""`check_columns`' phase codes."""
_PHASE, _ARGS, _PID, _TID, _CAT = (attrgetter(name) for name in ("ph", "args", "pid", "tid", "cat"))


def check_columns(events, kinds, activity: bytes, pids: tuple[dict, list],
                  tids: tuple[dict, list], devices: tuple[dict, list]) -> tuple[np.ndarray, ...]:
    """What verify's output-only checks read of a chunk's events (`model.CheckEvent`s), per
    event: the phase (PH_X, PH_FLOW for s/t/f, else PH_OTHER); the kind (kinds[cat] of an X
    event, else 0); the track (the pid's number << 32 | the tid's); the original track (the
    provenance's pid and tid for a moved flow, or a moved X event of a kind whose byte of
    `activity` is set, else the track); whether it is moved (its args hold a provenance);
    the number of args.device of such an activity (of None without args), else -1.

    Values are numbered in the (value -> number, values) tables given, extended in place
    (see `numbered`): every event's pid and tid, then the provenances', then the devices.
    """
    count = len(events)
    phases = np.array(list(map(_PHASE, events)), object)
    phase = np.full(count, PH_OTHER, np.int8)
    phase[(phases == "s") | (phases == "t") | (phases == "f")] = PH_FLOW
    phase[phases == "X"] = PH_X
    args = list(map(_ARGS, events))
    origins = list(map(getattr, args, repeat("origin"), repeat(None)))
    moved = np.fromiter(map(is_not, origins, repeat(None)), bool, count)
    track = _tracks(pids, tids, list(map(_PID, events)), list(map(_TID, events)))
    xs = np.flatnonzero(phase == PH_X).tolist()
    kind = np.zeros(count, np.int8)
    kind[xs] = list(map(kinds.__getitem__, map(_CAT, map(events.__getitem__, xs))))
    is_activity = (phase == PH_X) & np.frombuffer(activity, bool)[kind.view(np.uint8)]
    bound_at = np.flatnonzero(moved & (is_activity | (phase == PH_FLOW)))
    bound = list(map(origins.__getitem__, bound_at.tolist()))
    origin = track.copy()
    origin[bound_at] = _tracks(pids, tids, list(map(_PID, bound)), list(map(_TID, bound)))
    activity_at = np.flatnonzero(is_activity).tolist()
    device = np.full(count, -1, np.int64)
    device[activity_at] = numbered(devices, list(map(getattr, map(args.__getitem__, activity_at),
                                                     repeat("device"), repeat(None))))
    return phase, kind, track, origin, moved, device


def _tracks(pids: tuple[dict, list], tids: tuple[dict, list], pid_values: list,
            tid_values: list) -> np.ndarray:
    return (numbered(pids, pid_values) << 32) | numbered(tids, tid_values)


def numbered(table: tuple[dict, list], values: list) -> np.ndarray:
    """The numbers of `values` in `table` (value -> number, values by number), new values
    numbered in the order first met; equal values (as a dict's keys are equal) share one."""
    numbers, known = table
    for value in dict.fromkeys(values):  # the distinct values, a few
        if value not in numbers:
            numbers[value] = len(known)
            known.append(value)
    return np.fromiter(map(numbers.__getitem__, values), np.int64, len(values))
