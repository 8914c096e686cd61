"""Testing helpers: ``MockAdapter`` (a scripted model) and ``StoreContract`` (the store compliance suite).

``StoreContract`` needs pytest and hypothesis; it is imported only when asked for, so ``MockAdapter``
works in programs that have neither.
"""

from typing import TYPE_CHECKING, Any

from .mock import MockAdapter

if TYPE_CHECKING:
    from .store_contract import StoreContract

__all__ = ["MockAdapter", "StoreContract"]


def __getattr__(name: str) -> Any:
    if name == "StoreContract":
        from .store_contract import StoreContract

        return StoreContract
    raise AttributeError(name)
