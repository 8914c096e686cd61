"""``bookings``: a sleeping agent you can run from the command line.

Every command is its own process: ``ask`` runs until the agent asks a human to approve, commits the
session to the SQLite file and exits; ``approve``/``deny`` (minutes or days later) load it, answer the
waiting call and let the agent finish. Every run goes through ``dormant.serving.advance``, which claims
the session before any tool acts: of two people answering one approval at once, one wins and the other
is told so, having changed nothing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dormant.errors import ClaimLost, DormantError, StoreBusy
from dormant.serving import advance
from dormant.session import Session
from dormant.stores.base import SessionListing

from .app import MEMORY, Bookings, build, database, patient_id
from .output import (
    APPROVAL,
    BUSY,
    CLAIM_LOST,
    OK,
    RUN_FAILED,
    STUCK,
    UNKNOWN_SESSION,
    USAGE,
    Outcome,
    Waiting,
    emit,
    not_waiting,
    print_pending,
    report,
    say,
    silence,
    warn,
)
from .scripted import parse_request
from .timeline import timeline

__all__ = ["main"]

EXIT_CODES = """exit codes:
  0  done (for ask: the request waits for approval, or the agent answered)
  1  the agent's run failed (the error is on the ledger; `bookings resume <id>` runs it again)
  2  bad usage or configuration (also: no database at --db, for every command but ask and demo)
  3  no session with that id
  4  the session is not waiting for that command (the message says what it waits for)
  5  someone else acted on the session first: nothing was recorded or run (see `bookings show <id>`)
  6  the database is busy (another process holds its lock): retry
  7  the approved slot was booked for another patient first: nothing was booked (ask again)

The database: --db FILE (before or after the command), else $BOOKINGS_DB, else ./data/bookings.db.
--api URL drives the sessions through the HTTP API instead (`dormant serve`; every command but demo),
as the server's caller: exit 2 also when it cannot be reached, 6 on a 503."""


@dataclass(frozen=True)
class _Context:
    bookings: Bookings
    path: str
    command: str


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BrokenPipeError:
                silence(stream)


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    given = getattr(args, "db", None)
    try:
        path = database(given)
        text = _text(args.text) if hasattr(args, "text") else None
    except ValueError as exc:
        warn(str(exc))
        return USAGE
    api = getattr(args, "api", None)
    if api is not None:
        if given is not None:
            warn("--db and --api name two places for the sessions: give one")
            return USAGE
        from .remote import run_remote

        return run_remote(api, args, text)
    if args.command == "demo":
        return _demo(given)
    command = "bookings" if given is None else f"bookings --db {shlex.quote(path)}"
    try:
        bookings = build(path, create=args.command == "ask")  # only ask may start a database
    except (ValueError, OSError, DormantError) as exc:
        return _failed(exc)
    with bookings.app:
        try:
            return _COMMANDS[args.command](_Context(bookings, path, command), args, text)
        except (ValueError, DormantError) as exc:
            return _failed(exc)


def _failed(exc: Exception) -> int:
    if isinstance(exc, ClaimLost):
        warn(
            f"someone else acted on session {exc.session_id} first ({exc.reason}); nothing was recorded or run. "
            f"See: bookings show {exc.session_id}"
        )
        return CLAIM_LOST
    if isinstance(exc, StoreBusy):
        warn(f"the database is busy (another process holds its lock): retry. ({exc})")
        return BUSY
    warn(str(exc))
    return USAGE


def _parser() -> argparse.ArgumentParser:
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", default=argparse.SUPPRESS, help="the SQLite file (see below)")
    db.add_argument(
        "--api", default=argparse.SUPPRESS, metavar="URL", help="use the HTTP API at URL (dormant serve), not a file"
    )
    parser = argparse.ArgumentParser(
        prog="bookings",
        description="Book clinic appointments with an agent that sleeps while a human approves.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[db],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, parents=[db])

    ask = command("ask", "ask for an appointment; the run stops at the approval")
    ask.add_argument(
        "text", metavar="request", help='"I need physio on Tuesday afternoon, for Alex Doe" (- reads stdin)'
    )
    ask.add_argument("--patient", help="the patient's name, when the request does not say it")
    command("pending", "list the bookings waiting for a human: approvals, and runs to resume")
    approve = command("approve", "approve a waiting booking and let the agent finish")
    approve.add_argument("session_id")
    approve.add_argument("--note", help="a note for the agent")
    deny = command("deny", "refuse a waiting booking")
    deny.add_argument("session_id")
    deny.add_argument("reason")
    reply = command("reply", "answer the agent's question (a new turn in the same session)")
    reply.add_argument("session_id")
    reply.add_argument("text", metavar="message", help="- reads stdin")
    resume = command("resume", "run a session again whose run failed, or whose answers are all in")
    resume.add_argument("session_id")
    resume.add_argument(
        "--takeover",
        action="store_true",
        help="also take over a session whose run is in progress: only when you know its process died "
        "(its unfinished tool calls run again)",
    )
    show = command("show", "the session's ledger as a timeline")
    show.add_argument("session_id")
    command("demo", "run ask, pending, approve and show, each as its own process, on a temporary database")
    return parser


def _text(value: str) -> str:
    text = sys.stdin.read() if value == "-" else value
    if not text.strip():
        raise ValueError("the text is empty" + (" (nothing on stdin)" if value == "-" else ""))
    return text.strip()


# -- commands --------------------------------------------------------------------------------------------


def _ask(ctx: _Context, args: argparse.Namespace, text: str | None) -> int:
    assert text is not None
    bookings = ctx.bookings
    name = args.patient if args.patient is not None else parse_request(text)["name"]
    app = bookings.app
    session = app.sessions.ephemeral(scopes={"user": patient_id(name)} if name is not None else None)
    if bookings.model_label.startswith("scripted"):
        say("(scripted model: no key, no network. Set BOOKINGS_MODEL=openai:<model> or bedrock:<id> for a real one.)")
    seed = {"initial_state": {"user": {"name": name}}} if args.patient is not None else {}
    return report(ctx, Outcome.of(advance(app, bookings.agent, session, {"message": text, **seed})))


def _pending(ctx: _Context, args: argparse.Namespace, text: str | None) -> int:
    waiting = [
        Waiting(s.id, s.events[-1].created_at, [str(c.args.get("summary", c.name)) for c in s.yielded_tools])
        for s in _sessions(ctx, {"awaiting_input"})
        if any(c.name == APPROVAL for c in s.yielded_tools)
    ]
    stuck = [Waiting(s.id, s.events[-1].created_at, [], s.status, s.events) for s in _sessions(ctx, STUCK)]
    return print_pending(ctx, waiting, stuck)


def _answer(ctx: _Context, args: argparse.Namespace, approved: bool, note: str | None) -> int:
    session = _load(ctx, args.session_id)
    if session is None:
        return UNKNOWN_SESSION
    calls = [call for call in session.yielded_tools if call.name == APPROVAL]
    if not calls:
        return not_waiting(ctx, session.id, session.status, "an approval")
    answers = [{"call_id": call.call_id, "input": {"approved": approved, "note": note}} for call in calls]
    return report(ctx, Outcome.of(advance(ctx.bookings.app, ctx.bookings.agent, session, {"answers": answers})))


def _reply(ctx: _Context, args: argparse.Namespace, text: str | None) -> int:
    session = _load(ctx, args.session_id)
    if session is None:
        return UNKNOWN_SESSION
    if session.status not in ("completed", "max_steps", "idle"):
        return not_waiting(ctx, session.id, session.status, "a reply")
    return report(ctx, Outcome.of(advance(ctx.bookings.app, ctx.bookings.agent, session, text)))


def _resume(ctx: _Context, args: argparse.Namespace, text: str | None) -> int:
    session = _load(ctx, args.session_id)
    if session is None:
        return UNKNOWN_SESSION
    takeover = args.takeover and session.status == "running"
    if session.status not in ("error", "resumable", "max_steps") and not takeover:
        return not_waiting(ctx, session.id, session.status, "a resume")
    return report(ctx, Outcome.of(advance(ctx.bookings.app, ctx.bookings.agent, session, takeover=takeover)))


def _show(ctx: _Context, args: argparse.Namespace, text: str | None) -> int:
    session = _load(ctx, args.session_id)
    if session is None:
        return UNKNOWN_SESSION
    for line in timeline(session):
        say(line)
    return OK


_COMMANDS: dict[str, Callable[[_Context, argparse.Namespace, str | None], int]] = {
    "ask": _ask,
    "pending": _pending,
    "approve": lambda ctx, args, _: _answer(ctx, args, True, args.note),
    "deny": lambda ctx, args, _: _answer(ctx, args, False, args.reason),
    "reply": _reply,
    "resume": _resume,
    "show": _show,
}


def _load(ctx: _Context, session_id: str) -> Session | None:
    session = ctx.bookings.app.sessions.get(session_id)
    if session is None:
        warn(f"no session {session_id!r} in {ctx.path}")
    return session


def _sessions(ctx: _Context, statuses: set[str]) -> Iterator[Session]:
    for listing in _listings(ctx.bookings):
        if listing.status in statuses:
            session = ctx.bookings.app.sessions.get(listing.id)
            if session is not None and session.status in statuses:  # it may have moved since it was listed
                yield session


def _listings(bookings: Bookings) -> Iterator[SessionListing]:
    cursor = None
    while True:
        page = bookings.app.sessions.list(limit=100, cursor=cursor)
        yield from page
        if len(page) < 100:
            return
        cursor = page[-1].cursor


def _demo(db: str | None) -> int:
    """The whole arc, each step a separate process, as a user would type it."""
    with tempfile.TemporaryDirectory(prefix="bookings-demo-") as scratch:
        try:
            path = database(db) if db is not None else str(Path(scratch) / "bookings.db")
        except ValueError as exc:
            warn(str(exc))
            return USAGE
        if path == MEMORY:
            warn(f"the demo runs each step as its own process: --db {MEMORY} would forget between them")
            return USAGE

        def step(*command: str) -> str:
            say("")
            say(f"$ bookings {shlex.join(command)}")
            done = subprocess.run(  # the database through the environment: the hints read as you would type them
                [sys.executable, "-m", "bookings", *command],
                capture_output=True,
                text=True,
                env={**os.environ, "BOOKINGS_DB": path},
                check=False,
                timeout=300,
            )
            emit(sys.stdout, done.stdout)
            emit(sys.stderr, done.stderr)
            if done.returncode != OK:
                raise SystemExit(done.returncode)
            return done.stdout

        said = step("ask", "I need physio on Tuesday afternoon, for Alex Doe")
        found = next((line.split()[-1] for line in said.splitlines() if line.strip().startswith("session:")), None)
        if found is None:
            warn("demo: ask did not report a session id")
            return RUN_FAILED
        step("pending")
        step("approve", found)
        step("show", found)
    say("")
    if db is None:
        say("(The demo used a temporary database, now deleted. To keep one: bookings --db FILE demo)")
    else:
        say(f"(The demo's sessions are in {path}.)")
    return OK


if __name__ == "__main__":
    sys.exit(main())
