"""The optional C extension (tracestream/_native/_speedups.c); everything else is in pyproject.toml.

`optional=True`: where it cannot be built (no C compiler), the install goes on and
the numpy code it mirrors runs instead (see tracestream/_native/__init__.py).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("tracestream._native._speedups", ["tracestream/_native/_speedups.c"],
                             extra_compile_args=["-O2"], optional=True)])
