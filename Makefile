# The two commands of the README. Both set up everything they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint test-deps bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/sxwl up

test-deps:
	bash scripts/install-test-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: $(STAMP) test-deps lint
	$(BIN)/pytest

bench: $(STAMP) test-deps
	$(BIN)/python bench/auth_throughput.py

clean:
	rm -rf $(VENV) .sxwl test-artifacts .pytest_cache .mypy_cache .ruff_cache
