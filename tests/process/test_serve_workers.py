"""``dormant serve --workers N``: requests side by side in worker processes, each its own Lambda instance.

Driven as a separate process over real sockets, on SQLite: a slow run does not hold up a read, clients
racing runs and answers on one session leave a ledger with nothing lost or doubled (the losers told 409),
and no worker outlives its server, whether the server stops or is killed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.serve_calls import REQUEST, TIMEOUT, call
from tests.support.servers.serve import command, dormant_serve, serving_process

pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = 8


def children(pid: int) -> set[int]:
    """The live (not zombie) processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        state = _state(int(entry.name)) if entry.name.isdigit() else None
        if state is not None and state[1] == pid and state[0] != "Z":
            found.add(int(entry.name))
    return found


def _state(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent, or ``None`` once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, parent = stat.rsplit(")", 1)[1].split()[:2]
    return state, int(parent)


def gone(pid: int) -> bool:
    state = _state(pid)
    return state is None or state[0] == "Z"


def wait_until(check: Any, what: str) -> None:
    """Poll ``check()`` until true; ``TIMEOUT`` bounds a failing test, a passing one does not depend on it."""
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_slow_run_in_flight_does_not_hold_up_a_read(tmp_path: Path) -> None:
    """The run's tool holds it in a worker until the test releases it, and the test releases it only
    after a read of the same session has come back: with one request at a time, the read would wait for
    the run, the run for the release, and the run would end unreleased."""
    env = {"PYTHONPATH": str(ROOT), "HOLD_DIR": str(tmp_path)}
    store = f"sqlite:///{tmp_path / 'hold.db'}"
    args = ("--store", store, "--app", "tests.support.serve_app:build", "--workers", "2", "--quiet")
    with dormant_serve(*args, env=env, cwd=tmp_path, timeout=TIMEOUT) as server, ThreadPoolExecutor(2) as pool:
        assert call(f"{server.url}/sessions", "POST", {"session_id": "s-1"})[0] == 201
        run = pool.submit(call, f"{server.url}/sessions/s-1/runs", "POST", {"message": "go"})
        wait_until(lambda: (tmp_path / "inside").exists() or run.done(), "the run to enter its tool")
        assert not run.done(), run.result()

        status, shown = pool.submit(call, f"{server.url}/sessions/s-1").result(timeout=TIMEOUT)
        assert status == 200 and shown["status"] == "running" and not run.done()
        (tmp_path / "release").touch()

        status, ran = run.result(timeout=TIMEOUT)
        assert status == 200 and ran["output"]["text"] == '{"released": true}', ran
        assert ran["version"] > shown["version"]
    assert "Traceback" not in server.output()


def test_clients_racing_runs_and_answers_on_one_session_lose_with_409_and_nothing_is_lost_or_doubled(
    tmp_path: Path,
) -> None:
    """Eight clients at once, three times on one booking: all run it, all answer its approval, all run it
    again. Each race has its winners (one run that yields, one answer) and its losers, each told 409; the
    ledger holds each winner's message once and no loser's, under contiguous versions."""
    db = tmp_path / "race.db"
    with dormant_serve("--store", f"sqlite:///{db}", "--workers", "4", "--quiet", cwd=tmp_path) as server:
        api = f"{server.url}/sessions/b-1"
        assert call(f"{server.url}/sessions", "POST", {"session_id": "b-1", "scopes": {"user": "alex-doe"}})[0] == 201

        def race(path: str, body: Any) -> list[tuple[int, Any]]:
            start = threading.Barrier(CLIENTS, timeout=TIMEOUT)

            def one(n: int) -> tuple[int, Any]:
                start.wait()
                return call(f"{api}{path}", "POST", body(n))

            with ThreadPoolExecutor(CLIENTS) as pool:
                return list(pool.map(one, range(CLIENTS), timeout=TIMEOUT))

        def ask(n: int) -> dict[str, str]:
            return {"message": f"Client {n}: {REQUEST}"}

        first = race("/runs", ask)
        assert Counter(status for status, _ in first) == {200: 1, 409: CLIENTS - 1}, first
        [(_, won)] = [reply for reply in first if reply[0] == 200]
        assert won["status"] == "yielded_tool"
        [waiting] = won["yielded_tools"]

        answers = race("/tools", lambda n: {"answers": [{"call_id": waiting["call_id"], "input": {"approved": True}}]})
        assert Counter(status for status, _ in answers) == {202: 1, 409: CLIENTS - 1}, answers
        assert {body["error"] for status, body in answers if status == 409} == {"UnknownCallId"}
        deadline = time.monotonic() + TIMEOUT  # the answered turn runs on in the server after the 202
        while call(api)[1]["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)

        again = race("/runs", ask)
        assert {status for status, _ in again} <= {200, 409} and any(status == 200 for status, _ in again), again

        final = call(api)[1]
        events: list[dict[str, Any]] = []
        after: int | None = 0
        while after is not None:
            page = call(f"{api}/events?after={after}&limit=100")[1]
            events += page["events"]
            after = page["next"]
    assert "Traceback" not in server.output()

    sent = [ask(n)["message"] for n in range(CLIENTS)]
    winners = [sent[n] for race in (first, again) for n, (status, _) in enumerate(race) if status == 200]
    recorded = [e["text"] for e in events if e["type"] == "user"]
    assert sorted(recorded) == sorted(winners)  # each winner's message once, no loser's
    assert len({e["id"] for e in events}) == len(events)
    assert [e["type"] for e in events].count("tool_input") == 1
    assert [e["type"] for e in events].count("invocation_start") == [e["type"] for e in events].count("invocation_end")
    won_versions = [body["version"] for status, body in first + answers + again if status in (200, 202)]
    assert len(set(won_versions)) == len(won_versions) and max(won_versions) == final["version"]

    connection = sqlite3.connect(db)  # the store itself: a commit per version after the first (the creation)
    rows = connection.execute(
        "SELECT version, event_id FROM events WHERE session_id = 'b-1' ORDER BY version, seq"
    ).fetchall()
    connection.close()
    assert sorted({version for version, _ in rows}) == list(range(2, final["version"] + 1))
    assert [event_id for _, event_id in rows] == [e["id"] for e in events]


LONG_POLLS = 50


def test_fifty_long_polls_hold_no_worker_and_each_answers_when_an_event_lands(tmp_path: Path) -> None:
    """Fifty ``GET /events?wait=20`` open on four workers: ``GET /sessions`` still answers within a second (held
    in workers, eight of them took every worker and it waited ~19 s), none of the fifty answers before an event
    lands, and each answers with it once it does (a wait that ignored ``wait=`` would answer at once, empty)."""
    store = f"sqlite:///{tmp_path / 'polls.db'}"
    with dormant_serve("--store", store, "--workers", "4", "--quiet", cwd=tmp_path) as server:
        assert call(f"{server.url}/sessions", "POST", {"session_id": "s-1", "scopes": {"user": "alex-doe"}})[0] == 201
        host, port = server.url.removeprefix("http://").split(":")
        polls = []
        for _ in range(LONG_POLLS):
            connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
            connection.request("GET", "/sessions/s-1/events?after=0&wait=20")
            polls.append(connection)
        time.sleep(1)  # every poll reached the server (a held one would hold a worker by now)

        started = time.monotonic()
        status, listed = call(f"{server.url}/sessions")
        took = time.monotonic() - started
        assert status == 200 and [s["id"] for s in listed["sessions"]] == ["s-1"], listed
        assert took < 1.0, f"GET /sessions took {took:.1f} s behind {LONG_POLLS} long-polls"

        ready = [c.sock for c in polls if c.sock is not None and select.select([c.sock], [], [], 0)[0]]
        assert ready == [], f"{len(ready)} long-polls answered before any event landed"
        assert call(f"{server.url}/sessions/s-1/runs", "POST", {"message": REQUEST})[0] == 200
        started = time.monotonic()
        for connection in polls:
            response = connection.getresponse()
            page = json.loads(response.read())
            assert response.status == 200 and page["events"][0]["type"] == "invocation_start", page
            connection.close()
        assert time.monotonic() - started < 10  # each answered with the events, not at the end of its wait
    assert "Traceback" not in server.output()


def test_concurrent_callers_each_get_their_own_answer(tmp_path: Path) -> None:
    """Eight tenants at once, each reading its own session ``mine`` over and over: every reply is the
    caller's own (what one resolver shared by two requests at a time would break, across tenants)."""
    reads = 25
    store = f"sqlite:///{tmp_path / 'own.db'}"
    with dormant_serve("--store", store, "--workers", "4", "--quiet", cwd=tmp_path) as server:
        for n in range(CLIENTS):
            body = {"session_id": "mine", "scopes": {"user": f"user-{n}"}}
            assert call(f"{server.url}/sessions", "POST", body, principal=f"t-{n}")[0] == 201
        start = threading.Barrier(CLIENTS, timeout=TIMEOUT)

        def read(n: int) -> list[Any]:
            start.wait()
            return [call(f"{server.url}/sessions/mine", principal=f"t-{n}") for _ in range(reads)]

        with ThreadPoolExecutor(CLIENTS) as pool:
            seen = list(pool.map(read, range(CLIENTS), timeout=TIMEOUT))
    for n, replies in enumerate(seen):
        assert {(status, body["scopes"]["user"]) for status, body in replies} == {(200, f"user-{n}")}


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_server_stops_every_worker_when_it_stops(tmp_path: Path, stop: signal.Signals) -> None:
    with dormant_serve("--store", f"sqlite:///{tmp_path / 'stop.db'}", "--workers", "3", cwd=tmp_path) as server:
        workers = children(server.process.pid)
        assert len(workers) == 3 and "3 workers" in server.output()
        assert call(f"{server.url}/sessions")[0] == 200
        server.process.send_signal(stop)
        assert server.process.wait(timeout=TIMEOUT) == 0
    assert all(gone(pid) for pid in workers) and "stopping" in server.output()
    assert "Traceback" not in server.output()


def test_no_worker_outlives_a_killed_server(tmp_path: Path) -> None:
    with dormant_serve("--store", f"sqlite:///{tmp_path / 'kill.db'}", "--workers", "3", cwd=tmp_path) as server:
        workers = children(server.process.pid)
        assert len(workers) == 3
        server.process.kill()  # no chance to stop them: each must see its pipe close
        server.process.wait(timeout=TIMEOUT)
        wait_until(lambda: all(gone(pid) for pid in workers), "every worker to end")


def test_workers_orphaned_by_a_killed_server_busy_with_requests_end_quietly(tmp_path: Path) -> None:
    """kill -9 of the server while eight clients keep four workers busy: a worker whose reply the server never
    read gets a reset on its pipe, not EOF. Each worker ends all the same, and says nothing (they share the
    server's stderr: a ConnectionResetError traceback there is what a killed server's workers printed)."""
    with dormant_serve("--store", f"sqlite:///{tmp_path / 'orphans.db'}", "--workers", "4", "--quiet") as server:
        workers = children(server.process.pid)
        stop = threading.Event()

        def hammer(n: int) -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError, http.client.HTTPException):
                    call(f"{server.url}/sessions?limit=5")

        with ThreadPoolExecutor(CLIENTS) as pool:
            for n in range(CLIENTS):
                pool.submit(hammer, n)
            time.sleep(1.5)
            server.process.kill()
            server.process.wait(timeout=TIMEOUT)
            stop.set()
        wait_until(lambda: all(gone(pid) for pid in workers), "every orphaned worker to end")
    assert "Traceback" not in server.output() and "Error" not in server.output(), server.output()


def test_a_dead_worker_costs_its_requests_not_the_server(tmp_path: Path) -> None:
    with dormant_serve("--store", f"sqlite:///{tmp_path / 'dead.db'}", "--workers", "2", cwd=tmp_path) as server:
        first = min(children(server.process.pid))
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: gone(first), "the worker to die")
        for n in range(4):  # whichever worker each is handed to, a live one answers
            assert call(f"{server.url}/sessions", "POST", {"session_id": f"s-{n}"})[0] == 201
        wait_until(lambda: f"worker {first} died" in server.output(), "the server to say the worker died")


def test_with_every_worker_killed_the_server_starts_new_ones_and_answers(tmp_path: Path) -> None:
    """kill -9 of all four workers at once, idle: within a minute (in practice a second or two) four new workers
    answer, and the requests made meanwhile wait for them rather than answer 503."""
    with dormant_serve("--store", f"sqlite:///{tmp_path / 'all.db'}", "--workers", "4", cwd=tmp_path) as server:
        killed = children(server.process.pid)
        assert len(killed) == 4
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: all(gone(pid) for pid in killed), "every worker to die")
        started = time.monotonic()
        statuses = [call(f"{server.url}/sessions", "POST", {"session_id": f"s-{n}"})[0] for n in range(8)]
        assert statuses == [201] * 8 and time.monotonic() - started < 60, statuses
        wait_until(lambda: len(children(server.process.pid)) == 4, "four workers again")
        assert not children(server.process.pid) & killed
        assert server.process.poll() is None
        listening = _listening_inode(int(server.url.rsplit(":", 1)[1]))
        assert listening in _socket_inodes(server.process.pid)
        for pid in children(server.process.pid):  # forked from the serving process: its copies closed
            assert listening not in _socket_inodes(pid), f"worker {pid} holds the server's listening socket"
    output = server.output()
    assert all(f"worker {pid} died" in output for pid in killed) and "Traceback" not in output


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets a process holds open."""
    links = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            links.append(os.readlink(fd))
    return {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}


def _listening_inode(port: int) -> str:
    """The inode of the socket listening on ``port`` (IPv4), from /proc/net/tcp."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    raise AssertionError(f"nothing listens on {port}")


def test_workers_that_cannot_be_started_again_stop_the_server_with_exit_1(tmp_path: Path) -> None:
    """A worker dies and the one started in its place cannot build its app (here, broken on purpose): the
    server answers 503 meanwhile, then exits 1 naming why, within a minute, so a supervisor restarts it."""
    env = {"PYTHONPATH": str(ROOT), "HOLD_DIR": str(tmp_path)}
    store = f"sqlite:///{tmp_path / 'broken.db'}"
    args = ("--store", store, "--app", "tests.support.serve_app:build_until_broken", "--workers", "2")
    with dormant_serve(*args, env=env, cwd=tmp_path, timeout=TIMEOUT) as server:
        (tmp_path / "broken").touch()
        first = min(children(server.process.pid))
        os.kill(first, signal.SIGKILL)
        assert server.process.wait(timeout=60) == 1
    output = server.output()
    assert f"worker {first} died" in output and "broken on purpose" in output and "exit 1" in output, output
    assert "Traceback" not in output
    wait_until(lambda: not children(server.process.pid), "the other worker to end")


@pytest.mark.parametrize(
    ("args", "workers", "message"),
    [
        (["--store", "memory:", "--workers", "3"], 1, "a memory: store lives in one process"),
        (["--store", "memory:"], 1, None),
    ],
)
def test_a_memory_store_is_served_by_one_worker(
    tmp_path: Path, args: list[str], workers: int, message: str | None
) -> None:
    with dormant_serve(*args, cwd=tmp_path) as server:
        assert children(server.process.pid) == set()  # in the server's own process
        assert call(f"{server.url}/sessions", "POST", {"session_id": "s-1"})[0] == 201
        assert call(f"{server.url}/sessions/s-1")[0] == 200
    assert "1 worker;" in server.output() and (message is None or message in server.output())


def test_where_fork_is_missing_one_worker_serves_and_says_so(tmp_path: Path) -> None:
    """As on Windows: ``can_fork`` false. The server serves in its own process, with a message, not a traceback."""
    script = (
        "import sys; import dormant.serving.local as local; local.can_fork = lambda: False; "
        "from dormant.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = [sys.executable, "-c", script, "serve", "--port", "0", "--store", f"sqlite:///{tmp_path / 'one.db'}"]
    with serving_process(argv, cwd=tmp_path, timeout=TIMEOUT) as server:
        assert children(server.process.pid) == set()
        assert call(f"{server.url}/sessions", "POST", {"session_id": "s-1"})[0] == 201
    output = server.output()
    assert "cannot fork worker processes: serving with one worker" in output and "1 worker;" in output
    assert "Traceback" not in output


def test_zero_workers_is_refused_naming_the_option(tmp_path: Path) -> None:
    done = subprocess.run(
        [*command(), "serve", "--port", "0", "--workers", "0"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 2 and "--workers" in done.stderr and "Traceback" not in done.stderr


class _Echo:
    """A worker's API that answers each request with its own body, after a pause that varies."""

    def handle(self, method: str, target: str, headers: Any, body: bytes, client: str) -> Any:
        from dormant.serving.local import Reply

        time.sleep((hash(body) % 5) / 1000)
        return Reply(200, body, {"X-Worker": str(os.getpid())})


def test_the_pool_answers_each_request_with_its_own_reply_and_never_hangs() -> None:
    """The pool in this process, without a server: 200 requests from 8 threads over 3 workers each get their own
    reply, within seconds. A worker handed to a second request before the first's reply is read (two readers
    on one pipe) gives replies to the wrong callers, or none: either fails here at once, not at a shutdown."""
    import contextlib
    from collections.abc import Iterator
    from concurrent.futures import wait

    from dormant.serving.local import Workers

    @contextlib.contextmanager
    def build() -> Iterator[Any]:
        yield _Echo()

    workers = Workers(build, 3, timeout=30)
    pool = ThreadPoolExecutor(CLIENTS)
    try:
        futures = [
            pool.submit(workers.handle, "GET", "/x", [], f"request-{n}".encode(), "127.0.0.1") for n in range(200)
        ]
        _, pending = wait(futures, timeout=5)  # they take well under a second
        assert not pending, f"{len(pending)} requests got no reply"
        replies = [future.result() for future in futures]
        assert [reply.body for reply in replies] == [f"request-{n}".encode() for n in range(200)]
        assert len({reply.headers["X-Worker"] for reply in replies}) > 1  # the work was shared
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        workers.close(timeout=5)
