"""Local API (dormant serve): p50/p99 latency of GET /sessions/{id} and POST /runs, 8 concurrent clients.

Ours: ``dormant serve`` as started by default (the Bookings sample with its scripted model, on a SQLite
file; its default worker processes), driven by 8 client threads over keep-alive connections; each
request is one API Gateway event through the Lambda handler, in a worker taking one at a time. ``GET``
reads a booking waiting for approval (14 events); ``POST /runs`` runs a new booking's first turn until
it waits for approval (two commits: the claim, then the turn).
Floor: the same requests, clients and store, served by a bare threaded ``http.server`` process that does
the same work directly (``sessions.require`` + ``session_view``; ``serving.advance``), without the proxy
event, the Powertools resolver or the workers. The bare round trip (a fixed reply) is printed beside.
Both servers run at once and are measured in turns, ``ROUNDS`` times each, so a machine whose load
drifts weighs on both alike. Target: each percentile at most 2x the floor's.
Slow runs: ``GET`` p99 (8 clients, an idle session of ``tests.support.serve_app``) while ``SLOW_RUNS`` runs each
wait ``SLOW_SECONDS`` in their tool, as on a slow model, against the same server's ``GET`` p99 with none in
flight (measured in turns): what one request at a time would make a second or more. Target 2x.
"""

from __future__ import annotations

import http.client
import itertools
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .common import Figure, millis, scale

CLIENTS = 8
ROUNDS = scale(3, 1)
SLOW_RUNS = 2
SLOW_SECONDS = 1.0
TARGET = 2.0
REQUEST = "I need physio on Tuesday afternoon, for Alex Doe"


class Client:
    """One keep-alive connection; ``call`` returns the status, the JSON body and the seconds it took."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        self.connection = http.client.HTTPConnection(host, int(port), timeout=120)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any, float]:
        data = None if body is None else json.dumps(body).encode()
        started = time.perf_counter()
        headers = {"Content-Type": "application/json"}
        if method == "POST" and path.endswith("/runs"):
            headers["Prefer"] = "wait=25"  # the whole turn, as before runs answered 202: the same workload
        self.connection.request(method, path, body=data, headers=headers)
        response = self.connection.getresponse()
        raw = response.read()
        elapsed = time.perf_counter() - started
        return response.status, json.loads(raw) if raw else None, elapsed


def percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return statistics.median(samples), cuts[98]


def concurrently(url: str, work: Callable[[Client, int], list[float]]) -> list[float]:
    """``work(client, n)`` in CLIENTS threads at once, each with its own connection; every latency measured."""
    start = threading.Barrier(CLIENTS, timeout=120)

    def one(n: int) -> list[float]:
        client = Client(url)
        start.wait()
        try:
            return work(client, n)
        finally:
            client.connection.close()

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [s for samples in pool.map(one, range(CLIENTS), timeout=600) for s in samples]


def _expect(status: int, wanted: int, body: Any) -> None:
    if status != wanted:
        raise RuntimeError(f"HTTP {status} (expected {wanted}): {body}")


def reader(reads: int, path: Callable[[int], str]) -> Callable[[Client, int], list[float]]:
    """Client ``n``'s work: ``reads`` GETs of ``path(n)``, each one's time."""

    def read(client: Client, n: int) -> list[float]:
        samples = []
        for _ in range(reads):
            status, body, elapsed = client.call("GET", path(n))
            _expect(status, 200, body)
            samples.append(elapsed)
        return samples

    return read


def measure(url: str, tag: str) -> dict[str, list[float]]:
    """The two workloads against the server at ``url`` (fresh session ids under ``tag``)."""
    setup = Client(url)
    for n in range(CLIENTS):  # a completed booking to read, per client
        sid = f"{tag}-read-{n}"
        status, body, _ = setup.call("POST", "/sessions", {"session_id": sid})
        _expect(status, 201, body)
        status, body, _ = setup.call("POST", f"/sessions/{sid}/runs", {"message": REQUEST})
        _expect(status, 200, body)
    setup.connection.close()
    reads, runs = scale(200, 20), scale(25, 3)

    read = reader(reads, lambda n: f"/sessions/{tag}-read-{n}")

    def run(client: Client, n: int) -> list[float]:
        samples = []
        for i in range(runs):
            sid = f"{tag}-run-{n}-{i}"
            status, body, _ = client.call("POST", "/sessions", {"session_id": sid})
            _expect(status, 201, body)
            status, body, elapsed = client.call("POST", f"/sessions/{sid}/runs", {"message": REQUEST})
            _expect(status, 200, body)
            if body["status"] != "yielded_tool":
                raise RuntimeError(f"the run ended {body['status']}, not waiting for approval: {body}")
            samples.append(elapsed)
        return samples

    def bare(client: Client, n: int) -> list[float]:
        samples = []
        for _ in range(reads):
            status, body, elapsed = client.call("GET", "/bare")
            _expect(status, 200, body)
            samples.append(elapsed)
        return samples

    found = {"get": concurrently(url, read), "runs": concurrently(url, run)}
    if tag.startswith("floor"):
        found["bare"] = concurrently(url, bare)
    return found


def run() -> list[Figure]:
    try:
        import aws_lambda_powertools  # noqa: F401
    except ImportError:
        print("  skipped: dormant serve needs the lambda extra (pip install 'dormant[lambda]')")
        return []
    from tests.support.servers.serve import dormant_serve, serving_process

    ours: dict[str, list[float]] = {}
    floor: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as scratch:
        store = f"sqlite:///{Path(scratch) / 'serve.db'}"
        floor_argv = [sys.executable, "-m", "bench.serve", "floor", store]
        with (
            dormant_serve("--store", store, "--quiet", cwd=scratch, timeout=120) as served,
            serving_process(floor_argv, cwd=Path(__file__).resolve().parents[1], timeout=120) as bare,
        ):
            measure(served.url, "warm-ours")
            measure(bare.url, "warm-floor")
            for turn in range(ROUNDS):
                for url, tag, into in ((served.url, "ours", ours), (bare.url, "floor", floor)):
                    for key, samples in measure(url, f"{tag}-{turn}").items():
                        into.setdefault(key, []).extend(samples)
    figures = [slow_runs()]
    bare50, bare99 = percentiles(floor["bare"])
    for key, label in (("get", "GET /sessions/{id}"), ("runs", "POST /sessions/{id}/runs")):
        ours50, ours99 = percentiles(ours[key])
        floor50, floor99 = percentiles(floor[key])
        for name, mine, theirs, trip in (("p50", ours50, floor50, bare50), ("p99", ours99, floor99, bare99)):
            figures.append(
                Figure(
                    "serve",
                    f"{label} {name}, {CLIENTS} clients ({len(ours[key])} requests)",
                    millis(mine),
                    f"{millis(theirs)} (the same work, bare http.server)",
                    mine / theirs,
                    TARGET,
                    "lower",
                    note=f"bare round trip {millis(trip)}" if key == "get" else "",
                )
            )
    return figures


def slow_runs() -> Figure:
    """``GET`` p99 while slow runs hold workers, against ``GET`` p99 with none in flight, on one server."""
    from tests.support.servers.serve import dormant_serve

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as scratch:
        env = {"PYTHONPATH": str(root), "HOLD_DIR": scratch, "HOLD_SECONDS": str(SLOW_SECONDS)}
        store = f"sqlite:///{Path(scratch) / 'slow.db'}"
        args = ("--store", store, "--app", "tests.support.serve_app:build", "--quiet")
        with dormant_serve(*args, env=env, cwd=scratch, timeout=120) as server:
            setup = Client(server.url)
            for n in range(CLIENTS):
                status, body, _ = setup.call("POST", "/sessions", {"session_id": f"read-{n}"})
                _expect(status, 201, body)
            reads = scale(100, 10)

            read = reader(reads, lambda n: f"/sessions/read-{n}")

            def slow(n: int, turn: int, stop: threading.Event) -> None:
                client = Client(server.url)
                for i in itertools.count():
                    if stop.is_set():
                        break
                    sid = f"slow-{turn}-{n}-{i}"
                    status, body, _ = client.call("POST", "/sessions", {"session_id": sid})
                    _expect(status, 201, body)
                    status, body, _ = client.call("POST", f"/sessions/{sid}/runs", {"message": "hold"})
                    _expect(status, 200, body)
                client.connection.close()

            quiet: list[float] = []
            held: list[float] = []
            concurrently(server.url, read)  # warm up
            for turn in range(ROUNDS):
                quiet += concurrently(server.url, read)
                stop = threading.Event()
                with ThreadPoolExecutor(SLOW_RUNS) as pool:
                    running = [pool.submit(slow, n, turn, stop) for n in range(SLOW_RUNS)]
                    while not (Path(scratch) / "inside").exists():  # the tool creates it: a run is holding
                        time.sleep(0.01)
                    held += concurrently(server.url, read)
                    stop.set()
                    for future in running:
                        future.result(timeout=120)
                (Path(scratch) / "inside").unlink()
            setup.connection.close()
    quiet99, held99 = percentiles(quiet)[1], percentiles(held)[1]
    return Figure(
        "serve",
        f"GET p99 beside {SLOW_RUNS} runs of {SLOW_SECONDS:g} s, {CLIENTS} clients ({len(held)} requests)",
        millis(held99),
        f"{millis(quiet99)} (the same GETs, no run in flight)",
        held99 / quiet99,
        TARGET,
        "lower",
    )


# -- the floor: the same work behind a bare http.server ----------------------------------------------------


def floor_server(store_url: str) -> None:
    """Serve GET /sessions/{id}, POST /sessions, POST /sessions/{id}/runs and GET /bare, doing the work directly."""
    from dormant.serving import advance
    from dormant.serving.api import session_view
    from dormant.serving.runtime import load_served
    from dormant.stores.url import store_from_url

    served = load_served("bookings:build", store_from_url(store_url))
    app = served.for_tenant("local")
    agent = served.agent(None)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as dormant serve's handler

        def reply(self, status: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/bare":
                self.reply(200, {"ok": True})
                return
            session_id = self.path.removeprefix("/sessions/")
            self.reply(200, session_view(app, app.sessions.require(session_id)))

        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/sessions":
                self.reply(201, session_view(app, app.sessions.create(request["session_id"])))
                return
            session_id = self.path.removeprefix("/sessions/").removesuffix("/runs")
            outcome = advance(app, agent, app.sessions.require(session_id), {"message": request["message"]})
            self.reply(200, {"status": outcome.status, "version": outcome.version, "output": outcome.output.text})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # as dormant serve: stop on SIGINT, even started ignoring it
    print(f"floor at http://127.0.0.1:{server.server_address[1]} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["floor"]:
        floor_server(sys.argv[2])
