"""The store contract: the protocols a store meets, and the optional capabilities a caller asks for.


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
  time: pass ``cursor=`` the last listing's ``cursor`` to continue. A running turn's steps (commits that
  leave a ``running`` session ``running``) may leave its row as the turn's claim listed it (its version and
  ``updated_at``) until the next commit that is no step; a load always has the head. DynamoDB does so, as
  a step written there moves no index entry; the SQL and memory stores list every commit.
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

Every name here is also importable from ``dormant.stores.base``; the values are in ``dormant.stores.types``.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..events import Event
from .types import (
    CommitResult,
    LoadedSession,
    RunningSession,
    ScopedStateChange,
    SessionListing,
    StoredSession,
    StoredSnapshot,
    StoreLimits,
)

__all__ = [
    "BindingIndexStore",
    "DueStore",
    "ErasableStore",
    "LimitedStore",
    "OneReadSnapshotStore",
    "RepairableStore",
    "SessionStore",
    "SnapshotInCommitStore",
    "SnapshotStore",
    "SweepableStore",
]


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
        page is full unless no more match, and its last row's cursor goes on within the same status. A running
        turn's steps may be listed as its claim left the row (see the module's rules)."""
        ...

    def close(self) -> None: ...


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
class DueStore(Protocol):
    """A store that keeps, for each waiting session, when the sweeper is next to look at it (every built-in store),
    so a sweep reads the waits that are due and none of the healthy ones: its reads do not grow with them.

    A commit into a waiting status (``WAITING_STATUSES``) makes the session due from that commit (``due_at`` =
    its ``updated_at``); ``set_due`` moves it (to its timeout once its execution parked, or ``NOT_DUE``); any
    other status takes it out. ``due_waits`` pages the due ones, ``(due_at, app name, id)`` ascending."""

    def due_waits(
        self, before: int, *, limit: int = 100, after: RunningSession | None = None
    ) -> builtins.list[RunningSession]: ...

    def set_due(
        self,
        app_name: str,
        session_id: str,
        version: int,
        due_at: int,
        *,
        scoped_changes: Sequence[ScopedStateChange] = (),
    ) -> bool: ...


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


@runtime_checkable
class SnapshotInCommitStore(Protocol):
    """A store that can keep a session's snapshot in the commit's own transaction (``commit(snapshot=)``), when its
    ``snapshots_in_commit`` says so (the SQL stores): a state read then reads the snapshot at the last commit and
    folds nothing. An app with snapshots hands such a store one with every commit; any other store is handed none."""

    @property
    def snapshots_in_commit(self) -> bool: ...

    def commit(
        self,
        session: StoredSession,
        new_events: Sequence[Event],
        expected_version: int,
        scoped_changes: Sequence[ScopedStateChange] | None = None,
        *,
        snapshot: StoredSnapshot | None = None,
    ) -> CommitResult:
        """``SessionStore.commit``, keeping ``snapshot`` (the session's as of the version granted) with it."""
        ...


@runtime_checkable
class OneReadSnapshotStore(Protocol):
    """A store that reads a session's kept snapshot and the events after it together (every built-in store): a load
    takes one read where a ``SnapshotStore`` alone takes two (the snapshot, then the tail after its version)."""

    def load_with_snapshot(self, app_name: str, session_id: str) -> tuple[StoredSnapshot | None, LoadedSession | None]:
        """The kept snapshot (or ``None``) and the session with the events after its version (all of them when
        there is none; ``None`` when there is no session)."""
        ...
