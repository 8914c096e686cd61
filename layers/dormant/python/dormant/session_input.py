"""A session's input from outside an invocation: answers to yielded calls, checked before any is recorded, and user
messages (``session.input``; ``dormant.session.SessionInput`` is this class).

It reads the session through ``InputHost`` (what ``Session`` offers any caller) and records through its ``append``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .errors import ConfigurationError, InputError, ToolInputError, UnknownCallId
from .events import Event, ToolInputEvent, UserEvent
from .ledger import AnswerCheck
from .people import answering_groups, check_answer
from .projection import Projection
from .state.values import check_storable

__all__ = ["InputHost", "SessionInput"]


class ToolLookup(Protocol):
    """The app, as answers see it: the tool a call names."""

    def tool_named(self, name: str) -> AnswerCheck | None: ...


class InputHost(Protocol):
    """What ``SessionInput`` reads and records through (a ``Session``)."""

    @property
    def app_name(self) -> str: ...

    @property
    def runtime(self) -> ToolLookup: ...

    @property
    def projection(self) -> Projection: ...

    @property
    def current_agent_name(self) -> str | None: ...

    def append(self, event: Event) -> Event: ...


class SessionInput:
    """Input from outside an invocation: answers to yielded tool calls, and user messages."""

    def __init__(self, session: InputHost) -> None:
        self._session = session

    def answer(
        self, call_id: str, input: Any, *, principal: str | None = None, groups: Iterable[str] = ()
    ) -> ToolInputEvent:
        """Answer a yielded call; the answer is validated against the tool's ``yield_schema`` first, and the
        answerer (``principal``, a member of ``groups``) against its ``answerable_by`` (``AnswerRefused``)."""
        return self.answers([{"call_id": call_id, "input": input}], principal=principal, groups=groups)[0]

    def answers(
        self,
        answers: Sequence[Mapping[str, Any]],
        *,
        principal: str | None = None,
        groups: Iterable[str] = (),
        field: str = "answers",
    ) -> list[ToolInputEvent]:
        """Answer several yielded calls at once: all are checked before any is recorded.

        ``principal``: who answers, as authenticated by the caller of this (recorded on each answer), a member
        of ``groups``: each answer's tool's ``answerable_by`` must admit them (``AnswerRefused``, 403).
        ``field``: what errors call the answers (``answers.N...``, as in ``app.run``'s input and the API's body).
        """
        events = self.prepare(answers, principal=principal, groups=groups, field=field)
        for event in events:
            self._session.append(event)
        return events

    def tool(
        self, call_id: str, input: Any, *, principal: str | None = None, groups: Iterable[str] = ()
    ) -> ToolInputEvent:
        """Deprecated in 0.2 (``docs/concepts.md``): ``answer``. Its errors still name ``tools.N...``."""
        _renamed("session.input.tool", "session.input.answer")
        answers = [{"call_id": call_id, "input": input}]
        return self.answers(answers, principal=principal, groups=groups, field="tools")[0]

    def tools(
        self,
        answers: Sequence[Mapping[str, Any]],
        *,
        principal: str | None = None,
        groups: Iterable[str] = (),
        field: str = "tools",
    ) -> list[ToolInputEvent]:
        """Deprecated in 0.2 (``docs/concepts.md``): ``answers``. Its errors still name ``tools.N...``."""
        _renamed("session.input.tools", "session.input.answers")
        return self.answers(answers, principal=principal, groups=groups, field=field)

    def prepare(
        self,
        answers: Sequence[Mapping[str, Any]],
        *,
        principal: str | None = None,
        groups: Iterable[str] = (),
        field: str = "answers",
    ) -> list[ToolInputEvent]:
        """Check answers and build their events without recording them (errors name ``{field}.N...``)."""
        session = self._session
        member_of = frozenset(groups)
        if isinstance(answers, str | bytes) or not isinstance(answers, Sequence):
            raise InputError(f"{field} is a list of {{'call_id': ..., 'input': ...}}", field=field)
        pending = session.projection.pending
        events: list[ToolInputEvent] = []
        seen: set[str] = set()
        for position, answer in enumerate(answers):
            if not isinstance(answer, Mapping) or "call_id" not in answer:
                raise InputError("each tool answer is {'call_id': ..., 'input': ...}", field=f"{field}.{position}")
            unknown = sorted(str(key) for key in answer if key not in ("call_id", "input"))
            if unknown:  # a misspelt "input" would otherwise answer None, as HTTP refuses it too
                raise InputError(
                    f"a tool answer holds call_id and input, not {unknown[0]!r}",
                    field=f"{field}.{position}.{unknown[0]}",
                )
            call_id = answer["call_id"]
            if isinstance(call_id, str) and call_id in seen:
                raise InputError(f"tool call {call_id!r} is answered twice in this batch", field=f"{field}.{position}")
            call = pending.get(call_id) if isinstance(call_id, str) else None
            if call is None:
                refused = UnknownCallId(str(call_id), [c for c in pending if c not in seen], position)
                refused.field = f"{field}.{position}.call_id"
                raise refused
            seen.add(call_id)
            tool = session.runtime.tool_named(call.name)
            if tool is None:
                raise ConfigurationError(
                    f"tool {call.name!r} is not registered with app {session.app_name!r}: "
                    "define it (app.tool) in this process before answering its calls"
                )
            node = session.projection.invocations.get(call.invocation_id or "")
            check_answer(
                tool.rules,
                call_id=call_id,
                tool=call.name,
                principal=principal,
                groups=member_of,
                starter=node.principal if node is not None else None,
                field=f"{field}.{position}.call_id",
            )
            given = answer.get("input")
            check_storable(given, f"{field}.{position}.input")  # named as unstorable, not as "not JSON"
            try:
                value = tool.check_input(call_id, given, position)
            except ToolInputError as exc:
                exc.field = f"{field}.{position}.input" + (f".{exc.path}" if exc.path else "")
                raise
            check_storable(value, f"{field}.{position}.input")
            events.append(
                ToolInputEvent(
                    call_id=call_id,
                    name=call.name,
                    input=value,
                    invocation_id=call.invocation_id,
                    agent_name=session.current_agent_name,
                    principal=principal,
                    groups=answering_groups(tool.rules, member_of),
                )
            )
        return events

    def message(self, text: str) -> UserEvent:
        """Append a user message; the next run sees it."""
        if not isinstance(text, str):
            raise InputError(f"a message is a string, not {type(text).__name__}", field="message")
        check_storable(text, "message")
        event = UserEvent(text=text)
        self._session.append(event)
        return event


def _renamed(old: str, new: str) -> None:
    """Warn a caller of a name 0.2 renamed (``docs/concepts.md``: one name per concept); 0.3 drops it."""
    warnings.warn(f"{old} is deprecated: use {new} (docs/concepts.md)", DeprecationWarning, stacklevel=3)
