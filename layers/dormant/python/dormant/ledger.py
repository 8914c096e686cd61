"""What a ledger may hold at each point: one validator for every path that takes events from outside.

A run appends events in an order the runtime keeps; a remote runner's commit (``POST /sessions/{id}/commit``)
and ``app.sessions.from_events`` hand over events someone else assembled. ``LedgerRules`` holds them to the
same order, one event at a time, starting from what the ledger already holds (its ``Projection``):

* a user message only when no call waits for an answer, nor for its result (``AwaitingInput``,
  ``EventOutOfOrder``): a message between a call and its result is no transcript a model accepts;
* an answer (``tool_input``) only to a yielded call that waits for one, once (``UnknownCallId``), under the
  call's tool name, and a value that tool's ``yield_schema`` takes (``ToolInputError``);
* a result (``tool_result``) only for a call that was made and has none yet; for a yielded call, only after its
  answer (``EventOutOfOrder``): a result forged before the answer would stand in for the real tool's;
* calls and results only while an invocation runs (after its start or resume, not while it is paused on a
  yield); a yield, resume or end only of the open invocation; a start only when none is open, under a new id;
  a yield only of calls made and still without a result, of tools that yield (when the app's tools are given);
* every answer by the answerer its tool's ``answerable_by`` admits (``AnswerRefused``): this is the one check
  of the rules every path that lands an answer goes through (``session.append`` runs it on each event). The
  starter is who started the invocation the call was yielded in, as the ledger says; an answer naming
  another invocation is refused (``EventOutOfOrder`` naming ``.invocation_id``). The answerer is the event's
  ``principal`` and ``groups``, or, with a ``Caller`` (a remote runner's commit), that caller: each answer is
  recorded as them (``principal`` given or ``None``, ``groups`` among theirs: ``NotPermitted`` otherwise),
  and each invocation start or fork too;
* every event's id by the key rule (``dormant.ids``: a key on every store), named ``{field}.N.id``;
* every ``state_change`` checked against its scope's schema, by the key rules every writer meets
  (``ScopeSchema.check_write``: declared keys, the model's types, no empty key, no NUL or lone surrogate).

Errors name the event as ``{field}.N`` (``events.3.call_id``, ``events.2.changes.0.new_value``), ``N``
counting the events given, and nothing is written: callers check before they append.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .errors import (
    AwaitingInput,
    EventOutOfOrder,
    InputError,
    NotPermitted,
    ScopeNotBound,
    StateMigrationError,
    StateValidationError,
    ToolInputError,
    UnknownCallId,
    UnknownScope,
)
from .events import (
    Event,
    InvocationEndEvent,
    InvocationResumeEvent,
    InvocationStartEvent,
    InvocationYieldEvent,
    ModelEndEvent,
    ModelStartEvent,
    SessionForkedEvent,
    StateChangeEvent,
    ToolCallEvent,
    ToolInputEvent,
    ToolResultEvent,
    UserEvent,
)
from .ids import check_event_id
from .people import Caller, check_answer
from .projection import Projection
from .state.schema import Schema

__all__ = ["AnswerCheck", "LedgerRules"]


class AnswerCheck(Protocol):
    """What the rules need of a yielding tool to check an answer to it (``agents.tools.Tool`` is one)."""

    @property
    def yields(self) -> bool: ...

    @property
    def rules(self) -> tuple[str, ...]: ...

    def check_input(self, call_id: str, value: Any, position: int = 0) -> Any: ...


class LedgerRules:
    """The facts the rules need, folded from a ledger's ``Projection`` and then one checked event at a time.

    ``check(event, position)`` raises (a typed ``InputError``) if ``event`` may not come next, changing
    nothing, else folds it.
    ``tool_named`` looks up a tool to check answers with (``None``: answers are not checked against a schema);
    ``scope_id`` gives the id each shared scope is bound to (``None``: a state change's ``scope_id`` is not
    checked): a write under another id is ``ScopeNotBound``. ``state=False`` leaves state changes to whoever
    made them (a run's writes went through the state rules already; validating them twice costs a run).
    ``results_before_messages=False`` lets a message follow calls that have no result yet but do not wait
    (the run loop hears a message before yielding a call whose turn was cut between its call and its yield).
    ``caller``: who hands the events over (a remote runner's commit): answers, starts and forks must be theirs,
    and answers are held to each tool's ``answerable_by`` as theirs. ``None``: the app's own code, whose answers
    are held to the rules as the principal and groups they record.
    ``answers_by`` looks up the tool whose ``answerable_by`` judges an answer (``tool_named`` when not given);
    it is given even where ``tool_named`` is not (``session.append``): the rules are never skipped.
    """

    def __init__(
        self,
        schema: Schema,
        start: Projection | None = None,
        *,
        session_id: str = "",
        tool_named: Callable[[str], AnswerCheck | None] | None = None,
        scope_id: Callable[[str], str | None] | None = None,
        field: str = "events",
        state: bool = True,
        results_before_messages: bool = True,
        caller: Caller | None = None,
        answers_by: Callable[[str], AnswerCheck | None] | None = None,
    ) -> None:
        start = start if start is not None else Projection(schema.upcaster)
        self.caller = caller
        self.answers_by = answers_by if answers_by is not None else tool_named
        self.starters = {invocation_id: node.principal for invocation_id, node in start.invocations.items()}
        """Invocation id -> who started it, for the starter rules."""
        self.schema = schema
        self.session_id = session_id
        self.tool_named = tool_named
        self.scope_id = scope_id
        self.state = state
        self.results_before_messages = results_before_messages
        self.field = field
        self.open_invocation = start.open_invocation
        # a snapshot keeps open invocations and the last few started: an id a retry re-sends is among those
        self.invocations = set(start.invocations) | set(start.recent_invocations)
        self.paused = start.status in ("awaiting_input", "resumable")
        self.waiting = {call_id: call.name for call_id, call in start.pending.items()}
        """Yielded calls without an answer: call id -> tool name."""
        self.waiting_in = {call_id: call.invocation_id for call_id, call in start.pending.items()}
        """Yielded calls without an answer: call id -> the invocation whose yield waits for it (the starter's)."""
        self.answered = set(start.answered)
        """Yielded calls answered, whose result has not come yet."""
        self.open_calls = {call_id: call.name for call_id, call in start.open_calls.items()}
        """Calls made in the open invocation that have no result yet: call id -> tool name."""
        self.open_calls.update((call_id, answer.name) for call_id, answer in start.answered.items())
        self.values: dict[str, dict[str, Any]] = {"session": dict(start.session_state)}
        for scope, values in start.scoped_states.items():
            self.values[scope] = dict(values)

    def check_all(self, events: Iterable[Event]) -> None:
        for position, event in enumerate(events):
            self.check(event, position)

    def check(self, event: Event, position: int) -> None:
        where = f"{self.field}.{position}"
        check_event_id(event.id, f"{where}.id")  # a key on every store: the one key rule (dormant.ids)
        caller = self.caller
        if (
            caller is not None
            and isinstance(event, ToolInputEvent | InvocationStartEvent | SessionForkedEvent)
            and event.principal not in (None, caller.principal)
        ):
            raise NotPermitted(
                f"a {event.type} event recorded as {event.principal!r} is not {caller.principal!r}'s to commit",
                rule="principal",
                field=f"{where}.principal",
            )
        if caller is not None and isinstance(event, ToolInputEvent) and not set(event.groups or ()) <= caller.groups:
            raise NotPermitted(
                f"an answer recorded as a member of {sorted(set(event.groups or ()) - caller.groups)} names groups "
                f"{caller.principal!r} is not in",
                rule="groups",
                field=f"{where}.groups",
            )
        if isinstance(event, StateChangeEvent):
            if self.state:
                self._state(event, where)
        elif isinstance(event, UserEvent):
            if self.waiting:
                refused = AwaitingInput(self.session_id, list(self.waiting))
                refused.field = where
                raise refused
            if self.open_calls and self.results_before_messages:
                raise self._out_of_order(
                    f"calls {', '.join(sorted(self.open_calls))} have no result yet: a message comes after them",
                    position,
                )
        elif isinstance(event, ToolInputEvent):
            self._answer(event, position, where)
        elif isinstance(event, ToolCallEvent):
            self._running(event, position)
            self.open_calls[event.call_id] = event.name
        elif isinstance(event, ToolResultEvent):
            if event.call_id in self.waiting:
                raise self._out_of_order(
                    f"tool call {event.call_id!r} waits for its answer: its result comes after the answer",
                    position,
                    f"{where}.call_id",
                )
            if event.call_id not in self.open_calls:
                raise self._out_of_order(
                    f"no call {event.call_id!r} waits for a result (never made, or its result is already in)",
                    position,
                    f"{where}.call_id",
                )
            self._running(event, position)
            self.open_calls.pop(event.call_id, None)
            self.answered.discard(event.call_id)
        elif isinstance(event, ModelStartEvent | ModelEndEvent):
            self._running(event, position)
        elif isinstance(event, InvocationStartEvent):
            if self.open_invocation is not None:
                raise self._out_of_order(
                    f"invocation {self.open_invocation!r} is still open: end or resume it before starting another",
                    position,
                )
            if event.invocation_id in self.invocations:
                raise self._out_of_order(
                    f"invocation {event.invocation_id!r} already ran in this session: a start takes a new id",
                    position,
                    f"{where}.invocation_id",
                )
            self.invocations.add(event.invocation_id)
            self.starters[event.invocation_id] = self.caller.principal if self.caller is not None else event.principal
            self.open_invocation, self.paused = event.invocation_id, False
            self.open_calls, self.waiting, self.answered, self.waiting_in = {}, {}, set(), {}
        elif isinstance(event, InvocationYieldEvent):
            self._open(event.invocation_id, position, "yield")
            for n, call in enumerate(event.pending):
                if self.open_calls.get(call.call_id) != call.name:
                    raise self._out_of_order(
                        f"a yield waits only for calls made and without a result, not {call.call_id!r} "
                        f"of {call.name!r}",
                        position,
                        f"{where}.pending.{n}.call_id",
                    )
                tool = self.tool_named(call.name) if self.tool_named is not None else None
                if self.tool_named is not None and (tool is None or not tool.yields):
                    raise self._out_of_order(
                        f"{call.name!r} is no tool of this app that yields: nothing could answer its call",
                        position,
                        f"{where}.pending.{n}.name",
                    )
            self.waiting = {c.call_id: c.name for c in event.pending if c.call_id not in self.answered}
            self.waiting_in = dict.fromkeys(self.waiting, event.invocation_id)
            self.paused = True
        elif isinstance(event, InvocationResumeEvent):
            self._open(event.invocation_id, position, "resume")
            self.paused = False  # answered calls run now, while others may still wait
        elif isinstance(event, InvocationEndEvent):
            self._open(event.invocation_id, position, "end")
            self.open_invocation, self.paused = None, False
            self.open_calls, self.waiting, self.answered, self.waiting_in = {}, {}, set(), {}

    def _out_of_order(self, message: str, position: int, field: str | None = None) -> EventOutOfOrder:
        return EventOutOfOrder(message, position=position, field=field or f"{self.field}.{position}")

    def _open(self, invocation_id: str, position: int, what: str) -> None:
        if invocation_id != self.open_invocation:
            open_now = f"the open one is {self.open_invocation!r}" if self.open_invocation else "none is open"
            raise self._out_of_order(
                f"a {what} of invocation {invocation_id!r}, which is not open ({open_now})",
                position,
                f"{self.field}.{position}.invocation_id",
            )

    def _running(self, event: Event, position: int) -> None:
        if self.open_invocation is None or self.paused:
            state = "paused on a yield: resume it first" if self.open_invocation else "no invocation is open"
            raise self._out_of_order(f"a {event.type} event outside a running invocation ({state})", position)

    def _answer(self, event: ToolInputEvent, position: int, where: str) -> None:
        if event.call_id not in self.waiting:
            unknown = UnknownCallId(event.call_id, list(self.waiting), position)
            unknown.field = f"{where}.call_id"
            raise unknown
        if event.name != self.waiting[event.call_id]:  # else another tool's schema would judge the answer
            raise self._out_of_order(
                f"call {event.call_id!r} is a call of {self.waiting[event.call_id]!r}, not {event.name!r}",
                position,
                f"{where}.name",
            )
        waits_in = self.waiting_in.get(event.call_id)
        if event.invocation_id is not None and event.invocation_id != waits_in:  # its starter is not the answer's
            raise self._out_of_order(
                f"call {event.call_id!r} waits in invocation {waits_in!r}, not {event.invocation_id!r}",
                position,
                f"{where}.invocation_id",
            )
        # The one check of who may answer: the rule and the starter from the ledger, never from the answer.
        ruled = self.answers_by(event.name) if self.answers_by is not None else None
        if ruled is not None:
            caller = self.caller
            check_answer(
                ruled.rules,
                call_id=event.call_id,
                tool=event.name,
                principal=caller.principal if caller is not None else event.principal,
                groups=caller.groups if caller is not None else frozenset(event.groups or ()),
                starter=self.starters.get(waits_in or ""),
                field=f"{where}.call_id",
            )
        tool = self.tool_named(event.name) if self.tool_named is not None else None
        if tool is not None and tool.yields:
            try:
                tool.check_input(event.call_id, event.input, position)
            except ToolInputError as exc:
                exc.field = f"{where}.input" + (f".{exc.path}" if exc.path else "")
                raise
        del self.waiting[event.call_id]
        self.waiting_in.pop(event.call_id, None)
        self.answered.add(event.call_id)

    def _state(self, event: StateChangeEvent, where: str) -> None:
        scope = event.scope
        if scope == "temp" or scope not in self.schema:
            raise UnknownScope(scope, field=f"{where}.scope")  # temp is never on the ledger
        bound = self.scope_id
        if bound is not None and scope != "session" and event.scope_id not in (None, bound(scope)):
            raise ScopeNotBound(scope, scope_id=event.scope_id, field=f"{where}.scope_id")
        schema = self.schema[scope]
        try:
            current = self.schema.upcast(event)  # a write under an older model is read in the current shape
        except StateMigrationError as exc:
            raise StateValidationError(str(exc), scope=scope, key=exc.key, field=f"{where}.changes") from None
        renamed = current is not event
        values = self.values.setdefault(scope, {})
        for m, change in enumerate(current.changes):
            named = f"{where}.changes" if renamed else f"{where}.changes.{m}"
            try:
                checked = schema.check_write(
                    values, change.key, change.new_value, key_field=f"{named}.key", value_field=f"{named}.new_value"
                )
            except InputError as exc:
                if renamed:
                    exc.field = named
                raise
            if checked is None:
                values.pop(change.key, None)
            else:
                values[change.key] = checked
