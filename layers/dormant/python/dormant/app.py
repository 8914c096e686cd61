"""``adk(...)`` (the ``App`` class): the app — schema, tools, agents, model adapters, the store, and its sessions.

Why one module: it is the ``App`` class and the sessions handle it gives out, whose methods share the app's
configuration; the loop, snapshots and stores it wires together live in their own modules.
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from pydantic import BaseModel

from .agents.agent import Agent
from .agents.context import ContextFactory, HistoryRenderer, Renderer
from .agents.tools import Tool, ToolContext
from .clock import now_ms
from .errors import ConfigurationError, InputError, SessionNotFound, VersionConflict
from .events import Event, parse_event
from .ids import check_id, check_name
from .ledger import LedgerRules
from .models.base import ModelAdapter, ModelSpec, default_adapter
from .session import Session
from .snapshots import (
    DEFAULT_EVERY,
    keeps_snapshot_in_commit,
    load_session,
    pending_snapshot,
    save_after_commit,
    save_snapshot,
)
from .state.migrations import MigrationStep
from .state.schema import BOUND_SCOPES, Schema
from .state.values import check_storable
from .stores.base import (
    CommitResult,
    ErasableStore,
    ScopedStateChange,
    SessionListing,
    SessionStore,
)
from .stores.memory import in_memory_store
from .writes import OnConflict, WriteResult, write

if TYPE_CHECKING:
    from .agents.loop import Checkpoint, RunResult, RunStream

__all__ = ["App", "ErasureReport", "Sessions", "adk"]

_MISSING: Any = object()
T = TypeVar("T")
_log = logging.getLogger("dormant.app")


@dataclass(frozen=True)
class ErasureReport:
    """What ``app.erase`` removed: the sessions bound to the scope id, and its shared-scope keys.
    ``residue`` says what in the store's raw storage may still hold the erased data (``None``: nothing)."""

    scope: str
    scope_id: str
    sessions: list[str]
    scoped_keys: list[str]
    residue: str | None = None
    principal: str | None = None
    """Who erased (the API's caller; ``None`` in-process): the sessions are gone, so the report and the log
    are where it is recorded."""


class App:
    """An app: its schema, tools, agents, model adapters and store, and its sessions. Build one with ``adk(...)``
    (the same class). ``schema`` maps scope names to pydantic models; ``store`` defaults to in-memory.

    ``name`` follows the key rule (``dormant.ids``): 1 to 128 letters, digits and ``_ . : + = -``; never ``@``,
    which separates an app from a tenant in the name a tenant's view is stored under (``{app}@{tenant}``).

    ``migrations`` lists, per scope, the steps its model went through, oldest first
    (``RenameKey``, ``ConvertKey``, ``SplitKey``): state written under an older model is read in the new shape.
    ``retention`` is how long a session is kept after its last commit: older ones are gone from loads and
    listings at once, and ``app.sessions.purge()`` deletes them from the store.
    ``snapshot_every``: events between the snapshots a commit stores, so a load reads the tail of a long
    session (``dormant.snapshots``); ``None`` turns snapshots off (every load reads the whole ledger).
    """

    def __init__(
        self,
        *,
        name: str,
        schema: Mapping[str, type[BaseModel]] | None = None,
        adapters: Mapping[str, ModelAdapter] | None = None,
        store: SessionStore | None = None,
        migrations: Mapping[str, Sequence[MigrationStep]] | None = None,
        retention: timedelta | None = None,
        snapshot_every: int | None = DEFAULT_EVERY,
    ) -> None:
        self.name = check_name(name, "app name")  # no '@': "{app}@{tenant}" names a tenant's view (dormant.ids)
        if retention is not None and (not isinstance(retention, timedelta) or retention <= timedelta(0)):
            raise ConfigurationError(f"retention is a positive datetime.timedelta, not {retention!r}")
        self.retention_ms = None if retention is None else retention // timedelta(milliseconds=1)
        """Milliseconds a session is kept after its last commit (``None``: for ever)."""
        if snapshot_every is not None and (
            not isinstance(snapshot_every, int) or isinstance(snapshot_every, bool) or snapshot_every < 1
        ):
            raise ConfigurationError(f"snapshot_every is an int >= 1 or None, not {snapshot_every!r}")
        self.snapshot_every = snapshot_every
        self.history_turns: int | None = 0
        """The widest ``history(turns=)`` window of the app's agents (``None``: one renders the whole
        ledger): what ``sessions.get`` loads besides the tail."""
        self.schema = Schema(schema, migrations)
        for provider, adapter in (adapters or {}).items():
            if not callable(getattr(adapter, "complete", None)):
                raise ConfigurationError(f"adapters[{provider!r}] has no complete(request) method: {adapter!r}")
        self.adapters: dict[str, ModelAdapter] = dict(adapters or {})
        if store is not None and not isinstance(store, SessionStore):
            raise ConfigurationError(f"store must implement the SessionStore methods, not {store!r}")
        self.store: SessionStore = store if store is not None else in_memory_store()
        self.context = ContextFactory()
        self.sessions = Sessions(self)
        self._tools: dict[str, Tool] = {}
        self._built: dict[str, ModelAdapter] = {}
        self._lock = threading.Lock()

    # -- tools and agents -------------------------------------------------------------------

    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str = "",
        schema: type[BaseModel] | None = None,
        execute: Callable[[ToolContext], Any] | None,
        yield_schema: type[BaseModel] | None = None,
        answerable_by: str | Sequence[str] = "tenant",
    ) -> Tool: ...
    @overload
    def tool(
        self,
        *,
        name: str | None = None,
        description: str = "",
        schema: type[BaseModel] | None = None,
        yield_schema: type[BaseModel] | None = None,
        answerable_by: str | Sequence[str] = "tenant",
    ) -> Callable[[Callable[[ToolContext], Any]], Tool]: ...
    def tool(
        self,
        *,
        name: str | None = None,
        description: str = "",
        schema: type[BaseModel] | None = None,
        execute: Any = _MISSING,
        yield_schema: type[BaseModel] | None = None,
        answerable_by: str | Sequence[str] = "tenant",
    ) -> Tool | Callable[[Callable[[ToolContext], Any]], Tool]:
        """Define a tool. Without ``execute`` this is a decorator: ``@app.tool(description=..., schema=...)``.

        A yielding tool (``yield_schema=``) may pass ``execute=None``: its result is then the answer.
        ``answerable_by`` says who may answer its calls (``dormant.people``: ``"tenant"``, ``"group:NAME"``,
        ``"starter"``, ``"not_starter"``, or a tuple of them that must all hold).
        """

        def build(fn: Callable[[ToolContext], Any] | None) -> Tool:
            tool_name = name if name is not None else getattr(fn, "__name__", None)
            if tool_name is None:
                raise ConfigurationError("a tool needs a name")
            kwargs: dict[str, Any] = {"schema": schema} if schema is not None else {}
            rules = answerable_by if isinstance(answerable_by, str) else tuple(answerable_by)
            tool = Tool(tool_name, description, execute=fn, yield_schema=yield_schema, answerable_by=rules, **kwargs)
            self._register(tool)
            return tool

        if execute is _MISSING:
            return build
        return build(execute)

    def _register(self, tool: Tool) -> None:
        known = self._tools.get(tool.name)
        if known is not None and known is not tool:
            raise ConfigurationError(f"app {self.name!r} already has a different tool named {tool.name!r}")
        self._tools[tool.name] = tool

    def tool_named(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def agent(
        self,
        *,
        name: str,
        model: ModelSpec | Mapping[str, Any],
        context: Sequence[Renderer] | None = None,
        tools: Sequence[Tool] | None = None,
        max_steps: int = 10,
        output: type[BaseModel] | None = None,
    ) -> Agent:
        agent = Agent.build(name=name, model=model, context=context, tools=tools, max_steps=max_steps, output=output)
        for tool in agent.tools:
            self._register(tool)
        for renderer in agent.context:
            if isinstance(renderer, HistoryRenderer) and self.history_turns is not None:
                self.history_turns = None if renderer.turns is None else max(self.history_turns, renderer.turns)
        return agent

    def adapter_for(self, spec: ModelSpec) -> ModelAdapter:
        """The adapter for ``spec``'s provider: the override given to ``adk``, else the shipped one."""
        override = self.adapters.get(spec.provider)
        if override is not None:
            return override
        # One adapter per provider and options; options that are objects (a client) count by identity.
        key = spec.model_dump_json(exclude={"name"}, fallback=lambda value: f"{type(value).__qualname__}@{id(value)}")
        with self._lock:
            if key not in self._built:
                self._built[key] = default_adapter(spec)
            return self._built[key]

    # -- running ----------------------------------------------------------------------------

    def run(
        self,
        agent: Agent,
        input: Any = None,
        *,
        session: Session | None = None,
        principal: str | None = None,
        groups: Iterable[str] = (),
    ) -> RunResult:
        """Run ``agent`` until it answers, yields, fails or runs out of steps.

        ``input`` is a user message, or a dict of ``message``, ``tools`` (answers to yielded calls),
        ``state`` (session values to set first) and ``initial_state`` (scopes to seed). Without
        ``session`` an ephemeral one is built; nothing is stored until ``app.sessions.commit``.
        ``principal`` (a member of ``groups``) is who runs it: recorded on the invocation's start and on the
        answers, which each tool's ``answerable_by`` must admit (``AnswerRefused``).
        """
        return self.stream(agent, input, session=session, principal=principal, groups=groups).finish()

    def stream(
        self,
        agent: Agent,
        input: Any = None,
        *,
        session: Session | None = None,
        invocation_id: str | None = None,
        deadline: int | None = None,
        checkpoint: Checkpoint | None = None,
        principal: str | None = None,
        groups: Iterable[str] = (),
    ) -> RunStream:
        """Like ``run``, yielding each event as it lands; the ``RunResult`` is on ``.result`` at the end.

        For runners that commit as they go (``dormant.serving.turns``): ``invocation_id`` names a new
        invocation, ``deadline`` (ms since the epoch) is recorded on its start or resume event, and
        ``checkpoint`` is called before each model call and tool execution (``False`` ends the run there,
        status ``handed_on``)."""
        # Imported on the first run: a process that only reads or commits sessions never loads the loop.
        from .agents.loop import start_run

        return start_run(
            self,
            agent,
            input,
            session,
            adapter_for=self.adapter_for,
            ephemeral=self.sessions.ephemeral,
            invocation_id=invocation_id,
            deadline=deadline,
            checkpoint=checkpoint,
            principal=principal,
            groups=groups,
        )

    def erase(self, *, scope: str, scope_id: str, principal: str | None = None) -> ErasureReport:
        """Remove one person's (or org's...) data: the shared ``scope`` state stored under ``scope_id``,
        and every session bound to it, expired or not. Returns what was removed.

        The sessions are found through the store's index of bindings (``bound_sessions``), so an erasure
        reads that person's sessions, not the app's; each goes with the store's own ``delete``, which
        removes its events, snapshot and listing entries. A session created for the person while the
        erasure runs may outlive it: erase once they have no live traffic. Last, the store scrubs what
        the deletes left in its files (``store.scrub``: SQLite truncates its write-ahead log); what it
        could not is the report's ``residue``, and logged.
        """
        if scope not in BOUND_SCOPES:
            raise InputError(
                f"erase takes a shared scope bound by id ({', '.join(BOUND_SCOPES)}), not {scope!r}", field="scope"
            )
        scope_id = check_id(scope_id, "scope_id")
        store = self.store
        if not isinstance(store, ErasableStore):
            raise ConfigurationError(f"erase needs a store that indexes bindings (an ErasableStore), not {store!r}")
        bound = store.bound_sessions(self.name, scope, scope_id)
        for session_id in bound:
            store.delete(self.name, session_id)
        store.forget_bound(self.name, scope, scope_id)
        keys = sorted(store.load_scoped_state(self.name, scope, scope_id))
        if keys:
            store.save_scoped_state(self.name, scope, scope_id, dict.fromkeys(keys))
        residue = store.scrub()
        if residue is not None:
            _log.warning("erasure in %s: %s", self.name, residue)
        return ErasureReport(
            scope=scope, scope_id=scope_id, sessions=bound, scoped_keys=keys, residue=residue, principal=principal
        )

    def close(self) -> None:
        """Close the store (so a CLI or worker exits instead of hanging on a pool)."""
        self.store.close()

    def __enter__(self) -> App:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<App {self.name!r} store={type(self.store).__name__}>"


adk = App
"""``adk(name=..., ...)`` builds an ``App``: one constructor under two names (``adk`` is how the docs spell it)."""


class Sessions:
    """``app.sessions``: create, load, list, commit, write and delete the app's sessions."""

    def __init__(self, app: App) -> None:
        self._app = app

    def create(self, session_id: str | None = None, scopes: Mapping[str, str] | None = None) -> Session:
        """A new session, stored at once (version 1, no events). Raises ``VersionConflict`` if the id is taken."""
        session = Session(self._app, session_id=session_id, scopes=scopes)
        self.commit(session)
        return session

    def ephemeral(self, session_id: str | None = None, scopes: Mapping[str, str] | None = None) -> Session:
        """A new session that is not stored (nor listed) until it is committed."""
        return Session(self._app, session_id=session_id, scopes=scopes)

    def from_events(
        self,
        events: Iterable[Event | Mapping[str, Any]],
        *,
        session_id: str | None = None,
        scopes: Mapping[str, str] | None = None,
    ) -> Session:
        """Rebuild a session from its events (e.g. their JSON, as another process would have them).

        The session is not stored; committing it stores every event. An event holding text no store
        can keep (NUL, a lone surrogate) is refused with ``ValueNotStorable`` naming ``events.<n>``, and a
        ledger no run could have written (``dormant.ledger``: an order the runtime keeps, state its schema
        takes) with the rule's error naming ``events.<n>...``. Answers are not checked against today's tool
        schemas: they were recorded under the schemas of their day; their answerers are, against each tool's
        ``answerable_by`` (``AnswerRefused``): no path lands an answer the rule refuses.
        """
        parsed = [parse_event(e) for e in events]
        for position, event in enumerate(parsed):
            check_storable(event.model_dump(), f"events.{position}")
        LedgerRules(self._app.schema, answers_by=self._app.tool_named).check_all(parsed)
        return Session(self._app, session_id=session_id, scopes=scopes, events=parsed, committed=0)

    def get(self, session_id: str) -> Session | None:
        """The stored session, or ``None``.

        With snapshots on, this reads the latest snapshot and the ledger after it, plus the last turns the
        agents' ``history(turns=N)`` windows show: a turn's load does not grow with the session. The
        earlier ledger is fetched only when read (``session.events`` before the tail, ``state_at``,
        ``fork_at``, ``model_input``). An agent with ``history()`` (no window) shows the whole conversation,
        so with one the whole ledger is read on every load.
        """
        app = self._app
        alive = None
        if app.retention_ms is not None:
            now = now_ms()
            alive = lambda row: not self._expired(row.updated_at, now)  # noqa: E731
        return load_session(  # it checks the id
            app, session_id, history=app.history_turns, snapshots=app.snapshot_every is not None, alive=alive
        )

    def require(self, session_id: str) -> Session:
        """Like ``get``, but a session that is not stored raises ``SessionNotFound`` (a handler's 404)."""
        session = self.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    def list(
        self, *, limit: int | None = None, cursor: str | None = None, status: str | None = None
    ) -> builtins.list[SessionListing]:
        """The app's stored sessions, most recently updated first (``cursor=`` a listing's ``cursor`` to go on);
        with ``status``, only those whose stored status is that one, from the store's index of them."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise InputError(f"limit is an int >= 1, not {limit!r}", field="limit")
        store, name = self._app.store, self._app.name
        # status only when asked: a store written to the protocol before list(status=) still lists
        listed = (
            store.list(name, limit=limit, cursor=cursor)
            if status is None
            else store.list(name, limit=limit, cursor=cursor, status=status)
        )
        now = now_ms()
        return [listing for listing in listed if not self._expired(listing.updated_at, now)]

    def purge(self, *, page: int = 100) -> builtins.list[str]:
        """Delete every session past the app's ``retention`` from the store; return their ids.

        What a sweeper runs: expired sessions are already invisible to ``get`` and ``list``, this frees
        their storage. It reads every page of the listing (``every``).
        """
        app = self._app
        if app.retention_ms is None:
            return []
        now = now_ms()
        expired = [listing.id for listing in self.every(page=page) if self._expired(listing.updated_at, now)]
        for session_id in expired:
            app.store.delete(app.name, session_id)
        return expired

    def every(self, *, page: int = 100) -> Iterator[SessionListing]:
        """Every stored session of the app, expired ones too, read a page at a time (newest first)."""
        cursor = None
        while True:
            listed = self._app.store.list(self._app.name, limit=page, cursor=cursor)
            yield from listed
            if len(listed) < page:
                return
            cursor = listed[-1].cursor

    def _expired(self, updated_at: int, now: int) -> bool:
        retention = self._app.retention_ms
        return retention is not None and now >= updated_at + retention

    def _gone(self, session: Session, now: int) -> bool:
        """Whether the stored row is expired or deleted. Asked only when this session's own ``updated_at``
        is expired, so a commit reads nothing more unless a later writer may have kept the row alive."""
        loaded = self._app.store.load(self._app.name, session.id, after=session.version)
        return loaded is None or self._expired(loaded.row.updated_at, now)

    def commit(self, session: Session, *, scoped_changes: Sequence[ScopedStateChange] | None = None) -> CommitResult:
        """Store what the session holds that the store does not: its new events and shared-scope writes.

        Raises ``ScopeNotBound`` (writing nothing) for a state change under a shared scope id the session
        is not bound to, and ``VersionConflict`` (writing nothing) when another writer committed first; see
        ``dormant.serving.commit`` for the version that merges instead. A session past the app's
        ``retention`` is gone, as it is from ``get``: ``SessionNotFound``, nothing written.
        ``scoped_changes`` replaces the shared-scope writes the session's state changes make (a remote
        runner's commit names its own).
        """
        self._check(session)
        session.check_writes()
        new_events = session.uncommitted_events
        scoped = session.scoped_changes() if scoped_changes is None else scoped_changes
        if not new_events and not scoped and session.version > 0:
            return CommitResult(ok=True, version=session.version, appended=0)
        now = now_ms()
        if session.version > 0 and self._expired(session.updated_at, now) and self._gone(session, now):
            raise SessionNotFound(session.id)
        expected, before = session.version, session.committed_count
        store = self._app.store
        snapshot = None
        if self._app.snapshot_every is not None and keeps_snapshot_in_commit(store):
            snapshot = pending_snapshot(session)  # kept in the commit's transaction: a read then folds nothing
            result = store.commit(session.row(), new_events, expected, scoped, snapshot=snapshot)
        else:
            result = store.commit(session.row(), new_events, expected, scoped)
        if not result.ok:
            raise VersionConflict(session.id, expected_version=expected, actual_version=result.version)
        session.updated_at = max(session.updated_at, now)
        session.mark_committed(result.version)
        complete = result.appended == len(new_events)
        if snapshot is not None and complete:
            session.snapshot_at = session.committed_count
        save_after_commit(self._app, session, before=before, every=self._app.snapshot_every, complete=complete)
        return result

    def write(
        self,
        session_id: str | None = None,
        change: Callable[[Session], T] | None = None,
        *,
        session: Session | None = None,
        on_conflict: OnConflict = "fail",
        precondition: Callable[[Session], None] | None = None,
        scoped_changes: Callable[[Session], Sequence[ScopedStateChange]] | None = None,
        attempts: int = 5,
    ) -> WriteResult[T]:
        """Change a stored session: the one way to, for a claim, answers, a merge, ending an invocation.

        Loads ``session_id`` (or starts from ``session=``, a loaded session the first attempt works on),
        checks ``precondition(session)`` (it raises a typed error to refuse), runs ``change(session)`` (it
        appends events, sets state, answers calls; what it returns is the result's ``value``) and commits
        what that added. On a lost race ``on_conflict`` decides: ``"fail"`` raises ``VersionConflict``;
        ``"retry"`` runs precondition and change again on a fresh load, up to ``attempts`` tries in all,
        then raises ``StoreBusy`` naming the session; ``"merge"`` rebases what change added onto what
        landed, or stores it as a fork when they conflict (``dormant.writes`` states the rules).
        ``scoped_changes(session)``, when given, are the commit's shared-scope writes in place of those
        the session's state changes make (a task token, a remote runner's own).

        Returns a ``WriteResult``: ``status`` (``committed``, ``merged``, ``skipped``: nothing to write,
        no store call; ``forked``), ``session`` as stored after it (the fork, for ``forked``), ``version``,
        ``value``, ``attempts``, ``appended``, ``fork_id`` and ``conflicts``. An unknown or expired session
        is ``SessionNotFound``; errors raised by precondition or change propagate. Whatever raises, nothing
        was written.
        """
        if session is not None:
            self._check(session, "write")
        return write(
            self,
            session_id,
            change,
            session=session,
            on_conflict=on_conflict,
            precondition=precondition,
            scoped_changes=scoped_changes,
            attempts=attempts,
        )

    def snapshot(self, session: Session) -> bool:
        """Store a snapshot of ``session`` now (it must be committed); True when the store keeps one at its
        version.

        Commits store one every ``snapshot_every`` events on their own (on the SQL stores, with every
        commit); this is for a long session stored before snapshots, or one about to be read by many
        processes.
        """
        self._check(session)
        if session.uncommitted_events or session.version == 0:
            raise InputError("snapshot takes a session with everything committed", field="session")
        return save_snapshot(self._app, session)

    def _check(self, session: Session, verb: str = "commit") -> None:
        if not isinstance(session, Session):
            raise InputError(
                f"{verb} takes a Session (from app.sessions), not {type(session).__name__}", field="session"
            )
        if session.runtime is not self._app:
            raise InputError("that session belongs to another app", field="session")

    def delete(self, session_id: str) -> None:
        self._app.store.delete(self._app.name, check_id(session_id))
