"""The scheduled sweeper: repairs commits a stopped writer left pending, purges expired sessions, hands on turns
whose runner is gone and gives each wait whose wake-up was lost someone to end it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from ... import metrics
from ...app import App
from ...clock import now_ms
from ...errors import ClaimLost, InputError
from ...stores.base import NOT_DUE, DueStore, RepairableStore, RunningSession, SweepableStore
from ..runtime import Served, purge_tenants, served_from_env, view_of
from ..turns import RUNNER_TURN_MS, resume_turn
from .stepfunctions import StepFunctions, answer_error, wait_record
from .tasks import end_invocation

WAIT_GRACE_MS = 5 * 60_000
"""How long after its last commit a waiting session is left to its execution before the sweeper looks at it:
longer than a ``park`` takes with its retries, so a wait being parked is never taken for a lost one."""

SWEEP_PAGE = 100
"""Due waits a sweep asks its store for at a time (``DueStore.due_waits``), paging on with the last row read."""

_logger = logging.getLogger("dormant.serving")


def running_turns(app: App) -> Iterator[tuple[App, str]]:
    """``(view, session id)`` for each session of ``app`` and of its tenants whose stored status is ``running``.

    From the store's cross-app list of running sessions (``running_sessions``: an index on DynamoDB, a query on
    the SQL stores, oldest first); a store of the user's own that is no ``SweepableStore`` offers none."""
    store = app.store
    if not isinstance(store, SweepableStore):
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
        tenant = view.name.removeprefix(f"{app.name}@") if view is not app else None
        try:
            line = _sweep_turn(served, view, tenant, session_id, machine, now, grace_ms)
        except Exception as exc:  # one session's trouble (a throttle, a bug) does not stop the sweep of the others
            line = _skipped(tenant, session_id, exc)
        if line is not None:
            done.append(line)
    return done


def _sweep_turn(
    served: Served, view: App, tenant: str | None, session_id: str, machine: StepFunctions | None, now: int, grace: int
) -> str | None:
    """One running session (see ``sweep_turns``)."""
    session = view.sessions.get(session_id)
    if session is None or session.status != "running":
        return None
    invocation, deadline = session.projection.open_invocation, session.projection.deadline
    if invocation is None or deadline is None or now < deadline + grace:
        return None
    try:
        served.agent(session.current_agent_name)
    except InputError:
        end_invocation(view, session.id, invocation, "its runner stopped and no agent can go on", "RunnerLost")
        metrics.count("stuck_sessions_ended")
        return f"{session.id}@{invocation}: ended"
    if machine is not None and tenant is not None:
        name = machine.start(tenant, session.id, invocation, session.version)
        metrics.count("stuck_sessions_ended")  # handed on: its dead runner's turn goes to a fresh execution
        return f"{session.id}@{invocation}: handed on (execution {name})"
    try:
        outcome = resume_turn(view, served.agent, session.id, invocation, deadline=now_ms() + RUNNER_TURN_MS)
    except ClaimLost:
        return None
    return f"{session.id}@{invocation}: handed on ({outcome.status})"


def _skipped(tenant: str | None, session_id: str, exc: Exception) -> str:
    """Log and count a session the sweep skipped; it is due again next sweep (nothing of it was moved)."""
    keys = {"tenant": tenant, "session_id": session_id}  # the keys every line carries, on this one too
    _logger.warning("dormant: the sweep of %s failed: %s: %s", session_id, type(exc).__name__, exc, extra=keys)
    metrics.count("sweep_skips")
    return f"{session_id}: failed ({type(exc).__name__})"


def waiting_turns(app: App, before: int | None = None) -> Iterator[tuple[App, RunningSession]]:
    """``(view, row)`` for each session of ``app`` and of its tenants that waits (``awaiting_input``, ``resumable``)
    and is due for the sweeper by ``before`` (epoch ms; ``None``: every wait), from the store's index of due
    waits (``DueStore.due_waits``), paged, the cursor kept from page to page: a sweep reads the due waits, none of
    the healthy ones. A ``SweepableStore`` of the user's own without due times lists every wait
    (``waiting_sessions``), due from its last commit."""
    store = app.store
    if isinstance(store, DueStore):
        rows: Iterator[RunningSession] = _due_pages(store, NOT_DUE if before is None else before)
    elif isinstance(store, SweepableStore):
        rows = (row for row in store.waiting_sessions() if before is None or row.updated_at <= before)
    else:
        return
    views: dict[str, App | None] = {}
    for row in rows:
        name = str(row.app_name)
        if name not in views:
            views[name] = view_of(app, name)
        view = views[name]
        if view is not None:
            yield view, row


def _due_pages(store: DueStore, before: int) -> Iterator[RunningSession]:
    after: RunningSession | None = None
    while True:
        page = store.due_waits(before, limit=SWEEP_PAGE, after=after)
        yield from page
        if len(page) < SWEEP_PAGE:
            return
        after = page[-1]


def sweep_waits(
    served: Served, app: App, *, machine: StepFunctions | None = None, grace_ms: int = WAIT_GRACE_MS
) -> list[str]:
    """Give every wait someone to end it, in ``app`` and its tenants: each wait that is due (``waiting_turns``
    by ``now - grace_ms``): one just committed (an answer, a yield) whose execution had ``grace_ms`` to take it
    on, one whose timeout passed ``grace_ms`` ago. A healthy wait is not read: once its execution parked, it is
    due only at its timeout (``StepFunctions.park`` sets it).

    With ``machine`` (on AWS, a tenant's session): the execution the wait's record names is asked for
    (``DescribeExecution``). Alive, the wait is left to it until its timeout (``set_due``), or, if the answers
    are in (``resumable``), woken with the stored task token: the wake-up ``POST /tools`` lost. Gone (stopped,
    failed, never started): a wait whose time ran out is expired as the state machine's ``Expire`` would; any
    other gets a fresh execution (a deterministic name), which parks again or, answered, runs the turn on. Off
    AWS (in-process hooks), a ``resumable`` session whose resume was lost is resumed here; one that awaits answers
    needs nobody until they come (not due until its next commit). Runs never double: a resumed turn is claimed
    under optimistic concurrency. A session whose sweep fails (a throttle, anything) is logged, counted
    (``sweep_skips``) and left due for the next sweep; the others are swept. Returns lines as ``sweep_turns``."""
    done: list[str] = []
    now = now_ms()
    for view, row in waiting_turns(app, now - grace_ms):
        tenant = view.name.removeprefix(f"{app.name}@") if view is not app else None
        try:
            if machine is not None and tenant is not None:
                line = _sweep_wait(machine, view, tenant, row, now)
            else:
                line = _resume_here(served, view, row)
        except Exception as exc:  # one session's trouble does not stop the sweep of the others
            line = _skipped(tenant, row.session_id, exc)
        if line is not None:
            done.append(line)
    return done


def _defer(view: App, row: RunningSession, due_at: int) -> None:
    """Leave this wait alone until ``due_at`` (if nothing committed since the row was read: a commit sets its own)."""
    store = view.store
    if isinstance(store, DueStore) and row.version is not None:
        store.set_due(row.app_name, row.session_id, row.version, due_at)


def _sweep_wait(machine: StepFunctions, view: App, tenant: str, row: RunningSession, now: int) -> str | None:
    """One waiting session on AWS (see ``sweep_waits``)."""
    record = wait_record(view, row.session_id)
    parked = record.get("execution")
    until = record.get("wait_until")
    if parked and machine.status(str(parked)) == "RUNNING":
        token = record.get("task_token")
        if row.status == "resumable" and token and machine.wake(str(token), error=answer_error(record)):
            metrics.count("orphaned_waits_restarted")
            _defer(view, row, now)  # looked at again after a grace if the woken run never commits
            return f"{row.session_id}: woken (execution {str(parked).rsplit(':', 1)[-1]})"
        if row.status == "awaiting_input" and _holds(view, row, record):
            _defer(view, row, until if isinstance(until, int) and until > now else NOT_DUE if until is None else now)
        else:
            _defer(view, row, now)  # moving on from the wait (or parking anew): looked at again after a grace
        return None  # its execution holds the wait (or is moving on from it)
    session = view.sessions.get(row.session_id)
    if session is None or session.status not in ("awaiting_input", "resumable"):
        return None
    invocation = session.projection.open_invocation
    if invocation is None:
        return None
    this_wait = record.get("wait_version") == session.version  # nothing committed since it parked
    if session.status == "awaiting_input" and this_wait and isinstance(until, int) and now >= until:
        end_invocation(
            view, session.id, invocation, "the wait for answers timed out", "SessionExpired", only_waiting=True
        )
        return f"{session.id}@{invocation}: expired"
    name = machine.restart(tenant, session.id, invocation, session.version)
    metrics.count("orphaned_waits_restarted")
    _defer(view, row._replace(version=session.version), now)  # due again after a grace if it never parks
    return f"{session.id}@{invocation}: restarted (execution {name})"


def _holds(view: App, row: RunningSession, record: dict[str, Any]) -> bool:
    """Whether the wait's record (``park``'s) is this wait's: nothing committed since it parked, or (an answer
    to some of its calls since) the record names the invocation the session still waits on."""
    if record.get("wait_version") == row.version:
        return True
    parked_on = record.get("invocation")
    if parked_on is None:  # a record parked before it named its invocation: taken as this wait's
        return True
    session = view.sessions.get(row.session_id)
    return session is not None and session.projection.open_invocation == parked_on


def _resume_here(served: Served, view: App, row: RunningSession) -> str | None:
    """Off AWS: resume a ``resumable`` session whose resume was lost, in this process."""
    if row.status != "resumable":
        _defer(view, row, NOT_DUE)  # awaits answers: nobody need look until they come (their commit makes it due)
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
