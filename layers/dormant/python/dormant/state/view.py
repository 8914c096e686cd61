"""Attribute access to state: ``state.stage``, ``state.user.display_name``, ``state.temp.scratch``.

The views hold no values. Every read and write goes to the session, which validates it against the
schema and records it on the ledger; the view only knows which scope it shows and who is writing
(a direct write from outside, or an invocation's mutation).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from ..errors import ScopeNotAssignable
from .schema import SCOPES

__all__ = ["ScopeView", "StateAccess", "StateView"]

_NESTED = frozenset(SCOPES) - {"session"}
"""The scopes a ``StateView`` shows as attributes."""


class StateAccess(Protocol):
    """The reads and writes a view forwards (``dormant.state.access.Access`` implements them)."""

    def scope_view(self, scope: str) -> ScopeView: ...

    def read(self, scope: str, key: str) -> Any: ...

    def values(self, scope: str, *, copy: bool = False) -> Mapping[str, Any]: ...

    def write(self, scope: str, changes: Mapping[str, Any]) -> None: ...


class ScopeView:
    """One scope's values. Reads return copies: assign (or ``update``) to change a value."""

    __slots__ = ("_access", "_scope")

    def __init__(self, access: StateAccess, scope: str) -> None:
        object.__setattr__(self, "_access", access)
        object.__setattr__(self, "_scope", scope)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        return self._access.read(self._scope, key)

    def __setattr__(self, key: str, value: Any) -> None:
        self._access.write(self._scope, {key: value})

    def __delattr__(self, key: str) -> None:
        self._access.write(self._scope, {key: None})

    def __getitem__(self, key: str) -> Any:
        return self._access.read(self._scope, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._access.write(self._scope, {key: value})

    def __delitem__(self, key: str) -> None:
        self._access.write(self._scope, {key: None})

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._access.values(self._scope)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._access.values(self._scope)))

    def keys(self) -> list[str]:
        """The keys that hold a value (so ``dict(state)`` and ``dict(state.user)`` work)."""
        return list(self._access.values(self._scope))

    def get(self, key: str, default: Any = None) -> Any:
        return self._access.read(self._scope, key) if key in self else default

    def update(self, changes: Mapping[str, Any]) -> None:
        """Write several keys: all are validated first, so one bad value records nothing."""
        self._access.write(self._scope, dict(changes))

    def to_dict(self) -> dict[str, Any]:
        """The scope's values as JSON (a copy)."""
        return dict(self._access.values(self._scope, copy=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ScopeView):
            return self.to_dict() == other.to_dict()
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{self._scope} state {self.to_dict()!r}>"


class StateView(ScopeView):
    """Session-scope keys at the top level; shared scopes and ``temp`` as attributes."""

    __slots__ = ()

    def __init__(self, access: StateAccess) -> None:
        super().__init__(access, "session")

    @classmethod
    def of(cls, access: StateAccess) -> StateView:
        """``StateView(access)`` in one call (a session loaded to read one value builds one)."""
        view = object.__new__(cls)
        object.__setattr__(view, "_access", access)
        object.__setattr__(view, "_scope", "session")
        return view

    def __getattr__(self, key: str) -> Any:
        if key in _NESTED:
            return self._access.scope_view(key)
        if key.startswith("__"):
            raise AttributeError(key)
        return self._access.read("session", key)

    def __setattr__(self, key: str, value: Any) -> None:
        if key in SCOPES:
            raise ScopeNotAssignable(key)
        super().__setattr__(key, value)
