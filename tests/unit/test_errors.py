"""One error tree: every error dormant defines is in dormant.errors, every error it raises is a DormantError,
and every class has the HTTP status a handler maps it to."""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
import inspect
import pickle
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import pytest

import dormant
from dormant import errors
from dormant.errors import (
    HTTP_STATUS,
    DormantError,
    ModelProviderError,
    SessionNotFound,
    StoreBusy,
    VersionConflict,
    http_status,
    retryable_error_names,
)

# Exceptions that never leave their module: control flow inside one function, or a test harness's own.
PRIVATE_CLASSES = {
    "dormant.stores.postgres._Refuse",  # rolls one transaction back; caught right there
    # DynamoDB: a failed condition, a cancelled transaction, a vanished marker, unprocessed items left
    # over: raised by one step of a commit or repair and caught by the step that called it.
    "dormant.stores.dynamodb.store._ConditionFailed",
    "dormant.stores.dynamodb.store._Cancelled",
    "dormant.stores.dynamodb.store._MarkerGone",
    "dormant.stores.dynamodb.store._Conflict",  # a request another transaction held: re-sent by _call
    "dormant.stores.dynamodb.store._Exhausted",
    # Powertools' persistence-layer protocol: raised by dormant's layers to Powertools, which catches them.
    "aws_lambda_powertools.utilities.idempotency.exceptions.IdempotencyItemAlreadyExistsError",
    "aws_lambda_powertools.utilities.idempotency.exceptions.IdempotencyItemNotFoundError",
}
HARNESS_RAISES = {"AssertionError", "NotImplementedError"}  # dormant.testing: a failing contract check
# A bridge raises the errors the framework it plugs into promises its callers (ADK's own services raise these).
BRIDGE_RAISES = {"dormant.bridges.adk": {"AlreadyExistsError", "SessionNotFoundError", "StaleSessionError"}}


def library_modules() -> list[ModuleType]:
    names = [m.name for m in pkgutil.walk_packages(dormant.__path__, "dormant.")]
    return [importlib.import_module(name) for name in sorted(names)]


def error_classes() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }


def test_every_exception_class_in_the_package_is_defined_in_errors() -> None:
    strays = []
    for module in library_modules():
        for name, value in vars(module).items():
            defined_here = inspect.isclass(value) and value.__module__ == module.__name__
            if defined_here and issubclass(value, BaseException) and module is not errors:
                strays.append(f"{module.__name__}.{name}")
    assert [stray for stray in strays if stray not in PRIVATE_CLASSES] == []


def test_the_provider_errors_are_re_exported_where_callers_look_for_them() -> None:
    from dormant.agents import tools
    from dormant.models import bedrock, openai

    for module in (openai, bedrock, tools):
        exported = [name for name in module.__all__ if name in error_classes()]
        assert exported, module.__name__
        assert all(getattr(module, name) is getattr(errors, name) for name in exported)


def raised_classes(module: ModuleType) -> list[tuple[str, str, type[BaseException]]]:
    """(where, in which function, class) for every ``raise Name(...)``/``raise Name`` naming a class."""
    path = Path(inspect.getfile(module))
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                target = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(target, ast.Name):
                    value = vars(module).get(target.id) or getattr(builtins, target.id, None)
                    if inspect.isclass(value) and issubclass(value, BaseException):
                        found.append((f"{path.name}:{child.lineno}", function, value))
            visit(child, function)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_every_class_dormant_raises_is_a_dormant_error() -> None:
    wrong = []
    seen = 0
    for module in library_modules():
        for where, function, kind in raised_classes(module):
            seen += 1
            if issubclass(kind, DormantError) or f"{kind.__module__}.{kind.__name__}" in PRIVATE_CLASSES:
                continue
            if kind is AttributeError and function == "__getattr__":
                continue  # the attribute protocol (copy, pickle) needs a plain AttributeError for dunders
            if module.__name__.startswith("dormant.testing") and kind.__name__ in HARNESS_RAISES:
                continue
            if kind.__name__ in BRIDGE_RAISES.get(module.__name__, set()):
                continue
            wrong.append(f"{module.__name__} {where} raises {kind.__name__}")
    assert seen > 50  # the scan sees the raises
    assert wrong == []


def test_the_raise_scan_sees_a_stray_builtin() -> None:
    module = ModuleType("stray")
    module.__file__ = __file__
    found = {kind for _, _, kind in raised_classes(module)}
    assert ValueError in found  # raised just below, in this test file's own code


def _raises_a_value_error() -> None:
    raise ValueError("seen by test_the_raise_scan_sees_a_stray_builtin")


def test_every_error_class_has_an_http_status() -> None:
    classes = error_classes()
    assert set(HTTP_STATUS) == set(classes.values())
    assert all(400 <= status <= 599 for status in HTTP_STATUS.values())


def test_http_status_resolves_through_the_mro() -> None:
    class AppConflict(VersionConflict):
        pass

    assert http_status(VersionConflict("s", expected_version=1, actual_version=2)) == 409
    assert http_status(AppConflict("s", expected_version=1, actual_version=2)) == 409
    assert http_status(SessionNotFound("s")) == 404
    assert http_status(StoreBusy("locked")) == 503
    assert http_status(errors.OpenAIModelUnavailable("429")) == 503
    assert http_status(errors.OpenAIModelError("400")) == 502
    assert http_status(errors.StateValidationError("bad", scope="session", key="k")) == 422
    assert http_status(ValueError("not ours")) == 500


def test_retryable_failures_are_classes_of_their_own() -> None:
    assert retryable_error_names() == [
        "BedrockModelUnavailable",
        "CommitIncomplete",
        "ModelUnavailable",
        "OpenAIModelUnavailable",
        "StoreBusy",
        "StoreUnavailable",
    ]
    assert errors.BedrockModelUnavailable("throttled").retryable
    assert not errors.BedrockModelError("validation").retryable
    assert not ModelProviderError("x").retryable
    assert all(http_status(getattr(errors, name)("x")) == 503 for name in retryable_error_names())


@pytest.mark.parametrize("name", sorted(error_classes()))
def test_every_error_class_is_drawn_in_the_tree_with_its_status(name: str) -> None:
    drawn = re.search(rf"\b{name}\s+(\d{{3}})\b", errors.__doc__ or "")
    assert drawn is not None, f"{name} is not in the tree"
    assert int(drawn.group(1)) == HTTP_STATUS[error_classes()[name]]  # type: ignore[index]


@pytest.mark.parametrize(
    "error",
    [
        errors.UnknownCallId("call-1", ["call-2"], 1),
        errors.AwaitingInput("s-1", ["call-2"]),
        errors.EventIndexError(9, 3),
        errors.ToolInputError("no", call_id="call-1", tool="book", position=2, path="approved"),
        errors.VersionConflict("s-1", expected_version=1, actual_version=2),
        errors.SessionNotFound("s-1"),
        errors.UnknownScope("patient", field="scopes.patient"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_an_error_survives_pickling_and_copying(error: errors.DormantError) -> None:
    """An error raised in a worker process reaches its parent (multiprocessing pickles it) as itself:
    the same class, message, field and attributes, although its constructor takes other arguments."""
    for again in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error), copy.copy(error)):
        assert type(again) is type(error)
        assert (str(again), again.args, vars(again)) == (str(error), error.args, vars(error))
