"""The store workloads (issue 4 and 5 name them W1, W2, W4), shared by every store's section.

W1  one session, TURNS turns of 5 events of ~1 KB each, one commit per turn.
W2  load a 1,000-event and a 10,000-event session.
W4  create W4_SESSIONS sessions of 10 events (one commit each), then list them.

A store's floor runs the same statements through the raw driver: the same DDL, one transaction per
commit (version-checked UPDATE of the row, multi-row insert of the events), and on load the same
SELECTs with ``json.loads`` of each row — what any correct code must do at least.
"""

from __future__ import annotations

from dormant.events import UserEvent

from .common import Figure, millis, per_second, scale

TURNS = scale(200, 20)
EVENTS_PER_TURN = 5
EVENT_BYTES = 1024
LOAD_SIZES = (scale(1_000, 100), scale(10_000, 1_000))
W4_SESSIONS = scale(2_000, 100)
W4_EVENTS = 10

_FILLER = "lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 20


def event(n: int, prefix: str = "e") -> UserEvent:
    """A user event of about EVENT_BYTES bytes of JSON."""
    return UserEvent(id=f"{prefix}{n:08d}", created_at=1_700_000_000_000 + n, text=_FILLER[: EVENT_BYTES - 110])


def turns(prefix: str = "e") -> list[list[UserEvent]]:
    return [[event(t * EVENTS_PER_TURN + i, prefix) for i in range(EVENTS_PER_TURN)] for t in range(TURNS)]


def events(count: int, prefix: str = "e") -> list[UserEvent]:
    return [event(n, prefix) for n in range(count)]


def store_figures(
    section: str,
    *,
    w1: tuple[float, float],
    w2: dict[int, tuple[float, float]],
    w4_create: tuple[float, float],
    w4_list: tuple[float, float],
) -> list[Figure]:
    """Every store's five figures from (dormant, floor) seconds; the targets are issues 4 and 5's."""
    figures = [
        Figure(
            section,
            f"W1 commits ({TURNS} turns x {EVENTS_PER_TURN} x 1 KB) throughput",
            per_second(TURNS, w1[0]),
            per_second(TURNS, w1[1]),
            w1[1] / w1[0],
            0.5,
            "higher",
        )
    ]
    figures += [
        Figure(section, f"W2 load {size:,} events, time", millis(ours), millis(raw), ours / raw, 2, "lower")
        for size, (ours, raw) in w2.items()
    ]
    return [
        *figures,
        Figure(
            section,
            f"W4 create {W4_SESSIONS:,} sessions x {W4_EVENTS} events",
            per_second(W4_SESSIONS, w4_create[0]),
            per_second(W4_SESSIONS, w4_create[1]),
            w4_create[1] / w4_create[0],
            0.5,
            "higher",
        ),
        Figure(
            section,
            f"W4 list {W4_SESSIONS:,} sessions, time",
            millis(w4_list[0]),
            millis(w4_list[1]),
            w4_list[0] / w4_list[1],
            2,
            "lower",
        ),
    ]
