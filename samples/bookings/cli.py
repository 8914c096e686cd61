"""``bookings``: a sleeping agent you can run from the command line.

Every command is its own process: ``ask`` runs until the agent asks a human to approve, commits the
session to the SQLite file and exits; ``approve``/``deny`` — minutes or days later — load it, answer the
waiting call, resume the run and commit again.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime

from dormant.errors import DormantError
from dormant.serving import commit
from dormant.session import Session
from dormant.stores.base import SessionListing

from .app import Bookings, build
from .scripted import parse_request
from .timeline import timeline

__all__ = ["main"]

OK, RUN_FAILED, USAGE, UNKNOWN_SESSION, NOT_WAITING, ANSWERED_ELSEWHERE = 0, 1, 2, 3, 4, 5
EXIT_CODES = """exit codes:
  0  done (for ask: the request is waiting for approval, or the agent answered)
  1  the agent's run failed (the error is printed and on the ledger)
  2  bad usage or configuration
  3  no session with that id
  4  the session is not waiting for an approval
  5  someone else answered that approval first (your answer is kept in a forked session)"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bookings",
        description="Book clinic appointments with an agent that sleeps while a human approves.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--db", help="the SQLite file (default: $BOOKINGS_DB, else data/bookings.db)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    ask = commands.add_parser("ask", help="ask for an appointment; the run stops at the approval")
    ask.add_argument("request", help='e.g. "I need physio on Tuesday afternoon, for Alex Doe"')
    ask.add_argument("--patient", help="the patient's id (default: derived from the name in the request)")
    commands.add_parser("pending", help="list the bookings waiting for a human")
    approve = commands.add_parser("approve", help="approve a waiting booking and let the agent finish")
    approve.add_argument("session_id")
    approve.add_argument("--note", help="a note for the agent")
    deny = commands.add_parser("deny", help="refuse a waiting booking")
    deny.add_argument("session_id")
    deny.add_argument("reason")
    show = commands.add_parser("show", help="the session's ledger as a timeline")
    show.add_argument("session_id")
    commands.add_parser("demo", help="run ask, pending, approve and show, each as its own process")
    args = parser.parse_args(argv)

    if args.command == "demo":
        return _demo(args.db)
    try:
        bookings = build(args.db)
    except (ValueError, DormantError) as exc:
        print(f"bookings: {exc}", file=sys.stderr)
        return USAGE
    with bookings.app:
        try:
            handler: Callable[[Bookings, argparse.Namespace], int] = _COMMANDS[args.command]
            return handler(bookings, args)
        except DormantError as exc:
            print(f"bookings: {exc}", file=sys.stderr)
            return USAGE


def _ask(bookings: Bookings, args: argparse.Namespace) -> int:
    app = bookings.app
    patient = args.patient or _slug(parse_request(args.request)["name"])
    session = app.sessions.ephemeral(scopes={"user": patient} if patient else None)
    if bookings.model_label.startswith("scripted"):
        print("(scripted model: no key, no network. Set BOOKINGS_MODEL=openai:<model> or bedrock:<id> for a real one.)")
    result = app.run(bookings.agent, args.request, session=session)
    commit(app, session)
    return _report(result.status, result.error, session)


def _pending(bookings: Bookings, args: argparse.Namespace) -> int:
    app = bookings.app
    waiting = [listing for listing in _all_listings(bookings) if listing.status == "awaiting_input"]
    if not waiting:
        print("No booking is waiting for approval.")
        return OK
    print(f"{len(waiting)} booking(s) waiting for approval:")
    for listing in waiting:
        session = app.sessions.get(listing.id)
        if session is None:  # deleted since it was listed
            continue
        since = datetime.fromtimestamp(listing.updated_at / 1000).strftime("%Y-%m-%d %H:%M")
        for call in session.yielded_tools:
            print(f"  {session.id}  since {since}  {call.args.get('summary', call.name)}")
    return OK


def _answer(bookings: Bookings, args: argparse.Namespace, approved: bool, note: str | None) -> int:
    app = bookings.app
    session = app.sessions.get(args.session_id)
    if session is None:
        print(f"bookings: no session {args.session_id!r} in {_where(bookings)}", file=sys.stderr)
        return UNKNOWN_SESSION
    calls = [call for call in session.yielded_tools if call.name == "request_approval"]
    if not calls:
        print(
            f"bookings: session {session.id} is not waiting for an approval (status: {session.status})", file=sys.stderr
        )
        return NOT_WAITING
    answers = [{"call_id": call.call_id, "input": {"approved": approved, "note": note}} for call in calls]
    result = app.run(bookings.agent, {"tools": answers}, session=session)
    outcome = commit(app, session)
    if outcome.status == "orphaned":
        print(
            f"bookings: someone else answered session {session.id} first; your answer is kept in session "
            f"{outcome.fork_id}",
            file=sys.stderr,
        )
        return ANSWERED_ELSEWHERE
    return _report(result.status, result.error, session)


def _show(bookings: Bookings, args: argparse.Namespace) -> int:
    session = bookings.app.sessions.get(args.session_id)
    if session is None:
        print(f"bookings: no session {args.session_id!r} in {_where(bookings)}", file=sys.stderr)
        return UNKNOWN_SESSION
    print("\n".join(timeline(session)))
    return OK


_COMMANDS: dict[str, Callable[[Bookings, argparse.Namespace], int]] = {
    "ask": _ask,
    "pending": _pending,
    "approve": lambda bookings, args: _answer(bookings, args, True, args.note),
    "deny": lambda bookings, args: _answer(bookings, args, False, args.reason),
    "show": _show,
}


def _report(status: str, error: str | None, session: Session) -> int:
    if session.output.text:
        print(f"agent: {session.output.text}")
    if status == "yielded_tool":
        for call in session.yielded_tools:
            print(f"waiting for approval: {call.args.get('summary', call.name)}")
        print(f"  session: {session.id}")
        print(f'  approve: bookings approve {session.id}    deny: bookings deny {session.id} "reason"')
        return OK
    confirmation = session.state.confirmation
    if confirmation is not None:
        print(
            f"confirmation {confirmation.reference}: {confirmation.service} with {confirmation.clinician}, "
            f"{confirmation.day} at {confirmation.time}, for {confirmation.patient}"
        )
    print(f"  session: {session.id}")
    if status != "completed":
        print(f"bookings: the run ended with {status}: {error}", file=sys.stderr)
        return RUN_FAILED
    return OK


def _all_listings(bookings: Bookings) -> Iterator[SessionListing]:
    cursor = None
    while True:
        page = bookings.app.sessions.list(limit=100, cursor=cursor)
        yield from page
        if len(page) < 100:
            return
        cursor = page[-1].cursor


def _where(bookings: Bookings) -> str:
    return str(getattr(bookings.app.store, "path", "the store"))


def _slug(name: str | None) -> str | None:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or None if name else None


def _demo(db: str | None) -> int:
    """The whole arc, each step a separate process, as a user would type it."""

    def step(*command: str) -> str:
        print(f"\n$ bookings {' '.join(repr(c) if ' ' in c else c for c in command)}", flush=True)
        prefix = [sys.executable, "-m", "bookings", *(["--db", db] if db else [])]
        done = subprocess.run([*prefix, *command], capture_output=True, text=True, check=False)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        if done.returncode != OK:
            raise SystemExit(done.returncode)
        return done.stdout

    said = step("ask", "I need physio on Tuesday afternoon, for Alex Doe")
    found = re.search(r"session: (\S+)", said)
    if found is None:
        print("bookings demo: ask did not report a session id", file=sys.stderr)
        return RUN_FAILED
    step("pending")
    step("approve", found.group(1))
    step("show", found.group(1))
    return OK


if __name__ == "__main__":
    sys.exit(main())
