"""The ts/dur columns of a chunk, from their exact decimal text, and Perfetto's import model
(how its JSON importer turns that text into integer nanoseconds)."""

from __future__ import annotations

import numpy as np

from tracestream.index import timebase

_NUMBER_BYTES = np.zeros(256, bool)
_NUMBER_BYTES[list(b"0123456789.-")] = True
_MAX_DIGITS = 16  # integer digits of a value below 9e15 µs (the first of 16 at most 8)


SHAPE_ABSENT, SHAPE_INTEGER, SHAPE_DECIMAL, SHAPE_OTHER = 0, 1, 2, 3
"""The shape of one ts/dur text, as the C extension's decimal_column codes it."""
MAX_FAST_DECIMALS = 3
"""Decimals a value may have and still be read as a column: 1 to 3 are exact in ns (Kineto
writes three; older exporters write floats such as `68.0`)."""


def kineto_shapes(blob: bytes, lengths: np.ndarray, *, signed: bool) -> np.ndarray:
    """Per text (JSON values of `lengths` bytes each, joined by commas in `blob`): its
    shape, SHAPE_DECIMAL for a number with one to three decimals, SHAPE_INTEGER for an
    integer, both below 9e15 µs (and not negative unless `signed`), else SHAPE_OTHER."""
    return _shapes_and_decimals(blob, lengths, signed=signed)[0]


def _shapes_and_decimals(blob: bytes, lengths: np.ndarray, *,
                         signed: bool) -> tuple[np.ndarray, np.ndarray]:
    """`kineto_shapes` and each text's number of decimals (0 for the other shapes).

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


def double_values(ns: np.ndarray, texts: list) -> np.ndarray:
    """double(text) of each text from its exact nanoseconds `ns` (see `double_column`)."""
    return double_column(ns, texts, range(len(texts)), [])


def double_column(ns: np.ndarray, texts: list, events, inexact: list[int]) -> np.ndarray:
    """double(text) for each value, computed from its exact nanoseconds without rounding twice
    (value k is events[k]'s, whose text is texts[events[k]]).

    Below 2**53 ns the integer is exact in a double and one division rounds
    correctly. Above, q + r/1000 is exact while q is in [1000, 2**52) µs. The
    rest (and values with digits below 1 ns) are converted from their text.
    """
    out = ns.astype(np.float64) / 1000.0
    big = np.abs(ns) >= 2**53
    if big.any():
        q, r = np.divmod(ns[big], 1000)
        out[big] = q.astype(np.float64) + r.astype(np.float64) / 1000.0
        unsafe = np.flatnonzero(big)[(np.abs(q) < 1000) | (np.abs(q) >= 2**52)].tolist()
        for k in unsafe:
            out[k] = float(bytes(texts[events[k]]))
    for k in inexact:
        out[k] = float(bytes(texts[events[k]]))
    return out


def time_value(text: bytes, key: str):
    """(exact value, None) of a `ts`/`dur` text, or (None, why it cannot be used)."""
    try:
        value = timebase.parse_decimal(text)
    except timebase.OutOfRange as exc:
        return None, f"{key} {text[:30].decode(errors='replace')} {exc}"
    except ValueError:
        return None, f"`{key}` must be a number, not {text[:30].decode(errors='replace')}"
    low = 0 if key == "dur" else -timebase.MAX_ABS_US
    if not low <= float(text) < timebase.MAX_ABS_US:
        word = "negative" if key == "dur" and float(text) < 0 else "out of range"
        return None, f"{key} {text.decode()} is {word}"
    return value, None


def end_out_of_range(start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per slice: whether ts + dur (ns; each already below the limit, dur >= 0) reaches
    MAX_ABS_US, computed without the int64 overflow the sum itself would hit."""
    limit = int(timebase.MAX_ABS_US * 1000)
    return dur >= limit - np.maximum(start, 0)


def importer_bounds(start, end, ts_f, dur_f, int_ts, has_int_dur, int_dur):
    """Conservative [lo, hi] ns bounds: the exact span plus both Perfetto importer variants,
    and at least the first nanosecond after each of their starts.

    Integer literals (`int_ts`, `has_int_dur`; `int_dur` their ns) are converted
    exactly, as Perfetto does; anything else through a double, rounded (current)
    or truncated (older versions).
    """
    ts_round, ts_trunc = imported_ns_columns(start, int_ts, ts_f)
    dur_round, dur_trunc = imported_ns_columns(int_dur, has_int_dur, dur_f)
    lo = np.minimum(np.minimum(start, ts_round), ts_trunc)
    hi = np.maximum(np.maximum(end, ts_round + dur_round), ts_trunc + dur_trunc)
    # a slice occupies at least the first nanosecond of each of its starts (a zero-length
    # slice sharing a start with a longer one would import nested: see lanes.occupied_end)
    last_start = np.maximum(np.maximum(start, ts_round), ts_trunc)
    return lo, np.maximum(hi, last_start + 1)


def imported_ns_columns(exact: np.ndarray, integer: np.ndarray, doubles: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Perfetto's JSON importer on a column of µs values, in ns: (current, older versions).

    An integer literal (`integer`) is converted exactly (`exact`); any other value goes
    through its double (`doubles`) times 1000, rounded with llround by current Perfetto and
    truncated by older versions. The scalar model of the same rule is timebase.imported_ns.
    """
    product = doubles * 1000.0
    return (np.where(integer, exact, llround_column(product)),
            np.where(integer, exact, np.trunc(product).astype(np.int64)))


def llround_column(x: np.ndarray) -> np.ndarray:
    """C's llround of each value (halves away from zero), as int64."""
    f = np.floor(x)
    diff = x - f
    up = np.where(x >= 0, diff >= 0.5, diff > 0.5)
    return f.astype(np.int64) + up
