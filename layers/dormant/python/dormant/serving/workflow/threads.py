"""Locally, where there is no Step Functions: each claimed turn runs in a thread of this process, and answers that
leave nothing to wait for start the resumed turn the same way."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ...app import App
from ...clock import now_ms
from ...errors import ClaimLost, DormantError
from ...session import Session
from ..hooks import Hooks, Started
from ..runtime import Served
from ..turns import RUNNER_TURN_MS, AdvanceOutcome, Claim, claim_turn, run_to_end


class _Thread:
    """A turn running in a thread of this process."""

    def __init__(self, work: Callable[[], AdvanceOutcome | None]) -> None:
        self.outcome: AdvanceOutcome | None = None
        self._thread = threading.Thread(target=self._run, args=(work,), name="dormant-turn")
        _LOCAL_TURNS.add(self._thread)  # before it starts: a turn that ends at once must not leave itself here
        self._thread.start()

    def _run(self, work: Callable[[], AdvanceOutcome | None]) -> None:
        try:
            self.outcome = work()
        except DormantError as exc:  # lost to another runner, or the store failed: the session says where it is
            _logger.warning("dormant: a turn stopped: %s: %s", type(exc).__name__, exc)
        finally:
            _LOCAL_TURNS.discard(self._thread)

    def wait(self, seconds: float) -> AdvanceOutcome | None:
        self._thread.join(seconds)
        return None if self._thread.is_alive() else self.outcome


_LOCAL_TURNS: set[threading.Thread] = set()
_logger = logging.getLogger("dormant.serving")


def join_local_turns(timeout: float | None = None) -> None:
    """Wait for the turns this process runs in threads (a server stopping lets them commit first)."""
    for thread in list(_LOCAL_TURNS):
        thread.join(timeout)


def in_process_hooks(served: Served) -> Hooks:
    """Locally, where there is no Step Functions: a thread of this process runs each claimed turn, and
    answers that leave nothing to wait for start the resumed turn the same way."""

    def run(tenant: str, app: App, claim: Claim) -> Started:
        return _Thread(lambda: run_to_end(app, claim, served.agent))

    def on_answers(tenant: str, app: App, session: Session) -> dict[str, Any]:
        if session.status != "resumable":
            return {}
        try:
            claim = claim_turn(
                app, served.agent(session.current_agent_name), session.id, deadline=now_ms() + RUNNER_TURN_MS
            )
        except ClaimLost:  # another request resumed it first
            return {}
        claimed = {"status": claim.session.status, "version": claim.version}  # read before the thread moves it on
        _Thread(lambda: run_to_end(app, claim, served.agent))
        return claimed

    return Hooks(run=run, on_answers=on_answers)
