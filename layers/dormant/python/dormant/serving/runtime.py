"""The handlers' composition root: the app they serve, the store it runs on, and the caller's tenant.

* ``DORMANT_APP=package.module:attr`` names the agent app: an object with ``.app`` (an ``App``) and
  ``.agent`` (or ``.agents``, a name -> agent mapping), or a factory returning one. A factory is called
  with ``store=`` the store, so the user's code never picks a store itself.
* ``DORMANT_STORE`` is a store URL (``dormant.stores.url.store_from_url``).
* Tenants: ``for_tenant`` gives the app as one tenant sees it: the same tools and agents, under the
  app name ``{app}@{tenant}`` (``dormant.ids.tenant_app_name``). Every key a store writes starts with the
  app name (``S#{app}#{id}``, ``X#{app}#...``, the listing's partition), so one tenant's requests cannot
  name another's sessions, state or listings: isolation by construction, not by a filter. Neither an app
  name nor a tenant may hold ``@`` (the key rule, checked by ``App`` and by every store), so a stored app
  name has one reading: an app called ``clinic@eu`` cannot exist to meet tenant ``eu`` of ``clinic``.
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..agents.agent import Agent
from ..app import App, Sessions
from ..errors import ConfigurationError, InputError
from ..ids import TENANT_SEPARATOR, split_app_name, tenant_app_name
from ..models.base import ModelSpec
from ..stores.base import ErasableStore, SessionStore
from ..stores.url import store_from_url

__all__ = [
    "DEFAULT_TENANT_CLAIM",
    "Served",
    "for_tenant",
    "load_served",
    "purge_tenants",
    "served_from_env",
    "tenant_claim",
    "tenant_views",
    "view_of",
]

DEFAULT_APP = "bookings:build"
DEFAULT_STORE = "sqlite:///data/dormant.db"
DEFAULT_TENANT_CLAIM = "custom:tenant"


def tenant_claim() -> str:
    """The claim that names the caller's tenant (``DORMANT_TENANT_CLAIM``, set by the stack from
    ``-c tenant_claim=``; default ``custom:tenant``). A token without it is its own tenant (its ``sub``)."""
    return os.environ.get("DORMANT_TENANT_CLAIM") or DEFAULT_TENANT_CLAIM


@dataclass(frozen=True)
class Served:
    """The app the handlers serve and its agents by name."""

    app: App
    agents: Mapping[str, Agent]

    def agent(self, name: str | None) -> Agent:
        """The agent called ``name``; without a name, the app's only (or first) agent."""
        if name is None:
            return next(iter(self.agents.values()))
        agent = self.agents.get(name)
        if agent is None:
            raise InputError(f"no agent {name!r} (agents: {', '.join(self.agents)})", field="agent")
        return agent

    def for_tenant(self, tenant: str) -> App:
        return for_tenant(self.app, tenant)


def for_tenant(app: App, tenant: str) -> App:
    """``app`` as ``tenant`` sees it: its sessions, state and listings live under ``{app.name}@{tenant}``.

    ``InvalidKey`` naming ``tenant`` for a tenant outside the key rule (``@`` included); ``app`` must be an
    app's own view, not a tenant's (a tenant has no tenants)."""
    if TENANT_SEPARATOR in app.name:
        raise ConfigurationError(f"{app.name!r} is already a tenant's view of an app; take for_tenant of the app")
    view = copy.copy(app)
    view.name = tenant_app_name(app.name, tenant)
    view.sessions = Sessions(view)
    return view


def tenant_views(app: App) -> list[App] | None:
    """``app`` and each tenant's view of it; ``None`` on a store that cannot list its app names without a
    scan (``app_names`` is ``None``: DynamoDB)."""
    store = app.store
    names = store.app_names(f"{app.name}{TENANT_SEPARATOR}") if isinstance(store, ErasableStore) else None
    if names is None:
        return None
    return [app, *(view for name in names if (view := view_of(app, name)) is not None and view is not app)]


def view_of(app: App, name: str) -> App | None:
    """The view of ``app`` whose keys are under app name ``name``: ``app`` itself, one of its tenants
    (``{app}@{tenant}``), or ``None`` for another app's name (and for a name outside the key rule, which only
    a store written before the rule can hold)."""
    if name == app.name:
        return app
    try:
        owner, tenant = split_app_name(name)
    except InputError:
        return None
    return for_tenant(app, tenant) if owner == app.name and tenant is not None else None


def purge_tenants(app: App) -> dict[str, list[str]]:
    """Purge the sessions past ``app``'s retention, its own and each tenant's: app name -> ids deleted.

    What the sweeper and ``dormant purge`` run. Nothing without a retention, and nothing on a store that
    cannot list its app names without a scan (DynamoDB, whose TTL deletes them).
    """
    views = tenant_views(app) if app.retention_ms is not None else None
    return {view.name: purged for view in views or [] if (purged := view.sessions.purge())}


def load_served(spec: str, store: SessionStore, model: ModelSpec | None = None) -> Served:
    """Import ``spec`` (``module:attr``) and bind what it names to ``store``. ``model``, the deployment's model
    (``serving.deployed``), is given to the factory as ``model=``: one that takes none is refused."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"DORMANT_APP is module:attr, not {spec!r}")
    try:
        target: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"DORMANT_APP={spec!r} cannot be imported: {exc}") from exc
    if model is not None and not _takes_model(target):
        raise ConfigurationError(
            f"the deployment chose the model {model.provider}:{model.name}, but DORMANT_APP={spec!r} takes no "
            "model= (a factory with a model parameter decides what its agents use; it may still pick its own)"
        )
    extra = {} if model is None else {"model": model}
    built = target(store=store, **extra) if callable(target) else target
    app = getattr(built, "app", None)
    if not isinstance(app, App):
        raise ConfigurationError(f"DORMANT_APP={spec!r} gave {built!r}, which has no .app (an App)")
    app.store = store
    agents = getattr(built, "agents", None)
    if agents is None:
        agent = getattr(built, "agent", None)
        agents = {agent.name: agent} if isinstance(agent, Agent) else {}
    if not agents or not all(isinstance(a, Agent) for a in agents.values()):
        raise ConfigurationError(f"DORMANT_APP={spec!r} gave no agent (.agent, or .agents by name)")
    return Served(app, dict(agents))


def _takes_model(target: Any) -> bool:
    if not callable(target):
        return False
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "model" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@functools.cache
def served_from_env() -> Served:
    """What ``DORMANT_APP``, ``DORMANT_STORE`` and ``DORMANT_MODEL`` name, built once per process (a Lambda's
    cold start)."""
    from .deployed import model_from_env

    store = store_from_url(os.environ.get("DORMANT_STORE", DEFAULT_STORE))
    return load_served(os.environ.get("DORMANT_APP", DEFAULT_APP), store, model_from_env())
