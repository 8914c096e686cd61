"""The public surface stays small and explicit: ``dormant.__all__`` is exactly what the package exports."""

from __future__ import annotations

import types

import dormant
import dormant.errors


def test_all_is_exactly_the_public_non_module_names() -> None:
    public = {
        name
        for name, value in vars(dormant).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public | {"errors"} == set(dormant.__all__)
    assert len(dormant.__all__) == len(set(dormant.__all__)) <= 25  # small, no duplicates


def test_every_error_is_a_dormant_error_and_is_listed() -> None:
    classes = {
        name: value
        for name, value in vars(dormant.errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == "dormant.errors"
    }
    assert set(classes) | {"HTTP_STATUS", "RETRYABLE", "http_status", "retryable_error_names"} == set(
        dormant.errors.__all__
    )
    assert all(issubclass(cls, dormant.errors.DormantError) for cls in classes.values())
    documented = dormant.errors.__doc__ or ""
    assert all(name in documented for name in classes)
