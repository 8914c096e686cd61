"""The seam between the run loop and a model provider.

A provider implements ``ModelAdapter.complete``: it gets the messages the context renderers produced
(provider-neutral ``Message``s), the tool definitions and, when the agent declares an output model,
its JSON schema; it returns text and/or tool calls with usage and the finish reason. Anything it
raises ends the run with status ``error``, recorded on the ledger.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import time
from collections.abc import Iterator, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ConfigurationError
from ..events import ModelRef, Usage

__all__ = [
    "Message",
    "ModelAdapter",
    "ModelRequest",
    "ModelResponse",
    "ModelSpec",
    "ToolCall",
    "bedrock",
    "calls_end_by",
    "openai",
    "time_left",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)  # built on first use, not at import


class ToolCall(_Frozen):
    """A tool call the model asked for. ``error`` says why its arguments could not be decoded, if so."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    call_id: str | None = None
    error: str | None = None


class Message(_Frozen):
    """One provider-neutral chat message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


class ModelSpec(_Frozen):
    """Which model an agent uses: a provider, a model name, and options for that provider's adapter."""

    provider: str
    name: str
    options: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, value: ModelSpec | Mapping[str, Any]) -> ModelSpec:
        if isinstance(value, ModelSpec):
            return value
        if isinstance(value, Mapping) and isinstance(value.get("provider"), str) and isinstance(value.get("name"), str):
            extra = {k: v for k, v in value.items() if k not in ("provider", "name", "options")}
            return cls(provider=value["provider"], name=value["name"], options={**value.get("options", {}), **extra})
        raise ConfigurationError(
            f"an agent's model is openai(name), bedrock(model_id) or {{'provider': ..., 'name': ...}}, not {value!r}"
        )

    @property
    def ref(self) -> ModelRef:
        return ModelRef(provider=self.provider, name=self.name)


class ModelRequest(_Frozen):
    model: ModelSpec
    messages: list[Message]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    output_schema: dict[str, Any] | None = None
    """JSON schema the final answer must match (the agent's ``output`` model), if any."""
    output_name: str | None = None


class ModelResponse(_Frozen):
    text: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    finish_reason: str | None = None


@runtime_checkable
class ModelAdapter(Protocol):
    """What a model provider implements."""

    def complete(self, request: ModelRequest) -> ModelResponse: ...


# -- the time a model call may take --------------------------------------------------------

_CALLS_END_BY: contextvars.ContextVar[float | None] = contextvars.ContextVar("dormant_calls_end_by", default=None)

MIN_ATTEMPT_SECONDS = 1.0
"""An adapter starts no attempt (first try or retry) with less time than this left: it would only time out."""


@contextlib.contextmanager
def calls_end_by(deadline: float | None) -> Iterator[None]:
    """Model calls made inside must have returned by ``deadline`` (``time.time()`` seconds), retries included.

    A Lambda handler sets it from ``context.get_remaining_time_in_millis()``, less the time it needs to record
    what happened: a provider slower than that ends the step with the adapter's typed ``ModelUnavailable``
    (on the ledger) instead of Lambda killing the function mid-step. Without it adapters keep their own
    timeouts and retries.
    """
    token = _CALLS_END_BY.set(deadline)
    try:
        yield
    finally:
        _CALLS_END_BY.reset(token)


def time_left() -> float | None:
    """Seconds until the ``calls_end_by`` deadline in force (``None``: no deadline; never below 0)."""
    deadline = _CALLS_END_BY.get()
    return None if deadline is None else max(0.0, deadline - time.time())


# Providers dormant ships, imported only when a run first needs one (their SDKs are optional extras).
_PROVIDERS = {
    "openai": "dormant.models.openai:OpenAIAdapter",
    "bedrock": "dormant.models.bedrock:BedrockAdapter",
}


def default_adapter(spec: ModelSpec) -> ModelAdapter:
    """Build the shipped adapter for ``spec.provider`` (no override given to ``adk(adapters=...)``)."""
    target = _PROVIDERS.get(spec.provider)
    if target is None:
        raise ConfigurationError(
            f"no model adapter for provider {spec.provider!r}: pass adk(adapters={{{spec.provider!r}: ...}})"
        )
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"the {spec.provider} adapter needs an extra: pip install 'dormant[{spec.provider}]' ({exc})"
        ) from exc
    factory: Any = getattr(module, class_name)
    adapter: ModelAdapter = factory(**spec.options)
    return adapter


def openai(name: str, **options: Any) -> ModelSpec:
    """An OpenAI (or OpenAI-compatible, with ``base_url=``) chat model."""
    return ModelSpec(provider="openai", name=name, options=options)


def bedrock(model_id: str, **options: Any) -> ModelSpec:
    """An Amazon Bedrock model, through the Converse API."""
    return ModelSpec(provider="bedrock", name=model_id, options=options)
