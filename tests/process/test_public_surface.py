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


def test_all_is_exactly_the_public_names_and_each_resolves() -> None:
    assert [name for name in dir(dormant) if not name.startswith("_")] == sorted(dormant.__all__)
    assert len(dormant.__all__) == len(set(dormant.__all__)) <= 25  # small, no duplicates
    for name in dormant.__all__:
        value = getattr(dormant, name)
        assert isinstance(value, types.ModuleType) == (name == "errors"), name
        assert name in {"errors", "Event"} or value.__name__ == name  # Event is an Annotated union
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dormant.nothing


def test_importing_the_package_loads_none_of_it() -> None:
    """The names load when first used: ``import dormant`` alone, or a function that only commits, never
    pays for the run loop or the event models it does not touch."""
    code = "import json, sys, dormant; print(json.dumps(sorted(m for m in sys.modules if m.startswith('dormant'))))"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout) == ["dormant"]


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


USER_CODE = """\
import dormant
from dormant import App, UserEvent, adk, parse_event


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
