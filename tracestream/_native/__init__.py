"""Which code does the per-chunk byte work: the C extension, or the numpy it mirrors.

`tracestream._native._speedups` (built from _speedups.c by setup.py where a C compiler is
available) scans a chunk's events (validating the JSON and keeping where each field
the index reads lies, instead of msgspec's decode into structs; it declines what it
cannot be sure msgspec reads alike, and msgspec decodes those chunks; verify reads its
planned output chunks with it too, the provenance read as verify's own struct), finds key
positions, reads the events' fields (ts/dur columns, phase and category codes, track
and group keys) and splices relocated events, each in one pass. The numpy and Python
code in the index, write and commands packages, with msgspec's decode, returns the same
and stays the reference; it runs when the extension is missing or when the environment
sets TRACESTREAM_PURE=1 (for comparing the two).
"""

from __future__ import annotations

import os

try:
    from tracestream._native import _speedups as built
except ImportError:  # installed without a C compiler: numpy does the work
    built = None

native = None if os.environ.get("TRACESTREAM_PURE") else built
"""The extension the passes use (None: numpy); tests set it to compare the two."""


def describe() -> str:
    """Which one runs, for reports and benchmark results."""
    if native is not None:
        return "C extension"
    return "numpy (TRACESTREAM_PURE is set)" if built is not None else "numpy (no C extension)"
