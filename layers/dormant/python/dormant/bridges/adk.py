"""Google ADK sessions on any dormant store: ``DormantSessionService(store)`` (the ``dormant[adk]`` extra).

Why one module: it is one mapping (ADK sessions onto a dormant store), read top to bottom; the service and the
encoding helpers it shares change together, and it is imported alone, only with the ``adk`` extra.

A ``google.adk.sessions.BaseSessionService`` that behaves as ADK's own services do (in memory and
``DatabaseSessionService``), with dormant's ledger, optimistic concurrency and stores underneath.

The mapping, one way for every store:

* One ADK session is one dormant session of the dormant app named like the ADK app. Its dormant id is
  ``{user_id}.{session_id}`` (ADK keys sessions by user too: two users may hold the same session id), and
  it is bound to the user scope: ``scopes == {"user": user_id}``. An id that is not letters, digits and
  ``-`` (starting with a letter or digit) is stored as ``x_`` and its UTF-8 bytes in hex, in both places:
  every stored id is then letters, digits, ``_ . -``, which no URL escapes (the inspector's links).
* An ADK event is one ``adk_event`` (``dormant.events.AdkEvent``): ADK's own stored form of it, whole.
* Its ``state_delta`` becomes ``state_change`` events beside it, by prefix: no prefix, the ``session``
  scope; ``user:``, the ``user`` scope bound to the session's user; ``app:``, the ``app`` scope; ``temp:``
  is never stored (ADK trims it before a service sees it). ``user:`` and ``app:`` keys are also written to
  the store's scoped state, one key at a time, atomically with the event: two sessions of one user that
  write different keys both keep their write, and a stale session writes neither.
* ADK stores ``None`` as a value, where dormant reads ``None`` as a deletion: a ``None`` is stored as
  ``{"$adk": "None"}`` (and a dict value that holds a ``"$adk"`` key is wrapped, so nothing is ambiguous).
* ``append_event`` is one commit at the version the session object was loaded at (ADK's private
  ``_storage_update_marker`` holds it). A session another process appended to since raises ADK's
  ``StaleSessionError`` and writes nothing; a deleted or unknown one, ``SessionNotFoundError``.
* A session's ``last_update_time`` is its last event's ``timestamp`` (its creation time before any), as
  ADK's services keep it; events come back in the order they were appended.

Store calls are made on the event loop's thread (dormant's stores are synchronous). A service keeps the
parsed events of the sessions it read last: a read asks the store only for the events after the version it
holds (``load(after=)``), so a turn parses its new events, not the whole history. Returned events are
copies that share their nested parts (content, actions) with the kept ones: do not change those in place.

``DormantSessionService(store, tenant=T)`` keeps the sessions in tenant ``T``'s key space (dormant app
``{app_name}@{T}``), where dormant's HTTP API and inspector show them to caller ``T`` (``dormant serve
--principal T``) and ``dormant erase --tenant T`` finds them; without it, under the ADK app's own name.

``dormant_app(app_name, store)`` is the dormant ``App`` over the same sessions, for what reads them the
dormant way: ``app.erase(scope="user", scope_id=user_id)`` (and ``dormant erase``), audit, time travel.
``inspected(app_name)`` is what ``DORMANT_APP`` names for ``dormant serve`` to show them in the inspector.
"""

from __future__ import annotations

import copy
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event as AdkEventModel
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig, ListSessionsResponse
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from pydantic import BaseModel, ConfigDict
from pydantic_core import to_jsonable_python

from ..app import App
from ..clock import now_ms
from ..errors import ConfigurationError, InvalidSessionId
from ..events import AdkEvent, Event, StateChange, StateChangeEvent, StateSource
from ..ids import check_id
from ..state.schema import APP_SCOPE_ID
from ..stores.base import BindingIndexStore, LoadedSession, ScopedStateChange, SessionStore, StoredSession
from .inspection import Inspected
from .inspection import inspected as _inspected

__all__ = ["NONE", "DormantSessionService", "Inspected", "dormant_app", "inspected", "session_key", "user_key"]

STALE_MESSAGE = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
"""ADK's own message for a stale session (``DatabaseSessionService``'s), so callers matching on it keep working."""

NONE: dict[str, str] = {"$adk": "None"}
"""How an ADK state value ``None`` is stored (a ``None`` new value is a deletion to dormant)."""
_TAG = "$adk"

_SCOPES = (("app", State.APP_PREFIX), ("user", State.USER_PREFIX))


def user_key(user_id: str) -> str:
    """The user scope id (and the first part of the dormant session id) an ADK user id is stored under."""
    return check_id(_part(user_id, "user_id"), "user_id")


def session_key(user_id: str, session_id: str) -> str:
    """The dormant session id of ADK session ``session_id`` of ``user_id``."""
    return check_id(f"{_part(user_id, 'user_id')}.{_part(session_id, 'session_id')}", "session_id")


def _part(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidSessionId(f"{field} is a non-empty string, not {value!r}", field=field)
    if _plain(value):
        return value
    return "x_" + value.encode("utf-8", "surrogatepass").hex()


def _plain(value: str) -> bool:
    first = value[0]
    if not (first.isascii() and first.isalnum()):
        return False
    return all((c.isascii() and c.isalnum()) or c == "-" for c in value)


def _unpart(part: str) -> str:
    return bytes.fromhex(part[2:]).decode("utf-8", "surrogatepass") if part.startswith("x_") else part


def _stored(value: Any) -> Any:
    """An ADK state value as dormant stores it (see ``NONE``)."""
    if value is None:
        return dict(NONE)
    if isinstance(value, dict) and _TAG in value:
        return {_TAG: "dict", "value": value}
    return value


def _read(value: Any) -> Any:
    """A stored value as ADK state (the inverse of ``_stored``)."""
    if isinstance(value, dict) and _TAG in value:
        tag = value[_TAG]
        if tag == "None":
            return None
        if tag == "dict":
            return value.get("value")
    return value


def _json_safe(value: Any) -> Any:
    """``value`` as JSON data, as ADK's database services keep state: what has no JSON form becomes its text."""
    try:
        return to_jsonable_python(value)
    except Exception:
        if isinstance(value, Mapping):
            return {str(k): _json_safe(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [_json_safe(v) for v in value]
        return str(value)


def _split(delta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A state delta by scope, prefixes removed; ``temp:`` keys dropped."""
    scopes: dict[str, dict[str, Any]] = {"session": {}, "user": {}, "app": {}}
    for key, value in delta.items():
        for scope, prefix in _SCOPES:
            if key.startswith(prefix):
                scopes[scope][key[len(prefix) :]] = value
                break
        else:
            if not key.startswith(State.TEMP_PREFIX):
                scopes["session"][key] = value
    return scopes


CACHED_SESSIONS = 256
"""Sessions whose parsed events a service keeps (the store stays the truth: a read asks it for the events
after the kept version, and reads everything again when the row is not the one kept)."""


@dataclass(frozen=True)
class _Cached:
    """A session as this process last read it: at ``version``, made at ``created_at``."""

    created_at: int
    version: int
    state: dict[str, Any]
    events: list[AdkEventModel]
    last_update_time: float

    def precedes(self, row: StoredSession) -> bool:
        """Whether ``row`` is this session at this version or later (not one deleted and made again)."""
        return row.created_at == self.created_at and row.version >= self.version


@dataclass(frozen=True)
class _Folded:
    """What a dormant ledger holds of an ADK session."""

    state: dict[str, Any]
    events: list[dict[str, Any]]
    last_update_time: float
    user_id: str
    session_id: str
    version: int


class DormantSessionService(BaseSessionService):
    """ADK's session service contract on a dormant store (memory, SQLite, Postgres, DynamoDB)."""

    def __init__(self, store: SessionStore, *, tenant: str | None = None) -> None:
        """``tenant``: keep the sessions in that tenant's key space (dormant app ``{app_name}@{tenant}``), where
        dormant's HTTP API and its inspector show them to that caller; ``None``: under the ADK app's name."""
        if not isinstance(store, SessionStore):
            raise ConfigurationError(f"DormantSessionService takes a dormant store, not {store!r}")
        if tenant is not None:
            check_id(tenant, "tenant")
            if "@" in tenant:
                raise InvalidSessionId(f"a tenant may not contain '@': {tenant!r}", field="tenant")
        self.store = store
        self.tenant = tenant
        self._cache: OrderedDict[tuple[str, str], _Cached] = OrderedDict()

    def dormant_name(self, app_name: str) -> str:
        """The dormant app name ADK app ``app_name``'s sessions and shared state are kept under."""
        return check_id(app_name if self.tenant is None else f"{app_name}@{self.tenant}", "app_name")

    # -- sessions ----------------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        key, user = session_key(user_id, session_id), user_key(user_id)
        deltas = _split(_json_safe(dict(state or {})))
        shared = {scope: self._scoped(app_name, scope, user) for scope, _ in _SCOPES}
        created = now_ms()
        events, scoped = _state_events(deltas, user, {"session": {}, **shared}, "direct", None, created)
        row = StoredSession(id=key, app_name=self.dormant_name(app_name), scopes={"user": user}, created_at=created)
        result = self.store.commit(row, events, 0, scoped)
        if not result.ok:
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        merged = dict(deltas["session"])
        for scope, prefix in _SCOPES:
            merged.update({prefix + k: v for k, v in {**shared[scope], **deltas[scope]}.items()})
        session = Session(
            id=session_id, app_name=app_name, user_id=user_id, state=merged, last_update_time=created / 1000
        )
        session._storage_update_marker = str(result.version)
        return session

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        try:
            key = session_key(user_id, session_id)
        except InvalidSessionId:
            return None  # nothing can be stored under it
        name = self.dormant_name(app_name)
        cached = self._cache.pop((name, key), None)
        loaded = self.store.load(name, key, after=cached.version if cached is not None else None)
        if loaded is not None and cached is not None and not cached.precedes(loaded.row):
            cached, loaded = None, self.store.load(name, key)  # deleted and made again meanwhile: read it all
        if loaded is None:
            return None
        tail = _fold(loaded, dict(cached.state) if cached is not None else {})
        models = [*(cached.events if cached is not None else ()), *map(AdkEventModel.model_validate, tail.events)]
        last = tail.last_update_time if tail.events or cached is None else cached.last_update_time
        self._remember((name, key), _Cached(loaded.row.created_at, tail.version, tail.state, models, last))
        window = _window(models, config)
        folded = _Folded(tail.state, [], last, tail.user_id, tail.session_id, tail.version)
        # Copies that share their nested parts with the kept events, as ADK's in-memory service under its
        # light-copy flag: re-parsing (or deep-copying) every event on every read is most of a read's cost.
        return self._session(app_name, folded, [event.model_copy() for event in window])

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        """The app's sessions (of one user, or of all), without events, least recently updated first."""
        if user_id is not None:
            user = user_key(user_id)
            keys = [k for k in self._bound(app_name, user) if k.startswith(user + ".")]
        else:
            keys = self._all(app_name)
        sessions = []
        for key in keys:
            loaded = self.store.load(self.dormant_name(app_name), key)
            if loaded is None or "user" not in loaded.row.scopes or "." not in key:
                continue  # deleted meanwhile, or a session of the dormant app that ADK did not make
            sessions.append(self._session(app_name, _fold(loaded), []))
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        session_id = session_id.strip() if session_id else session_id
        try:
            key = session_key(user_id, session_id)
        except InvalidSessionId:
            return
        self._cache.pop((self.dormant_name(app_name), key), None)
        self.store.delete(self.dormant_name(app_name), key)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return self._scoped(app_name, "user", user_key(user_id))

    # -- events ------------------------------------------------------------------------------------

    async def append_event(self, session: Session, event: AdkEventModel) -> AdkEventModel:
        """Store ``event`` and its state changes in one commit at the version ``session`` was loaded at."""
        if event.partial:
            return event
        if any(e == event for e in session.events if e.id == event.id):
            return event  # an equal event delivered again (as ADK's in-memory service, nothing is applied twice)
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        try:
            key, user = session_key(session.user_id, session.id), user_key(session.user_id)
        except InvalidSessionId:
            raise SessionNotFoundError(f"Session {session.id} not found.") from None
        expected = self._expected_version(session, key)
        data = event.model_dump(mode="json", exclude_none=True)
        deltas = _split((data.get("actions") or {}).get("state_delta") or {})
        at = int(event.timestamp * 1000)
        invocation = event.invocation_id or None
        stored = AdkEvent(
            author=event.author,
            event=data,
            invocation_id=invocation,
            agent_name=None if event.author == "user" else event.author,
            created_at=at,
        )
        before = _in_hand(session.state)
        changes, scoped = _state_events(deltas, user, before, "mutation", invocation, at)
        row = StoredSession(id=key, app_name=self.dormant_name(session.app_name), scopes={"user": user})
        result = self.store.commit(row, [stored, *changes], expected, scoped)
        if not result.ok:
            if result.version == 0:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            raise StaleSessionError(STALE_MESSAGE)
        session._storage_update_marker = str(result.version)
        session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    # -- helpers -----------------------------------------------------------------------------------

    def _remember(self, where: tuple[str, str], cached: _Cached) -> None:
        """Keep the parsed events of the sessions read last, so the next read parses only the tail."""
        self._cache[where] = cached
        while len(self._cache) > CACHED_SESSIONS:
            self._cache.popitem(last=False)

    def _expected_version(self, session: Session, key: str) -> int:
        """The version ``session`` was loaded at; for a session object without one (built by hand, or by
        another service), the stored version when its last event is the stored last event, as ADK checks."""
        marker = session._storage_update_marker
        if marker is not None and marker.isdigit():
            return int(marker)
        loaded = self.store.load(self.dormant_name(session.app_name), key)
        if loaded is None:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        ids = [e.event.get("id") for e in loaded.events if isinstance(e, AdkEvent)]
        if (ids[-1] if ids else None) != (session.events[-1].id if session.events else None):
            raise StaleSessionError(STALE_MESSAGE)
        return loaded.row.version

    def _session(self, app_name: str, folded: _Folded, events: list[AdkEventModel]) -> Session:
        state = copy.deepcopy(folded.state)  # the caller's to change in place (ADK's State records such writes)
        user = user_key(folded.user_id)
        for scope, prefix in _SCOPES:
            state.update({prefix + k: v for k, v in self._scoped(app_name, scope, user).items()})
        session = Session(
            id=folded.session_id,
            app_name=app_name,
            user_id=folded.user_id,
            state=state,
            events=events,
            last_update_time=folded.last_update_time,
        )
        session._storage_update_marker = str(folded.version)
        return session

    def _scoped(self, app_name: str, scope: str, user: str) -> dict[str, Any]:
        scope_id = user if scope == "user" else APP_SCOPE_ID
        stored = self.store.load_scoped_state(self.dormant_name(app_name), scope, scope_id)
        return {k: _read(v) for k, v in stored.items()}

    def _bound(self, app_name: str, user: str) -> list[str]:
        """The dormant ids of a user's sessions: from the store's binding index where it keeps one."""
        if isinstance(self.store, BindingIndexStore):
            return self.store.bound_sessions(self.dormant_name(app_name), "user", user)
        return [k for k in self._all(app_name) if k.startswith(user + ".")]

    def _all(self, app_name: str) -> list[str]:
        keys: list[str] = []
        cursor: str | None = None
        while True:
            page = self.store.list(self.dormant_name(app_name), limit=1000, cursor=cursor)
            keys += [listing.id for listing in page]
            if len(page) < 1000:
                return keys
            cursor = page[-1].cursor


def _in_hand(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The session object's state by scope: the values a delta replaces (its changes' ``old_value``)."""
    return _split(state) if state else {"session": {}, "user": {}, "app": {}}


def _state_events(
    deltas: Mapping[str, Mapping[str, Any]],
    user: str,
    before: Mapping[str, Mapping[str, Any]],
    source: StateSource,
    invocation_id: str | None,
    created_at: int,
) -> tuple[list[Event], list[ScopedStateChange]]:
    """One ``state_change`` per scope with changes, and the scoped writes of the shared ones."""
    events: list[Event] = []
    scoped: list[ScopedStateChange] = []
    for scope, scope_id in (("session", None), ("user", user), ("app", APP_SCOPE_ID)):
        delta = deltas.get(scope)
        if not delta:
            continue
        old = before.get(scope, {})
        changes = [
            StateChange(key=k, old_value=_stored(old[k]) if k in old else None, new_value=_stored(v))
            for k, v in delta.items()
        ]
        events.append(
            StateChangeEvent(
                scope=scope,
                scope_id=scope_id,
                source=source,
                changes=changes,
                invocation_id=invocation_id,
                created_at=created_at,
            )
        )
        if scope_id is not None:
            scoped += [ScopedStateChange(scope, scope_id, c.key, c.new_value) for c in changes]
    return events, scoped


def _fold(loaded: LoadedSession, state: dict[str, Any] | None = None) -> _Folded:
    """The session state (folded onto ``state``), the ADK events (as stored) and the last update time of
    the events ``loaded`` holds (the whole ledger, or a tail)."""
    row = loaded.row
    state = {} if state is None else state
    events: list[dict[str, Any]] = []
    for event in loaded.events:
        if isinstance(event, AdkEvent):
            events.append(event.event)
        elif isinstance(event, StateChangeEvent) and event.scope == "session":
            for change in event.changes:
                if change.new_value is None:
                    state.pop(change.key, None)
                else:
                    state[change.key] = _read(change.new_value)
    last = events[-1].get("timestamp") if events else None
    user_part, _, session_part = row.id.partition(".")
    return _Folded(
        state=state,
        events=events,
        last_update_time=float(last) if isinstance(last, int | float) else row.created_at / 1000,
        user_id=_unpart(user_part),
        session_id=_unpart(session_part),
        version=row.version,
    )


def _window(events: list[AdkEventModel], config: GetSessionConfig | None) -> list[AdkEventModel]:
    """``GetSessionConfig`` as ADK's in-memory service applies it: the last ``num_recent_events``, then
    those from the last one before ``after_timestamp`` on (events at ``after_timestamp`` are kept)."""
    if config is None:
        return events
    if config.num_recent_events is not None:
        events = events[-config.num_recent_events :] if config.num_recent_events else []
    if config.after_timestamp is not None:
        i = len(events) - 1
        while i >= 0 and events[i].timestamp >= config.after_timestamp:
            i -= 1
        events = events[i + 1 :]
    return events


# -- the dormant side: erase, audit, the inspector ----------------------------------------------------


class _Open(BaseModel):
    """A shared scope of an ADK app: any key, any JSON value (ADK state has no schema)."""

    model_config = ConfigDict(extra="allow")


def dormant_app(app_name: str, store: SessionStore) -> App:
    """The dormant ``App`` over ADK app ``app_name``'s sessions in ``store``: ``erase``, audit, time travel.

    Its scopes are untyped (ADK state has no schema); ``user`` scope ids are ``user_key(user_id)``.
    """
    return App(name=app_name, schema={"user": _Open, "app": _Open}, store=store, snapshot_every=None)


def inspected(app_name: str) -> Callable[[SessionStore], Inspected]:
    """For ``DORMANT_APP=module:attr`` with ``attr = inspected("my_adk_app")``: ``dormant serve`` then shows
    the ADK app's sessions in the inspector, and ``dormant erase`` erases its users."""
    return _inspected(
        app_name,
        "ADK",
        app=lambda store: dormant_app(app_name, store),
        how="send their messages through ADK's Runner",
    )
