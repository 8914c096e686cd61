"""The Bookings agent: find open slots, ask a human to approve, book, confirm.

State: the session holds the request and the typed confirmation (or the refusal); the shared ``user``
scope, bound to the patient's id (``patient_id``), holds the patient's name and preferences, so a
second request for the same patient starts from what the first one learned.

A slot is booked at most once, across processes and patients: ``book_slot`` first reserves it with
the store's create-if-absent (a session per slot, in the app ``bookings.slots``), which every store
does under optimistic concurrency.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from dormant.agents.agent import Agent
from dormant.app import App, adk
from dormant.errors import VersionConflict
from dormant.ids import split_app_name
from dormant.models.base import ModelAdapter, ModelSpec, bedrock, openai
from dormant.serving.runtime import for_tenant
from dormant.stores.base import SessionStore
from dormant.stores.sqlite import sqlite_store

from .schedule import SERVICES, open_slots, slot_by_id
from .scripted import ScriptedBookingsModel

__all__ = ["Bookings", "Confirmation", "Reservations", "SlotHold", "SlotTaken", "build", "patient_id"]

DEFAULT_DB = "data/bookings.db"
MEMORY = ":memory:"
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
    slot_taken: str | None = None
    """The approved slot another booking got first (cleared when a booking succeeds)."""


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


class SlotHold(BaseModel):
    """Who holds a slot: the booking session and its reference."""

    booking: str | None = None
    reference: str | None = None


class SlotTaken(Exception):
    """The approved slot was booked for someone else first."""


class Reservations:
    """One session per booked slot, created only if absent: the store's conditional write is the lock.

    The reservations of the app ``bookings`` live in the app ``bookings.slots``; a deployment serving
    tenants runs each tenant's view of the app (stored as ``bookings@<tenant>``), whose slots are then that
    tenant's view of ``bookings.slots`` (stored as ``bookings.slots@<tenant>``): the tenant stays a key
    component of its own, never spliced into an app name.
    """

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        self._apps: dict[str, App] = {}

    def holder(self, slot_id: str, app_name: str = "bookings") -> SlotHold | None:
        held = self._app(app_name).sessions.get(f"slot-{slot_id}")
        return None if held is None else SlotHold(booking=held.state.booking, reference=held.state.reference)

    def reserve(self, slot_id: str, booking: str, reference: str, app_name: str = "bookings") -> SlotHold:
        """Reserve the slot for ``booking``; return whoever holds it now (``booking`` itself, or another)."""
        slots = self._app(app_name)
        hold = slots.sessions.ephemeral(f"slot-{slot_id}")
        hold.state.booking = booking
        hold.state.reference = reference
        try:
            slots.sessions.commit(hold)
        except VersionConflict:  # someone holds it: maybe this very booking, on a retried run
            held = self.holder(slot_id, app_name)
            assert held is not None, "a slot reservation is never deleted"
            return held
        return SlotHold(booking=booking, reference=reference)

    def _app(self, app_name: str) -> App:
        """The slots app of the booking app stored as ``app_name`` (an app's, or a tenant's view of one)."""
        if app_name not in self._apps:
            owner, tenant = split_app_name(app_name)
            slots = adk(name=f"{owner}.slots", schema={"session": SlotHold}, store=self.store)
            self._apps[app_name] = slots if tenant is None else for_tenant(slots, tenant)
        return self._apps[app_name]


class Bookings:
    """The sample app, its agent and the slot reservations, on one SQLite file."""

    def __init__(self, app: App, agent: Agent, model_label: str, reservations: Reservations) -> None:
        self.app = app
        self.agent = agent
        self.model_label = model_label
        self.reservations = reservations


def patient_id(name: str) -> str:
    """The patient's id from their name: one id per name, whatever its script, never shared by two names.

    The name is compared as written, up to Unicode normalisation (NFC), case and runs of spaces; the id
    is a readable ASCII hint plus 80 bits of the name's SHA-256, so it is always a valid id however
    long or non-Latin the name is ("Jö Li" and "Jå Li" get different ids).
    """
    canonical = " ".join(unicodedata.normalize("NFC", name).split()).casefold()
    if not canonical:
        raise ValueError("a patient's name cannot be empty")
    ascii_hint = unicodedata.normalize("NFKD", canonical).encode("ascii", "ignore").decode()
    hint = re.sub(r"[^a-z0-9]+", "-", ascii_hint).strip("-")[:24].strip("-")
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:20]
    return f"p-{hint}-{digest}" if hint else f"p-{digest}"


def _remember(ctx: Any) -> dict[str, Any]:
    args: RememberPatient = ctx.args
    ctx.state.user.name = args.name
    ctx.state.user.preferences = Preferences(service=args.service, day=args.day, part_of_day=args.part_of_day)
    return {"remembered": args.name}


def _finder(reservations: Reservations) -> Any:
    def find(ctx: Any) -> dict[str, Any]:
        args: FindSlots = ctx.args
        slots = open_slots(args.service, args.day, args.part_of_day)
        free = [slot for slot in slots if reservations.holder(slot.slot_id, ctx.session.app_name) is None]
        return {"slots": [slot.model_dump() for slot in free]}

    return find


def _answered(ctx: Any) -> dict[str, Any]:
    """Runs once the human answered: an approval unlocks book_slot, a denial is recorded."""
    answer: Approval = ctx.input
    if answer.approved:
        ctx.state.approved_slot = ctx.args.slot_id
    else:
        ctx.state.refusal = answer.note or "declined without a reason"
    return {"slot_id": ctx.args.slot_id, **answer.model_dump()}


def _booker(reservations: Reservations) -> Any:
    def book(ctx: Any) -> dict[str, Any]:
        slot = slot_by_id(ctx.args.slot_id)
        if slot is None:
            raise ValueError(f"no slot {ctx.args.slot_id!r}")
        if ctx.state.approved_slot != slot.slot_id:
            raise ValueError("only the slot a human approved can be booked")
        reference = f"BK-{ctx.session.id[-6:].upper()}"
        held = reservations.reserve(slot.slot_id, ctx.session.id, reference, ctx.session.app_name)
        if held.booking != ctx.session.id:
            ctx.state.slot_taken = slot.slot_id
            raise SlotTaken(f"slot {slot.slot_id} was booked for another patient first; nothing was booked")
        ctx.state.slot_taken = None
        confirmation = Confirmation(
            reference=reference,
            slot_id=slot.slot_id,
            service=slot.service,
            day=slot.day,
            time=slot.time,
            clinician=slot.clinician,
            patient=ctx.state.user.name or "unknown",
        )
        ctx.state.confirmation = confirmation
        return confirmation.model_dump()

    return book


def _patient_note(ctx: Any) -> str:
    """What the agent knows of the patient (read from the shared user scope) goes into its prompt."""
    patient = ctx.state.user
    if not patient.name:
        return "No patient is known yet."
    wants = patient.preferences
    name = json.dumps(patient.name, ensure_ascii=False)
    return f"Known patient: {name}. Last asked for: {wants.service} on {wants.day} {wants.part_of_day}."


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


def database(db: str | Path | None = None) -> str:
    """The SQLite file to use: ``db``, else ``$BOOKINGS_DB``, else ``data/bookings.db``.

    An empty ``db`` is a mistake (``--db ''``), not a request for the default: it raises ``ValueError``.
    ``~`` is expanded here too (the store does it as it opens), so the hints printed hold a usable path.
    """
    if db is None:
        db = os.environ.get("BOOKINGS_DB") or DEFAULT_DB
    text = str(db)
    if not text.strip():
        raise ValueError("the database path is empty: give a file (or leave --db out for data/bookings.db)")
    return text if text == MEMORY else str(Path(text).expanduser())


def build(
    db: str | Path | None = None,
    model: str | ModelSpec | None = None,
    adapter: ModelAdapter | None = None,
    *,
    store: SessionStore | None = None,
    create: bool = True,
) -> Bookings:
    """The Bookings app on ``store``, else the SQLite file ``database(db)`` (which must exist unless ``create``).

    ``store=`` is how a deployment serves it (``DORMANT_APP=bookings:build``): the handlers pass theirs, and the
    deployment's model (``cdk deploy -c model=...``) as ``model=``, a ``ModelSpec`` used instead of the script.
    """
    if isinstance(model, ModelSpec):
        spec, label = model, f"{model.provider} {model.name} (the deployment's model)"
    else:
        spec, label = model_from_env(model if model is not None else os.environ.get("BOOKINGS_MODEL"))
    adapters: dict[str, ModelAdapter] = {}
    if spec.provider == "scripted":
        adapters["scripted"] = adapter or ScriptedBookingsModel()
    elif adapter is not None:
        adapters[spec.provider] = adapter
    if store is None:
        store = sqlite_store(database(db), create=create)
    app = adk(name="bookings", schema={"session": BookingSession, "user": Patient}, store=store, adapters=adapters)
    reservations = Reservations(store)

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
            execute=_finder(reservations),
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
            execute=_booker(reservations),
        ),
    ]
    agent = app.agent(
        name="bookings",
        model=spec,
        context=[app.context.system(INSTRUCTIONS), app.context.system(_patient_note), app.context.history()],
        tools=tools,
        max_steps=8,
    )
    return Bookings(app, agent, label, reservations)
