"""The process's one botocore session, from which every AWS client dormant builds is made.

A botocore session loads and keeps what its clients are built from: the endpoints and partitions, each
service's model and endpoint rules. A client made from a session of its own (``botocore.session.get_session()``
is a new one each call, ``boto3.client`` another, the default's) loads them all again: in a Lambda function that
holds a DynamoDB, an idempotency and a Step Functions client, about 10 MB each, a fifth of what a 128 MB function
has. Made from this one, the second client of a service costs what the client itself holds. botocore's own
advice is that a session is not shared between threads while clients are made: ``client`` makes them under a
lock (a client, once made, is safe to share). botocore is imported on first use, never by importing this module.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["client", "session"]

_lock = threading.Lock()
_session: list[Any] = []


def session() -> Any:
    """The process's botocore session (made on first use): its config and credentials, as the environment gives
    them. Make clients with ``client``, not with this session's ``create_client``."""
    with _lock:
        return _shared()


def client(service: str, **options: Any) -> Any:
    """A botocore client for ``service`` from the shared session (``options``: ``create_client``'s keywords:
    ``region_name``, ``endpoint_url``, ``config``, keys)."""
    with _lock:
        return _shared().create_client(service, **options)


def _shared() -> Any:
    if not _session:
        import botocore.session

        _session.append(botocore.session.get_session())
    return _session[0]
