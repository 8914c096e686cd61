"""Secrets Manager and SSM Parameter Store, for the functions' own botocore: moto's backends served over HTTP.

moto's server mode without its Flask front end: a werkzeug server hands each request to moto's own response
classes (``SecretsManagerResponse``, ``SimpleSystemManagerResponse``), so a function reaching it through
``AWS_ENDPOINT_URL_SECRETS_MANAGER`` / ``AWS_ENDPOINT_URL_SSM`` gets moto's behaviour: ARNs with their random
suffix, lookups by name or ARN, decryption of SecureStrings, AWS's error codes. ``requests`` counts what came in,
by operation.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .template import ACCOUNT, REGION

CREDENTIALS = {"aws_access_key_id": "dormantlocal", "aws_secret_access_key": "dormantlocal"}


class SecretsServer:
    """``url`` serves both APIs; ``client(service)`` is a boto3 client on it (to create secrets, as an operator)."""

    def __init__(self) -> None:
        from moto.core.request import Request
        from moto.secretsmanager.responses import SecretsManagerResponse
        from moto.ssm.responses import SimpleSystemManagerResponse
        from werkzeug.serving import make_server

        self.requests: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            request = Request(environ)
            target = str(request.headers.get("X-Amz-Target", ""))
            with lock:
                self.requests[target] += 1
            responder = SecretsManagerResponse if target.startswith("secretsmanager.") else SimpleSystemManagerResponse
            status, headers, body = responder.dispatch(request, request.url, request.headers)
            payload = body.encode() if isinstance(body, str) else bytes(body or b"")
            kept = [(k, str(v)) for k, v in dict(headers).items() if k.lower() not in ("content-length", "status")]
            start_response(f"{status} -", [*kept, ("Content-Length", str(len(payload)))])
            return [payload]

        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def endpoints(self) -> dict[str, str]:
        """The variables that point a function's botocore here."""
        return {"AWS_ENDPOINT_URL_SECRETS_MANAGER": self.url, "AWS_ENDPOINT_URL_SSM": self.url}

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name=REGION, **CREDENTIALS)

    def count(self, operation: str) -> int:
        return sum(n for target, n in self.requests.items() if target.endswith(f".{operation}"))

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)


__all__ = ["ACCOUNT", "SecretsServer"]
