"""What a server does around a sleep, apart from the HTTP API (so the workflow's functions need no API).

On AWS the hooks start and wake the Step Functions execution (``serving.workflow``); locally the
answers' request runs the agent on itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..app import App
    from ..session import Session
    from .advance import AdvanceOutcome

__all__ = ["Hooks"]


@dataclass(frozen=True)
class Hooks:
    """What happens around a sleep: ``on_yield(tenant, app, outcome)`` once a run yields, and
    ``on_answers(tenant, app, session)`` once answers are stored (``None``: nothing; what it returns is
    merged into the ``POST /tools`` answer, over its ``status`` and ``version``)."""

    on_yield: Callable[[str, App, AdvanceOutcome], None] | None = None
    on_answers: Callable[[str, App, Session], dict[str, Any] | None] | None = None
