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

Format 2, JSON: ``{"format": 2, "version", "count", "created_at", "schema": {scope: version} (left out when
no scope has migrations),
"projection": Projection.export(), "anchors": "version,count version,count ..."}``, where the projection's
``recent_turns`` too is one string of counts (``"1194 1195 ..."``): a fresh load parses two strings there,
not up to 150 integers in up to 51 lists, which was two thirds of the parse (format 1, read too, held them
as JSON arrays). The state is folded in the shape of the scope versions in ``schema``; a snapshot taken
before a migration was added is ignored.

A load reads a snapshot in part (``Projection.resume``): the count, the scopes' values and the status at
once, the rest of the fold and the anchors on first use, so a state read builds no invocation, call or turn
list. A rest that does not parse then is replayed from the ledger; an anchor that does not is dropped.
"""

from __future__ import annotations

import bisect
import json
import logging
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple, TypeGuard

from pydantic_core import from_json

from . import metrics
from .errors import InputError, SessionNotFound
from .ids import ID_MATCH, check_id
from .projection import UNSET, Projection
from .session import Runtime, Session
from .stores.base import (
    BaseSessionStore,
    OneReadSnapshotStore,
    SessionStore,
    SnapshotInCommitStore,
    SnapshotStore,
    StoredSession,
    StoredSnapshot,
)

__all__ = [
    "DEFAULT_EVERY",
    "FORMAT",
    "keeps_snapshot_in_commit",
    "load_session",
    "pending_snapshot",
    "save_after_commit",
    "save_snapshot",
    "snapshot_of",
]

FORMAT = 2
_READABLE = (1, 2)
"""Formats a load reads: 1 held the turn positions and the anchors as JSON arrays."""
DEFAULT_EVERY = 100
"""Events between snapshots: a load then reads at most about this many events past the snapshot, plus
what the agents' history windows need."""

_log = logging.getLogger("dormant.snapshots")
_NO_MIGRATIONS: dict[str, int] = {}
"""A format 2 snapshot of an app with no migrations leaves ``schema`` out (format 1 wrote ``{}``)."""
_ANCHORS = (str, list)
"""What a snapshot's anchors are stored as (format 2: one string; 1: a list of pairs)."""


class _Snapshot(NamedTuple):
    version: int
    events: int
    """How many events the fold holds (the snapshot's ``count``)."""
    created_at: int
    projection: Projection
    """Resumed: the rest of the fold is read on first use (``Projection.resume``)."""
    anchors: list[Any] | str
    """As stored (format 1: pairs; 2: one string of them): ``Session.restore`` checks them when first needed."""


def snapshot_of(session: Session, *, pending: bool = False) -> StoredSnapshot:
    """``session``'s snapshot as of its committed version (every event of it must be committed).

    ``pending``: as of the commit about to store every uncommitted event, at the next version (the store
    keeps it in that commit's transaction, only if the commit lands whole).
    """
    projection = session.projection
    known = session.anchors  # anchor_for per turn, with the counts listed once (not once per turn)
    counts = [count for _, count in known]
    anchors = sorted({known[bisect.bisect_right(counts, position) - 1] for position in projection.recent_turns})
    version = session.version + 1 if pending else session.version
    data = {
        "format": FORMAT,
        "version": version,
        "count": projection.count if pending else session.committed_count,
        "created_at": session.created_at,
        "projection": _compact(projection),
        "anchors": " ".join(f"{version},{count}" for version, count in anchors),
    }
    if session.runtime.schema.versions:  # left out when no scope has migrations: one dict fewer per load
        data["schema"] = session.runtime.schema.versions
    return StoredSnapshot(version, json.dumps(data, separators=(",", ":"), allow_nan=False))


def _compact(projection: Projection) -> dict[str, Any]:
    """``projection.export()`` as format 2 stores it: the turn positions as one string, fields left at a fresh
    projection's values (``UNSET``) left out."""
    exported = projection.export()
    exported["recent_turns"] = " ".join(map(str, exported["recent_turns"]))
    return {key: value for key, value in exported.items() if key not in UNSET or value != UNSET[key]}


_IN_COMMIT: set[type] = set()


def keeps_snapshot_in_commit(store: SessionStore) -> TypeGuard[SnapshotInCommitStore]:
    """Whether ``store`` keeps a snapshot handed to its commit (a ``SnapshotInCommitStore`` whose
    ``snapshots_in_commit`` is true). Asked on every commit: a runtime Protocol's check is some 20 µs of Python, so
    a class that holds both members itself (not only its instances) is remembered."""
    cls = type(store)
    if cls not in _IN_COMMIT:
        if not isinstance(store, SnapshotInCommitStore):
            return False
        if hasattr(cls, "snapshots_in_commit") and hasattr(cls, "commit"):
            _IN_COMMIT.add(cls)
    return bool(store.snapshots_in_commit)  # type: ignore[attr-defined]  # (the protocol's, checked above)


def pending_snapshot(session: Session) -> StoredSnapshot | None:
    """The snapshot to keep with the commit about to store ``session``'s uncommitted events, or ``None`` when
    it cannot be built (a cache: the commit goes ahead without it; the next one tries again)."""
    try:
        return snapshot_of(session, pending=True)
    except Exception:
        _log.warning("could not build a snapshot of session %s", session.id, exc_info=True)
        return None


def _replay_unavailable() -> Projection:
    raise InputError("this snapshot's fold does not parse, and no ledger was given to replay", field="snapshot")


def _decode(
    stored: StoredSnapshot | None, runtime: Runtime, rebuild: Callable[[], Projection] = _replay_unavailable
) -> _Snapshot | None:
    """The snapshot, or ``None`` for one of another format, of other scope versions (state folded before a
    migration was added, say), or that does not parse: it is then rebuilt.

    Checked now: the format, the version, the scope versions, the counts, the scopes' values and the status
    (what a state read shows). The rest of the fold is read when first used (``Projection.resume``), and
    replayed from the ledger should it not parse; an anchor that is not two counts is dropped when first
    needed. The text is parsed by pydantic-core's JSON parser, about three times ``json.loads``'s speed.
    """
    if stored is None:
        return None
    try:
        data: Any = from_json(stored.data)
        if not isinstance(data, dict) or data.get("format") not in _READABLE or data.get("version") != stored.version:
            return None
        schema = runtime.schema
        if data.get("schema", _NO_MIGRATIONS) != schema.versions:
            return None
        count, created_at, anchors = data["count"], data["created_at"], data["anchors"]
        projection = Projection.resume(data["projection"], schema.upcaster, rebuild)  # checks what it reads now
        if projection.count != count or type(created_at) is not int or type(anchors) not in _ANCHORS:
            return None
    except (InputError, ValueError, TypeError, KeyError, AttributeError):
        _log.warning("ignoring a snapshot that does not parse (version %s)", stored.version, exc_info=True)
        return None
    return tuple.__new__(_Snapshot, (stored.version, count, created_at, projection, anchors))  # no Python __new__


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
    if type(session_id) is not str or ID_MATCH(session_id) is None:
        check_id(session_id)  # words the refusal
    store = runtime.store
    kind = "base" if type(store) in _KINDS else _kind(store)
    if history is None or not snapshots or kind is None:
        return _whole(runtime, session_id, covered=None, alive=alive)
    found: list[Any] = []
    rebuild = partial(_replay, runtime, session_id, found)
    if kind != "snapshots":  # the snapshot, the row and the tail in one read
        if kind == "base":  # a built-in store: its private read, with no LoadedSession to build and take apart
            base: BaseSessionStore = store  # type: ignore[assignment]  # (kind says so; cast() is a call)
            kept, row, events = base._load_with_snapshot(runtime.name, session_id)
        else:
            one_read: OneReadSnapshotStore = store  # type: ignore[assignment]  # (kind says so)
            kept, loaded = one_read.load_with_snapshot(runtime.name, session_id)
            row, events = (None, []) if loaded is None else (loaded.row, loaded.events)
        if row is None:
            return None
        if kept is None:  # the read holds the whole ledger: fold it (the next commit keeps a snapshot)
            if alive is not None and not alive(row):
                return None
            session = Session.from_row(runtime, row, events)
            session.snapshot_at = 0
            return session
        snapshot = _decode(kept, runtime, rebuild)
        if snapshot is None:
            return _whole(runtime, session_id, covered=0, alive=alive)  # unreadable: the next commit writes one
    else:
        assert isinstance(store, SnapshotStore)
        snapshot = _decode(store.load_snapshot(runtime.name, session_id), runtime, rebuild)
        if snapshot is None:
            return _whole(runtime, session_id, covered=0, alive=alive)  # none, or unreadable: rebuilt next commit
        loaded = store.load(runtime.name, session_id, after=snapshot.version)
        if loaded is None:
            return None
        row, events = loaded.row, loaded.events
    if alive is not None and not alive(row):
        return None
    if row.created_at != snapshot.created_at or row.version < snapshot.version:
        return _whole(runtime, session_id, covered=0, alive=alive)  # the session was deleted and made again since
    anchors = [snapshot.anchors, (snapshot.version, snapshot.events)]
    found.append(snapshot.created_at)  # before the tail is folded: it reads the fold's rest first
    found.append(snapshot.events)
    session = Session.restore(runtime, row, snapshot.projection, events, base=snapshot.events, anchors=anchors)
    found.append(weakref.ref(session))
    if history:
        session.turn_window(history)  # the window's turns the tail lacks, read now rather than mid-run
    return session


def _replay(runtime: Runtime, session_id: str, found: list[Any]) -> Projection:
    """What a snapshot's fold falls back on when its rest does not parse on first use (``Projection.resume``): the
    ledger's first ``count`` events replayed; the session then keeps a fresh snapshot at its next commit. ``found``
    holds the snapshot's ``created_at`` and ``count``, then a weak reference to the session, as the load gets them:
    a strong one would put every loaded session in a reference cycle (session -> projection -> this -> session)
    that only the garbage collector frees. A partial of this is made on every load: cheaper than a closure's cells
    or an object's ``__init__``."""
    created_at, count = found[0], found[1]
    loaded = runtime.store.load(runtime.name, session_id)
    if loaded is None or loaded.row.created_at != created_at or len(loaded.events) < count:
        raise SessionNotFound(session_id)  # deleted (and perhaps made again) since this load
    replayed = Projection(runtime.schema.upcaster)
    for event in loaded.events[:count]:
        replayed.apply(event)
    session = found[2]() if len(found) > 2 else None
    if session is not None:
        session.snapshot_at = 0  # the next commit keeps a fresh one
    return replayed


_KINDS: dict[type, str] = {}


def _kind(store: object) -> str | None:
    """How a load reads a snapshot: ``"one_read"`` for a store that reads it with the tail (``OneReadSnapshotStore``),
    ``"snapshots"`` for another ``SnapshotStore``, else ``None``. A built-in store (``BaseSessionStore``) is
    ``"base"``, the one-read load by its private method, and remembered per class (an ABC's check is Python code); a
    runtime Protocol's answer may differ between instances of a class (it inspects their members), so it is asked
    each time."""
    cls = type(store)
    if cls in _KINDS:
        return "base"
    if isinstance(store, BaseSessionStore):
        _KINDS[cls] = "base"
        return "base"
    if isinstance(store, OneReadSnapshotStore):
        return "one_read"
    return "snapshots" if isinstance(store, SnapshotStore) else None


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
    if loaded is None or (alive is not None and not alive(loaded.row)):
        return None
    row = loaded.row
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
