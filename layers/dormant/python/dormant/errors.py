"""Every error dormant raises, in one place.

The tree::

    DormantError
    ├── ConfigurationError          a mistake in how dormant was set up (adk(), stores, agents, tools)
    │   └── SchemaError             a schema that is not scope -> pydantic model class
    ├── InputError                  bad input from a caller; carries ``field`` (over HTTP: a 4xx)
    │   ├── InvalidSessionId
    │   ├── StateError              a state read or write that cannot be done
    │   │   ├── StateValidationError   value refused by the scope's model (``scope``, ``key``)
    │   │   ├── UnknownStateKey        a read of a key the scope's model does not declare (also ``AttributeError``)
    │   │   ├── UnknownScope           a scope the schema does not declare
    │   │   ├── ScopeNotBound          a shared scope written with no id bound to the session
    │   │   └── TempOutsideInvocation  ``temp`` touched outside an invocation
    │   ├── EventValidationError    a dict that is not a valid event
    │   ├── EventIndexError         an event index out of range (also an ``IndexError``)
    │   ├── UnknownEventId          an event id not in the ledger (also a ``KeyError``)
    │   ├── UnknownCallId           an answer for a tool call that is not waiting
    │   ├── ToolInputError          an answer refused by the tool's ``yield_schema``
    │   └── AgentMismatch           resuming a session with a different agent than the one waiting
    ├── ModelError                  a model adapter failed; a run records it and ends with ``error``
    │   ├── ModelProviderError      the provider's API failed (``status_code``, ``code``, ``retryable``)
    │   │   └── MalformedModelResponse   it answered with something that is not a model response
    │   └── ScriptExhausted         MockAdapter was asked for more responses than were scripted
    └── StoreError                  the store could not do what was asked
        ├── VersionConflict         optimistic concurrency: the stored version moved (``actual_version``)
        │   └── ClaimLost           another writer claimed the session first; this run did nothing (HTTP 409)
        ├── SessionNotFound
        ├── StoreBusy               the database stayed locked past the timeout (retryable)
        └── StoreClosed             the store was used after ``close()``

Errors a caller must act on carry the facts as attributes, not only in the message.
"""

from __future__ import annotations

__all__ = [
    "AgentMismatch",
    "ClaimLost",
    "ConfigurationError",
    "DormantError",
    "EventIndexError",
    "EventValidationError",
    "InputError",
    "InvalidSessionId",
    "MalformedModelResponse",
    "ModelError",
    "ModelProviderError",
    "SchemaError",
    "ScopeNotBound",
    "ScriptExhausted",
    "SessionNotFound",
    "StateError",
    "StateValidationError",
    "StoreBusy",
    "StoreClosed",
    "StoreError",
    "TempOutsideInvocation",
    "ToolInputError",
    "UnknownCallId",
    "UnknownEventId",
    "UnknownScope",
    "UnknownStateKey",
    "VersionConflict",
]


class DormantError(Exception):
    """Root of every error dormant raises."""


class ConfigurationError(DormantError):
    """dormant was set up wrongly: fix the code that builds the app, agent, tool or store."""


class SchemaError(ConfigurationError):
    """The schema given to ``adk()`` is not a mapping of known scope names to pydantic model classes."""

    def __init__(self, message: str, *, scope: str | None = None) -> None:
        super().__init__(message)
        self.scope = scope


class InputError(DormantError):
    """A caller passed something dormant cannot accept; nothing was written.

    ``field`` names the offending input (a dotted path such as ``state.session.stage``).
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidSessionId(InputError):
    """A session id (or scope id, or app name) that is empty, too long, or has characters outside the allowed set."""


class StateError(InputError):
    """A state read or write that cannot be done."""


class StateValidationError(StateError):
    """A value refused by the scope's model; nothing was recorded."""

    def __init__(self, message: str, *, scope: str, key: str) -> None:
        super().__init__(message, field=f"state.{scope}.{key}")
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

    def __init__(self, scope: str) -> None:
        super().__init__(f"scope {scope!r} is not declared in the app's schema", field=f"state.{scope}")
        self.scope = scope


class ScopeNotBound(StateError):
    """A shared scope written inside an invocation while the session carries no id for it."""

    def __init__(self, scope: str) -> None:
        super().__init__(
            f"shared scope {scope!r} is not bound to this session: create the session with "
            f"scopes={{{scope!r}: '<id>'}} to write it",
            field=f"state.{scope}",
        )
        self.scope = scope


class TempOutsideInvocation(StateError):
    """``temp`` holds scratch values for one invocation; it does not exist outside one."""

    def __init__(self) -> None:
        super().__init__("the temp scope exists only inside an invocation", field="state.temp")


class EventValidationError(InputError):
    """A dict (or JSON) that does not parse as a dormant event."""


class EventIndexError(InputError, IndexError):
    """An event index outside the ledger."""

    def __init__(self, index: int, length: int) -> None:
        super().__init__(f"event index {index} is out of range for a ledger of {length} events", field="index")
        self.index = index
        self.length = length


class UnknownEventId(InputError, KeyError):
    """An event id that is not in this session's ledger."""

    def __init__(self, event_id: str) -> None:
        super().__init__(f"no event with id {event_id!r} in this session", field="event_id")
        self.event_id = event_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class UnknownCallId(InputError):
    """An answer for a tool call that is not waiting for one."""

    def __init__(self, call_id: str, waiting: list[str]) -> None:
        hint = f"waiting: {', '.join(waiting)}" if waiting else "no call is waiting"
        super().__init__(f"tool call {call_id!r} is not waiting for input ({hint})", field="tools.call_id")
        self.call_id = call_id
        self.waiting = waiting


class ToolInputError(InputError):
    """An answer to a yielded call refused by the tool's ``yield_schema``."""

    def __init__(self, message: str, *, call_id: str, tool: str) -> None:
        super().__init__(message, field="tools.input")
        self.call_id = call_id
        self.tool = tool


class AgentMismatch(InputError):
    """The session waits inside an invocation of another agent."""

    def __init__(self, waiting_agent: str, given_agent: str) -> None:
        super().__init__(
            f"the session waits inside an invocation of agent {waiting_agent!r}; resume it with that agent, "
            f"not {given_agent!r}",
            field="agent",
        )
        self.waiting_agent = waiting_agent
        self.given_agent = given_agent


class ModelError(DormantError):
    """A model adapter failed. Inside a run this is recorded and the run ends with status ``error``."""


class ModelProviderError(ModelError):
    """The provider's API failed, after its client's own retries when the failure was transient.

    ``status_code`` is the HTTP status (if the server answered), ``code`` the provider's error code,
    ``retryable`` whether the failure was of a transient kind (a later run may succeed).
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        retryable: bool = False,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.code = code
        self.retryable = retryable
        self.request_id = request_id


class MalformedModelResponse(ModelProviderError):
    """The provider answered, but not with a model response (no choices, no output message...)."""


class ScriptExhausted(ModelError):
    """``MockAdapter`` was asked for a response beyond its script."""


class StoreError(DormantError):
    """The store could not do what was asked."""


class VersionConflict(StoreError):
    """The stored version is not the one the commit expected; nothing was written."""

    def __init__(self, session_id: str, *, expected_version: int, actual_version: int) -> None:
        super().__init__(
            f"session {session_id!r} is at version {actual_version}, not {expected_version}: "
            "reload it (or use dormant.serving.commit to merge)"
        )
        self.session_id = session_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class ClaimLost(VersionConflict):
    """``dormant.serving.advance`` lost the claim on a session: another writer's input or run landed first.

    Raised before any tool ran and with nothing written, so the caller may reload and decide again.
    ``reason`` says what happened; an HTTP handler answers ``http_status`` (409 Conflict).
    """

    http_status = 409

    def __init__(self, session_id: str, *, expected_version: int, actual_version: int, reason: str) -> None:
        StoreError.__init__(self, f"session {session_id!r}: {reason}; nothing was run")
        self.session_id = session_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        self.reason = reason


class SessionNotFound(StoreError, KeyError):
    """No session with that id in the store."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no session {session_id!r} in the store")
        self.session_id = session_id

    def __str__(self) -> str:
        return str(self.args[0])


class StoreBusy(StoreError):
    """The database stayed locked past the store's timeout; retrying later may succeed."""


class StoreClosed(StoreError):
    """The store was used after ``close()``."""
