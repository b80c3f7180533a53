"""Rows of JSON text written from columns, in Python: the twin of the C extension's
`json_rows` (guide events, report rows, anchor and cluster rows)."""

from __future__ import annotations

import numpy as np

TEXTS, INTEGERS, FIXED, SHORTEST, CODED = range(5)
"""The kinds of column `json_rows` takes (the C extension's constants of the same names)."""


def json_rows(n: int, parts: tuple[bytes, ...], columns: tuple, separator: bytes
              ) -> bytes | None:
    """n rows joined by `separator`, row i being parts[0] + column 0's text of row i +
    parts[1] + ... + parts[-1]. A column is (TEXTS, list of n bytes), (INTEGERS, int64s),
    (FIXED, int64s, d): v / 10**d with exactly d decimals, (SHORTEST, int64s, d) or
    (CODED, int64s, texts): texts[code].

    None where a column is SHORTEST: its callers write those rows themselves (the C
    extension writes what orjson would, and declines where it cannot be sure to).
    """
    if len(parts) != len(columns) + 1:
        raise TypeError("json_rows takes one more part than columns")
    if not all(type(part) is bytes for part in parts):
        raise TypeError("row parts must be bytes")
    for column in columns:
        _check(n, column)
    if n <= 0:
        return b""
    if any(column[0] == SHORTEST for column in columns):
        return None
    texts = [_texts(column) for column in columns]
    template = b"%b".join(part.replace(b"%", b"%%") for part in parts)
    return separator.join(map(template.__mod__, zip(*texts) if texts else [()] * n))


_SPEC = ("a row column is (TEXTS, list), (INTEGERS, int64s), (FIXED or SHORTEST, int64s, "
         "decimals) or (CODED, int64s, list)")


def _check(n: int, column) -> None:
    """The C extension's refusals of a column (`n` rows)."""
    if type(column) is not tuple or len(column) < 2:
        raise TypeError(_SPEC)
    kind, values, *rest = column
    if kind == TEXTS:
        if type(values) is not list or len(values) != n:
            raise TypeError(_SPEC)
        if not all(type(text) is bytes for text in values):
            raise TypeError("row texts must be bytes")
        return
    if kind not in (INTEGERS, FIXED, SHORTEST, CODED) or len(rest) != (kind != INTEGERS):
        raise TypeError(_SPEC)
    array = np.asarray(values)
    if array.dtype != np.int64 or array.shape != (n,):
        raise ValueError("a row column must be contiguous int64")
    if kind == CODED:
        texts = rest[0]
        if type(texts) is not list:
            raise TypeError(_SPEC)
        if n and (array.min() < 0 or array.max() >= len(texts)):
            raise IndexError("a row code names no text")
        if not all(type(text) is bytes for text in texts):
            raise TypeError("row texts must be bytes")
    elif kind in (FIXED, SHORTEST) and not (kind == FIXED) <= rest[0] <= 9:
        raise TypeError(_SPEC)


def _texts(column: tuple) -> list[bytes]:
    kind, values, *rest = column
    if kind == TEXTS:
        return values
    numbers = np.asarray(values).tolist()
    if kind == INTEGERS:
        return [b"%d" % v for v in numbers]
    if kind == FIXED:
        scale = 10 ** rest[0]
        return [b"%s%d.%0*d" % (b"-" if v < 0 else b"", abs(v) // scale, rest[0],
                                abs(v) % scale) for v in numbers]
    return list(map(rest[0].__getitem__, numbers))  # CODED
