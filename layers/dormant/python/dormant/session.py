"""A session: an append-only ledger of events, and the state derived from it.

Appending an event folds it into the session's ``Projection`` once, so reading state never replays the
ledger; ``state_at`` replays a prefix into a fresh projection. State writes are validated by the
app's schema and become ``state_change`` events; nothing else changes state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, overload

from .errors import (
    ConfigurationError,
    EventIndexError,
    EventValidationError,
    InputError,
    ScopeNotBound,
    TempOutsideInvocation,
    UnknownCallId,
    UnknownEventId,
    UnknownScope,
    UnknownStateKey,
)
from .events import (
    Event,
    StateChange,
    StateChangeEvent,
    StateSource,
    ToolInputEvent,
    UserEvent,
)
from .ids import check_id, new_id, now_ms
from .models.base import Message
from .projection import Output, Projection, SessionStatus, StateSnapshot, YieldedTool
from .state.schema import APP_SCOPE_ID, SHARED_SCOPES, Schema, ScopeSchema
from .state.values import json_copy, json_equal
from .state.view import ScopeView, StateView
from .stores.base import ScopedStateChange, SessionStore, StoredSession

if TYPE_CHECKING:
    from .agents.tools import Tool

__all__ = ["Invocation", "Runtime", "Session", "SessionInput"]


class Runtime(Protocol):
    """What a session needs from its app."""

    name: str
    schema: Schema
    store: SessionStore

    def tool_named(self, name: str) -> Tool | None: ...


class Invocation:
    """One run of an agent inside a session: its id, its ``temp`` values, what it read from shared scopes."""

    def __init__(self, session: Session, invocation_id: str, agent_name: str) -> None:
        self.session = session
        self.id = invocation_id
        self.agent_name = agent_name
        self.temp: dict[str, Any] = {}
        self._store_values: dict[str, dict[str, Any]] = {}
        self.checked: dict[str, set[str]] = {}
        self.state = StateView(Access(session, self))

    def store_values(self, scope: str, scope_id: str) -> dict[str, Any]:
        """The shared scope as stored (loaded once per invocation), under this session's uncommitted writes."""
        session = self.session
        if scope not in self._store_values:
            self._store_values[scope] = session._runtime.store.load_scoped_state(session.app_name, scope, scope_id)
        values = dict(self._store_values[scope])
        for change in session.scoped_changes():
            if change.scope == scope and change.scope_id == scope_id:
                if change.value is None:
                    values.pop(change.key, None)
                else:
                    values[change.key] = change.value
        return values


class Access:
    """Reads and writes state for one writer: the outside world (``direct``) or an invocation (``mutation``)."""

    __slots__ = ("invocation", "session")

    def __init__(self, session: Session, invocation: Invocation | None) -> None:
        self.session = session
        self.invocation = invocation

    def scope_view(self, scope: str) -> ScopeView:
        self.session._scope_schema(scope)
        if scope == "temp":
            self._require_invocation()
        return ScopeView(self, scope)

    def read(self, scope: str, key: str) -> Any:
        schema = self.session._scope_schema(scope)
        if not schema.open and not schema.declares(key):
            raise UnknownStateKey(scope, key, list(schema.model.model_fields) if schema.model else [])
        if scope == "temp":
            return schema.read(key, self._require_invocation().temp.get(key))
        self._observe(scope, (key,))
        return schema.read(key, self.session._values(scope).get(key))

    def values(self, scope: str, *, copy: bool = False) -> dict[str, Any]:
        self.session._scope_schema(scope)
        if scope == "temp":
            values = self._require_invocation().temp
        else:
            scope_id = self.session.scope_id(scope) if scope != "session" else None
            if self.invocation is not None and scope_id is not None:
                stored = self.invocation.store_values(scope, scope_id)
                self._observe(scope, (*stored, *self.session._values(scope)))
            values = self.session._values(scope)
        return json_copy(values) if copy else values

    def write(self, scope: str, changes: Mapping[str, Any]) -> None:
        session = self.session
        session._scope_schema(scope)
        invocation = self.invocation
        if scope == "temp":
            work = self.check(scope, changes)
            temp = self._require_invocation().temp
            temp.clear()
            temp.update(work)
            return
        scope_id = session.scope_id(scope) if scope != "session" else None
        if scope != "session" and invocation is not None and scope_id is None:
            raise ScopeNotBound(scope)
        work = self.check(scope, changes)  # every key validated before any is recorded
        self._observe(scope, tuple(changes))
        current = session._values(scope)
        source: StateSource = "direct" if invocation is None else "mutation"
        for key in changes:
            old, new = current.get(key), work.get(key)
            if not json_equal(old, new):
                session._append(self._change(scope, scope_id, source, key, old, new))

    def check(self, scope: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Validate a write without recording it; return the scope's values as they would be after it."""
        schema = self.session._scope_schema(scope)
        work = dict(self._require_invocation().temp if scope == "temp" else self.session._values(scope))
        for key, value in changes.items():
            self._stage(schema, work, key, value)
        return work

    @staticmethod
    def _stage(schema: ScopeSchema, work: dict[str, Any], key: str, value: Any) -> None:
        if not isinstance(key, str) or not key:
            raise InputError(f"state keys are non-empty strings, not {key!r}", field=f"state.{schema.name}")
        if value is None:
            work.pop(key, None)
        else:
            work[key] = schema.validate(work, key, value)
            if work[key] is None:
                work.pop(key)

    def _observe(self, scope: str, keys: Iterable[str]) -> None:
        """Inside an invocation, record the stored value of a bound shared scope's key when it moved."""
        invocation = self.invocation
        if invocation is None or scope in ("session", "temp"):
            return
        scope_id = self.session.scope_id(scope)
        if scope_id is None:
            return
        checked = invocation.checked.setdefault(scope, set())
        stored = None
        for key in keys:
            if key in checked:
                continue
            checked.add(key)
            if stored is None:
                stored = invocation.store_values(scope, scope_id)
            seen, actual = self.session._values(scope).get(key), stored.get(key)
            if not json_equal(seen, actual):
                self.session._append(self._change(scope, scope_id, "observation", key, seen, actual))

    def _change(
        self, scope: str, scope_id: str | None, source: StateSource, key: str, old: Any, new: Any
    ) -> StateChangeEvent:
        invocation = self.invocation
        return StateChangeEvent(
            scope=scope,
            scope_id=scope_id,
            source=source,
            changes=[StateChange(key=key, old_value=json_copy(old), new_value=json_copy(new))],
            invocation_id=invocation.id if invocation else None,
            agent_name=invocation.agent_name if invocation else None,
        )

    def _require_invocation(self) -> Invocation:
        if self.invocation is None:
            raise TempOutsideInvocation()
        return self.invocation


class EventLog(Sequence[Event]):
    """A read-only view of the ledger (append through the session, never here)."""

    __slots__ = ("_events",)

    def __init__(self, events: list[Event]) -> None:
        self._events = events

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...
    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        return self._events[index]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventLog):
            return self._events == other._events
        if isinstance(other, list | tuple):
            return self._events == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self._events)} events>"


class Session:
    """A conversation's ledger with its derived state. Build one with ``app.sessions``."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        session_id: str | None = None,
        scopes: Mapping[str, str] | None = None,
        version: int = 0,
        created_at: int | None = None,
        events: Iterable[Event] = (),
        committed: int | None = None,
    ) -> None:
        self._runtime = runtime
        self.id = check_id(session_id) if session_id is not None else new_id("s_")
        self.app_name = runtime.name
        self.scopes = _check_scopes(scopes, runtime.schema)
        self.version = version
        self.created_at = created_at if created_at is not None else now_ms()
        self._events: list[Event] = []
        self._index: dict[str, int] = {}
        self._projection = Projection()
        for event in events:
            self._append(event)
        self._committed = len(self._events) if committed is None else committed
        self.input = SessionInput(self)
        self.state = StateView(Access(self, None))

    # -- the ledger -------------------------------------------------------------------------

    @property
    def events(self) -> EventLog:
        return EventLog(self._events)

    def _append(self, event: Event) -> Event:
        if event.id in self._index:
            raise EventValidationError(f"event id {event.id!r} is already in this session's ledger", field="id")
        self._index[event.id] = len(self._events)
        self._events.append(event)
        self._projection.apply(event)
        return event

    def event_index_of(self, event_id: str) -> int:
        try:
            return self._index[event_id]
        except KeyError:
            raise UnknownEventId(event_id) from None

    # -- derived state ----------------------------------------------------------------------

    @property
    def status(self) -> SessionStatus:
        return self._projection.status

    @property
    def yielded_tools(self) -> list[YieldedTool]:
        return self._projection.yielded_tools

    @property
    def output(self) -> Output:
        return self._projection.output

    @property
    def current_agent_name(self) -> str | None:
        return self._projection.current_agent_name

    def scope_id(self, scope: str) -> str | None:
        """The id a shared scope is bound to in this session (``app`` is always bound)."""
        if scope == "app":
            return APP_SCOPE_ID
        return self.scopes.get(scope)

    def _values(self, scope: str) -> dict[str, Any]:
        projection = self._projection
        if scope == "session":
            return projection.session_state
        return projection.scoped_states.get(scope) or {}

    def _scope_schema(self, scope: str) -> ScopeSchema:
        schema = self._runtime.schema
        if scope not in schema:
            raise UnknownScope(scope)
        return schema[scope]

    # -- time travel ------------------------------------------------------------------------

    def _position(self, index: int) -> int:
        length = len(self._events)
        if not isinstance(index, int) or isinstance(index, bool):
            raise InputError(f"an event index is an int, not {type(index).__name__}", field="index")
        position = index + length if index < 0 else index
        if not 0 <= position < length:
            raise EventIndexError(index, length)
        return position

    def state_at(self, index: int) -> StateSnapshot:
        """The session as it stood after event ``index`` (inclusive), replayed from the ledger."""
        position = self._position(index)
        projection = Projection()
        for event in self._events[: position + 1]:
            projection.apply(event)
        return projection.snapshot()

    def fork_at(self, index: int) -> Session:
        """A new session (new id, not stored until committed) holding copies of events ``0..index``."""
        position = self._position(index)
        return Session(
            self._runtime,
            scopes=self.scopes,
            events=[event.model_copy(deep=True) for event in self._events[: position + 1]],
            committed=0,
        )

    def model_input(self, index: int) -> list[Message]:
        """The messages the model was sent at the ``model_start`` event at ``index``, rebuilt from the ledger."""
        from .agents.context import rebuild_input

        return rebuild_input(self, self._position(index))

    # -- persistence bookkeeping ------------------------------------------------------------

    @property
    def uncommitted_events(self) -> list[Event]:
        return self._events[self._committed :]

    def scoped_changes(self) -> list[ScopedStateChange]:
        """The shared-scope writes of the uncommitted events, one per key (the last write wins)."""
        latest: dict[tuple[str, str, str], Any] = {}
        for event in self._events[self._committed :]:
            if isinstance(event, StateChangeEvent) and event.source != "observation" and event.scope != "session":
                scope_id = self.scope_id(event.scope) if event.scope_id is None else event.scope_id
                if scope_id is None:
                    continue  # seeded while unbound: it lives in this ledger only
                for change in event.changes:
                    latest[(event.scope, scope_id, change.key)] = change.new_value
        return [ScopedStateChange(scope, scope_id, key, value) for (scope, scope_id, key), value in latest.items()]

    def stored(self) -> StoredSession:
        """This session's metadata row."""
        return StoredSession(
            id=self.id,
            app_name=self.app_name,
            version=self.version,
            scopes=dict(self.scopes),
            created_at=self.created_at,
            status=self.status,
        )

    def _mark_committed(self, version: int) -> None:
        self.version = version
        self._committed = len(self._events)

    def _reset(self, events: Iterable[Event], version: int) -> None:
        """Replace the ledger with ``events``, all of them stored at ``version`` (after a merge)."""
        self._events, self._index, self._projection = [], {}, Projection()
        for event in events:
            self._append(event)
        self._mark_committed(version)

    @property
    def committed_events(self) -> list[Event]:
        """The events this session knows to be stored."""
        return self._events[: self._committed]

    def __repr__(self) -> str:
        return (
            f"<Session {self.id} app={self.app_name!r} version={self.version} "
            f"events={len(self._events)} status={self.status!r}>"
        )


class SessionInput:
    """Input from outside an invocation: answers to yielded tool calls, and user messages."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def tool(self, call_id: str, input: Any) -> ToolInputEvent:
        """Answer a yielded call; the answer is validated against the tool's ``yield_schema`` first."""
        return self.tools([{"call_id": call_id, "input": input}])[0]

    def tools(self, answers: Sequence[Mapping[str, Any]]) -> list[ToolInputEvent]:
        """Answer several yielded calls at once: all are checked before any is recorded."""
        events = self.prepare(answers)
        for event in events:
            self._session._append(event)
        return events

    def prepare(self, answers: Sequence[Mapping[str, Any]]) -> list[ToolInputEvent]:
        """Check answers and build their events without recording them."""
        session = self._session
        if isinstance(answers, str | bytes) or not isinstance(answers, Sequence):
            raise InputError("tools is a list of {'call_id': ..., 'input': ...}", field="tools")
        pending = session._projection.pending
        events: list[ToolInputEvent] = []
        seen: set[str] = set()
        for position, answer in enumerate(answers):
            if not isinstance(answer, Mapping) or "call_id" not in answer:
                raise InputError("each tool answer is {'call_id': ..., 'input': ...}", field=f"tools.{position}")
            call_id = answer["call_id"]
            call = pending.get(call_id) if isinstance(call_id, str) else None
            if call is None or call_id in seen:
                raise UnknownCallId(str(call_id), [c for c in pending if c not in seen])
            seen.add(call_id)
            tool = session._runtime.tool_named(call.name)
            if tool is None:
                raise ConfigurationError(
                    f"tool {call.name!r} is not registered with app {session.app_name!r}: "
                    "define it (app.tool) in this process before answering its calls"
                )
            value = tool.check_input(call_id, answer.get("input"))
            events.append(
                ToolInputEvent(
                    call_id=call_id,
                    name=call.name,
                    input=value,
                    invocation_id=call.invocation_id,
                    agent_name=session.current_agent_name,
                )
            )
        return events

    def message(self, text: str) -> UserEvent:
        """Append a user message; the next run sees it."""
        if not isinstance(text, str):
            raise InputError(f"a message is a string, not {type(text).__name__}", field="message")
        event = UserEvent(text=text)
        self._session._append(event)
        return event


def _check_scopes(scopes: Mapping[str, str] | None, schema: Schema) -> dict[str, str]:
    bound: dict[str, str] = {}
    for scope, scope_id in (scopes or {}).items():
        if scope not in SHARED_SCOPES or scope == "app":
            raise InputError(
                f"scopes binds shared scopes ({', '.join(s for s in SHARED_SCOPES if s != 'app')}), not {scope!r}",
                field=f"scopes.{scope}",
            )
        if scope not in schema:
            raise UnknownScope(scope)
        bound[scope] = check_id(scope_id, f"{scope} id")
    return bound
