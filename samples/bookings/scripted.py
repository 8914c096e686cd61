"""A stand-in for a model that follows the booking script, so the sample runs with no key and no network.

It reads the rendered conversation like a model would — the request in the last user turn, the tool
results after it, the known patient in the system prompt — and takes the next step. Everything else
(tools, state, ledger, store) is the real runtime.
"""

from __future__ import annotations

import json
import re
from typing import Any

from dormant.models.base import Message, ModelRequest, ModelResponse, ToolCall

from .schedule import DAYS

__all__ = ["ScriptedBookingsModel", "parse_request"]

_SERVICES = {
    "physio": "physio",
    "physiotherapy": "physio",
    "dentist": "dentist",
    "dental": "dentist",
    "gp": "gp",
    "doctor": "gp",
    "massage": "massage",
}
_WORDS_AFTER_FOR = re.compile(r"\bfor\s+([^\W\d_][\w'\u2019-]*(?:[ \u3000][^\W\d_][\w'\u2019-]*)*)")
_KNOWN = re.compile(r'Known patient: ("(?:[^"\\]|\\.)*")')


def parse_request(text: str, known_name: str | None = None) -> dict[str, str | None]:
    words = re.findall(r"[a-z]+", text.lower())
    return {
        "service": next((_SERVICES[w] for w in words if w in _SERVICES), None),
        "day": next((d for d in DAYS if d.lower() in words), None),
        "part_of_day": next((p for p in ("morning", "afternoon", "evening") if p in words), None),
        "name": _name(text) or known_name,
    }


def _name(text: str) -> str | None:
    """The name after "for": the words that do not start lower-case, in any script ("for 李 小龙", "for Zoë Ångström").

    Two such words at least, or one in a script without case (a Latin single word is more likely "Tuesday").
    """
    for found in _WORDS_AFTER_FOR.finditer(text):
        name: list[str] = []
        for word in found.group(1).split():
            if word[0].islower():
                break
            name.append(word)
        if len(name) >= 2 or (len(name) == 1 and not name[0][0].isupper()):
            return " ".join(name)
    return None


class ScriptedBookingsModel:
    """The booking script as a ``ModelAdapter``."""

    def complete(self, request: ModelRequest) -> ModelResponse:
        messages = request.messages
        last_user = max((i for i, m in enumerate(messages) if m.role == "user"), default=None)
        if last_user is None:
            return _say("How can I help? Tell me the service, the day and part of day, and who it is for.")
        system = " ".join(m.content or "" for m in messages if m.role == "system")
        known = _KNOWN.search(system)
        requests = [m.content or "" for m in messages if m.role == "user"]
        ask = _merged(requests, json.loads(known.group(1)) if known else None)
        results = _results(messages[last_user + 1 :])
        booked = _results(messages[:last_user]).get("book_slot")
        if not results and booked and "error" not in booked:  # a new message after a booking
            return _say(f"You are booked: reference {booked['reference']}. For another appointment, ask again.")
        missing = [label for key, label in _LABELS.items() if not ask[key]]
        if missing:
            return _say(f"I can book that once I know {' and '.join(missing)}.")
        if "remember_patient" not in results:
            find = {k: ask[k] for k in ("service", "day", "part_of_day")}
            return _call(("remember_patient", {**find, "name": ask["name"]}), ("find_slots", find))
        slots = results.get("find_slots", {}).get("slots")
        if not slots:
            return _say(f"There is no open {ask['service']} slot on {ask['day']} {ask['part_of_day']}. Another day?")
        slot = slots[0]
        if "request_approval" not in results:
            summary = f"{slot['service']} with {slot['clinician']} on {slot['day']} at {slot['time']} for {ask['name']}"
            return _call(("request_approval", {"slot_id": slot["slot_id"], "summary": summary}))
        approval = results["request_approval"]
        if not approval.get("approved"):
            return _say(f"The booking was not approved: {approval.get('note') or 'no reason given'}.")
        if "book_slot" not in results:
            return _call(("book_slot", {"slot_id": approval["slot_id"]}))
        booked = results["book_slot"]
        if "error" in booked:
            return _say(f"I could not book it: {booked['error']}")
        return _say(
            f"Booked: {booked['service']} with {booked['clinician']} on {booked['day']} at {booked['time']} "
            f"for {booked['patient']}. Reference {booked['reference']}."
        )


_LABELS = {"service": "the service", "day": "the day", "part_of_day": "the part of day", "name": "who it is for"}


def _merged(requests: list[str], known_name: str | None) -> dict[str, str | None]:
    """What the user asked for over the whole conversation: a reply fills in what was missing."""
    merged: dict[str, str | None] = dict.fromkeys(_LABELS)
    for text in requests:
        merged |= {k: v for k, v in parse_request(text).items() if v is not None}
    merged["name"] = merged["name"] or known_name
    return merged


def _results(messages: list[Message]) -> dict[str, Any]:
    return {m.name: json.loads(m.content or "null") for m in messages if m.role == "tool" and m.name}


def _say(text: str) -> ModelResponse:
    return ModelResponse(text=text, finish_reason="stop")


def _call(*calls: tuple[str, dict[str, Any]]) -> ModelResponse:
    return ModelResponse(tool_calls=[ToolCall(name=n, args=a) for n, a in calls], finish_reason="tool_calls")
