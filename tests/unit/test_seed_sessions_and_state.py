"""The seed page "Sessions and state", steps 1-5, reproduced with their documented outcomes."""

from __future__ import annotations

from dormant.events import StateChangeEvent, ToolCallEvent
from tests.support.examples import SEED, SORE_THROAT, triage


def audit(session: object) -> list[dict[str, object]]:
    return [
        {
            "scope": e.scope,
            "source": e.source,
            "changes": [(c.key, c.old_value, c.new_value) for c in e.changes],
            "invocation": e.invocation_id,
        }
        for e in session.events  # type: ignore[attr-defined]
        if isinstance(e, StateChangeEvent)
    ]


def test_step_1_the_schema_and_its_scopes() -> None:
    t = triage()
    assert sorted(t.app.schema.scopes) == ["session", "user"]
    assert (t.agent.name, t.note_concern.name) == ("triage", "note_concern")


def test_step_3_run_it_then_read_state() -> None:
    t = triage()
    t.model.set_responses(SORE_THROAT)
    run = t.app.run(t.agent, {"message": "I have a sore throat.", "initial_state": SEED})
    assert run.status == "completed"
    assert run.output.text == "Noted a sore throat. Anything else?"
    assert {"stage": run.state.stage, "concerns": run.state.concerns} == {
        "stage": "collecting",
        "concerns": ["sore throat"],
    }
    # The run is over; the session is not: the same object the tool wrote to.
    assert run.session.state.stage == "collecting"
    assert run.state.user.display_name == "Ada"


def test_step_2_and_4_writes_and_the_audit_trail() -> None:
    t = triage()
    t.model.set_responses(SORE_THROAT)
    run = t.app.run(t.agent, {"message": "I have a sore throat.", "initial_state": SEED})
    invocation = run.invocation_id
    assert invocation is not None
    assert audit(run.session) == [
        # seeding: direct, outside any invocation, defaults filled in by the schema
        {"scope": "session", "source": "direct", "changes": [("stage", None, "intake")], "invocation": None},
        {"scope": "session", "source": "direct", "changes": [("concerns", None, [])], "invocation": None},
        {"scope": "user", "source": "direct", "changes": [("display_name", None, "Ada")], "invocation": None},
        # the tool: mutations, one event per key that changed, old and new values, the invocation id
        {
            "scope": "session",
            "source": "mutation",
            "changes": [("concerns", [], ["sore throat"])],
            "invocation": invocation,
        },
        {
            "scope": "session",
            "source": "mutation",
            "changes": [("stage", "intake", "collecting")],
            "invocation": invocation,
        },
    ]


def test_step_5_the_timeline_of_stage_and_a_fork_at_the_tool_call() -> None:
    t = triage()
    t.model.set_responses(SORE_THROAT)
    run = t.app.run(t.agent, {"message": "I have a sore throat.", "initial_state": SEED})
    session = run.session
    timeline = [
        (index, session.state_at(index).session_state["stage"])
        for index, event in enumerate(session.events)
        if isinstance(event, StateChangeEvent)
    ]
    assert [stage for _, stage in timeline] == ["intake", "intake", "intake", "intake", "collecting"]
    # seeding (0-2), invocation_start, user, model_start, model_end, tool_call (3-7), the tool's writes (8-9)
    assert [index for index, _ in timeline] == [0, 1, 2, 8, 9]
    call_index = next(i for i, e in enumerate(session.events) if isinstance(e, ToolCallEvent))
    fork = session.fork_at(call_index)
    assert fork.id != session.id
    # the copies, a pause (cut inside the running invocation, so it can move on), then the session_forked event
    assert len(fork.events) == call_index + 3 and fork.events[-2].type == "invocation_yield"
    assert fork.events[-1].type == "session_forked" and fork.forked_from == session.id
    # The state as it was when the model asked for the tool, before the tool ran.
    assert fork.state.to_dict() == {"stage": "intake", "concerns": []}
    assert session.state.stage == "collecting"  # the original is untouched
