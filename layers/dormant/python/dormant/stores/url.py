"""``store_from_url``: one string names a store, so handlers, the CLI and tests are configured alike.

* ``memory:`` — in this process's memory;
* ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, ``sqlite:///:memory:``;
* ``postgresql://user:pass@host/db`` (or ``postgres://``) — the Postgres store (``dormant[postgres]``);
* ``dynamodb://table?region=eu-west-2&endpoint=http://127.0.0.1:8000&shards=4`` — the DynamoDB store
  (``dormant[dynamodb]``) on that table; every parameter is optional (``shards``: listing shards,
  ``pending_shards``: the table-wide pending and running index shards; both fixed by the table's first store;
  ``pitr_days``: the table's point-in-time recovery period, 1 to 35, which an erasure reports as its residue).
  Given an ``endpoint`` (DynamoDB Local), the table is created if it is missing: a local table, never
  a deployed one (the stack makes that). An endpoint on this machine (``localhost``, ``127.0.0.1``, ``[::1]``)
  needs nothing else: the credentials and region the environment configures are used, and where it
  configures none, dummy ones (DynamoDB Local checks neither). Any other endpoint gets no defaults.

Each store module is imported only when its scheme is asked for, so naming SQLite never loads a driver.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .. import aws
from ..errors import ConfigurationError
from .base import SessionStore

__all__ = ["LOCAL_ACCESS_KEY", "LOCAL_REGION", "is_loopback_endpoint", "store_from_url"]

LOCAL_REGION = "us-east-1"
"""The region of a client for DynamoDB Local when the URL and the environment name none."""
LOCAL_ACCESS_KEY = "dormantlocal"
"""The dummy key (id and secret) of a client for DynamoDB Local when the environment has no credentials
(DynamoDB Local takes only letters and digits in a key id)."""


def store_from_url(url: str, *, create: bool = True) -> SessionStore:
    """The store ``url`` names (see the module docstring); a ``ConfigurationError`` says what is wrong.

    ``create=False``: the storage must exist already (a SQLite file with dormant's tables, a DynamoDB
    Local table), for a command where a mistyped name must not quietly start an empty store.
    """
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"a store URL is a non-empty string, not {url!r}")
    scheme = url.split(":", 1)[0].lower()
    if scheme == "memory":
        from .memory import in_memory_store

        return in_memory_store()
    if scheme == "sqlite":
        parts = urlsplit(url)
        if parts.netloc or not url.startswith("sqlite:///") or parts.path in {"", "/"}:
            raise ConfigurationError(f"a SQLite store URL is sqlite:///path (three slashes), not {url!r}")
        from .sqlite import sqlite_store

        return sqlite_store(parts.path[1:], create=create)
    if scheme in {"postgresql", "postgres"}:
        from .postgres import postgres_store

        return postgres_store(url)
    if scheme == "dynamodb":
        return _dynamodb(url, create)
    raise ConfigurationError(
        f"unknown store URL scheme {scheme!r} in {url!r}: use memory:, sqlite:///, postgresql://, dynamodb://"
    )


def _dynamodb(url: str, create: bool) -> SessionStore:
    parts = urlsplit(url)
    try:
        params = {key: value for key, [value] in parse_qs(parts.query, strict_parsing=bool(parts.query)).items()}
    except ValueError:
        raise ConfigurationError(f"a DynamoDB store URL takes each parameter once, as key=value: {url!r}") from None
    unknown = set(params) - {"region", "endpoint", "shards", "pending_shards", "pitr_days"}
    if not parts.netloc or parts.path not in {"", "/"} or unknown:
        raise ConfigurationError(
            "a DynamoDB store URL is dynamodb://table?region=...&endpoint=...&shards=N&pending_shards=N&pitr_days=N, "
            f"not {url!r}"
        )
    counts: dict[str, int] = {}
    for param, option in (
        ("shards", "listing_shards"),
        ("pending_shards", "pending_shards"),
        ("pitr_days", "recovery_days"),
    ):
        value = params.get(param, "")
        if value and not value.isdigit():
            raise ConfigurationError(f"{param} in a DynamoDB store URL is a number, not {value!r}")
        if value:
            counts[option] = int(value)
    if not 1 <= counts.get("recovery_days", 1) <= 35:
        raise ConfigurationError(f"pitr_days in a DynamoDB store URL is 1 to 35 (days), not {params['pitr_days']!r}")
    from .dynamodb import DynamoDBSessionStore, create_table, dynamo_store

    endpoint = params.get("endpoint")
    if endpoint and is_loopback_endpoint(endpoint):
        if len(parts.netloc) < 3:  # as dynamo_store checks it, before a client is built
            raise ConfigurationError(f"a DynamoDB table name has at least 3 characters, not {parts.netloc!r}")
        client = _local_client(endpoint, params.get("region"))
        try:
            if create:
                create_table(parts.netloc, client=client)
            return DynamoDBSessionStore(client, parts.netloc, owns_client=True, **counts)
        except BaseException:
            client.close()
            raise
    if params.get("endpoint") and create:
        create_table(parts.netloc, endpoint_url=params["endpoint"], region=params.get("region"))
    return dynamo_store(
        parts.netloc,
        endpoint_url=params.get("endpoint"),
        region=params.get("region"),
        **counts,
    )


def is_loopback_endpoint(endpoint: str) -> bool:
    """Whether an endpoint URL names this machine (``localhost``, or a loopback address): DynamoDB Local."""
    try:
        host = urlsplit(endpoint).hostname or ""
    except ValueError:  # a malformed IPv6 literal
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _local_client(endpoint: str, region: str | None) -> Any:
    """A DynamoDB client for DynamoDB Local at ``endpoint``: the environment's credentials and region where it
    configures them, else ``LOCAL_ACCESS_KEY`` and ``LOCAL_REGION`` (so ``dormant serve --store
    'dynamodb://t?endpoint=http://127.0.0.1:8001'`` works alone); the store's retry and timeout settings."""
    try:
        from .dynamodb.admin import client_config
    except ImportError as exc:
        raise ConfigurationError("the DynamoDB store needs boto3: pip install 'dormant[dynamodb]'") from exc
    config = client_config()
    try:
        session = aws.session()
        keys = {}
        if session.get_credentials() is None:
            keys = {"aws_access_key_id": LOCAL_ACCESS_KEY, "aws_secret_access_key": LOCAL_ACCESS_KEY}
        region = region or session.get_config_variable("region") or LOCAL_REGION
        return aws.client("dynamodb", endpoint_url=endpoint, region_name=region, config=config, **keys)
    except Exception as exc:  # botocore says what is wrong
        raise ConfigurationError(f"cannot build a DynamoDB client for {endpoint}: {exc}") from exc
