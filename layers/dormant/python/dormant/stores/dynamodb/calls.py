"""Calls to the table: one DynamoDB call with its errors mapped to dormant's, re-sent on a transaction conflict;
batches and queries built on it."""

from __future__ import annotations

import builtins
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from ...errors import StoreBusy, StoreError, StoreThrottled, StoreUnavailable
from ..base import BaseSessionStore
from .items import _BATCH

_THROTTLED = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "LimitExceededException",
}
_THROTTLED_REASONS = {"ProvisionedThroughputExceeded", "ThrottlingError"}
"""Cancellation reasons of a ``TransactWriteItems`` that mean it was throttled."""


class _Exhausted(Exception):
    """``UnprocessedItems`` still left after every re-send."""


class _ConditionFailed(Exception):
    def __init__(self, item: Mapping[str, Any] | None) -> None:
        self.item = item


class _Cancelled(Exception):
    """A ``TransactWriteItems`` cancelled because a condition failed (``items``: what each item held)."""

    def __init__(self, codes: builtins.list[str], items: builtins.list[Mapping[str, Any] | None]) -> None:
        self.codes = codes
        self.items = items


class _Conflict(Exception):
    """DynamoDB refused the request, unapplied, because another request's transaction held one of its items."""


CLIENT_RETRIES = 8
"""Retries of a throttled call on the clients the store builds (botocore's standard mode, ``max_attempts``); a
transaction cancelled for throttling is re-sent as often (``_resends``)."""


class _Throttled(Exception):
    """A ``TransactWriteItems`` cancelled, unapplied, because an item's partition or an index was over its rate."""


def _resends(client: Any) -> int:
    """How often a throttled transaction is re-sent: the client's own retry budget (botocore's ``retries``, which
    counts retries in ``max_attempts`` and the first try too in ``total_max_attempts``), as botocore re-sends any
    other throttled call; its default (2) when the client sets none."""
    retries = getattr(getattr(getattr(client, "meta", None), "config", None), "retries", None) or {}
    if "total_max_attempts" in retries:
        return max(0, int(retries["total_max_attempts"]) - 1)
    return max(0, int(retries.get("max_attempts", 2)))


def _backoff(attempt: int, base: float = 0.025, cap: float = 1.0) -> None:
    """Sleep before re-send ``attempt + 1``: exponential from ``base`` up to ``cap`` seconds, jittered by half,
    so writers that collided do not collide again in step."""
    time.sleep(min(cap, base * 2**attempt) * (0.5 + random.random() / 2))


class _Calls(BaseSessionStore):
    """The table helper every part stands on: the store's settings, and its calls (botocore's errors as dormant's)."""

    _client: Any
    _table: str
    _owns_client: bool
    _listing_shards: int
    _pending_shards: int
    _stale_after_ms: int
    _live_wait_s: float
    _unprocessed_retries: int
    _conflict_retries: int
    _single_call_items: int
    _layout_checked: bool
    _known: dict[str, dict[str, Any]]

    if TYPE_CHECKING:  # the store's first call checks the table's layout (admin)

        def _check_layout(self) -> None: ...

    def _get_items(
        self,
        keys: Sequence[Mapping[str, Any]],
        projection: str,
        *,
        names: Mapping[str, str] | None = None,
        consistent: bool = True,
        what: str = "items",
    ) -> builtins.list[dict[str, Any]]:
        """The items of these keys that exist, read by ``BatchGetItem`` (100 keys a call), re-sending
        ``UnprocessedKeys`` with bounded backoff; past it ``StoreBusy`` (``what`` names them in its message)."""
        found: builtins.list[dict[str, Any]] = []
        for start in range(0, len(keys), 100):
            request: dict[str, Any] = {
                self._table: {
                    "Keys": builtins.list(keys[start : start + 100]),
                    "ProjectionExpression": projection,
                    **({"ExpressionAttributeNames": dict(names)} if names else {}),
                    "ConsistentRead": consistent,
                }
            }
            for attempt in range(self._unprocessed_retries + 1):
                answer = self._call("batch_get_item", RequestItems=request)
                found += answer.get("Responses", {}).get(self._table, [])
                request = answer.get("UnprocessedKeys") or {}
                if not request:
                    break
                if attempt == self._unprocessed_retries:
                    raise StoreBusy(f"DynamoDB left {what} unread after {attempt + 1} BatchGetItem calls")
                _backoff(attempt)
        return found

    def _transact(self, items: Sequence[Mapping[str, Any]]) -> None:
        """One ``TransactWriteItems`` (re-sent by ``_call`` while another transaction holds one of its keys).

        Raises ``_Cancelled`` when a condition failed (the first item's answer first).
        """
        self._call("transact_write_items", TransactItems=builtins.list(items))

    def _write_batches(self, requests: Sequence[Mapping[str, Any]]) -> None:
        """``BatchWriteItem`` in calls of 25, re-sending ``UnprocessedItems`` with bounded backoff."""
        for start in range(0, len(requests), _BATCH):
            pending: Sequence[Mapping[str, Any]] = requests[start : start + _BATCH]
            for attempt in range(self._unprocessed_retries + 1):
                answer = self._call("batch_write_item", RequestItems={self._table: list(pending)})
                pending = answer.get("UnprocessedItems", {}).get(self._table, [])
                if not pending:
                    break
                if attempt == self._unprocessed_retries:
                    raise _Exhausted(f"{len(pending)} items still unprocessed after {attempt + 1} calls")
                _backoff(attempt)

    def _call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """One DynamoDB call, with botocore's errors turned into dormant's.

        A request that met another request's transaction (``TransactionConflictException``, or a
        ``TransactWriteItems`` cancelled for ``TransactionConflict``) was not applied, and botocore does not
        retry it: it is re-sent here with backoff, and past ``conflict_retries`` it is ``StoreBusy``. Nor does it
        retry a transaction cancelled for ``ThrottlingError`` (an index's back-pressure, a hot partition): re-sent
        here with a throttle's backoff as often as the client retries a throttled call (``_resends``), then
        ``StoreThrottled``.
        """
        conflicts = throttled = 0
        while True:
            try:
                return self._send(operation, kwargs)
            except _Conflict as conflict:
                if conflicts >= self._conflict_retries:
                    raise StoreBusy(
                        f"DynamoDB {operation} met another request's transaction {conflicts + 1} times; "
                        f"nothing of it was applied, try again ({conflict})"
                    ) from None
                _backoff(conflicts)
                conflicts += 1
            except _Throttled as refused:
                if throttled >= _resends(self._client):
                    raise StoreThrottled(f"DynamoDB throttled {operation} {throttled + 1} times: {refused}") from None
                _backoff(throttled, base=0.05, cap=2.0)  # a partition's rate is per second
                throttled += 1

    def _send(self, operation: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        self._check_open()
        if not self._layout_checked:
            self._layout_checked = True  # before the check's own calls, which come back through here
            try:
                self._check_layout()
            except BaseException:
                self._layout_checked = False
                raise
        try:
            answer: dict[str, Any] = getattr(self._client, operation)(**kwargs)
            return answer
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = error.get("Code", ""), error.get("Message", "")
            if code == "ConditionalCheckFailedException":
                raise _ConditionFailed(exc.response.get("Item")) from None
            if code == "TransactionConflictException":
                raise _Conflict(message) from None
            if code == "TransactionCanceledException":
                reasons = exc.response.get("CancellationReasons") or []
                codes = [r.get("Code", "") for r in reasons] or ["?"]
                if "ConditionalCheckFailed" in codes:
                    raise _Cancelled(codes, [r.get("Item") for r in reasons] or [None]) from None
                if "TransactionConflict" in codes:
                    raise _Conflict(f"cancellation reasons {codes}") from None
                if _THROTTLED_REASONS.intersection(codes):
                    raise _Throttled(f"cancellation reasons {codes}") from None
                raise StoreError(f"DynamoDB cancelled the transaction: {codes}: {message}") from exc
            if code in _THROTTLED:
                raise StoreThrottled(f"DynamoDB throttled {operation} past the client's retries: {message}") from exc
            if code == "ResourceNotFoundException":
                raise StoreError(
                    f"DynamoDB table {self._table!r} (or an index of it) does not exist: create it with "
                    f"dormant.stores.dynamodb.create_table() or the CDK stack ({message})"
                ) from exc
            raise StoreError(f"DynamoDB {operation} failed: {code}: {message}") from exc
        except (BotoConnectionError, HTTPClientError) as exc:
            raise StoreUnavailable(f"DynamoDB {operation} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"DynamoDB {operation} failed: {exc}") from exc

    def _query(self, **kwargs: Any) -> builtins.list[dict[str, Any]]:
        """Every item a Query returns, following its pages."""
        return builtins.list(self._query_pages(**kwargs))

    def _query_pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        while True:
            page = self._call("query", **kwargs)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
