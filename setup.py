"""The optional C extension, tracestream._native._speedups; everything else is in pyproject.toml.

It is built from tracestream/_native/speedups/: speedups.h, what its files share, and one .c
file per concern (module.c holds the method table and the module's init; speedups.h says
what each file holds).

`optional=True`: where it cannot be built (no C compiler), the install goes on and
the numpy code it mirrors runs instead (see tracestream/_native/__init__.py).
"""

from setuptools import Extension, setup

SPEEDUPS = "tracestream/_native/speedups"
SOURCES = [f"{SPEEDUPS}/{name}.c" for name in (
    "module", "keyscan", "scan", "events", "columns", "keys", "classify", "splice", "rows")]

# `depends`: a change to the header rebuilds every file, and the sdist ships it
setup(ext_modules=[Extension("tracestream._native._speedups", SOURCES,
                             depends=[f"{SPEEDUPS}/speedups.h"],
                             extra_compile_args=["-O2"], optional=True)])
