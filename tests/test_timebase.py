"""Exact decimal time arithmetic and the Perfetto importer model."""

import math
from dataclasses import dataclass

import msgspec
import pytest

from tracestream.index.timebase import (
    imported_ns,
    is_integer_text,
    llround,
    parse_decimal,
)


@dataclass(frozen=True, slots=True)
class SliceBounds:
    """Nanosecond interval of one slice: exact, and conservative for packing.

    ``lo``/``hi`` contain the exact interval and both importer variants, and the
    first nanosecond after each of their starts, so two slices with ``hi_a <= lo_b``
    never overlap in any of them, nor start at the same nanosecond (Perfetto would
    nest a zero-length slice under a longer one that starts with it).
    """

    start_ns: int  # floor of the exact start
    end_ns: int  # ceil of the exact end
    lo: int
    hi: int


def slice_bounds(ts_text: bytes | str, dur_text: bytes | str) -> SliceBounds:
    ts = parse_decimal(ts_text)
    dur = parse_decimal(dur_text)
    start = ts.floor_ns()
    end = (ts + dur).ceil_ns()
    ts_round, ts_trunc = imported_ns(ts_text)
    dur_round, dur_trunc = imported_ns(dur_text)
    lo = min(start, ts_round, ts_trunc)
    hi = max(end, ts_round + dur_round, ts_trunc + dur_trunc, max(start, ts_round, ts_trunc) + 1)
    return SliceBounds(start, end, lo, hi)


@pytest.mark.parametrize(
    "text, floor_ns, ceil_ns",
    [
        ("1764400000005000.125", 1764400000005000125, 1764400000005000125),
        ("1764400000005000", 1764400000005000000, 1764400000005000000),
        ("0.0005", 0, 1),
        ("-0.0005", -1, 0),
        ("1.5e3", 1500000, 1500000),
        ("2.5E-4", 0, 1),
        ("6123456789012.3456", 6123456789012345, 6123456789012346),
    ],
)
def test_exact_nanoseconds_from_text(text, floor_ns, ceil_ns):
    value = parse_decimal(text)
    assert value.floor_ns() == floor_ns
    assert value.ceil_ns() == ceil_ns


def test_text_keeps_digits_a_double_cannot_hold():
    a = parse_decimal("1764400000005000.100")
    b = parse_decimal("1764400000005000.110")
    assert float("1764400000005000.100") == float("1764400000005000.110")
    assert a < b and a != b
    assert a.to_text() == "1764400000005000.100"


def test_equal_values_with_different_text_compare_equal():
    assert parse_decimal("1.50") == parse_decimal("1.5")
    assert hash(parse_decimal("1.50")) == hash(parse_decimal("1.5"))


@pytest.mark.parametrize("bad", ["", "abc", "NaN", "Infinity", "1.", ".5", "01", "1e"])
def test_not_a_number_is_rejected(bad):
    with pytest.raises(ValueError):
        parse_decimal(bad)


def test_round_us_is_nearest_with_halves_up():
    assert parse_decimal("10.499").round_us() == 10
    assert parse_decimal("10.5").round_us() == 11
    assert parse_decimal("-10.5").round_us() == -10
    assert parse_decimal("7").round_us() == 7


@pytest.mark.parametrize("x", [0.5, 1.5, 2.5, -0.5, -2.5, 0.49999999999999994, 1e18 + 256.0])
def test_llround_matches_c(x):
    expected = math.floor(abs(x) + 0.5) * (1 if x >= 0 else -1)
    if x == 0.49999999999999994:
        expected = 0  # floor(x + 0.5) would round up here; llround does not
    assert llround(x) == expected


def test_importer_rounds_epoch_microseconds_to_multiples_of_256ns():
    rounded, truncated = imported_ns("1764400000005000.125")
    assert rounded % 256 == 0 and truncated % 256 == 0
    assert rounded != 1764400000005000125


def test_integer_literals_import_exactly():
    assert is_integer_text("1764400000005000")
    assert not is_integer_text("1764400000005000.0")
    assert imported_ns("1764400000005000") == (1764400000005000000, 1764400000005000000)


def test_touching_kernels_overlap_after_import_but_not_in_bounds_order():
    """Two kernels touching exactly can import overlapping; the bounds say so."""
    first = slice_bounds("1764400000005000.125", "3.125")
    second = slice_bounds("1764400000005003.250", "1.0")
    assert first.end_ns == second.start_ns  # exactly touching
    assert first.lo <= first.start_ns and first.hi >= first.end_ns
    # the conservative bounds contain the importer's interval for both variants
    ts_r, ts_t = imported_ns("1764400000005000.125")
    dur_r, dur_t = imported_ns("3.125")
    assert first.hi >= ts_r + dur_r and first.hi >= ts_t + dur_t
    assert first.lo <= ts_r and first.lo <= ts_t


def test_a_zero_length_slice_occupies_its_start_nanosecond():
    """Perfetto nests a zero-length slice under a longer one starting with it, so the bounds
    keep the next slice on a lane from starting at its start (in either importer variant)."""
    assert slice_bounds("100", "0").hi == 100_001
    assert slice_bounds("100", "0.0001").hi == 100_001  # imports as zero length
    assert slice_bounds("100", "1").hi == 101_000  # a longer slice is unchanged


def test_number_columns_are_timebase_values():
    """Kineto's shapes (and floats with one or two decimals) parsed a column at a time give
    timebase's exact and imported ns; every other text is left to timebase."""
    from tracestream.commands.verify.events import NumberColumn
    from tracestream.model import CheckEvent

    texts = [b"1700000000123456.789", b"12", b"-3.500", b"0.000", b"4503599627370.497",
             b"123456789.5", b"1e3", b"", b"9007199254740993", b"900719925474099", b"-7",
             b"68.25", b"123456789.5000"]
    column = NumberColumn.of_events([CheckEvent(ts=msgspec.Raw(t)) for t in texts], "ts")
    regular = [bool(v) for v in column.regular]
    assert regular == [True, True, True, True, True, True, False, False, False, True, True,
                       True, False]
    for k, text in enumerate(texts):
        if regular[k]:
            assert column.exact[k] == parse_decimal(text).floor_ns()
            assert (column.rounded[k], column.truncated[k]) == imported_ns(text)
