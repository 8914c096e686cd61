"""LangGraph checkpoints on any dormant store: ``DormantSaver(store)`` (the ``dormant[langgraph]`` extra).

Why one module: it is one mapping (LangGraph threads onto a dormant store), read top to bottom; it is imported
alone, only with the ``langgraph`` extra.

A ``langgraph.checkpoint.base.BaseCheckpointSaver``, sync and async, with every base capability (``put``,
``put_writes``, ``get_tuple``, ``list``, ``delete_thread``) and the extended ones (``delete_for_runs``,
``copy_thread``, ``prune``), judged by LangGraph's own ``langgraph-checkpoint-conformance``.

The mapping, one way for every store (memory, SQLite, Postgres, DynamoDB):

* One LangGraph thread is one dormant session of the dormant app ``app_name`` (``"langgraph"`` unless told).
  Its dormant id is the thread id when that is letters, digits and ``-`` (a UUID is), else ``x_`` and its
  UTF-8 bytes in hex, so every stored id is one no URL escapes (the inspector's links).
* Everything is a ``langgraph`` event on the thread's ledger (``dormant.events.LangGraphEvent``), so the
  inspector, audit, ``dormant erase`` and retention see LangGraph threads like any other session:
  a ``checkpoint`` (without its channel values), a ``blob`` per channel whose version is new in that
  checkpoint (``new_versions``: a value that did not change is never written again), the ``writes`` of a
  task, and ``removed`` (``delete_for_runs`` and ``prune`` hide checkpoints; ``delete_thread`` deletes).
  Values are serialized by the saver's ``serde`` (LangGraph's own), kept as base64; a value larger than
  ``BLOB_PART_BYTES`` is split over several events, so a checkpoint of any size the store's commit takes
  is kept (dormant's DynamoDB store splits an event over items past DynamoDB's 400 KB item limit).
* Every write is one commit at the version this saver last read or wrote of the thread. A thread another
  process wrote since raises ``ThreadChanged`` (a ``VersionConflict``) and writes nothing: read it again
  (``get_tuple``, which LangGraph does at the start of every run) and retry. Two graphs that run one thread
  at once thus never interleave their checkpoints unnoticed, and nothing either wrote is lost.

Store calls are synchronous (dormant's stores are); the ``a*`` methods make them on the event loop's
thread. A saver keeps the parsed records of the threads it read last and asks the store only for the
events after the version it holds (``load(after=)``).
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..clock import now_ms
from ..errors import ConfigurationError, InputError, InvalidSessionId, ThreadChanged
from ..events import LangGraphEvent
from ..ids import check_app_key, check_id, new_id
from ..stores.base import SessionStore, StoredSession
from .inspection import Inspected
from .inspection import inspected as _inspected

__all__ = ["inspected", "BLOB_PART_BYTES", "DormantSaver", "ThreadChanged", "thread_key"]

BLOB_PART_BYTES = 512 * 1024
"""Serialized bytes of one value per ``blob`` event (its base64 fits dormant's 1 MiB event limit)."""
CACHED_THREADS = 256
"""Threads whose parsed records a saver keeps (the store stays the truth: a read asks for the newer events)."""
PACKED_BYTES = 64 * 1024
"""Base64 bytes of a checkpoint's new values kept in its own event (larger: a ``blob`` event per value)."""
BATCH_EVENTS = 24
"""Events one commit of queued writes takes at most (within DynamoDB's one-call commit)."""
BATCH_BYTES = 1 << 20
"""Serialized bytes of values one commit of queued writes takes at most (a larger write goes alone)."""
LINGER_SECONDS = 0.005
"""How long a commit of task writes waits at most for the checkpoint that follows them (see ``_linger``)."""
COPY_BATCH = 64
"""Events per commit when ``copy_thread`` writes the copy."""


def thread_key(thread_id: object) -> str:
    """The dormant session id a LangGraph thread is stored under."""
    if isinstance(thread_id, int) and not isinstance(thread_id, bool):
        thread_id = str(thread_id)
    if not isinstance(thread_id, str) or not thread_id:
        raise InvalidSessionId(f"thread_id is a non-empty string, not {thread_id!r}", field="thread_id")
    first = thread_id[0]
    plain = first.isascii() and first.isalnum() and all((c.isascii() and c.isalnum()) or c == "-" for c in thread_id)
    key = thread_id if plain else "x_" + thread_id.encode("utf-8", "surrogatepass").hex()
    return check_id(key, "thread_id", "thread_id")


def _thread_id(key: str) -> str:
    return bytes.fromhex(key[2:]).decode("utf-8", "surrogatepass") if key.startswith("x_") else key


def _version_key(version: Any) -> str:
    return json.dumps(version)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    return base64.b64decode(str(text))


@dataclass
class _Record:
    """One checkpoint as stored: the checkpoint without values, its metadata, its parent's id."""

    skeleton: dict[str, Any]
    metadata: dict[str, Any]
    parent: str | None


@dataclass(frozen=True)
class _Delta:
    """A list value stored as the list at ``base`` (another version of the channel) and what was appended:
    its serialized form is ``head`` (the new list's header), the base's elements, then ``tail``."""

    kind: str
    base: tuple[str, str, str]
    head: bytes
    tail: bytes


@dataclass
class _Thread:
    """What a saver read of one thread, at ``version`` (a session made at ``created_at``)."""

    created_at: int
    version: int = 0
    checkpoints: dict[tuple[str, str], _Record] = field(default_factory=dict)
    blobs: dict[tuple[str, str, str], tuple[str, bytes]] = field(default_factory=dict)
    deltas: dict[tuple[str, str, str], _Delta] = field(default_factory=dict)
    last: dict[tuple[str, str], tuple[tuple[str, str, str], bytes]] = field(default_factory=dict)
    parts: dict[tuple[str, str, str], list[bytes]] = field(default_factory=dict)
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, bytes, str]]] = field(default_factory=dict)
    removed: set[tuple[str, str]] = field(default_factory=set)

    def live(self, ns: str | None) -> list[tuple[str, str]]:
        """The (namespace, id) of the checkpoints not removed, in ``ns`` (every one: ``None``), newest first."""
        keys = [k for k in self.checkpoints if (ns is None or k[0] == ns) and k not in self.removed]
        return sorted(keys, key=lambda k: k[1], reverse=True)


@dataclass
class _Queued:
    """One write's events waiting for a commit; ``done`` once stored, or failed with ``error``."""

    events: builtins.list[LangGraphEvent]
    size: int
    done: bool = False
    error: BaseException | None = None


class _Gate:
    """A thread's gate, and how many hold it or wait for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class DormantSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpointer contract on a dormant store (memory, SQLite, Postgres, DynamoDB)."""

    def __init__(
        self, store: SessionStore, *, app_name: str = "langgraph", serde: SerializerProtocol | None = None
    ) -> None:
        """``app_name``: the dormant app the threads are sessions of (``{app}@{tenant}`` keeps them in a
        tenant's key space, where dormant's HTTP API and inspector show them to that caller)."""
        if not isinstance(store, SessionStore):
            raise ConfigurationError(f"DormantSaver takes a dormant store, not {store!r}")
        super().__init__(serde=serde)
        self.store = store
        self.app_name = check_app_key(app_name)
        self._threads: OrderedDict[str, _Thread] = OrderedDict()
        self._lock = threading.RLock()
        self._queued: dict[str, builtins.list[_Queued]] = {}
        self._gates: dict[str, _Gate] = {}
        self._arrived = threading.Condition(self._lock)
        self._commit_seconds = 0.0

    # -- reads -------------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, given_ns = _where(config)
        ns = given_ns or ""
        key = thread_key(thread_id)
        with self._gated(key), self._lock:
            self._flush(key)
            thread = self._refresh(key)
            if thread is None:
                return None
            checkpoint_id = get_checkpoint_id(config)
            if checkpoint_id is None:
                live = thread.live(ns)
                if not live:
                    return None
                checkpoint_id = live[0][1]
            elif (ns, checkpoint_id) not in thread.checkpoints or (ns, checkpoint_id) in thread.removed:
                return None
            return self._tuple(thread_id, thread, ns, checkpoint_id)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Newest first per thread; of one thread (``config``) or of all (``None``), of one namespace when the
        config names one; only checkpoints whose metadata holds every ``filter`` item, older than ``before``."""
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise InputError(f"limit is an int >= 0, not {limit!r}", field="limit")
        configurable: Mapping[str, Any] = (config or {}).get("configurable") or {}
        keys = [thread_key(configurable["thread_id"])] if "thread_id" in configurable else self._all()
        ns = configurable.get("checkpoint_ns")
        only = configurable.get("checkpoint_id")
        below = get_checkpoint_id(before) if before is not None else None
        found: list[CheckpointTuple] = []
        for key in keys:
            with self._gated(key), self._lock:
                self._flush(key)
                thread = self._refresh(key)
                if thread is None:
                    continue
                for cns, cid in thread.live(ns):
                    if (only is not None and cid != only) or (below is not None and cid >= below):
                        continue
                    record = thread.checkpoints[(cns, cid)]
                    if filter and not all(self._decode(record.metadata).get(k) == v for k, v in filter.items()):
                        continue
                    if limit is not None and len(found) >= limit:
                        break
                    found.append(self._tuple(_thread_id(key), thread, cns, cid))
        yield from found

    # -- writes ------------------------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """One commit: a ``blob`` for each channel in ``new_versions`` (only those), then the ``checkpoint``."""
        thread_id, ns = _where(config)
        ns = ns or ""
        skeleton = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint["channel_values"]
        parent_id = get_checkpoint_id(config)
        with self._lock:
            thread = self._refresh_if_unknown(thread_key(thread_id))
            parent = thread.checkpoints.get((ns, parent_id)) if thread is not None and parent_id else None
            before: dict[str, Any] = self._decode(parent.skeleton).get("channel_versions") or {} if parent else {}
            events: list[LangGraphEvent] = []
            full: dict[str, tuple[tuple[str, str, str], bytes]] = {}
            for channel, version in new_versions.items():
                if channel not in values:
                    events += _blob_events(ns, channel, version, ("empty", b""))
                    continue
                kind, data = self.serde.dumps_typed(values[channel])
                full[channel] = ((ns, channel, _version_key(version)), data)
                base = before.get(channel)
                delta = (
                    _delta(thread, ns, channel, base, kind, data) if thread is not None and base is not None else None
                )
                if delta is not None:
                    head, tail = delta
                    events += _blob_events(ns, channel, version, (kind, tail), base=(base, head))
                else:
                    events += _blob_events(ns, channel, version, (kind, data))
            queued = self._put(thread_id, thread, checkpoint, config, metadata, skeleton, ns, events, full)
        self._wait(thread_key(thread_id), queued)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _put(
        self,
        thread_id: str,
        thread: _Thread | None,
        checkpoint: Checkpoint,
        config: RunnableConfig,
        metadata: CheckpointMetadata,
        skeleton: dict[str, Any],
        ns: str,
        events: builtins.list[LangGraphEvent],
        full: dict[str, tuple[tuple[str, str, str], bytes]],
    ) -> _Queued:
        data: dict[str, Any] = {
            "id": checkpoint["id"],
            "parent": get_checkpoint_id(config),
            "checkpoint": self._encode(skeleton),
            "metadata": self._encode(dict(get_serializable_checkpoint_metadata(config, metadata))),
        }
        if (
            events
            and sum(len(str(e.data["data"])) for e in events) <= PACKED_BYTES
            and all(e.data["parts"] == 1 for e in events)
        ):  # small values ride in the checkpoint's own event: one stored item each, not one per value
            data["values"] = [dict(e.data) for e in events]
            events = []
        events.append(LangGraphEvent(kind="checkpoint", checkpoint_ns=ns, data=data))
        queued, held = self._queue(thread_key(thread_id), thread, events, sum(len(v[1]) for v in full.values()))
        for channel, value in full.items():  # the serialized values written: the base of the next version's delta
            held.last[(ns, channel)] = value
        return queued

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """One ``writes`` event; a write at an index the task already wrote is kept once (special channels,
        at their negative index, are replaced), so a retried task writes nothing twice."""
        self._put_writes(config, writes, task_id, task_path, linger=True)

    def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str, *, linger: bool
    ) -> None:
        thread_id, ns = _where(config)
        ns = ns or ""
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise InputError("put_writes needs the config of a checkpoint (its checkpoint_id)", field="checkpoint_id")
        key = thread_key(thread_id)
        size = 0
        with self._lock:
            thread = self._refresh_if_unknown(key)
            held = thread.writes.get((ns, checkpoint_id), {}) if thread is not None else {}
            rows: list[list[Any]] = []
            blobs: list[LangGraphEvent] = []
            for i, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, i)
                if idx >= 0 and (task_id, idx) in held:
                    continue
                kind, data = self.serde.dumps_typed(value)
                size += len(data)
                if len(data) <= BLOB_PART_BYTES:
                    rows.append([idx, channel, kind, _b64(data)])
                else:  # kept in blob pieces before the writes event, which names them
                    ref = new_id()
                    blobs += _blob_events(ns, channel, None, (kind, data), ref=ref)
                    rows.append([idx, channel, kind, {"ref": ref}])
            if not rows:
                return
            event_data: dict[str, Any] = {
                "checkpoint_id": checkpoint_id,
                "task_id": task_id,
                "task_path": task_path,
                "writes": rows,
            }
            events = [*blobs, LangGraphEvent(kind="writes", checkpoint_ns=ns, data=event_data)]
            queued, _ = self._queue(key, thread, events, size)
        self._wait(key, queued, linger=linger)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's session: every checkpoint and write of every namespace, from the store."""
        key = thread_key(thread_id)
        with self._gated(key), self._lock:
            self._flush(key)
            self._threads.pop(key, None)
            self.store.delete(self.app_name, key)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) whose metadata ``run_id`` is one of ``run_ids``, in every
        thread of the app (read one by one: the store keeps no index of run ids)."""
        runs = set(run_ids)
        if not runs:
            return

        def of_runs(thread: _Thread) -> list[tuple[str, str]]:
            return [k for k in thread.live(None) if self._decode(thread.checkpoints[k].metadata).get("run_id") in runs]

        for key in self._all():
            self._remove(key, of_runs)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Append every checkpoint, value and write of the source thread (and what it removed) to the target."""
        source = thread_key(source_thread_id)
        loaded = self.store.load(self.app_name, source)
        if loaded is None:
            return
        copies = [
            event.model_copy(update={"id": new_id()}) for event in loaded.events if isinstance(event, LangGraphEvent)
        ]
        target = thread_key(target_thread_id)
        with self._gated(target), self._lock:
            self._flush(target)
            for start in range(0, len(copies), COPY_BATCH):
                self._commit(target_thread_id, copies[start : start + COPY_BATCH])

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: remove every checkpoint but the newest of each namespace (the newest keeps its
        writes and the values it reads); ``delete``: delete the threads."""
        if strategy not in ("keep_latest", "delete"):
            raise InputError(f"strategy is 'keep_latest' or 'delete', not {strategy!r}", field="strategy")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            self._remove(thread_key(thread_id), _all_but_latest)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version greater than ``current``, unique to this write (a random tail): a graph resumed from an
        older checkpoint makes new versions that never collide with those of the branch it left."""
        if current is None:
            count = 0
        elif isinstance(current, int):
            count = current
        else:
            count = int(str(current).split(".")[0])
        return f"{count + 1:032}.{random.random():016}"

    # -- async: the same calls, on the loop's thread --------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._put_writes(config, writes, task_id, task_path, linger=False)

    async def adelete_thread(self, thread_id: str) -> None:
        self.delete_thread(thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.prune(thread_ids, strategy=strategy)

    # -- helpers -----------------------------------------------------------------------------------

    def _queue(
        self, key: str, thread: _Thread | None, events: builtins.list[LangGraphEvent], size: int
    ) -> tuple[_Queued, _Thread]:
        """Queue ``events`` (the caller holds the lock) and apply them to the thread as held: the writes queued
        after them build on them (a delta's base, a task's writes already kept). Nothing reads them before
        they are stored: a read first commits what is queued (``_flush``), and a failed commit drops the
        thread as held along with every write queued on it."""
        if thread is None:
            thread = _Thread(created_at=now_ms())
        for event in events:
            _fold(thread, event)
        self._remember(key, thread)
        queued = _Queued(events, size)
        self._queued.setdefault(key, []).append(queued)
        if events[-1].kind == "checkpoint":
            self._arrived.notify_all()
        return queued, thread

    def _wait(self, key: str, queued: _Queued, *, linger: bool = False) -> None:
        """Return once ``queued`` is stored (committed by this call, or with others by another writer's):
        LangGraph's writes of one run arrive from several threads at once, and one commit stores them all."""
        with self._gated(key):
            while not queued.done:
                if linger:  # not on an event loop's thread: the checkpoint could not arrive meanwhile
                    self._linger(key)
                self._flush(key)
        if queued.error is not None:
            raise queued.error

    def _linger(self, key: str) -> None:
        """When only a step's task writes are queued, wait a little (half a commit, at most ``LINGER_SECONDS``) for
        the checkpoint LangGraph puts after them: one commit then stores both."""
        deadline = time.monotonic() + min(LINGER_SECONDS, self._commit_seconds / 2)
        with self._lock:
            while not any(q.events[-1].kind == "checkpoint" for q in self._queued.get(key, ())):
                left = deadline - time.monotonic()
                if left <= 0 or not self._queued.get(key):
                    return
                self._arrived.wait(left)

    def _flush(self, key: str) -> None:
        """Commit the writes queued on the thread (the caller holds its gate), as few commits as fit."""
        with self._lock:
            waiting = self._queued.get(key)
            if not waiting:
                return
            batch: builtins.list[_Queued] = []
            count = size = 0
            while waiting and (
                not batch or (count + len(waiting[0].events) <= BATCH_EVENTS and size + waiting[0].size <= BATCH_BYTES)
            ):
                batch.append(waiting.pop(0))
                count, size = count + len(batch[-1].events), size + batch[-1].size
            if not waiting:
                del self._queued[key]
            thread = self._threads[key]  # held while writes are queued on it (_remember keeps it)
            expected = thread.version
        row = StoredSession(id=key, app_name=self.app_name, scopes={}, created_at=thread.created_at)
        error: BaseException | None = None
        started = time.monotonic()
        try:
            result = self.store.commit(row, [event for queued in batch for event in queued.events], expected)
        except Exception as exc:
            error = exc
        else:
            self._commit_seconds = time.monotonic() - started
            if result.ok:
                with self._lock:
                    thread.version = result.version
                for queued in batch:
                    queued.done = True
                return
            error = ThreadChanged(_thread_id(key), key, expected_version=expected, actual_version=result.version)
        with self._lock:  # what was queued after the batch built on it: it fails too
            self._threads.pop(key, None)
            batch += self._queued.pop(key, [])
        for queued in batch:
            queued.error, queued.done = error, True

    @contextlib.contextmanager
    def _gated(self, key: str) -> Iterator[None]:
        """Hold the thread's gate: whoever commits to the thread or reads it does (taken before the saver's
        lock, never after); the gate is dropped when nobody holds or waits for it and the thread is not held."""
        with self._lock:
            gate = self._gates.get(key)
            if gate is None:
                gate = self._gates[key] = _Gate()
            gate.users += 1
        try:
            with gate.lock:
                yield
        finally:
            with self._lock:
                gate.users -= 1
                if not gate.users and key not in self._threads:
                    self._gates.pop(key, None)

    def _commit(self, thread_id: str, events: Sequence[LangGraphEvent]) -> None:
        """One commit at the version this saver holds of the thread (read first if it holds none); the caller
        holds the thread's gate and the lock, with nothing queued."""
        key = thread_key(thread_id)
        thread = self._refresh_if_unknown(key)
        expected = thread.version if thread is not None else 0
        created = thread.created_at if thread is not None else now_ms()
        row = StoredSession(id=key, app_name=self.app_name, scopes={}, created_at=created)
        result = self.store.commit(row, events, expected)
        if not result.ok:
            self._threads.pop(key, None)
            raise ThreadChanged(str(thread_id), key, expected_version=expected, actual_version=result.version)
        if thread is None:
            thread = _Thread(created_at=created)
        for event in events:
            _fold(thread, event)
        thread.version = result.version
        self._remember(key, thread)

    def _remove(self, key: str, which: Any) -> None:
        """Append a ``removed`` event for the checkpoints ``which(thread)`` names (retried on a concurrent write)."""
        for _ in range(5):
            with self._gated(key), self._lock:
                self._flush(key)
                thread = self._refresh(key)
                if thread is None:
                    return
                gone: list[tuple[str, str]] = which(thread)
                if not gone:
                    return
                event = LangGraphEvent(kind="removed", data={"checkpoints": [list(k) for k in gone]})
                try:
                    self._commit(_thread_id(key), [event])
                    return
                except ThreadChanged:
                    continue
        raise ThreadChanged(_thread_id(key), key, expected_version=0, actual_version=0)

    def _refresh_if_unknown(self, key: str) -> _Thread | None:
        thread = self._threads.get(key)
        return thread if thread is not None else self._refresh(key)

    def _refresh(self, key: str) -> _Thread | None:
        """The thread as stored now: the kept one with the events after its version, or read whole."""
        kept = self._threads.pop(key, None)
        loaded = self.store.load(self.app_name, key, after=kept.version if kept is not None else None)
        if loaded is not None and kept is not None and loaded.row.created_at != kept.created_at:
            kept, loaded = None, self.store.load(self.app_name, key)  # deleted and made again meanwhile
        if loaded is None:
            return None
        thread = kept if kept is not None else _Thread(created_at=loaded.row.created_at)
        for event in loaded.events:
            if isinstance(event, LangGraphEvent):
                _fold(thread, event)
        thread.version = loaded.row.version
        self._remember(key, thread)
        return thread

    def _remember(self, key: str, thread: _Thread) -> None:
        self._threads[key] = thread
        self._threads.move_to_end(key)
        while len(self._threads) > CACHED_THREADS:
            oldest = next(iter(self._threads))
            if self._busy(oldest):  # writes queued on it, or a commit or read under way: kept
                self._threads.move_to_end(oldest)
                if all(self._busy(k) for k in self._threads):
                    return
                continue
            self._threads.popitem(last=False)
            gate = self._gates.get(oldest)
            if gate is not None and not gate.users:
                del self._gates[oldest]

    def _busy(self, key: str) -> bool:
        gate = self._gates.get(key)
        return key in self._queued or (gate is not None and gate.users > 0)

    def _all(self) -> builtins.list[str]:
        keys: builtins.list[str] = []
        cursor: str | None = None
        while True:
            page = self.store.list(self.app_name, limit=1000, cursor=cursor)
            keys += [listing.id for listing in page]
            if len(page) < 1000:
                return keys
            cursor = page[-1].cursor

    def _tuple(self, thread_id: str, thread: _Thread, ns: str, checkpoint_id: str) -> CheckpointTuple:
        record = thread.checkpoints[(ns, checkpoint_id)]
        checkpoint = dict(self._decode(record.skeleton))
        values: dict[str, Any] = {}
        for channel, version in (checkpoint.get("channel_versions") or {}).items():
            blob = _full(thread, (ns, channel, _version_key(version)))
            if blob is not None and blob[0] != "empty":
                values[channel] = self.serde.loads_typed(blob)
        checkpoint["channel_values"] = values
        pending = [
            (task, channel, self.serde.loads_typed((kind, data)))
            for (task, _), (channel, kind, data, _path) in thread.writes.get((ns, checkpoint_id), {}).items()
        ]
        parent = record.parent
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}},
            checkpoint=cast(Checkpoint, checkpoint),
            metadata=cast(CheckpointMetadata, self._decode(record.metadata)),
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent is not None
                else None
            ),
            pending_writes=pending,
        )

    def _encode(self, value: dict[str, Any]) -> dict[str, Any]:
        """``value`` as JSON the inspector shows when it is JSON (and reads back equal), else serialized."""
        try:
            text = json.dumps(value, allow_nan=False)
            if "\\u0000" not in text and json.loads(text) == value:
                return {"json": value}
        except (TypeError, ValueError):
            pass
        kind, data = self.serde.dumps_typed(value)
        return {"typed": [kind, _b64(data)]}

    def _decode(self, stored: dict[str, Any]) -> dict[str, Any]:
        if "json" in stored:
            return dict(stored["json"])
        kind, data = stored["typed"]
        return dict(self.serde.loads_typed((kind, _unb64(data))))


def _where(config: RunnableConfig) -> tuple[str, str | None]:
    """The thread id and namespace (``None``: not given) a config names."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        raise InputError("the config names no thread: configurable.thread_id is required", field="thread_id")
    thread_key(thread_id)
    ns = configurable.get("checkpoint_ns")
    return str(thread_id), ns


def _blob_events(
    ns: str,
    channel: str,
    version: Any,
    typed: tuple[str, bytes],
    *,
    ref: str | None = None,
    base: tuple[Any, bytes] | None = None,
) -> list[LangGraphEvent]:
    """A value's events: one, or its pieces of ``BLOB_PART_BYTES``; ``ref``: a pending write's value, by id;
    ``base``: the value is a ``_Delta`` on that version of the channel, with that header."""
    kind, data = typed
    named: dict[str, Any] = {"ref": ref} if ref is not None else {}
    if base is not None:
        named.update({"base": base[0], "head": _b64(base[1])})
    pieces = [data[i : i + BLOB_PART_BYTES] for i in range(0, len(data), BLOB_PART_BYTES)] or [b""]
    return [
        LangGraphEvent(
            kind="blob",
            checkpoint_ns=ns,
            data={
                "channel": channel,
                "version": version,
                "type": kind,
                "data": _b64(piece),
                "part": i,
                "parts": len(pieces),
                **named,
            },
        )
        for i, piece in enumerate(pieces)
    ]


def _fold(thread: _Thread, event: LangGraphEvent) -> None:
    """Apply one stored record to what a saver holds of its thread."""
    ns, data = event.checkpoint_ns, cast(dict[str, Any], event.data)
    if event.kind == "checkpoint":
        for packed in cast(list[dict[str, Any]], data.get("values") or []):
            _fold_blob(thread, ns, packed)
        key = (ns, str(data["id"]))
        thread.checkpoints[key] = _Record(data["checkpoint"], data["metadata"], data.get("parent"))
        thread.removed.discard(key)
    elif event.kind == "blob":
        _fold_blob(thread, ns, data)
    elif event.kind == "writes":
        held_writes = thread.writes.setdefault((ns, str(data["checkpoint_id"])), {})
        task, path = str(data["task_id"]), str(data.get("task_path", ""))
        for idx, channel, kind, encoded in data["writes"]:
            value = (
                thread.blobs.pop(("\x00ref", str(encoded["ref"]), ""), (kind, b""))[1]
                if isinstance(encoded, dict)
                else _unb64(encoded)
            )
            if idx >= 0 and (task, idx) in held_writes:
                continue
            held_writes[(task, idx)] = (channel, kind, value, path)
    elif event.kind == "removed":
        for removed_ns, removed_id in data["checkpoints"]:
            thread.removed.add((removed_ns, removed_id))
            thread.writes.pop((removed_ns, removed_id), None)


def _fold_blob(thread: _Thread, ns: str, data: dict[str, Any]) -> None:
    """Apply one value as stored (a ``blob`` event's data, or one of a checkpoint's ``values``)."""
    where = (
        ("\x00ref", str(data["ref"]), "")
        if "ref" in data
        else (ns, str(data["channel"]), _version_key(data["version"]))
    )
    parts = int(data.get("parts", 1))
    piece = _unb64(data["data"])
    if parts > 1:
        held = thread.parts.setdefault(where, [])
        if int(data.get("part", 0)) == 0:
            held.clear()
        held.append(piece)
        if len(held) < parts:
            return
        piece = b"".join(thread.parts.pop(where))
    thread.blobs.pop(where, None)
    thread.deltas.pop(where, None)
    if "base" in data:
        base = (ns, where[1], _version_key(data["base"]))
        thread.deltas[where] = _Delta(str(data["type"]), base, _unb64(data["head"]), piece)
    else:
        thread.blobs[where] = (str(data["type"]), piece)


def _all_but_latest(thread: _Thread) -> list[tuple[str, str]]:
    newest: dict[str, str] = {}
    for ns, cid in thread.live(None):
        newest.setdefault(ns, cid)
    return [(ns, cid) for ns, cid in thread.live(None) if newest[ns] != cid]


DELTA_MIN_BYTES = 1024
"""A list value this large or larger is stored as what was appended to its parent's version, when it was."""


def _array_header(data: bytes) -> int:
    """The length of the msgpack array header ``data`` starts with (0: not an array)."""
    if not data:
        return 0
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return 1
    return {0xDC: 3, 0xDD: 5}.get(first, 0)


def _delta(thread: _Thread, ns: str, channel: str, base: Any, kind: str, data: bytes) -> tuple[bytes, bytes] | None:
    """(header, appended elements) when ``data`` is the list at version ``base`` with elements appended, byte
    for byte (msgpack lays a list out as a header and then its elements), else ``None``."""
    if kind != "msgpack" or len(data) < DELTA_MIN_BYTES:
        return None
    head = _array_header(data)
    held = _full(thread, (ns, channel, _version_key(base)))
    if not head or held is None or held[0] != kind:
        return None
    base_head = _array_header(held[1])
    body = held[1][base_head:]
    if not base_head or not data.startswith(body, head):
        return None
    return data[:head], data[head + len(body) :]


def _full(thread: _Thread, key: tuple[str, str, str]) -> tuple[str, bytes] | None:
    """The serialized value stored at ``key``, its deltas applied (``None``: none stored)."""
    found = thread.blobs.get(key)
    if found is not None:
        return found
    last = thread.last.get((key[0], key[1]))
    if last is not None and last[0] == key and key in thread.deltas:
        return thread.deltas[key].kind, last[1]
    chain: list[_Delta] = []
    at = key
    while at in thread.deltas and len(chain) <= len(thread.deltas):
        chain.append(thread.deltas[at])
        at = thread.deltas[at].base
    root = thread.blobs.get(at)
    if root is None:
        return None
    data = root[1]
    for delta in reversed(chain):
        data = delta.head + data[_array_header(data) :] + delta.tail
    return (chain[0].kind if chain else root[0]), data


def inspected(app_name: str = "langgraph") -> Callable[[SessionStore], Inspected]:
    """For ``DORMANT_APP=module:attr`` with ``attr = inspected()``: ``dormant serve`` shows these sessions in the
    inspector (``app_name``: the one the sessions were stored under, without a tenant)."""
    return _inspected(app_name, "LangGraph")
