"""The store contract, and the skeleton every built-in store is made on.

A store persists two things: a session's metadata row with its append-only events, and scoped state
(values shared by every session bound to one user, patient, practice, org, team, or the app). It knows
nothing of agents, runs or derived state: the session service above it decides what to write.

The contract (``SessionStore``; ``dormant.testing.StoreContract`` checks every point):

* ``commit`` with ``expected_version=0`` creates the session; otherwise it succeeds only when the stored
  version equals ``expected_version``, and then bumps it by exactly one.
* A commit is all or nothing: on a version mismatch (or a deleted session) nothing is written — no
  events, no scoped changes — and the result carries the actual version (0 when there is no row).
* Scopes are fixed at creation. A commit onto a stored session (``expected_version > 0``) whose
  ``session.scopes`` differ from the row's — another id, a scope added or left out — raises
  ``ScopeMismatch`` and writes nothing, whatever the version: reloading cannot fix it, so it is an
  error, not a conflict. ``forked_from`` and ``fork_reason`` are written at creation and kept.
* Events are append-only, ordered (within a batch and across batches), and idempotent by event id:
  a re-sent event already stored is skipped without disturbing order; the batch's new events land at
  the end, in order. ``appended`` counts only those.
* Positions: every event is stored with the version of the commit that stored it.
  ``load(..., after=v)`` returns the row and only the events stored by versions after ``v`` — the tail
  a caller holding version ``v`` lacks. ``after=0`` (or ``None``) is the whole ledger. Every store
  keys or indexes events by (version, position in the commit), so the tail is one range read.
* Limits (``StoreLimits``, on ``store.limits``): at most ``max_events_per_commit`` events and
  ``max_commit_bytes`` of encoded events per commit, each event at most ``max_event_bytes`` and each
  scoped value at most ``max_scoped_value_bytes`` once encoded. Over a limit, ``EventTooLarge`` or
  ``CommitTooLarge`` is raised before anything is written. Every store accepts everything within the
  defaults, so an app can move between stores.
* Keys: every app name (an app's, or ``{app}@{tenant}`` for a tenant's view), session id, event id, scope,
  scope id, state key and listing cursor meets the one key rule (``dormant.ids``: its characters, 1 to 128
  characters, no NUL or lone surrogate), checked before anything is written: ``InvalidKey`` (or
  ``InvalidSessionId``, or ``ValueNotStorable`` for a state key no store can keep) naming the field. The
  rule fits every store's keys (DynamoDB's included), so none refuses late what another accepts.
* Expiry: creating the id of a session past its retention (``StoredSession.retention_ms`` after its
  ``updated_at``) starts a new session in its place (``PreparedCommit.replaces``), on every store.
* ``updated_at`` never goes backwards: a commit stores ``max(now, previous)``, so listings keep their
  order when clocks of several writers disagree.
* ``list`` returns an app's sessions (never another app's), most recently updated first, a page at a
  time: pass ``cursor=`` the last listing's ``cursor`` to continue.
* ``close`` releases what the store owns; calling it twice is harmless.

Snapshots (``SnapshotStore``, optional): a store may also keep one derived snapshot per session — the
session's folded state as of a version, as opaque text the session layer writes and reads — so a load
reads the snapshot and the tail of the ledger instead of the whole of it. A snapshot is a cache, never
authoritative: ``save_snapshot`` keeps it only when the session's row exists at that version or later
and no snapshot of a later version is kept (so racing writers never move it back), replacing the one
before it (old snapshots are pruned by being overwritten); ``delete`` removes it with the session; one
larger than ``limits.max_snapshot_bytes`` is not kept. A store without snapshots still works: sessions
are then loaded whole.

``save_scoped_state`` is not part of the Protocol: the runtime writes scoped state only with a commit.
The built-in stores keep it (``BaseSessionStore.save_scoped_state``) for seeding shared values from
outside any session, such as a profile edited in a back office.

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
* optionally ``_save_snapshot``/``_load_snapshot`` (the defaults keep none: loads are then whole).

Then run ``StoreContract`` against it.
"""

from __future__ import annotations

import base64
import builtins
import itertools
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar, cast, runtime_checkable

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
    VersionConflict,
)
from ..events import Event, EventBase, parse_event_json
from ..ids import (
    ID_MATCH,
    MAX_CURSOR_LENGTH,
    MAX_KEY_LENGTH,
    TENANT_SEPARATOR,
    check_app_key,
    check_event_id,
    check_id,
    check_name,
    check_scoped_key,
)
from ..state.schema import BOUND_SCOPES
from ..state.values import check_storable

__all__ = [
    "MAX_CURSOR_TIME",
    "MAX_SCOPED_KEY_BYTES",
    "RUNNING_STATUS",
    "WAITING_STATUSES",
    "BaseSessionStore",
    "CommitResult",
    "EncodedEvent",
    "ErasableStore",
    "LimitedStore",
    "LoadedSession",
    "PreparedCommit",
    "Refused",
    "RepairableStore",
    "RunningSession",
    "ScopedStateChange",
    "ScopedWrite",
    "SessionListing",
    "SessionStore",
    "SnapshotStore",
    "StoreLimits",
    "StoredSession",
    "StoredSnapshot",
    "decode_cursor",
    "encode_cursor",
]


_T = TypeVar("_T")

MAX_SCOPED_KEY_BYTES = 4 * MAX_KEY_LENGTH
"""The most UTF-8 bytes a scoped key can take (``MAX_KEY_LENGTH`` characters of 4 bytes): within DynamoDB's
1,024 for a sort key (the key is one there). The limit itself is in characters (``dormant.ids``)."""
RUNNING_STATUS = "running"
"""The stored status ``running_sessions`` finds (``Projection.status`` while an invocation is open)."""
WAITING_STATUSES = ("awaiting_input", "resumable")
"""The stored statuses ``waiting_sessions`` finds: an invocation open on yielded tools, unanswered or answered."""
_STATUS = re.compile(r"[a-z][a-z_]{0,31}")
"""What ``list(status=)`` accepts: a status as ``Projection.status`` spells them (safe inside any store's key)."""
MAX_CURSOR_TIME = (1 << 63) - 1
"""The largest ``updated_at`` a listing cursor may carry (what a 64-bit SQL integer holds)."""


@dataclass(frozen=True)
class StoredSession:
    """A session's metadata row. Never the events: those are rows (items) of their own."""

    id: str
    app_name: str
    version: int = 0
    scopes: dict[str, str] = field(default_factory=dict)
    created_at: int = 0
    status: str | None = None
    """The session's status as of this version, kept on the row so listings can filter on it."""
    updated_at: int = 0
    forked_from: str | None = None
    """For a fork (a run that could not join its session): the session it was taken from."""
    fork_reason: str | None = None
    """Why the fork was taken."""
    retention_ms: int | None = None
    """How long the session is kept after its last commit (the app's ``retention``; ``None``: for ever).
    A store with its own expiry (DynamoDB's TTL attribute) writes it from this at each commit; the others
    leave expiry to the app, which hides and purges by it."""

    @classmethod
    def of_row(
        cls,
        id: str,
        app_name: str,
        version: int,
        scopes: str,
        created_at: int,
        status: str | None,
        updated_at: int,
        forked_from: str | None,
        fork_reason: str | None,
    ) -> StoredSession:
        """The row as a SQL store reads it (``scopes`` its JSON text), built without the frozen ``__init__``'s
        ten ``object.__setattr__`` calls: a state read builds one and does little else."""
        return built(
            cls,
            id=id,
            app_name=app_name,
            version=version,
            scopes={} if scopes == "{}" else json.loads(scopes),
            created_at=created_at,
            status=status,
            updated_at=updated_at,
            forked_from=forked_from,
            fork_reason=fork_reason,
            retention_ms=None,
        )


@dataclass(frozen=True)
class LoadedSession:
    session: StoredSession
    events: list[Event]
    """The whole ledger in order, or with ``load(..., after=v)`` the events stored after version ``v``."""


@dataclass(frozen=True)
class CommitResult:
    ok: bool
    version: int
    """The stored version after the call: the new one, or the actual one on a conflict."""
    appended: int
    """Events actually added (re-sent ids are not counted)."""

    def raise_on_conflict(self, session_id: str, expected_version: int) -> CommitResult:
        """For callers that prefer exceptions: raise ``VersionConflict`` unless ``ok``."""
        if not self.ok:
            raise VersionConflict(session_id, expected_version=expected_version, actual_version=self.version)
        return self


@dataclass(frozen=True)
class ScopedStateChange:
    """One key of a shared scope, set (or deleted, when ``value`` is ``None``) by a commit."""

    scope: str
    scope_id: str
    key: str
    value: Any = None


class SessionListing(NamedTuple):
    """One session in a listing (a named tuple: listings are built by the thousand)."""

    id: str
    updated_at: int
    created_at: int = 0
    version: int = 0
    status: str | None = None

    @property
    def cursor(self) -> str:
        """Pass as ``list(..., cursor=)`` to get the sessions listed after this one."""
        return encode_cursor(self.updated_at, self.id)

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> builtins.list[SessionListing]:
        """Listings from rows holding the fields in order, built in C (``_make`` costs as much as the query)."""
        return cast("builtins.list[SessionListing]", builtins.list(map(tuple.__new__, itertools.repeat(cls), rows)))


class RunningSession(NamedTuple):
    """A session whose stored status is ``running`` (``running_sessions``): an invocation started and not ended,
    in progress or with its runner gone. The sweeper loads it to read the runner's deadline. ``waiting_sessions``
    answers the same rows for the sessions that wait (``status`` says on what)."""

    app_name: str
    session_id: str
    updated_at: int
    """When it last committed (epoch ms): the oldest come first."""
    status: str = RUNNING_STATUS


@dataclass(frozen=True)
class StoreLimits:
    """How much one commit may carry. The defaults are what every built-in store accepts."""

    max_events_per_commit: int = 10_000
    max_event_bytes: int = 1 << 20
    """One event's encoded JSON, in UTF-8 bytes (1 MiB)."""
    max_commit_bytes: int = 32 << 20
    """All of one commit's encoded events together (32 MiB)."""
    max_scoped_value_bytes: int = 256 << 10
    """One scoped value's encoded JSON (256 KiB)."""
    max_snapshot_bytes: int = 256 << 10
    """One snapshot's text (256 KiB; under DynamoDB's item size). A larger one is not kept: loads replay more."""


@runtime_checkable
class SessionStore(Protocol):
    """Where sessions live. Implement these six methods, then run ``dormant.testing.StoreContract``."""

    def load(self, app_name: str, session_id: str, *, after: int | None = None) -> LoadedSession | None:
        """The row and its events in order (only those stored after version ``after``), or ``None``.

        Never shows half of a commit.
        """
        ...

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
    ) -> CommitResult:
        """Append ``new_events`` and apply ``scoped_changes`` if the stored version is ``expected_version``.

        Must write nothing and return ``ok=False`` with the actual version on a mismatch; must skip
        events whose id is already stored. ``session.status`` is saved on the row; ``session.scopes``
        must match the row's (``ScopeMismatch``).
        """
        ...

    def delete(self, app_name: str, session_id: str) -> None:
        """Remove the row and its events. Deleting a missing session is not an error."""
        ...

    def load_scoped_state(self, app_name: str, scope: str, scope_id: str) -> dict[str, Any]: ...

    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None, status: str | None = None
    ) -> builtins.list[SessionListing]:
        """The app's sessions, most recently updated first; ``cursor`` continues after a listing. With ``status``,
        only the sessions whose stored status is that one, read from an index of (app, status, updated_at): a
        page is full unless no more match, and its last row's cursor goes on within the same status."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class StoredSnapshot:
    """A session's derived state as of ``version``: text only the session layer reads (never authoritative)."""

    version: int
    data: str


@runtime_checkable
class RepairableStore(Protocol):
    """A store whose commits a writer that died can leave pending (DynamoDB's gated commits): the sweeper finishes
    or undoes the stale ones, and a retried run the one its dead runner left."""

    def repair_pending(self, older_than_s: float = 60.0) -> list[Any]: ...

    def repair_session(self, app_name: str, session_id: str) -> Any | None: ...


@runtime_checkable
class ErasableStore(Protocol):
    """A store an erasure (``app.erase``) and a purge across tenants (``purge_tenants``) can run on: beyond the six
    methods, an index of the sessions bound to a shared-scope id, forgetting it, merging shared-scope keys, a scrub
    of what deletes leave, and the app names of an app's tenants. Every built-in store is one (``BaseSessionStore``);
    ``app.erase`` refuses any other store with a ``ConfigurationError``, and a purge then covers the app alone."""

    def bound_sessions(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]: ...

    def forget_bound(self, app_name: str, scope: str, scope_id: str) -> None: ...

    def save_scoped_state(self, app_name: str, scope: str, scope_id: str, state: Mapping[str, Any]) -> None: ...

    def scrub(self) -> str | None: ...

    def app_names(self, prefix: str) -> builtins.list[str] | None: ...


@runtime_checkable
class LimitedStore(Protocol):
    """A store that declares how much one commit may carry (``limits``; every built-in store). The compliance suite
    holds a store that declares none to the defaults, ``StoreLimits()``."""

    @property
    def limits(self) -> StoreLimits: ...


@runtime_checkable
class SweepableStore(Protocol):
    """A store that lists, across its apps, the sessions whose turn runs and those that wait (every built-in store):
    where the sweeper finds turns whose runner died and waits whose wake-up was lost. In any other store the
    sweeper hands on no turn and wakes no wait (it still repairs and purges what the store lets it)."""

    def running_sessions(self, limit: int = 1000) -> builtins.list[RunningSession]: ...

    def waiting_sessions(self, limit: int = 1000) -> builtins.list[RunningSession]: ...


@runtime_checkable
class BindingIndexStore(Protocol):
    """A store that keeps an index of the sessions bound to a shared-scope id (every built-in store): the ADK
    bridge lists one user's sessions from it. On any other store it lists all the app's sessions and keeps the
    user's."""

    def bound_sessions(self, app_name: str, scope: str, scope_id: str) -> builtins.list[str]: ...


@runtime_checkable
class SnapshotStore(Protocol):
    """The optional part of the contract: one snapshot per session, for loading the tail of a long ledger."""

    def save_snapshot(self, app_name: str, session_id: str, snapshot: StoredSnapshot) -> bool:
        """Keep ``snapshot`` unless the row is gone or older, or a later snapshot is kept; True when kept."""
        ...

    def load_snapshot(self, app_name: str, session_id: str) -> StoredSnapshot | None:
        """The snapshot kept for the session, or ``None``."""
        ...


# -- what the base hands a store's primitives ---------------------------------------------------


class EncodedEvent(NamedTuple):
    id: str
    data: str
    """The event as ``encode_event`` made it."""


class ScopedWrite(NamedTuple):
    scope: str
    scope_id: str
    key: str
    value: str | None
    """Encoded JSON, or ``None``: delete the key."""


class Refused(NamedTuple):
    """The gate's answer when it does not open: the stored version (0: no row) and the row's scopes."""

    version: int
    scopes: dict[str, str] | None = None


@dataclass(frozen=True)
class PreparedCommit:
    """A checked, encoded commit, ready for a store's ``_write``."""

    row: StoredSession
    """The row to store: ``version`` is the one to grant, ``updated_at`` and (on create) ``created_at`` are now.

    On an update, keep the stored ``created_at``, ``forked_from`` and ``fork_reason``, and store
    ``updated_at = max(row.updated_at, stored updated_at)``.
    """
    expected_version: int
    events: tuple[EncodedEvent, ...]
    """In order, each id once; ids already stored are the store's to skip (``fresh``)."""
    scoped: tuple[ScopedWrite, ...]
    """One write per key, sorted (so concurrent commits lock keys in the same order)."""
    snapshot: StoredSnapshot | None = None
    """For a store with ``snapshots_in_commit``: the session's snapshot as of ``row.version``, to keep in the
    commit's transaction, over an older one, and only when every event is fresh (else the ledger differs
    from the fold the snapshot holds)."""

    def admits(self, version: int, scopes: Mapping[str, str] | None) -> bool:
        """The gate, for stores that read the row under their lock: the version, and fixed scopes."""
        return version == self.expected_version and (version == 0 or scopes == self.row.scopes)

    def replaces(self, stored_updated_at: int) -> bool:
        """Whether this create takes the id of a stored session past its retention (judged as the app judges
        it, by ``row.retention_ms`` after the stored ``updated_at``): that session is gone, so the create
        starts a new one in its place — none of the old events, snapshot or version shows — as on every
        store, never a conflict that reveals the expired session's version."""
        retention = self.row.retention_ms
        return (
            self.expected_version == 0
            and retention is not None
            and self.row.updated_at >= stored_updated_at + retention
        )

    def fresh(self, stored_ids: set[str] | frozenset[str]) -> builtins.list[EncodedEvent]:
        """The events not stored yet, in order."""
        return [event for event in self.events if event.id not in stored_ids]


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


def built(cls: type[_T], **fields: Any) -> _T:
    """An instance of the frozen dataclass ``cls`` holding ``fields`` (every one of them), without its ``__init__``'s
    ``object.__setattr__`` per field: for what a store builds on every read from values it read itself."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


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


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _utf8_size(text: str) -> int:
    """UTF-8 length of ``text`` (``isascii`` is a flag lookup: most events skip the encode)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def encode_cursor(updated_at: int, session_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, session_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    """``(updated_at, session id)`` from a listing's ``cursor``; ``InputError`` naming ``cursor`` for anything
    ``encode_cursor`` did not make (a float, a number past ``MAX_CURSOR_TIME``, an id no session may have)."""
    refused = InvalidKey("not a listing cursor", field="cursor")
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_LENGTH:
        raise refused
    try:
        decoded = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError) as exc:  # not base64, not UTF-8, not JSON
        raise refused from exc
    if not (isinstance(decoded, list) and len(decoded) == 2):
        raise refused
    updated_at, session_id = decoded
    if not _is_count(updated_at) or updated_at > MAX_CURSOR_TIME:
        raise refused
    try:
        return updated_at, check_id(session_id)
    except InputError as exc:
        raise refused from exc
