"""``store_from_url``: one string names a store, so handlers, the CLI and tests are configured alike.

* ``memory:`` — in this process's memory;
* ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``, ``sqlite:///:memory:``;
* ``postgresql://user:pass@host/db`` (or ``postgres://``) — the Postgres store (``dormant[postgres]``).

Each store module is imported only when its scheme is asked for, so naming SQLite never loads a driver.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigurationError
from .base import SessionStore

__all__ = ["store_from_url"]


def store_from_url(url: str) -> SessionStore:
    """The store ``url`` names (see the module docstring); a ``ConfigurationError`` says what is wrong."""
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

        return sqlite_store(parts.path[1:])
    if scheme in {"postgresql", "postgres"}:
        from .postgres import postgres_store

        return postgres_store(url)
    raise ConfigurationError(f"unknown store URL scheme {scheme!r} in {url!r}: use memory:, sqlite:///, postgresql://")
