"""Every error dormant raises, in one tree.

Why one module of ~700 lines: the tree below is the map a caller (and an HTTP client) reads, and each class is
a docstring and a constructor; split by floor, the statuses and the ``field`` conventions would be read in
five places. The provider errors alone live apart, next to their adapters (``dormant.models.errors``), and are
re-exported here by name when first asked for, so ``from dormant.errors import OpenAIModelError`` works (that
module is loaded by name, not imported: it imports this one, and this one imports nothing of dormant).

The tree, with the HTTP status a handler answers each class with. The status is the class attribute
``http_status``, declared only where a class answers differently from its base and inherited otherwise
(routes raise the declared class rather than re-wrap it, and ``http_status(exc)`` reads it)::

    DormantError                                  500
    ├── ConfigurationError                        500  dormant was set up wrongly (adk(), stores, agents, tools)
    │   ├── SchemaError                           500  a schema that is not scope -> pydantic model class
    │   └── StateMigrationError                   500  stored state no migration brings to the model (``key``)
    ├── InputError                                400  bad input from a caller; carries ``field``
    │   ├── InvalidKey                            400  a key outside the key rule (app name, tenant, scope, cursor...)
    │   │   └── InvalidSessionId                  400  a session id or scope id outside it
    │   ├── ValueNotStorable                      422  NaN/Infinity, a lone surrogate or NUL (``field``)
    │   ├── StateError                            400  a state read or write that cannot be done
    │   │   ├── StateValidationError              422  value refused by the scope's model (``scope``, ``key``)
    │   │   ├── UnknownStateKey                   400  a key the scope's model does not declare (an AttributeError)
    │   │   ├── UnknownScope                      400  a scope the schema does not declare
    │   │   ├── ScopeNotBound                     400  a shared scope written under an id not bound to the session
    │   │   ├── ScopeNotAssignable                400  ``state.user = ...`` (write its keys; an AttributeError)
    │   │   └── TempOutsideInvocation             400  ``temp`` touched outside an invocation
    │   ├── EventValidationError                  400  a dict that is not a valid event
    │   ├── EventIndexError                       404  an event index out of range (an IndexError)
    │   ├── UnknownEventId                        404  an event id not in the ledger (a KeyError)
    │   ├── UnknownCallId                         409  an answer for a tool call that is not waiting
    │   ├── AwaitingInput                         409  a message to a session waiting on yielded calls (``call_ids``)
    │   ├── EventOutOfOrder                       409  an event the ledger may not hold at its place (``position``)
    │   ├── ToolInputError                        422  an answer refused by the tool's ``yield_schema``
    │   ├── AgentMismatch                         409  resuming with another agent than the one waiting
    │   ├── EventTooLarge                         413  an event over the store's ``max_event_bytes`` (``event_id``)
    │   ├── CommitTooLarge                        413  a commit over a store limit (``size``, ``limit``)
    │   ├── ScopeMismatch                         409  a commit whose scopes differ from the stored row's (``scope``)
    │   ├── RequestTooLarge                       413  an HTTP body over the handler's limit (``size``, ``limit``)
    │   ├── RequestInProgress                     409  a retry of a request (same Idempotency-Key) still running
    │   ├── NotAuthenticated                      401  an HTTP request with no authenticated caller
    │   ├── NotPermitted                          403  a caller a rule refuses (``AnswerRefused``, a missing scope)
    │   │   └── AnswerRefused                     403  an answer the tool's ``answerable_by`` refuses this caller
    │   └── TurnQuotaExceeded                     429  a caller past its turn quota (``quota``, ``retry_after``)
    ├── ModelError                                502  a model failed; a run records it and ends with ``error``
    │   ├── ModelProviderError                    502  the provider's API failed (``status_code``, ``code``)
    │   │   ├── ModelUnavailable                  503  throttled, timed out, down or unreachable: retry later
    │   │   ├── MalformedModelResponse            502  it answered with something that is not a model response
    │   │   ├── OpenAIModelError                  502  (these seven: dormant.models.errors)
    │   │   │   ├── OpenAIModelUnavailable        503  (also a ModelUnavailable)
    │   │   │   ├── OpenAIMalformedResponse       502  (also a MalformedModelResponse)
    │   │   │   └── OpenAIRefusal                 502  the model refused the structured output asked for
    │   │   └── BedrockModelError                 502
    │   │       ├── BedrockModelUnavailable       503  (also a ModelUnavailable)
    │   │       └── BedrockMalformedResponse      502  (also a MalformedModelResponse)
    │   ├── ToolArgumentsError                    502  tool arguments the schema refuses (shown to the model)
    │   └── ScriptExhausted                       500  MockAdapter was asked for more responses than scripted
    ├── TurnNotClaimed                            503  a workflow's turn whose claim has not landed (yet): retried
    └── StoreError                                500  the store could not do what was asked
        ├── VersionConflict                       409  optimistic concurrency: the stored version moved
        │   ├── ClaimLost                         409  another writer claimed the session first; nothing ran
        │   └── ThreadChanged                     409  another process wrote the LangGraph thread; nothing written
        ├── SessionNotFound                       404  ``app.sessions.require`` of an id that is not stored
        ├── StoreBusy                             503  locked, overloaded or contended past its limit: retry later
        │   └── StoreThrottled                    429  the store throttled it past the retries (``retry_after``)
        ├── StoreUnavailable                      503  the store cannot be reached: retry later
        ├── CommitIncomplete                      503  a commit passed its gate, not all its writes landed: retry
        └── StoreClosed                           500  the store was used after ``close()``

Retryable failures are classes of their own (``RETRYABLE``), so a Step Functions ``Retry`` can match
them by name in ``ErrorEquals`` (``retryable_error_names()`` lists the names).

Errors a caller must act on carry the facts as attributes, not only in the message.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    HTTP_STATUS: dict[type[DormantError], int]
    """The HTTP status each public error class answers with: derived from the classes (``http_status``), kept
    for callers that want the whole table (the tree above draws it)."""

__all__ = [
    "HTTP_STATUS",
    "RETRYABLE",
    "AgentMismatch",
    "AnswerRefused",
    "AwaitingInput",
    "BedrockMalformedResponse",  # noqa: F822 (defined in dormant.models.errors, loaded by __getattr__)
    "BedrockModelError",  # noqa: F822 (defined in dormant.models.errors, loaded by __getattr__)
    "BedrockModelUnavailable",  # noqa: F822 (defined in dormant.models.errors, loaded by __getattr__)
    "ClaimLost",
    "CommitIncomplete",
    "CommitTooLarge",
    "ConfigurationError",
    "DormantError",
    "EventIndexError",
    "EventOutOfOrder",
    "EventTooLarge",
    "EventValidationError",
    "InputError",
    "InvalidKey",
    "InvalidSessionId",
    "MalformedModelResponse",
    "ModelError",
    "ModelProviderError",
    "ModelUnavailable",
    "NotAuthenticated",
    "NotPermitted",
    "OpenAIMalformedResponse",  # noqa: F822 (defined in dormant.models.errors, loaded by __getattr__)
    "OpenAIModelError",  # noqa: F822 (defined in dormant.models.errors, loaded by __getattr__)
    "OpenAIModelUnavailable",  # noqa: F822 (defined in dormant.models.errors, loaded by __getattr__)
    "OpenAIRefusal",  # noqa: F822 (defined in dormant.models.errors, loaded by __getattr__)
    "RequestInProgress",
    "RequestTooLarge",
    "SchemaError",
    "ScopeMismatch",
    "ScopeNotAssignable",
    "ScopeNotBound",
    "ScriptExhausted",
    "SessionNotFound",
    "StateError",
    "StateMigrationError",
    "StateValidationError",
    "StoreBusy",
    "StoreThrottled",
    "StoreClosed",
    "TurnNotClaimed",
    "TurnQuotaExceeded",
    "StoreError",
    "StoreUnavailable",
    "TempOutsideInvocation",
    "ToolArgumentsError",
    "ToolInputError",
    "UnknownCallId",
    "UnknownEventId",
    "UnknownScope",
    "UnknownStateKey",
    "ValueNotStorable",
    "VersionConflict",
    "ThreadChanged",
    "http_status",
    "retryable_error_names",
]


class DormantError(Exception):
    """Root of every error dormant raises."""

    http_status: ClassVar[int] = 500

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its state, not by calling __init__ with ``args`` (the message): most errors take other
        # arguments, and an error a worker process raises must reach its parent (pickle, copy) as itself.
        return (_rebuilt, (type(self), self.args, vars(self)))


def _rebuilt(cls: type[DormantError], args: tuple[Any, ...], state: dict[str, Any]) -> DormantError:
    error = cls.__new__(cls)
    error.args = args
    vars(error).update(state)
    return error


class ConfigurationError(DormantError):
    """dormant was set up wrongly: fix the code that builds the app, agent, tool or store."""


class SchemaError(ConfigurationError):
    """The schema given to ``adk()`` is not a mapping of known scope names to pydantic model classes."""

    def __init__(self, message: str, *, scope: str | None = None) -> None:
        super().__init__(message)
        self.scope = scope


class StateMigrationError(ConfigurationError):
    """Stored state that the app's migrations cannot bring to its current scope model.

    Raised when the session (or shared scope) is loaded, before anything runs: add or fix a migration.
    ``version`` is the schema version the value was written under, ``current`` the app's.
    """

    def __init__(self, scope: str, key: str, version: int, current: int, reason: str) -> None:
        super().__init__(
            f"{scope}.{key}, written under schema version {version}, cannot be read by version {current}: {reason}"
        )
        self.scope = scope
        self.key = key
        self.version = version
        self.current = current


class InputError(DormantError):
    """A caller passed something dormant cannot accept; nothing was written.

    ``field`` names the offending input (a dotted path such as ``state.session.stage``).
    """

    http_status: ClassVar[int] = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidKey(InputError):
    """A key outside the one key rule (``dormant.ids``): an app name, tenant, scope, scoped key or listing cursor
    that is empty, too long, or holds a character the rule refuses. ``field`` names it; nothing was written."""


class InvalidSessionId(InvalidKey):
    """A session id (or scope id) that is empty, too long, or has characters outside the allowed set."""


class ValueNotStorable(InputError):
    """A value no store can keep as it is: NaN or ±Infinity, or text with a lone surrogate or NUL.

    Every store refuses the same values (Postgres cannot hold NUL, JSON has no NaN, UTF-8 no lone
    surrogate), at input, naming the offending ``field``.
    """

    http_status: ClassVar[int] = 422


class StateError(InputError):
    """A state read or write that cannot be done."""


class StateValidationError(StateError):
    """A value refused by the scope's model; nothing was recorded."""

    http_status: ClassVar[int] = 422

    def __init__(self, message: str, *, scope: str, key: str, field: str | None = None) -> None:
        super().__init__(message, field=field or f"state.{scope}.{key}")
        self.scope = scope
        self.key = key


class UnknownStateKey(StateError, AttributeError):
    """A read of a key the scope's model does not declare (a typo, usually)."""

    def __init__(self, scope: str, key: str, declared: list[str]) -> None:
        super().__init__(
            f"{scope} state has no key {key!r} (declared: {', '.join(declared) or 'none'})",
            field=f"state.{scope}.{key}",
        )
        self.scope = scope
        self.key = key


class UnknownScope(StateError):
    """A scope the app's schema does not declare."""

    def __init__(self, scope: str, field: str | None = None) -> None:
        super().__init__(f"scope {scope!r} is not declared in the app's schema", field=field or f"state.{scope}")
        self.scope = scope


class ScopeNotBound(StateError):
    """A shared scope written while the session carries no id for it, or under an id it is not bound to
    (``scope_id``): a session writes only the shared state it is bound to."""

    def __init__(self, scope: str, *, scope_id: str | None = None, field: str | None = None) -> None:
        if scope_id is None:
            message = (
                f"shared scope {scope!r} is not bound to this session: create the session with "
                f"scopes={{{scope!r}: '<id>'}} to write it"
            )
        else:
            message = f"shared scope {scope!r} is not bound to id {scope_id!r} in this session: it writes only its own"
        super().__init__(message, field=field or f"state.{scope}")
        self.scope = scope
        self.scope_id = scope_id


class ScopeNotAssignable(StateError, AttributeError):
    """A scope assigned as a whole (``state.user = ...``): write its keys instead."""

    def __init__(self, scope: str) -> None:
        super().__init__(f"{scope!r} is a scope: write its keys (state.{scope}.<key> = ...)", field=f"state.{scope}")
        self.scope = scope


class TempOutsideInvocation(StateError):
    """``temp`` holds scratch values for one invocation; it does not exist outside one."""

    def __init__(self) -> None:
        super().__init__("the temp scope exists only inside an invocation", field="state.temp")


class EventValidationError(InputError):
    """A dict (or JSON) that does not parse as a dormant event."""


class EventIndexError(InputError, IndexError):
    """An event index outside the ledger."""

    http_status: ClassVar[int] = 404

    def __init__(self, index: int, length: int) -> None:
        super().__init__(f"event index {index} is out of range for a ledger of {length} events", field="index")
        self.index = index
        self.length = length


class UnknownEventId(InputError, KeyError):
    """An event id that is not in this session's ledger."""

    http_status: ClassVar[int] = 404

    def __init__(self, event_id: str) -> None:
        super().__init__(f"no event with id {event_id!r} in this session", field="event_id")
        self.event_id = event_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class UnknownCallId(InputError):
    """An answer for a tool call that is not waiting for one."""

    http_status: ClassVar[int] = 409

    def __init__(self, call_id: str, waiting: list[str], position: int) -> None:
        hint = f"waiting: {', '.join(waiting)}" if waiting else "no call is waiting"
        message = f"tool call {call_id!r} is not waiting for input ({hint})"
        super().__init__(message, field=f"answers.{position}.call_id")
        self.call_id = call_id
        self.waiting = waiting
        self.position = position
        """The answer's place in the list given (``answers.N.call_id``)."""


class AwaitingInput(InputError):
    """A message for a session with a yielded call that this input leaves unanswered: its result would come
    after the message, and a message between a call and its result is no transcript a model accepts."""

    http_status: ClassVar[int] = 409

    def __init__(self, session_id: str, call_ids: list[str]) -> None:
        super().__init__(
            f"session {session_id!r} waits for answers to calls {', '.join(call_ids)}: answer them first "
            "(input={'answers': [...]}, or POST /sessions/{id}/tools), then send the message",
            field="message",
        )
        self.session_id = session_id
        self.call_ids = call_ids


class EventOutOfOrder(InputError):
    """An event a ledger may not hold where it was put (``dormant.ledger`` states the rules): a result for a
    call that waits for its answer, or that was never made; a yield, resume or end of an invocation that is
    not open; a second invocation started while one is open. Nothing was written.

    ``position`` is the event's place in the events given; ``field`` names it (``events.N...``)."""

    http_status: ClassVar[int] = 409

    def __init__(self, message: str, *, position: int, field: str | None = None) -> None:
        super().__init__(message, field=field or f"events.{position}")
        self.position = position


class ToolInputError(InputError):
    """An answer to a yielded call refused by the tool's ``yield_schema``.

    ``field`` is the refused value's path, ``answers.{position}.input.{path}``: ``position`` is the
    answer's place in its batch, ``path`` the place inside the answer (``""``: the answer as a whole).
    """

    http_status: ClassVar[int] = 422

    def __init__(self, message: str, *, call_id: str, tool: str, position: int = 0, path: str = "") -> None:
        super().__init__(message, field=f"answers.{position}.input" + (f".{path}" if path else ""))
        self.call_id = call_id
        self.tool = tool
        self.position = position
        self.path = path


class AgentMismatch(InputError):
    """The session waits inside an invocation of another agent."""

    http_status: ClassVar[int] = 409

    def __init__(self, waiting_agent: str, given_agent: str) -> None:
        super().__init__(
            f"the session waits inside an invocation of agent {waiting_agent!r}; resume it with that agent, "
            f"not {given_agent!r}",
            field="agent",
        )
        self.waiting_agent = waiting_agent
        self.given_agent = given_agent


class EventTooLarge(InputError):
    """An event whose encoded JSON is over the store's ``limits.max_event_bytes``; nothing was written."""

    http_status: ClassVar[int] = 413

    def __init__(self, event_id: str, *, size: int, limit: int) -> None:
        super().__init__(
            f"event {event_id!r} is {size:,} bytes encoded; a store takes at most {limit:,} per event",
            field="new_events",
        )
        self.event_id = event_id
        self.size = size
        self.limit = limit


class CommitTooLarge(InputError):
    """A commit over one of the store's limits (events, bytes, a scoped value); nothing was written."""

    http_status: ClassVar[int] = 413

    def __init__(self, message: str, *, size: int, limit: int, field: str = "new_events") -> None:
        super().__init__(message, field=field)
        self.size = size
        self.limit = limit


class ScopeMismatch(InputError):
    """A commit whose scopes differ from the stored session's: scopes are fixed at creation; nothing was written."""

    http_status: ClassVar[int] = 409

    def __init__(self, session_id: str, *, stored: dict[str, str], given: dict[str, str]) -> None:
        scope = min(name for name in {*stored, *given} if stored.get(name) != given.get(name))
        super().__init__(
            f"session {session_id!r} is bound to {scope}={stored.get(scope)!r}, not {given.get(scope)!r}: "
            "scopes are fixed when a session is created",
            field=f"scopes.{scope}",
        )
        self.session_id = session_id
        self.scope = scope
        self.stored = stored
        self.given = given


class RequestTooLarge(InputError):
    """An HTTP request body over the handler's limit; refused before it is parsed."""

    http_status: ClassVar[int] = 413

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the body is {size} bytes; the limit is {limit}", field="body")
        self.size = size
        self.limit = limit


class RequestInProgress(InputError):
    """A request retried with the ``Idempotency-Key`` of one still running: wait, then retry for its result."""

    http_status: ClassVar[int] = 409


class NotAuthenticated(InputError):
    """An HTTP request that reached a handler with no authenticated caller (no authorizer identity)."""

    http_status: ClassVar[int] = 401


class TurnQuotaExceeded(InputError):
    """A caller (tenant) past its turn quota: nothing was run or written. ``quota`` names it (``turns/seconds``);
    ``retry_after`` is the seconds until its window ends."""

    http_status: ClassVar[int] = 429

    def __init__(self, turns: int, seconds: int, retry_after: int) -> None:
        super().__init__(
            f"the turn quota of {turns} turns per {seconds} s is spent; try again in {retry_after} s", field="quota"
        )
        self.quota = f"{turns}/{seconds}"
        self.retry_after = retry_after


class NotPermitted(InputError):
    """An authenticated caller a rule refuses: nothing is written. ``rule`` names the rule."""

    http_status: ClassVar[int] = 403

    def __init__(self, message: str, *, rule: str, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.rule = rule


class AnswerRefused(NotPermitted):
    """An answer by a caller the tool's ``answerable_by`` refuses (``call_id``, ``tool``, ``rule``)."""

    def __init__(self, call_id: str, tool: str, rule: str, why: str, *, field: str | None = None) -> None:
        super().__init__(f"call {call_id!r} of {tool!r} is answerable by {rule}: {why}", rule=rule, field=field)
        self.call_id = call_id
        self.tool = tool


class ModelError(DormantError):
    """A model adapter failed. Inside a run this is recorded and the run ends with status ``error``."""

    http_status: ClassVar[int] = 502


class ModelProviderError(ModelError):
    """The provider's API failed, after its client's own retries when the failure was transient.

    ``status_code`` is the HTTP status (if the server answered), ``code`` the provider's error code.
    A transient failure (a later run may succeed) is a ``ModelUnavailable``; ``retryable`` says so.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.request_id = request_id

    @property
    def retryable(self) -> bool:
        return isinstance(self, ModelUnavailable)


class ModelUnavailable(ModelProviderError):
    """The provider throttled, timed out, was down or could not be reached (after its client's retries)."""

    http_status: ClassVar[int] = 503


class MalformedModelResponse(ModelProviderError):
    """The provider answered, but not with a model response (no choices, no output message...)."""


class ToolArgumentsError(ModelError):
    """Arguments from the model that the tool's schema refuses (shown to the model, not raised to callers)."""


class ScriptExhausted(ModelError):
    """``MockAdapter`` was asked for a response beyond its script."""

    http_status: ClassVar[int] = 500


class StoreError(DormantError):
    """The store could not do what was asked."""


class VersionConflict(StoreError):
    """The stored version is not the one the commit expected; nothing was written."""

    http_status: ClassVar[int] = 409
    field: str | None = None
    """What a caller sent that conflicted (``expected_version``, a create's ``session_id``), when an API knows."""

    def __init__(self, session_id: str, *, expected_version: int, actual_version: int) -> None:
        super().__init__(
            f"session {session_id!r} is at version {actual_version}, not {expected_version}: "
            "reload it (or use dormant.serving.commit to merge)"
        )
        self.session_id = session_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class ThreadChanged(VersionConflict):
    """Another process wrote the LangGraph thread since this saver read it (``dormant.bridges.langgraph``);
    nothing was written. ``session_id`` is the dormant session the thread is stored under."""

    def __init__(self, thread_id: str, session_id: str, *, expected_version: int, actual_version: int) -> None:
        super().__init__(session_id, expected_version=expected_version, actual_version=actual_version)
        gone = "was deleted" if actual_version == 0 else f"is at version {actual_version}"
        self.args = (
            f"LangGraph thread {thread_id!r} {gone}, not at version {expected_version} as this saver read it: "
            "another process wrote it. Nothing was written; read the thread again (get_tuple) and retry.",
        )
        self.thread_id = thread_id


class ClaimLost(VersionConflict):
    """``dormant.serving.advance`` lost the claim on a session: another writer's input or run landed first.

    Raised before any tool ran and with nothing written, so the caller may reload and decide again.
    ``reason`` says what happened; an HTTP handler answers 409 Conflict.
    """

    def __init__(self, session_id: str, *, expected_version: int, actual_version: int, reason: str) -> None:
        StoreError.__init__(self, f"session {session_id!r}: {reason}; nothing was run")
        self.session_id = session_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        self.reason = reason


class SessionNotFound(StoreError, KeyError):
    """No session with that id in the store (``app.sessions.require``; ``get`` returns ``None`` instead)."""

    http_status: ClassVar[int] = 404

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r} in the store")
        self.session_id = session_id

    def __str__(self) -> str:
        return str(self.args[0])


class StoreBusy(StoreError):
    """The database stayed locked past the store's timeout, or a session kept moving under a write that
    retries (``app.sessions.write``, which names it in ``session_id``); retrying later may succeed."""

    http_status: ClassVar[int] = 503

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id
        """The session whose writes kept losing the race (``None``: the store as a whole was busy)."""


THROTTLE_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "RequestLimitExceeded", "Throttling", "ThrottlingException"}
    | {"TooManyRequestsException"}
)
"""AWS error codes of a request refused for its rate (DynamoDB, Step Functions, Lambda), past botocore's retries."""


def throttle_code(exc: BaseException | None) -> str | None:
    """The code of an AWS SDK error (a botocore ``ClientError``, read by shape: no import) refused for its rate."""
    response = getattr(exc, "response", None)
    code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
    return code if code in THROTTLE_CODES else None


class StoreThrottled(StoreBusy):
    """The store refused the request for its rate (DynamoDB: a partition, an index's back-pressure or the table
    over its throughput) past the client's retries; nothing of it was applied. A throttle, so over HTTP a 429
    with ``Retry-After``: ``retry_after`` seconds (a partition's rate is per second)."""

    http_status: ClassVar[int] = 429
    retry_after: ClassVar[int] = 1


class StoreUnavailable(StoreError):
    """The store cannot be reached (connection refused, network down); retrying later may succeed."""

    http_status: ClassVar[int] = 503


class CommitIncomplete(StoreError):
    """A commit passed the version gate but not all of its writes landed (throttling, a lost connection).

    None of it is visible: readers skip a pending version. Its marker stays on the session until
    ``repair_pending`` (or the next writer, once the marker is stale) rolls the commit forward or back;
    then the same commit may be sent again.
    """

    http_status: ClassVar[int] = 503

    def __init__(self, message: str, *, session_id: str = "", version: int = 0) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.version = version


class StoreClosed(StoreError):
    """The store was used after ``close()``."""


class TurnNotClaimed(DormantError):
    """A workflow was started for an invocation that is not on the ledger (yet): its claim has not landed.

    The API starts a turn's execution just before it commits the claim, so the execution may look first.
    The state machine retries this for about a minute; past that the claim never landed and the execution
    ends with nothing to do."""

    http_status: ClassVar[int] = 503


RETRYABLE: tuple[type[DormantError], ...] = (ModelUnavailable, StoreBusy, StoreUnavailable, CommitIncomplete)
"""Transient failures: the same call may succeed later."""


def http_status(exc: BaseException) -> int:
    """The HTTP status for ``exc``: its class's ``http_status`` (inherited by a subclass that declares none;
    500 for an error that is not dormant's)."""
    return exc.http_status if isinstance(exc, DormantError) else 500


def retryable_error_names() -> list[str]:
    """The names of the retryable classes and their subclasses (for a Step Functions ``ErrorEquals``)."""
    return sorted(kind.__name__ for kind in _status_table() if issubclass(kind, RETRYABLE))


_PROVIDER_ERRORS = frozenset(
    {
        "BedrockMalformedResponse",
        "BedrockModelError",
        "BedrockModelUnavailable",
        "OpenAIMalformedResponse",
        "OpenAIModelError",
        "OpenAIModelUnavailable",
        "OpenAIRefusal",
    }
)
"""The names defined in ``_PROVIDER_MODULE`` that this module re-exports."""
_PROVIDER_MODULE = "dormant.models.errors"
"""Where the provider errors are defined. ``dormant.models.errors`` imports this module (their bases are here),
and this module, the bottom layer, imports nothing of dormant: it names that module by a string and loads it on
the first access to one of its names. So no import points up a layer, and none closes a cycle."""
_TABLES = frozenset({"HTTP_STATUS", "RETRYABLE", "http_status", "retryable_error_names"})


def _status_table() -> dict[type[DormantError], int]:
    """Each public error class and the status it answers with, derived from the classes (``http_status``)."""
    kinds = (globals()[name] if name in globals() else __getattr__(name) for name in __all__ if name not in _TABLES)
    return {kind: kind.http_status for kind in kinds if isinstance(kind, type) and issubclass(kind, DormantError)}


def __getattr__(name: str) -> Any:
    """The provider errors (``dormant.models.errors``), and ``HTTP_STATUS``, loaded when first asked for."""
    if name in _PROVIDER_ERRORS:
        value: Any = getattr(importlib.import_module(_PROVIDER_MODULE), name)
    elif name == "HTTP_STATUS":
        value = _status_table()
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value
