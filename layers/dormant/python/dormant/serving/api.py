"""The HTTP API as Lambda handlers behind API Gateway (REST, proxy integration), with Powertools.

``api_handler()`` builds one function's handler: a Powertools ``APIGatewayRestResolver`` with the
routes of ``serving.routes`` that function serves (its module of ``serving.http``, a ``Router``), a
``Logger`` that carries the request id as correlation id, the invocation's ``dormant.metrics`` published as
EMF, and a ``Tracer`` only when tracing is on (it imports the X-Ray SDK, which costs a cold start nothing
uses otherwise).

What a caller gets: JSON in and out; bad input a 400 naming the field; an unknown session (or another
tenant's) a 404; a body over ``MAX_BODY_BYTES`` a 413; a lost claim or version a 409 — each with
``{"error": <class>, "message", "field"?}``, never a traceback, and with nothing written (``http.views``).
Who calls is the authorizer's claims (``http.request``); runs, answers, forks and erasures record the
principal. ``POST /runs`` and ``POST /tools`` retried with the same ``Idempotency-Key`` return the first
result without running again (``http.idempotency``).

Browsers: the origins in ``DORMANT_CORS_ORIGINS`` (none by default) get ``Access-Control-*`` headers on every
answer, errors included, and a preflight ``OPTIONS`` is answered before any route or tenant is looked at.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, CORSConfig
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers

from .. import metrics
from ..errors import ConfigurationError
from .bodies import MAX_LIST_LIMIT, MAX_WAIT_SECONDS
from .callers import admin_group, machine_clients
from .hooks import Hooks
from .http.idempotency import idempotency_from_env, records
from .http.request import MAX_BODY_BYTES, Api, Routes, log_keys
from .http.views import MAX_EVENTS_PAGE_BYTES, answer_errors, session_view, state_view
from .quota import TurnQuota, quota_from_env
from .routes import CLIENT_PREFIX, ROUTES
from .runtime import Served, served_from_env, tenant_claim

if TYPE_CHECKING:
    from .idempotency import Idempotency

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_EVENTS_PAGE_BYTES",
    "MAX_LIST_LIMIT",
    "MAX_WAIT_SECONDS",
    "CORS_ORIGINS",
    "Hooks",
    "api_handler",
    "build_resolver",
    "cors_config",
    "idempotency_from_env",
    "records",
    "session_view",
    "state_view",
]

FUNCTIONS = ("sessions", "run", "tools", "commit")
"""The functions that serve HTTP routes (``serving.routes``), each from its module of ``serving.http``."""


CORS_ORIGINS = "DORMANT_CORS_ORIGINS"
"""The origins (comma-separated) whose pages may call the API from a browser; none when unset (the stack sets it
from ``-c cors_origins=``, ``dormant serve`` from ``--cors-origin``)."""
CORS_HEADERS = ("Idempotency-Key", "Prefer")
"""Request headers a page may send beyond Powertools' own (Authorization, Content-Type and AWS's)."""
CORS_MAX_AGE = 600
"""Seconds a browser may keep a preflight's answer."""


def cors_config(origins: Sequence[str], headers: Sequence[str] = ()) -> CORSConfig | None:
    """Powertools' CORS for ``origins`` (``None``: no origin is allowed, no ``Access-Control-*`` header is sent).
    A preflight (``OPTIONS``) is answered by the resolver itself, before any route; an answer carries the
    ``Access-Control-*`` headers only when the request's ``Origin`` is one of ``origins``."""
    allowed = [origin.strip().rstrip("/") for origin in origins if origin.strip()]
    if not allowed:
        return None
    first, *rest = allowed
    return CORSConfig(
        allow_origin=first,
        extra_origins=rest,
        allow_headers=[*CORS_HEADERS, *headers],
        expose_headers=["Location"],
        max_age=CORS_MAX_AGE,
    )


def cors_origins_from_env() -> list[str]:
    return [origin for origin in os.environ.get(CORS_ORIGINS, "").split(",") if origin.strip()]


def _routes(function: str, api: Api) -> Routes | None:
    """The routes of ``function``, from its own module only (a function's cold start imports no other's)."""
    if function == "sessions":
        from .http import sessions

        return sessions.routes(api)
    if function == "run":
        from .http import run

        return run.routes(api)
    if function == "tools":
        from .http import tools

        return tools.routes(api)
    if function == "commit":
        from .http import commit

        return commit.routes(api)
    return None


def build_resolver(
    served: Served,
    hooks: Hooks,
    logger: Logger,
    idempotency: Idempotency | None = None,
    function: str | None = None,
    quota: TurnQuota | None = None,
    cors: CORSConfig | None = None,
) -> APIGatewayRestResolver:
    """The routes of ``function`` (``serving.routes``; ``None``: every route), over ``served``; each request
    works on the app as its tenant sees it. A function answers only its own routes, as API Gateway sends it
    only those: any other is a 404."""
    resolver = APIGatewayRestResolver(cors=cors, strip_prefixes=[CLIENT_PREFIX])
    api = Api(served, hooks, logger, idempotency, quota, tenant_claim(), machine_clients(), admin_group())
    wanted = {(m, p) for m, p, f in ROUTES if function is None or f == function}
    built: set[tuple[str, str]] = set()
    for name in FUNCTIONS if function is None else (function,):
        routes = _routes(name, api)
        if routes is not None:
            resolver.include_router(routes.router)
            built |= routes.paths
    if built != wanted:  # serving.routes is what API Gateway sends each function: the modules must agree
        raise ConfigurationError(f"the routes of {function or 'the API'} are {sorted(built)}, not {sorted(wanted)}")
    answer_errors(resolver, logger)
    return resolver


def api_handler(
    hooks: Hooks | None = None,
    served: Served | None = None,
    idempotency: Idempotency | None = None,
    *,
    function: str | None = None,
    cors_origins: Sequence[str] | None = None,
    cors_headers: Sequence[str] = (),
) -> Callable[[dict[str, Any], Any], Any]:
    """A Lambda handler serving the routes of ``function`` (``functions/<name>``; ``None``: every route), with
    ``served`` defaulting to ``DORMANT_APP`` on ``DORMANT_STORE`` and ``idempotency`` to
    ``DORMANT_IDEMPOTENCY_TABLE``; it builds its routes over the app on its first request. ``hooks`` say who
    runs a claimed turn (``None``: the request itself) and what answers wake. ``cors_origins`` (default:
    ``DORMANT_CORS_ORIGINS``) may call it from a browser, sending ``cors_headers`` too (``cors_config``)."""
    logger = Logger()
    cors = cors_config(cors_origins_from_env() if cors_origins is None else cors_origins, cors_headers)

    @functools.cache
    def resolver() -> APIGatewayRestResolver:
        # Built by the first request, as the workflow's handlers build theirs: importing the function
        # module stays cheap, and the app and its store client are made where they are first needed.
        return build_resolver(
            served or served_from_env(),
            hooks or Hooks(),
            logger,
            idempotency or idempotency_from_env(),
            function,
            quota_from_env(),
            cors,
        )

    if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # not under dormant serve: its logging is the user's
        # The library's own loggers (dormant.*) write through this one: the same JSON and keys on every line.
        copy_config_to_registered_loggers(source_logger=logger, include={"dormant"})

    # clear_state: a warm sandbox's next request starts without the last one's keys
    @logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
    def handler(event: dict[str, Any], context: Any) -> Any:
        logger.append_keys(**log_keys(event, tenant_claim(), machine_clients()))
        with metrics.collecting(function or "api"):
            response = resolver().resolve(event, context)
        if cors is not None:  # the answer differs by Origin: a cache must not give one origin's to another
            response.setdefault("multiValueHeaders", {})["Vary"] = ["Origin"]
        return response

    return _traced(handler)


def _traced(handler: Callable[[dict[str, Any], Any], Any]) -> Callable[[dict[str, Any], Any], Any]:
    """Wrap ``handler`` in a Powertools Tracer only on Lambda with tracing on (importing it costs a cold start)."""
    off = os.environ.get("POWERTOOLS_TRACE_DISABLED", "").lower() in {"1", "true"}
    if off or "AWS_LAMBDA_FUNCTION_NAME" not in os.environ:
        return handler
    from aws_lambda_powertools import Tracer

    traced: Callable[[dict[str, Any], Any], Any] = Tracer().capture_lambda_handler(handler)
    return traced
