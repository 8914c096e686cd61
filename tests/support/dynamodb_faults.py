"""Fault injection on a boto3 DynamoDB client, through botocore's event hooks (the real engine answers the rest).

``Faults(client)`` counts the client's API calls by operation and, for the calls you name (the n-th
``BatchWriteItem`` from now, say), makes them:

* ``fail``: raise an exception instead of being sent;
* ``die``: raise ``Died``, a ``BaseException`` standing for the writer's process dying at that point —
  no ``except Exception`` in the store can swallow it;
* ``unprocessed``: send only the first part of a ``BatchWriteItem``'s items and report the rest in
  ``UnprocessedItems``, as DynamoDB does when a partition is throttled;
* ``throttle``: answer the HTTP request with a 400 ``ThrottlingException`` (below botocore's retry
  layer, which therefore retries it);
* ``pause``: block until an event is set (the writer is slow), after telling the test it got there;
* ``error``: answer the HTTP request with a 400 of a DynamoDB error code (``TransactionConflictException``,
  or a ``TransactionCanceledException`` with cancellation reasons), below botocore's retry layer;
* ``lose``: send the HTTP request for real (DynamoDB applies it), then lose the answer: the caller sees a
  read timeout, which botocore's retry mode re-sends like any timeout.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from botocore.awsrequest import AWSResponse


class Died(BaseException):
    """The writer's process dies here."""


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> list[bytes]:
        return [self._body]


class _Http:
    status_code = 200
    headers: dict[str, str] = {}  # noqa: RUF012


class Faults:
    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        self.params: list[tuple[str, dict[str, Any]]] = []
        self._actions: dict[tuple[str, int], Callable[[dict[str, Any]], None]] = {}
        self._throttles: Counter[str] = Counter()
        self._errors: dict[str, list[tuple[str, list[str] | None]]] = {}
        self._lost: Counter[str] = Counter()
        self._after_lost: dict[str, Callable[[], None]] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        events = client.meta.events
        events.register("before-parameter-build.dynamodb", self._on_params)
        events.register("before-call.dynamodb", self._on_call)
        events.register("after-call.dynamodb", self._on_answer)
        events.register("before-send.dynamodb", self._on_send)

    # -- what to do -------------------------------------------------------------------------

    def _at(self, operation: str, nth: int, action: Callable[[dict[str, Any]], None], times: int = 1) -> None:
        for n in range(nth, nth + times):
            self._actions[operation, self.calls[operation] + n] = action

    def fail(self, operation: str, nth: int = 1, exc: BaseException | None = None, times: int = 1) -> None:
        from botocore.exceptions import EndpointConnectionError

        error = exc or EndpointConnectionError(endpoint_url="http://injected")

        def action(_: dict[str, Any]) -> None:
            raise error

        self._at(operation, nth, action, times)

    def die(self, operation: str, nth: int = 1) -> None:
        def action(_: dict[str, Any]) -> None:
            raise Died(f"{operation} #{nth}")

        self._at(operation, nth, action)

    def unprocessed(self, nth: int = 1, times: int = 1, keep: float = 0.5) -> None:
        def action(params: dict[str, Any]) -> None:
            ((table, items),) = params["RequestItems"].items()
            cut = int(len(items) * keep)
            if cut:  # send the first part; with nothing to send, _on_call answers without sending
                params["RequestItems"][table] = items[:cut]
            self._local.unprocessed = (table, items[cut:], cut == 0)

        self._at("BatchWriteItem", nth, action, times)

    def pause(self, operation: str, nth: int, arrived: threading.Event, resume: threading.Event) -> None:
        def action(_: dict[str, Any]) -> None:
            arrived.set()
            if not resume.wait(timeout=30):
                raise TimeoutError("the test never resumed the paused call")

        self._at(operation, nth, action)

    def throttle(self, operation: str, attempts: int) -> None:
        """The next ``attempts`` HTTP attempts of ``operation`` are answered with a throttling error."""
        self._throttles[operation] += attempts

    def error(
        self, operation: str, code: str, attempts: int = 1, reasons: list[str] | None = None, nth: int | None = None
    ) -> None:
        """The next ``attempts`` HTTP attempts of ``operation`` (from its ``nth`` call from now, if given) are
        answered with a 400 ``code`` (with these ``CancellationReasons`` codes, for a
        ``TransactionCanceledException``); DynamoDB never sees them."""

        def arm(_: dict[str, Any] | None = None) -> None:
            with self._lock:
                self._errors.setdefault(operation, []).extend([(code, reasons)] * attempts)

        if nth is None:
            arm()
        else:
            self._at(operation, nth, arm)

    def lose(
        self, operation: str, attempts: int = 1, then: Callable[[], None] | None = None, nth: int | None = None
    ) -> None:
        """The next ``attempts`` HTTP attempts of ``operation`` (from its ``nth`` call from now, if given) reach
        DynamoDB, which applies them, and their answers are lost: each raises a read timeout instead (after
        running ``then``, if given)."""

        def arm(_: dict[str, Any] | None = None) -> None:
            with self._lock:
                self._lost[operation] += attempts
                if then is not None:
                    self._after_lost[operation] = then

        if nth is None:
            arm()
        else:
            self._at(operation, nth, arm)

    # -- hooks ------------------------------------------------------------------------------

    def _on_params(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        with self._lock:
            self.calls[model.name] += 1
            self.params.append((model.name, params))
            action = self._actions.pop((model.name, self.calls[model.name]), None)
        self._local.unprocessed = None
        if action is not None:
            action(params)

    def _on_call(self, model: Any, **_: Any) -> Any:
        pending = getattr(self._local, "unprocessed", None)
        if pending is not None and pending[2]:  # nothing left to send: answer without sending
            table, items, _ = pending
            self._local.unprocessed = None
            return _Http(), {"UnprocessedItems": {table: items}}
        return None

    def _on_answer(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        pending = getattr(self._local, "unprocessed", None)
        if pending is not None:
            table, items, _ = pending
            parsed.setdefault("UnprocessedItems", {}).setdefault(table, []).extend(items)
            self._local.unprocessed = None

    def _on_send(self, request: Any, **_: Any) -> AWSResponse | None:
        operation = request.headers.get("X-Amz-Target", b"")
        operation = (operation.decode() if isinstance(operation, bytes) else operation).rsplit(".", 1)[-1]
        with self._lock:
            self.sent[operation] += 1
            lost = self._lost[operation] > 0
            if lost:
                self._lost[operation] -= 1
            errors = self._errors.get(operation)
            answer: dict[str, Any] | None = None
            if not lost and errors:
                code, reasons = errors.pop(0)
                answer = {"__type": f"com.amazonaws.dynamodb.v20120810#{code}", "message": "injected"}
                if reasons is not None:
                    answer["CancellationReasons"] = [{"Code": r} for r in reasons]
            elif not lost and self._throttles[operation] > 0:
                self._throttles[operation] -= 1
                answer = {"__type": "com.amazonaws.dynamodb.v20120810#ThrottlingException", "message": "injected"}
        if lost:
            from botocore.exceptions import ReadTimeoutError

            self.client._endpoint.http_session.send(request).content  # applied by DynamoDB; answer dropped
            then = self._after_lost.get(operation)
            if then is not None:
                then()
            raise ReadTimeoutError(endpoint_url=request.url)
        if answer is None:
            return None
        body = json.dumps(answer).encode()
        return AWSResponse(request.url, 400, {"x-amzn-requestid": "injected"}, _Raw(body))
