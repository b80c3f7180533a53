"""Text tables and short forms for the terminal: cells, widths, times, pids."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from tracestream.index.timebase import relative_ms

NAME_WIDTH = 110  # longest kernel/annotation name in human-readable tables


_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(count: int, most: int, width: int) -> str:
    """A bar of block characters, `width` long for `most`, in eighths of a character; any
    count above 0 shows at least one eighth."""
    eighths = max(1, round(count * width * 8 / most)) if count else 0
    full, part = divmod(eighths, 8)
    return "█" * full + (_EIGHTHS[part] if part else "")


def histogram(values: np.ndarray) -> dict[str, int]:
    distinct, counts = np.unique(values, return_counts=True)
    return {str(k): v for k, v in zip(distinct.tolist(), counts.tolist())}


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
                 right: Sequence[bool] | None = None, indent: str = "  ") -> str:
    """Aligned columns; `right[i]` right-aligns column i (numbers)."""
    cells = [cell_texts(row) for row in rows]
    columns = [list(column) for column in zip(*cells, strict=True)] or [[] for _ in headers]
    return "\n".join(table_lines(headers, lambda: iter([columns]), right, indent))


def cell_text(value: Any) -> str:
    """A table cell of a value (None is printed as '-')."""
    return "-" if value is None else str(value)


def cell_texts(values: Iterable[Any]) -> list[str]:
    """Table cells of values."""
    return list(map(cell_text, values))


def table_lines(headers: Sequence[str], make_batches, right: Sequence[bool] | None = None,
                indent: str = "  ", widest=None) -> Iterator[str]:
    """Lines of an aligned table. `make_batches()` yields the cells a batch of rows at a
    time, as columns of texts; it is called twice (widths, then lines), so a table of
    millions of rows never exists as a whole. `widest()`, when given, replaces the widths
    pass: it yields (in the same shape) only cells that include the widest of each column,
    so the rows are not all formatted twice."""
    right = right or [False] * len(headers)
    widths = [len(h) for h in headers]
    for columns in (widest or make_batches)():
        widths = [max(w, max(map(len, column), default=0))
                  for w, column in zip(widths, columns, strict=True)]
    template = indent.replace("{", "{{").replace("}", "}}") + "  ".join(
        ("{:>%d}" if r else "{:<%d}") % w for w, r in zip(widths, right, strict=True))
    yield template.format(*headers).rstrip()
    for columns in make_batches():
        yield from map(str.rstrip, map(template.format, *columns))


def short(name: Any, width: int = NAME_WIDTH) -> str | None:
    """A name cut to `width` characters for tables (None stays None: printed as '-')."""
    if name is None:
        return None
    text = str(name)
    return text if len(text) <= width else text[: width - 1] + "…"


def ms(ns: int | None, origin_ns: int) -> float | None:
    """Nanoseconds as milliseconds from the trace origin (µs precision)."""
    return None if ns is None else relative_ms(ns, origin_ns)


def pid_text(pid: Any) -> str:
    """A pid for tables: string pids quoted, so `""` and `"Spans"` stand out from numbers."""
    return f'"{pid}"' if isinstance(pid, str) else str(pid)


def pid_order(pid: Any):
    return (0, pid, "") if isinstance(pid, int) else (1, 0, str(pid))


def top_counts(counter: Counter, top: int) -> list[dict]:
    return [{"name": name, "count": n} for name, n in counter.most_common(top)]


def three_places(value: float | None) -> str | None:
    return None if value is None else f"{value:,.3f}"
