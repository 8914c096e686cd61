"""Running one tool call: the arguments checked, the tool's answer or its ``execute`` called, the value it returns
made storable. Whatever goes wrong becomes the ``tool_result`` error the model sees next step."""

from __future__ import annotations

from typing import Any

from pydantic_core import to_jsonable_python

from ..events import ToolCallEvent, ToolInputEvent, ToolResultEvent
from ..session import Session
from ..state.access import Invocation
from ..state.values import json_values, repaired, unstorable
from .agent import Agent
from .calls import describe
from .tools import Tool, ToolArgumentsError, ToolContext


def execute(
    agent: Agent,
    session: Session,
    invocation: Invocation,
    tool: Tool | None,
    call: ToolCallEvent,
    answer: ToolInputEvent | None,
) -> ToolResultEvent:
    """Run one tool call of ``invocation``: its result, or the error the model sees next step (never a raise)."""

    def result(value: Any = None, error: str | None = None) -> ToolResultEvent:
        return ToolResultEvent(
            call_id=call.call_id,
            name=call.name,
            result=value,
            error=error,
            invocation_id=invocation.id,
            agent_name=invocation.agent_name,
        )

    if tool is None:
        names = ", ".join(t.name for t in agent.tools) or "none"
        return result(error=f"unknown tool {call.name!r} (available: {names})")
    if call.error is not None:
        return result(error=f"could not decode the arguments for {call.name}: {call.error}")
    try:
        args = tool.check_args(call.args)
    except ToolArgumentsError as exc:
        return result(error=str(exc))
    if tool.execute is None:  # a yielding tool without execute returns its answer
        return result(answer.input if answer else None)
    context = ToolContext(
        args=args,
        state=invocation.tool_state(call.call_id, tool.name),
        session=session,
        call_id=call.call_id,
        invocation_id=invocation.id,
        agent_name=invocation.agent_name,
        tool_name=tool.name,
        input=tool.typed_input(answer.input) if answer is not None else None,
    )
    try:
        value = tool.execute(context)
    except Exception as exc:
        return result(error=f"{tool.name} failed: {describe(exc)}")
    try:
        returned = repaired(json_values().validate_python(to_jsonable_python(value)))
    except Exception as exc:
        return result(error=f"{tool.name} returned a value that is not JSON: {describe(exc)}")
    problem = unstorable(returned)
    if problem is not None:
        path, what = problem
        return result(error=f"{tool.name} returned a value that cannot be stored: {what} at result{path}")
    return result(returned)
