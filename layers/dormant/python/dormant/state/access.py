"""The state rules: who may read and write which scope, and how a write lands on the ledger.

An ``Access`` reads and writes state for one writer: the outside world (``direct`` writes) or an
invocation (``mutation``s, with ``observation``s recorded when a shared scope moved under it). It
works on a ``StateHost`` — the session — through a small protocol, so the rules live with state and
the session depends on them, not the other way round.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from ..errors import InputError, ScopeNotBound, TempOutsideInvocation, UnknownStateKey
from ..events import Event, StateChange, StateChangeEvent, StateSource
from .schema import ScopeSchema
from .values import check_storable, json_copy, json_equal
from .view import ScopeView, StateView

__all__ = ["Access", "Invocation", "StateHost"]


class StateHost(Protocol):
    """What the state rules need from the ledger they write to."""

    def scope_schema(self, scope: str) -> ScopeSchema:
        """The scope's schema; raises ``UnknownScope`` for a scope the app does not declare."""
        ...

    def scope_values(self, scope: str) -> Mapping[str, Any]:
        """The scope's values as the ledger folds them (not to be mutated)."""
        ...

    def scope_id(self, scope: str) -> str | None: ...

    def append(self, event: Event) -> Event: ...

    def load_scope(self, scope: str, scope_id: str) -> dict[str, Any]:
        """The shared scope as the store holds it."""
        ...

    def uncommitted_writes(self, scope: str, scope_id: str) -> Mapping[str, Any]:
        """This ledger's shared-scope writes not yet committed, key -> value (``None``: deleted)."""
        ...

    @property
    def version(self) -> int:
        """The stored version the ledger was last committed at."""
        ...


class Invocation:
    """One run of an agent inside a session: its id, its ``temp`` values, what it read from shared scopes."""

    def __init__(
        self,
        host: StateHost,
        invocation_id: str,
        agent_name: str,
        stored: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self.host = host
        self.id = invocation_id
        self.agent_name = agent_name
        self.temp: dict[str, Any] = {}
        self._stored = stored if stored is not None else {}
        self._version = host.version
        self.checked: dict[str, set[str]] = {}
        self.state = StateView(Access(host, self))

    def tool_state(self, call_id: str, tool: str) -> StateView:
        """The state a tool's ``execute`` gets: its writes record the call that made them."""
        return StateView(Access(self.host, self, (call_id, tool)))

    def store_values(self, scope: str, scope_id: str) -> dict[str, Any]:
        """The shared scope as stored (loaded once per run), under this session's uncommitted writes.

        A commit in the middle of the run (``serving.advance`` claims the session as the invocation
        opens) moves the writes it carried from "uncommitted" to "stored": the values loaded before
        it are stale then, so they are loaded again.
        """
        if self.host.version != self._version:
            self._stored.clear()
            self._version = self.host.version
        values = dict(load_once(self.host, self._stored, scope, scope_id))
        for key, value in self.host.uncommitted_writes(scope, scope_id).items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
        return values


def load_once(host: StateHost, cache: dict[str, dict[str, Any]], scope: str, scope_id: str) -> dict[str, Any]:
    if scope not in cache:
        cache[scope] = host.load_scope(scope, scope_id)
    return cache[scope]


class Access:
    """Reads and writes state for one writer: the outside world (``invocation`` None) or an invocation,
    and in it, for a tool's ``execute``, the tool call (``call``: call id and tool name)."""

    __slots__ = ("call", "host", "invocation")

    def __init__(self, host: StateHost, invocation: Invocation | None, call: tuple[str, str] | None = None) -> None:
        self.host = host
        self.invocation = invocation
        self.call = call

    def scope_view(self, scope: str) -> ScopeView:
        self.host.scope_schema(scope)
        if scope == "temp":
            self._require_invocation()
        return ScopeView(self, scope)

    def read(self, scope: str, key: str) -> Any:
        schema = self.host.scope_schema(scope)
        if not schema.open and key not in schema.fields:
            raise UnknownStateKey(scope, key, list(schema.model.model_fields) if schema.model else [])
        if scope == "temp":
            return schema.read(key, self._require_invocation().temp.get(key))
        if self.invocation is not None:
            self._observe(scope, (key,))
        return schema.read(key, self.host.scope_values(scope).get(key))

    def values(self, scope: str, *, copy: bool = False) -> Mapping[str, Any]:
        host = self.host
        host.scope_schema(scope)
        if scope == "temp":
            values: Mapping[str, Any] = self._require_invocation().temp
        else:
            scope_id = host.scope_id(scope) if scope != "session" else None
            if self.invocation is not None and scope_id is not None:
                stored = self.invocation.store_values(scope, scope_id)
                self._observe(scope, (*stored, *host.scope_values(scope)))
            values = host.scope_values(scope)
        return json_copy(dict(values)) if copy else values

    def write(self, scope: str, changes: Mapping[str, Any]) -> None:
        """Validate ``changes`` (every key before any is recorded), then record them."""
        self.record(scope, changes, self.check(scope, changes))

    def record(self, scope: str, changes: Mapping[str, Any], checked: Mapping[str, Any]) -> None:
        """Record ``changes`` whose result ``check`` already computed (so nothing is validated twice)."""
        host, invocation = self.host, self.invocation
        if scope == "temp":
            temp = self._require_invocation().temp
            temp.clear()
            temp.update(checked)
            return
        scope_id = host.scope_id(scope) if scope != "session" else None
        self._observe(scope, tuple(changes))
        current = host.scope_values(scope)
        source: StateSource = "direct" if invocation is None else "mutation"
        for key in changes:
            old, new = current.get(key), checked.get(key)
            if not json_equal(old, new):
                host.append(self._change(scope, scope_id, source, key, old, new))

    def check(self, scope: str, changes: Mapping[str, Any], *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Validate a write without recording it; return the scope's values as they would be after it.

        ``base`` stands for the scope's current values (a run checks its input against the values its
        seeds will leave, before writing anything).
        """
        host = self.host
        schema = host.scope_schema(scope)
        if scope == "temp":
            work = dict(self._require_invocation().temp)
        else:
            if scope != "session" and self.invocation is not None and host.scope_id(scope) is None:
                raise ScopeNotBound(scope)
            work = dict(host.scope_values(scope) if base is None else base)
        for key, value in changes.items():
            _stage(schema, work, key, value)
        return work

    def seeds(self, initial: Mapping[str, Any] | None, stored: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Seed values per scope: the schema's defaults and the given values, for keys not already set.

        A bound shared scope is never overwritten where another session stored a key; what is read
        from the store lands in ``stored`` (scope -> values), for the run to reuse.
        """
        host = self.host
        seeds: dict[str, dict[str, Any]] = {}
        for scope, given in (initial or {}).items():
            if scope == "temp":
                raise InputError(
                    "temp cannot be seeded: it exists only inside an invocation", field="initial_state.temp"
                )
            schema = host.scope_schema(scope)
            if not isinstance(given, Mapping):
                raise InputError(f"initial_state.{scope} must be a dict", field=f"initial_state.{scope}")
            present = set(host.scope_values(scope))
            scope_id = host.scope_id(scope) if scope != "session" else None
            if scope_id is not None:
                present |= set(load_once(host, stored, scope, scope_id))
            values = schema.seed(given)
            check_storable(values, f"initial_state.{scope}")
            seeds[scope] = {k: v for k, v in values.items() if v is not None and k not in present}
        return seeds

    def _observe(self, scope: str, keys: Iterable[str]) -> None:
        """Inside an invocation, record the stored value of a bound shared scope's key when it moved."""
        invocation = self.invocation
        if invocation is None or scope in ("session", "temp"):
            return
        host = self.host
        scope_id = host.scope_id(scope)
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
            seen, actual = host.scope_values(scope).get(key), stored.get(key)
            if not json_equal(seen, actual):
                host.append(self._change(scope, scope_id, "observation", key, seen, actual))

    def _change(
        self, scope: str, scope_id: str | None, source: StateSource, key: str, old: Any, new: Any
    ) -> StateChangeEvent:
        invocation = self.invocation
        call_id, tool = self.call if self.call is not None and source == "mutation" else (None, None)
        return StateChangeEvent(
            scope=scope,
            scope_id=scope_id,
            source=source,
            changes=[StateChange(key=key, old_value=json_copy(old), new_value=json_copy(new))],
            schema_version=self.host.scope_schema(scope).version,
            invocation_id=invocation.id if invocation else None,
            agent_name=invocation.agent_name if invocation else None,
            call_id=call_id,
            tool=tool,
        )

    def _require_invocation(self) -> Invocation:
        if self.invocation is None:
            raise TempOutsideInvocation()
        return self.invocation


def _stage(schema: ScopeSchema, work: dict[str, Any], key: str, value: Any) -> None:
    where = f"state.{schema.name}"  # in every scope, temp too
    if isinstance(key, str):
        check_storable({key: None}, where)  # the key itself, named by its path (state.org.<key>)
    named = f"{where}.{key}"
    checked = schema.check_write(work, key, value, key_field=where, value_field=named, unknown_field=named)
    if checked is None:
        work.pop(key, None)
    else:
        work[key] = checked
