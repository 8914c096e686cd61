"""Who runs a claimed turn and wakes a sleeping one: the seam between the HTTP API and the workflow.

The API claims turns and stores answers; a ``Hooks`` says what happens around that:

* on AWS (``serving.workflow.step_functions_hooks``) a Step Functions execution runs the turn: it is
  started *before* the claim is committed (its name is derived from the invocation it will run), so a
  claim that landed always has an execution responsible for it; answers wake the waiting execution. A turn
  whose caller waits for it (``Prefer: wait``) is run by the request itself, and an execution is started
  (``hand_on``) only if it parks or cannot end within the hold;
* under ``dormant serve`` (``serving.workflow.in_process_hooks``) a thread of the serving process runs it;
* with no hooks the request runs the turn itself (tests, ``make invoke``): the old, synchronous behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..app import App
    from ..session import Session
    from .turns import AdvanceOutcome, Claim

__all__ = ["Hooks", "Started"]


class Started(Protocol):
    """A turn running elsewhere in this process: ``wait(seconds)`` gives its outcome once it ended, else ``None``."""

    def wait(self, seconds: float) -> AdvanceOutcome | None: ...


@dataclass(frozen=True)
class Hooks:
    """What happens around a turn and a sleep.

    ``before_claim(tenant, session_id, invocation_id, version)``: ready the runner of the turn about to be
    claimed (AWS: start its execution). ``run(tenant, app, claim)``: run a claimed turn outside the request
    (``None``: the request runs it); it may return a ``Started`` the request can wait on (``Prefer: wait``).
    ``on_answers(tenant, app, session)``: answers were stored (wake the waiting execution); what it returns is
    merged into the ``POST /tools`` answer. ``hand_on(tenant, session_id, invocation_id, version, parked)``: start
    the runner of a claimed turn that a waiting request ran first and could not end (it ``parked``: its runner
    starts at the wait; or its hold ran short); given, a request that waits runs its turn itself, and
    ``before_claim`` is not called for it.
    ``end_wait(tenant, app, session)``: the answers' turn was taken on by the request that stored them (it waits,
    and ``hand_on`` is given): end the waiting execution without a runner of its own (``False``: none was
    waiting, or it ended already). ``None`` for any: nothing."""

    before_claim: Callable[[str, str, str, int], None] | None = None
    hand_on: Callable[[str, str, str, int, bool], object] | None = None
    run: Callable[[str, App, Claim], Started | None] | None = None
    on_answers: Callable[[str, App, Session], dict[str, Any] | None] | None = None
    end_wait: Callable[[str, App, Session], bool] | None = None
