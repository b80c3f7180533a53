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
    if any(kind == SHORTEST for kind, *_ in columns):
        return None
    texts = [_texts(n, column) for column in columns]
    template = b"%b".join(part.replace(b"%", b"%%") for part in parts)
    return separator.join(map(template.__mod__, zip(*texts))) if texts else separator.join(
        [template] * n)


def _texts(n: int, column: tuple) -> list[bytes]:
    kind, values, *rest = column
    if kind == TEXTS:
        if len(values) != n:
            raise TypeError("a TEXTS column holds one text per row")
        return values
    values = np.asarray(values)
    if values.dtype != np.int64 or len(values) != n:
        raise ValueError("a row column holds n int64 values")
    numbers = values.tolist()
    if kind == INTEGERS:
        return [b"%d" % v for v in numbers]
    if kind == FIXED:
        scale = 10 ** rest[0]
        return [b"%s%d.%0*d" % (b"-" if v < 0 else b"", abs(v) // scale, rest[0],
                                abs(v) % scale) for v in numbers]
    if kind == CODED:
        return list(map(rest[0].__getitem__, numbers))
    raise TypeError("a row column is (TEXTS, list), (INTEGERS, int64s), (FIXED or SHORTEST, "
                    "int64s, decimals) or (CODED, int64s, list)")
