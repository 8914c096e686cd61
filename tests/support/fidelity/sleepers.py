"""The busy day's sleepers: thousands of sessions parked on a sign-off, most of them seeded as what a parked session
is, a share parked through the API.

Through the API (every ``API_SHARE``-th): ``POST /sessions`` and ``POST /runs`` through the gateway, the run
function's claim and execution, the resume function's turn and the park function's token: the whole arc, four
sandbox invocations each.

Seeded (the others): the ledger is written in this process by the library, with the deployment's own app and store
(the run function's ``DORMANT_APP`` and ``DORMANT_STORE``): the session created, the turn claimed as ``POST /runs``
claims it (its invocation id, deadline and principal) and run to its sign-off as the resume function runs it. Then
the execution that claim names (``execution_name``) is started in the harness's state machine with the input the
run function gives it: its ``Run`` (the resume function) finds the turn waiting, and its ``Park`` (the park
function) stores the task token and the wait's record with the session and marks it not due, as for any wait.
Not exercised for a seeded sleeper: the gateway, the sessions and run functions, their idempotency records and the
turn quota, the capacity ledger's units for the writes made here (they are the harness's, not a function's), and
the order of the execution's start before the claim (started after the turn waits, so its ``Run`` does not race
this process's). Each costs two sandbox invocations instead of four, and no gateway or function cold starts.

Either way a sleeper ends parked: ``awaiting_input``, one execution alive in ``Park``, its token on the ledger.
Sleepers are put to sleep as a steady stream, not a storm: at most the park function's reserved concurrency of
them are between their execution's start and its park at once (the ledgers are written ahead), so ``park`` is
never throttled by them. (A storm at its cap, with cold starts many times slower than Lambda's, spends a task's
throttle retries in the harness's scaled time: the busy phase's to show, not the setup's.)
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

API_SHARE = 10
"""One sleeper in this many is parked through the API; the others are seeded."""
SEED_THREADS = 8
"""Threads writing seeded ledgers in this process, ahead of their executions."""


def through_api(i: int) -> bool:
    """Whether sleeper ``i`` is parked through the API (the first, and every ``API_SHARE``-th)."""
    return i % API_SHARE == 0


def park_sleepers(d: Any, park_through_api: Callable[[str, str], None], sleepers: list[tuple[str, str]]) -> None:
    """Park every sleeper (``through_api`` ones with ``park_through_api(tenant, sid)``); return once each is parked."""
    from .capacity import reserved_concurrency

    gate = threading.BoundedSemaphore(reserved_concurrency(d.template, d.functions).get("park", SEED_THREADS))
    seeder = _Seeder(d)

    def api(who: tuple[str, str]) -> None:
        with gate:
            park_through_api(*who)
            _await_park(d, lambda: _executions_of(d, *who), who)

    def seeded(who: tuple[str, str]) -> None:
        name = seeder.write(*who)  # outside the gate: the ledgers are written ahead
        with gate:
            arn = seeder.start(*who, name)
            _await_park(d, lambda: [e for e in [d.sfn.executions.get(arn)] if e is not None], who)

    pool = concurrent.futures.ThreadPoolExecutor(SEED_THREADS + 8)
    try:
        futures = [pool.submit(api if through_api(i) else seeded, who) for i, who in enumerate(sleepers)]
        for future in concurrent.futures.as_completed(futures):
            future.result()  # the first failure ends the setup at once
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        seeder.close()


def stored_statuses(d: Any, sessions: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each session's status as stored, read in this process with the deployment's app and store."""
    fidelity, served = _served(d)
    try:
        with concurrent.futures.ThreadPoolExecutor(SEED_THREADS) as pool:
            found = pool.map(lambda who: served.for_tenant(who[0]).sessions.require(who[1]).status, sessions)
            return dict(zip(sessions, found, strict=True))
    finally:
        fidelity.app.close()


def _served(d: Any) -> tuple[Any, Any]:
    """The fidelity app on the deployment's own store (the run function's ``DORMANT_STORE``), served as there."""
    from dormant.serving.runtime import Served
    from dormant.stores.url import store_from_url

    from .fidelity_app import build
    from .template import REGION

    url = d.lambdas.environment(d.functions["run"])["DORMANT_STORE"]
    fidelity = build(store_from_url(f"{url}{'&' if '?' in url else '?'}endpoint={d.dynamodb_endpoint}&region={REGION}"))
    return fidelity, Served(fidelity.app, {fidelity.agent.name: fidelity.agent})


class _Seeder:
    """Writes a seeded sleeper's ledger with the deployment's own app and store, and starts its execution."""

    def __init__(self, d: Any) -> None:
        import botocore.session

        from dormant.serving.workflow import StepFunctions

        from .template import REGION

        env = d.lambdas.environment(d.functions["run"])
        self.fidelity, self.served = _served(d)
        self.client = botocore.session.get_session().create_client(
            "stepfunctions",
            region_name=REGION,
            endpoint_url=env["AWS_ENDPOINT_URL_SFN"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        self.machine = StepFunctions(env["DORMANT_STATE_MACHINE"], self.client)
        self.executions = d.machine_arn.replace(":stateMachine:", ":execution:", 1)

    def write(self, tenant: str, sid: str) -> tuple[str, int]:
        """The session created and its turn claimed and run to its sign-off: (invocation id, version claimed from)."""
        from dormant.clock import now_ms
        from dormant.serving.turns import CLAIM_GRACE_MS, claim_turn, run_claimed

        view = self.served.for_tenant(tenant)
        session = view.sessions.create(sid, {})
        version = session.version  # the version claimed from: the execution's name, as the run function names it
        invocation_id = f"inv_seed_{sid}"
        claim = claim_turn(
            view,
            self.fidelity.agent,
            session,
            {"message": "signoffs=1"},
            invocation_id=invocation_id,
            deadline=now_ms() + CLAIM_GRACE_MS,
            principal=tenant,
        )
        outcome = run_claimed(view, claim, deadline=now_ms() + 60_000)
        assert outcome.status == "yielded_tool", (tenant, sid, outcome)
        return invocation_id, version

    def start(self, tenant: str, sid: str, claimed: tuple[str, int]) -> str:
        """Start the claim's execution, named and given its input as the run function does; its ARN."""
        return f"{self.executions}:{self.machine.start(tenant, sid, *claimed)}"

    def close(self) -> None:
        self.client.close()
        self.fidelity.app.close()


def _executions_of(d: Any, tenant: str, sid: str) -> list[Any]:
    """The executions of one session (read from their inputs, as the run function writes them)."""
    marks = (f'"tenant": "{tenant}"', f'"session_id": "{sid}"')
    return [e for e in list(d.sfn.executions.values()) if all(m in e.input for m in marks)]


def _await_park(d: Any, executions: Callable[[], list[Any]], who: tuple[str, str], timeout: float = 600) -> None:
    """Until the sleeper's execution sleeps in ``Park`` (its park function returned); it ending first is a setup
    that failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for execution in executions():
            if execution.status != "RUNNING":
                raise AssertionError(f"{who}: its execution ended {execution.status} {execution.error}")
            if execution.history and execution.history[-1]["type"] == "TaskSubmitted":
                return
        time.sleep(0.02)
    raise AssertionError(f"{who}: its execution did not park within {timeout} s")
