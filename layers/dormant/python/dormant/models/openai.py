"""OpenAI Chat Completions, for OpenAI and any OpenAI-compatible server (``base_url=``).

Why one module: it is one adapter for one provider API (its options, the request and response mapping, its
errors and deadline); what adapters share is in ``models.base`` and ``models.errors``.

Options (``openai(name, **options)`` or ``OpenAIAdapter(**options)``) are of two kinds:

- client options configure the SDK client once: ``api_key`` (else ``OPENAI_API_KEY``; or a
  ``dormant.models.secrets.Secret``, read on the first call and again when its cached value changes), ``base_url``,
  ``organization``, ``project``, ``timeout``, ``max_retries``, ``default_headers``, ``default_query``,
  ``http_client``, ``websocket_base_url``; or ``client=`` a ready ``openai.OpenAI`` (Azure, proxies, tests).
  Retries with backoff on 429, 408/409, 5xx, timeouts and dropped connections are the SDK's own
  (``max_retries``, default 2; ``Retry-After`` honoured): this module adds no retry loop, except under a
  deadline (``dormant.models.base.calls_end_by``, set by the Lambda handlers from the function's remaining
  time): then each attempt gets what is left as its timeout, and a retry is made only if its backoff leaves
  time for it (at most ``max_retries``), so a slow provider ends the step with ``OpenAIModelUnavailable``.
- every other option is a request field sent as is (``temperature``, ``max_tokens``, ``seed``,
  ``top_p``, ``reasoning_effort``, vendor fields of a compatible server...). Request options on the
  agent's model spec override the adapter's, so one injected adapter can serve several agents.

Structured output (an agent's ``output=`` model) is asked for natively with
``response_format={"type": "json_schema", ...}``. OpenAI's ``strict`` mode only accepts schemas whose
objects all forbid extra keys and require every property, which a pydantic model with defaults does
not; so ``output_strict=None`` (default) sends ``strict: true`` only when the schema already qualifies
(``model_config = ConfigDict(extra="forbid")`` and no defaults), ``True``/``False`` force it. A
``response_format`` option replaces the generated one (e.g. ``{"type": "json_object"}`` for a server
without JSON-schema support). The loop validates the answer against the model either way.

``wire_request`` is the pure function from a ``ModelRequest`` to the request body; ``complete`` sends
exactly that, so a ``model_start`` event (rendered messages + tools) determines what the provider got.
The ``openai`` package is imported only when a client is first built.
"""

from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigurationError,
    ModelError,
)
from ..events import Usage
from .base import MIN_ATTEMPT_SECONDS, Message, ModelRequest, ModelResponse, ToolCall, time_left
from .errors import OpenAIMalformedResponse, OpenAIModelError, OpenAIModelUnavailable, OpenAIRefusal

if TYPE_CHECKING:
    import openai as openai_sdk

# The errors are defined next door (dormant.models.errors, one tree) and re-exported here, where callers look.
__all__ = ["OpenAIAdapter", "OpenAIMalformedResponse", "OpenAIModelError", "OpenAIModelUnavailable", "OpenAIRefusal"]

# Options that configure the SDK client, not the request body.
_CLIENT_OPTIONS = frozenset(
    {
        "api_key",
        "organization",
        "project",
        "base_url",
        "websocket_base_url",
        "timeout",
        "max_retries",
        "default_headers",
        "default_query",
        "http_client",
    }
)
# Options this adapter reads itself.
_ADAPTER_OPTIONS = frozenset({"client", "output_strict"})
# Request fields the adapter builds; an option may not replace them.
_RESERVED = frozenset({"model", "messages", "tools", "stream", "extra_body", "extra_headers", "extra_query"})
# Non-body parameters of ``chat.completions.create``; everything else in its signature is a body field.
_CREATE_NON_BODY = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
_RETRYABLE_STATUS = frozenset({408, 409, 429})
_SDK_MAX_RETRIES = 2
"""The SDK's own default ``max_retries``: what a deadline-bound call allows itself too."""
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")


class OpenAIAdapter:
    """A ``ModelAdapter`` over ``client.chat.completions.create``."""

    def __init__(self, **options: Any) -> None:
        _check_options(options)
        self.output_strict: bool | None = options.get("output_strict")
        self.client_options = {k: v for k, v in options.items() if k in _CLIENT_OPTIONS}
        self.request_options = {k: v for k, v in options.items() if k not in _CLIENT_OPTIONS | _ADAPTER_OPTIONS}
        self._client: openai_sdk.OpenAI | None = options.get("client")
        self._injected = self._client is not None
        self._key_used: str | None = None
        self._body_fields: frozenset[str] | None = None
        self._lock = threading.Lock()

    # -- the request ------------------------------------------------------------------------

    def wire_request(self, request: ModelRequest) -> dict[str, Any]:
        """The exact JSON body ``complete`` sends for ``request`` (pure: no client, no I/O)."""
        _check_options(request.model.options)
        options = {**self.request_options, **_request_level(request.model.options)}
        body: dict[str, Any] = {
            "model": request.model.name,
            "messages": [_wire_message(m) for m in request.messages],
        }
        if request.tools:
            body["tools"] = [_wire_tool(t) for t in request.tools]
        if request.output_schema is not None and "response_format" not in options:
            body["response_format"] = self._response_format(request)
        body.update(options)
        return body

    def _response_format(self, request: ModelRequest) -> dict[str, Any]:
        schema = request.output_schema or {}
        strict = request.model.options.get("output_strict", self.output_strict)
        if strict is None:
            strict = _strict_compatible(schema)
        name = _SCHEMA_NAME.sub("_", request.output_name or str(schema.get("title") or "output"))[:64] or "output"
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}

    # -- the call ---------------------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        body = self.wire_request(request)
        client = self._get_client()
        fields = self._create_body_fields(client)
        kwargs = {k: v for k, v in body.items() if k in fields}
        extra = {k: v for k, v in body.items() if k not in fields}  # vendor fields the SDK does not name
        if time_left() is None:
            try:
                completion = client.chat.completions.create(**kwargs, extra_body=extra or None)
            except Exception as exc:
                raise _translate(exc, client) from exc
        else:
            completion = self._create_by_deadline(client, kwargs, extra)
        return self.parse_response(completion, request)

    def _create_by_deadline(self, client: openai_sdk.OpenAI, kwargs: dict[str, Any], extra: dict[str, Any]) -> Any:
        """``create`` under a deadline: each attempt times out when the deadline comes, and a retry is made only
        when its backoff leaves at least ``MIN_ATTEMPT_SECONDS``."""
        retries = self.client_options.get("max_retries", _SDK_MAX_RETRIES)
        attempt = 0
        while True:
            left = time_left() or 0.0
            if left < MIN_ATTEMPT_SECONDS:
                raise OpenAIModelUnavailable(
                    f"OpenAI chat completion ({client.base_url}): the function's time ran out"
                    f"{_after(attempt)} before {'a retry' if attempt else 'the call'} could be made"
                )
            try:
                bounded = client.with_options(timeout=left, max_retries=0)
                return bounded.chat.completions.create(**kwargs, extra_body=extra or None)
            except Exception as exc:
                pause = _retry_pause(exc, attempt) if attempt < retries else None
                if pause is None or (time_left() or 0.0) - pause < MIN_ATTEMPT_SECONDS:
                    raise _translate(exc, client, retries=attempt, deadline=True) from exc
                time.sleep(pause)
                attempt += 1

    def parse_response(self, completion: Any, request: ModelRequest | None = None) -> ModelResponse:
        """Map a chat completion (SDK object or its JSON) to a ``ModelResponse``; refuse a malformed one."""
        data = completion.to_dict() if callable(getattr(completion, "to_dict", None)) else completion
        if not isinstance(data, Mapping):
            raise OpenAIMalformedResponse(f"the server did not return a chat completion object: {_clip(data)}")
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise OpenAIMalformedResponse(f"the chat completion has no choices: {_clip(data)}")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, Mapping) else None
        if not isinstance(message, Mapping):
            raise OpenAIMalformedResponse(f"the chat completion's first choice has no message: {_clip(choice)}")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise OpenAIMalformedResponse(f"the message content is not a string: {_clip(content)}")
        refusal = message.get("refusal")
        if content is None and isinstance(refusal, str) and refusal:
            if request is not None and request.output_schema is not None:
                raise OpenAIRefusal(f"the model refused to answer as {request.output_name or 'the output'}: {refusal}")
            content = refusal
        raw_calls = message.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise OpenAIMalformedResponse(f"the message's tool_calls is not a list: {_clip(raw_calls)}")
        finish = choice.get("finish_reason")
        return ModelResponse(
            text=content,
            tool_calls=[_tool_call(c) for c in raw_calls],
            usage=_usage(data.get("usage")),
            finish_reason=finish if isinstance(finish, str) else None,
        )

    # -- the client -------------------------------------------------------------------------

    def _get_client(self) -> openai_sdk.OpenAI:
        with self._lock:
            key = self.client_options.get("api_key")
            if callable(getattr(key, "value", None)):  # a Secret: its cached value; a new one rebuilds the client
                value = str(key.value())  # type: ignore[union-attr]
                if self._client is not None and value != self._key_used and not self._injected:
                    self._client = None
                self._key_used = value
            if self._client is None:
                self._client = self._build_client(self._key_used)
            return self._client

    def _build_client(self, key: str | None = None) -> openai_sdk.OpenAI:
        _sdk()
        import openai as sdk

        options = dict(self.client_options)
        if key is not None:
            options["api_key"] = key
        if not options.get("api_key"):
            options["api_key"] = os.environ.get("OPENAI_API_KEY") or None
        if not options["api_key"]:
            raise ConfigurationError(
                "the OpenAI adapter has no API key: set OPENAI_API_KEY or pass openai(name, api_key=...) "
                "(a compatible server that needs no key still needs a placeholder, e.g. api_key='none')"
            )
        try:
            return sdk.OpenAI(**options)
        except (sdk.OpenAIError, TypeError, ValueError) as exc:  # e.g. max_retries=None, a malformed base_url
            raise ConfigurationError(f"could not build the OpenAI client: {exc}") from exc

    def _create_body_fields(self, client: openai_sdk.OpenAI) -> frozenset[str]:
        """The body fields ``chat.completions.create`` names in this SDK version; the rest go in ``extra_body``."""
        if self._body_fields is None:
            import inspect

            params = inspect.signature(client.chat.completions.create).parameters
            self._body_fields = frozenset(params) - _CREATE_NON_BODY
        return self._body_fields


# -- neutral -> wire ------------------------------------------------------------------------


def _check_options(options: Mapping[str, Any]) -> None:
    clash = sorted(_RESERVED & set(options))
    if clash:
        raise ConfigurationError(f"OpenAI option {clash[0]!r} is set by the adapter itself and cannot be passed")
    strict = options.get("output_strict")
    if strict is not None and not isinstance(strict, bool):
        raise ConfigurationError(f"output_strict is True, False or None (decide from the schema), not {strict!r}")


def _request_level(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in _CLIENT_OPTIONS | _ADAPTER_OPTIONS}


def _wire_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        if message.tool_call_id is None:
            raise ConfigurationError("a tool message needs the tool_call_id it answers")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content or ""}
    wire: dict[str, Any] = {"role": message.role}
    if message.role == "assistant" and message.tool_calls:
        wire["content"] = message.content  # may be null next to tool calls
        wire["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.args, ensure_ascii=False)},
            }
            for call in message.tool_calls
        ]
    else:
        wire["content"] = message.content or ""
    if message.name is not None:
        wire["name"] = message.name
    return wire


def _wire_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _strict_compatible(schema: Any) -> bool:
    """Whether OpenAI's strict mode accepts ``schema`` as is: every object closed, every property required."""
    if isinstance(schema, list):
        return all(_strict_compatible(item) for item in schema)
    if not isinstance(schema, Mapping):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False or set(schema.get("required") or []) != set(properties):
            return False
    return all(_strict_compatible(value) for value in schema.values())


# -- wire -> neutral ------------------------------------------------------------------------


def _tool_call(raw: Any) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise OpenAIMalformedResponse(f"a tool call is not an object: {_clip(raw)}")
    call_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    function = raw.get("function")
    if raw.get("type", "function") != "function" or not isinstance(function, Mapping):
        label = str((raw.get("custom") or {}).get("name") or raw.get("type") or "unknown")
        return ToolCall(name=label, call_id=call_id, error=f"unsupported tool call type {raw.get('type')!r}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise OpenAIMalformedResponse(f"a tool call has no function name: {_clip(raw)}")
    arguments = function.get("arguments")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return ToolCall(name=name, call_id=call_id)  # some compatible servers send "" for no arguments
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError as exc:
        return ToolCall(name=name, call_id=call_id, error=f"arguments are not valid JSON ({exc}): {_clip(arguments)}")
    if not isinstance(args, dict):
        return ToolCall(name=name, call_id=call_id, error=f"arguments are not a JSON object: {_clip(arguments)}")
    return ToolCall(name=name, call_id=call_id, args=args)


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, Mapping):
        return Usage()  # some compatible servers omit usage
    prompt = _int(raw.get("prompt_tokens"))
    completion = _int(raw.get("completion_tokens"))
    total = _int(raw.get("total_tokens")) or prompt + completion
    return Usage(input_tokens=prompt, output_tokens=completion, total_tokens=total)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# -- errors ---------------------------------------------------------------------------------


def _after(retries: int) -> str:
    return f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""


def _retry_pause(exc: Exception, attempt: int) -> float | None:
    """Seconds to wait before retrying after ``exc`` (the SDK's rules: ``x-should-retry``, 408/409/429/5xx,
    timeouts and dropped connections; ``Retry-After`` up to 60 s, else backoff from 0.5 s), or ``None``."""
    sdk = _sdk()
    if isinstance(exc, sdk.APIStatusError):
        headers = exc.response.headers
        should = headers.get("x-should-retry")
        retryable = exc.status_code in _RETRYABLE_STATUS or exc.status_code >= 500
        if should == "false" or (should != "true" and not retryable):
            return None
        for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                seconds = float(headers.get(name, "")) * scale
            except ValueError:
                continue
            if 0 < seconds <= 60:
                return seconds
    elif not isinstance(exc, sdk.APITimeoutError | sdk.APIConnectionError):
        return None
    return float(min(0.5 * 2**attempt, 8.0) * (1 - 0.25 * random.random()))


def _translate(
    exc: Exception, client: openai_sdk.OpenAI, *, retries: int | None = None, deadline: bool = False
) -> ModelError:
    """An SDK/HTTP failure as a typed dormant error whose message says what happened and how often it was tried."""
    sdk = _sdk()
    where = f"OpenAI chat completion ({client.base_url})"
    retries = _retries_taken(exc) if retries is None else retries
    tried = _after(retries)
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        kind = OpenAIModelUnavailable if status in _RETRYABLE_STATUS or status >= 500 else OpenAIModelError
        return kind(
            f"{where} failed with HTTP {status}{tried}: {_error_detail(exc)}",
            status_code=status,
            request_id=exc.request_id,
        )
    if isinstance(exc, sdk.APITimeoutError):
        spent = " (the function's remaining time)" if deadline else ""
        return OpenAIModelUnavailable(f"{where} timed out{spent}{tried}")
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f": {cause}" if cause is not None else ""
        return OpenAIModelUnavailable(f"{where} could not connect{tried}{detail}")
    if isinstance(exc, sdk.APIResponseValidationError):
        return OpenAIMalformedResponse(f"{where} returned an invalid response: {exc}", status_code=exc.status_code)
    if isinstance(exc, ValueError):  # a 2xx body that is not JSON
        return OpenAIMalformedResponse(f"{where} returned a body that is not JSON: {exc}")
    return OpenAIModelError(f"{where} failed: {type(exc).__name__}: {exc}")


def _retries_taken(exc: Exception) -> int:
    request = getattr(exc, "request", None)
    headers = getattr(request, "headers", None)
    try:
        return int(headers.get("x-stainless-retry-count", 0)) if headers is not None else 0
    except (TypeError, ValueError):
        return 0


def _error_detail(exc: openai_sdk.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and isinstance(error.get("message"), str):
            return str(error["message"])
    return exc.message


def _clip(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _sdk() -> Any:
    try:
        import openai as sdk
    except ImportError as exc:
        raise ConfigurationError(
            f"the OpenAI adapter needs the openai SDK: pip install 'dormant[openai]' ({exc})"
        ) from exc
    return sdk
