"""``Workers``: requests side by side, as Lambda runs them, one instance each.

``count`` forked processes, each with its own ``LocalAPI``, app and store connection, each taking one request
at a time from the server, which reads and writes HTTP in threads (a slow client holds up no one) and hands
each request to whichever worker is free. A worker ends when the server closes its pipe, or dies: it reads
EOF (or a reset), and ends quietly. A worker that dies is replaced at once; one that cannot be is the pool's
end (``on_give_up``: the server exits 1).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from ...errors import ConfigurationError, InputError
from .gateway import Reply, refuse
from .pages import LocalAPI

__all__ = ["RESPAWN_TIMEOUT", "Workers", "can_fork"]

logger = logging.getLogger(__name__)


def can_fork() -> bool:
    """Whether this platform forks processes (``Workers`` needs it; Windows does not)."""
    return "fork" in multiprocessing.get_all_start_methods()


RESPAWN_TIMEOUT = 30.0
"""Seconds a worker started in place of a dead one has to build its API; one that cannot makes the server give up."""


@dataclass(frozen=True)
class _Worker:
    process: multiprocessing.process.BaseProcess
    connection: Connection
    dead: threading.Event = field(default_factory=threading.Event)


class Workers:
    """``count`` forked processes, each with the ``LocalAPI`` that ``build()`` opens, each taking one request at
    a time: requests run side by side, each in a free worker (``handle`` waits for one).

    ``build`` runs in each worker after the fork (a store connection must not cross one) and is a context
    manager: the worker closes what it opened when it ends. Every worker has built its API when the
    constructor returns; one that could not is a ``ConfigurationError`` with its message. Workers ignore
    SIGINT (Ctrl-C in a terminal reaches the whole process group): the server stops them with ``close``,
    after the requests in flight. A worker whose server dies reads EOF on its pipe and ends too.

    **A worker that dies** (killed, out of memory, a crash in native code) costs the request it held a 500,
    and a thread of the pool starts another in its place at once, so the server never runs short of
    workers. If the new one cannot start (its ``build`` fails, or is not ready in ``RESPAWN_TIMEOUT``
    seconds), the pool gives up: every request is a 503 and ``on_give_up`` is called with why, so the
    server can exit non-zero and a supervisor restart it.
    """

    def __init__(
        self,
        build: Callable[[], AbstractContextManager[LocalAPI]],
        count: int,
        *,
        timeout: float = 60,
        on_give_up: Callable[[str], None] | None = None,
    ) -> None:
        if count < 1:
            raise InputError(f"workers is >= 1, not {count}", field="workers")
        if not can_fork():
            raise ConfigurationError("this platform cannot fork worker processes: serve with one LocalAPI")
        self._build, self._context = build, multiprocessing.get_context("fork")
        self.on_give_up = on_give_up
        self.inherited: Callable[[], None] | None = None
        """Run first in a worker started in place of a dead one: closes what it inherits from the running server
        (its listening socket, its clients' connections; ``LocalServer.forget``), which is not the worker's."""
        self._workers: list[_Worker] = []  # the live ones (a dead one leaves once the watcher sees it)
        self._lock = threading.Lock()  # the list, and a connection closed while another worker forks
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._born = 0
        self._watcher: threading.Thread | None = None
        try:
            for _ in range(count):
                self._workers.append(self._spawn())
            for worker in self._workers:
                failed = _started(worker, timeout, self._closing)
                if failed is not None:
                    raise ConfigurationError(f"a worker process could not start: {failed}")
        except BaseException:
            self.close(timeout=0)
            raise
        for worker in self._workers:
            self._idle.put(worker)
        self._watcher = threading.Thread(target=self._watch, name="dormant-workers", daemon=True)
        self._watcher.start()

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids."""
        with self._lock:
            return [worker.process.pid for worker in self._workers if worker.process.pid is not None]

    def _spawn(self) -> _Worker:
        with self._lock:  # the server's ends of every pipe, held by the server alone: closed in the new worker
            ours, theirs = self._context.Pipe()
            others = [ours, *(worker.connection for worker in self._workers)]
            process = self._context.Process(
                target=_work, args=(self._build, theirs, others, self.inherited), name=f"dormant-worker-{self._born}"
            )
            self._born += 1
            process.start()
        theirs.close()
        return _Worker(process, ours)

    def handle(self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, client: str) -> Reply:
        """Answer one request in the first free worker; a worker that dies on it makes it a 500."""
        request = (method, target, list(headers), body, client)
        while (worker := self._idle.get()) is not None:
            if worker.dead.is_set():  # died while idle; the watcher has started another
                self._drop(worker)
                continue
            try:
                worker.connection.send(request)
            except OSError:  # it died while idle: the request never reached it, so another may take it
                self._drop(worker)
                continue
            try:
                reply: Reply = worker.connection.recv()
            except (EOFError, OSError):
                self._drop(worker)
                return refuse(500, "the worker process serving this request died; the server's log says why")
            self._idle.put(worker)
            return reply
        self._idle.put(None)  # for the next request waiting
        return refuse(503, "the workers of this server died and none could be started again; its log says why")

    def _drop(self, worker: _Worker) -> None:
        """Close a dead worker's pipe (once no request uses it: the watcher leaves the pipes to the requests)."""
        with self._lock:
            worker.connection.close()

    def _watch(self) -> None:
        """Start a worker in place of each that dies, until the pool closes or one cannot start."""
        while not self._closing.is_set():
            with self._lock:
                live = list(self._workers)
            ended = multiprocessing.connection.wait([worker.process.sentinel for worker in live], timeout=0.5)
            for worker in live:
                if worker.process.sentinel in ended and not self._closing.is_set() and not self._replace(worker):
                    return

    def _replace(self, worker: _Worker) -> bool:
        worker.process.join(timeout=5)
        with self._lock:
            self._workers.remove(worker)
        worker.dead.set()
        logger.error(
            "dormant serve: worker %s died (exit code %s): starting another",
            worker.process.pid,
            worker.process.exitcode,
        )
        new = self._spawn()
        failed = _started(new, RESPAWN_TIMEOUT, self._closing)
        if failed is not None:
            with contextlib.suppress(OSError):
                new.process.kill()
            new.process.join(timeout=5)
            if not self._closing.is_set():
                self._give_up(f"a worker started in place of a dead one could not start: {failed}")
            return False
        with self._lock:
            self._workers.append(new)
        self._idle.put(new)
        logger.warning("dormant serve: worker %s started in place of %s", new.process.pid, worker.process.pid)
        return True

    def _give_up(self, why: str) -> None:
        logger.error("dormant serve: %s", why)
        self._idle.put(None)  # every request waiting for a worker, and each after it, is a 503
        if self.on_give_up is not None:
            self.on_give_up(why)

    def close(self, timeout: float = 30) -> None:
        """Stop every worker: each ends its request, reads EOF and exits; one still running after ``timeout``
        seconds is killed. Call it once no request is in flight (after ``LocalServer.close``)."""
        self._closing.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=RESPAWN_TIMEOUT + 10)
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.connection.close()
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.exitcode is None:
                worker.process.kill()
                worker.process.join(timeout=5)


def _started(worker: _Worker, timeout: float, stop: threading.Event) -> str | None:
    """Wait for a new worker's first word: ``None`` once its API is built, else why it could not start."""
    deadline = time.monotonic() + timeout
    while not worker.connection.poll(0.2):
        if stop.is_set():
            return "the server is stopping"
        if time.monotonic() > deadline:
            return f"worker {worker.process.pid} was not ready in {timeout} s"
    try:
        failed: str | None = worker.connection.recv()
    except (EOFError, OSError):
        worker.process.join(timeout=5)
        return f"worker {worker.process.pid} exited with {worker.process.exitcode}"
    return failed


def _work(
    build: Callable[[], AbstractContextManager[LocalAPI]],
    connection: Connection,
    others: list[Connection],
    inherited: Callable[[], None] | None = None,
) -> None:
    """A worker's life: build its API, say so, answer requests one at a time until the server's pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if inherited is not None:
        inherited()
    for other in others:  # the server's ends of the pipes, ours and the earlier workers': held by the server
        other.close()  # alone, a pipe reads EOF in its worker when the server goes, even killed
    with contextlib.ExitStack() as stack:
        try:
            api = stack.enter_context(build())
        except Exception as exc:
            with contextlib.suppress(OSError):
                connection.send(f"{type(exc).__name__}: {exc}")
            return
        try:
            connection.send(None)
        except OSError:  # the server is gone already
            return
        while True:
            try:
                method, target, headers, body, client = connection.recv()
            except (EOFError, OSError):  # the server closed the pipe, or died (a reset, if it died mid-request)
                return
            try:
                reply = api.handle(method, target, headers, body, client)
            except Exception:  # a bug past the handler's error handling: this request's 500, not the worker's end
                logger.exception("dormant serve: worker %s failed on %s %s", os.getpid(), method, target)
                reply = refuse(500, "the request failed; the server's log says why")
            try:
                connection.send(reply)
            except OSError:  # the server is gone
                return
