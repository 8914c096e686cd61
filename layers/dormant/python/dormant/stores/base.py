"""The skeleton every built-in store is made on: ``BaseSessionStore`` and the encoding it owns.

Why one module: the shared steps of every write and read (checks, encoding, limits, the gate's answer) are one
sequence that calls the primitives a store supplies; split, each half would be read with the other open.

The contract is in ``dormant.stores.contract`` and the values in ``dormant.stores.types``; both are re-exported
here, so ``from dormant.stores.base import SessionStore`` (and every other name it ever held) keeps working.

Writing a store on ``BaseSessionStore`` (the DynamoDB store is one). The base does, once for every
store: argument checks, de-duplicating a batch, encoding events (``encode_event``/``decode_event``:
the one seam where compression or chunking plugs in), the limits, merging scoped changes into sorted
writes, the clock, and turning the gate's answer into a ``CommitResult`` or a ``ScopeMismatch``.
A store supplies only these primitives, each documented with the concurrency it must provide:

* ``_read(app, session_id, after)`` -> ``(row, [encoded events])`` or ``None``: one consistent snapshot;
* ``_write(commit: PreparedCommit)`` -> events appended, or ``Refused``: the atomic, gated step;
* ``_save_scoped(app, writes)``: scoped writes on their own, atomically;
* ``_load_scoped(app, scope, scope_id)`` -> ``{key: encoded value}``;
* ``_delete(app, session_id)``, ``_list(app, limit, after, status)`` and ``_close()``;
* ``_running(limit)``: the sessions whose stored status is ``running``, across apps, from an index;
* ``_waiting(limit)``: the same for the waiting statuses (``awaiting_input``, ``resumable``);
* ``_due(before, limit, after)`` and ``_set_due(app, session_id, version, due_at)``: the waits due for the
  sweeper, from an index keyed by when each is due (the defaults read ``_waiting``: every wait, as before);
* optionally ``_save_snapshot``/``_load_snapshot`` (the defaults keep none: loads are then whole).

Then run ``StoreContract`` against it.
"""

from __future__ import annotations

import builtins
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic_core import PydanticSerializationError

from ..clock import now_ms
from ..errors import (
    CommitTooLarge,
    EventTooLarge,
    InputError,
    InvalidKey,
    ScopeMismatch,
    StoreClosed,
    ValueNotStorable,
)
from ..events import Event, EventBase, parse_event_json
from ..ids import (
    ID_MATCH,
    TENANT_SEPARATOR,
    check_app_key,
    check_event_id,
    check_id,
    check_name,
    check_scoped_key,
)
from ..state.schema import BOUND_SCOPES
from ..state.values import check_storable
from .contract import (
    BindingIndexStore,
    DueStore,
    ErasableStore,
    LimitedStore,
    OneReadSnapshotStore,
    RepairableStore,
    SessionStore,
    SnapshotInCommitStore,
    SnapshotStore,
    SweepableStore,
)
from .types import (
    MAX_CURSOR_TIME,
    MAX_SCOPED_KEY_BYTES,
    NOT_DUE,
    RUNNING_STATUS,
    WAITING_STATUSES,
    CommitResult,
    EncodedEvent,
    LoadedSession,
    PreparedCommit,
    Refused,
    RunningSession,
    ScopedStateChange,
    ScopedWrite,
    SessionListing,
    StoredSession,
    StoredSnapshot,
    StoreLimits,
    _is_count,
    built,
    decode_cursor,
    encode_cursor,
)

__all__ = [
    "MAX_CURSOR_TIME",
    "MAX_SCOPED_KEY_BYTES",
    "NOT_DUE",
    "RUNNING_STATUS",
    "WAITING_STATUSES",
    "BaseSessionStore",
    "BindingIndexStore",
    "CommitResult",
    "DueStore",
    "EncodedEvent",
    "ErasableStore",
    "LimitedStore",
    "OneReadSnapshotStore",
    "LoadedSession",
    "PreparedCommit",
    "Refused",
    "RepairableStore",
    "RunningSession",
    "ScopedStateChange",
    "ScopedWrite",
    "SessionListing",
    "SessionStore",
    "SnapshotInCommitStore",
    "SnapshotStore",
    "StoreLimits",
    "StoredSession",
    "StoredSnapshot",
    "SweepableStore",
    "decode_cursor",
    "encode_cursor",
]

_STATUS = re.compile(r"[a-z][a-z_]{0,31}")
"""What ``list(status=)`` accepts: a status as ``Projection.status`` spells them (safe inside any store's key)."""


class BaseSessionStore(ABC):
    """The shared steps of every store; subclasses supply the ``_``-prefixed primitives."""

    limits: ClassVar[StoreLimits] = StoreLimits()
    snapshots_in_commit: ClassVar[bool] = False
    """Whether ``commit(snapshot=)`` keeps the snapshot in the commit's own transaction (the SQL stores):
    a state read then reads the snapshot at the last commit and folds nothing, at no extra round trip."""
    _closed: bool = False

    # -- the contract -------------------------------------------------------------------------

    def load(self, app_name: str, session_id: str, *, after: int | None = None) -> LoadedSession | None:
        check_app_key(app_name)
        check_id(session_id)
        if after is not None and not _is_count(after):
            raise InputError(f"after is a version (an int >= 0), not {after!r}", field="after")
        self._check_open()
        found = self._read(app_name, session_id, after or 0)
        if found is None:
            return None
        row, data = found
        return LoadedSession(row, [self.decode_event(item) for item in data])

    def load_encoded(
        self, app_name: str, session_id: str, *, after: int | None = None
    ) -> tuple[StoredSession, Sequence[str]] | None:
        """``load`` without decoding: the row and each event as ``encode_event`` stored it (``decode_event`` makes
        one an event). For a reader that recognises the stored text of its own events (a bridge reading a long
        ledger) and decodes only the rest."""
        check_app_key(app_name)
        check_id(session_id)
        if after is not None and not _is_count(after):
            raise InputError(f"after is a version (an int >= 0), not {after!r}", field="after")
        self._check_open()
        return self._read(app_name, session_id, after or 0)

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
        *,
        snapshot: StoredSnapshot | None = None,
    ) -> CommitResult:
        """``snapshot``: see ``snapshots_in_commit`` (ignored by a store without it, or when too large)."""
        if snapshot is not None and not (
            self.snapshots_in_commit
            and snapshot.version == expected_version + 1
            and _utf8_size(snapshot.data) <= self.limits.max_snapshot_bytes
        ):
            snapshot = None
        prepared = self._prepare(session, new_events, expected_version, scoped_changes, snapshot)
        self._check_open()
        outcome = self._write(prepared)
        if type(outcome) is int:
            return built(CommitResult, ok=True, version=expected_version + 1, appended=outcome)
        assert isinstance(outcome, Refused)
        if expected_version > 0 and outcome.version > 0 and outcome.scopes != prepared.row.scopes:
            raise ScopeMismatch(session.id, stored=outcome.scopes or {}, given=prepared.row.scopes)
        return CommitResult(ok=False, version=outcome.version, appended=0)

    def delete(self, app_name: str, session_id: str) -> None:
        check_app_key(app_name)
        check_id(session_id)
        self._check_open()
        self._delete(app_name, session_id)

    def load_scoped_state(self, app_name: str, scope: str, scope_id: str) -> dict[str, Any]:
        check_app_key(app_name)
        check_name(scope, "scope")
        check_id(scope_id, "scope id")
        self._check_open()
        return {key: json.loads(value) for key, value in self._load_scoped(app_name, scope, scope_id).items()}

    def save_scoped_state(self, app_name: str, scope: str, scope_id: str, state: Mapping[str, Any]) -> None:
        """Merge ``state`` into the scope: unmentioned keys stay, ``None`` deletes a key."""
        check_app_key(app_name)
        changes = [ScopedStateChange(scope, scope_id, key, value) for key, value in state.items()]
        writes = self._scoped_writes(changes, "state")
        self._check_open()
        self._save_scoped(app_name, writes)

    def bound_sessions(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        """The ids of the app's sessions bound to ``scope_id`` in ``scope``, read from an index of the
        bindings (what ``app.erase`` reads instead of every session of the app), sorted."""
        check_app_key(app_name)
        if scope not in BOUND_SCOPES:
            raise InputError(f"sessions are bound by id to {', '.join(BOUND_SCOPES)}, not {scope!r}", field="scope")
        check_id(scope_id, "scope_id")
        self._check_open()
        return self._bound(app_name, scope, scope_id)

    def forget_bound(self, app_name: str, scope: str, scope_id: str) -> None:
        """Drop what the binding index still holds of ``scope_id`` once its sessions are deleted (the
        last step of an erasure)."""
        check_app_key(app_name)
        check_id(scope_id, "scope_id")
        self._check_open()
        self._forget_bound(app_name, scope, scope_id)

    def scrub(self) -> str | None:
        """Make what deletes removed unreadable in the store's raw storage, where the store can (the last
        step of an erasure). Returns what may still hold deleted data, or ``None``: nothing does."""
        self._check_open()
        return self._scrub()

    def app_names(self, prefix: str) -> builtins.list[str] | None:
        """The app names holding sessions that start with ``prefix``, which is ``"{app}@"``: the stored names of
        an app's tenants (``dormant.ids.tenant_app_name``), or ``None`` from a store that cannot list them
        without a scan (DynamoDB, whose TTL expires sessions where a sweeper would purge them)."""
        if not isinstance(prefix, str) or not prefix.endswith(TENANT_SEPARATOR):
            refused = f"app_names lists an app's tenants: the prefix is '{{app}}@', not {prefix!r}"
            raise InvalidKey(refused, field="prefix")
        check_name(prefix[:-1], "app name", "prefix")
        self._check_open()
        return self._app_names(prefix)

    def running_sessions(self, limit: int = 1000) -> builtins.list[RunningSession]:
        """The sessions of every app in the store whose stored status is ``running``, least recently updated
        first, at most ``limit`` of them: where the sweeper finds turns whose runner died, without listing
        apps (which DynamoDB cannot do without a scan). Read from an index of running sessions on every
        store, so its cost follows the running sessions, not all of them. A session in the middle of a
        commit shows with its status before that commit."""
        if not _is_count(limit) or limit < 1:
            raise InputError(f"limit is an int >= 1, not {limit!r}", field="limit")
        self._check_open()
        return self._running(limit)

    def waiting_sessions(self, limit: int = 1000) -> builtins.list[RunningSession]:
        """The sessions of every app whose stored status is one of ``WAITING_STATUSES`` (``awaiting_input``,
        ``resumable``), least recently updated first, at most ``limit``: where the sweeper finds waits that may
        have lost the execution meant to wake them. From an index of them, as ``running_sessions``."""
        if not _is_count(limit) or limit < 1:
            raise InputError(f"limit is an int >= 1, not {limit!r}", field="limit")
        self._check_open()
        return self._waiting(limit)

    def due_waits(
        self, before: int, *, limit: int = 100, after: RunningSession | None = None
    ) -> builtins.list[RunningSession]:
        """The waiting sessions due for the sweeper by ``before`` (epoch ms): ``due_at <= before``, ordered by
        ``(due_at, app name, id)``, only those past ``after`` (the last row of the page before), at most ``limit``.
        Each row carries its ``due_at`` and ``version``. From an index of due times: a page's reads follow the
        due waits, never the healthy ones (``DueStore``)."""
        if not _is_count(before) or before > MAX_CURSOR_TIME:
            raise InputError(f"before is a time in epoch ms, not {before!r}", field="before")
        if not _is_count(limit) or limit < 1:
            raise InputError(f"limit is an int >= 1, not {limit!r}", field="limit")
        if after is not None and (not isinstance(after, RunningSession) or not _is_count(after.due_at)):
            raise InputError("after is a row due_waits answered (with its due_at)", field="after")
        self._check_open()
        return self._due(before, limit, after)

    def set_due(
        self,
        app_name: str,
        session_id: str,
        version: int,
        due_at: int,
        *,
        scoped_changes: Sequence[ScopedStateChange] = (),
    ) -> bool:
        """When the sweeper is next to look at this waiting session (epoch ms; ``NOT_DUE``: only after its next
        commit), if it still waits at ``version``: a later commit set its own. True when set.

        ``scoped_changes`` are written in the same atomic write, and only if it sets the due time: park's wait
        record, gated on the wait without a commit of its own (the session's version, ``updated_at`` and listing
        entry stay as they are). A store that keeps no due times sets nothing and writes nothing (False)."""
        check_app_key(app_name)
        check_id(session_id)
        if not _is_count(version) or version < 1:
            raise InputError(f"version is an int >= 1, not {version!r}", field="version")
        if not _is_count(due_at) or due_at > NOT_DUE:
            raise InputError(f"due_at is a time in epoch ms up to NOT_DUE, not {due_at!r}", field="due_at")
        writes = self._scoped_writes(list(scoped_changes)) if scoped_changes else ()
        self._check_open()
        if writes:
            return self._set_due(app_name, session_id, version, due_at, writes)
        return self._set_due(app_name, session_id, version, due_at)

    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None, status: str | None = None
    ) -> builtins.list[SessionListing]:
        check_app_key(app_name)
        if limit is not None and (not _is_count(limit) or limit < 1):
            raise InputError(f"limit is an int >= 1, not {limit!r}", field="limit")
        if status is not None and (not isinstance(status, str) or not _STATUS.fullmatch(status)):
            raise InputError(f"status is a session status (lower case letters and '_'), not {status!r}", field="status")
        after = decode_cursor(cursor) if cursor is not None else None
        self._check_open()
        return self._list(app_name, limit, after, status)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        check_app_key(app_name)
        check_id(session_id)
        if not isinstance(snapshot, StoredSnapshot) or not _is_count(snapshot.version) or snapshot.version < 1:
            raise InputError("a snapshot is a StoredSnapshot of a stored version (>= 1)", field="snapshot")
        if _utf8_size(snapshot.data) > self.limits.max_snapshot_bytes:
            return False  # a cache: too big to keep is not an error
        self._check_open()
        return self._save_snapshot(app_name, session_id, snapshot)

    def load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        check_app_key(app_name)
        check_id(session_id)
        self._check_open()
        return self._load_snapshot(app_name, session_id)

    def load_with_snapshot(self, app_name: str, session_id: str) -> tuple[StoredSnapshot | None, LoadedSession | None]:
        """The kept snapshot and the session with the events after the snapshot's version (all of them when
        there is none), read together: in one transaction on a store that overrides ``_read_with_snapshot``."""
        check_app_key(app_name)
        check_id(session_id)
        snapshot, row, events = self._load_with_snapshot(app_name, session_id)
        return snapshot, None if row is None else LoadedSession(row, events)

    def _load_with_snapshot(
        self, app_name: str, session_id: str
    ) -> tuple[StoredSnapshot | None, StoredSession | None, builtins.list[Event]]:
        """``load_with_snapshot`` of keys the caller checked (``app.sessions.get``: a state read pays for one check),
        as (snapshot, row or ``None``, events after the snapshot): no ``LoadedSession`` to build and take apart."""
        self._check_open()
        snapshot, found = self._read_with_snapshot(app_name, session_id)
        if found is None:
            return snapshot, None, []
        row, data = found
        return snapshot, row, [self.decode_event(item) for item in data] if data else []

    def _read_with_snapshot(
        self, app_name: str, session_id: str
    ) -> tuple[StoredSnapshot | None, tuple[StoredSession, Sequence[str]] | None]:
        snapshot = self._load_snapshot(app_name, session_id)
        return snapshot, self._read(app_name, session_id, snapshot.version if snapshot is not None else 0)

    # -- the encoding seam ----------------------------------------------------------------------

    def encode_event(self, event: Event) -> str:
        """An event as stored; ``ValueNotStorable`` if it holds text no store can keep (the last line of defence).

        Override (with ``decode_event``) to compress, on top of this one; chunking goes here too.
        """
        return _encode(event)

    def decode_event(self, data: str | bytes) -> Event:
        return parse_event_json(data)

    # -- primitives -----------------------------------------------------------------------------

    @abstractmethod
    def _read(self, app_name: str, session_id: str, after: int) -> tuple[StoredSession, Sequence[str]] | None:
        """The row and the encoded events of versions > ``after``, in (version, position) order.

        Concurrency: one snapshot. The events shown are exactly those of versions up to the row's
        version: never a version still being written, never a row older than its events.
        """

    @abstractmethod
    def _write(self, commit: PreparedCommit) -> int | Refused:
        """The gated, atomic step; returns the number of events appended, or ``Refused``.

        Concurrency: all or nothing, serialised per session against every other ``_write``. The gate
        opens only when ``commit.admits(stored version, stored scopes)`` (no row: version 0). Then:
        append ``commit.fresh(ids already stored)`` at version ``commit.row.version``, at increasing
        positions in batch order (a skipped id may leave a gap); store the row (see
        ``PreparedCommit.row``); apply ``commit.scoped``.
        When the gate stays shut nothing is written and ``Refused(stored version, stored scopes)``
        comes back (the scopes are needed only when a row exists and ``expected_version > 0``).
        """

    @abstractmethod
    def _save_scoped(self, app_name: str, writes: Sequence[ScopedWrite]) -> None:
        """Apply ``writes`` (``None`` deletes the key) all together. Concurrency: atomic."""

    @abstractmethod
    def _load_scoped(self, app_name: str, scope: str, scope_id: str) -> dict[str, str]:
        """The scope's keys and encoded values. Concurrency: shows no half-applied commit."""

    @abstractmethod
    def _delete(self, app_name: str, session_id: str) -> None:
        """Remove the row, every event and the snapshot. Concurrency: a ``_write`` that follows must find no row."""

    @abstractmethod
    def _list(
        self, app_name: str, limit: int | None, after: tuple[int, str] | None, status: str | None
    ) -> builtins.list[SessionListing]:
        """Rows ordered by (updated_at, id) descending, only those below ``after`` when given, and only those whose
        stored status is ``status`` when given (from an index: a page never comes back short while more match)."""

    @abstractmethod
    def _running(self, limit: int) -> builtins.list[RunningSession]:
        """Up to ``limit`` sessions whose stored status is ``running``, of every app, ordered by
        (updated_at, app name, id) ascending, read from an index of them (never every session)."""

    @abstractmethod
    def _waiting(self, limit: int) -> builtins.list[RunningSession]:
        """As ``_running``, for the sessions whose stored status is in ``WAITING_STATUSES`` (with that status)."""

    def _due(self, before: int, limit: int, after: RunningSession | None) -> builtins.list[RunningSession]:
        """The default for a store without a due index: every wait, due from its last commit (reads them all)."""
        rows = [
            row._replace(due_at=row.updated_at)
            for row in self._waiting(1000)
            if row.updated_at <= before
            and (after is None or (row.updated_at, row.app_name, row.session_id) > _due_key(after))
        ]
        return sorted(rows, key=_due_key)[:limit]

    def _set_due(
        self, app_name: str, session_id: str, version: int, due_at: int, writes: Sequence[ScopedWrite] = ()
    ) -> bool:
        """The default keeps no due times: nothing is set (nor ``writes`` written)."""
        return False

    @abstractmethod
    def _close(self) -> None:
        """Release what the store owns (called once)."""

    @abstractmethod
    def _bound(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]:
        """Ids of the app's stored sessions whose scopes bind ``scope`` to ``scope_id``, sorted, from an index
        (the SQL stores: a partial expression index on ``scopes``), never from a read of every session."""

    def _forget_bound(self, app_name: str, scope: str, scope_id: str) -> None:
        """Delete the binding index's entries of ``scope_id``. The default has none to delete: an index
        derived from the session rows goes with them."""
        return None

    def _scrub(self) -> str | None:
        """The default: a delete is final, nothing of the deleted data is left to scrub."""
        return None

    def _app_names(self, prefix: str) -> builtins.list[str] | None:
        """The distinct app names with sessions, starting with ``prefix``; ``None``: not without a scan."""
        return None

    def _save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        """Keep ``snapshot`` in place of the session's one, only if the row's version >= ``snapshot.version``
        and the kept one is older. Concurrency: atomic against ``_write`` and ``_delete`` of the session.
        The default keeps nothing (the store has no snapshots)."""
        return False

    def _load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        """The session's snapshot. The default: none."""
        return None

    # -- shared steps -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("this store was closed")

    def _prepare(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None,
        snapshot: StoredSnapshot | None = None,
    ) -> PreparedCommit:
        """Check and encode a commit. Run once per commit with every event in it, so the per-event steps are
        inlined: the id's key rule as one C-level match (``check_event_id`` only to word a refusal), the JSON
        from the model's serializer (``encode_event``'s default, when a store keeps it), its size."""
        check_app_key(session.app_name)
        check_id(session.id)
        scopes = session.scopes
        if type(scopes) is not dict and not isinstance(scopes, Mapping):  # (an ABC's check is Python code)
            raise InputError(f"scopes is a dict of scope -> id, not {type(scopes).__name__}", field="scopes")
        for scope, scope_id in scopes.items():  # keys too, on DynamoDB (the binding index)
            check_name(scope, "scope", "scopes")
            check_id(scope_id, "scope id", f"scopes.{scope}")
        if not _is_count(expected_version):
            raise InputError(
                f"expected_version must be an int >= 0, not {expected_version!r}", field="expected_version"
            )
        limits = self.limits
        max_event = limits.max_event_bytes
        own_encoding = type(self).encode_event is BaseSessionStore.encode_event
        seen: set[str] = set()
        events: builtins.list[EncodedEvent] = []
        total = 0
        for n, event in enumerate(new_events):
            if not isinstance(event, EventBase):
                raise InputError(f"commit takes events, not {type(event).__name__}", field="new_events")
            event_id = event.id
            if type(event_id) is not str or ID_MATCH(event_id) is None:
                check_event_id(event_id, f"new_events.{n}.id")
            if event_id in seen:
                continue
            seen.add(event_id)
            data = _encode(event) if own_encoding else self.encode_event(event)
            size = len(data) if data.isascii() else _utf8_size(data)
            if size > max_event:
                raise EventTooLarge(event_id, size=size, limit=max_event)
            total += size
            events.append(tuple.__new__(EncodedEvent, (event_id, data)))  # (a named tuple's __new__ is Python)
        if len(events) > limits.max_events_per_commit:
            raise CommitTooLarge(
                f"a commit carries at most {limits.max_events_per_commit:,} events, not {len(events):,}",
                size=len(events),
                limit=limits.max_events_per_commit,
            )
        if total > limits.max_commit_bytes:
            raise CommitTooLarge(
                f"a commit's events total at most {limits.max_commit_bytes:,} bytes encoded, not {total:,}",
                size=total,
                limit=limits.max_commit_bytes,
            )
        if snapshot is not None and len(events) != len(new_events):
            snapshot = None  # a batch that repeats an id is not the ledger the snapshot folded
        now = now_ms()
        row = built(
            StoredSession,
            id=session.id,
            app_name=session.app_name,
            version=expected_version + 1,
            scopes=dict(scopes),
            created_at=session.created_at or now,
            status=session.status,
            updated_at=now,
            forked_from=session.forked_from,
            fork_reason=session.fork_reason,
            retention_ms=session.retention_ms,
        )
        scoped = self._scoped_writes(scoped_changes) if scoped_changes else ()
        return built(
            PreparedCommit,
            row=row,
            expected_version=expected_version,
            events=tuple(events),
            scoped=scoped,
            snapshot=snapshot,
        )

    def _scoped_writes(
        self, changes: Sequence[ScopedStateChange], what: str = "scoped_changes"
    ) -> tuple[ScopedWrite, ...]:
        """One write per (scope, scope id, key) — a later change wins — encoded, checked and sorted.

        Scopes, scope ids and keys follow the one key rule (``dormant.ids``) on every store, checked here before
        anything is written (``what.N.scope``, ``what.N.scope_id``, ``what.N.key`` name a refused one).
        """
        latest: dict[tuple[str, str, str], Any] = {}
        for n, change in enumerate(changes):
            if not isinstance(change, ScopedStateChange):
                raise InputError(f"scoped changes are ScopedStateChange, not {type(change).__name__}", field=what)
            check_name(change.scope, "scope", f"{what}.{n}.scope")
            check_id(change.scope_id, "scope id", f"{what}.{n}.scope_id")
            check_scoped_key(change.key, f"{what}.{n}.key")
            latest[(change.scope, change.scope_id, change.key)] = change.value
        limit = self.limits.max_scoped_value_bytes
        writes = []
        for (scope, scope_id, key), value in sorted(latest.items(), key=lambda item: item[0]):
            field_name = f"state.{scope}.{key}"
            if value is None:
                writes.append(ScopedWrite(scope, scope_id, key, None))
                continue
            check_storable(value, field_name)  # the one rule for every store: no NaN, NUL or lone surrogate
            try:
                text = json.dumps(value, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InputError(f"scoped value {scope}.{key} is not JSON: {exc}", field=field_name) from exc
            size = _utf8_size(text)
            if size > limit:
                raise CommitTooLarge(
                    f"scoped value {scope}.{key} is {size:,} bytes encoded; the limit is {limit:,}",
                    size=size,
                    limit=limit,
                    field=field_name,
                )
            writes.append(ScopedWrite(scope, scope_id, key, text))
        return tuple(writes)


def _due_key(row: RunningSession) -> tuple[int, str, str]:
    return (row.due_at or 0, row.app_name, row.session_id)


def _encode(event: Event) -> str:
    """``encode_event``'s default: the model's JSON from its serializer (``model_dump_json`` without its wrapper)."""
    try:
        data: str = event.__pydantic_serializer__.to_json(event).decode()
    except PydanticSerializationError as exc:  # a lone surrogate has no UTF-8 encoding
        check_storable(event.model_dump(), "event")
        raise ValueNotStorable(f"event {event.id} cannot be stored as JSON: {exc}", field="event") from exc
    if "\\u0000" in data:  # a NUL (or text that spells its escape): look closer
        check_storable(event.model_dump(), "event")
    return data


def _utf8_size(text: str) -> int:
    """UTF-8 length of ``text`` (``isascii`` is a flag lookup: most events skip the encode)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
