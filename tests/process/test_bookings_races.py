"""Races through the CLI, every writer its own process: one booking per slot, no forked run, every loser told why.

Each round races, all at once: two ``approve`` of one session, an ``approve`` and a ``deny`` of
another, and the approvals of two patients whose proposals name the same slot. While they start, the
test holds the database's write lock, so every process loads its waiting session and then queues at
its claim: most rounds end in a real lost claim (exit 5) rather than in a loser that simply came late
(exit 4). Either way the loser must be told why.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookings import build, patient_id
from dormant.events import ToolInputEvent, ToolResultEvent
from dormant.serving import advance
from tests.support.bookings_cli import REQUEST

pytestmark = pytest.mark.slow

ROUNDS = 20
LOST = ("someone else", "is not waiting for an approval (status: completed)")


def waiting(db: Path, *requests: str) -> list[str]:
    bookings = build(db)
    with bookings.app as app:
        ids = []
        for request in requests:
            name = request.rsplit(" for ", 1)[1]
            outcome = advance(app, bookings.agent, app.sessions.ephemeral(scopes={"user": patient_id(name)}), request)
            assert outcome.status == "yielded_tool"
            ids.append(outcome.session_id)
        return ids


def start(db: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOOKINGS_")}
    return subprocess.Popen(
        [sys.executable, "-m", "bookings", "--db", str(db), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=120)
    return process.returncode, out, err


@contextlib.contextmanager
def racing(db: Path, *commands: tuple[str, ...]) -> Iterator[list[subprocess.Popen[str]]]:
    """Start the commands while holding the write lock; let go once each has the database open."""
    lock = sqlite3.connect(db, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        processes = [start(db, *command) for command in commands]
        deadline = time.monotonic() + 30  # not a check: past it, the race just runs unaided
        while time.monotonic() < deadline and not all(has_open(p.pid, db) for p in processes):
            time.sleep(0.01)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    yield processes


def has_open(pid: int, db: Path) -> bool:
    with contextlib.suppress(OSError):
        fds = Path(f"/proc/{pid}/fd")
        return any(os.readlink(fd) == str(db) for fd in fds.iterdir())
    return False


def told_why(code: int, err: str) -> bool:
    return (code == 5 and LOST[0] in err) or (code == 4 and LOST[1] in err)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_raced_answers_book_each_slot_once(tmp_path: Path, round_: int) -> None:
    db = tmp_path / "race.db"
    twice, approve_deny, first, second = waiting(
        db,
        REQUEST,
        "Dentist on Friday morning for Jo Bloggs",
        "GP on Monday morning for Kim Poe",
        "GP on Monday morning for Lee Roe",
    )
    commands = {
        "approve-1": ("approve", twice),
        "approve-2": ("approve", twice),
        "approve": ("approve", approve_deny),
        "deny": ("deny", approve_deny, "changed my mind"),
        "patient-1": ("approve", first),
        "patient-2": ("approve", second),
    }
    with racing(db, *commands.values()) as processes:
        done = {name: finish(process) for name, process in zip(commands, processes, strict=True)}

    # Two approvals of one session: one books, the other is told someone else answered.
    pair = sorted([done["approve-1"], done["approve-2"]], key=lambda d: d[0])
    assert pair[0][0] == 0 and "confirmation BK-" in pair[0][1], pair
    assert told_why(pair[1][0], pair[1][2]), pair[1]

    # Approve against deny: exactly one of them lands, and the loser is told.
    winner = "approve" if done["approve"][0] == 0 else "deny"
    loser = "deny" if winner == "approve" else "approve"
    assert done[winner][0] == 0 and told_why(done[loser][0], done[loser][2]), done

    # Two patients, one slot: one confirmation, the other told the slot went first.
    codes = sorted(done[name][0] for name in ("patient-1", "patient-2"))
    assert codes == [0, 7], done
    taken = next(done[name] for name in ("patient-1", "patient-2") if done[name][0] == 7)
    assert "was booked for another patient before this approval" in taken[2]

    bookings = build(db)
    with bookings.app as app:
        listed = app.sessions.list()
        assert len(listed) == 4 and {s.status for s in listed} == {"completed"}  # no forked run
        confirmations = {}
        for sid in (twice, approve_deny, first, second):
            session = app.sessions.get(sid)
            assert session is not None
            answers = [e for e in session.events if isinstance(e, ToolInputEvent)]
            booked = [e for e in session.events if isinstance(e, ToolResultEvent) and e.name == "book_slot"]
            assert len(answers) == 1 and len(booked) <= 1
            if session.state.confirmation is not None:
                confirmations[sid] = session.state.confirmation.slot_id
        assert (approve_deny in confirmations) == (winner == "approve")
        slots = list(confirmations.values())
        assert len(slots) == len(set(slots))  # one booking per slot
        for sid, slot in confirmations.items():
            holder = bookings.reservations.holder(slot)
            assert holder is not None and holder.booking == sid
        held_gp = bookings.reservations.holder("gp-mon-0900")
        assert held_gp is not None and held_gp.booking in (first, second)
