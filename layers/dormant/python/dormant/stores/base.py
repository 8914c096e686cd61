"""The store contract: seven methods, the records that cross them, and what every store must hold to.

A store persists two things: a session's metadata row with its append-only events, and scoped state
(values shared by every session bound to one user, patient, practice, org, team, or the app). It knows
nothing of agents, runs or derived state: the session service above it decides what to write.

What every store guarantees (and ``dormant.testing.StoreContract`` checks):

* ``commit`` with ``expected_version=0`` creates the session; otherwise it succeeds only when the stored
  version equals ``expected_version``, and then bumps it by exactly one.
* A commit is all or nothing: on a version mismatch (or a deleted session) nothing is written — no
  events, no scoped changes — and the result carries the actual version (0 when there is no row).
* Events are append-only, ordered (within a batch and across batches), and idempotent by event id:
  a re-sent event already stored is skipped without disturbing order; the batch's new events land at
  the end, in order. ``appended`` counts only those.
* ``save_scoped_state`` merges: keys not mentioned are untouched, a key set to ``None`` is deleted.
  Scoped changes passed to ``commit`` are written in the same atomic step as its events.
* ``list`` returns an app's sessions (never another app's), most recently updated first, a page at a
  time: pass ``cursor=`` the last listing's ``cursor`` to continue.
* ``close`` releases what the store owns; calling it twice is harmless.
"""

from __future__ import annotations

import base64
import builtins
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ..errors import InputError, VersionConflict
from ..events import Event, EventBase, parse_event_json
from ..ids import check_id

__all__ = [
    "CommitResult",
    "LoadedSession",
    "ScopedStateChange",
    "SessionListing",
    "SessionStore",
    "StoredSession",
    "check_commit",
    "decode_cursor",
    "encode_cursor",
    "encode_values",
    "event_from_json",
    "event_to_json",
    "merge_scoped_changes",
    "unique_new",
]


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


@dataclass(frozen=True)
class LoadedSession:
    session: StoredSession
    events: list[Event]


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


@runtime_checkable
class SessionStore(Protocol):
    """Where sessions live. Implement these seven methods, then run ``dormant.testing.StoreContract``."""

    def load(self, app_name: str, session_id: str) -> LoadedSession | None:
        """The session's row and its events in order, or ``None``. Never shows half of a commit."""
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
        events whose id is already stored. ``session.scopes`` and ``session.status`` are saved on the row.
        """
        ...

    def delete(self, app_name: str, session_id: str) -> None:
        """Remove the row and its events. Deleting a missing session is not an error."""
        ...

    def load_scoped_state(self, app_name: str, scope: str, scope_id: str) -> dict[str, Any]: ...

    def save_scoped_state(self, app_name: str, scope: str, scope_id: str, state: Mapping[str, Any]) -> None:
        """Merge ``state`` into the scope: unmentioned keys stay, ``None`` deletes a key."""
        ...

    def list(
        self, app_name: str, *, limit: int | None = None, cursor: str | None = None
    ) -> builtins.list[SessionListing]:
        """The app's sessions, most recently updated first; ``cursor`` continues after a listing."""
        ...

    def close(self) -> None: ...


def check_commit(session: StoredSession, new_events: Sequence[Event], expected_version: int) -> None:
    """The argument checks every store makes before touching storage."""
    check_id(session.app_name, "app name")
    check_id(session.id)
    if not isinstance(expected_version, int) or isinstance(expected_version, bool) or expected_version < 0:
        raise InputError(f"expected_version must be an int >= 0, not {expected_version!r}", field="expected_version")
    for event in new_events:
        if not isinstance(event, EventBase):
            raise InputError(f"commit takes events, not {type(event).__name__}", field="new_events")


def merge_scoped_changes(changes: Sequence[ScopedStateChange] | None) -> dict[tuple[str, str], dict[str, Any]]:
    """Group scoped changes by (scope, scope_id); a later change to a key wins."""
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for change in changes or ():
        check_id(change.scope_id, "scope id")
        grouped.setdefault((change.scope, change.scope_id), {})[change.key] = change.value
    return grouped


def unique_new(new_events: Sequence[Event], stored_ids: set[str] | frozenset[str]) -> builtins.list[Event]:
    """The events of a batch that are not stored yet, in order, each id once."""
    seen = set(stored_ids)
    fresh = []
    for event in new_events:
        if event.id not in seen:
            seen.add(event.id)
            fresh.append(event)
    return fresh


def encode_values(values: Mapping[str, Any]) -> dict[str, str | None]:
    """Scoped values as JSON text (``None`` stays ``None``: delete the key)."""
    encoded: dict[str, str | None] = {}
    for key, value in values.items():
        if value is None:
            encoded[key] = None
            continue
        try:
            encoded[key] = json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InputError(f"scoped value {key!r} is not JSON: {exc}", field=f"state.{key}") from exc
    return encoded


def event_to_json(event: Event) -> str:
    return event.model_dump_json()


def event_from_json(data: str | bytes) -> Event:
    return parse_event_json(data)


def encode_cursor(updated_at: int, session_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([updated_at, session_id]).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        updated_at, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return int(updated_at), str(session_id)
    except (ValueError, TypeError) as exc:
        raise InputError("not a listing cursor", field="cursor") from exc
