"""``Idempotency-Key`` on every store: Powertools idempotency, with its records where the sessions are.

A ``POST /runs`` or ``POST /tools`` retried with the same key returns the first request's result without
running again; the same key with another body is an ``InputError`` naming ``Idempotency-Key``; a retry while
the first still runs is ``RequestInProgress`` (409). The rules are Powertools' own (``idempotent_function``);
only where the records live differs, so a retry behaves on the embedded default as it does deployed:

* DynamoDB: Powertools' ``DynamoDBPersistenceLayer``, in the session table under the partition
  ``I#{app}@{tenant}#{session}`` (``stores.dynamodb.keys.idempotency_pk``), expiring through the table's TTL.
* SQLite and Postgres: ``SQLPersistenceLayer``, a custom persistence layer over the ``idempotency`` table
  the store makes with its schema (``stores.sql_schema``), in the same database; an expired record is
  taken over by the next request with its key, as on DynamoDB.
* Memory: ``MemoryPersistenceLayer``, a dict beside the store (one process, as the memory store is).

Records of a session go with it (``forget``) when it is deleted or erased through the API or the CLI.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Protocol

from aws_lambda_powertools.utilities.idempotency import (
    BasePersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyItemAlreadyExistsError,
    IdempotencyItemNotFoundError,
    IdempotencyPersistenceLayerError,
    IdempotencyValidationError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord

from .. import aws
from ..errors import DormantError, InputError, RequestInProgress, StoreError, StoreThrottled, throttle_code
from ..stores.base import SessionStore

__all__ = [
    "EXPIRES_AFTER_SECONDS",
    "DynamoDBIdempotency",
    "Idempotency",
    "MemoryPersistenceLayer",
    "SQLPersistenceLayer",
    "idempotency_for",
]

EXPIRES_AFTER_SECONDS = 24 * 3600
"""How long a request's result is kept for its retries."""


class Idempotency(ABC):
    """Run a request once per ``Idempotency-Key``; subclasses say where the records live (``layer``, ``forget``)."""

    def __init__(self, expires_after_seconds: int = EXPIRES_AFTER_SECONDS) -> None:
        self.expires_after_seconds = expires_after_seconds

    @abstractmethod
    def layer(self, partition: str) -> BasePersistenceLayer:
        """The Powertools persistence layer keeping the records of ``partition``."""

    @abstractmethod
    def forget(self, partition: str) -> None:
        """Delete every record under ``partition`` (results cached for retries hold what the session held)."""

    def once(
        self,
        partition: str,
        key: str,
        route: str,
        work: Callable[[], dict[str, Any]],
        context: Any,
        payload: str = "",
    ) -> dict[str, Any]:
        """``work()``, or the result of the request that ran first with ``key`` on ``route``; ``payload`` (the
        request's body) must be that request's: a key reused for another body is refused, not replayed."""
        config = IdempotencyConfig(
            event_key_jmespath="[key, route]",
            payload_validation_jmespath="body",
            expires_after_seconds=self.expires_after_seconds,
        )
        config.register_lambda_context(context)  # a request cut off by the Lambda timeout may be retried

        def run(request: dict[str, str]) -> dict[str, Any]:
            return work()

        guarded = idempotent_function(
            run, data_keyword_argument="request", persistence_store=self.layer(partition), config=config
        )
        try:
            result: dict[str, Any] = guarded(request={"key": key, "route": route, "body": payload})
        except IdempotencyValidationError:
            raise InputError(
                f"Idempotency-Key {key!r} was used for another request body; use a new key for a new request",
                field="Idempotency-Key",
            ) from None
        except IdempotencyAlreadyInProgressError:
            raise RequestInProgress(
                f"a request with Idempotency-Key {key!r} is still running; retry later", field="Idempotency-Key"
            ) from None
        except IdempotencyPersistenceLayerError as exc:  # the store's own error (StoreBusy, ...) as it was raised
            cause = next((a for a in exc.args if isinstance(a, DormantError)), None) or exc.__cause__
            if isinstance(cause, DormantError):
                raise cause from None
            if _throttled(exc):  # DynamoDB refused the record for its rate: a throttle, not a fault (429)
                raise StoreThrottled(f"the idempotency records were throttled: {exc}") from exc
            raise StoreError(f"the idempotency records could not be read or written: {exc}") from exc
        return result


def _throttled(exc: BaseException) -> bool:
    """Whether Powertools' persistence error carries a DynamoDB throttle (a botocore ``ClientError``)."""
    return any(throttle_code(c) for c in (*exc.args, exc.__cause__) if isinstance(c, BaseException))


class DynamoDBIdempotency(Idempotency):
    """Powertools' DynamoDB persistence layer, in the session table (as deployed)."""

    def __init__(self, table_name: str, client: Any = None, expires_after_seconds: int = EXPIRES_AFTER_SECONDS) -> None:
        super().__init__(expires_after_seconds)
        self.table_name = table_name
        self._client = client

    def layer(self, partition: str) -> BasePersistenceLayer:
        from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

        from ..stores.dynamodb import TABLE
        from ..stores.dynamodb.keys import idempotency_pk

        return DynamoDBPersistenceLayer(
            table_name=self.table_name,
            key_attr=TABLE.partition_key[0],
            sort_key_attr=TABLE.sort_key[0],
            static_pk_value=idempotency_pk(partition),
            expiry_attr=TABLE.ttl_attribute,
            boto3_client=self._boto(),
        )

    def forget(self, partition: str) -> None:
        from ..stores.dynamodb import TABLE
        from ..stores.dynamodb.keys import idempotency_pk

        client = self._boto()
        query: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": TABLE.partition_key[0], "#sk": TABLE.sort_key[0]},
            "ExpressionAttributeValues": {":pk": {"S": idempotency_pk(partition)}},
            "ProjectionExpression": "#pk, #sk",
            "ConsistentRead": True,
        }
        while True:
            page = client.query(**query)
            for item in page.get("Items", []):
                client.delete_item(TableName=self.table_name, Key=item)
            if "LastEvaluatedKey" not in page:
                return
            query["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _boto(self) -> Any:
        if self._client is None:  # from the shared session: the store's client loaded DynamoDB's model there
            self._client = aws.client("dynamodb")
        return self._client


class SQLStatements(Protocol):
    """What ``SQLPersistenceLayer`` needs of a SQL store: one statement in its own transaction."""

    def execute(self, statement: str, params: Any) -> tuple[list[tuple[Any, ...]], int]: ...


def _now_ms() -> int:
    return int(time.time() * 1000)


class SQLPersistenceLayer(BasePersistenceLayer):
    """Powertools' records in the ``idempotency`` table of a SQLite or Postgres store's own database.

    The put is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` (taken only when absent, expired, or in
    progress past its deadline), so two requests with one key never both run, across processes too.
    """

    def __init__(self, store: SQLStatements, partition: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._store = store
        self._partition = partition

    def _get_record(self, idempotency_key: str) -> DataRecord:
        from ..stores.sql_schema import IDEMPOTENCY

        rows, _ = self._store.execute(IDEMPOTENCY["get"], (self._partition, idempotency_key))
        if not rows:
            raise IdempotencyItemNotFoundError
        status, expires_at, in_progress_expires_at, response, payload_hash = rows[0]
        return DataRecord(
            idempotency_key=idempotency_key,
            status=status,
            expiry_timestamp=expires_at,
            in_progress_expiry_timestamp=in_progress_expires_at,
            response_data=response or "",
            payload_hash=payload_hash or "",
        )

    def _put_record(self, data_record: DataRecord) -> None:
        from ..stores.sql_schema import IDEMPOTENCY

        params = (
            self._partition,
            data_record.idempotency_key,
            data_record.status,
            data_record.expiry_timestamp,
            data_record.in_progress_expiry_timestamp,
            data_record.response_data,
            data_record.payload_hash,
            int(time.time()),
            _now_ms(),
        )
        _, taken = self._store.execute(IDEMPOTENCY["put"], params)
        if taken != 1:
            raise IdempotencyItemAlreadyExistsError

    def _update_record(self, data_record: DataRecord) -> None:
        from ..stores.sql_schema import IDEMPOTENCY

        params = (
            data_record.status,
            data_record.expiry_timestamp,
            data_record.response_data,
            self._partition,
            data_record.idempotency_key,
        )
        self._store.execute(IDEMPOTENCY["update"], params)

    def _delete_record(self, data_record: DataRecord) -> None:
        from ..stores.sql_schema import IDEMPOTENCY

        self._store.execute(IDEMPOTENCY["delete"], (self._partition, data_record.idempotency_key))


class SQLIdempotency(Idempotency):
    """Records in the ``idempotency`` table of the SQLite or Postgres database the sessions are in."""

    def __init__(self, store: SQLStatements, expires_after_seconds: int = EXPIRES_AFTER_SECONDS) -> None:
        super().__init__(expires_after_seconds)
        self._store = store

    def layer(self, partition: str) -> BasePersistenceLayer:
        return SQLPersistenceLayer(self._store, partition)

    def forget(self, partition: str) -> None:
        from ..stores.sql_schema import IDEMPOTENCY

        self._store.execute(IDEMPOTENCY["forget"], (partition,))


class MemoryPersistenceLayer(BasePersistenceLayer):
    """Powertools' records in a dict shared by the layers of one ``MemoryIdempotency`` (one process)."""

    def __init__(self, records: dict[tuple[str, str], DataRecord], lock: threading.Lock, partition: str) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._records, self._lock, self._partition = records, lock, partition

    def _get_record(self, idempotency_key: str) -> DataRecord:
        with self._lock:
            record = self._records.get((self._partition, idempotency_key))
        if record is None:
            raise IdempotencyItemNotFoundError
        return record

    def _put_record(self, data_record: DataRecord) -> None:
        key = (self._partition, data_record.idempotency_key)
        with self._lock:
            held = self._records.get(key)
            if held is not None and not held.is_expired and not _in_progress_lapsed(held):
                raise IdempotencyItemAlreadyExistsError
            self._records[key] = data_record

    def _update_record(self, data_record: DataRecord) -> None:
        with self._lock:
            self._records[(self._partition, data_record.idempotency_key)] = data_record

    def _delete_record(self, data_record: DataRecord) -> None:
        with self._lock:
            self._records.pop((self._partition, data_record.idempotency_key), None)


def _in_progress_lapsed(record: DataRecord) -> bool:
    deadline = record.in_progress_expiry_timestamp
    return record.status == "INPROGRESS" and deadline is not None and deadline < _now_ms()


class MemoryIdempotency(Idempotency):
    """Records beside a memory store, in this process (as the store's sessions are)."""

    def __init__(self, expires_after_seconds: int = EXPIRES_AFTER_SECONDS) -> None:
        super().__init__(expires_after_seconds)
        self._records: dict[tuple[str, str], DataRecord] = {}
        self._lock = threading.Lock()

    def layer(self, partition: str) -> BasePersistenceLayer:
        return MemoryPersistenceLayer(self._records, self._lock, partition)

    def forget(self, partition: str) -> None:
        with self._lock:
            for key in [k for k in self._records if k[0] == partition]:
                del self._records[key]


def idempotency_for(store: SessionStore) -> Idempotency | None:
    """The records for ``store``'s kind: in its DynamoDB table, its SQL database, or beside a memory store;
    ``None`` for a store of another kind (a custom one: the header is then ignored)."""
    from ..stores.memory import MemorySessionStore
    from ..stores.sqlite import SQLiteSessionStore

    if isinstance(store, SQLiteSessionStore):
        return SQLIdempotency(store)
    if isinstance(store, MemorySessionStore):
        return MemoryIdempotency()
    kind = type(store).__module__
    if kind.startswith("dormant.stores.dynamodb"):
        return DynamoDBIdempotency(store.table_name, client=store.client)  # type: ignore[attr-defined]
    if kind == "dormant.stores.postgres":
        return SQLIdempotency(store)  # type: ignore[arg-type]
    return None
