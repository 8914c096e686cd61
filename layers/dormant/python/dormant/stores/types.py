"""The values a store takes and gives: the session's row, a load, a commit's result, a listing's rows, the limits,
and what ``BaseSessionStore`` hands a store's primitives (``PreparedCommit`` and its parts).

The contract they travel through is in ``dormant.stores.contract``; every name here is also importable from
``dormant.stores.base``.
"""

from __future__ import annotations

import base64
import builtins
import itertools
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, cast

from ..errors import (
    InputError,
    InvalidKey,
    VersionConflict,
)
from ..events import Event
from ..ids import (
    MAX_CURSOR_LENGTH,
    MAX_KEY_LENGTH,
    check_id,
)

__all__ = [
    "MAX_CURSOR_TIME",
    "NOT_DUE",
    "MAX_SCOPED_KEY_BYTES",
    "RUNNING_STATUS",
    "WAITING_STATUSES",
    "CommitResult",
    "EncodedEvent",
    "LoadedSession",
    "PreparedCommit",
    "Refused",
    "RunningSession",
    "ScopedStateChange",
    "ScopedWrite",
    "SessionListing",
    "StoreLimits",
    "StoredSession",
    "StoredSnapshot",
    "built",
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
NOT_DUE = (1 << 53) - 1
"""``set_due``'s "nobody need look until the next commit": a wait with no timeout, or one that needs nobody
until its answers come (the next commit, an answer, makes it due again). Exact as a float too (DynamoDB, JSON)."""

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
    """What a store's ``load`` answers: the session's row and its events."""

    row: StoredSession
    events: list[Event]
    """The whole ledger in order, or with ``load(..., after=v)`` the events stored after version ``v``."""

    @property
    def session(self) -> StoredSession:
        """Deprecated in 0.2 (``docs/concepts.md``): ``row``. It was never a ``Session``; 0.3 drops it."""
        warnings.warn(
            "LoadedSession.session is deprecated: use LoadedSession.row (docs/concepts.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.row


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
    due_at: int | None = None
    """From ``due_waits``: when the sweeper is next to look at this wait (epoch ms); else ``None``."""
    version: int | None = None
    """From ``due_waits``: the version the row was read at, which ``set_due`` is conditioned on."""


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


@dataclass(frozen=True)
class StoredSnapshot:
    """A session's derived state as of ``version``: text only the session layer reads (never authoritative)."""

    version: int
    data: str


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


def built(cls: type[_T], **fields: Any) -> _T:
    """An instance of the frozen dataclass ``cls`` holding ``fields`` (every one of them), without its ``__init__``'s
    ``object.__setattr__`` per field: for what a store builds on every read from values it read itself."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
