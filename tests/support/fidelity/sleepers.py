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
At most ``IN_FLIGHT`` seeded executions run their tasks at once: ``park`` is capped at its reserved concurrency,
and a storm of thousands would spend its throttle retries, as a real storm of turns would.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

API_SHARE = 10
"""One sleeper in this many is parked through the API; the others are seeded."""
IN_FLIGHT = 10
"""Seeded executions between their start and their park at once."""
SEED_THREADS = 8
"""Threads writing seeded ledgers in this process."""


def through_api(i: int) -> bool:
    """Whether sleeper ``i`` is parked through the API (the first, and every ``API_SHARE``-th)."""
    return i % API_SHARE == 0


def park_sleepers(d: Any, park_through_api: Any, sleepers: list[tuple[str, str]]) -> None:
    """Park every sleeper (``through_api`` ones with ``park_through_api(tenant, sid)``), until each is parked."""
    api = [who for i, who in enumerate(sleepers) if through_api(i)]
    seeded = [who for i, who in enumerate(sleepers) if not through_api(i)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        by_api = [pool.submit(park_through_api, *who) for who in api]
        _seed(d, seeded)
        for future in by_api:
            future.result()


def _seed(d: Any, sleepers: list[tuple[str, str]]) -> None:
    import botocore.session

    from dormant.clock import now_ms
    from dormant.serving.runtime import Served
    from dormant.serving.turns import CLAIM_GRACE_MS, claim_turn, run_claimed
    from dormant.serving.workflow import StepFunctions
    from dormant.stores.url import store_from_url

    from .fidelity_app import build
    from .template import REGION

    env = d.lambdas.environment(d.functions["run"])
    store = store_from_url(
        f"{env['DORMANT_STORE']}{'&' if '?' in env['DORMANT_STORE'] else '?'}"
        f"endpoint={d.dynamodb_endpoint}&region={REGION}"
    )
    fidelity = build(store)
    served = Served(fidelity.app, {fidelity.agent.name: fidelity.agent})
    client = botocore.session.get_session().create_client(
        "stepfunctions",
        region_name=REGION,
        endpoint_url=env["AWS_ENDPOINT_URL_SFN"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    machine = StepFunctions(env["DORMANT_STATE_MACHINE"], client)
    gate = threading.BoundedSemaphore(IN_FLIGHT)

    def seed(who: tuple[str, str]) -> None:
        tenant, sid = who
        view = served.for_tenant(tenant)
        session = view.sessions.create(sid, {})
        version = session.version  # the version claimed from: the execution's name, as the run function names it
        invocation_id = f"inv_seed_{sid}"
        claim = claim_turn(
            view,
            fidelity.agent,
            session,
            {"message": "signoffs=1"},
            invocation_id=invocation_id,
            deadline=now_ms() + CLAIM_GRACE_MS,
            principal=tenant,
        )
        outcome = run_claimed(view, claim, deadline=now_ms() + 60_000)
        assert outcome.status == "yielded_tool", (who, outcome)
        gate.acquire()
        try:
            name = machine.start(tenant, sid, invocation_id, version)
            _await_park(d, name, who)
        finally:
            gate.release()

    try:
        with concurrent.futures.ThreadPoolExecutor(SEED_THREADS + IN_FLIGHT) as pool:
            for future in [pool.submit(seed, who) for who in sleepers]:
                future.result()
    finally:
        client.close()
        fidelity.app.close()


def _await_park(d: Any, name: str, who: tuple[str, str], timeout: float = 600) -> None:
    """Until execution ``name`` sleeps in ``Park``; it ending first is a seeding that failed."""
    arn = d.machine_arn.replace(":stateMachine:", ":execution:", 1) + f":{name}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        execution = d.sfn.executions.get(arn)
        if execution is not None:
            if execution.status != "RUNNING":
                raise AssertionError(f"{who}: its execution ended {execution.status} {execution.error}")
            if execution.history and execution.history[-1]["type"] == "TaskSubmitted":
                return  # the park function returned: the task sleeps on its token
        time.sleep(0.02)
    raise AssertionError(f"{who}: its execution did not park within {timeout} s")
