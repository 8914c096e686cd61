"""The public surface stays small and explicit: ``dormant.__all__`` is exactly what the package exports."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import dormant
import dormant.errors

EVERYDAY = {"Agent", "ToolContext", "App", "adk", "Session", "RunResult", "SessionStore", "openai", "bedrock"}
MODULES = {"errors", "events"}
STORES = {"in_memory_store", "sqlite_store", "postgres_store", "dynamo_store", "store_from_url"}
EVENT_NAMES = [
    "AssistantEvent",
    "Event",
    "InvocationEndEvent",
    "InvocationResumeEvent",
    "InvocationStartEvent",
    "InvocationYieldEvent",
    "ModelEndEvent",
    "ModelStartEvent",
    "SessionForkedEvent",
    "StateChangeEvent",
    "ToolCallEvent",
    "ToolInputEvent",
    "ToolResultEvent",
    "UserEvent",
    "parse_event",
]
"""The names ``dormant`` exported in 0.1 that live in ``dormant.events``: deprecated aliases for one release."""


def test_all_is_exactly_the_public_names_and_each_resolves() -> None:
    assert [name for name in dir(dormant) if not name.startswith("_")] == sorted(dormant.__all__)
    assert len(dormant.__all__) == len(set(dormant.__all__)) <= 25  # small, no duplicates
    assert set(dormant.__all__) == EVERYDAY | STORES | MODULES  # the everyday names, every store's constructor
    for name in dormant.__all__:
        value = getattr(dormant, name)
        assert isinstance(value, types.ModuleType) == (name in MODULES), name
        assert value.__name__ == (f"dormant.{name}" if name in MODULES else "App" if name == "adk" else name)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dormant.nothing


def test_adk_and_app_are_one_constructor() -> None:
    """``adk(...)`` is the ``App`` class under the name the docs use: the same parameters, the same object type."""
    from dormant.app import App, adk

    assert adk is App is dormant.adk is dormant.App
    assert type(adk(name="one")) is type(App(name="one")) is App


@pytest.mark.parametrize("name", EVENT_NAMES)
def test_the_events_live_in_dormant_events_and_the_old_names_warn_for_a_release(name: str) -> None:
    """Each 0.1 event name of ``dormant`` still gives the same object, with a ``DeprecationWarning`` that names its
    home (``dormant.events``), every time; it is not listed in ``__all__`` or ``dir``."""
    import dormant.events

    assert name in dormant.events.__all__ and name not in dormant.__all__ and name not in dir(dormant)
    for _ in range(2):
        with pytest.warns(DeprecationWarning, match=rf"dormant\.{name} is deprecated: import it from dormant\.events"):
            assert getattr(dormant, name) is getattr(dormant.events, name)


def test_importing_the_package_loads_none_of_it() -> None:
    """The names load when first used: ``import dormant`` alone, or a function that only commits, never
    pays for the run loop or the event models it does not touch."""
    code = "import json, sys, dormant; print(json.dumps(sorted(m for m in sys.modules if m.startswith('dormant'))))"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout) == ["dormant"]
    # An everyday name loads its own module, not the run loop nor a store's driver.
    code = code.replace("dormant;", "dormant; dormant.sqlite_store;")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    loaded = json.loads(done.stdout)
    assert "dormant.stores.sqlite" in loaded and "dormant.agents.loop" not in loaded, loaded


def test_every_error_is_a_dormant_error_and_is_listed() -> None:
    """Every class of the one tree is listed in ``dormant.errors``: its own, and the provider errors defined next to
    their adapters (``dormant.models.errors``) that it re-exports."""
    import dormant.models.errors

    classes = {
        name: value
        for module in (dormant.errors, dormant.models.errors)
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == module.__name__
    }
    assert set(classes) | {"HTTP_STATUS", "RETRYABLE", "http_status", "retryable_error_names"} == set(
        dormant.errors.__all__
    )
    assert all(issubclass(cls, dormant.errors.DormantError) for cls in classes.values())
    documented = dormant.errors.__doc__ or ""
    assert all(name in documented for name in classes)


USER_CODE = """\
import dormant
from dormant import App, adk
from dormant.events import UserEvent, parse_event


def build() -> App:
    return adk(name="typed")


first: UserEvent = UserEvent(text="hi")
wrong: int = first.text
parsed = parse_event({"type": "user", "text": "x"})
reveal_type(parsed.id)
dormant.Sesion
"""


@pytest.mark.slow
def test_a_user_type_checking_against_the_package_gets_its_types(tmp_path: Path) -> None:
    """The package is typed (``py.typed``) and its lazy names are seen by a type checker as the real ones:
    a wrong type or a misspelt name in the user's code is reported, not hidden behind ``Any``."""
    user = tmp_path / "user.py"
    user.write_text(USER_CODE)
    cache = tmp_path / "cache"
    command = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(cache), str(user)]
    done = subprocess.run(command, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = [line.split(": ", 1)[1] for line in done.stdout.splitlines()]
    assert lines == [
        'error: Incompatible types in assignment (expression has type "str", variable has type "int")  [assignment]',
        'note: Revealed type is "str"',
        'error: Module has no attribute "Sesion"; maybe "Session"?  [attr-defined]',
    ], done.stdout + done.stderr
