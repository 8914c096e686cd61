"""The agent app the fidelity harness deploys (``-c app=fidelity_app:build``, its package as ``app_packages``).

A sign-off agent whose scripted model reads its orders from the user's messages, so one warm function serves many
sessions, each with its own script: ``signoffs=N`` (yielding tool calls before the final answer, default 1),
``sleep=S`` (seconds each model call takes), ``fail=model`` (the model raises a non-retryable error on its call
after the first sign-off; a call that would outlast the handler's ``calls_end_by`` gives up at it with
``ModelUnavailable``, as the shipped adapters do), ``steps=K`` (plain tool steps first: events enough for a
snapshot; with ``keys=N`` each step also writes N session state keys, so its commit holds more items than one
transaction takes and goes the gated way), ``tool=approve`` (the sign-offs are calls of ``approve``, answerable by
group ``approvers`` only) or ``tool=review`` (of ``review``: anyone but who started the run, four eyes). Deployed
with a model (``-c model=...``) its agent uses that model instead: the harness's loopback model server then plays
the script.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from dormant import App, adk
from dormant.agents.agent import Agent
from dormant.agents.tools import ToolContext
from dormant.errors import ModelUnavailable
from dormant.models.base import ModelRequest, ModelResponse, ModelSpec, time_left
from dormant.stores.base import SessionStore


class Step(BaseModel):
    step: int
    keys: int = 0


class SignOff(BaseModel):
    approved: bool


class Person(BaseModel):
    """A user scope, so sessions can be bound to a person and erased with them."""

    note: str | None = None


class ScriptedFailure(RuntimeError):
    """The scripted model's provider crashed (not a retryable error)."""


class ScriptedTimeout(ModelUnavailable):
    """The scripted model did not answer by the deadline (what ``OpenAIModelUnavailable`` says for a timeout)."""


def _orders(request: ModelRequest) -> dict[str, str]:
    said = " ".join(m.content or "" for m in request.messages if m.role == "user")
    return dict(re.findall(r"\b(signoffs|sleep|fail|steps|tool|keys)=(\w+)", said))


class OrderedModel:
    """A model adapter that follows the orders in the session's first message."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        orders = _orders(request)
        sleep, left = float(orders.get("sleep", 0)), time_left()
        if left is not None and sleep > left:  # the provider answers too late: the adapter's timeout, at the deadline
            time.sleep(left)
            raise ScriptedTimeout(f"the scripted model takes {sleep} s; {left:.1f} s were left")
        time.sleep(sleep)
        answered = [m for m in request.messages if m.role == "tool"]
        steps = int(orders.get("steps", 0))
        signoffs = int(orders.get("signoffs", 1))
        done = len(answered)
        if done < steps:
            args = {"step": done + 1, "keys": int(orders.get("keys", 0))}
            return ModelResponse(tool_calls=[{"name": "note", "args": args}], finish_reason="tool_calls")
        if orders.get("fail") == "model" and done > steps:
            raise ScriptedFailure("the scripted model's provider crashed")
        if done < steps + signoffs:
            step = done - steps + 1
            name = orders.get("tool", "sign_off")
            return ModelResponse(tool_calls=[{"name": name, "args": {"step": step}}], finish_reason="tool_calls")
        return ModelResponse(text="All steps signed off.", finish_reason="stop")


@dataclass
class FidelityApp:
    app: App
    agent: Agent


def build(store: SessionStore, model: ModelSpec | None = None) -> FidelityApp:
    app = adk(
        name="fidelity", schema={"user": Person}, adapters={"ordered": OrderedModel()}, store=store, snapshot_every=10
    )
    sign_off = app.tool(
        name="sign_off", description="Ask a human to sign off a step.", schema=Step, execute=None, yield_schema=SignOff
    )

    approve = app.tool(
        name="approve",
        description="Ask an approver to approve a step.",
        schema=Step,
        execute=None,
        yield_schema=SignOff,
        answerable_by="group:approvers",
    )
    review = app.tool(
        name="review",
        description="Ask someone else to review a step.",
        schema=Step,
        execute=None,
        yield_schema=SignOff,
        answerable_by="not_starter",
    )

    def note(context: ToolContext) -> dict[str, Any]:
        step = context.args.step
        context.state.update({f"s{step}k{i}": i for i in range(context.args.keys)})
        return {"noted": step}

    noted = app.tool(name="note", description="Note a step.", schema=Step, execute=note)
    agent = app.agent(
        name="signoff",
        model=model or {"provider": "ordered", "name": "script"},
        context=[app.context.history()],
        tools=[sign_off, approve, review, noted],
        max_steps=50,
    )
    return FidelityApp(app, agent)
