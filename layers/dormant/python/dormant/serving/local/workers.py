"""``Workers``: requests side by side, as Lambda runs them, one instance each.

``count`` forked processes, each with its own ``LocalAPI``, app and store connection, each taking one request
at a time from the server, which reads and writes HTTP in threads (a slow client holds up no one) and hands
each request to whichever worker is free. A worker ends when the server closes its pipe, or dies: it reads
EOF.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from multiprocessing.connection import Connection

from ...errors import ConfigurationError, InputError
from .gateway import Reply, refuse
from .pages import LocalAPI

__all__ = ["Workers", "can_fork"]

logger = logging.getLogger(__name__)


def can_fork() -> bool:
    """Whether this platform forks processes (``Workers`` needs it; Windows does not)."""
    return "fork" in multiprocessing.get_all_start_methods()


@dataclass(frozen=True)
class _Worker:
    process: multiprocessing.process.BaseProcess
    connection: Connection


class Workers:
    """``count`` forked processes, each with the ``LocalAPI`` that ``build()`` opens, each taking one request at
    a time: requests run side by side, each in a free worker (``handle`` waits for one).

    ``build`` runs in each worker after the fork (a store connection must not cross one) and is a context
    manager: the worker closes what it opened when it ends. Every worker has built its API when the
    constructor returns; one that could not is a ``ConfigurationError`` with its message. Workers ignore
    SIGINT (Ctrl-C in a terminal reaches the whole process group): the server stops them with ``close``,
    after the requests in flight. A worker whose server dies reads EOF on its pipe and ends too.
    """

    def __init__(
        self, build: Callable[[], AbstractContextManager[LocalAPI]], count: int, *, timeout: float = 60
    ) -> None:
        if count < 1:
            raise InputError(f"workers is >= 1, not {count}", field="workers")
        if not can_fork():
            raise ConfigurationError("this platform cannot fork worker processes: serve with one LocalAPI")
        context = multiprocessing.get_context("fork")
        self._workers: list[_Worker] = []
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        self._alive = count
        self._alive_lock = threading.Lock()
        try:
            for n in range(count):
                ours, theirs = context.Pipe()
                others = [ours, *(worker.connection for worker in self._workers)]
                process = context.Process(target=_work, args=(build, theirs, others), name=f"dormant-worker-{n}")
                process.start()
                theirs.close()
                self._workers.append(_Worker(process, ours))
            for worker in self._workers:
                failed = _started(worker, timeout)
                if failed is not None:
                    raise ConfigurationError(f"a worker process could not start: {failed}")
        except BaseException:
            self.close(timeout=0)
            raise
        for worker in self._workers:
            self._idle.put(worker)

    def handle(self, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes, client: str) -> Reply:
        """Answer one request in the first free worker; a worker that dies on it makes it a 500."""
        request = (method, target, list(headers), body, client)
        while (worker := self._idle.get()) is not None:
            try:
                worker.connection.send(request)
            except OSError:  # it died while idle: the request never reached it, so another may take it
                self._lost(worker)
                continue
            try:
                reply: Reply = worker.connection.recv()
            except (EOFError, OSError):
                self._lost(worker)
                return refuse(500, "the worker process serving this request died; the server's log says why")
            self._idle.put(worker)
            return reply
        self._idle.put(None)  # for the next request waiting
        return refuse(503, "every worker process of this server has died; its log says why: restart it")

    def _lost(self, worker: _Worker) -> None:
        worker.process.join(timeout=5)
        logger.error("dormant serve: worker %s died (exit code %s)", worker.process.pid, worker.process.exitcode)
        with self._alive_lock:
            self._alive -= 1
            if self._alive == 0:
                self._idle.put(None)

    def close(self, timeout: float = 30) -> None:
        """Stop every worker: each ends its request, reads EOF and exits; one still running after ``timeout``
        seconds is killed. Call it once no request is in flight (after ``LocalServer.close``)."""
        for worker in self._workers:
            worker.connection.close()
        deadline = time.monotonic() + timeout
        for worker in self._workers:
            worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.exitcode is None:
                worker.process.kill()
                worker.process.join(timeout=5)


def _started(worker: _Worker, timeout: float) -> str | None:
    """Wait for a new worker's first word: ``None`` once its API is built, else why it could not start."""
    if not worker.connection.poll(timeout):
        return f"worker {worker.process.pid} was not ready in {timeout} s"
    try:
        failed: str | None = worker.connection.recv()
    except (EOFError, OSError):
        worker.process.join(timeout=5)
        return f"worker {worker.process.pid} exited with {worker.process.exitcode}"
    return failed


def _work(
    build: Callable[[], AbstractContextManager[LocalAPI]], connection: Connection, others: list[Connection]
) -> None:
    """A worker's life: build its API, say so, answer requests one at a time until the server's pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for other in others:  # the server's ends of the pipes, ours and the earlier workers': held by the server
        other.close()  # alone, a pipe reads EOF in its worker when the server goes, even killed
    with contextlib.ExitStack() as stack:
        try:
            api = stack.enter_context(build())
        except Exception as exc:
            connection.send(f"{type(exc).__name__}: {exc}")
            return
        connection.send(None)
        while True:
            try:
                method, target, headers, body, client = connection.recv()
            except EOFError:  # the server closed the pipe, or died
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
