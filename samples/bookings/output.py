"""What the ``bookings`` commands print, and their exit codes: shared by the local CLI (``cli``) and the
one that drives sessions through the HTTP API (``remote``), so both say the same things."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TextIO

from dormant.events import Event, InvocationEndEvent
from dormant.serving import AdvanceOutcome

from .app import MEMORY, Confirmation
from .timeline import printable

OK, RUN_FAILED, USAGE, UNKNOWN_SESSION, NOT_WAITING, CLAIM_LOST, BUSY, SLOT_TAKEN = range(8)

APPROVAL = "request_approval"


class Where(Protocol):
    """Where the sessions are, for what is printed: a database here, or an API (``bookings --api``)."""

    @property
    def path(self) -> str: ...

    @property
    def command(self) -> str:
        """How to run this command again on the same sessions, for the hints printed."""
        ...


@dataclass(frozen=True)
class Outcome:
    """What a run did, as the CLI reports it: from ``advance`` here, or from the API's answers."""

    session_id: str
    status: str
    text: str | None = None
    waiting: list[str] = field(default_factory=list)
    """What each waiting approval asks."""
    confirmation: Confirmation | None = None
    slot_taken: str | None = None
    refusal: str | None = None
    error: str | None = None
    commit_status: str = "committed"
    fork_id: str | None = None

    @classmethod
    def of(cls, outcome: AdvanceOutcome) -> Outcome:
        state = outcome.session.state
        return cls(
            session_id=outcome.session.id,
            status=outcome.status,
            text=outcome.output.text,
            waiting=[str(call.args.get("summary", call.name)) for call in outcome.yielded_tools],
            confirmation=state.confirmation,
            slot_taken=state.slot_taken,
            refusal=state.refusal,
            error=outcome.error,
            commit_status=outcome.commit_status,
            fork_id=outcome.fork_id,
        )


STUCK = {"resumable", "error"}


@dataclass(frozen=True)
class Waiting:
    """A session ``pending`` lists: an approval waiting (``asks``), or a run to resume (``status``)."""

    session_id: str
    since_ms: int
    asks: list[str]
    status: str = "awaiting_input"
    events: Sequence[Event] = ()


def print_pending(ctx: Where, waiting: list[Waiting], stuck: list[Waiting]) -> int:
    if not waiting and not stuck:
        say("No booking is waiting for a human.")
        return OK
    if waiting:
        say(f"{len(waiting)} booking(s) waiting for approval ({ctx.command} approve <id>, or deny <id> <reason>):")
        for item in waiting:
            for summary in item.asks:
                say(f"  {item.session_id}  since {_since(item.since_ms)}  {summary}")
    if stuck:
        say(f"{len(stuck)} to run again ({ctx.command} resume <id>):")
        for item in stuck:
            why = "every answer is in" if item.status == "resumable" else f"the run failed: {_last_error(item.events)}"
            say(f"  {item.session_id}  since {_since(item.since_ms)}  {why}")
    return OK


def report(ctx: Where, outcome: Outcome) -> int:
    """Print what a run did, with the commands that follow it; the exit code."""
    sid = outcome.session_id
    if outcome.commit_status == "orphaned":
        warn(f"session {sid} moved on while this ran; the run is kept in session {outcome.fork_id}")
        return CLAIM_LOST
    if outcome.text:
        say(f"agent: {outcome.text}")
    if outcome.status == "yielded_tool":
        for summary in outcome.waiting:
            say(f"waiting for approval: {summary}")
        say(f"  session: {sid}")
        _hint(ctx, f'approve: {ctx.command} approve {sid}    deny: {ctx.command} deny {sid} "reason"')
        return OK
    confirmation = outcome.confirmation
    if confirmation is not None:
        say(
            f"confirmation {confirmation.reference}: {confirmation.service} with {confirmation.clinician}, "
            f"{confirmation.day} at {confirmation.time}, for {confirmation.patient}"
        )
    say(f"  session: {sid}")
    if outcome.status != "completed":
        warn(f"the run ended with {outcome.status}: {outcome.error}")
        _hint(ctx, f"run it again: {ctx.command} resume {sid}")
        return RUN_FAILED
    if confirmation is None and outcome.slot_taken is not None:
        warn(
            f"slot {outcome.slot_taken} was booked for another patient before this approval: "
            "nothing was booked; ask again for another slot"
        )
        return SLOT_TAKEN
    if confirmation is None and outcome.refusal is None:
        _hint(ctx, f'reply: {ctx.command} reply {sid} "..."')
    return OK


def _hint(ctx: Where, line: str) -> None:
    if ctx.path == MEMORY:
        say(f"  (--db {MEMORY}: nothing is kept after this command, so there is nothing to follow up)")
    else:
        say(f"  {line}")


def not_waiting(ctx: Where, session_id: str, status: str, what: str) -> int:
    """Say that the session waits for something else (and for what); the exit code."""
    if status == "running":
        warn(
            f"someone else is acting on session {session_id} right now; nothing was recorded or run. "
            f"If that process died: {ctx.command} resume --takeover {session_id}"
        )
        return CLAIM_LOST
    waits = {
        "awaiting_input": f"it waits for an approval: {ctx.command} approve|deny {session_id}",
        "resumable": f"it waits to run again: {ctx.command} resume {session_id}",
        "error": f"its run failed: {ctx.command} resume {session_id}",
    }.get(status, f"see {ctx.command} show {session_id}")
    warn(f"session {session_id} is not waiting for {what} (status: {status}); {waits}")
    return NOT_WAITING


def _since(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M")


def _last_error(events: Sequence[Event]) -> str:
    ends = (e for e in reversed(events) if isinstance(e, InvocationEndEvent))
    return next((e.error for e in ends if e.error), None) or "no error recorded"


def say(line: str) -> None:
    emit(sys.stdout, printable(line) + "\n")


def warn(line: str) -> None:
    emit(sys.stderr, f"bookings: {printable(line)}\n")


def emit(stream: TextIO, text: str) -> None:
    """Write, and go quiet when the reader has gone (``bookings pending | head -1``): the command still finishes."""
    try:
        stream.write(text)
    except BrokenPipeError:
        silence(stream)


def silence(stream: TextIO) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)
