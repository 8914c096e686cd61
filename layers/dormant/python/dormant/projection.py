"""What a session's ledger adds up to, folded one event at a time.

Why one module: the fold's ``apply``, its export and its restore must change together (a snapshot is the
fold's state), and each reads the same few fields.

``Projection`` never looks at the event list: it is a pure fold (``apply`` one event, in order), so
the same code keeps a live session current (one event per append), replays a prefix for time
travel, and resumes from a snapshot: ``export()`` is the fold's state as JSON, ``Projection.restore``
takes it back. What is exported is state, not history: invocations that ended are left out (time
travel replays the ledger for those), so a snapshot stays the size of the state however long the
session grows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias, TypeVar

from .errors import InputError
from .events import (
    AssistantEvent,
    Event,
    InvocationEndEvent,
    InvocationResumeEvent,
    InvocationStartEvent,
    InvocationYieldEvent,
    ModelStartEvent,
    StateChangeEvent,
    ToolCallEvent,
    ToolInputEvent,
    ToolResultEvent,
    UserEvent,
    parse_event,
)
from .state.values import json_copy

__all__ = [
    "RECENT_INVOCATIONS",
    "RECENT_TURNS",
    "InvocationNode",
    "Output",
    "Projection",
    "SessionStatus",
    "StateSnapshot",
    "YieldedTool",
]

RECENT_TURNS = 50
"""User turns whose ledger positions the fold remembers: ``history(turns=N)`` for N up to this reads only
the tail of a long session; a wider window reads the whole ledger."""

RECENT_INVOCATIONS = 16
"""Invocations whose ids (and start positions) the fold remembers after they ended, snapshots included: a retried
request that claimed one (its id derived from its ``Idempotency-Key``) finds it there without reading history."""

_E = TypeVar("_E", ToolCallEvent, ToolInputEvent)
_log = logging.getLogger("dormant.snapshots")
_ENDED = frozenset({"completed", "error", "max_steps"})

SessionStatus: TypeAlias = Literal[
    "idle",  # no invocation yet
    "running",  # an invocation started and has not ended (in progress, or interrupted mid-run)
    "awaiting_input",  # paused on yielded tool calls, at least one still unanswered
    "resumable",  # paused, every yielded call answered: run the agent to continue
    "completed",
    "error",
    "max_steps",
]


@dataclass(frozen=True)
class YieldedTool:
    """A yielded tool call waiting for its answer."""

    call_id: str
    name: str
    args: dict[str, Any]
    invocation_id: str | None


@dataclass(frozen=True)
class Output:
    """What the agent last said: its text, and its structured value when the agent declares one."""

    text: str | None = None
    value: Any = None


@dataclass
class InvocationNode:
    """One invocation: its agent, its status, where it starts and ends in the ledger."""

    invocation_id: str
    agent_name: str
    status: str
    start_index: int
    end_index: int | None = None
    model_calls: int = 0
    """``model_start`` events so far (an agent's ``max_steps`` counts them across resumes)."""
    principal: str | None = None
    """Who started it (``InvocationStartEvent.principal``): what ``answerable_by`` rules about the starter read."""


@dataclass(frozen=True)
class StateSnapshot:
    """The session as it stood after event ``index`` (inclusive)."""

    index: int
    session_state: dict[str, Any]
    scoped_states: dict[str, dict[str, Any]]
    status: SessionStatus
    current_agent_name: str | None
    yielded_tools: list[YieldedTool]
    invocations: list[InvocationNode]
    """Every invocation so far, in the order they started."""


_DEFERRED = frozenset(
    {
        "answered",
        "current_agent_name",
        "deadline",
        "invocations",
        "open_calls",
        "open_invocation",
        "output",
        "pending",
        "recent_invocations",
        "recent_turns",
        "user_turns",
    }
)
"""What ``Projection.resume`` reads on first use: all but the count, the scopes' values and the status."""


class Projection:
    """Derived session state: scoped values, status, pending tool calls, the invocation tree."""

    # What a state read needs, the fold's own fields, then what ``resume`` leaves for first use.
    __slots__ = ("_deferred", "count", "scoped_states", "session_state", "status", "upcast", *sorted(_DEFERRED))

    def __init__(self, upcast: Callable[[StateChangeEvent], StateChangeEvent] | None = None) -> None:
        # State written under an older scope model is folded in the current shape (``Schema.upcast``).
        self.upcast = upcast
        self._deferred: tuple[dict[str, Any], Callable[[], Projection]] | None = None
        """A projection resumed from a snapshot: the export whose other fields are read on first use, and what
        rebuilds them from the ledger when they do not parse (``resume``)."""
        self.count = 0
        self.session_state: dict[str, Any] = {}
        self.scoped_states: dict[str, dict[str, Any]] = {}
        self.status: SessionStatus = "idle"
        self.current_agent_name: str | None = None
        self.output = Output()
        self.invocations: dict[str, InvocationNode] = {}
        self.open_invocation: str | None = None
        # When the open invocation's runner stops (ms since the epoch), as its start or last resume recorded.
        self.deadline: int | None = None
        # Calls of the open invocation that have no result yet, in the order the model made them.
        self.open_calls: dict[str, ToolCallEvent] = {}
        # Yielded calls without an answer, and answered ones whose tool has not run yet.
        self.pending: dict[str, YieldedTool] = {}
        self.answered: dict[str, ToolInputEvent] = {}
        self.user_turns = 0
        """User messages so far: each starts a turn of the conversation."""
        self.recent_turns: list[int] = []
        """Ledger positions of the last ``RECENT_TURNS`` user messages (where ``history(turns=N)`` starts)."""
        self.recent_invocations: dict[str, int] = {}
        """The last ``RECENT_INVOCATIONS`` invocations started: id -> the ledger position of its start."""

    def apply(self, event: Event) -> None:
        if self._deferred is not None:
            self._fill()
        index = self.count
        self.count += 1
        if isinstance(event, StateChangeEvent):
            if self.upcast is not None:
                event = self.upcast(event)
            target = self.session_state if event.scope == "session" else self.scoped_states.setdefault(event.scope, {})
            for change in event.changes:
                if change.new_value is None:
                    target.pop(change.key, None)
                else:
                    target[change.key] = change.new_value
        elif isinstance(event, UserEvent):
            self.user_turns += 1
            self.recent_turns.append(index)
            if len(self.recent_turns) > RECENT_TURNS:
                del self.recent_turns[0]
        elif isinstance(event, ToolCallEvent):
            self.open_calls[event.call_id] = event
        elif isinstance(event, ToolResultEvent):
            self.open_calls.pop(event.call_id, None)
            self.answered.pop(event.call_id, None)
        elif isinstance(event, ToolInputEvent):
            if self.pending.pop(event.call_id, None) is not None:
                self.answered[event.call_id] = event
                if not self.pending and self.status == "awaiting_input":
                    self.status = "resumable"
        elif isinstance(event, AssistantEvent):
            if event.text is not None or event.value is not None:
                self.output = Output(event.text, event.value)
        elif isinstance(event, ModelStartEvent):
            node = self.invocations.get(event.invocation_id)
            if node is not None:
                node.model_calls += 1
        elif isinstance(event, InvocationStartEvent):
            node = InvocationNode(event.invocation_id, event.agent_name, "running", index, principal=event.principal)
            self.invocations[event.invocation_id] = node
            self.recent_invocations[event.invocation_id] = index
            if len(self.recent_invocations) > RECENT_INVOCATIONS:
                del self.recent_invocations[next(iter(self.recent_invocations))]
            self.open_invocation = event.invocation_id
            self.deadline = event.deadline
            self.open_calls = {}
            self.current_agent_name = event.agent_name
            self.status = "running"
        elif isinstance(event, InvocationYieldEvent):
            self.pending = {
                c.call_id: YieldedTool(c.call_id, c.name, dict(c.args), event.invocation_id)
                for c in event.pending
                if c.call_id not in self.answered
            }
            self.status = "awaiting_input" if self.pending else "resumable"
            self._set_node(event.invocation_id, self.status, index)
        elif isinstance(event, InvocationResumeEvent):
            self.open_invocation = event.invocation_id
            self.deadline = event.deadline
            resumed = self.invocations.get(event.invocation_id)
            if resumed is not None:
                self.current_agent_name = resumed.agent_name
            self.status = "awaiting_input" if self.pending else "running"
            self._set_node(event.invocation_id, self.status, None)
        elif isinstance(event, InvocationEndEvent):
            self.status = event.status
            self._set_node(event.invocation_id, event.status, index)
            self.open_invocation = None
            self.deadline = None
            self.open_calls = {}
            self.pending = {}
            self.answered = {}

    def _set_node(self, invocation_id: str, status: str, end_index: int | None) -> None:
        node = self.invocations.get(invocation_id)
        if node is not None:
            node.status = status
            node.end_index = end_index

    @property
    def yielded_tools(self) -> list[YieldedTool]:
        return list(self.pending.values())

    def unexecuted_calls(self) -> list[ToolCallEvent]:
        """Calls of the open invocation that can run now: non-yielding ones, and answered yielded ones."""
        return [c for c in self.open_calls.values() if c.call_id not in self.pending]

    def snapshot(self) -> StateSnapshot:
        return StateSnapshot(
            index=self.count - 1,
            session_state=json_copy(self.session_state),
            scoped_states=json_copy(self.scoped_states),
            status=self.status,
            current_agent_name=self.current_agent_name,
            yielded_tools=self.yielded_tools,
            invocations=[replace(node) for node in self.invocations.values()],
        )

    # -- snapshots --------------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The fold's state as JSON: what a snapshot stores. Ended invocations are history: left out."""
        return {
            "count": self.count,
            "session_state": json_copy(self.session_state),
            "scoped_states": json_copy(self.scoped_states),
            "status": self.status,
            "current_agent_name": self.current_agent_name,
            "output": [self.output.text, json_copy(self.output.value)],
            "invocations": [
                # the principal last: a snapshot without it (written before it was recorded) restores with None
                [n.invocation_id, n.agent_name, n.status, n.start_index, n.end_index, n.model_calls, n.principal]
                for n in self.invocations.values()
                if n.status not in _ENDED
            ],
            "open_invocation": self.open_invocation,
            "deadline": self.deadline,
            "open_calls": [e.model_dump(mode="json") for e in self.open_calls.values()],
            "pending": [[y.call_id, y.name, json_copy(y.args), y.invocation_id] for y in self.pending.values()],
            "answered": [e.model_dump(mode="json") for e in self.answered.values()],
            "user_turns": self.user_turns,
            "recent_turns": list(self.recent_turns),
            "recent_invocations": [[i, start] for i, start in self.recent_invocations.items()],
        }

    @classmethod
    def restore(
        cls, data: dict[str, Any], upcast: Callable[[StateChangeEvent], StateChangeEvent] | None = None
    ) -> Projection:
        """A projection from ``export()``'s output, folding on with ``upcast``. Anything else raises
        (``InputError``, or ``KeyError``, ``TypeError``, ``ValueError`` from a wrong shape), for the caller
        to replay the ledger instead. The state must be in the shape ``upcast`` folds to: a snapshot
        records the scope versions it was folded under, and one of other versions is not restored."""
        projection = cls(upcast)
        _restore_state(projection, data)
        for name, value in _restore_rest(data).items():
            setattr(projection, name, value)
        return projection

    @classmethod
    def resume(
        cls,
        data: dict[str, Any],
        upcast: Callable[[StateChangeEvent], StateChangeEvent] | None,
        rebuild: Callable[[], Projection],
    ) -> Projection:
        """As ``restore``, reading now only what a state read needs (the count, the scopes' values, the status;
        checked as ``restore`` checks them) and the rest of ``data`` on first use: a fresh load that reads one
        value builds no invocation, call or turn list. Should the rest not parse then, ``rebuild()`` (the
        ledger's first ``count`` events replayed) stands in for it: a snapshot is never trusted over the ledger.
        ``data`` must not change meanwhile (a fresh parse of the stored text)."""
        projection = cls.__new__(cls)
        projection.upcast = upcast
        # _restore_state, inlined: this runs on every load from a snapshot
        count, scoped, status = data["count"], data.get("scoped_states", UNSET_SCOPES), data["status"]
        projection.count = count if type(count) is int and count >= 0 else _count(count)
        state = data["session_state"]
        projection.session_state = state if type(state) is dict else dict(state)  # a fresh parse: its own dict
        empty = type(scoped) is dict and not scoped
        projection.scoped_states = {} if empty else {str(k): dict(v) for k, v in scoped.items()}
        if type(status) is not str:
            raise InputError(f"a snapshot's status is a string, not {status!r}", field="snapshot")
        projection.status = status  # type: ignore[assignment]
        projection._deferred = (data, rebuild)
        return projection

    def __getattr__(self, name: str) -> Any:
        """A field a resumed projection has not read yet (``resume``): the rest is read now, once."""
        if name in _DEFERRED and self._deferred is not None:
            self._fill()
            return getattr(self, name)
        raise AttributeError(name)

    def _fill(self) -> None:
        deferred, self._deferred = self._deferred, None
        if deferred is None:
            return
        data, rebuild = deferred
        try:
            rest = _restore_rest(data)
        except (InputError, ValueError, TypeError, KeyError, AttributeError):
            _log.warning("a snapshot's fold does not parse: replaying the ledger instead", exc_info=True)
            rebuilt = rebuild()
            rest = {name: getattr(rebuilt, name) for name in _DEFERRED}
        for name, value in rest.items():
            setattr(self, name, value)


def _restore_state(projection: Projection, data: dict[str, Any]) -> None:
    """The count, the scopes' values and the status from ``export()``'s output (what a state read needs)."""
    count = data["count"]
    projection.count = count if type(count) is int and count >= 0 else _count(count)
    projection.session_state = dict(data["session_state"])
    scoped = data.get("scoped_states", UNSET_SCOPES)
    empty = type(scoped) is dict and not scoped
    projection.scoped_states = {} if empty else {str(k): dict(v) for k, v in scoped.items()}
    status = data["status"]
    if type(status) is not str:
        raise InputError(f"a snapshot's status is a string, not {status!r}", field="snapshot")
    projection.status = status  # type: ignore[assignment]


UNSET: dict[str, Any] = {
    "scoped_states": {},
    "current_agent_name": None,
    "output": [None, None],
    "invocations": [],
    "open_invocation": None,
    "deadline": None,
    "open_calls": [],
    "pending": [],
    "answered": [],
    "recent_invocations": [],
}
"""``export()``'s fields at their values in a fresh projection: a snapshot (format 2) leaves them out, so a load
parses and builds less; ``restore`` and ``resume`` read an absent one as this (never mutated: copied on use)."""
UNSET_SCOPES: dict[str, Any] = {}


def _restore_rest(data: dict[str, Any]) -> dict[str, Any]:
    """The other fields of ``export()``'s output, checked: name -> value (one left out: ``UNSET``'s)."""
    text, value = data.get("output", (None, None))
    deadline = data.get("deadline")  # absent from snapshots written before deadlines
    recent = data["recent_turns"]
    if isinstance(recent, str):  # a snapshot's (format 2): one string of counts
        recent = [int(i) for i in recent.split()]
    if not all(type(i) is int and i >= 0 for i in recent):  # bools and negatives: _count says which
        recent = [_count(i) for i in recent]
    return {
        "current_agent_name": data.get("current_agent_name"),
        "output": Output(text, value),
        "invocations": {
            row[0]: InvocationNode(row[0], row[1], row[2], _count(row[3]), row[4], _count(row[5]), _principal(row[6:]))
            for row in data.get("invocations", ())
        },
        "open_invocation": data.get("open_invocation"),
        "deadline": None if deadline is None else _count(deadline),
        "open_calls": {e.call_id: e for e in _events(data.get("open_calls", []), ToolCallEvent)},
        "pending": {row[0]: YieldedTool(row[0], row[1], dict(row[2]), row[3]) for row in data.get("pending", ())},
        "answered": {e.call_id: e for e in _events(data.get("answered", []), ToolInputEvent)},
        "user_turns": _count(data["user_turns"]),
        "recent_turns": list(recent),
        # absent from snapshots written before it: a retry then finds only what the tail folds
        "recent_invocations": {str(row[0]): _count(row[1]) for row in data.get("recent_invocations", ())},
    }


def _events(rows: list[Any], kind: type[_E]) -> list[_E]:
    events = [parse_event(row) for row in rows]
    if not all(isinstance(event, kind) for event in events):
        raise InputError(f"a snapshot's calls are {kind.__name__} events", field="snapshot")
    return events  # type: ignore[return-value]


def _principal(rest: list[Any]) -> str | None:
    principal = rest[0] if rest else None
    if principal is not None and not isinstance(principal, str):
        raise InputError(f"a snapshot's principals are strings, not {principal!r}", field="snapshot")
    return principal


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"a snapshot's positions are counts, not {value!r}", field="snapshot")
    return value
