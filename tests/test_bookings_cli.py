"""The Bookings sample, run the way a user runs it: every command a separate process on one SQLite file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bookings import Confirmation, build
from dormant.events import StateChangeEvent, ToolInputEvent
from dormant.stores.sqlite import sqlite_store

REQUEST = "I need physio on Tuesday afternoon, for Alex Doe"


def bookings(db: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BOOKINGS_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "bookings", "--db", str(db), *args],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
        timeout=60,
    )


def session_id(output: str) -> str:
    found = re.search(r"session: (\S+)", output)
    assert found, output
    return found.group(1)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "data" / "bookings.db"


def test_ask_pending_approve(db: Path) -> None:
    asked = bookings(db, "ask", REQUEST)
    assert asked.returncode == 0, asked.stderr
    assert "scripted model" in asked.stdout
    assert "waiting for approval: physio with Sam Patel on Tuesday at 14:30 for Alex Doe" in asked.stdout
    sid = session_id(asked.stdout)

    pending = bookings(db, "pending")
    assert pending.returncode == 0 and f"{sid}  since" in pending.stdout and "1 booking(s)" in pending.stdout

    approved = bookings(db, "approve", sid, "--note", "fine by reception")
    assert approved.returncode == 0, approved.stderr
    reference = f"BK-{sid[-6:].upper()}"
    assert f"confirmation {reference}: physio with Sam Patel, Tuesday at 14:30, for Alex Doe" in approved.stdout
    assert bookings(db, "pending").stdout.strip() == "No booking is waiting for approval."

    # Read back from the file, as a new process would.
    app = build(db).app
    session = app.sessions.get(sid)
    assert session is not None and session.status == "completed" and session.version == 2
    assert session.state.confirmation == Confirmation(
        reference=reference,
        slot_id="physio-tue-1430",
        service="physio",
        day="Tuesday",
        time="14:30",
        clinician="Sam Patel",
        patient="Alex Doe",
    )
    answer = next(e for e in session.events if isinstance(e, ToolInputEvent))
    assert answer.input == {"approved": True, "note": "fine by reception"}
    kinds = [e.type for e in session.events]
    assert kinds.index("invocation_yield") < kinds.index("tool_input") < kinds.index("invocation_resume")
    assert kinds[-1] == "invocation_end"
    writes = {(e.scope, e.changes[0].key) for e in session.events if isinstance(e, StateChangeEvent)}
    assert writes == {
        ("user", "name"),
        ("user", "preferences"),
        ("session", "approved_slot"),
        ("session", "confirmation"),
    }
    store = sqlite_store(db)
    assert store.load_scoped_state("bookings", "user", "alex-doe") == {
        "name": "Alex Doe",
        "preferences": {"service": "physio", "day": "Tuesday", "part_of_day": "afternoon"},
    }
    store.close()
    app.close()

    shown = bookings(db, "show", sid)
    assert shown.returncode == 0
    assert 'user[alex-doe].name: - -> "Alex Doe"  (mutation)' in shown.stdout
    assert "human   answers request_approval" in shown.stdout and "--- ends: completed" in shown.stdout


def test_ask_deny(db: Path) -> None:
    sid = session_id(bookings(db, "ask", "Dentist on Friday morning for Jo Bloggs please").stdout)
    denied = bookings(db, "deny", sid, "the clinic is closed that day")
    assert denied.returncode == 0, denied.stderr
    assert "agent: The booking was not approved: the clinic is closed that day." in denied.stdout
    assert "confirmation" not in denied.stdout
    app = build(db).app
    session = app.sessions.get(sid)
    assert session is not None
    assert session.state.confirmation is None and session.state.refusal == "the clinic is closed that day"
    assert not any(e.type == "tool_call" and e.name == "book_slot" for e in session.events)  # type: ignore[union-attr]
    app.close()


def test_clear_messages_and_exit_codes(db: Path) -> None:
    unknown = bookings(db, "approve", "s_nope")
    assert (unknown.returncode, unknown.stdout) == (3, "")
    assert "no session 's_nope'" in unknown.stderr
    assert bookings(db, "show", "s_nope").returncode == 3
    bad_id = bookings(db, "approve", "not a valid id!")
    assert bad_id.returncode == 2 and "session id" in bad_id.stderr

    sid = session_id(bookings(db, "ask", REQUEST).stdout)
    assert bookings(db, "approve", sid).returncode == 0
    again = bookings(db, "approve", sid)
    assert again.returncode == 4 and "is not waiting for an approval (status: completed)" in again.stderr
    assert bookings(db, "deny", sid, "late").returncode == 4

    vague = bookings(db, "ask", "I need an appointment")
    assert vague.returncode == 0 and "I can book that once I know the service" in vague.stdout
    assert "No booking is waiting" in bookings(db, "pending").stdout

    misconfigured = bookings(db, "pending", env={"BOOKINGS_MODEL": "gemini"})
    assert misconfigured.returncode == 2 and "BOOKINGS_MODEL" in misconfigured.stderr
    assert bookings(db).returncode == 2  # no command: argparse usage


def test_a_second_request_for_the_same_patient_reads_what_the_first_stored(db: Path) -> None:
    bookings(db, "ask", REQUEST)
    second = bookings(db, "ask", "Massage on Monday evening", "--patient", "alex-doe")
    assert second.returncode == 0, second.stderr
    assert "massage with Ines Duarte on Monday at 18:00 for Alex Doe" in second.stdout
    app = build(db).app
    session = app.sessions.get(session_id(second.stdout))
    assert session is not None
    observed = [
        (e.changes[0].key, e.changes[0].new_value)
        for e in session.events
        if isinstance(e, StateChangeEvent) and e.source == "observation"
    ]
    assert ("name", "Alex Doe") in observed
    app.close()


def test_the_db_path_comes_from_the_environment_too(tmp_path: Path) -> None:
    db = tmp_path / "elsewhere" / "b.db"
    done = subprocess.run(
        [sys.executable, "-m", "bookings", "ask", REQUEST],
        capture_output=True,
        text=True,
        env={**os.environ, "BOOKINGS_DB": str(db)},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0 and db.exists()
    assert not (tmp_path / "data").exists()


def test_demo_runs_the_whole_arc(tmp_path: Path) -> None:
    done = bookings(tmp_path / "demo.db", "demo")
    assert done.returncode == 0, done.stderr
    out: Any = done.stdout
    for command in ("$ bookings ask", "$ bookings pending", "$ bookings approve", "$ bookings show"):
        assert command in out
    assert "confirmation BK-" in out and "--- ends: completed" in out
