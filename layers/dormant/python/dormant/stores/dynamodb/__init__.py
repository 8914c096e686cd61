"""The DynamoDB store (``pip install 'dormant[dynamodb]'``): one table, gated commits, sharded listing.

``table`` holds the table's shape and imports no AWS SDK, so the CDK app can build from it; the store
itself (``dynamo_store``, ``create_table``) is imported on first use, and boto3 only when a client is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .table import (
    DUE_INDEX,
    LAYOUT_FORMAT,
    LISTING_INDEX,
    PENDING_INDEX,
    RUNNING_INDEX,
    STATUS_INDEX,
    TABLE,
    IndexShape,
    TableShape,
)

if TYPE_CHECKING:
    from .store import DynamoDBSessionStore, RepairReport, create_table, dynamo_store

__all__ = [
    "DUE_INDEX",
    "LAYOUT_FORMAT",
    "LISTING_INDEX",
    "PENDING_INDEX",
    "RUNNING_INDEX",
    "STATUS_INDEX",
    "TABLE",
    "DynamoDBSessionStore",
    "IndexShape",
    "RepairReport",
    "TableShape",
    "create_table",
    "dynamo_store",
]

_STORE_NAMES = {"DynamoDBSessionStore", "RepairReport", "create_table", "dynamo_store"}


def __getattr__(name: str) -> Any:
    if name in _STORE_NAMES:
        try:
            from . import store
        except ImportError as exc:  # boto3/botocore missing
            from ...errors import ConfigurationError

            message = f"the DynamoDB store needs boto3: pip install 'dormant[dynamodb]' ({exc})"
            raise ConfigurationError(message) from exc
        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
