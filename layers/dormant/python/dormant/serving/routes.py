"""The HTTP API's routes, as data: the CDK stack builds API Gateway from them, the handlers serve them.

Each route is ``(method, path, function)``; ``function`` names the Lambda (``functions/<name>``) that
serves it, so each function holds only the permissions its routes need.
"""

from __future__ import annotations

__all__ = ["PREFLIGHT_FUNCTION", "ROUTES", "Route"]

Route = tuple[str, str, str]

ROUTES: tuple[Route, ...] = (
    ("POST", "/sessions", "sessions"),
    ("GET", "/sessions", "sessions"),
    ("GET", "/sessions/{id}", "sessions"),
    ("DELETE", "/sessions/{id}", "sessions"),
    ("GET", "/sessions/{id}/events", "sessions"),
    ("GET", "/sessions/{id}/state", "sessions"),
    ("GET", "/sessions/{id}/audit", "sessions"),
    ("POST", "/sessions/{id}/forks", "sessions"),
    ("POST", "/sessions/{id}/runs", "run"),
    ("POST", "/sessions/{id}/tools", "tools"),
    ("POST", "/sessions/{id}/commit", "commit"),
    ("POST", "/erasures", "sessions"),
    ("GET", "/openapi.json", "sessions"),  # the OpenAPI document (serving.openapi), built when asked for
)

PREFLIGHT_FUNCTION = "sessions"
"""With CORS on, the function that answers a browser's preflight ``OPTIONS`` on every path of the API (no
authorizer: a browser sends no token with it)."""
