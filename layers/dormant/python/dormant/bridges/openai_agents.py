"""OpenAI Agents SDK sessions on any dormant store: ``DormantSession(session_id, store)`` (``dormant[openai-agents]``).

Why one module: it is one mapping (an SDK session onto a dormant session), imported alone, only with the
``openai-agents`` extra.

An ``agents.memory.Session`` (the SDK's protocol, which the SDK asks third parties to implement rather than
its internal ``SessionABC``) that behaves as the SDK's own ``SQLiteSession``:

* One SDK session is one dormant session of the dormant app ``app_name`` (``"openai-agents"`` unless told);
  its id is the SDK's session id when that is letters, digits and ``-``, else ``x_`` and its UTF-8 in hex.
* Each item is one ``openai_agents`` event (``dormant.events.OpenAIAgentsEvent``), kept whole as the SDK gave
  it; an item whose JSON passes ``ITEM_PART_CHARS`` is kept as pieces, joined on read. ``pop_item`` appends a
  ``pop`` event naming the item it removes (the ledger keeps what was said; audit sees the pop);
  ``clear_session`` deletes the dormant session (erasure, not hiding).
* ``get_items(limit)``: the last ``limit`` items in order (``session_settings.limit`` when ``None``; all when
  neither); ``0``, none; a negative limit, all (the SQLite session's behaviour).
* ``add_items`` from two processes at once: both land, each process's items in its order (a commit that
  finds the session moved on reads the new events and commits again); ``pop_item`` from two processes never
  pops one item twice.

Store calls are made on the event loop's thread (dormant's stores are synchronous). A session object keeps
the items it read and asks the store only for the events after the version it holds.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, cast

from agents.items import TResponseInputItem
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from ..clock import now_ms
from ..errors import ConfigurationError, InvalidSessionId, StoreBusy
from ..events import OpenAIAgentsEvent
from ..ids import check_app_key, check_id
from ..stores.base import BaseSessionStore, SessionStore, StoredSession
from .inspection import Inspected
from .inspection import inspected as _inspected

__all__ = ["inspected", "ITEM_PART_CHARS", "DormantSession", "session_key"]

ITEM_PART_CHARS = 256 * 1024
"""Characters of an item's JSON (ASCII, escaped) kept in one event: larger items are kept as pieces, each well
under dormant's 1 MiB event limit however the store escapes it again."""
_STRING = r'"(?:[^"\\]|\\.)*"'
_STORED_ITEM = re.compile(
    r'\{"v":1,"id":"([^"\\]+)","created_at":-?\d+,'
    rf'"invocation_id":(?:null|{_STRING}),"agent_name":(?:null|{_STRING}),'
    r'"type":"openai_agents","kind":"item","item":'
)
_STORED_ITEM_END = ',"parts":null,"popped":null}'
"""An ``item`` event whole as dormant's encoding stores it (its fields in order, no extra ones): the item's JSON is
what lies between. JSON escapes every quote inside a string, so the pattern cannot match inside one."""
ATTEMPTS = 50
"""Commits a write tries while other writers keep moving the session on, before ``StoreBusy``."""


def session_key(session_id: object) -> str:
    """The dormant session id an SDK session id is stored under."""
    if not isinstance(session_id, str) or not session_id:
        raise InvalidSessionId(f"session_id is a non-empty string, not {session_id!r}", field="session_id")
    first = session_id[0]
    plain = first.isascii() and first.isalnum() and all((c.isascii() and c.isalnum()) or c == "-" for c in session_id)
    key = session_id if plain else "x_" + session_id.encode("utf-8", "surrogatepass").hex()
    return check_id(key, "session_id", "session_id")


class DormantSession:
    """The SDK's ``Session`` protocol on a dormant store (memory, SQLite, Postgres, DynamoDB)."""

    def __init__(
        self,
        session_id: str,
        store: SessionStore,
        *,
        app_name: str = "openai-agents",
        session_settings: SessionSettings | None = None,
    ) -> None:
        """``app_name``: the dormant app the sessions belong to (``{app}@{tenant}``: a tenant's key space)."""
        if not isinstance(store, SessionStore):
            raise ConfigurationError(f"DormantSession takes a dormant store, not {store!r}")
        self.session_id = session_id
        self.session_settings = session_settings
        self.store = store
        self.app_name = check_app_key(app_name)
        self._key = session_key(session_id)
        self._created_at: int | None = None
        self._version = 0
        self._items: list[tuple[str, str]] = []  # (the id of the event that holds it, the item's JSON)
        self._parts: list[str] = []

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items in the order they were added; the last ``limit`` of them when given."""
        self._refresh()
        held = self._items
        count = resolve_session_limit(limit, self.session_settings)
        if count is not None and count >= 0:
            held = held[-count:] if count else []
        # Parsed afresh from the kept JSON, in one call: the caller's to change, and cheaper than a deep copy.
        return cast(list[TResponseInputItem], json.loads("[" + ",".join(text for _, text in held) + "]"))

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in one commit (retried on top of what other writers appended meanwhile)."""
        if not items:
            return
        events: list[OpenAIAgentsEvent] = []
        for item in items:
            events += _item_events(item)
        self._write(lambda: events)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the most recent item; ``None`` on an empty session."""
        popped: list[Any] = []

        def pop() -> list[OpenAIAgentsEvent]:
            popped.clear()
            if not self._items:
                return []
            event_id, text = self._items[-1]
            popped.append(json.loads(text))
            return [OpenAIAgentsEvent(kind="pop", popped=event_id)]

        self._write(pop, read_first=True)
        return cast(TResponseInputItem, popped[0]) if popped else None

    async def clear_session(self) -> None:
        """Delete the dormant session: every item, from the store (adding again starts a new one)."""
        self.store.delete(self.app_name, self._key)
        self._created_at, self._version, self._items, self._parts = None, 0, [], []

    # -- helpers -----------------------------------------------------------------------------------

    def _write(self, make: Any, *, read_first: bool = False) -> None:
        """Commit ``make()`` at the version held; when another writer moved the session on, read and again."""
        if read_first:
            self._refresh()
        for attempt in range(ATTEMPTS):
            events: list[OpenAIAgentsEvent] = make()
            if not events:
                return
            created = self._created_at if self._created_at is not None else now_ms()
            row = StoredSession(id=self._key, app_name=self.app_name, scopes={}, created_at=created)
            result = self.store.commit(row, events, self._version)
            if result.ok:
                self._created_at, self._version = created, result.version
                for event in events:
                    self._fold(event)
                return
            self._refresh()
            time.sleep(min(0.001 * 2**attempt, 0.05))
        raise StoreBusy(f"session {self.session_id!r} kept moving on under {ATTEMPTS} attempts to write it")

    def _refresh(self) -> None:
        loaded = self._load(self._version or None)
        if loaded is not None and self._created_at is not None and loaded[0].created_at != self._created_at:
            self._created_at, self._version, self._items, self._parts = None, 0, [], []
            loaded = self._load(None)  # deleted and made again meanwhile
        if loaded is None:
            self._created_at, self._version, self._items, self._parts = None, 0, [], []
            return
        row, events = loaded
        self._created_at = row.created_at
        for event in events:
            if type(event) is tuple:
                self._items.append(event)
            elif isinstance(event, OpenAIAgentsEvent):
                self._fold(event)
        self._version = row.version

    def _load(self, after: int | None) -> tuple[StoredSession, list[Any]] | None:
        """The row and the events after ``after``: an item event as stored by dormant's own encoding is taken
        as (its id, its item's JSON) straight from the stored text (no model validation, no re-encoding: a
        long session's read is mostly these); anything else is decoded by the store."""
        store = self.store
        if not isinstance(store, BaseSessionStore) or type(store).decode_event is not BaseSessionStore.decode_event:
            loaded = store.load(self.app_name, self._key, after=after)
            return None if loaded is None else (loaded.row, list(loaded.events))
        found = store.load_encoded(self.app_name, self._key, after=after)
        if found is None:
            return None
        row, encoded = found
        events: list[Any] = []
        for text in encoded:
            head = _STORED_ITEM.match(text)
            if head is not None and text.endswith(_STORED_ITEM_END):
                events.append((head.group(1), text[head.end() : -len(_STORED_ITEM_END)]))
            else:
                events.append(store.decode_event(text))
        return row, events

    def _fold(self, event: OpenAIAgentsEvent) -> None:
        if event.kind == "pop":
            self._items = [(i, item) for i, item in self._items if i != event.popped]
        elif event.kind == "part":
            self._parts.append(str(event.item))
        elif event.parts:
            self._items.append((event.id, "".join(self._parts[-event.parts :])))
            self._parts = []
        else:
            self._items.append((event.id, json.dumps(event.item)))


def _item_events(item: Any) -> list[OpenAIAgentsEvent]:
    """One event holding ``item`` whole; or, past ``ITEM_PART_CHARS`` of JSON, its pieces and then the event
    that joins them."""
    text = json.dumps(item)
    if len(text) <= ITEM_PART_CHARS:
        return [OpenAIAgentsEvent(kind="item", item=item)]
    pieces = [text[i : i + ITEM_PART_CHARS] for i in range(0, len(text), ITEM_PART_CHARS)]
    return [
        *(OpenAIAgentsEvent(kind="part", item=p) for p in pieces),
        OpenAIAgentsEvent(kind="item", parts=len(pieces)),
    ]


def inspected(app_name: str = "openai-agents") -> Callable[[SessionStore], Inspected]:
    """For ``DORMANT_APP=module:attr`` with ``attr = inspected()``: ``dormant serve`` shows these sessions in the
    inspector (``app_name``: the one the sessions were stored under, without a tenant)."""
    return _inspected(app_name, "OpenAI Agents SDK")
