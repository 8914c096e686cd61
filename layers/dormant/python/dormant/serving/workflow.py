"""Sleeping sessions woken by Step Functions (on AWS) or in-process (locally).

The state machine (``infra/workflow.py``) calls ``workflow_handler`` with ``{action, tenant, session_id}``:

* ``park`` (a ``.waitForTaskToken`` task) stores the task token with the session — a commit of the
  tenant's scoped state (scope ``workflow``, id = the session), gated on the version at which the
  session still awaited answers. Answers that arrived first moved the version: park sees them and
  wakes the execution itself, so they are not lost. ``POST /tools`` commits the answers (merging past
  a token commit), then reads the token and wakes the execution. Whichever lands second sees the other.
* ``resume`` runs the waiting agent on (claiming the session first, ``serving.advance``) and returns
  its status: ``yielded_tool`` parks again, anything else ends the execution.
* ``expire`` (the wait timed out) and ``fail`` (a task failed) end the open invocation on the ledger
  with an ``error`` status and the reason, so the session says what happened to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from ..app import App
from ..errors import ClaimLost, InputError, StoreBusy, VersionConflict
from ..events import InvocationEndEvent
from ..session import Session
from ..stores.base import ScopedStateChange
from .advance import AdvanceOutcome, advance
from .hooks import Hooks
from .runtime import Served, purge_tenants, served_from_env

__all__ = [
    "TOKEN_SCOPE",
    "StepFunctions",
    "end_invocation",
    "execution_name",
    "in_process_hooks",
    "resume",
    "sweeper_handler",
    "workflow_handler",
    "workflow_hooks",
]

TOKEN_SCOPE = "workflow"
_ATTEMPTS = 5
_GONE = {"InvalidToken", "TaskDoesNotExist", "TaskTimedOut"}


def execution_name(tenant: str, session_id: str, invocation_id: str | None) -> str:
    """One name per (tenant, session, invocation): a retried run cannot start a second execution."""
    return hashlib.sha256(f"{tenant}\n{session_id}\n{invocation_id}".encode()).hexdigest()[:64]


def resume(served: Served, app: App, session_id: str) -> dict[str, Any]:
    """Run the session's waiting agent on, if it can go on; report the status either way."""
    session = app.sessions.require(session_id)
    if session.status != "resumable":
        return {"status": session.status}
    try:
        outcome = advance(app, served.agent(session.current_agent_name), session)
    except ClaimLost:  # another resume won the claim: it carries the session on
        return {"status": app.sessions.require(session_id).status}
    return {"status": outcome.status, "version": outcome.version}


def end_invocation(app: App, session_id: str, error: str, error_type: str) -> dict[str, Any]:
    """End the session's open invocation as an error, with the reason, on the ledger."""
    for _ in range(_ATTEMPTS):
        session = app.sessions.require(session_id)
        invocation = session.projection.open_invocation
        if invocation is None:
            return {"status": session.status}
        session.append(InvocationEndEvent(invocation_id=invocation, status="error", error=error, error_type=error_type))
        try:
            app.sessions.commit(session)
        except VersionConflict:
            continue
        return {"status": session.status, "version": session.version}
    return {"status": app.sessions.require(session_id).status}


class StepFunctions:
    """Start and wake the resume workflow's executions (the AWS SDK is imported on first use only)."""

    def __init__(self, state_machine_arn: str, client: Any = None) -> None:
        self.state_machine_arn = state_machine_arn
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import botocore.session

            self._client = botocore.session.get_session().create_client("stepfunctions")
        return self._client

    def on_yield(self, tenant: str, app: App, outcome: AdvanceOutcome) -> None:
        name = execution_name(tenant, outcome.session_id, outcome.session.projection.open_invocation)
        # A retried request finds the execution its first attempt started.
        with contextlib.suppress(self.client.exceptions.ExecutionAlreadyExists):
            self.client.start_execution(
                stateMachineArn=self.state_machine_arn,
                name=name,
                input=json.dumps({"tenant": tenant, "session_id": outcome.session_id}),
            )

    def on_answers(self, tenant: str, app: App, session: Session) -> dict[str, Any]:
        token = app.store.load_scoped_state(app.name, TOKEN_SCOPE, session.id).get("task_token")
        if not token:
            return {"woke": False}  # park has not stored its token yet: it will find the answers itself
        # A token left by an earlier wait is refused by Step Functions (ignored); that wait's successor
        # parks after these answers landed and wakes itself.
        return {"woke": self.wake(token)}

    def wake(self, token: str) -> bool:
        """Send the answers' arrival to the waiting task; ``False`` when it was woken already or ended."""
        try:
            self.client.send_task_success(taskToken=token, output=json.dumps({"answered": True}))
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _GONE:
                return False
            raise
        return True

    def park(self, app: App, session_id: str, token: str) -> dict[str, Any]:
        """Store ``token`` with the session, gated on its version; if answers arrived first, wake at once."""
        for _ in range(_ATTEMPTS):
            session = app.sessions.require(session_id)
            if session.status != "awaiting_input":
                return {"woke": self.wake(token), "status": session.status}
            stored = app.store.commit(
                session.stored(), [], session.version, [ScopedStateChange(TOKEN_SCOPE, session_id, "task_token", token)]
            )
            if stored.ok:
                return {"woke": False, "status": session.status}
        raise StoreBusy(f"session {session_id!r} kept moving while its task token was being stored")


def step_functions_from_env() -> StepFunctions:
    return StepFunctions(os.environ["DORMANT_STATE_MACHINE"])


def workflow_hooks() -> Hooks:
    """On AWS (``DORMANT_STATE_MACHINE`` set) the state machine waits and wakes; elsewhere, this process."""
    if os.environ.get("DORMANT_STATE_MACHINE"):
        machine = step_functions_from_env()
        return Hooks(on_yield=machine.on_yield, on_answers=machine.on_answers)
    return in_process_hooks(served_from_env())


def in_process_hooks(served: Served) -> Hooks:
    """Locally, where there is no Step Functions: the answers' request runs the agent on itself, and its
    answer gives the session's status and version after that run (on AWS they are those before the resume,
    which happens later)."""

    def on_answers(tenant: str, app: App, session: Session) -> dict[str, Any]:
        resumed = resume(served, app, session.id)["status"]
        after = app.sessions.require(session.id)
        return {"resumed": resumed, "status": after.status, "version": after.version}

    return Hooks(on_answers=on_answers)


def workflow_handler(
    served: Served | None = None, step_functions: StepFunctions | None = None
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda handler the state machine calls (see the module docstring for its actions)."""
    from aws_lambda_powertools import Logger

    logger = Logger()

    @logger.inject_lambda_context(log_event=False)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        chosen = served or served_from_env()
        app = chosen.for_tenant(str(event["tenant"]))
        session_id = str(event["session_id"])
        action = event["action"]
        logger.append_keys(session_id=session_id, action=action)
        if action == "park":
            return (step_functions or step_functions_from_env()).park(app, session_id, str(event["token"]))
        if action == "resume":
            return resume(chosen, app, session_id)
        if action == "expire":
            return end_invocation(app, session_id, "the wait for answers timed out", "SessionExpired")
        if action == "fail":
            error = event.get("error") or {}
            return end_invocation(app, session_id, str(error.get("Cause") or error), str(error.get("Error", "Failed")))
        raise InputError(f"unknown workflow action {action!r}", field="action")

    return handler


def sweeper_handler(served: Served | None = None) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The scheduled sweeper: repair commits a stopped writer left pending (stores that gate commits), and
    purge the sessions past the app's retention, in every tenant (``purge_tenants``: the SQL stores)."""

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        app = (served or served_from_env()).app
        repair: Callable[[], list[Any]] | None = getattr(app.store, "repair_pending", None)
        reports = repair() if repair is not None else []
        return {
            "repaired": len(reports),
            "sessions": [f"{r.app_name}/{r.session_id}@{r.version}: {r.action}" for r in reports],
            "purged": [f"{name}/{sid}" for name, ids in purge_tenants(app).items() for sid in ids],
        }

    return handler
