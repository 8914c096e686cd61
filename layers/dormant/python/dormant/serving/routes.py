"""The HTTP API's routes, as data: the CDK stack builds API Gateway from them, the handlers serve them.

Each route is ``(method, path, function)``; ``function`` names the Lambda (``functions/<name>``) that
serves it, so each function holds only the permissions its routes need.
"""

from __future__ import annotations

from ..errors import ConfigurationError

__all__ = ["ADMIN_ROUTES", "CLIENT_PREFIX", "PREFLIGHT_FUNCTION", "ROUTES", "SCOPES", "Route", "scope_of"]

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

CLIENT_PREFIX = "/clients"
"""Machine clients call every route under this prefix, with an access token (client-credentials grant).

API Gateway's Cognito authorizer takes only an ID token on a method without authorization scopes, and only
an access token carrying one of them on a method with scopes: no one method serves both. So each route is
two methods: ``/sessions...`` for people (their ID token carries the tenant claim and ``cognito:groups``)
and ``/clients/sessions...`` requiring the route's scope (``scope_of``). The handlers serve both (the prefix
is stripped) and check the scope of an access token again themselves."""

SCOPES = {
    "read": "dormant/sessions.read",
    "run": "dormant/runs.write",
    "answer": "dormant/answers.write",
    "admin": "dormant/admin",
}
"""The resource server's scopes (``dormant/...``): read sessions; start runs (and create, fork, commit them);
answer yielded calls; erase and delete (the administrative role, ``ADMIN_ROUTES``)."""

_ROUTE_SCOPES = {
    ("POST", "/sessions"): SCOPES["run"],
    ("DELETE", "/sessions/{id}"): SCOPES["admin"],
    ("POST", "/sessions/{id}/forks"): SCOPES["run"],
    ("POST", "/sessions/{id}/runs"): SCOPES["run"],
    ("POST", "/sessions/{id}/tools"): SCOPES["answer"],
    ("POST", "/sessions/{id}/commit"): SCOPES["run"],
    ("POST", "/erasures"): SCOPES["admin"],
}


ADMIN_ROUTES = frozenset(route for route, scope in _ROUTE_SCOPES.items() if scope == SCOPES["admin"])
"""The routes that remove data or change who may do what: ``(method, path)``. A person needs the administrative
role for them (the group ``serving.callers.admin_group``), a machine client the scope ``dormant/admin``; anyone
else gets a 403 naming the role, before the route reads its body (``http.request.Routes``). One table with the
scopes: a route given the admin scope is an administrative route."""


def scope_of(method: str, path: str) -> str:
    """The scope a machine client needs for a route (a read for any GET not named above). A commit that holds
    answers needs ``dormant/answers.write`` as well (the handler checks)."""
    scope = _ROUTE_SCOPES.get((method, path))
    if scope is None and method == "GET":
        return SCOPES["read"]
    if scope is None:
        raise ConfigurationError(f"no scope for {method} {path}: add it to serving.routes")
    return scope


PREFLIGHT_FUNCTION = "sessions"
"""With CORS on, the function that answers a browser's preflight ``OPTIONS`` on every path of the API (no
authorizer: a browser sends no token with it)."""
