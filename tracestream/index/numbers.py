"""Perfetto's import model of ts/dur columns (how its JSON importer turns their text into
integer nanoseconds), and the checks of their values. The columns themselves are read by
`_native.decimal_column`."""

from __future__ import annotations

import numpy as np

from tracestream.index import timebase


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
