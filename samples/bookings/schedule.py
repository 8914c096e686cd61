"""The clinic's week: a fixed, deterministic timetable, so the sample behaves the same on every machine."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["DAYS", "SERVICES", "Slot", "open_slots", "slot_by_id"]

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
SERVICES = {"physio": "Sam Patel", "dentist": "Dr. Ruth Okafor", "gp": "Dr. Lee Chan", "massage": "Ines Duarte"}
TIMES = {"morning": ("09:00", "10:30"), "afternoon": ("14:30", "16:00"), "evening": ("18:00",)}


class Slot(BaseModel):
    slot_id: str
    service: str
    day: str
    time: str
    clinician: str


def _all() -> dict[str, Slot]:
    slots = {}
    for service, clinician in SERVICES.items():
        for day in DAYS:
            for times in TIMES.values():
                for time in times:
                    slot_id = f"{service}-{day[:3].lower()}-{time.replace(':', '')}"
                    slots[slot_id] = Slot(slot_id=slot_id, service=service, day=day, time=time, clinician=clinician)
    return slots


_SLOTS = _all()


def open_slots(service: str, day: str, part_of_day: str) -> list[Slot]:
    service, day = service.strip().lower(), day.strip().capitalize()
    times = TIMES.get(part_of_day, ())
    return [s for s in _SLOTS.values() if s.service == service and s.day == day and s.time in times]


def slot_by_id(slot_id: str) -> Slot | None:
    return _SLOTS.get(slot_id)
