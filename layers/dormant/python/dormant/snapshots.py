"""Snapshots: a long session loads from its latest snapshot and the tail of its ledger.

Every ``snapshot_every`` events (``adk(snapshot_every=)``, 100 by default) a commit also stores a
snapshot: the session's ``Projection`` as of the committed version (state of every scope, status,
yielded and answered calls, the open invocation), the ledger positions of its last user turns, and
known (version, event count) pairs so a load can start the ledger at a turn. It holds state, not
history, and the store keeps one per session, so storage stays linear in the ledger.

On a store with ``snapshots_in_commit`` (SQLite, Postgres) every commit of an app with snapshots keeps
the snapshot as of that commit in the commit's own transaction (one more row written, no round trip), so a
state read folds nothing; the store keeps it only when the commit lands whole. On the other stores a
snapshot is a cache written after the commit, as a separate best-effort write (a failure is
logged and the commit stands), kept only if no later one is; it is checked on load (format, version,
the row's ``created_at``) and anything that does not fit is ignored — the session is then loaded whole
and the next commit writes a fresh snapshot. It is never trusted over the ledger.

Format 1, JSON: ``{"format": 1, "version", "count", "created_at", "schema": {scope: version},
"projection": Projection.export(), "anchors": [[version, count], ...]}``. The state is folded in the
shape of the scope versions in ``schema``; a snapshot taken before a migration was added is ignored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import metrics
from .errors import InputError
from .projection import Projection
from .session import Runtime, Session
from .stores.base import BaseSessionStore, SnapshotStore, StoredSession, StoredSnapshot

__all__ = [
    "DEFAULT_EVERY",
    "FORMAT",
    "load_session",
    "pending_snapshot",
    "save_after_commit",
    "save_snapshot",
    "snapshot_of",
]

FORMAT = 1
DEFAULT_EVERY = 100
"""Events between snapshots: a load then reads at most about this many events past the snapshot, plus
what the agents' history windows need."""

_log = logging.getLogger("dormant.snapshots")


@dataclass(frozen=True)
class _Snapshot:
    version: int
    count: int
    created_at: int
    projection: Projection
    anchors: list[tuple[int, int]]


def snapshot_of(session: Session, *, pending: bool = False) -> StoredSnapshot:
    """``session``'s snapshot as of its committed version (every event of it must be committed).

    ``pending``: as of the commit about to store every uncommitted event, at the next version (the store
    keeps it in that commit's transaction, only if the commit lands whole).
    """
    projection = session.projection
    anchors = sorted({session.anchor_for(position) for position in projection.recent_turns})
    version = session.version + 1 if pending else session.version
    data = {
        "format": FORMAT,
        "version": version,
        "count": projection.count if pending else session.committed_count,
        "created_at": session.created_at,
        "schema": session.runtime.schema.versions,
        "projection": projection.export(),
        "anchors": [list(anchor) for anchor in anchors],
    }
    return StoredSnapshot(version, json.dumps(data, separators=(",", ":"), allow_nan=False))


def pending_snapshot(session: Session) -> StoredSnapshot | None:
    """The snapshot to keep with the commit about to store ``session``'s uncommitted events, or ``None`` when
    it cannot be built (a cache: the commit goes ahead without it; the next one tries again)."""
    try:
        return snapshot_of(session, pending=True)
    except Exception:
        _log.warning("could not build a snapshot of session %s", session.id, exc_info=True)
        return None


def _decode(stored: StoredSnapshot | None, runtime: Runtime) -> _Snapshot | None:
    """The snapshot, or ``None`` for one of another format, of other scope versions (state folded before a
    migration was added, say), or that does not parse: it is then rebuilt."""
    if stored is None:
        return None
    schema = runtime.schema
    try:
        data: Any = json.loads(stored.data)
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != stored.version:
            return None
        if data.get("schema") != schema.versions:
            return None
        projection = Projection.restore(data["projection"], schema.upcaster)
        count, created_at = data["count"], data["created_at"]
        if projection.count != count or not isinstance(created_at, int):
            return None
        anchors = [(int(version), int(at)) for version, at in data["anchors"]]
    except (InputError, ValueError, TypeError, KeyError, AttributeError):
        _log.warning("ignoring a snapshot that does not parse (version %s)", stored.version, exc_info=True)
        return None
    return _Snapshot(stored.version, count, created_at, projection, anchors)


def load_session(
    runtime: Runtime,
    session_id: str,
    *,
    history: int | None,
    snapshots: bool = True,
    alive: Callable[[StoredSession], bool] | None = None,
) -> Session | None:
    """Load a stored session: from its snapshot and the tail of its ledger when it can, else whole.

    ``alive`` may refuse the row (retention): the session then loads as ``None``.
    ``history`` is how many user turns the app's renderers show (0: none, ``None``: the whole ledger,
    so the whole ledger is read). The tail after the snapshot is read first; when it holds fewer user
    turns than the window, the rest of the window is read from the snapshot's anchors.
    """
    store = runtime.store
    # The base class first: a runtime Protocol check inspects every member, on every read.
    if history is None or not snapshots or not isinstance(store, (BaseSessionStore, SnapshotStore)):
        return _whole(runtime, session_id, covered=None, alive=alive)
    if isinstance(store, BaseSessionStore):  # the snapshot, the row and the tail in one read
        kept, loaded = store.load_with_snapshot(runtime.name, session_id)
        if loaded is None:
            return None
        snapshot = _decode(kept, runtime)
        if kept is None:  # the read holds the whole ledger: fold it (the next commit keeps a snapshot)
            if alive is not None and not alive(loaded.session):
                return None
            session = Session.from_row(runtime, loaded.session, loaded.events)
            session.snapshot_at = 0
            return session
        if snapshot is None:
            return _whole(runtime, session_id, covered=0, alive=alive)  # unreadable: the next commit writes one
    else:
        snapshot = _decode(store.load_snapshot(runtime.name, session_id), runtime)
        if snapshot is None:
            return _whole(runtime, session_id, covered=0, alive=alive)  # none, or unreadable: rebuilt next commit
        loaded = store.load(runtime.name, session_id, after=snapshot.version)
        if loaded is None:
            return None
    row = loaded.session
    if alive is not None and not alive(row):
        return None
    if row.created_at != snapshot.created_at or row.version < snapshot.version:
        return _whole(runtime, session_id, covered=0, alive=alive)  # the session was deleted and made again since
    session = Session.restore(
        runtime,
        row,
        snapshot.projection,
        loaded.events,
        base=snapshot.count,
        anchors=[*snapshot.anchors, (snapshot.version, snapshot.count)],
    )
    session.snapshot_at = snapshot.count
    if history:
        session.turn_window(history)  # the window's turns the tail lacks, read now rather than mid-run
    return session


def _whole(
    runtime: Runtime,
    session_id: str,
    *,
    covered: int | None,
    created_at: int | None = None,
    alive: Callable[[StoredSession], bool] | None = None,
) -> Session | None:
    """The whole ledger, folded. ``covered``: events the stored snapshot covers (``None``: not looked at)."""
    loaded = runtime.store.load(runtime.name, session_id)
    if loaded is None or (alive is not None and not alive(loaded.session)):
        return None
    row = loaded.session
    session = Session.from_row(runtime, row, loaded.events)
    if covered is not None:
        session.snapshot_at = covered if created_at in (None, row.created_at) else 0
    return session


def save_snapshot(runtime: Runtime, session: Session) -> bool:
    """Store ``session``'s snapshot now; True when the store keeps one at its version (this one, or the one its
    commit kept). Nothing may be uncommitted."""
    store = runtime.store
    session.snapshot_at = session.committed_count
    if not isinstance(store, SnapshotStore):
        return False
    if store.save_snapshot(session.app_name, session.id, snapshot_of(session)):
        return True
    kept = store.load_snapshot(session.app_name, session.id)  # the commit's own, at this version, counts
    return kept is not None and kept.version == session.version


def save_after_commit(runtime: Runtime, session: Session, *, before: int, every: int | None, complete: bool) -> None:
    """After a commit that took the ledger from ``before`` events to ``session.committed_count``: store a
    snapshot when it crossed a multiple of ``every``, or ``every`` events landed since the last snapshot
    this session knows of.

    ``complete`` says the store appended every event sent (else the stored ledger may order them
    otherwise, and this session's fold is not the snapshot to keep). Best effort: an error is logged.
    """
    after = session.committed_count
    if every is None or not complete or (after // every == before // every and after - session.snapshot_at < every):
        return
    try:
        save_snapshot(runtime, session)
    except Exception:  # a cache: the commit has landed and stands
        metrics.count("snapshot_write_failures")
        _log.warning("could not store a snapshot of session %s", session.id, exc_info=True)
