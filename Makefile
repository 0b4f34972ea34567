# Two commands set everything up on a fresh machine: `make run` and `make test`.
# Both bootstrap .venv from the committed uv.lock, installing uv into .tools/
# with pip when it is not on PATH.

PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: run test lint types pytest bench chaos bootstrap clean help

help:
	@echo "make run    start a Pingo server on the embedded default (SQLite, local executor)"
	@echo "make test   lint, type-check and run the whole test suite"
	@echo "make bench  run the benchmarks and write bench/results/latest.json"
	@echo "make chaos  the full chaos test: 3 nodes, 2,000 actions, kill -9 every 20 s"

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv

$(VENV)/.synced: uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --all-extras --all-groups
	@touch $@

bootstrap: $(VENV)/.synced

# The sandbox is required (PINGO_SANDBOX=on) unless the environment says otherwise.
run: bootstrap
	PINGO_SANDBOX=$${PINGO_SANDBOX:-on} $(BIN)/pingo server

lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

types: bootstrap
	$(BIN)/mypy

pytest: bootstrap
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint types pytest

bench: bootstrap
	$(BIN)/python -m bench $(BENCH_ARGS)

# The full chaos run (a reduced one is part of `make test`): docs/states.md.
chaos: bootstrap
	PINGO_CHAOS=full $(BIN)/pytest tests/integration/test_chaos.py -k every_20s -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
