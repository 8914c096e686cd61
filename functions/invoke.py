"""Run the Lambda handlers here, on the sample events of ``events/``.

* ``make invoke FUNCTION=sessions EVENT=events/api/get_session.json`` (``python functions/invoke.py FUNCTION
  EVENT.json``): one handler on one event. The handler is loaded from ``functions/<name>/app.py`` exactly as
  Lambda would load it, and serves ``DORMANT_APP`` on ``DORMANT_STORE`` (default: the Bookings sample on
  ``data/dormant.db``). ``run`` and ``tools`` are wired to Step Functions: they need ``DORMANT_STATE_MACHINE`` (a
  deployed state machine's ARN), and say so without it.
* ``make invoke`` (``python functions/invoke.py --all``): every sample event, in the order a session meets
  them, as a fresh caller (tenant) on sessions with fresh ids (so it runs again on the same store, the sample
  user's slots all free), each event given the ids the
  earlier answers made (the session, the call the agent yielded, its invocation, the version to commit
  after). ``POST /runs`` goes through the same route with no hooks, so the turn runs in the request, as
  the state machine's ``Run`` would run it; everything else through its function's own module. The three
  sessions it makes: one answered and completed (then committed to, forked and deleted), one whose wait
  times out (``park``, ``expire``) and one whose turn fails (``fail``); ``erase`` then removes the
  sample user's sessions. It exits 1 if any event got another answer than the sample's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EVENTS = ROOT / "events"
TENANT, SESSION, CALL, INVOCATION = "7d3f0c1e-5b6a-4c1e-9f2d-3a4b5c6d7e8f", "s-sample", "call-sample", "inv_sample"
"""The placeholders the sample events hold, replaced by ``--all`` with fresh ids and those earlier answers made."""

Handler = Callable[[dict[str, Any], Any], Any]

PLAN: list[tuple[str, str, str, Any]] = [
    # (session, function, event, expected: an API status code, or the workflow answer's "status")
    ("answered", "sessions", "api/create_session.json", 201),
    ("answered", "sessions", "api/get_session.json", 200),
    ("answered", "sessions", "api/list_sessions.json", 200),
    ("answered", "run", "api/run.json", 200),  # no hooks: the turn runs in the request and yields
    ("answered", "sessions", "api/session_events.json", 200),
    ("answered", "resume", "workflow/run.json", "yielded_tool"),  # a Run that finds the turn waiting parks
    ("answered", "sessions", "api/session_state.json", 200),
    ("answered", "sessions", "api/key_audit.json", 200),
    ("answered", "tools", "api/tools.json", 202),  # stored; no task token here, so nothing to wake
    ("answered", "resume", "workflow/run.json", "completed"),  # the woken execution runs the turn on
    ("answered", "commit", "api/commit.json", 200),
    ("answered", "sessions", "api/fork_session.json", 201),
    ("answered", "sessions", "api/delete_session.json", 204),
    ("timed out", "sessions", "api/create_session.json", 201),
    ("timed out", "run", "api/run.json", 200),
    ("timed out", "sessions", "api/session_events.json", 200),
    ("timed out", "park", "workflow/park.json", "awaiting_input"),  # the token stored: the session waits
    ("timed out", "resume", "workflow/expire.json", "error"),  # the wait timed out: SessionExpired
    ("failed", "sessions", "api/create_session.json", 201),
    ("failed", "run", "api/run.json", 200),
    ("failed", "sessions", "api/session_events.json", 200),
    ("failed", "resume", "workflow/fail.json", "error"),
    ("failed", "sessions", "api/erase.json", 200),  # the sample user's sessions: the last two and the fork
    ("failed", "sweeper", "schedule/sweeper.json", None),
]


def context(name: str) -> SimpleNamespace:
    """What a handler reads of Lambda's context object (15 minutes left: the longest function's timeout)."""
    return SimpleNamespace(
        function_name=f"dormant-{name}",
        memory_limit_in_mb=512,
        invoked_function_arn=f"arn:aws:lambda:local:000000000000:function:dormant-{name}",
        aws_request_id=f"local-{uuid.uuid4()}",
        get_remaining_time_in_millis=lambda: 900_000,
    )


def load(name: str) -> ModuleType | None:
    """``functions/<name>/app.py``, imported as Lambda imports it (``None``: no such function)."""
    path = Path(__file__).resolve().parent / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"dormant_function_{name}", path)
    if spec is None or spec.loader is None or not path.exists():
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NEEDS_MACHINE = (
    "the {name} function starts Step Functions executions (run: one for every turn; tools: one for an answered turn"
    " it ran that parks again; sweeper: one for a turn whose runner died): it needs DORMANT_STATE_MACHINE, a"
    " deployed state machine's ARN. Here, `make invoke` (functions/invoke.py --all) runs run's and tools' routes"
    " with the turn in the request, and the sweeper in this process."
)


def main(argv: list[str]) -> int:
    if argv == ["--all"]:
        return run_all()
    if len(argv) != 2:
        print("usage: python functions/invoke.py FUNCTION EVENT.json | --all", file=sys.stderr)
        return 2
    name, event_path = argv
    if name in ("run", "tools", "sweeper") and not os.environ.get("DORMANT_STATE_MACHINE"):
        print(f"invoke: {NEEDS_MACHINE.format(name=name)}", file=sys.stderr)
        return 2
    module = load(name)
    if module is None:
        print(f"no function {name!r} (looked for functions/{name}/app.py)", file=sys.stderr)
        return 2
    event = json.loads(Path(event_path).read_text(encoding="utf-8"))
    print(json.dumps(module.handler(event, context(name)), indent=2))
    return 0


def run_all() -> int:
    """Every sample event in ``PLAN``'s order (see the module docstring); 1 if any answer was not the expected one."""
    planned = {event for _, _, event, _ in PLAN}
    samples = {str(path.relative_to(EVENTS)) for path in EVENTS.rglob("*.json")}
    if planned != samples:  # a new sample event needs its place in the plan
        print(f"invoke --all: the plan and events/ differ: {sorted(planned ^ samples)}", file=sys.stderr)
        return 2
    from dormant.serving.api import api_handler
    from dormant.serving.workflow import sweeper_handler

    # No Step Functions here: run's turn runs in the request, and the sweeper hands turns on in this process.
    handlers: dict[str, Handler] = {
        "run": api_handler(function="run"),
        "tools": api_handler(function="tools"),
        "sweeper": sweeper_handler(),
    }
    tenant = str(uuid.uuid4())  # a caller of its own: the sample user's slots and sessions start empty each time
    ids: dict[str, dict[str, str]] = {}
    versions: dict[str, int] = {}
    failed = 0
    for label, function, event_name, expected in PLAN:
        mine = ids.setdefault(label, {TENANT: tenant, SESSION: f"s-{uuid.uuid4().hex[:12]}"})
        text = (EVENTS / event_name).read_text(encoding="utf-8")
        for placeholder, value in mine.items():
            text = text.replace(placeholder, value)
        event = json.loads(text)
        if event_name == "api/commit.json":  # a remote runner commits after the version it read
            body = json.loads(event["body"])
            event["body"] = json.dumps({**body, "expected_version": versions[label]})
        if function not in handlers:
            module = load(function)
            assert module is not None, function
            handlers[function] = module.handler
        answer = handlers[function](event, context(function))
        if "statusCode" in answer:
            got: Any = answer["statusCode"]
            body = json.loads(answer["body"]) if answer.get("body") else None
        else:
            body = answer
            got = answer.get("status") if expected is not None else None
        _learn(mine, body)
        if isinstance(body, dict) and isinstance(body.get("version"), int):
            versions[label] = body["version"]
        ok = got == expected
        failed += not ok
        shown = json.dumps(body)
        print(f"{'ok ' if ok else 'BAD'} {mine[SESSION]} {function} {event_name}: {got}  {shown[:160]}", flush=True)
        if not ok:
            print(f"invoke --all: {event_name} expected {expected}, got {got}: {shown}", file=sys.stderr)
    return 1 if failed else 0


def _learn(ids: dict[str, str], body: Any) -> None:
    """The ids later events need, from an answer: the call the agent yielded, and its invocation."""
    if not isinstance(body, dict):
        return
    for call in body.get("yielded_tools") or []:
        ids[CALL] = call["call_id"]
    for event in body.get("events") or []:
        if event.get("type") == "invocation_start":
            ids[INVOCATION] = event["invocation_id"]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
