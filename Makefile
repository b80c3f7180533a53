# Set-up and everyday jobs. `make demo` and `make test` are all a fresh clone needs.
PYTHON ?= python3
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
# pip's own notices (e.g. about this machine's index configuration) are not ours to show.
PIP := $(BIN)/pip --quiet --disable-pip-version-check

.PHONY: install demo test test-native bench fuzz lint docs clean

install: $(STAMP)

# The package alone: what `make demo` and the `tracestream` command need.
$(STAMP): pyproject.toml setup.py $(wildcard tracestream/_native/speedups/*.[ch])
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e . 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }
	touch $(STAMP)

# The test, benchmark and Dask extras on top.
$(DEV_STAMP): $(STAMP)
	$(PIP) install -e '.[dev,dask]' 2>&1 | { grep -v "^WARNING: Location '.*' is ignored" || true; }
	touch $(DEV_STAMP)

demo: $(STAMP)
	$(BIN)/python -m samples.demo

test: $(DEV_STAMP)
	-scripts/ensure-chromium
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -p no:cacheprovider

# The C extension built with AddressSanitizer and UndefinedBehaviorSanitizer into build/sanitize
# (the .venv's own build stays), and the tests that exercise it run against that build; any
# sanitizer report fails the run. Needs gcc and its libasan and libubsan (Debian's gcc package
# brings them). `scripts/sanitized_native.py` says how the sanitized build is imported.
test-native: $(DEV_STAMP)
	$(BIN)/python scripts/sanitized_native.py

bench: $(DEV_STAMP)
	$(BIN)/python -m pytest -q benchmarks --benchmark-only -p no:cacheprovider
	$(BIN)/python -m benchmarks.scale --size 1GB --size 10GB

fuzz: $(DEV_STAMP)
	TRACESTREAM_FUZZ_EXAMPLES=5000 $(BIN)/python -m pytest -q tests/reliability -k fuzz -p no:cacheprovider

# ruff, and the import contracts of pyproject.toml: each pipeline stage imports only the
# stages below it, and no package's modules import each other in a cycle.
lint: $(DEV_STAMP)
	$(BIN)/ruff check tracestream tests benchmarks samples
	$(BIN)/lint-imports --no-cache

# docs/cli.md's command reference, generated from every command's --help (cog); `make test`
# fails while it is out of date (tests/test_docs_cli.py).
docs: $(DEV_STAMP)
	$(BIN)/cog -r docs/cli.md

clean:
	rm -rf $(VENV) demo-out build/sanitize .pytest_cache .ruff_cache
