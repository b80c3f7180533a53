"""Benchmarks: pytest-benchmark micro-benchmarks (`test_bench_*.py`) and the scale script.

    .venv/bin/python -m pytest -q benchmarks --benchmark-only -p no:cacheprovider
    .venv/bin/python -m benchmarks.scale --size 1GB

They live outside `tests/` so `make test` never collects them (pyproject's
testpaths is `tests`).
"""
