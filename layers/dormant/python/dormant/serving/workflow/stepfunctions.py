"""Step Functions, seen from the library: the executions it starts (one name per claim) and the task tokens it
answers. The AWS SDK is imported on first use only."""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import TYPE_CHECKING, Any

from ... import aws
from ...clock import now_ms
from ...errors import ConfigurationError, SessionNotFound, StoreBusy
from ...session import Session
from ...stores.base import NOT_DUE, DueStore, ScopedStateChange
from ..hooks import Hooks

if TYPE_CHECKING:
    from ...app import App

TOKEN_SCOPE = "workflow"
_ATTEMPTS = 5
_GONE = {"InvalidToken", "TaskDoesNotExist", "TaskTimedOut"}
_RESTARTS = 5
"""Names the sweeper tries for one wait's fresh execution (``-r1``...): a name whose execution ended is not reused."""


ANSWERED = "Answered"
"""The error a wait's task is failed with (``SendTaskFailure``) when answers came and no runner took the turn on:
the state machine catches it on ``Park`` into ``Continue`` (the turn goes on in a fresh execution). A task's
success (``SendTaskSuccess``) ends the execution: the turn went on in the request that answered (issue 36)."""
ANSWERED_CAUSE = "the answers are stored; the turn goes on in the next execution"

WAIT_KEY = "wait"
"""The key of a wait's record (``park``'s) in the session's ``TOKEN_SCOPE`` state: one item, not one a field."""


def wait_record(app: App, session_id: str) -> dict[str, Any]:
    """The session's wait record: its task token, parked execution, the version and invocation it waits at and
    when it times out. Held under one key (one item on DynamoDB: 2 write units a park, not 10); a record an
    earlier release wrote, a key a field, is read as it was."""
    state = app.store.load_scoped_state(app.name, TOKEN_SCOPE, session_id)
    record = state.get(WAIT_KEY)
    return dict(record) if isinstance(record, dict) else state


def execution_name(tenant: str, session_id: str, invocation_id: str, version: int) -> str:
    """One name per claim (tenant, session, invocation, the version claimed from): a retried request cannot
    start a second execution for the same claim, and a later claim of the same invocation gets its own."""
    return hashlib.sha256(f"{tenant}\n{session_id}\n{invocation_id}\n{version}".encode()).hexdigest()[:64]


class StepFunctions:
    """Start executions and answer task tokens (the AWS SDK is imported on first use only).

    Answering a token needs no state machine ARN: ``park`` is built without one. Starting an execution (``run``,
    ``tools``, the sweeper) needs the sessions machine's (``state_machine_arn``: a turn starts at ``Run``) and the
    waits machine's (``wait_machine_arn``: a wait starts at ``Park``; without it a wait is started in the sessions
    machine, whose ``Run`` finds the turn waiting and parks: 2 transitions and an invocation more)."""

    def __init__(
        self, state_machine_arn: str | None = None, client: Any = None, *, wait_machine_arn: str | None = None
    ) -> None:
        self.state_machine_arn = state_machine_arn
        self.wait_machine_arn = wait_machine_arn
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = aws.client("stepfunctions")  # the process's one session (dormant.aws)
        return self._client

    def start(self, tenant: str, session_id: str, invocation_id: str, version: int, parked: bool = False) -> str:
        """Start the execution that will run this claim (the same claim's retry finds it started). ``parked``: the
        turn waits for answers at ``version`` (a waiting request ran it to its park): the execution is the waits
        machine's, which starts at ``Park``, with no ``Run`` (and no Choice) to find that out."""
        name = execution_name(tenant, session_id, invocation_id, version)
        with contextlib.suppress(self.client.exceptions.ExecutionAlreadyExists):
            self._start(self._machine(parked), tenant, session_id, invocation_id, name)
        return name

    def restart(self, tenant: str, session_id: str, invocation_id: str, version: int) -> str:
        """Start a fresh execution for a wait whose own is gone (the sweeper), in the waits machine: it parks again
        (or, answered meanwhile, continues into the sessions machine). Named after the session's version
        (``<claim's name>-r0``: a claim's own execution is never taken for it), so two sweeps of the same wait
        start one execution; a name whose execution already ended (a restart that died before it parked) is not
        reused: the next (``-r1``, ``-r2``...) is tried."""
        base = execution_name(tenant, session_id, invocation_id, version)
        machine = self._machine(parked=True)
        for attempt in range(_RESTARTS):
            name = f"{base}-r{attempt}"
            try:
                self._start(machine, tenant, session_id, invocation_id, name)
            except self.client.exceptions.ExecutionAlreadyExists:
                if self.status(name, machine) == "RUNNING":
                    return name  # another sweep started it: it is the wait's execution
                continue
            return name
        raise ConfigurationError(f"{_RESTARTS} executions for session {session_id!r} at version {version} ended")

    def _machine(self, parked: bool) -> str:
        """The waits machine for a wait (``parked``) if this was given one, else the sessions machine."""
        arn = (self.wait_machine_arn if parked else None) or self.state_machine_arn
        if arn is None:
            # a wiring mistake (a 500 naming it), not the caller's: no request can mend it
            raise ConfigurationError("StepFunctions was built without the state machine's ARN: it cannot start one")
        return arn

    def _start(self, machine: str, tenant: str, session_id: str, invocation_id: str, name: str) -> None:
        payload = {"tenant": tenant, "session_id": session_id, "invocation_id": invocation_id, "name": name, "loop": 0}
        self.client.start_execution(stateMachineArn=machine, name=name, input=json.dumps(payload))

    def status(self, execution: str, machine: str | None = None) -> str | None:
        """An execution's status (``RUNNING``, ``SUCCEEDED``, ``ABORTED``...) by ARN or by name (of ``machine``,
        by default the sessions machine); ``None`` when there is no such execution."""
        arn = execution
        if not arn.startswith("arn:"):
            machine = machine or self.state_machine_arn
            if machine is None:
                raise ConfigurationError("StepFunctions was built without the state machine's ARN")
            arn = f"{machine.replace(':stateMachine:', ':execution:', 1)}:{execution}"
        try:
            described = self.client.describe_execution(executionArn=arn)
        except self.client.exceptions.ExecutionDoesNotExist:
            return None
        return str(described["status"])

    def on_answers(self, tenant: str, app: App, session: Session) -> dict[str, Any]:
        record = wait_record(app, session.id)
        token = record.get("task_token")
        if not token:
            return {"woke": False}  # park has not stored its token yet: it will find the answers itself
        # A token left by an earlier wait is refused by Step Functions (ignored); that wait's successor
        # parks after these answers landed and wakes itself.
        return {"woke": self.wake(str(token), error=answer_error(record))}

    def end_wait(self, tenant: str, app: App, session: Session) -> bool:
        """End the execution waiting on ``session``'s answers without a runner of its own: the request that stored
        them runs the turn (``POST /tools`` with ``Prefer: wait``). ``False`` when no token is stored yet (park
        finds the turn taken on and ends its execution itself) or the wait ended already."""
        token = wait_record(app, session.id).get("task_token")
        return bool(token) and self.wake(str(token), inline=True)

    def wake(self, token: str, *, inline: bool = False, error: str | None = None) -> bool:
        """Send the answers' arrival to the waiting task; ``False`` when it was woken already or ended.

        ``inline``: the turn went on in the request that answered (or another runner holds it): the task succeeds
        and the execution ends there, no ``Continue``, no ``Run``. Otherwise the turn goes on in a fresh execution:
        the task fails with ``error`` (``ANSWERED``, which the machine catches into ``Continue``; the wait's record
        says so, ``answer_error``). A wait parked by an earlier machine (no ``error``) is sent a success without
        ``inline``: its ``Went on?`` continues it."""
        try:
            if inline or error is None:
                output = {"answered": True, "inline": True} if inline else {"answered": True}
                self.client.send_task_success(taskToken=token, output=json.dumps(output))
            else:
                self.client.send_task_failure(taskToken=token, error=error, cause=ANSWERED_CAUSE)
        except self.client.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _GONE:
                return False
            raise
        return True

    def park(
        self,
        app: App,
        session_id: str,
        invocation_id: str,
        token: str,
        *,
        execution: str | None = None,
        wait_seconds: float | None = None,
        answer_error: str | None = None,
    ) -> dict[str, Any]:
        """Store ``token`` with the session while it waits on ``invocation_id``; if answers arrived first (or
        the wait is over), send the token back at once, so the execution goes on. With it goes the wait's
        record: the parked ``execution`` (its ARN), the version it waits at, when the wait times out and
        ``answer_error``, the error the machine catches into ``Continue`` (its Park's payload names it).

        Not a commit: the record is written with the wait's due time (``set_due(scoped_changes=)``), gated on the
        version at which the invocation awaits answers, so the session's version, ``updated_at`` and listing entry
        stay as the commit into the wait left them (on DynamoDB: the token record and one move of the due entry,
        no listing or status entry). Answers that land first move the version: the gate refuses, and the next
        look finds them. A store that keeps no due times gets the record in a commit, as before."""
        store = app.store
        refused_at: int | None = None  # the version a gated write was last refused at
        for _ in range(_ATTEMPTS):
            session = app.sessions.get(session_id)
            if session is None:
                raise SessionNotFound(session_id)
            if not _waiting(session, invocation_id):
                return self._answered_first(session, invocation_id, token, answer_error)
            if not isinstance(store, DueStore) or session.version == refused_at:
                break  # refused with nothing moved: the store keeps no due times (the commit below)
            until = _until(wait_seconds)
            record = _record(session_id, token, execution, session.version, until, invocation_id, answer_error)
            due = NOT_DUE if until is None else until
            if store.set_due(app.name, session_id, session.version, due, scoped_changes=[record]):
                return {"woke": False, "status": session.status}
            refused_at = session.version
        else:
            raise StoreBusy(
                f"session {session_id!r} kept moving: {_ATTEMPTS} attempts to park its wait lost the race",
                session_id=session_id,
            )
        return self._park_in_commit(app, session_id, invocation_id, token, execution, wait_seconds, answer_error)

    def _park_in_commit(
        self,
        app: App,
        session_id: str,
        invocation_id: str,
        token: str,
        execution: str | None,
        wait_seconds: float | None,
        answer_error: str | None,
    ) -> dict[str, Any]:
        """``park`` on a store without due times: the record in a commit of its own (a version of its own)."""

        def token_while_waiting(session: Session) -> list[ScopedStateChange]:
            if not _waiting(session, invocation_id):
                return []
            until = _until(wait_seconds)
            return [_record(session_id, token, execution, session.version + 1, until, invocation_id, answer_error)]

        written = app.sessions.write(
            session_id,
            lambda session: _waiting(session, invocation_id),
            on_conflict="retry",
            scoped_changes=token_while_waiting,
            attempts=_ATTEMPTS,
        )
        if written.value:
            return {"woke": False, "status": written.session.status}
        return self._answered_first(written.session, invocation_id, token, answer_error)

    def _answered_first(
        self, session: Session, invocation_id: str, token: str, answer_error: str | None
    ) -> dict[str, Any]:
        """Answered before the token was stored. Only a turn no runner holds yet goes on in the next execution; one
        some runner took on since (POST /tools with Prefer: wait; its take-on has a deadline: the sweeper's if that
        runner dies), or that ended, is not run by this execution too: it ends at once (no Continue, no Run)."""
        needs_runner = session.status == "resumable" and session.projection.open_invocation == invocation_id
        return {"woke": self.wake(token, inline=not needs_runner, error=answer_error), "status": session.status}


def _waiting(session: Session, invocation_id: str) -> bool:
    return session.status == "awaiting_input" and session.projection.open_invocation == invocation_id


def _until(wait_seconds: float | None) -> int | None:
    """When a wait parked now times out (epoch ms), or ``None``: it never does."""
    return None if wait_seconds is None else now_ms() + int(float(wait_seconds) * 1000)


def _record(
    session_id: str,
    token: str,
    execution: str | None,
    version: int,
    until: int | None,
    invocation_id: str,
    answer_error: str | None,
) -> ScopedStateChange:
    """The wait's record (``wait_record``), as the write that stores it."""
    record = {
        "task_token": token,
        "execution": execution,
        "wait_version": version,
        "wait_until": until,
        "invocation": invocation_id,
    }
    if answer_error is not None:
        record["answer_error"] = answer_error
    return ScopedStateChange(TOKEN_SCOPE, session_id, WAIT_KEY, record)


def answer_error(record: dict[str, Any]) -> str | None:
    """The error a wait's record says its machine catches into ``Continue`` (``None``: a record from before)."""
    error = record.get("answer_error")
    return str(error) if error else None


def step_functions_hooks(machine: StepFunctions) -> Hooks:
    """On AWS: the execution that runs a turn is started before the turn is claimed; answers wake it. A turn
    whose caller waits runs in the request, and its execution is started after (``hand_on``) only if it parks or
    runs past the hold: its ``Run`` finds the turn waiting (and parks) or goes on from the last committed step."""

    def before_claim(tenant: str, session_id: str, invocation_id: str, version: int) -> None:
        machine.start(tenant, session_id, invocation_id, version)

    def hand_on(tenant: str, session_id: str, invocation_id: str, version: int, parked: bool) -> str:
        return machine.start(tenant, session_id, invocation_id, version, parked=parked)

    return Hooks(before_claim=before_claim, hand_on=hand_on, on_answers=machine.on_answers, end_wait=machine.end_wait)
