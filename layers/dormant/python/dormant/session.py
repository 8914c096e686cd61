"""A session: an append-only ledger of events, and the state derived from it.

Why one module: ``Session`` is the one object a run, a commit and a state read share; what is left here is its
ledger (append, fold, fork, time travel) and the state host, which read the same fields on every call.

Appending an event folds it into the session's ``Projection`` once, so reading state never replays the
ledger; ``state_at`` replays a prefix into a fresh projection. State writes are validated by the
app's schema and become ``state_change`` events; nothing else changes state.

A session loaded from a snapshot (``dormant.snapshots``) holds only the tail of its ledger: its
projection comes from the snapshot, and the events before the tail are fetched from the store the
first time something reads them (``events`` iterated or indexed there, ``state_at``, ``fork_at``,
``model_input``, ``event_index_of`` of an older id). Everything a turn needs — state, status, yielded
tools, runs, commits — works on the tail alone. That loading is ``dormant.lazy_ledger`` (``LazyLedger``, which
``Session`` is, and ``EventLog``); the commit bookkeeping is ``dormant.committed`` (``CommittedLedger``); input
from outside a run is ``dormant.session_input``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from .clock import now_ms
from .committed import CommittedLedger
from .errors import (
    EventIndexError,
    EventValidationError,
    InputError,
    ScopeNotBound,
    UnknownEventId,
    UnknownScope,
)
from .events import Event, InvocationYieldEvent, SessionForkedEvent, StateChangeEvent
from .ids import check_id, new_id
from .lazy_ledger import _FIRST_ANCHORS, EventLog
from .ledger import AnswerCheck, LedgerRules
from .models.base import Message
from .people import Caller
from .projection import Output, Projection, SessionStatus, StateSnapshot, YieldedTool
from .session_input import SessionInput
from .state.access import Access, Invocation
from .state.schema import APP_SCOPE_ID, SHARED_SCOPES, Schema, ScopeSchema
from .state.values import check_storable
from .state.view import StateView
from .stores.base import ScopedStateChange, SessionStore, StoredSession
from .transcript import rebuild_input, rebuild_tools

__all__ = ["AnswerCheck", "EventLog", "Runtime", "Session", "SessionInput"]

_new = object.__new__
_setattr = object.__setattr__


class Runtime(Protocol):
    """What a session needs from its app."""

    name: str
    schema: Schema
    store: SessionStore
    retention_ms: int | None

    def tool_named(self, name: str) -> AnswerCheck | None: ...


class Session(CommittedLedger):
    """A conversation's ledger with its derived state. Build one with ``app.sessions``.

    The ledger API (``append``, ``projection``, ``mark_committed``, ``replace_ledger``) is what the run
    loop and the commit paths build on; an application reads ``state``, ``events`` and ``status``,
    writes through ``state`` and ``input``, and leaves appending to ``app.run``.
    """

    _runtime: Runtime

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
        forked_from: str | None = None,
        fork_reason: str | None = None,
    ) -> None:
        self._runtime = runtime
        self.id = check_id(session_id) if session_id is not None else new_id("s_")
        self.app_name = runtime.name
        self.scopes = _check_scopes(scopes, runtime.schema)
        self.version = version
        self.created_at = created_at if created_at is not None else now_ms()
        self.updated_at = self.created_at
        """When the stored row last changed, as this session knows it: retention counts from there."""
        self.forked_from = forked_from
        """For a fork: the session it was copied from (its ledger ends with a ``session_forked`` event)."""
        self.fork_reason = fork_reason
        self._events: list[Event] = []
        """The ledger from position ``_base`` on (the whole of it unless loaded from a snapshot)."""
        self._base = 0
        self._index: dict[str, int] = {}
        """Event id -> ledger position, for the events held."""
        self._anchors: list[tuple[int, int]] = [(0, 0)]
        """Known (stored version, events stored up to it), ascending: ``load(after=version)`` starts there."""
        self._unchecked: list[Any] = []
        """Pairs noted since ``_anchors`` was last built (a snapshot's as stored, a string of them in its format 2:
        ``"version,count version,count"``): checked and merged on first use."""
        self._projection = Projection(runtime.schema.upcaster)
        self._rules: LedgerRules | None = None
        """What may be appended next (``dormant.ledger``), built from the projection on the first append."""
        # Shared-scope writes not yet committed, kept as they are appended: (scope, scope id) -> key -> value.
        self._writes: dict[tuple[str, str], dict[str, Any]] = {}
        self._hold(events)  # a load builds here: each event held and folded once, writes tracked below
        self._committed = len(self._events) if committed is None else committed
        """Events known to be stored (a count from the start of the ledger)."""
        self.snapshot_at = self._committed
        """Events covered by the latest snapshot this session knows of (``dormant.snapshots`` keeps it)."""
        for event in self._events[self._committed :]:
            self._track_write(event)

    # The views below hold the session; the session holds none of them. Were they kept on it, each session would
    # sit in a reference cycle that only the garbage collector frees: a process loading sessions to read a value
    # would run a collection every few dozen loads. They hold nothing of their own, so a fresh one each time is
    # the same one.

    @property
    def access(self) -> Access:
        """The state rules for writes from outside an invocation (``state`` goes through it)."""
        return Access(self, None)

    @property
    def state(self) -> StateView:
        """The session's state: session keys as attributes, shared scopes and ``temp`` below (``state.user.name``)."""
        access = _new(Access)  # Access(self, None) and StateView(access) with no Python call: a state read on a
        access.host, access.invocation, access.call = self, None, None  # fresh load costs little more than these
        view = _new(StateView)
        _setattr(view, "_access", access)
        _setattr(view, "_scope", "session")
        return view

    # -- the session as the state rules see it (``dormant.state.access.StateHost``) ----------------------------
    # On the session itself, not on an object of its own: every state read asks these, and a read of a freshly
    # loaded session is mostly what it builds and calls.

    def scope_schema(self, scope: str) -> ScopeSchema:
        """The app's schema of ``scope`` (``UnknownScope`` for one it does not declare)."""
        try:
            return self._runtime.schema.scopes[scope]
        except KeyError:
            raise UnknownScope(scope) from None

    def scope_values(self, scope: str) -> Mapping[str, Any]:
        """``scope``'s values as the ledger folds them (read them, never change them)."""
        if scope == "session":
            return self._projection.session_state
        return self._projection.scoped_states.get(scope) or {}

    def load_scope(self, scope: str, scope_id: str) -> dict[str, Any]:
        """The shared scope as the store holds it, in the current model's shape."""
        stored = self._runtime.store.load_scoped_state(self.app_name, scope, scope_id)
        return self.scope_schema(scope).from_store(stored)

    def uncommitted_writes(self, scope: str, scope_id: str) -> Mapping[str, Any]:
        """This ledger's writes to a shared scope not committed yet, key -> value (``None``: deleted)."""
        return self._writes.get((scope, scope_id)) or {}

    @property
    def input(self) -> SessionInput:
        """Input from outside an invocation: answers to yielded calls, and user messages."""
        return SessionInput(self)

    @property
    def runtime(self) -> Runtime:
        """The app this session belongs to."""
        return self._runtime

    # -- the ledger -------------------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        runtime: Runtime,
        row: StoredSession,
        projection: Projection,
        events: Sequence[Event],
        *,
        base: int,
        anchors: Iterable[Any] = (),
    ) -> Session:
        """A stored session from a folded ``projection`` and the ledger from position ``base`` on.

        The first ``projection.count - base`` of ``events`` are already folded into ``projection``; the
        rest are folded now. ``anchors`` are known (version, event count) pairs of the stored ledger, as a
        snapshot stored them: checked when first needed (a pair that is not two counts is dropped, and the
        earlier ledger is then read from an earlier anchor). Built by ``dormant.snapshots`` for every load
        from a snapshot, so it sets the fields directly: the row is the store's, checked when written (its
        scopes are checked again: the schema may have changed since); the events before ``base`` are
        fetched when first read.
        """
        folded = projection.count - base
        if base < 0 or not 0 <= folded <= len(events):
            raise InputError("restore: the events must start at or before the projection's end", field="base")
        schema = runtime.schema
        session = cls.__new__(cls)
        session._runtime = runtime
        session.id = row.id
        session.app_name = runtime.name
        session.scopes = _check_scopes(row.scopes, schema) if row.scopes else {}
        session.version = row.version
        session.created_at = row.created_at
        session.updated_at = row.updated_at
        session.forked_from = row.forked_from
        session.fork_reason = row.fork_reason
        session._base = base
        session._projection, session._rules = projection, None
        held = session._events = list(events[:folded]) if folded else []
        session._index = {event.id: base + n for n, event in enumerate(held)} if held else {}
        session._anchors = _FIRST_ANCHORS  # replaced, never changed in place (_known_anchors)
        session._unchecked = anchors if type(anchors) is list else list(anchors)  # a load's own list: taken
        session._writes = {}
        session.snapshot_at = projection.count
        if folded < len(events):
            session._hold(events[folded:])  # stored: folded as they are, never refused (a load must load)
        session.version = row.version  # all of it stored, at the row's version (mark_committed, inlined)
        session._committed = committed = base + len(session._events)
        session._unchecked.append((row.version, committed))
        return session

    @classmethod
    def from_row(cls, runtime: Runtime, row: StoredSession, events: Iterable[Event] = ()) -> Session:
        """A stored session: ``row``'s id, scopes, version and fork fields, with ``events``, all committed."""
        session = cls(
            runtime,
            session_id=row.id,
            scopes=row.scopes,
            version=row.version,
            created_at=row.created_at,
            events=events,
            forked_from=row.forked_from,
            fork_reason=row.fork_reason,
        )
        session.updated_at = row.updated_at
        session.mark_committed(row.version)
        return session

    def append(self, event: Event) -> Event:
        """Add ``event`` to the ledger and fold it into the projection (once: reads never replay).

        This is the one way events get in; ``app.run`` and ``input`` call it. An id already in the
        ledger is refused, and so is an event the ledger rules (``dormant.ledger``) do not allow where it
        would stand (the error names ``events.<n>``, ``n`` counting the uncommitted events): what no run
        could record, no commit stores. The event is not checked for text no store can keep (inputs are
        checked where they enter); the store's encoder refuses it at commit with ``ValueNotStorable``.
        """
        if self._rules is None:
            self._rules = self.rules(checks=False)
        self._rules.check(event, self._base + len(self._events) - self._committed)
        self._hold((event,))
        self._track_write(event)
        return event

    def _hold(self, events: Iterable[Event]) -> None:
        """Index, keep and fold ``events`` (one loop: a load of 10,000 events runs it 10,000 times)."""
        index, held, fold, base = self._index, self._events, self._projection.apply, self._base
        for event in events:
            if event.id in index:
                raise EventValidationError(f"event id {event.id!r} is already in this session's ledger", field="id")
            index[event.id] = base + len(held)
            held.append(event)
            fold(event)

    def _track_write(self, event: Event) -> None:
        if isinstance(event, StateChangeEvent) and event.source != "observation" and event.scope != "session":
            scope_id = self.scope_id(event.scope) if event.scope_id is None else event.scope_id
            if scope_id is None:
                return  # seeded while unbound: it lives in this ledger only
            writes = self._writes.setdefault((event.scope, scope_id), {})
            for change in event.changes:
                writes[change.key] = change.new_value

    def event_index_of(self, event_id: str) -> int:
        """The ledger position of ``event_id`` (an id older than a snapshot's tail fetches the ledger)."""
        if event_id not in self._index:
            self._fetch_from(0)
        try:
            return self._index[event_id]
        except KeyError:
            raise UnknownEventId(event_id) from None

    def turn_window(self, turns: int | None) -> Sequence[Event]:
        """The events ``history(turns=)`` renders from: the last ``turns`` user turns, or the whole ledger.

        From the ``turns``-th last user message on when there are more user messages than that (rendering
        those gives what rendering the whole ledger with the same window gives); otherwise, and for
        ``None``, the whole ledger. On a session loaded from a snapshot, what the tail lacks is fetched.
        """
        projection = self._projection
        if turns is None or projection.user_turns <= turns or turns > len(projection.recent_turns):
            return self.events[:]
        return self.events[projection.recent_turns[-turns] :]

    @property
    def projection(self) -> Projection:
        """The ledger folded so far: read it, never change it (only ``append`` moves it)."""
        return self._projection

    def invocation(
        self, invocation_id: str, agent_name: str, *, stored: dict[str, dict[str, Any]] | None = None
    ) -> Invocation:
        """The state rules for one invocation of ``agent_name`` (its ``temp``, its reads of shared scopes).

        ``stored`` caches the shared scopes as stored (scope -> values) for the run.
        """
        return Invocation(self, invocation_id, agent_name, stored)

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

    def check_bound(self, scope: str, scope_id: str, field: str) -> None:
        """Refuse a shared-scope write under an id this session is not bound to (``ScopeNotBound`` naming
        ``field``): a run could not make it, so no commit, whoever assembled it, stores it."""
        if scope_id != self.scope_id(scope):
            raise ScopeNotBound(scope, scope_id=scope_id, field=field)

    def check_writes(self) -> None:
        """``check_bound`` for each uncommitted state change that names its scope id; ``field`` is
        ``events.<n>.scope_id``, ``n`` counting the uncommitted events."""
        for position, event in enumerate(self.uncommitted_events):
            if isinstance(event, StateChangeEvent) and event.scope != "session" and event.scope_id is not None:
                self.check_bound(event.scope, event.scope_id, f"events.{position}.scope_id")

    def rules(self, *, field: str = "events", checks: bool = True, caller: Caller | None = None) -> LedgerRules:
        """The ledger rules (``dormant.ledger``) from where this ledger stands now, for events to append.

        ``checks``: besides the order, check answers against their tool's ``yield_schema`` (as ``input``
        does), and state changes against their scope's schema and binding (as the state rules do): for
        events from outside. ``append`` checks the order alone: what a run appends went through those
        rules already, and a commit checks the bindings (``check_writes``). It lets a message follow calls
        with no result that do not wait: the run loop writes one there when a turn was cut between a yielding
        call and its yield. ``caller``: who hands the events over (``LedgerRules``)."""
        return LedgerRules(
            self._runtime.schema,
            self._projection,
            session_id=self.id,
            tool_named=self._runtime.tool_named if checks else None,
            scope_id=self.scope_id if checks else None,
            field=field,
            state=checks,
            results_before_messages=checks,
            caller=caller,
            answers_by=self._runtime.tool_named,  # who may answer is checked on every append, checks or not
        )

    def check_scoped_changes(
        self, changes: Sequence[ScopedStateChange], *, field: str = "scoped_changes"
    ) -> list[ScopedStateChange]:
        """Shared-scope writes a caller names (a remote runner's commit), checked as a run's writes are: each
        under the id this session is bound to (``ScopeNotBound``), in a scope the schema declares
        (``UnknownScope``), by the scope's key rules and model (``ScopeSchema.check_write``). Errors name
        ``{field}.N.scope_id``, ``.scope``, ``.key`` or ``.value``. Returns them as stored (JSON form, tagged
        with the scope's version when it has migrations). Nothing is written either way."""
        schema = self._runtime.schema
        values: dict[str, dict[str, Any]] = {}
        checked: list[ScopedStateChange] = []
        for position, change in enumerate(changes):
            where = f"{field}.{position}"
            if change.scope not in schema:  # first: an unknown scope is no unbound id
                raise UnknownScope(change.scope, field=f"{where}.scope")
            self.check_bound(change.scope, change.scope_id, f"{where}.scope_id")
            scope = schema[change.scope]
            current = values.setdefault(change.scope, dict(self._projection.scoped_states.get(change.scope) or {}))
            value = scope.check_write(
                current, change.key, change.value, key_field=f"{where}.key", value_field=f"{where}.value"
            )
            if value is None:
                current.pop(change.key, None)
            else:
                current[change.key] = value
            checked.append(ScopedStateChange(change.scope, change.scope_id, change.key, scope.stored_form(value)))
        return checked

    # -- time travel ------------------------------------------------------------------------

    def _position(self, index: int) -> int:
        length = self._base + len(self._events)
        if not isinstance(index, int) or isinstance(index, bool):
            raise InputError(f"an event index is an int, not {type(index).__name__}", field="index")
        position = index + length if index < 0 else index
        if not 0 <= position < length:
            raise EventIndexError(index, length)
        return position

    def state_at(self, index: int) -> StateSnapshot:
        """The session as it stood after event ``index`` (inclusive), replayed from the ledger (fetched
        first on a session loaded from a snapshot)."""
        position = self._position(index)
        self._fetch_from(0)
        projection = Projection(self._runtime.schema.upcaster)
        for event in self._events[: position + 1]:
            projection.apply(event)
        return projection.snapshot()

    def fork_at(self, index: int, *, reason: str = "fork_at", principal: str | None = None) -> Session:
        """A new session (new id, not stored until committed): copies of events ``0..index``, then a
        ``session_forked`` event saying where it came from and ``reason``. Cut inside a running invocation,
        the copy is paused there (an ``invocation_yield`` waiting for nothing before ``session_forked``): it
        is ``resumable``, and a message or a run continues it, running the calls that had no result.

        On a session loaded from a snapshot the earlier ledger is fetched first. ``principal``: who forks it
        (recorded on the ``session_forked`` event)."""
        position = self._position(index)
        self._fetch_from(0)
        if not isinstance(reason, str) or not reason:
            raise InputError("a fork's reason is a non-empty string", field="reason")
        check_storable(reason, "reason")
        copied = [e.model_copy(deep=True) for e in self._events[: position + 1]]
        replayed = Projection(self._runtime.schema.upcaster)
        for event in copied:
            replayed.apply(event)
        if replayed.status == "running" and replayed.open_invocation is not None:
            # Taken inside a running invocation: no runner goes on with the copy, so it is paused where it was
            # cut (a yield waiting for nothing: ``resumable``), for a message or a run to continue it.
            node = replayed.invocations.get(replayed.open_invocation)
            agent_name = node.agent_name if node is not None else None
            copied.append(
                InvocationYieldEvent(invocation_id=replayed.open_invocation, pending=[], agent_name=agent_name)
            )
        return self._fork(self._events[position].id, reason, copied, principal)

    def fork(self, reason: str) -> Session:
        """A new session holding this whole ledger, stored or not (a run that could not join its session).

        ``at_event_id`` on its ``session_forked`` event is the last event known to be stored. On a session
        loaded from a snapshot the earlier ledger is fetched first.
        """
        self._fetch_from(0)
        at = self._events[self._committed - 1].id if self._committed else None
        return self._fork(at, reason, list(self._events))

    def _fork(self, at_event_id: str | None, reason: str, events: list[Event], principal: str | None = None) -> Session:
        fork = Session(
            self._runtime, scopes=self.scopes, events=events, committed=0, forked_from=self.id, fork_reason=reason
        )
        fork.append(
            SessionForkedEvent(from_session_id=self.id, at_event_id=at_event_id, reason=reason, principal=principal)
        )
        return fork

    def model_input(self, index: int) -> list[Message]:
        """The messages the model was sent at the ``model_start`` event at ``index``, rebuilt from the ledger
        (fetched first on a session loaded from a snapshot)."""
        position = self._position(index)
        self._fetch_from(0)
        return rebuild_input(self._events, position, self.event_index_of)

    def model_tools(self, index: int) -> list[dict[str, Any]]:
        """The tool definitions the model was sent at the ``model_start`` event at ``index`` (a later call of an
        invocation holds them by reference to its first: ``ModelStartEvent.tools_as_in``)."""
        position = self._position(index)
        self._fetch_from(0)
        return rebuild_tools(self._events, position, self.event_index_of)

    # -- persistence bookkeeping (the rest is ``CommittedLedger``) -----------------------------

    def replace_ledger(self, merged: Session) -> None:
        """Take over ``merged``'s ledger, all of it stored: this session's run rebased onto what landed.

        ``merged`` is already folded, so nothing is replayed; it must be this session, rebuilt.
        """
        if merged.id != self.id or merged._runtime is not self._runtime:
            raise InputError("replace_ledger takes this session rebuilt (same id, same app)", field="merged")
        self._events, self._index, self._projection = merged._events, merged._index, merged._projection
        self._rules = None
        self._base = merged._base
        self.updated_at = max(self.updated_at, merged.updated_at)
        self.note_anchors(merged._known_anchors())
        self.mark_committed(merged.version)

    def __repr__(self) -> str:
        return (
            f"<Session {self.id} app={self.app_name!r} version={self.version} "
            f"events={self._base + len(self._events)} status={self.status!r}>"
        )


def _check_scopes(scopes: Mapping[str, str] | None, schema: Schema) -> dict[str, str]:
    if scopes is not None and not isinstance(scopes, Mapping):
        raise InputError(f"scopes is a dict of scope -> id (e.g. {{'user': 'u-1'}}), not {scopes!r}", field="scopes")
    bound: dict[str, str] = {}
    for scope, scope_id in (scopes or {}).items():
        if scope not in SHARED_SCOPES or scope == "app":
            raise InputError(
                f"scopes binds shared scopes ({', '.join(s for s in SHARED_SCOPES if s != 'app')}), not {scope!r}",
                field=f"scopes.{scope}",
            )
        if scope not in schema:
            raise UnknownScope(scope, field=f"scopes.{scope}")
        try:
            bound[scope] = check_id(scope_id, f"{scope} id")
        except InputError as exc:  # named where the caller gave it
            exc.field = f"scopes.{scope}"
            raise
    return bound
