# Two commands for a newcomer: `make run` (set up + start the app) and `make test` (set up + run the tests).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
APP_STAMP := $(VENV)/.installed-app
STAMP := $(VENV)/.installed
# The tests run in two processes (pytest-xdist; each test file stays in one, so its fixtures are built once):
# CI's two cores. PYTEST_WORKERS=0 runs them in this one process. The files go out longest first, in the order
# tests/conftest.py gives them (--no-loadscope-reorder keeps it). PYTHONDONTWRITEBYTECODE is cleared for the run:
# with it set, each worker and each `qwen-desk` process the tests start compiled every module again (and pytest
# rewrote every test file's asserts), about 20 s of each worker's start-up, on every run.
PYTEST_WORKERS ?= 2
TEST_ENV := PYTHONDONTWRITEBYTECODE= QT_QPA_PLATFORM=offscreen MLX_DISABLE_COMPILE=1
PYTEST_DIST = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: setup run test test-lowest lint bench app dmg clean screenshots docs

# `make run` installs the app alone (its own dependencies); `make test` adds the test and packaging tools and the
# reference torch. pip's progress stays visible: the first install downloads several hundred MB.
$(APP_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e .
	touch $(APP_STAMP)

$(STAMP): $(APP_STAMP)
	$(BIN)/pip install -e ".[test,package]"
	# transformers' reference (tests/reference/) only: the CPU build, kept off the venv's path
	$(BIN)/pip install --target $(VENV)/torch-reference torch==2.13.0
	touch $(STAMP)

setup: $(STAMP)

run: $(APP_STAMP)
	$(BIN)/qwen-desk

# The bundle test's build (about two minutes) starts first, in the background, on the core the linters leave idle;
# its fixture waits for it (tests/packaging/bundle_cache.py). Not for the quick run, which leaves that test out.
test: $(STAMP)
	$(if $(findstring not slow,$(PYTEST_ARGS)),,$(TEST_ENV) $(BIN)/python -m tests.packaging.bundle_cache >/dev/null 2>&1 &)
	$(BIN)/ruff check macapp tests bench packaging
	$(BIN)/ruff format --check --quiet macapp tests bench packaging
	$(BIN)/lint-imports
	$(BIN)/mypy
	$(TEST_ENV) $(BIN)/python -m pytest -q --durations=15 $(PYTEST_DIST) $(PYTEST_ARGS)

# The engine and server tests on the lowest versions pyproject.toml allows (.ci/lowest-constraints.txt), in a venv of
# their own: what CI's "lowest" job runs.
LOWEST_VENV ?= .venv-lowest
test-lowest:
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_VENV)/bin/pip install --quiet --upgrade pip
	$(LOWEST_VENV)/bin/pip install --quiet -c .ci/lowest-constraints.txt -e ".[test]"
	$(LOWEST_VENV)/bin/pip list 2>/dev/null | grep -iE "^(mlx|mlx-lm|mlx-vlm|transformers|huggingface.hub|starlette|pydantic) "
	$(TEST_ENV) $(LOWEST_VENV)/bin/python -m pytest -q $(PYTEST_DIST) tests/core/engine tests/core/serving tests/server

lint: $(STAMP)
	$(BIN)/ruff check macapp tests bench packaging
	$(BIN)/ruff format --check --quiet macapp tests bench packaging
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

app: $(STAMP)
	$(BIN)/python packaging/build.py

dmg: app
	$(BIN)/python packaging/build.py --dmg

screenshots: $(STAMP)
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m macapp.devtools.screenshots docs/
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m macapp.devtools.screenshots_newcomer docs/

# The example outputs in README.md and docs/*.md, rewritten from the commands they document (tests/test_docs.py checks them).
docs: $(APP_STAMP)
	$(BIN)/python -m macapp.devtools.doc_outputs

clean:
	rm -rf build dist $(VENV) $(LOWEST_VENV) .pytest_cache
