"""What a run takes and gives back: its input (checked before anything is written), its status, its result, its stream.

Kept apart from the loop so code that only names these types (the app's signatures, the turn runner) does not load
the loop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ..errors import InputError
from ..events import Event, Usage
from ..projection import Output, YieldedTool
from ..session import Session
from ..state.values import check_storable

if TYPE_CHECKING:
    from ..state.view import StateView

__all__ = ["Checkpoint", "RunInput", "RunResult", "RunStatus", "RunStream"]

RunStatus: TypeAlias = Literal["completed", "yielded_tool", "error", "max_steps", "handed_on"]
"""How a run stopped. ``handed_on`` only comes from a run given a ``checkpoint`` that said stop: the invocation
stays open, everything it did is committed, and the next runner resumes it from there."""

Checkpoint: TypeAlias = Callable[[], bool]
"""Called before each model call and each tool execution: commit what the run holds; ``False`` stops the run
there (``handed_on``). A runner that commits as it goes loses at most the step in flight."""


@dataclass(frozen=True)
class RunInput:
    """``app.run``'s input: a user message, answers to yielded calls, state to set, scopes to seed."""

    message: str | None = None
    answers: list[Mapping[str, Any]] = field(default_factory=list)
    state: Mapping[str, Any] | None = None
    initial_state: Mapping[str, Any] | None = None
    named: str = "answers"
    """The key the answers came under, which errors name (``tools``: 0.1's name, deprecated)."""

    @classmethod
    def parse(cls, value: Any) -> RunInput:
        if value is None:
            return cls()
        if isinstance(value, str):
            value = {"message": value}
        if not isinstance(value, Mapping):
            raise InputError(f"run input is a message string or a dict, not {type(value).__name__}", field="input")
        unknown = sorted(set(value) - {"message", "answers", "tools", "state", "initial_state"})
        if unknown:
            raise InputError(
                f"unknown run input {unknown[0]!r} (expected message, answers, state, initial_state)", field=unknown[0]
            )
        if "tools" in value:  # 0.1's name for the answers: errors name the key the caller sent
            if "answers" in value:
                raise InputError("run input holds answers once: under answers, not tools as well", field="tools")
            warnings.warn(
                "app.run's input key 'tools' is deprecated: name the answers 'answers' (docs/concepts.md)",
                DeprecationWarning,
                stacklevel=3,
            )
        message = value.get("message")
        if message is not None and not isinstance(message, str):
            raise InputError("message must be a string", field="message")
        check_storable(message, "message")
        for key in ("state", "initial_state"):
            if value.get(key) is not None and not isinstance(value[key], Mapping):
                raise InputError(f"{key} must be a dict", field=key)
        key = "tools" if "tools" in value else "answers"
        answers = value.get(key) or []
        if isinstance(answers, str | bytes) or not isinstance(answers, list | tuple):
            raise InputError(f"{key} is a list of {{'call_id': ..., 'input': ...}}", field=key)
        return cls(message, list(answers), value.get("state"), value.get("initial_state"), key)


@dataclass
class RunResult:
    status: RunStatus
    session: Session
    output: Output
    yielded_tools: list[YieldedTool]
    usage: Usage
    error: str | None = None
    error_type: str | None = None
    invocation_id: str | None = None
    events: list[Event] = field(default_factory=list)
    """The events this run appended."""

    @property
    def state(self) -> StateView:
        return self.session.state


class RunStream(Iterator[Event]):
    """The events of a run as they happen; ``result`` is set once the stream is exhausted."""

    def __init__(self, steps: Generator[Event, None, RunResult]) -> None:
        self._steps = steps
        self.result: RunResult | None = None

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> Event:
        try:
            return next(self._steps)
        except StopIteration as stop:
            if self.result is None:  # an exhausted stream keeps the result it ended with
                self.result = stop.value
            raise

    def finish(self) -> RunResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result
