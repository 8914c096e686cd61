"""A session's ledger as a readable timeline: who said what, every state change with scope, source, old -> new.

Everything in a ledger may come from a user or a model, so nothing is shown raw: ``printable`` escapes
every control, format and line-separator character (a newline plus an ANSI escape in a request could
otherwise print a forged line).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from dormant.events import (
    AssistantEvent,
    Event,
    InvocationEndEvent,
    InvocationResumeEvent,
    InvocationStartEvent,
    InvocationYieldEvent,
    ModelEndEvent,
    ModelStartEvent,
    SessionForkedEvent,
    StateChangeEvent,
    ToolCallEvent,
    ToolInputEvent,
    ToolResultEvent,
    UserEvent,
)
from dormant.session import Session

__all__ = ["header", "ledger", "printable", "timeline"]

_WIDTH = 100


def timeline(session: Session) -> list[str]:
    head = header(session.id, f"app {session.app_name}", session.version, session.status, session.scopes)
    return [head, *ledger(session.events)]


def header(session_id: str, where: str, version: int, status: str, scopes: Mapping[str, str]) -> str:
    """The timeline's first line; ``where`` says where the session lives (its app, or the API's address)."""
    bound = ", ".join(f"{scope}={scope_id}" for scope, scope_id in scopes.items()) or "none"
    return f"Session {session_id}  ({where}, version {version}, status {status}, scopes: {bound})"


def ledger(events: Iterable[Event]) -> list[str]:
    """One line per event: its index, time, who acted and what happened."""
    lines = []
    for index, event in enumerate(events):
        when = datetime.fromtimestamp(event.created_at / 1000).strftime("%H:%M:%S")
        who, what = _describe(event)
        lines.append(f"{index:>4}  {when}  {who:<7} {what}")
    return lines


def _describe(event: Event) -> tuple[str, str]:
    if isinstance(event, UserEvent):
        return "user", _short(event.text)
    if isinstance(event, AssistantEvent):
        return "agent", _short(event.text) if event.text is not None else _short(event.value)
    if isinstance(event, ToolCallEvent):
        args = ", ".join(f"{k}={_short(v, 40)}" for k, v in event.args.items())
        return "agent", f"calls {event.name}({args})"
    if isinstance(event, ToolResultEvent):
        if event.error is not None:
            return "tool", f"{event.name} failed: {event.error}"
        return "tool", f"{event.name} -> {_short(event.result)}"
    if isinstance(event, ToolInputEvent):
        by = f"  (by {json.dumps(event.principal, ensure_ascii=False)})" if event.principal is not None else ""
        return "human", f"answers {event.name}: {_short(event.input)}{by}"
    if isinstance(event, StateChangeEvent):
        target = event.scope if event.scope_id is None else f"{event.scope}[{event.scope_id}]"
        parts = [f"{target}.{c.key}: {_short(c.old_value, 40)} -> {_short(c.new_value, 40)}" for c in event.changes]
        by = f" by {event.tool} [{event.call_id}]" if event.call_id is not None else ""  # the tool call that wrote it
        return "state", f"{'; '.join(parts)}  ({event.source}{by})"
    if isinstance(event, InvocationStartEvent):
        return "run", f"--- {event.agent_name} starts ({event.invocation_id})"
    if isinstance(event, InvocationYieldEvent):
        waiting = ", ".join(f"{c.name} [{c.call_id}]" for c in event.pending)
        return "run", f"... paused, waiting for: {waiting}"
    if isinstance(event, InvocationResumeEvent):
        return "run", "--- resumes"
    if isinstance(event, InvocationEndEvent):
        detail = f": {event.error}" if event.error else ""
        return "run", f"--- ends: {event.status}{detail}"
    if isinstance(event, ModelStartEvent):
        return "model", f"{event.model.provider}/{event.model.name} asked ({event.message_count} messages)"
    if isinstance(event, ModelEndEvent):
        if event.error is not None:
            return "model", f"failed: {event.error}"
        tokens = f", {event.usage.total_tokens} tokens" if event.usage.total_tokens else ""
        return "model", f"answered ({event.finish_reason}{tokens}, {event.latency_ms} ms)"
    if isinstance(event, SessionForkedEvent):
        where = f"after event {event.at_event_id}" if event.at_event_id is not None else "from its start"
        return "fork", f"--- forked from {event.from_session_id} {where}: {_short(event.reason)}"
    return "?", event.type


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (C*, Zl, Zp categories) as a visible escape."""
    return "".join(_escape(ch) if unicodedata.category(ch)[0] == "C" or ch in "\u2028\u2029" else ch for ch in text)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    code = ord(ch)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _short(value: Any, width: int = _WIDTH) -> str:
    text = "-" if value is None else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 3] + "..."
