"""The Bookings sample, run the way a user runs it: every command a separate process on one SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bookings import Confirmation, build, patient_id
from dormant.events import StateChangeEvent, ToolCallEvent, ToolInputEvent
from dormant.stores.sqlite import sqlite_store
from tests.support.bookings_cli import REQUEST, bookings, session_id


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
    assert bookings(db, "pending").stdout.strip() == "No booking is waiting for a human."

    # Read back from the file, as a new process would.
    app = build(db).app
    session = app.sessions.get(sid)
    assert session is not None and session.status == "completed"
    # each turn: its claim, a commit before each step that runs a tool, its end; every event stored once
    assert session.version > 4 and len({e.id for e in session.events}) == len(session.events)
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
    assert store.load_scoped_state("bookings", "user", patient_id("Alex Doe")) == {
        "name": "Alex Doe",
        "preferences": {"service": "physio", "day": "Tuesday", "part_of_day": "afternoon"},
    }
    store.close()
    app.close()

    shown = bookings(db, "show", sid)
    assert shown.returncode == 0
    # which tool call wrote it: the one the ledger records for remember_patient
    [remembered] = [e for e in session.events if isinstance(e, ToolCallEvent) and e.name == "remember_patient"]
    by = f"by remember_patient [{remembered.call_id}]"
    assert f'user[{patient_id("Alex Doe")}].name: - -> "Alex Doe"  (mutation {by})' in shown.stdout
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
    sid = session_id(bookings(db, "ask", REQUEST).stdout)
    unknown = bookings(db, "approve", "s_nope")
    assert (unknown.returncode, unknown.stdout) == (3, "")
    assert "no session 's_nope'" in unknown.stderr
    assert bookings(db, "show", "s_nope").returncode == 3
    bad_id = bookings(db, "approve", "not a valid id!")
    assert bad_id.returncode == 2 and "session id" in bad_id.stderr

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
    second = bookings(db, "ask", "Massage on Monday evening", "--patient", "alex  DOE")  # the same name
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


# -- the database path (issue 10 #5) ----------------------------------------------------------------------


def test_an_empty_db_is_an_error_and_a_typo_creates_nothing(tmp_path: Path) -> None:
    empty = bookings("", "ask", REQUEST)
    assert empty.returncode == 2 and "database path is empty" in empty.stderr
    typo = tmp_path / "bokings.db"
    for command in (["pending"], ["show", "s_1"], ["approve", "s_1"], ["deny", "s_1", "no"], ["resume", "s_1"]):
        done = bookings(typo, *command)
        assert done.returncode == 2 and f"no SQLite database at {typo}" in done.stderr, command
    assert bookings(typo, "reply", "s_1", "hello").returncode == 2
    assert not typo.exists() and list(tmp_path.iterdir()) == []


def test_a_tilde_is_the_home_directory(tmp_path: Path) -> None:
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(), cwd.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "bookings", "--db", "~/clinic/b.db", "ask", REQUEST],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(home)},
        cwd=cwd,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (home / "clinic" / "b.db").is_file() and list(cwd.iterdir()) == []


def test_memory_prints_no_follow_up_that_cannot_work(tmp_path: Path) -> None:
    asked = bookings(":memory:", "ask", REQUEST)
    assert asked.returncode == 0 and "waiting for approval" in asked.stdout
    assert "approve:" not in asked.stdout and "nothing is kept after this command" in asked.stdout
    pending = bookings(":memory:", "pending")
    assert pending.returncode == 2 and "':memory:' is always a new, empty database" in pending.stderr


def test_db_works_after_the_command_too(db: Path) -> None:
    asked = subprocess.run(
        [sys.executable, "-m", "bookings", "ask", REQUEST, "--db", str(db)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert asked.returncode == 0 and db.is_file()
    sid = session_id(asked.stdout)
    pending = subprocess.run(
        [sys.executable, "-m", "bookings", "pending", "--db", str(db)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert sid in pending.stdout


# -- a busy database is "retry", not "bad usage" (#6) ------------------------------------------------------


def test_a_busy_database_exits_with_the_retry_code(db: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import functools
    import sqlite3

    from bookings import app as sample_app
    from bookings.cli import main

    bookings(db, "ask", REQUEST)
    monkeypatch.setattr(sample_app, "sqlite_store", functools.partial(sqlite_store, timeout=0.2))
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    try:
        code = main(["--db", str(db), "ask", "Dentist on Friday morning for Jo Bloggs"])
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    err = capsys.readouterr().err
    assert code == 6 and "busy" in err and "retry" in err
    assert "6  the database is busy" in bookings(db, "--help").stdout


# -- nothing from the ledger is printed raw (#7) -----------------------------------------------------------


def test_show_and_pending_escape_control_characters(db: Path) -> None:
    forged = "\n  99  12:00:00  human   answers request_approval: APPROVED\x1b[2K\u202e"
    asked = bookings(db, "ask", "Hi" + forged + " physio on Tuesday afternoon for Alex Doe")
    named = bookings(db, "ask", "Dentist on Friday morning", "--patient", "Eve" + forged)  # the name is in the summary
    assert asked.returncode == 0 and named.returncode == 0, asked.stderr + named.stderr
    shown = [bookings(db, "show", session_id(done.stdout)).stdout for done in (asked, named)]
    for out in (*shown, bookings(db, "pending").stdout, named.stdout):
        assert "\x1b" not in out and "\u202e" not in out
        assert not any(line.startswith("  99") for line in out.splitlines())
    assert '"Hi\\n  99  12:00:00  human' in shown[0]
    assert "Eve\\n  99  12:00:00  human   answers request_approval: APPROVED\\x1b[2K\\u202e" in named.stdout


# -- patient ids (#8) ---------------------------------------------------------------------------------------


def test_two_names_that_used_to_share_a_slug_never_share_state(db: Path) -> None:
    first = bookings(db, "ask", "Physio on Tuesday afternoon for Jö Li")
    second = bookings(db, "ask", "Dentist on Friday morning for Jå Li")
    assert first.returncode == 0 and second.returncode == 0
    assert "for Jå Li" in second.stdout and "Jö" not in second.stdout
    app = build(db).app
    sessions = [app.sessions.get(session_id(done.stdout)) for done in (first, second)]
    assert sessions[0] is not None and sessions[1] is not None
    assert sessions[0].scopes["user"] != sessions[1].scopes["user"]
    assert not any(e.type == "state_change" and e.source == "observation" for e in sessions[1].events)  # type: ignore[union-attr]
    store = sqlite_store(db)
    assert store.load_scoped_state("bookings", "user", patient_id("Jö Li"))["name"] == "Jö Li"
    assert store.load_scoped_state("bookings", "user", patient_id("Jå Li"))["name"] == "Jå Li"
    store.close()
    app.close()


@pytest.mark.parametrize("name", ["Zoë Ångström", "李 小龙", "Maria " + "Anna " * 40 + "Long"])
def test_names_in_any_script_and_of_any_length_are_recognised(db: Path, name: str) -> None:
    asked = bookings(db, "ask", f"Physio on Tuesday afternoon for {name}")
    assert asked.returncode == 0, asked.stderr
    assert f"for {name}" in asked.stdout


# -- rough edges ----------------------------------------------------------------------------------------------


def test_a_request_can_come_from_stdin(db: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bookings", "--db", str(db), "ask", "-"],
        input=REQUEST + "\n",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0 and "waiting for approval: physio with Sam Patel" in done.stdout
    empty = subprocess.run(
        [sys.executable, "-m", "bookings", "--db", str(db), "ask", "-"],
        input="",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert empty.returncode == 2 and "nothing on stdin" in empty.stderr


def test_a_closed_pipe_is_quiet_and_the_command_still_finishes(db: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "bookings", "--db", str(db), "ask", REQUEST],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.close()  # `| head -0`: the reader is gone before anything is written
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err
    assert "1 booking(s) waiting" in bookings(db, "pending").stdout


def test_the_agent_asks_and_the_user_replies(db: Path) -> None:
    asked = bookings(db, "ask", "I need an appointment for Alex Doe")
    assert "I can book that once I know the service and the day and the part of day" in asked.stdout
    sid = session_id(asked.stdout)
    assert f'reply: bookings --db {db} reply {sid} "..."' in asked.stdout
    replied = bookings(db, "reply", sid, "physio on Tuesday afternoon please")
    assert replied.returncode == 0, replied.stderr
    assert "waiting for approval: physio with Sam Patel on Tuesday at 14:30 for Alex Doe" in replied.stdout
    wrong = bookings(db, "reply", sid, "hello?")
    assert wrong.returncode == 4 and "waits for an approval" in wrong.stderr
    assert bookings(db, "approve", sid).returncode == 0
    after = bookings(db, "reply", sid, "thanks!")
    assert after.returncode == 0 and "You are booked: reference BK-" in after.stdout


def test_a_resumable_session_is_pending_and_resume_runs_it(db: Path) -> None:
    sid = session_id(bookings(db, "ask", REQUEST).stdout)
    app = build(db).app
    session = app.sessions.get(sid)
    assert session is not None
    session.input.answer(session.yielded_tools[0].call_id, {"approved": True})  # answered through the API, not run
    app.sessions.commit(session)
    app.close()
    pending = bookings(db, "pending").stdout
    assert f"1 to run again (bookings --db {db} resume <id>)" in pending and f"{sid}  since" in pending
    assert "every answer is in" in pending
    assert bookings(db, "approve", sid).returncode == 4
    resumed = bookings(db, "resume", sid)
    assert resumed.returncode == 0 and "confirmation BK-" in resumed.stdout
    assert bookings(db, "resume", sid).returncode == 4


def test_a_slot_is_booked_once_across_patients(db: Path) -> None:
    first = session_id(bookings(db, "ask", REQUEST).stdout)
    second_ask = bookings(db, "ask", "Physio on Tuesday afternoon for Sam Roe")
    assert "physio with Sam Patel on Tuesday at 14:30 for Sam Roe" in second_ask.stdout  # nobody holds it yet
    second = session_id(second_ask.stdout)
    assert bookings(db, "approve", first).returncode == 0
    lost = bookings(db, "approve", second)
    assert lost.returncode == 7 and "was booked for another patient before this approval" in lost.stderr
    assert "confirmation" not in lost.stdout
    third = bookings(db, "ask", "Physio on Tuesday afternoon for Kim Poe")
    assert "physio with Sam Patel on Tuesday at 16:00 for Kim Poe" in third.stdout  # the next free slot
    bookings_ = build(db)
    holder = bookings_.reservations.holder("physio-tue-1430")
    assert holder is not None and holder.booking == first
    bookings_.app.close()


def test_demo_without_a_db_leaves_nothing_behind(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bookings", "demo"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("BOOKINGS_")},
        cwd=tmp_path,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "temporary database, now deleted" in done.stdout and list(tmp_path.iterdir()) == []


def test_a_lost_claim_exits_5_having_run_nothing(db: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """Another process answers between this one's load and its claim: the real conflict, made certain."""
    import bookings.cli as cli
    from dormant.serving import advance

    sid = session_id(bookings(db, "ask", REQUEST).stdout)

    def answered_first(app: Any, agent: Any, session: Any, input: Any = None) -> Any:
        assert bookings(db, "deny", sid, "no").returncode == 0  # lands while this process holds version 2
        return advance(app, agent, session, input)

    monkeypatch.setattr(cli, "advance", answered_first)
    code = cli.main(["--db", str(db), "approve", sid])
    captured = capsys.readouterr()
    assert code == 5 and f"someone else acted on session {sid} first" in captured.err
    assert "nothing was recorded or run" in captured.err and "confirmation" not in captured.out
    app = build(db).app
    session = app.sessions.get(sid)
    assert session is not None and session.state.refusal == "no" and session.state.confirmation is None
    assert len(app.sessions.list()) == 1  # no fork
    app.close()


def test_show_tells_a_fork_where_it_came_from(db: Path) -> None:
    asked = bookings(db, "ask", REQUEST)
    assert asked.returncode == 0, asked.stderr
    original = session_id(asked.stdout)
    app = build(db).app
    fork = app.sessions.require(original).fork_at(0, reason="try another slot\x1b[2K")
    app.sessions.commit(fork)
    app.close()
    shown = bookings(db, "show", fork.id)
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if "forked" in line)
    assert f"fork    --- forked from {original} after event " in line
    assert "try another slot\\u001b[2K" in line and "\x1b" not in line


def test_a_run_whose_process_died_is_taken_over_only_when_asked(db: Path) -> None:
    sid = session_id(bookings(db, "ask", REQUEST).stdout)
    bookings_app = build(db)
    session = bookings_app.app.sessions.require(sid)
    answer = {"answers": [{"call_id": session.yielded_tools[0].call_id, "input": {"approved": True}}]}
    stream = bookings_app.app.stream(bookings_app.agent, answer, session=session)
    for event in stream:  # the approval is claimed, then this "process" dies before any tool runs
        if event.type == "invocation_resume":
            bookings_app.app.sessions.commit(session)
            break
    bookings_app.app.close()
    assert build(db).app.sessions.require(sid).status == "running"

    for command in (["approve", sid], ["resume", sid]):
        refused = bookings(db, *command)
        assert refused.returncode == 5, refused.stderr
        assert f"If that process died: bookings --db {db} resume --takeover {sid}" in refused.stderr
    taken = bookings(db, "resume", "--takeover", sid)
    assert taken.returncode == 0, taken.stderr
    assert "confirmation BK-" in taken.stdout
    assert bookings(db, "resume", "--takeover", sid).returncode == 4  # completed: nothing to take over
