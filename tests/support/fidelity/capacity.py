"""AWS's capacity, enforced as AWS enforces it (opt-in: ``Deployment.start(capacity=Capacity())``).

* **Lambda concurrency**: a function with ``ReservedConcurrentExecutions`` in the template runs at most that many
  invocations at once; the others share what the account has left (``account_concurrency`` minus every
  reservation). One more is refused with ``TooManyRequestsException`` (``lambda_``): Step Functions sees
  ``Lambda.TooManyRequestsException``, API Gateway answers a throttled proxy integration 500 (``deployment``).
* **API Gateway's stage throttle**: the stage's ``ThrottlingRateLimit``/``ThrottlingBurstLimit`` as a token bucket;
  past it the gateway answers 429 ``THROTTLED`` before any function runs (``deployment``).
* **Step Functions' API throttles**: a token bucket per API action, per account (``SFN_BUCKETS``); an empty bucket
  answers ``ThrottlingException`` (``stepfunctions``), which botocore retries with backoff.
* **DynamoDB's partitions**: each partition key (of the table, and of each global index by the index's own key)
  takes about 1,000 write units and 3,000 read units a second. Every function's DynamoDB call reports the units
  it was billed per partition (``bench.units.partition_units``, from the items before and after it: ``capture``)
  to the ``Accountant`` here, over loopback HTTP, and asks it before each HTTP attempt whether a partition it
  touches is over its rate; one that is gets the throttle DynamoDB answers (``worker``), which botocore retries.

A partition's bucket holds one second of its rate and may go into debt (a call is billed after it ran, from what
it touched): a call is refused while a partition it touches is in debt, as DynamoDB refuses the requests past
a partition's rate. ``rate_scale`` multiplies every rate (and bucket) at once: the harness runs its functions
far slower than AWS does, so a test that wants a throttle at the harness's pace scales the limits down with it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PARTITION_WRITE_UNITS = 1000.0
"""Write units a second one partition key takes (the developer guide's per-partition maximum)."""
PARTITION_READ_UNITS = 3000.0
"""Read units a second one partition key takes."""
SFN_BUCKETS: dict[str, tuple[float, float]] = {
    "StartExecution": (1300, 300),
    "DescribeExecution": (300, 15),
    "StopExecution": (1000, 200),
    "ListExecutions": (200, 5),
    "SendTaskSuccess": (3000, 500),
    "SendTaskFailure": (3000, 500),
    "SendTaskHeartbeat": (3000, 500),
}
"""Step Functions (Standard) API action -> (bucket size, refill per second), per account, in the large regions
(us-east-1, us-west-2, eu-west-1), from the developer guide's quotas page ("Quotas related to API action
throttling" for StartExecution, "Other quotas" for the rest). DescribeExecution refills at 15 a second: a sweep that
described every wait would be throttled past its first 300. State transitions have a bucket too (5,000, refilled
1,500 a second), which delays a transition rather than failing it: not modelled, as a day's transitions stay
inside one bucket (``python -m bench busy`` prints them)."""
ACCOUNT_CONCURRENCY = 1000
"""Lambda's default concurrency limit per account and region (new accounts may start lower)."""


class TokenBucket:
    """``size`` tokens, refilled at ``rate`` a second; ``take`` spends them, ``charge`` may leave a debt."""

    def __init__(self, size: float, rate: float) -> None:
        self.size = size
        self.rate = rate
        self._level = size
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self._level = min(self.size, self._level + (now - self._at) * self.rate)
        self._at = now

    def take(self, tokens: float = 1.0) -> bool:
        """Spend ``tokens`` if the bucket holds them (an API call's admission)."""
        with self._lock:
            self._refill()
            if self._level < tokens:
                return False
            self._level -= tokens
            return True

    def open(self) -> bool:
        """Whether the bucket is out of debt (a partition admits a request while it is)."""
        with self._lock:
            self._refill()
            return self._level > 0

    def charge(self, tokens: float) -> None:
        """Spend ``tokens`` after the fact, into debt if need be (units billed once the call ran)."""
        with self._lock:
            self._refill()
            self._level -= tokens


@dataclass
class Capacity:
    """What the harness enforces (see the module docstring); every rate is multiplied by ``rate_scale``."""

    account_concurrency: int = ACCOUNT_CONCURRENCY
    partition_write_units: float = PARTITION_WRITE_UNITS
    partition_read_units: float = PARTITION_READ_UNITS
    sfn_buckets: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(SFN_BUCKETS))
    rate_scale: float = 1.0


class Accountant:
    """The one ledger of capacity every sandbox and the interpreter share: partitions' units, API buckets, throttles."""

    def __init__(self, capacity: Capacity) -> None:
        self.capacity = capacity
        self._partitions: dict[tuple[str, str, str], TokenBucket] = {}
        self._sfn = {
            action: TokenBucket(size * capacity.rate_scale, rate * capacity.rate_scale)
            for action, (size, rate) in capacity.sfn_buckets.items()
        }
        self._lock = threading.Lock()
        self.units: dict[tuple[str, str, str], float] = defaultdict(float)
        """(place, partition key, ``read``/``write``) -> units billed, summed over the run."""
        self.throttles: Counter[tuple[str, str]] = Counter()
        """(who: a function, ``states`` or ``gateway``, what: the partition, API or function throttled) -> count."""
        self._server: ThreadingHTTPServer | None = None

    # -- DynamoDB partitions -------------------------------------------------------------------------------------

    def _bucket(self, place: str, key: str, kind: str) -> TokenBucket:
        with self._lock:
            bucket = self._partitions.get((place, key, kind))
            if bucket is None:
                rate = self.capacity.partition_write_units if kind == "write" else self.capacity.partition_read_units
                rate *= self.capacity.rate_scale
                bucket = self._partitions[(place, key, kind)] = TokenBucket(rate, rate)
            return bucket

    def admit(self, function: str, partitions: list[tuple[str, str, str]]) -> tuple[str, str, str] | None:
        """The first of ``partitions`` (place, key, kind) that is over its rate now, or None: the call may go."""
        for partition in partitions:
            if not self._bucket(*partition).open():
                with self._lock:
                    self.throttles[(function, f"{partition[0]}:{partition[2]}")] += 1
                return partition
        return None

    def charge(self, units: dict[tuple[str, str, str], float]) -> None:
        for partition, value in units.items():
            self._bucket(*partition).charge(value)
            with self._lock:
                self.units[partition] += value

    # -- Step Functions and Lambda -------------------------------------------------------------------------------

    def sfn_admits(self, action: str) -> bool:
        bucket = self._sfn.get(action)
        if bucket is None or bucket.take():
            return True
        with self._lock:
            self.throttles[("states", action)] += 1
        return False

    def throttled(self, who: str, what: str) -> None:
        with self._lock:
            self.throttles[(who, what)] += 1

    # -- the loopback endpoint the sandboxes report to -----------------------------------------------------------

    def serve(self) -> str:
        """Serve ``POST /admit`` and ``POST /charge`` on loopback; the URL the sandboxes are given."""
        accountant = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive: one connection per sandbox

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                partitions = [tuple(p) for p in body.get("partitions", [])]
                if self.path == "/admit":
                    refused = accountant.admit(body["function"], partitions)
                    answer: dict[str, Any] = {"refused": list(refused) if refused else None}
                else:
                    accountant.charge({tuple(p): float(u) for p, u in body.get("units", [])})  # empty: its caller died
                    answer = {}
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- views ----------------------------------------------------------------------------------------------------

    def hottest(self, kind: str = "write", place_contains: str = "") -> tuple[tuple[str, str, str], float] | None:
        """The partition billed the most units of ``kind`` (in a place whose name holds ``place_contains``)."""
        found = [(p, u) for p, u in self.units.items() if p[2] == kind and place_contains in p[0]]
        return max(found, key=lambda pu: pu[1]) if found else None


def reserved_concurrency(template: Any, functions: dict[str, Any]) -> dict[str, int]:
    """Function name -> its ``ReservedConcurrentExecutions`` in the template (functions without one left out)."""
    found = {}
    for name, function in functions.items():
        value = template.resources[function.logical_id]["Properties"].get("ReservedConcurrentExecutions")
        if value is not None:
            found[name] = int(template.resolve(value))
    return found


def stage_throttle(template: Any) -> tuple[float, float] | None:
    """(rate, burst) of the stage's ``/*/*`` method setting, or None when the stage sets none."""
    for stage in template.of_type("AWS::ApiGateway::Stage").values():
        for setting in stage["Properties"].get("MethodSettings") or []:
            if setting.get("ResourcePath") == "/*" and setting.get("HttpMethod") == "*":
                rate, burst = setting.get("ThrottlingRateLimit"), setting.get("ThrottlingBurstLimit")
                if rate is not None and burst is not None:
                    return float(template.resolve(rate)), float(template.resolve(burst))
    return None
