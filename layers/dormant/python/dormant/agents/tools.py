"""Tools: a name, a pydantic schema for the arguments, and the function that runs them.

A tool with ``yield_schema`` *yields*: when the model calls it the run pauses until someone answers
(``session.input.tool``); the answer is validated against ``yield_schema`` and ``execute`` then runs
with it as ``ctx.input``. Without ``execute`` a yielding tool returns the answer itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticSerializationError, to_json

from ..errors import ConfigurationError, ToolArgumentsError, ToolInputError
from ..people import ANYONE, parse_rules

if TYPE_CHECKING:
    from ..session import Session
    from ..state.view import StateView

__all__ = ["Tool", "ToolArgumentsError", "ToolContext", "json_schema"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class _NoArgs(BaseModel):
    model_config = ConfigDict(defer_build=True)


@dataclass
class ToolContext:
    """What ``execute`` gets: validated ``args``, the invocation's ``state``, and for a yielding tool ``input``."""

    args: Any
    state: StateView
    session: Session
    call_id: str
    invocation_id: str
    agent_name: str
    tool_name: str
    input: Any = None


@functools.cache
def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema, built once per class (pydantic builds it anew on every call, and the run
    loop and the API ask on every model call and every session view). Shared: do not mutate it."""
    return model.model_json_schema()


@dataclass(eq=False)
class Tool:
    name: str
    description: str
    schema: type[BaseModel] = _NoArgs
    execute: Callable[[ToolContext], Any] | None = None
    yield_schema: type[BaseModel] | None = None
    answerable_by: str | tuple[str, ...] = ANYONE
    """Who may answer a yielded call (``dormant.people``): ``"tenant"``, ``"group:NAME"``, ``"starter"``,
    ``"not_starter"``, or a tuple of them that must all hold."""
    _definition: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigurationError(f"a tool name is 1-64 letters, digits, _ or -, not {self.name!r}")
        if not isinstance(self.description, str):
            raise ConfigurationError(f"tool {self.name!r}: description must be a string")
        for label, model in (("schema", self.schema), ("yield_schema", self.yield_schema)):
            if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise ConfigurationError(f"tool {self.name!r}: {label} must be a pydantic model class, not {model!r}")
        if self.execute is None and self.yield_schema is None:
            raise ConfigurationError(f"tool {self.name!r} needs execute= (only a yielding tool may leave it out)")
        self.answerable_by = parse_rules(self.answerable_by)
        if self.answerable_by != (ANYONE,) and self.yield_schema is None:
            raise ConfigurationError(f"tool {self.name!r}: answerable_by is for a tool that yields (yield_schema=)")
        if self.execute is not None and not callable(self.execute):
            raise ConfigurationError(f"tool {self.name!r}: execute must be callable")
        parameters = self.schema.model_json_schema()
        parameters.setdefault("properties", {})
        parameters.pop("title", None)
        self._definition = {"name": self.name, "description": self.description, "parameters": parameters}

    @property
    def yields(self) -> bool:
        return self.yield_schema is not None

    @property
    def rules(self) -> tuple[str, ...]:
        """``answerable_by`` as the tuple of rules it is once checked."""
        return self.answerable_by if isinstance(self.answerable_by, tuple) else (self.answerable_by,)

    @property
    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema an answer to this tool's yield must match (``None``: the tool does not yield)."""
        return json_schema(self.yield_schema) if self.yield_schema is not None else None

    def definition(self) -> dict[str, Any]:
        """The tool as the model is told of it: name, description, JSON schema of the arguments."""
        return self._definition

    def check_args(self, args: Any) -> BaseModel:
        try:
            return self.schema.model_validate(args)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from exc

    def check_input(self, call_id: str, value: Any, position: int = 0) -> Any:
        """Validate an answer to a yielded call; return its JSON form (what the ledger records).

        An answer is a record of what a human decided, so it is validated as the JSON it is (or, from
        Python, would be on the wire) in pydantic's strict mode: ``1`` or ``"yes"`` is not ``true``.
        JSON-strict still reads ISO strings as dates, times and UUIDs, and integers as floats. A field the
        schema does not have is refused, at any depth (``notes`` for ``note`` would otherwise be dropped, the
        reason lost), unless ``yield_schema`` sets ``extra`` itself (``ConfigDict(extra="allow")``).
        ``position`` is the answer's place in its batch, for the error's ``field``.
        """
        assert self.yield_schema is not None

        def refused(where: str, why: str) -> ToolInputError:
            return ToolInputError(
                f"invalid answer for {self.name} call {call_id}: {where or 'input'}: {why}",
                call_id=call_id,
                tool=self.name,
                position=position,
                path=where,
            )

        try:
            text = to_json(value, inf_nan_mode="constants")  # NaN stays NaN, for check_storable to name
        except PydanticSerializationError as exc:
            raise refused("", f"not a JSON value ({exc})") from exc
        try:
            extra: Literal["forbid"] | None = None if "extra" in self.yield_schema.model_config else "forbid"
            return self.yield_schema.model_validate_json(text, strict=True, extra=extra).model_dump(mode="json")
        except ValidationError as exc:
            first = exc.errors()[0]
            raise refused(".".join(str(p) for p in first["loc"]), first["msg"]) from exc

    def typed_input(self, value: Any) -> Any:
        return self.yield_schema.model_validate(value) if self.yield_schema is not None else value
