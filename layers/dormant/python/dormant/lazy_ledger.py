"""The ledger's loading: a session's events held from a position on, the earlier ones fetched from the store the
first time something reads them, and ``EventLog``, the read-only list of them a session hands out.

A session loaded from a snapshot (``dormant.snapshots``) holds only the tail of its ledger. ``LazyLedger`` keeps
the known anchors (stored version, events stored up to it) and reads what is missing with one
``load(after=version)`` from the latest anchor before it, checking that what it reads joins what is held (else the
session was deleted, and perhaps made again, since: ``SessionNotFound``). ``EventLog`` reads through
``held_from`` and ``ledger_length`` alone.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, overload

from .errors import EventIndexError, SessionNotFound
from .events import Event
from .stores.base import SessionStore

__all__ = ["EventLog", "HasStore", "LazyLedger"]

_log = logging.getLogger("dormant.session")
_FIRST_ANCHORS = [(0, 0)]
"""Every ledger's first anchor: version 0 holds no event."""


class HasStore(Protocol):
    """What the ledger's loading needs of the app: its store."""

    @property
    def store(self) -> SessionStore: ...


class LazyLedger:
    """The ledger's events as a session holds them: from position ``_base`` on, the earlier ones fetched from the
    store on first read, starting at the latest known anchor (a stored version and the events stored up to it).

    ``Session`` is one; it sets the attributes below. ``EventLog`` reads through ``held_from`` and
    ``ledger_length`` alone.
    """

    id: str
    app_name: str
    created_at: int
    _runtime: HasStore
    _events: list[Event]
    """The ledger from position ``_base`` on (the whole of it unless loaded from a snapshot)."""
    _base: int
    _index: dict[str, int]
    """Event id -> ledger position, for the events held."""
    _committed: int
    """Events known to be stored (a count from the start of the ledger)."""
    _anchors: list[tuple[int, int]]
    """Known (stored version, events stored up to it), ascending: ``load(after=version)`` starts there."""
    _unchecked: list[Any]
    """Pairs noted since ``_anchors`` was last built (a snapshot's as stored, a string of them in its format 2:
    ``"version,count version,count"``): checked and merged on first use."""

    @property
    def events(self) -> EventLog:
        """The ledger. On a session loaded from a snapshot, reading before the tail fetches the rest (see
        ``EventLog``)."""
        return EventLog(self)

    @property
    def ledger_length(self) -> int:
        """Events in the ledger, held or not."""
        return self._base + len(self._events)

    def held_from(self, position: int | None) -> tuple[int, list[Event]]:
        """The held events and the ledger position of the first, once the events from ``position`` on are held
        (``None``: as they are, nothing fetched). Read the list, never change it."""
        if position is not None:
            self._fetch_from(position)
        return self._base, self._events

    def held_event(self, event_id: str) -> Event | None:
        """The event ``event_id`` if the session holds it (nothing fetched)."""
        position = self._index.get(event_id)
        return None if position is None else self._events[position - self._base]

    def note_anchors(self, anchors: Iterable[tuple[int, int]]) -> None:
        """Add known (stored version, events stored up to it) pairs of this session's stored ledger (merged
        when next read: a later pair for a version wins)."""
        self._unchecked.extend(anchors)

    def _known_anchors(self) -> list[tuple[int, int]]:
        """``_anchors`` with the pairs noted since merged in; a pair that is not two counts is dropped."""
        if self._unchecked:
            known = dict(self._anchors)
            for pair in _pairs(self._unchecked):
                version, count = pair if isinstance(pair, list | tuple) and len(pair) == 2 else (None, None)
                if type(version) is int and type(count) is int and version >= 0 and count >= 0:
                    known[version] = count
                else:
                    _log.warning("session %s: ignoring an anchor that is not two counts: %r", self.id, pair)
            self._unchecked = []
            self._anchors = sorted(known.items())
        return self._anchors

    def anchor_for(self, position: int) -> tuple[int, int]:
        """The latest known (version, count) with count <= ``position``: ``load(after=version)`` reaches it."""
        anchors = self._known_anchors()
        counts = [count for _, count in anchors]
        return anchors[bisect.bisect_right(counts, position) - 1]

    @property
    def anchors(self) -> list[tuple[int, int]]:
        """Known (stored version, events stored up to it) pairs, ascending."""
        return list(self._known_anchors())

    def _fetch_from(self, position: int) -> None:
        """Make sure the events from ``position`` on are held, reading the missing ones from the store."""
        if position >= self._base:
            return
        version, start = self.anchor_for(position)
        loaded = self._runtime.store.load(self.app_name, self.id, after=version)
        if loaded is None:
            raise SessionNotFound(self.id)
        missing = self._base - start
        fetched = loaded.events[:missing]
        # The stored ledger must go on with the first event held, when that one is stored: held events past
        # the last commit (a writer's own, not yet committed) are not in the store, whatever landed since.
        held_stored = bool(self._events) and self._base < self._committed
        joins = len(fetched) == missing and (
            not held_stored or len(loaded.events) <= missing or loaded.events[missing].id == self._events[0].id
        )
        if not joins or loaded.row.created_at != self.created_at:
            raise SessionNotFound(self.id)  # deleted (and perhaps made again): the earlier ledger is gone
        self._events[0:0] = fetched
        self._index.update((event.id, start + n) for n, event in enumerate(fetched))
        self._base = start


class EventLog(Sequence[Event]):
    """A read-only view of the ledger (append through the session, never here).

    On a session loaded from a snapshot, ``len`` and reads within the loaded tail (``[-1]``,
    ``[i:]`` from a recent position) cost nothing more; iterating, or reading before the tail, fetches
    the earlier ledger from the store first (once).
    """

    __slots__ = ("_ledger",)

    def __init__(self, ledger: LazyLedger) -> None:
        self._ledger = ledger

    @overload
    def __getitem__(self, index: int) -> Event: ...
    @overload
    def __getitem__(self, index: slice) -> list[Event]: ...
    def __getitem__(self, index: int | slice) -> Event | list[Event]:
        ledger = self._ledger
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return ledger.held_from(0)[1][index]
            base, held = ledger.held_from(start) if start < stop else ledger.held_from(None)
            return held[max(start - base, 0) : max(stop - base, 0)]
        length = len(self)
        position = index + length if index < 0 else index
        if not 0 <= position < length:
            raise EventIndexError(index, length)
        base, held = ledger.held_from(position)
        return held[position - base]

    def __len__(self) -> int:
        return self._ledger.ledger_length

    def __iter__(self) -> Iterator[Event]:
        return iter(self._ledger.held_from(0)[1])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, EventLog):
            return list(self) == list(other)
        if isinstance(other, list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{len(self)} events>"


def _pairs(noted: Iterable[Any]) -> Iterator[Any]:
    """Noted anchors one by one, a snapshot's string of them (``"version,count ..."``) read into pairs."""
    for item in noted:
        if isinstance(item, str):
            for text in item.split():
                version, _, count = text.partition(",")
                yield (int(version), int(count)) if version.isdigit() and count.isdigit() else text
        else:
            yield item
