"""The model's tool calls, checked: which wait for an answer, whether their arguments fit, what can be stored.

Pure functions of an agent, a projection and what the model sent; the loop (``loop.py``) records what they decide.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic_core import to_jsonable_python

from ..events import ToolCallEvent
from ..models.base import ModelResponse
from ..projection import Projection
from ..state.values import json_values, repaired, storable_text, unstorable
from .agent import Agent
from .tools import Tool, ToolArgumentsError


def unyielded(agent: Agent, projection: Projection) -> list[ToolCallEvent]:
    """The calls of yielding tools that wait for an answer but were never yielded (the loop yields them next)."""
    waiting = []
    for call in projection.unexecuted_calls():
        tool = agent.tool(call.name)
        if (
            tool is not None
            and tool.yields
            and call.call_id not in projection.answered
            and call.call_id not in projection.pending
            and callable_with(tool, call)
        ):
            waiting.append(call)
    return waiting


def callable_with(tool: Tool, call: ToolCallEvent) -> bool:
    if call.error is not None:
        return False
    try:
        tool.check_args(call.args)
    except ToolArgumentsError:
        return False
    return True


def json_args(args: Any) -> tuple[dict[str, Any], str | None]:
    """The arguments as storable JSON, or ``{}`` and why they cannot be (the model sees that error)."""
    try:
        value = repaired(json_values().validate_python(to_jsonable_python(args)))
    except Exception:
        return {}, None
    if not isinstance(value, dict):
        return {}, None
    problem = unstorable(value)
    if problem is not None:
        path, what = problem
        return {}, f"the arguments hold {what} at args{path}, which cannot be stored"
    return value, None


def storable_response(response: ModelResponse) -> ModelResponse:
    """The model's text and tool names with NUL and lone surrogates replaced (U+FFFD): kept, not refused."""
    texts = [(c.name, c.call_id, c.error) for c in response.tool_calls]
    if unstorable([response.text, response.finish_reason, texts]):
        calls = [
            call.model_copy(
                update={
                    "name": storable_text(call.name),
                    "call_id": repaired(call.call_id),
                    "error": repaired(call.error),
                }
            )
            for call in response.tool_calls
        ]
        return response.model_copy(
            update={
                "text": repaired(response.text),
                "finish_reason": repaired(response.finish_reason),
                "tool_calls": calls,
            }
        )
    return response


def describe(exc: BaseException) -> str:
    text = storable_text(str(exc))
    return text if text else type(exc).__name__


def ms_since(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)
