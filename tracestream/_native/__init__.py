"""The one place that chooses which code does the per-chunk byte work: the C extension, or
the numpy and Python it mirrors (`reference`). Callers call `_native.<function>` and never
ask which one runs.

`tracestream._native._speedups` (built from the C files in speedups/ by setup.py where a C
compiler is available) scans a chunk's events (validating the JSON and keeping where each field the
index reads lies, instead of msgspec's decode into structs; it declines what it cannot be
sure msgspec reads alike, and msgspec decodes those chunks), finds key positions, reads the
events' fields (ts/dur columns, phase and category codes, track and group keys), splices
relocated events and writes rows of JSON text, each in one pass. `reference` returns the
same; it runs when the extension is missing or when the environment sets
TRACESTREAM_PURE=1 (for comparing the two), and the tests hold the two to each other.
"""

from __future__ import annotations

import os
from types import ModuleType

from tracestream._native import reference
from tracestream._native.reference import columns as _columns

try:
    from tracestream._native import _speedups as built
except ImportError:  # installed without a C compiler: numpy does the work
    built = None
if built is not None and not all(hasattr(built, name) for name in reference.__all__):
    built = None  # a build older than these sources: its twins run (a test fails on it)

FUNCTIONS = tuple(name for name in reference.__all__ if not name.isupper())
"""What both provide: bound here, as module attributes, to the chosen one's."""
COLUMN_KINDS = ("TEXTS", "INTEGERS", "FIXED", "SHORTEST", "CODED")
"""json_rows' column kinds: the same numbers in both."""
TEXTS, INTEGERS, FIXED, SHORTEST, CODED = (getattr(reference, kind) for kind in COLUMN_KINDS)
PH_OTHER, PH_X, PH_FLOW = _columns.PH_OTHER, _columns.PH_X, _columns.PH_FLOW
"""check_columns' phase codes: the same in both."""
SHAPE_ABSENT, SHAPE_INTEGER, SHAPE_DECIMAL, SHAPE_OTHER = (
    _columns.SHAPE_ABSENT, _columns.SHAPE_INTEGER, _columns.SHAPE_DECIMAL, _columns.SHAPE_OTHER)
"""decimal_column's shapes: the same in both."""
chosen: ModuleType = reference


def use(functions: ModuleType) -> None:
    """Make `functions` (`built` or `reference`) the one every caller runs (tests compare the
    two by switching)."""
    global chosen
    chosen = functions
    globals().update((name, getattr(functions, name)) for name in FUNCTIONS)


def describe() -> str:
    """Which one runs, for reports and benchmark results."""
    if chosen is built:
        return "C extension"
    return "numpy (TRACESTREAM_PURE is set)" if built is not None else "numpy (no C extension)"


use(reference if built is None or os.environ.get("TRACESTREAM_PURE") else built)
