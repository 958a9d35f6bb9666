# The two commands a fresh machine needs (see README): `make demo` and `make test`.
# Both create .venv on first use; no PostgreSQL server is needed (the embedded one starts).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test pytest test-django lint check clean

# Tests run side by side (pytest-xdist): most wait on the server and on worker processes, so
# more test processes than cores pays. PYTEST_WORKERS=0 runs them in this process, one by one.
PYTEST_WORKERS ?= 4
PYTEST_ARGS ?=
# The Citus suite starts a cluster of its own: `make test-citus`, not the suite's run.
PYTEST_MARK ?= not citus

# $(1) pytest, $(2) its arguments: the tests side by side but those marked `alone`, then those.
define PYTEST_SPLIT
$(1) -q -n $(PYTEST_WORKERS) -m "$(if $(PYTEST_MARK),($(PYTEST_MARK)) and )not alone" $(2)
$(1) -q -m "$(if $(PYTEST_MARK),($(PYTEST_MARK)) and )alone" $(2) || [ $$? -eq 5 ]
endef

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev,embedded,bench,cli]'
	touch $@

# The start of a recipe that needs Python 3.12 or newer: sets $$py to the newest one found
# (PATH, then pyenv's versions), or stops saying why one is needed ($(1)).
define PYTHON_312
py=""; for p in python3.14 python3.13 python3.12 $$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -rV); do \
	if $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then py=$$p; break; fi; \
done; \
if [ -z "$$py" ]; then echo "no Python 3.12 or newer: $(1)"; exit 1; fi
endef

# django.tasks needs Django 6, which needs Python 3.12 or newer: its tests get a venv of
# their own (the worker's tests run there too, below).
DJANGO_VENV ?= .venv-django

$(DJANGO_VENV)/.installed: pyproject.toml
	@$(call PYTHON_312,Django 6 cannot be installed); \
	echo "$(DJANGO_VENV): $$($$py --version)"; \
	$$py -m venv $(DJANGO_VENV) && \
	$(DJANGO_VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[dev,embedded]' 'django>=6'
	touch $@

# The benchmarks with every peer: oban-py needs Python 3.12 or newer, so the bench runs from
# a venv of its own on one (`make bench-venv`, then `.venv-bench/bin/python -m bench ...`).
BENCH_VENV ?= .venv-bench

$(BENCH_VENV)/.installed: pyproject.toml
	@$(call PYTHON_312,oban-py cannot be installed); \
	echo "$(BENCH_VENV): $$($$py --version)"; \
	$$py -m venv $(BENCH_VENV) && \
	$(BENCH_VENV)/bin/pip install --quiet --disable-pip-version-check \
		-e '.[dev,embedded,bench,cli,peers]'
	touch $@

.PHONY: bench-venv
bench-venv: $(BENCH_VENV)/.installed

# The Django integration's tests on Django 6, the django.tasks backend's and its example's
# among them.
DJANGO_TESTS := tests/integration/test_django.py tests/integration/test_django_tasks.py \
	tests/acceptance/test_integration_examples.py tests/unit/test_readme_imports.py

# Then Django's own tests of django.tasks on pgqueue's backend (tests/django_suite): taken
# from the installed Django's sdist, which pip downloads once into DJANGO_SDIST_CACHE.
DJANGO_SDIST_CACHE ?= .pgqueue/django-sdist

test-django: $(DJANGO_VENV)/.installed
	$(DJANGO_VENV)/bin/pytest -q -n $(PYTEST_WORKERS) $(DJANGO_TESTS)
	DJANGO_SDIST_CACHE=$(DJANGO_SDIST_CACHE) $(DJANGO_VENV)/bin/python -m tests.django_suite -q

# From Python 3.12 a job's task starts eagerly (its first step runs as it is started), so
# the worker's tests run again there, on the same 3.12-or-newer venv.
WORKER_TESTS := tests/unit tests/integration/test_worker.py tests/integration/test_cancel.py \
	tests/integration/test_shutdown.py tests/integration/test_timeout.py \
	tests/integration/test_progress.py tests/integration/test_snooze.py \
	tests/integration/test_retry.py tests/integration/test_tracing.py \
	tests/integration/test_observers.py tests/integration/test_durable.py \
	tests/integration/test_wakeup.py tests/integration/test_rate_limits.py \
	tests/integration/test_job_rate_limits.py tests/integration/test_atomic.py \
	tests/integration/test_faults.py tests/integration/test_claim_cooldown.py \
	tests/integration/test_hint.py

.PHONY: test-worker-312
test-worker-312: $(DJANGO_VENV)/.installed
	$(call PYTEST_SPLIT,$(DJANGO_VENV)/bin/pytest,$(WORKER_TESTS))

demo: $(VENV)/.installed
	$(BIN)/pgqueue demo

lint: $(VENV)/.installed
	$(BIN)/ruff check pgqueue tests bench examples
	$(BIN)/ruff format --check pgqueue tests bench examples
	$(BIN)/mypy

test: lint pytest

# The tests marked `alone` run after the others, one at a time. PYTEST_MARK narrows both runs
# (a marker expression); pytest's exit 5, no test selected, is no failure.
pytest: $(VENV)/.installed
	$(call PYTEST_SPLIT,$(BIN)/pytest,$(PYTEST_ARGS))

check: test

# The Citus suite (tests/citus) on a local cluster it starts: a coordinator and two nodes of
# the PostgreSQL that ../shared/citus/build.sh built Citus into. One cluster, one process.
.PHONY: test-citus
test-citus: $(VENV)/.installed
	$(BIN)/pytest -q -m citus tests/citus $(PYTEST_ARGS)

# The documentation site (mkdocs.yml), built in strict mode into site/: a broken link or an
# API name that no longer exists fails it. Its tools are the `docs` extra, added to .venv here
# only, so `make test`'s setup is unchanged.
.PHONY: docs
$(VENV)/.docs-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The site served at http://127.0.0.1:8000/, rebuilt as a page changes. Opened from disk,
# site/ shows folders instead of pages and has no search (a browser loads neither over file://).
.PHONY: docs-serve
DOCS_ADDR ?= 127.0.0.1:8000

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

clean:
	rm -rf $(VENV) $(DJANGO_VENV) $(BENCH_VENV) .pgqueue .pytest_cache .mypy_cache .ruff_cache
