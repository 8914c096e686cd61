"""Races through the CLI, every writer its own process: one booking per slot, no forked run, every loser told why.

Each round starts, all at once: two ``approve`` of one session, an ``approve`` and a ``deny`` of another,
and the approvals of two patients whose proposals name the same slot.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_bookings_cli import REQUEST

from bookings import build, patient_id
from dormant.events import ToolInputEvent, ToolResultEvent
from dormant.serving import advance

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
    processes = {
        "approve-1": start(db, "approve", twice),
        "approve-2": start(db, "approve", twice),
        "approve": start(db, "approve", approve_deny),
        "deny": start(db, "deny", approve_deny, "changed my mind"),
        "patient-1": start(db, "approve", first),
        "patient-2": start(db, "approve", second),
    }
    done = {name: finish(process) for name, process in processes.items()}

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
