"""``bookings --api URL ...``: the same commands, through the HTTP API (``dormant serve``, or a deployment's).

Each command is a few JSON requests (stdlib ``urllib``); what it prints and its exit code are the local
command's (``output.report``, ``output.print_pending``, ``timeline``). The server runs the agent: ``ask`` is
``POST /sessions`` then ``POST /runs``; ``approve``/``deny`` is ``POST /tools``, after which the server
resumes the agent. The server runs turns after it answers (a 202), so runs and answers ask it to hold the
request until the turn ends (``Prefer: wait=25``); a turn longer than that is waited for by reading the
session, up to ``SETTLE_SECONDS``.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dormant.events import Event, InvocationEndEvent, parse_event

from .app import Confirmation, patient_id
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
    not_waiting,
    print_pending,
    report,
    say,
    warn,
)
from .scripted import parse_request
from .timeline import header, ledger

__all__ = ["ApiError", "run_remote"]

TIMEOUT_SECONDS = 120
SETTLE_SECONDS = 60
_PAGE = 100


class ApiError(Exception):
    """The API answered with an error status (``status``, and its JSON ``body``), or could not be reached (0)."""

    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body or {}


@dataclass(frozen=True)
class _Remote:
    """The API at ``path``: its requests, and the hints' command prefix."""

    path: str
    command: str

    def call(self, method: str, route: str, body: Any = None, *, wait: bool = False) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **({"Prefer": "wait=25"} if wait else {})}
        request = urllib.request.Request(self.path.rstrip("/") + route, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                answer = json.loads(raw) if raw else {}
            except ValueError:
                answer = {}
            detail = answer.get("message") if isinstance(answer, dict) else None
            raise ApiError(exc.code, str(detail or f"{method} {route}: HTTP {exc.code}"), answer) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(0, f"cannot reach the API at {self.path} ({reason}); is `dormant serve` running?") from None
        return json.loads(text) if text else None

    def session(self, session_id: str) -> dict[str, Any]:
        return self.call("GET", f"/sessions/{_quoted(session_id)}")  # type: ignore[no-any-return]

    def events(self, session_id: str) -> list[Event]:
        found: list[Event] = []
        after: int | None = 0
        while after is not None:
            page = self.call("GET", f"/sessions/{_quoted(session_id)}/events?after={after}&limit={_PAGE}")
            found += [parse_event(raw) for raw in page["events"]]
            after = page["next"]
        return found

    def listed(self, status: str) -> Iterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            query = urllib.parse.urlencode({"status": status, "limit": _PAGE, **({"cursor": cursor} if cursor else {})})
            page = self.call("GET", f"/sessions?{query}")
            yield from page["sessions"]
            cursor = page["cursor"]
            if cursor is None:
                return


def run_remote(url: str, args: argparse.Namespace, text: str | None) -> int:
    """Run ``args.command`` against the API at ``url``; the exit code."""
    if args.command == "demo":
        warn("demo is not available with --api")
        return USAGE
    if args.command == "ask" and args.patient is not None:
        warn("--patient is not available with --api: name the patient in the request")
        return USAGE
    if not url.startswith(("http://", "https://")):
        warn(f"--api is an http:// or https:// URL, not {url!r}")
        return USAGE
    remote = _Remote(url, f"bookings --api {url}")
    try:
        return _COMMANDS[args.command](remote, args, text)
    except ApiError as exc:
        return _failed(exc)


def _failed(exc: ApiError) -> int:
    warn(str(exc))
    if exc.status == 404:
        return UNKNOWN_SESSION
    if exc.status == 409:
        return CLAIM_LOST
    if exc.status == 503:
        return BUSY
    return RUN_FAILED if exc.status >= 500 else USAGE


def _ask(remote: _Remote, args: argparse.Namespace, text: str | None) -> int:
    assert text is not None
    name = parse_request(text)["name"]
    created = remote.call("POST", "/sessions", {"scopes": {"user": patient_id(name)}} if name is not None else {})
    return _run(remote, created["id"], {"message": text})


def _reply(remote: _Remote, args: argparse.Namespace, text: str | None) -> int:
    shown = remote.session(args.session_id)
    if shown["status"] not in ("completed", "max_steps", "idle"):
        return not_waiting(remote, args.session_id, shown["status"], "a reply")
    return _run(remote, args.session_id, {"message": text})


def _resume(remote: _Remote, args: argparse.Namespace, text: str | None) -> int:
    shown = remote.session(args.session_id)
    takeover = args.takeover and shown["status"] == "running"
    if shown["status"] not in ("error", "resumable", "max_steps") and not takeover:
        return not_waiting(remote, args.session_id, shown["status"], "a resume")
    return _run(remote, args.session_id, {"takeover": True} if takeover else {})


def _run(remote: _Remote, session_id: str, body: dict[str, Any]) -> int:
    ran = remote.call("POST", f"/sessions/{_quoted(session_id)}/runs", body, wait=True)
    if "output" not in ran:  # a 202: the turn outlasted the request
        return _report_settled(remote, session_id)
    shown = remote.session(session_id) if ran["status"] != "yielded_tool" else None
    return report(
        remote,
        _outcome(
            session_id,
            ran["status"],
            ran["output"]["text"],
            shown,
            error=ran.get("error"),
            waiting=ran["yielded_tools"],
            commit_status=ran["commit_status"],
            fork_id=ran.get("fork_id"),
        ),
    )


def _answer(remote: _Remote, args: argparse.Namespace, approved: bool, note: str | None) -> int:
    before = remote.session(args.session_id)
    calls = [call for call in before["yielded_tools"] if call["name"] == APPROVAL]
    if not calls:
        return not_waiting(remote, args.session_id, before["status"], "an approval")
    answers = [{"call_id": call["call_id"], "input": {"approved": approved, "note": note}} for call in calls]
    remote.call("POST", f"/sessions/{_quoted(args.session_id)}/tools", {"answers": answers}, wait=True)
    return _report_settled(remote, args.session_id)


def _report_settled(remote: _Remote, session_id: str) -> int:
    """Report a turn the server runs on its own, once it settled (or say it still runs)."""
    args = argparse.Namespace(session_id=session_id)
    shown = _settled(remote, args.session_id)
    if shown["status"] in ("resumable", "running"):
        say(f"the answer is in; the agent is still running. See: {remote.command} show {args.session_id}")
        return OK
    ends = [e for e in remote.events(args.session_id) if isinstance(e, InvocationEndEvent)]
    last = ends[-1] if ends else None
    status = "yielded_tool" if shown["status"] == "awaiting_input" else last.status if last else shown["status"]
    text = last.output_text if last is not None and status != "yielded_tool" else None
    error = last.error if last is not None else None
    return report(remote, _outcome(args.session_id, status, text, shown, error=error, waiting=shown["yielded_tools"]))


def _settled(remote: _Remote, session_id: str) -> dict[str, Any]:
    """The session once its resumed run has ended (at once on ``dormant serve``), or after ``SETTLE_SECONDS``."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        shown = remote.session(session_id)
        if shown["status"] not in ("resumable", "running") or time.monotonic() > deadline:
            return shown
        time.sleep(0.5)


def _outcome(
    session_id: str,
    status: str,
    text: str | None,
    shown: dict[str, Any] | None,
    *,
    error: str | None,
    waiting: list[dict[str, Any]],
    commit_status: str = "committed",
    fork_id: str | None = None,
) -> Outcome:
    state = (shown or {}).get("state", {}).get("session", {})
    confirmation = state.get("confirmation")
    return Outcome(
        session_id=session_id,
        status=status,
        text=text,
        waiting=[str(call["args"].get("summary", call["name"])) for call in waiting],
        confirmation=Confirmation.model_validate(confirmation) if confirmation else None,
        slot_taken=state.get("slot_taken"),
        refusal=state.get("refusal"),
        error=error,
        commit_status=commit_status,
        fork_id=fork_id,
    )


def _pending(remote: _Remote, args: argparse.Namespace, text: str | None) -> int:
    waiting = []
    for listing in remote.listed("awaiting_input"):
        shown = remote.session(listing["id"])
        asks = [str(c["args"].get("summary", c["name"])) for c in shown["yielded_tools"] if c["name"] == APPROVAL]
        if shown["status"] == "awaiting_input" and asks:  # it may have moved since it was listed
            waiting.append(Waiting(listing["id"], shown["updated_at"], asks))
    stuck = []
    for status in sorted(STUCK):
        for listing in remote.listed(status):
            shown = remote.session(listing["id"])
            if shown["status"] in STUCK:
                events = remote.events(listing["id"]) if shown["status"] == "error" else []
                stuck.append(Waiting(listing["id"], shown["updated_at"], [], shown["status"], events))
    return print_pending(remote, waiting, stuck)


def _show(remote: _Remote, args: argparse.Namespace, text: str | None) -> int:
    shown = remote.session(args.session_id)
    events = remote.events(args.session_id)
    say(header(shown["id"], f"at {remote.path}", shown["version"], shown["status"], shown["scopes"]))
    for line in ledger(events):
        say(line)
    return OK


def _quoted(session_id: str) -> str:
    return urllib.parse.quote(session_id, safe="")


_COMMANDS: dict[str, Callable[[_Remote, argparse.Namespace, str | None], int]] = {
    "ask": _ask,
    "pending": _pending,
    "approve": lambda remote, args, _: _answer(remote, args, True, args.note),
    "deny": lambda remote, args, _: _answer(remote, args, False, args.reason),
    "reply": _reply,
    "resume": _resume,
    "show": _show,
}
