"""What a held request waits for: the events that land on a session's ledger, or the end of a turn.

Both read the store again with a growing pause, never the whole ledger more than once.
"""

from __future__ import annotations

import time
from typing import Any

from ...app import App
from ...errors import SessionNotFound
from ...events import Event, InvocationEndEvent
from ..hooks import Started
from ..turns import AdvanceOutcome

__all__ = ["WAIT_MARGIN", "await_events", "await_turn", "held_for"]

WAIT_MARGIN = 3.0
"""Seconds a held request keeps before the function's deadline, to answer."""
_WAIT_FIRST, _WAIT_LONGEST = 0.1, 1.0  # the held request's pause between reads of the tail, growing


def held_for(seconds: float, context: Any) -> float:
    """How long a request may hold for ``seconds``: never past ``WAIT_MARGIN`` before the function's deadline
    (Lambda's ``context``; ``None``: no deadline, as under ``dormant serve``). A held request then answers
    before its function times out, and, with the API functions' timeout, before API Gateway's 29 s."""
    if context is None:
        return seconds
    left = float(context.get_remaining_time_in_millis()) / 1000 - WAIT_MARGIN
    return min(seconds, max(0.0, left))


def await_events(
    app: App, session_id: str, version: int, count: int, after: int, wait: float
) -> tuple[list[Event], int]:
    """The events from index ``after`` that land within ``wait`` seconds, and the ledger's length then.

    ``count`` events are stored as of ``version``: each look reads only what was stored after the last
    version seen (the tail), never the whole ledger, pausing a little longer each time.
    """
    deadline = time.monotonic() + wait
    pause = _WAIT_FIRST
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(pause, left))
        pause = min(pause * 2, _WAIT_LONGEST)
        loaded = app.store.load(app.name, session_id, after=version)
        if loaded is None:  # deleted (or erased) while we waited
            raise SessionNotFound(session_id)
        version, start = loaded.row.version, count
        count += len(loaded.events)
        if count > after:
            return loaded.events[after - start :], count
    return [], count


_RUN_STATUS = {"awaiting_input": "yielded_tool", "resumable": "yielded_tool"}


def await_turn(
    app: App, session_id: str, version: int, started: Started | None, seconds: float
) -> AdvanceOutcome | None:
    """The turn's outcome once it ended, waiting up to ``seconds``; ``None`` while it still runs. A turn this
    process runs is waited on; one that runs elsewhere (a Step Functions execution) is read from the store,
    re-read with a growing pause (0.1 s to 1 s)."""
    if started is not None:
        return started.wait(seconds)
    deadline, pause = time.monotonic() + seconds, 0.1
    while seconds:
        session = app.sessions.require(session_id)
        if session.version > version and session.status not in ("running", "resumable"):
            end = next((e for e in reversed(session.events) if isinstance(e, InvocationEndEvent)), None)
            return AdvanceOutcome(
                status=_RUN_STATUS.get(session.status, session.status),  # type: ignore[arg-type]
                session_id=session_id,
                output=session.output,
                yielded_tools=session.yielded_tools,
                commit_status="committed",
                version=session.version,
                session=session,
                error=end.error if end is not None and session.status == "error" else None,
            )
        if time.monotonic() + pause > deadline:
            return None
        time.sleep(pause)
        pause = min(1.0, pause * 2)
    return None
