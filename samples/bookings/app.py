"""The Bookings agent: find open slots, ask a human to approve, book, confirm.

State: the session holds the request and the typed confirmation (or the refusal); the shared ``user``
scope, bound to the patient's id, holds the patient's name and preferences, so a second request for
the same patient starts from what the first one learned.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from dormant.agents.agent import Agent
from dormant.app import App, adk
from dormant.models.base import ModelAdapter, ModelSpec, bedrock, openai
from dormant.stores.base import SessionStore
from dormant.stores.sqlite import sqlite_store

from .schedule import SERVICES, open_slots, slot_by_id
from .scripted import ScriptedBookingsModel

__all__ = ["Bookings", "Confirmation", "build"]

DEFAULT_DB = "data/bookings.db"
SCRIPTED = ModelSpec(provider="scripted", name="bookings-rules")

INSTRUCTIONS = """You book appointments at a small clinic.
1. Call remember_patient with the patient's name and what they asked for.
2. Call find_slots for the service, day and part of day.
3. Propose the first suitable slot with request_approval: a human must approve every booking.
4. If it is approved, call book_slot and confirm the booking in one sentence; if it is denied, say so
   and give the reason. Never book without approval."""


class Preferences(BaseModel):
    service: str | None = None
    day: str | None = None
    part_of_day: Literal["morning", "afternoon", "evening"] | None = None


class Patient(BaseModel):
    name: str | None = None
    preferences: Preferences = Field(default_factory=Preferences)


class Confirmation(BaseModel):
    reference: str
    slot_id: str
    service: str
    day: str
    time: str
    clinician: str
    patient: str


class BookingSession(BaseModel):
    approved_slot: str | None = None
    confirmation: Confirmation | None = None
    refusal: str | None = None


class RememberPatient(BaseModel):
    name: str
    service: str
    day: str
    part_of_day: Literal["morning", "afternoon", "evening"]


class FindSlots(BaseModel):
    service: str = Field(description=f"one of: {', '.join(SERVICES)}")
    day: str = Field(description="a weekday, e.g. Tuesday")
    part_of_day: Literal["morning", "afternoon", "evening"]


class ProposeSlot(BaseModel):
    slot_id: str
    summary: str = Field(description="what the human is asked to approve, in one line")


class Approval(BaseModel):
    """A human's answer to a proposed booking."""

    approved: bool
    note: str | None = None


class BookSlot(BaseModel):
    slot_id: str


class Bookings:
    """The sample app and its agent, on a SQLite file."""

    def __init__(self, app: App, agent: Agent, model_label: str) -> None:
        self.app = app
        self.agent = agent
        self.model_label = model_label


def _remember(ctx: Any) -> dict[str, Any]:
    args: RememberPatient = ctx.args
    ctx.state.user.name = args.name
    ctx.state.user.preferences = Preferences(service=args.service, day=args.day, part_of_day=args.part_of_day)
    return {"remembered": args.name}


def _find(ctx: Any) -> dict[str, Any]:
    args: FindSlots = ctx.args
    return {"slots": [slot.model_dump() for slot in open_slots(args.service, args.day, args.part_of_day)]}


def _answered(ctx: Any) -> dict[str, Any]:
    """Runs once the human answered: an approval unlocks book_slot, a denial is recorded."""
    answer: Approval = ctx.input
    if answer.approved:
        ctx.state.approved_slot = ctx.args.slot_id
    else:
        ctx.state.refusal = answer.note or "declined without a reason"
    return {"slot_id": ctx.args.slot_id, **answer.model_dump()}


def _book(ctx: Any) -> dict[str, Any]:
    slot = slot_by_id(ctx.args.slot_id)
    if slot is None:
        raise ValueError(f"no slot {ctx.args.slot_id!r}")
    if ctx.state.approved_slot != slot.slot_id:
        raise ValueError("only the slot a human approved can be booked")
    confirmation = Confirmation(
        reference=f"BK-{ctx.session.id[-6:].upper()}",
        slot_id=slot.slot_id,
        service=slot.service,
        day=slot.day,
        time=slot.time,
        clinician=slot.clinician,
        patient=ctx.state.user.name or "unknown",
    )
    ctx.state.confirmation = confirmation
    return confirmation.model_dump()


def _patient_note(ctx: Any) -> str:
    """What the agent knows of the patient (read from the shared user scope) goes into its prompt."""
    patient = ctx.state.user
    if not patient.name:
        return "No patient is known yet."
    wants = patient.preferences
    return f"Known patient: {patient.name}. Last asked for: {wants.service} on {wants.day} {wants.part_of_day}."


def model_from_env(value: str | None) -> tuple[ModelSpec, str]:
    """``BOOKINGS_MODEL``: unset for the scripted model, else ``openai:<model>`` or ``bedrock:<model id>``."""
    if not value:
        return SCRIPTED, "scripted model (no key, no network)"
    provider, _, name = value.partition(":")
    if provider == "openai" and name:
        return openai(name), f"OpenAI {name}"
    if provider == "bedrock" and name:
        return bedrock(name), f"Amazon Bedrock {name}"
    raise ValueError(f"BOOKINGS_MODEL is openai:<model> or bedrock:<model id>, not {value!r}")


def build(
    db: str | Path | None = None,
    model: str | None = None,
    adapter: ModelAdapter | None = None,
    *,
    store: SessionStore | None = None,
) -> Bookings:
    """The Bookings app on ``store``, else the SQLite file ``db`` (default ``$BOOKINGS_DB`` or ``data/bookings.db``).

    ``store=`` is how a deployment serves it (``DORMANT_APP=bookings:build``): the handlers pass theirs.
    """
    path = db or os.environ.get("BOOKINGS_DB") or DEFAULT_DB
    spec, label = model_from_env(model if model is not None else os.environ.get("BOOKINGS_MODEL"))
    adapters: dict[str, ModelAdapter] = {}
    if spec.provider == "scripted":
        adapters["scripted"] = adapter or ScriptedBookingsModel()
    elif adapter is not None:
        adapters[spec.provider] = adapter
    app = adk(
        name="bookings",
        schema={"session": BookingSession, "user": Patient},
        store=store if store is not None else sqlite_store(path),
        adapters=adapters,
    )

    tools = [
        app.tool(
            name="remember_patient",
            description="Remember the patient's name and preferences.",
            schema=RememberPatient,
            execute=_remember,
        ),
        app.tool(
            name="find_slots",
            description="Find open appointment slots for a service on a day.",
            schema=FindSlots,
            execute=_find,
        ),
        app.tool(
            name="request_approval",
            description="Ask a human to approve booking a slot. The run pauses until they answer.",
            schema=ProposeSlot,
            execute=_answered,
            yield_schema=Approval,
        ),
        app.tool(
            name="book_slot",
            description="Book an approved slot and record the confirmation.",
            schema=BookSlot,
            execute=_book,
        ),
    ]
    agent = app.agent(
        name="bookings",
        model=spec,
        context=[app.context.system(INSTRUCTIONS), app.context.system(_patient_note), app.context.history()],
        tools=tools,
        max_steps=8,
    )
    return Bookings(app, agent, label)
