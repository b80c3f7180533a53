"""Exact time arithmetic on the decimal text of `ts`/`dur` (microseconds).

Kineto writes epoch microseconds with three decimals: 19 significant digits,
more than a double holds. Every decision here works on the number *text*, and
the Perfetto importer is modelled separately so that lane packing can use
bounds that contain both views of an interval:

* exact: the decimal value, converted to integer nanoseconds (floor/ceil);
* imported: ``llround(double(text) * 1000)`` for ``ts`` and ``dur`` separately
  (current Perfetto), or the truncating variant of older versions.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_ABS_US = 9.2e15
"""Largest |ts| or dur (µs) whose nanosecond value still fits Perfetto's int64."""

_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?\Z")
_MAX_DIGITS = 400
"""Longer number texts (and larger exponents) are refused: exact arithmetic on them
would take unbounded time (1e-99999999 needs a 10**99999996)."""


class OutOfRange(ValueError):
    """A JSON number too long or with too large an exponent for exact arithmetic."""


@dataclass(frozen=True, slots=True)
class Decimal10:
    """An exact decimal ``mantissa * 10**exponent`` microseconds."""

    mantissa: int
    exponent: int

    def __add__(self, other: Decimal10) -> Decimal10:
        e = min(self.exponent, other.exponent)
        m = self.mantissa * 10 ** (self.exponent - e) + other.mantissa * 10 ** (other.exponent - e)
        return Decimal10(m, e)

    def floor_ns(self) -> int:
        shift = self.exponent + 3
        if shift >= 0:
            return self.mantissa * 10**shift
        return self.mantissa // 10**-shift

    def ceil_ns(self) -> int:
        shift = self.exponent + 3
        if shift >= 0:
            return self.mantissa * 10**shift
        return -((-self.mantissa) // 10**-shift)

    def round_us(self) -> int:
        """Nearest whole microsecond, halves rounded up (towards +inf)."""
        if self.exponent >= 0:
            return self.mantissa * 10**self.exponent
        scale = 10**-self.exponent
        return (2 * self.mantissa + scale) // (2 * scale)

    def __lt__(self, other: Decimal10) -> bool:
        return _aligned(self, other) < 0

    def __le__(self, other: Decimal10) -> bool:
        return _aligned(self, other) <= 0

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decimal10):
            return NotImplemented
        return _aligned(self, other) == 0

    def __hash__(self) -> int:
        m, e = self.mantissa, self.exponent
        while m and m % 10 == 0:
            m //= 10
            e += 1
        return hash((m, e if m else 0))

    def to_text(self) -> str:
        """Plain decimal text (no exponent) of the exact value."""
        m, e = self.mantissa, self.exponent
        if e >= 0:
            return str(m * 10**e)
        sign = "-" if m < 0 else ""
        digits = str(abs(m)).rjust(-e + 1, "0")
        return f"{sign}{digits[:e]}.{digits[e:]}"


def _aligned(a: Decimal10, b: Decimal10) -> int:
    e = min(a.exponent, b.exponent)
    x = a.mantissa * 10 ** (a.exponent - e)
    y = b.mantissa * 10 ** (b.exponent - e)
    return (x > y) - (x < y)


def parse_decimal(text: bytes | str) -> Decimal10:
    """Exact value of a JSON number text; ValueError if it is not one."""
    if isinstance(text, str):
        text = text.encode()
    match = _NUMBER.match(text)
    if match is None:
        raise ValueError(f"not a JSON number: {text[:40]!r}")
    fraction, exp = match.group(1), match.group(2)
    if len(text) > _MAX_DIGITS:
        raise OutOfRange(f"has more than {_MAX_DIGITS} digits")
    exponent = int(exp) if exp else 0
    if abs(exponent) > _MAX_DIGITS:
        raise OutOfRange("has an exponent out of range")
    if exp:
        text = text[: match.start(2) - 1]
    if fraction:
        mantissa = int(text.replace(b".", b""))
        exponent -= len(fraction)
    else:
        mantissa = int(text)
    return Decimal10(mantissa, exponent)


def llround(x: float) -> int:
    """C's llround: nearest integer, halves away from zero."""
    f = math.floor(x)
    diff = x - f  # exact: below 2**52 by Sterbenz, above it x is already integral
    if x >= 0:
        return int(f) + (1 if diff >= 0.5 else 0)
    return int(f) + (1 if diff > 0.5 else 0)


def is_integer_text(text: bytes | str) -> bool:
    """An integer literal: Perfetto reads it as int64 and multiplies exactly."""
    if isinstance(text, str):
        text = text.encode()
    return bool(text) and b"." not in text and b"e" not in text and b"E" not in text


def imported_ns(text: bytes | str) -> tuple[int, int]:
    """(rounded, truncated) nanoseconds Perfetto computes from a number text.

    Integer literals are exact (x1000 in int64); any other number goes through
    a double, and the x1000 product is rounded (current) or truncated (older).
    """
    if is_integer_text(text):
        exact = int(text) * 1000
        return exact, exact
    product = float(text) * 1000.0
    return llround(product), int(product)


def us_text(ns: int) -> str:
    """Nanoseconds as exact microsecond text with three decimals (as Kineto writes `ts`)."""
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(ns), 1000)
    return f"{sign}{q}.{r:03d}"


def relative_ms(ns: int, origin_ns: int) -> float:
    """Milliseconds from the trace origin, to the nanosecond (what reports and tables show;
    `plan.guidetext.relative_ms_column` is the same for a column)."""
    return round((ns - origin_ns) / 1e6, 6)

