"""Operational metrics: counted where they happen, published as CloudWatch EMF by the Lambda handlers.

The library calls ``count(name, value, agent=)`` on the path where a thing happens (a claim, a yield, a
conflict, a repair...). Nothing is collected unless a handler opened a collection (``collecting``): off AWS
(``dormant serve``, the library on its own) a call is one global read and a return. On Lambda each handler
collects for one invocation and publishes on the way out through Powertools' ``EphemeralMetrics``: one EMF
line per dimension set, in namespace ``NAMESPACE``, dimensioned by ``service`` and ``function`` (the handler's
name: ``run``, ``resume``...), and, for the metrics marked ``by_agent``, by the agent's name too: agents are
the app's code, so their names are bounded. Never by session or tenant id: those are unbounded.

``METRICS`` is the one list of names, units and emitting functions: the alarms, the dashboard and the tests
that hold them to the template read it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["METRICS", "NAMESPACE", "SERVICE", "Metric", "collecting", "count", "dimensions"]

NAMESPACE = "dormant"
SERVICE = "dormant"

_API = frozenset({"sessions", "run", "tools", "commit"})
_COMMITTERS = frozenset({*_API, "park", "resume", "sweeper"})
_RUNNERS = frozenset({"run", "tools", "resume", "sweeper"})
"""Functions that may run an agent step: ``run`` (a turn with no hooks, one opened without input, or one whose
caller waits), ``tools`` (an answered turn whose caller waits), ``resume`` (the workflow's Run) and the sweeper (a
turn handed on in-process)."""


@dataclass(frozen=True)
class Metric:
    unit: str
    """A CloudWatch unit: ``Count`` or ``Milliseconds``."""
    by_agent: bool
    """Dimensioned by ``agent`` as well as ``function``."""
    emitted_by: frozenset[str]
    """The functions whose path emits it (where an alarm or a dashboard looks for it)."""
    description: str


def _m(unit: str, by_agent: bool, emitted_by: frozenset[str], description: str) -> Metric:
    return Metric(unit, by_agent, emitted_by, description)


COUNT, MS = "Count", "Milliseconds"
METRICS: Mapping[str, Metric] = MappingProxyType(
    {
        "turns": _m(COUNT, True, frozenset({"run"}), "turns claimed by POST /runs"),
        "turn_ms": _m(MS, True, _RUNNERS, "one runner's stretch of a turn, from its claim or resume to its end"),
        "yields": _m(COUNT, True, _RUNNERS, "turns that ended waiting for answers to yielded tools"),
        "answers": _m(COUNT, False, frozenset({"tools"}), "answers to yielded tools stored by POST /tools"),
        "resumes": _m(COUNT, True, frozenset({"resume", "tools", "sweeper"}), "answered turns taken on again"),
        "expiries": _m(COUNT, False, frozenset({"resume", "sweeper"}), "waits ended as SessionExpired"),
        # park too: the workflow's RecordFailure runs on park (resume, at its cap, cannot record its own failure)
        "failures": _m(COUNT, False, frozenset({*_RUNNERS, "park"}), "turns ended as an error"),
        "model_input_tokens": _m(COUNT, True, _RUNNERS, "tokens sent to the model"),
        "model_output_tokens": _m(COUNT, True, _RUNNERS, "tokens the model answered"),
        "model_latency_ms": _m(MS, True, _RUNNERS, "one model call's time"),
        "conflicts": _m(COUNT, False, _COMMITTERS, "commits that lost to another writer (retried, merged or failed)"),
        "merges": _m(COUNT, False, _COMMITTERS, "commits rebased onto what another writer landed"),
        "forks": _m(COUNT, False, _COMMITTERS, "runs that could not join their session and were forked"),
        "repairs": _m(COUNT, False, frozenset({"sweeper"}), "commits a stopped writer left pending, repaired"),
        "stuck_sessions_ended": _m(
            COUNT, False, frozenset({"sweeper"}), "turns whose runner died: ended, or handed to a fresh runner"
        ),
        "orphaned_waits_restarted": _m(
            COUNT, False, frozenset({"sweeper"}), "waits with no live execution given one (restarted or woken)"
        ),
        "sweep_skips": _m(
            COUNT, False, frozenset({"sweeper"}), "sessions a sweep skipped (a throttle, an error): due next sweep"
        ),
        "snapshot_write_failures": _m(COUNT, False, _COMMITTERS, "snapshots that could not be stored after a commit"),
    }
)
"""Every metric: its unit, whether it is dimensioned by agent, and the functions that emit it."""


def dimensions(function: str, agent: str | None = None) -> dict[str, str]:
    """The dimensions a metric is published with (the alarms watch exactly these)."""
    named = {"service": SERVICE, "function": function}
    if agent is not None:
        named["agent"] = agent
    return named


class _Collection:
    def __init__(self, function: str) -> None:
        self.function = function
        self.values: list[tuple[str, float, str | None]] = []


class _Current:
    """The collection open on this process, and the thread that opened it (one invocation at a time)."""

    collection: _Collection | None = None
    owner: int | None = None


_current = _Current()


def count(name: str, value: float = 1, *, agent: str | None = None) -> None:
    """Record ``value`` of metric ``name`` (one of ``METRICS``); nothing unless a handler collects, and only on
    the thread that collects (a turn a server runs in a thread of its own is not the invocation's)."""
    collection = _current.collection
    if collection is None or threading.get_ident() != _current.owner:
        return
    collection.values.append((name, float(value), agent if METRICS[name].by_agent else None))


@contextmanager
def collecting(function: str) -> Iterator[list[tuple[str, float, str | None]]]:
    """Collect what this invocation of ``function`` counts, and publish it as EMF on the way out (errors
    included: a failure is counted as it happens). Only on Lambda: the same handlers under ``dormant serve``
    collect nothing and print nothing."""
    if "AWS_LAMBDA_FUNCTION_NAME" not in os.environ:
        yield []
        return
    collection = _Collection(function)
    _current.collection, _current.owner = collection, threading.get_ident()
    try:
        yield collection.values
    finally:
        _current.collection = _current.owner = None
        if collection.values:
            publish(function, collection.values)


def publish(function: str, values: list[tuple[str, float, str | None]]) -> None:
    """Print ``values`` as EMF lines (stdout: CloudWatch Logs turns them into metrics), one per agent."""
    from aws_lambda_powertools.metrics import EphemeralMetrics

    by_agent: dict[str | None, list[tuple[str, float]]] = {}
    for name, value, agent in values:
        by_agent.setdefault(agent, []).append((name, value))
    for agent, named in by_agent.items():
        metrics = EphemeralMetrics(namespace=NAMESPACE, service=SERVICE)
        for key, value_ in dimensions(function, agent).items():
            if key != "service":
                metrics.add_dimension(name=key, value=value_)
        for name, value in named:
            metrics.add_metric(name=name, unit=METRICS[name].unit, value=value)
        metrics.flush_metrics()


def model_call(agent: str, input_tokens: int, output_tokens: int, latency_ms: float) -> None:
    """The model adapter's boundary: one call's tokens and time (the agent loop calls it after each answer)."""
    if _current.collection is None:
        return
    count("model_input_tokens", input_tokens, agent=agent)
    count("model_output_tokens", output_tokens, agent=agent)
    count("model_latency_ms", latency_ms, agent=agent)
