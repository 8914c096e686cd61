"""What the HTTP API's requests may hold: the pydantic bodies of its routes and the limits of its query values.

Apart from the routes (``serving.http``) so that what describes the API (``serving.openapi``) reads them without
importing the handlers, and the handlers import the document only when it is asked for.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..projection import SessionStatus

__all__ = [
    "MAX_LIST_LIMIT",
    "MAX_WAIT_SECONDS",
    "STATUSES",
    "Answer",
    "CommitBody",
    "CreateBody",
    "EraseBody",
    "ForkBody",
    "RunBody",
    "ScopedChange",
    "ToolsBody",
]

MAX_LIST_LIMIT = 1000
"""The most sessions one ``GET /sessions`` page holds (a larger ``limit`` is a 400, not a table read)."""
STATUSES: tuple[str, ...] = typing.get_args(SessionStatus)
"""What ``GET /sessions?status=`` may ask for."""
MAX_WAIT_SECONDS = 25
"""The longest a request holds (``GET /sessions/{id}/events?wait=``, ``Prefer: wait=``): under API Gateway's 29 s."""


class _Body(BaseModel):
    # Built on first use: each function's cold start builds only the bodies of the routes it serves.
    model_config = ConfigDict(extra="forbid", defer_build=True)


class CreateBody(_Body):
    session_id: str | None = None
    scopes: dict[str, str] | None = None


class RunBody(_Body):
    agent: str | None = None
    message: str | None = None
    state: dict[str, Any] | None = None
    takeover: bool = Field(default=False, strict=True)
    """Run a session left ``running`` by a process that died (``advance(takeover=True)``)."""


class Answer(_Body):
    call_id: str
    input: Any = None


class ToolsBody(_Body):
    answers: list[Answer] = Field(min_length=1)


class ScopedChange(_Body):
    scope: str
    scope_id: str
    key: str
    value: Any = None


class EraseBody(_Body):
    scope: str
    scope_id: str


class ForkBody(_Body):
    at: int = Field(ge=0, strict=True)  # JSON true is not event 1
    reason: str = Field(default="forked in the inspector", min_length=1)


class CommitBody(_Body):
    expected_version: int = Field(ge=0, strict=True)  # JSON true or "1" is no version
    events: list[dict[str, Any]]
    scoped_changes: list[ScopedChange] | None = None
