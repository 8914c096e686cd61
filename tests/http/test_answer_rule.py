"""One answer rule on every path that can land an answer (issue 35).

Who may answer a yielded call is checked in one place, ``LedgerRules._answer`` (``dormant.ledger``), which
``Session.append`` runs on every event: the rule is the waiting call's tool's ``answerable_by`` and the starter is
whoever started the invocation the call waits in, as the ledger says, never what the answer claims.

* ``test_every_way_into_a_ledger_goes_through_the_rule`` reads the package's source: every ``ToolInputEvent`` is
  built in one place, every event enters a ledger through ``append`` (or a load, a fork's copy, or
  ``from_events``, which runs the same rules), and every ``LedgerRules`` is given the tools' rules. A new path that
  builds answers, or holds events without ``append``, turns it red until it is listed here and argued for.
* ``test_an_answer_lands_iff_the_waiting_calls_rule_admits_its_principal`` is the property: for random sequences of
  runs, yields, forks and answers by random principals and groups, on every path (``POST /tools``, a remote commit,
  ``session.input``, ``session.append``, a run's input, a takeover's claim, ``from_events``), an answer lands if and
  only if the waiting call's rule admits its principal (and, in a commit, it names no other invocation).
"""

from __future__ import annotations

import ast
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dormant.errors import AnswerRefused, EventOutOfOrder, NotPermitted
from dormant.events import ToolInputEvent
from dormant.people import answering_groups, parse_rules, refusal
from dormant.session import Session
from tests.support.people_app import RULES, PeopleApp, build

pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "dormant" / "python" / "dormant"
YES = {"approved": True}
TENANT = "clinic"


# -- the structure: one way in -----------------------------------------------------------------------------------


def _calls(name: str) -> set[tuple[str, str]]:
    """(module, enclosing function) of each call of ``name`` (a function or a method) in the package."""
    found: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module = path.relative_to(PACKAGE).as_posix()
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Call):
                    called = node.func
                    called_name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", None)
                    if called_name == name:
                        found.add((module, function.name))
    return found


def test_every_way_into_a_ledger_goes_through_the_rule() -> None:
    # Answers are built in one place, whose events go through session.append (and so the rule).
    assert _calls("ToolInputEvent") == {("session_input.py", "prepare")}
    # Events enter a ledger through append; _hold takes them only in a load, the constructor and append itself.
    assert _calls("_hold") == {("session.py", "__init__"), ("session.py", "restore"), ("session.py", "append")}
    # The constructor with events: loads of stored ledgers, a fork's copy of a ledger already checked, and
    # from_events, which checks what it is given with LedgerRules first (answers_by: the tools' rules).
    constructed = {site for site in _calls("Session") if not site[0].startswith("models/")}  # boto3's Session
    constructed |= {site for site in _calls("cls") if site[0] == "session.py"}
    assert constructed == {
        ("session.py", "from_row"),  # a load
        ("session.py", "_fork"),  # a copy of a checked ledger
        ("app.py", "create"),  # no events
        ("app.py", "ephemeral"),  # no events
        ("app.py", "from_events"),  # checked by LedgerRules(answers_by=...) first
        ("bridges/adk.py", "_session"),  # a load (ADK's own sessions)
        ("bridges/adk.py", "create_session"),  # no events
    }, "a new way to build a Session: does it hold answers the rule never saw?"
    # Every LedgerRules knows the tools' rules: none is built that would skip them.
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "LedgerRules":
                keywords = {k.arg for k in node.keywords}
                assert "answers_by" in keywords, f"{path.name}:{node.lineno} builds LedgerRules without answers_by"


# -- the property: on every path, an answer lands iff the rule admits its principal ---------------------------------

PRINCIPALS = ("alice", "bob", "carol")
GROUPS = ("approvers", "staff")
PATHS = ("tools", "commit", "input", "append", "run", "takeover", "from_events")


@dataclass
class Waiting:
    call_id: str
    tool: str
    invocation_id: str
    starter: str


class Harness:
    """The people app served in-process (every route, its turns run in the request), and the tenant's view of it
    for the library's own paths; both on one in-memory store."""

    def __init__(self) -> None:
        from dormant.serving.api import api_handler
        from dormant.serving.runtime import Served, for_tenant

        self.people: PeopleApp = build()
        self.handler = api_handler(served=Served(self.people.app, {"asker": self.people.agent}))
        self.app = for_tenant(self.people.app, TENANT)

    def http(self, method: str, route: str, sid: str, who: str, groups: frozenset[str], body: Any) -> tuple[int, Any]:
        from dormant.serving.local import proxy_event
        from tests.support.lambda_events import LambdaContext

        resource = f"/sessions/{{id}}/{route}"
        event = proxy_event(
            method,
            resource,
            resource.replace("{id}", sid),
            {"id": sid},
            "",
            [("Content-Type", "application/json")],
            json.dumps(body).encode(),
            who,
            "127.0.0.1",
            "r",
            tenant=TENANT,
            groups=sorted(groups),
        )
        response = self.handler(event, LambdaContext())
        return response["statusCode"], json.loads(response["body"] or "null")

    def load(self, sid: str) -> Session:
        return self.app.sessions.require(sid)

    def save(self, session: Session) -> None:
        if session.uncommitted_events:
            self.app.sessions.commit(session)


def _answered(session: Session, call_id: str) -> bool:
    return any(isinstance(e, ToolInputEvent) and e.call_id == call_id for e in session.events)


def _answer_by(
    h: Harness, sid: str, waiting: Waiting, path: str, who: str, groups: frozenset[str], forged: str | None
) -> str | None:
    """Answer ``waiting`` by ``path`` as ``who`` in ``groups``: the session id the answer may have landed in
    (``from_events`` builds a new one), else ``None`` when it was refused."""
    answer = {"call_id": waiting.call_id, "input": YES}
    session = h.load(sid)
    agent = h.people.agent
    refused = (AnswerRefused, NotPermitted, EventOutOfOrder)
    if path in ("tools", "commit"):
        if path == "tools":
            status, body = h.http("POST", "tools", sid, who, groups, {"answers": [answer]})
        else:
            sent: dict[str, Any] = {
                "type": "tool_input",
                "call_id": waiting.call_id,
                "name": waiting.tool,
                "input": YES,
            }
            if forged is not None:
                sent["invocation_id"] = forged
            status, body = h.http(
                "POST", "commit", sid, who, groups, {"expected_version": session.version, "events": [sent]}
            )
        assert status < 500, body
        if status >= 400:
            assert status in (403, 409), body
            return None
        return sid
    try:
        if path == "input":
            session.input.answer(waiting.call_id, YES, principal=who, groups=groups)
        elif path == "append":
            recorded = answering_groups(parse_rules(RULES[waiting.tool]), groups)
            event = ToolInputEvent(
                call_id=waiting.call_id,
                name=waiting.tool,
                input=YES,
                invocation_id=waiting.invocation_id,
                principal=who,
                groups=recorded,
            )
            session.append(event)
        elif path == "run":
            h.app.run(agent, {"answers": [answer]}, session=session, principal=who, groups=groups)
        elif path == "takeover":
            from dormant.serving.turns import claim_turn, run_to_end

            claim = claim_turn(
                h.app, agent, session, {"answers": [answer]}, takeover=True, principal=who, groups=groups
            )
            run_to_end(h.app, claim, lambda _name: agent)
        else:  # from_events: a ledger handed over whole, its last event the answer (judged as it records it)
            event = ToolInputEvent(
                call_id=waiting.call_id,
                name=waiting.tool,
                input=YES,
                invocation_id=waiting.invocation_id,
                principal=who,
                groups=answering_groups(parse_rules(RULES[waiting.tool]), groups),
            )
            wire = [e.model_dump(mode="json") for e in session.events] + [event.model_dump(mode="json")]
            rebuilt = h.app.sessions.from_events(wire, session_id=f"{sid}-rebuilt-{uuid.uuid4().hex[:8]}")
            h.app.sessions.commit(rebuilt)
            return rebuilt.id
    except refused:
        return None
    h.save(session)
    return sid


OPS = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(sorted(RULES)), st.sampled_from(PRINCIPALS)),
    st.tuples(
        st.just("answer"),
        st.sampled_from(PATHS),
        st.sampled_from(PRINCIPALS),
        st.frozensets(st.sampled_from(GROUPS)),
        st.sampled_from(("none", "own", "other")),
    ),
    st.tuples(st.just("fork"), st.sampled_from(PRINCIPALS)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=2, max_size=12))
def test_an_answer_lands_iff_the_waiting_calls_rule_admits_its_principal(ops: list[tuple[Any, ...]]) -> None:
    h = Harness()
    sid = "s"
    h.app.sessions.create(sid)
    waiting: Waiting | None = None
    invocations: list[str] = []
    for op in ops:
        if op[0] == "run":
            if waiting is not None:
                continue  # a message while a call waits is AwaitingInput: no yield to answer
            _, tool, who = op
            result = h.app.run(h.people.agent, tool, session=h.load(sid), principal=who)
            h.save(result.session)
            (call,) = result.yielded_tools
            assert call.invocation_id is not None
            waiting = Waiting(call.call_id, tool, call.invocation_id, who)
            invocations.append(call.invocation_id)
        elif op[0] == "fork":
            before = h.load(sid)
            if not before.events:
                continue  # nothing to fork at
            status, forked = h.http("POST", "forks", sid, op[1], frozenset(), {"at": len(before.events) - 1})
            assert status == 201, forked
            sid = forked["id"]  # the call (if any) still waits, in the same invocation, started by the same person
            event(f"fork{' while a call waits' if waiting is not None else ''}")
        elif waiting is not None:
            _, path, who, groups, forge = op
            forged = {"none": None, "own": waiting.invocation_id}.get(forge)
            others = [i for i in invocations if i != waiting.invocation_id]
            if forge == "other":
                forged = None if path != "commit" or not others else others[0]
            admitted = refusal(parse_rules(RULES[waiting.tool]), who, groups, waiting.starter) is None
            expected = admitted and (path != "commit" or forged in (None, waiting.invocation_id))
            version = h.load(sid).version
            landed_in = _answer_by(h, sid, waiting, path, who, groups, forged)
            assert (landed_in is not None) == expected, (path, who, groups, waiting, forged)
            event(f"{path}: {'landed' if expected else 'refused'}")
            if landed_in is None:
                stored = h.load(sid)
                assert stored.version == version and not _answered(stored, waiting.call_id)  # nothing written
                continue
            stored = h.load(landed_in)
            (answer,) = [e for e in stored.events if isinstance(e, ToolInputEvent) and e.call_id == waiting.call_id]
            assert answer.principal == who
            if landed_in != sid:  # from_events: a copy answered; the session itself still waits
                continue
            if stored.status == "resumable":  # the answer is in: the turn goes on to its end
                h.save(h.app.run(h.people.agent, session=stored, principal=who).session)
            assert h.load(sid).status == "completed", h.load(sid).status
            waiting = None


# -- the library's own answers: as strict as the API's --------------------------------------------------------------


def test_the_librarys_answer_names_an_unknown_field_and_writes_nothing() -> None:
    from dormant.errors import ToolInputError

    people = build()
    session = people.app.sessions.create()
    (call,) = people.app.run(people.agent, "note", session=session).yielded_tools
    before = len(session.events)
    with pytest.raises(ToolInputError) as refused:
        session.input.answer(call.call_id, {"approved": False, "notes": "the slot is taken"})
    assert (refused.value.field, refused.value.http_status) == ("answers.0.input.notes", 422)
    event = ToolInputEvent(
        call_id=call.call_id, name="note", input={"approved": False, "notes": "x"}, invocation_id=call.invocation_id
    )
    with pytest.raises(ToolInputError) as refused:
        session.rules().check(event, 0)  # a commit's events: named where they stand
    assert refused.value.field == "events.0.input.notes"
    assert len(session.events) == before
    kept = session.input.answer(call.call_id, {"approved": False, "note": "the slot is taken"})
    assert kept.input == {"approved": False, "note": "the slot is taken"}
