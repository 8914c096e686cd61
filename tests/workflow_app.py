"""A two-step sign-off agent for the resume-workflow tests (``DORMANT_APP=tests.workflow_app:build``).

It asks for a sign-off (a yielding tool) twice before it finishes, so one execution parks, resumes,
parks again and ends: the loop the Bookings sample, which asks once, never takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from dormant import App, adk
from dormant.agents.agent import Agent
from dormant.stores.base import SessionStore
from dormant.testing import MockAdapter


class Step(BaseModel):
    step: int


class SignOff(BaseModel):
    approved: bool


@dataclass
class SignOffApp:
    app: App
    agent: Agent


def build(store: SessionStore) -> SignOffApp:
    script = MockAdapter(
        [
            {"tool_calls": [{"name": "sign_off", "args": {"step": 1}}]},
            {"tool_calls": [{"name": "sign_off", "args": {"step": 2}}]},
            {"text": "Both steps signed off."},
        ]
    )
    app = adk(name="signoff", adapters={"scripted": script}, store=store)
    sign_off = app.tool(
        name="sign_off", description="Ask a human to sign off a step.", schema=Step, execute=None, yield_schema=SignOff
    )
    agent = app.agent(name="signoff", model={"provider": "scripted", "name": "script"}, tools=[sign_off])
    return SignOffApp(app, agent)
