"""The README's tour runs as written."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"


def test_the_tour_and_the_yielding_tools_run(capsys: object) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    tour, yielding = blocks[0], next(block for block in blocks if "yield_schema=" in block)
    assert "app.run(" in tour and "triage" in tour
    namespace: dict[str, object] = {}
    exec(compile(tour, "README.md (tour)", "exec", dont_inherit=True), namespace)
    exec(compile(yielding, "README.md (yielding tools)", "exec", dont_inherit=True), namespace)
    session = namespace["session"]
    assert session.status == "completed" and session.version == 3  # type: ignore[attr-defined]


def test_the_first_lines_are_the_commands_demo_serve_test() -> None:
    lines = README.read_text().splitlines()
    assert lines[2] == "```sh" and lines[3].startswith("make demo") and lines[4].startswith("make serve")
    assert lines[5].startswith("make test") and lines[6] == "```"
    after = " ".join(lines[7:14])  # what comes right after: make serve is the next step, and what it serves
    assert "make serve" in after and "dormant serve" in after and "lambda extra" in after


def test_the_local_api_curl_examples_run_as_written_against_dormant_serve_twice_in_a_row(tmp_path: Path) -> None:
    pytest.importorskip("aws_lambda_powertools", reason="dormant serve needs the lambda extra")
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    from tests.support.servers.serve import dormant_serve

    [block] = [b for b in re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S) if "curl -s localhost" in b]
    # Each curl also writes its status code to stderr; the README's address becomes the server's free port.
    trace = "curl() { command curl -w '%{stderr}%{http_code}\\n' \"$@\"; }\nset -e\n"
    ids, runs = [], []
    with dormant_serve("--store", f"sqlite:///{tmp_path / 'readme.db'}", cwd=tmp_path) as server:
        script = trace + block.replace("localhost:8000", server.url.removeprefix("http://"))
        for _ in range(3):  # as a reader pastes it again: the same block, on the same server
            done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
            runs.append(done)
    ids = [_check_one_run(done.stdout, done.stderr) for done in runs[:2]]
    assert ids[0] != ids[1]
    assert "Traceback" not in server.output()
    # The third finds both Tuesday-afternoon slots booked, as the README says: the agent says so, no call
    # waits, and the answer is UnknownCallId, a 409 naming the call id, as POST /commit answers the same
    # mistake (not a traceback from the one-liner).
    third = runs[2]
    assert "Traceback" not in third.stderr
    assert third.stderr.split() == ["201", "200", "200", "200", "409", "200", "200", "200", "400"]
    assert (
        '"status":"completed"' in third.stdout and "There is no open physio slot on Tuesday afternoon" in third.stdout
    )
    assert '"field":"answers.0.call_id"' in third.stdout


def _check_one_run(stdout: str, stderr: str) -> str:
    """What one run of the curl block printed is what the README says it prints; the session's id."""
    assert stderr.split() == ["201", "200", "200", "200", "200", "200", "200", "200", "400"]
    session_id, _, text = stdout.partition("\n")  # echo "$S" prints the new id first
    assert re.fullmatch(r"[A-Za-z0-9_-]+", session_id), stdout
    bodies, text, decoder = [], text.strip(), json.JSONDecoder()
    while text:  # the bodies, one after another (no newline between them)
        body, end = decoder.raw_decode(text)
        bodies.append(body)
        text = text[end:].lstrip()
    assert len(bodies) == 7  # the create's body and the call id went into variables, not to the output
    assert bodies[0]["status"] == "yielded_tool" and bodies[1]["status"] == "awaiting_input"
    assert bodies[1]["id"] == session_id
    # the answer held (Prefer: wait) until the resumed turn ended, and gives it
    assert bodies[2]["status"] == "completed" and bodies[2]["version"] == bodies[3]["version"]
    assert bodies[3]["status"] == "completed" and bodies[3]["state"]["session"]["confirmation"]["reference"]
    assert len(bodies[4]["events"]) == 5
    assert bodies[5] == {"sessions": [], "cursor": None}
    assert bodies[6]["field"] == "mesage"
    return session_id
