"""One error tree: every error dormant defines is in dormant.errors (the provider errors next to their adapters,
in dormant.models.errors, re-exported from dormant.errors), every error it raises is a DormantError, and every
class has the HTTP status a handler maps it to."""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
import inspect
import pickle
import pkgutil
import re
import subprocess
import sys
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
    "dormant.stores.dynamodb.calls._ConditionFailed",
    "dormant.stores.dynamodb.calls._Cancelled",
    "dormant.stores.dynamodb.plan._MarkerGone",
    "dormant.stores.dynamodb.calls._Conflict",  # a request another transaction held: re-sent by _call
    "dormant.stores.dynamodb.calls._Throttled",  # a transaction cancelled for throttling: re-sent by _call
    "dormant.stores.dynamodb.calls._Exhausted",
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


# Where the tree's classes are defined: dormant.errors, and the provider errors next to their adapters.
TREE_MODULES = ("dormant.errors", "dormant.models.errors")


def error_classes() -> dict[str, type[BaseException]]:
    """Every error class ``dormant.errors`` exports (the provider errors it re-exports included)."""
    return {
        name: value
        for name in errors.__all__
        if isinstance(value := getattr(errors, name), type) and issubclass(value, BaseException)
    }


def test_every_exception_class_in_the_package_is_defined_in_the_tree() -> None:
    strays = []
    for module in library_modules():
        for name, value in vars(module).items():
            defined_here = inspect.isclass(value) and value.__module__ == module.__name__
            if defined_here and issubclass(value, BaseException) and module.__name__ not in TREE_MODULES:
                strays.append(f"{module.__name__}.{name}")
    assert [stray for stray in strays if stray not in PRIVATE_CLASSES] == []


def test_every_class_of_the_tree_is_exported_from_dormant_errors() -> None:
    """The provider errors moved next to their adapters; ``from dormant.errors import X`` still finds each one."""
    from dormant.models import errors as provider_errors

    defined = {
        name
        for module in (errors, provider_errors)
        for name, value in vars(module).items()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__
    }
    assert defined == set(error_classes())
    assert set(provider_errors.__all__) <= set(errors.__all__)
    assert all(getattr(errors, name) is getattr(provider_errors, name) for name in provider_errors.__all__)
    assert all(issubclass(getattr(errors, name), ModelProviderError) for name in provider_errors.__all__)
    with pytest.raises(AttributeError, match="no attribute 'OpenAIModelErr'"):
        errors.OpenAIModelErr  # type: ignore[attr-defined]


def test_the_provider_errors_load_with_their_module_only_when_asked_for() -> None:
    """``import dormant.errors`` (every Lambda handler's first import) does not load the models package."""
    code = (
        "import sys, dormant.errors as e; before = 'dormant.models.errors' in sys.modules; "
        "from dormant.errors import BedrockModelUnavailable as B; "
        "print(before, B.__module__, B.http_status, 'dormant.models.errors' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "dormant.models.errors", "503", "True"]


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
    """``HTTP_STATUS`` is derived from the classes: one entry per exported class, its ``http_status``."""
    classes = error_classes()
    assert set(HTTP_STATUS) == set(classes.values())
    assert all(status == kind.http_status for kind, status in HTTP_STATUS.items())
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
        "StoreThrottled",
        "StoreUnavailable",
    ]
    assert errors.BedrockModelUnavailable("throttled").retryable
    assert not errors.BedrockModelError("validation").retryable
    assert not ModelProviderError("x").retryable
    # "retry later": 503, or a throttle's 429 (with Retry-After over HTTP)
    assert all(
        http_status(getattr(errors, name)("x")) == (429 if name == "StoreThrottled" else 503)
        for name in retryable_error_names()
    )


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


# Each public error class's HTTP status, frozen before the statuses became inherited class attributes: moving
# a class, or dropping a status a class restated, must leave every class answering what it did.
FROZEN_STATUSES = {
    "AgentMismatch": 409,
    "AnswerRefused": 403,
    "AwaitingInput": 409,
    "BedrockMalformedResponse": 502,
    "BedrockModelError": 502,
    "BedrockModelUnavailable": 503,
    "ClaimLost": 409,
    "ThreadChanged": 409,
    "CommitIncomplete": 503,
    "CommitTooLarge": 413,
    "ConfigurationError": 500,
    "DormantError": 500,
    "EventIndexError": 404,
    "EventOutOfOrder": 409,
    "EventTooLarge": 413,
    "EventValidationError": 400,
    "InputError": 400,
    "InvalidKey": 400,
    "InvalidSessionId": 400,
    "MalformedModelResponse": 502,
    "ModelError": 502,
    "ModelProviderError": 502,
    "ModelUnavailable": 503,
    "NotAuthenticated": 401,
    "NotPermitted": 403,
    "OpenAIMalformedResponse": 502,
    "OpenAIModelError": 502,
    "OpenAIModelUnavailable": 503,
    "OpenAIRefusal": 502,
    "RequestInProgress": 409,
    "RequestTooLarge": 413,
    "SchemaError": 500,
    "ScopeMismatch": 409,
    "ScopeNotAssignable": 400,
    "ScopeNotBound": 400,
    "ScriptExhausted": 500,
    "SessionNotFound": 404,
    "StateError": 400,
    "StateMigrationError": 500,
    "StateValidationError": 422,
    "StoreBusy": 503,
    "StoreClosed": 500,
    "StoreThrottled": 429,
    "StoreError": 500,
    "StoreUnavailable": 503,
    "TempOutsideInvocation": 400,
    "ToolArgumentsError": 502,
    "ToolInputError": 422,
    "TurnNotClaimed": 503,
    "TurnQuotaExceeded": 429,
    "UnknownCallId": 409,
    "UnknownEventId": 404,
    "UnknownScope": 400,
    "UnknownStateKey": 400,
    "ValueNotStorable": 422,
    "VersionConflict": 409,
}


def test_every_public_error_answers_the_status_it_answered_before() -> None:
    """The statuses are class attributes a subclass inherits: each name ``dormant.errors`` exports answers its
    frozen status, through ``http_status`` and through the derived ``HTTP_STATUS`` table."""
    classes = {name: getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)}
    assert {name: kind.http_status for name, kind in classes.items()} == FROZEN_STATUSES
    assert {name: http_status(kind.__new__(kind)) for name, kind in classes.items()} == FROZEN_STATUSES
    assert {kind.__name__: status for kind, status in HTTP_STATUS.items()} == FROZEN_STATUSES
