"""A busy day, driven through a ``Deployment`` with AWS's capacity enforced (``capacity.py``), as many clients would.

``SLEEPING`` sessions are parked on a sign-off across many tenants; then ``TURNING`` sessions post a turn at once,
three in four of them in one hot tenant, each a chat turn (``signoffs=0``) or a turn that parks and is answered as
soon as its sign-off shows (often while it is still parking), and one sleeper in fifty is answered meanwhile. One
turning client in three waits for its turn (``Prefer: wait`` on ``POST /runs`` and on its answer's ``POST /tools``):
the turn runs inline in the function the request holds, at the held routes' method throttles.
Clients behave as a careful client does: a 429 is waited out for its ``Retry-After`` and tried again, a 5xx tried
again after a pause, and each is recorded. Then two sweeps. ``tests/deployed/test_busy_day.py`` holds the day to
its promises; ``python -m bench busy`` prints its latencies, throttles and cost.
"""

from __future__ import annotations

import concurrent.futures
import random
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .calls import evidence
from .sleepers import park_sleepers

HOT = "hot"
TENANTS = 20
"""Tenants the sleepers are spread over (the hot tenant is one more)."""
TIME_SCALE = 0.01
"""Retry intervals, Wait states and a 429's ``Retry-After`` pass at this fraction of real time."""
ATTEMPTS = 30
"""A client's tries of one request."""
SWEEP_EVERY = 5 * 60.0
"""The sweeper's schedule (seconds)."""
BACKOFF, BACKOFF_CAP = 0.2, 8.0
"""A refused request's pause (seconds): full jitter over ``BACKOFF * 2**retry``, at most ``BACKOFF_CAP``, as AWS's
SDKs back off (in the harness's time: its functions run many times slower than Lambda)."""
FUNCTION_WAIT = 240.0
"""The API functions' timeout here: the sandboxes run many times slower than Lambda on a shared 2-core machine. At
their template's 24 s, a loaded machine timed out hundreds of invocations (a fresh sandbox's first request builds
its SDK clients, which takes Lambda a few hundred milliseconds and took here more than 20 s): each a 502 to its
client, a discarded sandbox and one more cold start, which made the next time out too. A cold start's init gets as
long (``init_wait``): in a storm of them some took more than the harness's usual minute, each another 502. Lambda's
own time limits are held in ``test_fidelity`` and ``test_limits``."""
GATEWAY_WAIT = 2 * FUNCTION_WAIT + 60.0
"""How long the gateway waits on a function here (its request's turn in the harness's pool included): a cold
start's init and the whole timeout, with room, as API Gateway's 29 s holds the API functions' 4 s cold start and
24 s; the 29 s limit itself is held in ``test_fidelity``. At 300 s, a day on a machine at a load of 200 answered
a few 504s."""


@dataclass
class Client:
    """Callers as a careful client behaves: a 429 waited out for its ``Retry-After`` and tried again."""

    d: Any
    statuses: Counter[int] = field(default_factory=Counter)
    throttles: list[tuple[int, dict[str, str], Any]] = field(default_factory=list)
    """Every answer that refused for load (429, or a 500/502/503/504): status, headers, body."""
    refusals: Counter[tuple[int, str, str]] = field(default_factory=Counter)
    """(status, method, route) -> how many of ``throttles`` it answered."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)
    refused_answers: list[tuple[str, str, int, Any, str, str]] = field(default_factory=list)
    """Answers to a call the session showed as waiting that the API refused: tenant, session, status, body, the
    session's status and the call's id as shown."""

    def retried(self) -> bool:
        """Whether this thread's last request took more than one attempt."""
        return len(getattr(self._local, "tries", [])) > 1

    def call(
        self, method: str, path: str, body: Any = None, tenant: str = HOT, after_retry: int = 0, **options: Any
    ) -> tuple[int, Any]:
        """The answer, once it is not a throttle; ``after_retry``: a status taken as the answer of a retry (the
        request an earlier attempt made landed: e.g. 409 for a turn an attempt that timed out or failed began). A
        POST carries one ``Idempotency-Key`` for all its attempts, as the API asks of a client that retries."""
        tries: list[tuple[int, Any]] = []
        self._local.tries = tries
        if method == "POST":  # one key for every attempt: a retry after a 5xx whose claim landed is the same turn
            options["headers"] = {"Idempotency-Key": uuid.uuid4().hex, **(options.get("headers") or {})}
        for _ in range(ATTEMPTS):
            status, headers, answer = self.d.api(method, path, body, tenant=tenant, timeout=GATEWAY_WAIT, **options)
            tries.append((status, answer if status >= 400 else None))
            with self.lock:
                self.statuses[status] += 1
                if status == 429 or status >= 500:
                    self.throttles.append((status, headers, answer))
                    self.refusals[(status, method, re.sub(r"/sessions/[^/]+", "/sessions/{id}", path))] += 1
            if status == 429 or status >= 500:  # waited out: Retry-After, at least an exponential backoff
                given = headers.get("Retry-After") or headers.get("retry-after")
                backoff = random.uniform(0, min(BACKOFF_CAP, BACKOFF * 2 ** (len(tries) - 1)))
                time.sleep(max(float(given) * TIME_SCALE if given else 0.0, backoff))
                continue
            if status >= 400 and len(tries) > 1 and status != after_retry:
                raise AssertionError(f"{method} {path}: {tries}")
            return status, answer
        raise AssertionError(f"{method} {path}: still refused after {ATTEMPTS} tries; {evidence(self.d)}")


@dataclass
class Day:
    d: Any
    client: Client
    turned: dict[tuple[str, str], int]
    """(tenant, session) -> turns it was accepted (202/200) for."""
    answered: dict[tuple[str, str], int]
    """(tenant, session) -> answers it was given."""
    sleepers: list[tuple[str, str]]
    sweeps: list[dict[str, Any]]
    seconds: dict[str, float]
    """Wall time of each phase: ``park`` (the sleepers), ``busy`` (the turns at once), ``sweeps``."""
    held: dict[tuple[str, str], list[tuple[str, int]]]
    """(tenant, session) of each client that waited (``HOLD``) -> the route (``runs``, ``tools``) and status of each
    of its held requests: 200 answered with the turn (run inline: ended or parked), 202 handed on."""
    turn_seconds: list[float]
    """Each turn's ``POST /runs``, from the start until accepted (429s and retries included)."""
    load: Load
    swept: dict[tuple[str, str, str], float] = field(default_factory=dict)
    """Units billed while the two sweeps ran (and what they started), by partition: a sweep reads no healthy wait."""


def _tenant(i: int) -> str:
    return f"t{i % TENANTS}"


HOLD = {"Prefer": "wait=25"}
"""What a client that waits for its turn sends: the request holds its function up to 25 s and runs the turn inline."""


def _answer(c: Client, tenant: str, sid: str, settle: float = 120, held: list[tuple[str, int]] | None = None) -> bool:
    """Answer the session's sign-off once it shows one (False: it never did within ``settle`` s); ``held``: the
    client waits for the rest of the turn (``HOLD``), and its answer's status is counted there."""
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline:
        status, shown = c.call("GET", f"/sessions/{sid}", tenant=tenant)
        calls = (shown or {}).get("yielded_tools") or []
        if status == 200 and calls:
            body = {"answers": [{"call_id": calls[0]["call_id"], "input": {"approved": True}}]}
            options = {"headers": dict(HOLD)} if held is not None else {}
            status, answer = c.call("POST", f"/sessions/{sid}/tools", body, tenant=tenant, after_retry=409, **options)
            if held is not None:
                with c.lock:
                    held.append(("tools", status))
            if status in (200, 202) or (status == 409 and c.retried()):  # a 409 on a retry: the earlier attempt landed
                return True
            with c.lock:  # refused: the session stays waiting, its execution parked (the tests look at both)
                c.refused_answers.append((tenant, sid, status, answer, shown["status"], calls[0]["call_id"]))
            return False
        time.sleep(0.2)
    return False


def start(dynamodb_endpoint: str) -> Any:
    """The stack with the fidelity app, synthesized with the account's concurrency declared, capacity enforced; the
    API functions' timeouts at the harness's pace (``FUNCTION_WAIT``)."""
    from dormant.serving.routes import ROUTES

    from .calls import APP_PACKAGE
    from .capacity import Capacity
    from .deployment import Deployment

    return Deployment.start(
        dynamodb_endpoint=dynamodb_endpoint,
        app="fidelity_app:build",
        app_packages=[APP_PACKAGE],
        time_scale=TIME_SCALE,
        context={"account_concurrency": "1000"},
        capacity=Capacity(),
        timeouts={function: FUNCTION_WAIT for _, _, function in ROUTES},
    )


def run_day(d: Any, turning: int, sleeping: int) -> Day:
    """The day (the module docstring) on deployment ``d``: ``sleeping`` sessions parked, ``turning`` at once."""
    d.lambdas.init_wait = FUNCTION_WAIT  # a cold start in a storm of them took more than a minute here
    c = Client(d)
    started = time.monotonic()
    sleepers = [(_tenant(i), f"sleep-{i}") for i in range(sleeping)]
    park_sleepers(d, lambda tenant, sid: _park(c, tenant, sid), sleepers)  # most seeded, a share through the API
    d.settle(600)
    parked = time.monotonic()
    before = _marks(d, c)
    turners = [(HOT if i % 4 else _tenant(i), f"turn-{i}") for i in range(turning)]
    for tenant, sid in turners:
        created = c.call("POST", "/sessions", {"session_id": sid, "scopes": {}}, tenant=tenant, after_retry=409)
        assert created[0] in (201, 409)
    turned: Counter[tuple[str, str]] = Counter()
    answered: Counter[tuple[str, str]] = Counter()
    turn_seconds: list[float] = []
    held: dict[tuple[str, str], list[tuple[str, int]]] = {}
    lock = threading.Lock()
    go = threading.Barrier(turning)

    def turn(i: int) -> None:
        tenant, sid = turners[i]
        parks, waits = i % 2 == 1, i % 3 == 0
        go.wait()  # all at once
        began = time.monotonic()
        message = {"message": f"signoffs={int(parks)}"}
        options = {"headers": dict(HOLD)} if waits else {}
        status, _ = c.call("POST", f"/sessions/{sid}/runs", message, tenant=tenant, after_retry=409, **options)
        assert status in (200, 202, 409), status  # 409 only on a retry: an earlier attempt began the turn
        with lock:
            turned[(tenant, sid)] += 1
            turn_seconds.append(time.monotonic() - began)
            if waits:
                held[(tenant, sid)] = [("runs", status)]
        if parks and _answer(c, tenant, sid, held=held[(tenant, sid)] if waits else None):
            with lock:
                answered[(tenant, sid)] += 1

    def wake(who: tuple[str, str]) -> None:
        if _answer(c, *who):
            with lock:
                answered[who] += 1

    # one in fifty, half parked through the API, half seeded: answers to old waits, without doubling the turns at once
    woken = [who for i, who in enumerate(sleepers) if i % 100 in (0, 5)]
    with concurrent.futures.ThreadPoolExecutor(turning + len(woken)) as pool:
        futures = [pool.submit(turn, i) for i in range(turning)] + [pool.submit(wake, who) for who in woken]
        for future in futures:
            future.result()
    d.settle(600)
    busy = time.monotonic()
    load = Load(before, _marks(d, c))
    print("function errors in the day:", Counter((f, kind) for f, kind, _ in d.errors()))
    # two scheduled sweeps, 5 minutes apart, once the day's claims are past their deadlines: the longest a runner
    # may hold a turn (the functions' longest timeout) passes on dormant's clock, not on the test's
    d.advance(max(f.timeout for f in d.functions.values()) + SWEEP_EVERY)
    sweeps = [d.sweep(grace_seconds=None)]
    d.settle(600)
    d.advance(SWEEP_EVERY)
    sweeps.append(d.sweep(grace_seconds=None))
    d.settle(600)
    swept = {p: u - load.after["units"].get(p, 0.0) for p, u in _marks(d, c)["units"].items()}
    return Day(
        d,
        c,
        dict(turned),
        dict(answered),
        sleepers,
        sweeps,
        {"park": parked - started, "busy": busy - parked, "sweeps": time.monotonic() - busy},
        held,
        turn_seconds,
        load,
        {p: u for p, u in swept.items() if u > 0},
    )


def _marks(d: Any, c: Client) -> dict[str, Any]:
    accountant = d.accountant
    return {
        "invocations": len(d.lambdas.invocations),
        "units": dict(accountant.units) if accountant is not None else {},
        "throttles": Counter(accountant.throttles) if accountant is not None else Counter(),
        "requests": sum(c.statuses.values()),
        "executions": set(d.sfn.executions),
    }


@dataclass
class Load:
    """What the busy phase alone did: the counters before it and after it settled."""

    before: dict[str, Any]
    after: dict[str, Any]

    def invocations(self, d: Any) -> list[Any]:
        return list(d.lambdas.invocations[self.before["invocations"] : self.after["invocations"]])

    def units(self) -> dict[tuple[str, str, str], float]:
        return {p: u - self.before["units"].get(p, 0.0) for p, u in self.after["units"].items()}

    def throttles(self) -> Counter[tuple[str, str]]:
        return self.after["throttles"] - self.before["throttles"]  # type: ignore[no-any-return]

    def requests(self) -> int:
        return int(self.after["requests"] - self.before["requests"])

    def executions(self, d: Any) -> list[Any]:
        return [d.sfn.executions[a] for a in self.after["executions"] - self.before["executions"]]


def _park(c: Client, tenant: str, sid: str) -> None:
    """A sleeper: created, run until it waits on a sign-off."""
    assert c.call("POST", "/sessions", {"session_id": sid, "scopes": {}}, tenant=tenant, after_retry=409)[0] in (
        201,
        409,
    )
    status, _ = c.call("POST", f"/sessions/{sid}/runs", {"message": "signoffs=1"}, tenant=tenant, after_retry=409)
    assert status in (200, 202, 409), status
