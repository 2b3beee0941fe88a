# Quick start: `make demo` (set up + run the demo), `make test` (set up + run the tests).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench clean

# setuptools >= 77 in the venv too: the build backend pyproject.toml names (tests build a wheel without isolation)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77'
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/confluence demo --out runs/demo $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest --durations=15 --durations-min=5 $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check confluence tests

clean:
	rm -rf runs .pytest_cache
