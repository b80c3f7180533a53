# Set-up and everyday jobs. `make demo` and `make test` are all a fresh clone needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench fuzz lint clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py tracestream/_speedups.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,dask]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m samples.demo

test: $(STAMP)
	-scripts/ensure-chromium
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python -m pytest -q benchmarks --benchmark-only -p no:cacheprovider
	$(BIN)/python -m benchmarks.scale --size 1GB --size 10GB

fuzz: $(STAMP)
	TRACESTREAM_FUZZ_EXAMPLES=5000 $(BIN)/python -m pytest -q tests/reliability -k fuzz -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check tracestream tests benchmarks samples

clean:
	rm -rf $(VENV) demo-out .pytest_cache .ruff_cache
