"""Turns run and sleeping sessions woken by Step Functions (on AWS) or by threads of this process (locally).

Over 400 lines: the state machine's actions, its client and the sweeper share the wait's record (not split yet).

The state machine (``infra/workflow.py``) calls ``workflow_handler`` with ``{action, tenant, session_id,
invocation_id}``; each action works on that one invocation, never on "whatever is open":

* ``run`` takes the invocation on and runs it (``serving.turns.resume_turn``), committing before every step,
  and returns its status: ``yielded_tool`` parks, ``handed_on`` (its time ran out) runs again in a fresh
  invocation of the function, anything else ends the execution. A retried ``run`` (its first attempt timed
  out or died after committing) finds the invocation still open and takes it over from its last committed
  step; one that finds it waiting for answers parks again. An invocation not on the ledger yet (the
  execution starts just before the API commits the claim) is ``TurnNotClaimed``, which the state machine
  retries for a while and then drops: a claim that never landed has nothing to run. Its model calls must
  return ``MODEL_END_RESERVE_MS`` before the function's own deadline (``models.base.calls_end_by``): a slow
  provider ends the step with a typed error on the ledger, not a killed function.
* ``park`` (a ``.waitForTaskToken`` task) stores the task token with the session, gated on the version at
  which the invocation still awaited answers, and with it the wait's record: which execution parked
  (``execution``), at which version (``wait_version``) and until when it waits (``wait_until``); the sweeper
  reads it to tell a live wait from a lost one. Answers that arrived first moved the version: park sees them
  and wakes the execution itself, so they are not lost. ``POST /tools`` commits the answers (merging past a
  token commit), then reads the token and wakes the execution. Whichever lands second sees the other.
* ``expire`` (the wait timed out) ends the invocation with ``SessionExpired`` only while it still waits on
  answers, and only if this execution holds the wait (the record names it, or none does): an execution the
  sweeper superseded never expires the wait its successor holds. Answers that landed as the wait timed out
  are honoured (``resumable``: the state machine runs on).
* ``fail`` (a task failed for good) ends the invocation as an ``error`` with the reason, if it is still open.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .. import metrics
from ..app import App
from ..clock import now_ms
from ..errors import ClaimLost, ConfigurationError, DormantError, InputError, TurnNotClaimed
from ..events import InvocationEndEvent
from ..models.base import calls_end_by
from ..session import Session
from ..stores.base import BaseSessionStore, RepairableStore, RunningSession, ScopedStateChange
from .hooks import Hooks, Started
from .runtime import Served, purge_tenants, served_from_env, view_of
from .turns import RUNNER_TURN_MS, AdvanceOutcome, Claim, claim_turn, resume_turn, run_to_end

__all__ = [
    "TOKEN_SCOPE",
    "StepFunctions",
    "end_invocation",
    "execution_name",
    "in_process_hooks",
    "repair_after_lost_runner",
    "step_functions_hooks",
    "running_turns",
    "sweep_turns",
    "sweep_waits",
    "sweeper_handler",
    "workflow_handler",
]

TOKEN_SCOPE = "workflow"
MODEL_END_RESERVE_MS = 10_000
"""What a run keeps of its function's time after a model call gave up: to record the error and commit."""
_ATTEMPTS = 5
_GONE = {"InvalidToken", "TaskDoesNotExist", "TaskTimedOut"}
WAIT_GRACE_MS = 5 * 60_000
"""How long after its last commit a waiting session is left to its execution before the sweeper looks at it:
longer than a ``park`` takes with its retries, so a wait being parked is never taken for a lost one."""
_RESTARTS = 5
"""Names the sweeper tries for one wait's fresh execution (``-r1``...): a name whose execution ended is not reused."""


def execution_name(tenant: str, session_id: str, invocation_id: str, version: int) -> str:
    """One name per claim (tenant, session, invocation, the version claimed from): a retried request cannot
    start a second execution for the same claim, and a later claim of the same invocation gets its own."""
    return hashlib.sha256(f"{tenant}\n{session_id}\n{invocation_id}\n{version}".encode()).hexdigest()[:64]


def end_invocation(
    app: App,
    session_id: str,
    invocation_id: str,
    error: str,
    error_type: str,
    *,
    only_waiting: bool = False,
    holder: str | None = None,
) -> dict[str, Any]:
    """End invocation ``invocation_id`` as an ``error`` with the reason, if it is still open (and, with
    ``only_waiting``, still waiting on answers; with ``holder``, an execution's ARN, only while no other
    execution holds the wait); report the session's status either way."""
    if holder is not None:
        parked = app.store.load_scoped_state(app.name, TOKEN_SCOPE, session_id).get("execution")
        if parked and parked != holder:  # the sweeper gave the wait to another execution: that one ends it
            return {"status": "superseded"}

    def end(session: Session) -> None:
        if session.projection.open_invocation != invocation_id:
            return  # ended already, or another invocation's: nothing to end
        if only_waiting and session.status != "awaiting_input":
            return  # answered as the wait timed out: honoured, the state machine runs it on
        session.append(
            InvocationEndEvent(invocation_id=invocation_id, status="error", error=error, error_type=error_type)
        )

    written = app.sessions.write(session_id, end, on_conflict="retry", attempts=_ATTEMPTS)
    if written.status == "skipped":
        return {"status": written.session.status}
    metrics.count("expiries" if error_type == "SessionExpired" else "failures")
    return {"status": written.session.status, "version": written.version}


def run_action(
    served: Served, app: App, session_id: str, invocation_id: str, deadline: int | None, *, retried: bool = False
) -> dict[str, Any]:
    """The workflow's ``run``: take the invocation on and run it; report where it stands. A ``retried`` run
    (Step Functions' retry of ``Run``) first frees the session of a commit its dead predecessor left pending."""
    if retried:
        repair_after_lost_runner(app, session_id, invocation_id)
    try:
        outcome = resume_turn(app, served.agent, session_id, invocation_id, deadline=deadline)
    except ClaimLost:  # another runner holds the turn: that runner's execution carries it on
        return {"status": "superseded"}
    if isinstance(outcome, AdvanceOutcome):
        return {"status": outcome.status, "version": outcome.version}
    session = outcome
    if session.projection.open_invocation == invocation_id:  # waiting on answers: park (again)
        return {"status": "yielded_tool", "version": session.version}
    node = session.projection.invocations.get(invocation_id)
    if node is None and not _ended_before(session, invocation_id):
        raise TurnNotClaimed(f"invocation {invocation_id!r} of session {session_id!r} is not on the ledger yet")
    return {"status": node.status if node is not None else "ended", "version": session.version}


def repair_after_lost_runner(app: App, session_id: str, invocation_id: str) -> bool:
    """Finish or undo the commit a killed runner of this turn left pending (stores that gate commits): its
    retry must not wait on a dead writer's marker until it turns stale (``StoreBusy`` again and again, each
    costing a retry). Only for a claimed turn still running: a retry of ``TurnNotClaimed`` may meet the API's
    claim in flight, which is no dead writer's."""
    store = app.store
    if not isinstance(store, RepairableStore):
        return False
    session = app.sessions.get(session_id)
    if session is None or session.status != "running" or session.projection.open_invocation != invocation_id:
        return False
    return store.repair_session(app.name, session_id) is not None


def _ended_before(session: Session, invocation_id: str) -> bool:
    """Whether ``invocation_id`` is on the ledger (a snapshot keeps only open invocations; read the events)."""
    return any(event.invocation_id == invocation_id for event in session.events)


class StepFunctions:
    """Start executions and answer task tokens (the AWS SDK is imported on first use only).

    Answering a token needs no state machine ARN: ``park`` and ``tools`` are built without one. Starting an
    execution (``run``, the sweeper) needs it."""

    def __init__(self, state_machine_arn: str | None = None, client: Any = None) -> None:
        self.state_machine_arn = state_machine_arn
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            import botocore.session

            self._client = botocore.session.get_session().create_client("stepfunctions")
        return self._client

    def start(self, tenant: str, session_id: str, invocation_id: str, version: int) -> str:
        """Start the execution that will run this claim (the same claim's retry finds it started)."""
        name = execution_name(tenant, session_id, invocation_id, version)
        with contextlib.suppress(self.client.exceptions.ExecutionAlreadyExists):
            self._start(tenant, session_id, invocation_id, name)
        return name

    def restart(self, tenant: str, session_id: str, invocation_id: str, version: int) -> str:
        """Start a fresh execution for a wait whose own is gone (the sweeper). Named after the session's version
        (``<claim's name>-r0``: a claim's own execution is never taken for it), so two sweeps of the same wait
        start one execution; a name whose execution already ended (a restart that died before it parked) is not
        reused: the next (``-r1``, ``-r2``...) is tried."""
        base = execution_name(tenant, session_id, invocation_id, version)
        for attempt in range(_RESTARTS):
            name = f"{base}-r{attempt}"
            try:
                self._start(tenant, session_id, invocation_id, name)
            except self.client.exceptions.ExecutionAlreadyExists:
                if self.status(name) == "RUNNING":
                    return name  # another sweep started it: it is the wait's execution
                continue
            return name
        raise ConfigurationError(f"{_RESTARTS} executions for session {session_id!r} at version {version} ended")

    def _start(self, tenant: str, session_id: str, invocation_id: str, name: str) -> None:
        if self.state_machine_arn is None:
            # a wiring mistake (a 500 naming it), not the caller's: no request can mend it
            raise ConfigurationError("StepFunctions was built without the state machine's ARN: it cannot start one")
        payload = {"tenant": tenant, "session_id": session_id, "invocation_id": invocation_id, "name": name, "loop": 0}
        self.client.start_execution(stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(payload))

    def status(self, execution: str) -> str | None:
        """An execution's status (``RUNNING``, ``SUCCEEDED``, ``ABORTED``...) by ARN or by name (this machine's);
        ``None`` when there is no such execution."""
        arn = execution
        if not arn.startswith("arn:"):
            if self.state_machine_arn is None:
                raise ConfigurationError("StepFunctions was built without the state machine's ARN")
            arn = f"{self.state_machine_arn.replace(':stateMachine:', ':execution:', 1)}:{execution}"
        try:
            described = self.client.describe_execution(executionArn=arn)
        except self.client.exceptions.ExecutionDoesNotExist:
            return None
        return str(described["status"])

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

    def park(
        self,
        app: App,
        session_id: str,
        invocation_id: str,
        token: str,
        *,
        execution: str | None = None,
        wait_seconds: float | None = None,
    ) -> dict[str, Any]:
        """Store ``token`` with the session while it waits on ``invocation_id``; if answers arrived first (or
        the wait is over), send the token back at once, so the execution goes on. With it goes the wait's
        record: the parked ``execution`` (its ARN), the version this commit stores and when the wait times out."""

        def waiting(session: Session) -> bool:
            return session.status == "awaiting_input" and session.projection.open_invocation == invocation_id

        def token_while_waiting(session: Session) -> list[ScopedStateChange]:
            if not waiting(session):
                return []
            until = None if wait_seconds is None else now_ms() + int(float(wait_seconds) * 1000)
            record = {"task_token": token, "execution": execution, "wait_version": session.version + 1}
            record["wait_until"] = until
            return [ScopedStateChange(TOKEN_SCOPE, session_id, key, value) for key, value in record.items()]

        written = app.sessions.write(
            session_id, waiting, on_conflict="retry", scoped_changes=token_while_waiting, attempts=_ATTEMPTS
        )
        if written.value:
            return {"woke": False, "status": written.session.status}
        return {"woke": self.wake(token), "status": written.session.status}


def step_functions_hooks(machine: StepFunctions) -> Hooks:
    """On AWS: the execution that runs a turn is started before the turn is claimed; answers wake it."""

    def before_claim(tenant: str, session_id: str, invocation_id: str, version: int) -> None:
        machine.start(tenant, session_id, invocation_id, version)

    return Hooks(before_claim=before_claim, on_answers=machine.on_answers)


class _Thread:
    """A turn running in a thread of this process."""

    def __init__(self, work: Callable[[], AdvanceOutcome | None]) -> None:
        self.outcome: AdvanceOutcome | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name="dormant-turn")
        _LOCAL_TURNS.add(self._thread)  # before it starts: a turn that ends at once must not leave itself here
        self._thread.start()

    def _run(self, work: Callable[[], AdvanceOutcome | None]) -> None:
        try:
            self.outcome = work()
        except DormantError as exc:  # lost to another runner, or the store failed: the session says where it is
            _logger.warning("dormant: a turn stopped: %s: %s", type(exc).__name__, exc)
        finally:
            _LOCAL_TURNS.discard(self._thread)

    def wait(self, seconds: float) -> AdvanceOutcome | None:
        self._thread.join(seconds)
        return None if self._thread.is_alive() else self.outcome


_LOCAL_TURNS: set[threading.Thread] = set()
_logger = logging.getLogger("dormant.serving")


def join_local_turns(timeout: float | None = None) -> None:
    """Wait for the turns this process runs in threads (a server stopping lets them commit first)."""
    for thread in list(_LOCAL_TURNS):
        thread.join(timeout)


def in_process_hooks(served: Served) -> Hooks:
    """Locally, where there is no Step Functions: a thread of this process runs each claimed turn, and
    answers that leave nothing to wait for start the resumed turn the same way."""

    def run(tenant: str, app: App, claim: Claim) -> Started:
        return _Thread(lambda: run_to_end(app, claim, served.agent))

    def on_answers(tenant: str, app: App, session: Session) -> dict[str, Any]:
        if session.status != "resumable":
            return {}
        try:
            claim = claim_turn(
                app, served.agent(session.current_agent_name), session.id, deadline=now_ms() + RUNNER_TURN_MS
            )
        except ClaimLost:  # another request resumed it first
            return {}
        claimed = {"status": claim.session.status, "version": claim.version}  # read before the thread moves it on
        _Thread(lambda: run_to_end(app, claim, served.agent))
        return claimed

    return Hooks(run=run, on_answers=on_answers)


def workflow_handler(
    served: Served | None = None, step_functions: StepFunctions | None = None
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda handler the state machine calls (see the module docstring for its actions). ``park`` needs
    ``step_functions`` (a client; no ARN) to wake itself when answers came first."""
    from aws_lambda_powertools import Logger
    from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

    logger = Logger()
    if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # the library's loggers write through this one, keys and all
        copy_config_to_registered_loggers(source_logger=logger, include={"dormant"})

    @logger.inject_lambda_context(log_event=False, clear_state=True)
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        logger.append_keys(
            tenant=event.get("tenant"),
            principal="workflow",  # the state machine acts for the tenant who claimed the turn
            session_id=event.get("session_id"),
            invocation_id=event.get("invocation_id"),
            action=event.get("action"),
        )
        # One function parks (park), another runs, expires and fails (resume): named by what it was asked.
        with metrics.collecting("park" if event.get("action") == "park" else "resume"):
            return _act(event, context)

    def _act(event: dict[str, Any], context: Any) -> dict[str, Any]:
        chosen = served or served_from_env()
        app = chosen.for_tenant(str(event["tenant"]))
        session_id = str(event["session_id"])
        invocation_id = str(event["invocation_id"])
        action = event["action"]
        if action == "run":
            remaining = int(context.get_remaining_time_in_millis())
            deadline = now_ms() + remaining
            retried = int(event.get("retry") or 0) > 0  # Step Functions' $$.State.RetryCount
            with calls_end_by(time.time() + (remaining - MODEL_END_RESERVE_MS) / 1000):
                return run_action(chosen, app, session_id, invocation_id, deadline, retried=retried)
        if action == "park":
            if step_functions is None:
                raise InputError("this function is not wired to answer task tokens", field="action")
            execution, wait = event.get("execution"), event.get("wait_seconds")
            return step_functions.park(
                app,
                session_id,
                invocation_id,
                str(event["token"]),
                execution=None if execution is None else str(execution),
                wait_seconds=None if wait is None else float(wait),
            )
        if action == "expire":
            holder = event.get("execution")
            return end_invocation(
                app,
                session_id,
                invocation_id,
                "the wait for answers timed out",
                "SessionExpired",
                only_waiting=True,
                holder=None if holder is None else str(holder),
            )
        if action == "fail":
            error = event.get("error") or {}
            cause, kind = str(error.get("Cause") or error), str(error.get("Error", "Failed"))
            return end_invocation(app, session_id, invocation_id, cause, kind)
        raise InputError(f"unknown workflow action {action!r}", field="action")

    return handler


def running_turns(app: App) -> Iterator[tuple[App, str]]:
    """``(view, session id)`` for each session of ``app`` and of its tenants whose stored status is ``running``.

    From the store's cross-app list of running sessions (``running_sessions``: an index on DynamoDB, a query on
    the SQL stores, oldest first); a store of the user's own that is no ``BaseSessionStore`` offers none."""
    store = app.store
    if not isinstance(store, BaseSessionStore):
        return
    views: dict[str, App | None] = {}
    for row in store.running_sessions():
        name = str(row.app_name)
        if name not in views:
            views[name] = view_of(app, name)
        view = views[name]
        if view is not None:  # else another app's session
            yield view, str(row.session_id)


def sweep_turns(
    served: Served,
    app: App,
    *,
    machine: StepFunctions | None = None,
    grace_ms: int = 60_000,
    wait_grace_ms: int = WAIT_GRACE_MS,
) -> list[str]:
    """Hand on the turns whose runner is gone, in ``app`` and every tenant of it: a ``running`` session whose
    recorded deadline passed more than ``grace_ms`` ago. With ``machine`` (on AWS) a tenant's turn gets a fresh
    Step Functions execution, whose ``Run`` takes the invocation over; otherwise it is run here. Either way its
    committed steps are kept and completed tools are not run again. A turn whose agent the app no longer has is
    ended as an ``error``. Then the waits whose wake-up was lost (``sweep_waits``, after ``wait_grace_ms``).
    Returns ``session@invocation: what`` lines."""
    return _sweep_running(served, app, machine, grace_ms) + sweep_waits(
        served, app, machine=machine, grace_ms=wait_grace_ms
    )


def _sweep_running(served: Served, app: App, machine: StepFunctions | None, grace_ms: int) -> list[str]:
    done: list[str] = []
    now = now_ms()
    for view, session_id in running_turns(app):
        session = view.sessions.get(session_id)
        if session is None or session.status != "running":
            continue
        invocation, deadline = session.projection.open_invocation, session.projection.deadline
        if invocation is None or deadline is None or now < deadline + grace_ms:
            continue
        try:
            served.agent(session.current_agent_name)
        except InputError:
            end_invocation(view, session.id, invocation, "its runner stopped and no agent can go on", "RunnerLost")
            metrics.count("stuck_sessions_ended")
            done.append(f"{session.id}@{invocation}: ended")
            continue
        tenant = view.name.removeprefix(f"{app.name}@") if view is not app else None
        if machine is not None and tenant is not None:
            name = machine.start(tenant, session.id, invocation, session.version)
            metrics.count("stuck_sessions_ended")  # handed on: its dead runner's turn goes to a fresh execution
            done.append(f"{session.id}@{invocation}: handed on (execution {name})")
            continue
        try:
            outcome = resume_turn(view, served.agent, session.id, invocation, deadline=now_ms() + RUNNER_TURN_MS)
        except ClaimLost:
            continue
        done.append(f"{session.id}@{invocation}: handed on ({outcome.status})")
    return done


def waiting_turns(app: App) -> Iterator[tuple[App, RunningSession]]:
    """``(view, row)`` for each session of ``app`` and of its tenants whose stored status is ``awaiting_input``
    or ``resumable``, from the store's cross-app index of them (``waiting_sessions``), oldest first."""
    store = app.store
    if not isinstance(store, BaseSessionStore):
        return
    views: dict[str, App | None] = {}
    for row in store.waiting_sessions():
        name = str(row.app_name)
        if name not in views:
            views[name] = view_of(app, name)
        view = views[name]
        if view is not None:
            yield view, row


def sweep_waits(
    served: Served, app: App, *, machine: StepFunctions | None = None, grace_ms: int = WAIT_GRACE_MS
) -> list[str]:
    """Give every wait someone to end it, in ``app`` and its tenants: a session that waits (``awaiting_input``,
    ``resumable``) and has not committed for ``grace_ms``.

    With ``machine`` (on AWS, a tenant's session): the execution the wait's record names is asked for
    (``DescribeExecution``). Alive, it is left alone, or, if the answers are in (``resumable``), woken with the
    stored task token: the wake-up ``POST /tools`` lost. Gone (stopped, failed, never started): a wait whose
    time ran out is expired as the state machine's ``Expire`` would; any other gets a fresh execution (a
    deterministic name), which parks again or, answered, runs the turn on. Off AWS (in-process hooks), a
    ``resumable`` session whose resume was lost is resumed here; one that awaits answers needs nobody until they
    come. Runs never double: a resumed turn is claimed under optimistic concurrency. Returns lines as
    ``sweep_turns``."""
    done: list[str] = []
    now = now_ms()
    for view, row in waiting_turns(app):
        if now < row.updated_at + grace_ms:
            continue  # just parked, just answered: its execution (or request) is on it
        tenant = view.name.removeprefix(f"{app.name}@") if view is not app else None
        try:
            if machine is not None and tenant is not None:
                line = _sweep_wait(machine, view, tenant, row, now)
            else:
                line = _resume_here(served, view, row)
        except DormantError as exc:  # one session's trouble does not stop the sweep of the others
            keys = {"tenant": tenant, "session_id": row.session_id}  # the keys every line carries, on this one too
            _logger.warning(
                "dormant: the sweep of %s failed: %s: %s", row.session_id, type(exc).__name__, exc, extra=keys
            )
            line = f"{row.session_id}: failed ({type(exc).__name__})"
        if line is not None:
            done.append(line)
    return done


def _sweep_wait(machine: StepFunctions, view: App, tenant: str, row: RunningSession, now: int) -> str | None:
    """One waiting session on AWS (see ``sweep_waits``)."""
    record = view.store.load_scoped_state(view.name, TOKEN_SCOPE, row.session_id)
    parked = record.get("execution")
    if parked and machine.status(str(parked)) == "RUNNING":
        token = record.get("task_token")
        if row.status == "resumable" and token and machine.wake(str(token)):
            metrics.count("orphaned_waits_restarted")
            return f"{row.session_id}: woken (execution {str(parked).rsplit(':', 1)[-1]})"
        return None  # its execution holds the wait (or is moving on from it)
    session = view.sessions.get(row.session_id)
    if session is None or session.status not in ("awaiting_input", "resumable"):
        return None
    invocation = session.projection.open_invocation
    if invocation is None:
        return None
    until = record.get("wait_until")
    this_wait = record.get("wait_version") == session.version  # nothing committed since it parked
    if session.status == "awaiting_input" and this_wait and isinstance(until, int) and now >= until:
        end_invocation(
            view, session.id, invocation, "the wait for answers timed out", "SessionExpired", only_waiting=True
        )
        return f"{session.id}@{invocation}: expired"
    name = machine.restart(tenant, session.id, invocation, session.version)
    metrics.count("orphaned_waits_restarted")
    return f"{session.id}@{invocation}: restarted (execution {name})"


def _resume_here(served: Served, view: App, row: RunningSession) -> str | None:
    """Off AWS: resume a ``resumable`` session whose resume was lost, in this process."""
    if row.status != "resumable":
        return None
    session = view.sessions.get(row.session_id)
    invocation = None if session is None else session.projection.open_invocation
    if session is None or session.status != "resumable" or invocation is None:
        return None
    try:
        served.agent(session.current_agent_name)
    except InputError:
        end_invocation(view, session.id, invocation, "its answers came and no agent can go on", "RunnerLost")
        return f"{session.id}@{invocation}: ended"
    try:
        outcome = resume_turn(view, served.agent, session.id, invocation, deadline=now_ms() + RUNNER_TURN_MS)
    except ClaimLost:
        return None  # resumed by another meanwhile
    metrics.count("orphaned_waits_restarted")
    return f"{session.id}@{invocation}: resumed ({outcome.status})"


def sweeper_handler(
    served: Served | None = None, step_functions: StepFunctions | None = None
) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The scheduled sweeper: repair commits a stopped writer left pending (stores that gate commits), purge
    the sessions past the app's retention, hand on turns whose runner is gone, and give each wait whose
    wake-up was lost an execution (``sweep_waits``), in every tenant (with ``step_functions``, on AWS, to a
    fresh execution; else in this process). An event may carry ``grace_seconds`` (an operator's "sweep
    now"): how long a session must have been quiet, instead of the defaults."""

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        with metrics.collecting("sweeper"):
            return _sweep(event)

    def _sweep(event: dict[str, Any]) -> dict[str, Any]:
        chosen = served or served_from_env()
        app = chosen.app
        reports = app.store.repair_pending() if isinstance(app.store, RepairableStore) else []
        metrics.count("repairs", len(reports))  # 0 too: "repairs > 0 for 3 sweeps" needs every sweep's count
        graces: dict[str, int] = {}
        given = event.get("grace_seconds") if isinstance(event, dict) else None
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, int | float) or given < 0:
                raise InputError(f"grace_seconds is a number >= 0, not {given!r}", field="grace_seconds")
            graces = {"grace_ms": int(given * 1000), "wait_grace_ms": int(given * 1000)}
        turns = sweep_turns(chosen, app, machine=step_functions, **graces)
        return {
            "repaired": len(reports),
            "sessions": [f"{r.app_name}/{r.session_id}@{r.version}: {r.action}" for r in reports],
            "purged": [f"{name}/{sid}" for name, ids in purge_tenants(app).items() for sid in ids],
            "turns": turns,
        }

    if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # on Lambda, its lines (the library's) are JSON with their keys
        from aws_lambda_powertools import Logger
        from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

        logger = Logger()
        copy_config_to_registered_loggers(source_logger=logger, include={"dormant"})

        def keyed(event: dict[str, Any], context: Any) -> dict[str, Any]:
            logger.append_keys(principal="sweeper")  # the schedule's sweep, for every tenant
            return handler(event, context)

        logged: Callable[[dict[str, Any], Any], dict[str, Any]] = logger.inject_lambda_context(
            log_event=False, clear_state=True
        )(keyed)
        return logged

    return handler
