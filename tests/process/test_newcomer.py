"""A newcomer's first commands: ``make demo``, then ``make serve`` (or ``dormant serve``), then the README's curl.

``make demo`` builds the venv ``dormant serve`` needs (the lambda extra), so the command after it works. A fresh
venv is too slow for a test, so a ``pip install dormant`` without the extra is played by a ``dormant serve``
whose import of Powertools fails, as it fails there.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

_WITHOUT = """
import sys
sys.modules[{module!r}] = None  # import of it raises ModuleNotFoundError, as in a venv without it
from dormant.cli import main
sys.exit(main(["serve", "--port", "0", "--store", "memory:", "--sweep-every", "0"]))
"""


def _serve_without(module: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT.format(module=module)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_dormant_serve_without_the_lambda_extra_says_how_to_get_it_in_one_line_and_exits_2(tmp_path: Path) -> None:
    done = _serve_without("aws_lambda_powertools", tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("dormant serve: needs the lambda extra")
    assert "make serve" in line and ".[lambda]" in line and "aws_lambda_powertools is not installed" in line


def test_a_module_missing_for_another_reason_is_not_blamed_on_the_extra(tmp_path: Path) -> None:
    done = _serve_without("dormant.serving.local", tmp_path)  # a bug, not a missing extra: its traceback shows it
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "needs the lambda extra" not in done.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_serve_installs_the_lambda_extra_then_runs_dormant_serve(tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # make -n: what it would run, into a venv of its own (nothing is run)
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "serve", f"VENV={venv}", "SERVE_ARGS=--port 8001"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("make")]
    install = next(n for n, line in enumerate(lines) if "pip install" in line)
    # The library with the lambda extra, and the Bookings sample (its own distribution): dormant serve's default app.
    assert lines[install].endswith("-e '.[lambda]' -e samples")
    assert lines[-1] == f"{venv}/bin/dormant serve --port 8001"
    assert install < len(lines) - 1


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_builds_the_venv_dormant_serve_needs_and_names_it_next(tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # the command a newcomer types after the demo must work in the venv it built
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "demo", f"VENV={venv}"], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip() and not line.startswith("make")]
    [install] = [line for line in lines if "pip install" in line]
    assert install.endswith("-e '.[lambda]' -e samples")
    assert f"{venv}/bin/bookings demo" in lines
    assert any(f"{venv}/bin/dormant serve" in line for line in lines[lines.index(f"{venv}/bin/bookings demo") :])


def _invoke(*args: str, cwd: Path, store: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "functions" / "invoke.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
        env={
            **{k: v for k, v in os.environ.items() if k != "DORMANT_STATE_MACHINE"},
            "PYTHONPATH": os.pathsep.join(sys.path),
            "DORMANT_STORE": store,
            "DORMANT_APP": "bookings:build",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        },
    )


def test_make_invoke_runs_every_sample_event_in_order_and_again(tmp_path: Path) -> None:
    pytest.importorskip("aws_lambda_powertools", reason="the handlers need the lambda extra")
    store = f"sqlite:///{tmp_path / 'invoke.db'}"
    samples = sorted(str(p.relative_to(ROOT / "events")) for p in (ROOT / "events").rglob("*.json"))
    seen: list[set[str]] = []
    for _ in range(2):  # fresh sessions each time: the same store takes it again
        done = _invoke("--all", cwd=tmp_path, store=store)
        assert done.returncode == 0, done.stdout + done.stderr
        steps = [line for line in done.stdout.splitlines() if line.startswith(("ok ", "BAD"))]
        assert steps and all(line.startswith("ok ") for line in steps), done.stdout
        assert sorted({line.split()[3].rstrip(":") for line in steps}) == samples  # every sample, none left out
        assert "Traceback" not in done.stderr
        seen.append({line.split()[1] for line in steps})
    assert len(seen[0]) == 3 and not seen[0] & seen[1]  # three sessions a run, new ids the second time
    for line in steps:  # what the events that failed before now answer
        if "api/tools.json" in line:
            assert ": 202 " in line  # the call the run yielded, answered (the sample's call-sample was a 400)
        if "api/commit.json" in line:
            assert ": 200 " in line  # after the version it read (the sample's fixed 1 was a 409)


def test_invoking_run_alone_says_it_needs_the_state_machine(tmp_path: Path) -> None:
    done = _invoke("run", str(ROOT / "events" / "api" / "run.json"), cwd=tmp_path, store="memory:")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "needs DORMANT_STATE_MACHINE" in done.stderr and "--all" in done.stderr


# -- DynamoDB Local with the endpoint alone ---------------------------------------------------------------


@pytest.fixture
def no_aws_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS_* variable and no ~/.aws: a machine that never configured AWS, in a process that made no AWS client
    yet (the process's one botocore session, ``dormant.aws``, resolves credentials and region once)."""
    from dormant import aws

    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(aws, "_session", [])


@pytest.mark.parametrize(
    ("endpoint", "local"),
    [
        ("http://localhost:8001", True),
        ("http://LOCALHOST:8001", True),
        ("http://127.0.0.1:8001", True),
        ("http://127.9.9.9:8001", True),
        ("http://[::1]:8001", True),
        ("http://attackerlocalhost:8001", False),
        ("http://localhost.evil.example:8001", False),
        ("http://10.0.0.8:8001", False),
        ("https://dynamodb.eu-west-1.amazonaws.com", False),
        ("http://[::1:8001", False),
    ],
)
def test_only_an_endpoint_on_this_machine_counts_as_dynamodb_local(endpoint: str, local: bool) -> None:
    from dormant.stores.url import is_loopback_endpoint

    assert is_loopback_endpoint(endpoint) is local


def test_a_loopback_endpoint_gets_dummy_credentials_and_a_region_when_none_are_configured(
    no_aws_configuration: None,
) -> None:
    pytest.importorskip("botocore")
    from dormant.errors import ConfigurationError
    from dormant.stores.url import LOCAL_ACCESS_KEY, LOCAL_REGION, store_from_url

    with pytest.raises(ConfigurationError, match="3 characters"):  # checked as for any table, before a client
        store_from_url("dynamodb://ab?endpoint=http://127.0.0.1:9")
    store = store_from_url("dynamodb://t-local?endpoint=http://127.0.0.1:9", create=False)  # nothing is sent
    try:
        client: Any = store._client  # type: ignore[attr-defined]
        assert client.meta.region_name == LOCAL_REGION
        assert client._request_signer._credentials.access_key == LOCAL_ACCESS_KEY
    finally:
        store.close()


def test_a_loopback_endpoint_keeps_the_credentials_and_region_the_environment_gives(
    no_aws_configuration: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("botocore")
    from dormant.stores.url import store_from_url

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "mine")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "mine")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-2")
    for url, region in [
        ("dynamodb://t-local?endpoint=http://localhost:9", "eu-west-2"),
        ("dynamodb://t-local?endpoint=http://localhost:9&region=ap-south-1", "ap-south-1"),
    ]:
        store = store_from_url(url, create=False)
        try:
            client: Any = store._client  # type: ignore[attr-defined]
            assert client.meta.region_name == region
            assert client._request_signer._credentials.access_key == "mine"
        finally:
            store.close()


def test_an_endpoint_elsewhere_gets_no_defaults(no_aws_configuration: None) -> None:
    pytest.importorskip("botocore")
    from dormant.errors import ConfigurationError
    from dormant.stores.url import store_from_url

    with pytest.raises(ConfigurationError, match="region"):
        store_from_url("dynamodb://t-remote?endpoint=http://192.0.2.1:8000", create=False)
    store = store_from_url("dynamodb://t-remote?endpoint=http://192.0.2.1:8000&region=eu-west-1", create=False)
    try:
        client: Any = store._client  # type: ignore[attr-defined]
        assert client._request_signer._credentials is None  # no dummy key sent to a machine that is not this one
    finally:
        store.close()


@pytest.mark.backend("dynamodb")
def test_dormant_serve_on_dynamodb_local_needs_the_endpoint_alone(
    dynamodb_endpoint: str, no_aws_configuration: None, tmp_path: Path
) -> None:
    pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")
    from tests.support.servers.serve import dormant_serve

    assert not any(name.startswith("AWS_") for name in os.environ)
    table = f"newcomer-{uuid.uuid4().hex[:8]}"
    with dormant_serve("--store", f"dynamodb://{table}?endpoint={dynamodb_endpoint}", cwd=tmp_path) as server:
        created = _request(f"{server.url}/sessions", "POST", {"session_id": "s-1"})
        listed = _request(f"{server.url}/sessions")
    assert created[0] == 201 and created[1]["id"] == "s-1"
    assert listed[0] == 200 and [s["id"] for s in listed[1]["sessions"]] == ["s-1"]
    assert "Traceback" not in server.output()


def _request(url: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


# -- the HTTP server: any method, disconnects, bursts -------------------------------------------------------


@pytest.fixture
def local_server(tmp_path: Path) -> Iterator[Any]:
    """A ``LocalServer`` (what ``dormant serve`` runs) with the inspector's page, listening but not yet serving."""
    pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")
    from dormant.cli import default_pages
    from dormant.serving.local import LocalAPI, LocalServer
    from dormant.serving.runtime import load_served
    from dormant.stores.url import store_from_url

    store = store_from_url(f"sqlite:///{tmp_path / 'server.db'}")
    api = LocalAPI(load_served("bookings:build", store), pages=default_pages())
    server = LocalServer(api, "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.server_close()
        store.close()


def _raw(url: str, method: str, target: str) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, target)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("method", "target", "status", "allow"),
    [
        ("TRACE", "/sessions", 405, "GET, HEAD, POST"),
        ("CONNECT", "/sessions/s-1", 405, "DELETE, GET, HEAD"),
        ("PATCH", "/sessions/s-1", 405, "DELETE, GET, HEAD"),
        ("PUT", "/sessions/s-1/runs", 405, "POST"),
        ("BREW", "/sessions", 405, "GET, HEAD, POST"),  # a token no HTTP server knows
        ("TRACE", "/", 405, "GET, HEAD"),  # the inspector's page
        ("DELETE", "/inspect/app.js", 405, "GET, HEAD"),
        ("TRACE", "/nowhere", 404, None),
    ],
)
def test_a_method_a_path_does_not_take_is_a_json_405_naming_allow(
    local_server: Any, method: str, target: str, status: int, allow: str | None
) -> None:
    with local_server.running():
        got, headers, body = _raw(local_server.url, method, target)
    assert got == status and headers.get("allow") == allow
    assert headers["content-type"] == "application/json"
    payload = json.loads(body)
    if status == 405:
        assert payload["error"] == "MethodNotAllowed" and payload["message"] == f"{method} {target}: use {allow}"
    else:
        assert payload["error"] == "NotFound"


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /sessions HTTP/9.9\r\n\r\n", 505),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
    ],
)
def test_what_http_server_itself_refuses_is_json_too(local_server: Any, request_line: bytes, status: int) -> None:
    host, port = local_server.url.removeprefix("http://").rsplit(":", 1)
    with local_server.running(), socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request_line)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split(b" ")[1] == str(status).encode()
    assert b"content-type: application/json" in head.lower() and json.loads(body)["message"]


def _exchange(url: str, request: bytes) -> tuple[int, bytes, bytes]:
    """Send raw bytes as one request; the status, head and body of the answer (the server closes after it)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, body


@pytest.mark.parametrize("lengths", [("2", "-5"), ("2", "3"), ("-5", "2")])
def test_two_differing_content_lengths_are_a_400_naming_it_and_nothing_is_written(
    local_server: Any, lengths: tuple[str, str]
) -> None:
    """Which of two lengths frames the body is what request smuggling plays on: neither is believed."""
    body = b'{"session_id": "smuggled"}'
    head = b"".join(f"Content-Length: {n}\r\n".encode() for n in lengths)
    request = (
        b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + head + b"\r\n" + body
    )
    with local_server.running():
        status, _, answer = _exchange(local_server.url, request)
        listed = _raw(local_server.url, "GET", "/sessions")
    assert status == 400 and json.loads(answer)["field"] == "Content-Length", answer
    assert json.loads(listed[2])["sessions"] == []


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_an_encoded_body_is_a_400_naming_content_encoding_and_nothing_is_written(
    local_server: Any, coding: str
) -> None:
    """Nothing decodes a body (API Gateway has no compression set): one marked gzip, gzip or not, is refused,
    not read as the bytes it is."""
    body = b'{"session_id": "encoded"}'  # valid JSON: what was accepted as is
    request = (
        f"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: {coding}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with local_server.running():
        status, _, answer = _exchange(local_server.url, request)
        listed = _raw(local_server.url, "GET", "/sessions")
        plain = _exchange(local_server.url, request.replace(f"Content-Encoding: {coding}".encode(), b"X-Note: plain"))
    assert status == 400 and json.loads(answer)["field"] == "Content-Encoding", answer
    assert json.loads(listed[2])["sessions"] == [] and plain[0] == 201


def _post(path: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


def test_head_on_a_get_route_answers_as_get_without_a_body(local_server: Any) -> None:
    with local_server.running():
        created = _exchange(local_server.url, _post("/sessions", b'{"session_id": "s-1"}'))
        got = _raw(local_server.url, "GET", "/sessions/s-1")
        head = _raw(local_server.url, "HEAD", "/sessions/s-1")
        listed = _raw(local_server.url, "HEAD", "/sessions")
        missing = _raw(local_server.url, "HEAD", "/sessions/nobody")
    assert created[0] == 201 and got[0] == 200 and head[0] == 200 and head[2] == b""
    assert head[1]["content-length"] == str(len(got[2])) and head[1]["content-type"] == got[1]["content-type"]
    assert listed[0] == 200 and listed[2] == b""
    assert missing[0] == 404 and missing[2] == b""


def test_post_answers_are_compact_json_as_gets_are(local_server: Any) -> None:
    request = _post("/sessions", json.dumps({"session_id": "s-1", "scopes": {"user": "alex-doe"}}).encode())
    with local_server.running():
        created = _exchange(local_server.url, request)
        again = _exchange(local_server.url, request)  # its 409, an error answer
        got = _raw(local_server.url, "GET", "/sessions/s-1")
    for status, _, answer in (created, again):
        assert status in {201, 409} and answer == json.dumps(json.loads(answer), separators=(",", ":")).encode()
    assert got[2] == json.dumps(json.loads(got[2]), separators=(",", ":")).encode()


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset, as a client that crashed or timed out does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_clients_that_go_away_mid_request_or_mid_response_are_one_quiet_line_each(
    local_server: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    host, port = local_server.url.removeprefix("http://").rsplit(":", 1)
    clients = 0
    with local_server.running():
        for _ in range(10):  # mid-request: the headers never end
            sock = socket.create_connection((host, int(port)), timeout=30)
            sock.sendall(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
            time.sleep(0.05)
            _reset(sock)
            clients += 1
        for _ in range(10):  # mid-response: a 60 KB answer to a client that reads none of it
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            sock.settimeout(30)
            sock.connect((host, int(port)))
            sock.sendall(b"GET /" + b"x" * 60_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")  # its 404 echoes the path
            time.sleep(0.05)
            _reset(sock)
            clients += 1
        assert _raw(local_server.url, "GET", "/sessions")[0] == 200  # and the server goes on
    err = capfd.readouterr().err
    assert "Traceback" not in err
    gone = [line for line in err.splitlines() if "went away" in line]
    assert 1 <= len(gone) <= clients  # at most one line a client; no traceback
    assert all(line.startswith("dormant serve: client 127.0.0.1:") for line in gone)


def test_two_hundred_clients_at_once_are_all_queued_and_all_answered(local_server: Any) -> None:
    from dormant.serving.local import REQUEST_BACKLOG

    assert REQUEST_BACKLOG >= 128 and local_server.request_queue_size == REQUEST_BACKLOG
    host, port = local_server.url.removeprefix("http://").rsplit(":", 1)
    count, connected, lock = 200, [0], threading.Lock()
    all_connected = threading.Event()
    outcomes: list[str] = [""] * count

    def client(n: int) -> None:
        try:
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                with lock:
                    connected[0] += 1
                    if connected[0] == count:
                        all_connected.set()
                sock.sendall(b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            outcomes[n] = answer.split(b"\r\n", 1)[0].decode()
        except OSError as exc:  # refused, reset, timed out
            outcomes[n] = type(exc).__name__

    threads = [threading.Thread(target=client, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    # The server accepts nothing yet: every connection the kernel completes waits in the listen backlog. With
    # socketserver's default of 5, the rest could not connect until it accepted (nor time out meanwhile).
    queued = all_connected.wait(timeout=20)
    with local_server.running():
        for thread in threads:
            thread.join(timeout=120)
    assert queued, f"only {connected[0]} of {count} connections were queued before the server accepted"
    assert outcomes == ["HTTP/1.1 200 OK"] * count


@pytest.mark.parametrize("wait", ["26", "abc", "-1", "1.5"])
def test_a_long_poll_held_by_the_server_still_refuses_a_bad_wait_naming_it(local_server: Any, wait: str) -> None:
    """The server holds a long-poll itself (asking with ``wait=0``); a ``wait`` the route refuses still reaches
    the route, and is its 400 naming ``wait``, at once."""
    with local_server.running():
        assert _exchange(local_server.url, _post("/sessions", b'{"session_id": "s-1"}'))[0] == 201
        status, _, body = _raw(local_server.url, "GET", f"/sessions/s-1/events?after=0&wait={wait}")
    assert status == 400 and json.loads(body)["field"] == "wait", body
