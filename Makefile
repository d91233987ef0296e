# Two set-up commands, each of which prepares .venv itself:
#   make demo   runs the main job on its embedded defaults
#   make test   installs the test dependencies and runs every check CI runs
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test lint typecheck lint-imports pytest clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.runtime-installed: pyproject.toml | $(PY)
	$(PIP) install -e .
	@touch $@

$(VENV)/.test-installed: pyproject.toml | $(PY)
	$(PIP) install -e '.[test]'
	@touch $@ $(VENV)/.runtime-installed

demo: $(VENV)/.runtime-installed
	$(PY) -m dsagent.cli.demo

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

lint-imports: $(VENV)/.test-installed
	$(VENV)/bin/lint-imports

typecheck: $(VENV)/.test-installed
	$(PY) -m mypy

# -n auto: one worker per core (pytest-xdist); PYTEST_ARGS="-n 0 -k name" runs one test in-process
pytest: $(VENV)/.test-installed
	$(PY) -m pytest -n auto $(PYTEST_ARGS)

test: lint lint-imports typecheck pytest

clean:
	rm -rf $(VENV) demo-cache .pytest_cache .mypy_cache
