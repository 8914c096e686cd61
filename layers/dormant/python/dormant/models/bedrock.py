"""Amazon Bedrock through the Converse API (``bedrock-runtime``), for any model Converse serves.

Why one module: it is one adapter for one provider API (its options, the request and response mapping, its
errors and deadline); what adapters share is in ``models.base`` and ``models.errors``.

Options (``bedrock(model_id, **options)`` or ``BedrockAdapter(**options)``):

- client options: ``client=`` a ready ``bedrock-runtime`` client (tests, custom sessions), else one is
  built on first use from ``region_name``, ``endpoint_url``, ``profile_name``, ``aws_access_key_id``,
  ``aws_secret_access_key``, ``aws_session_token`` (else boto3's usual chain), with
  ``botocore.config.Config(retries={"mode": retry_mode, "total_max_attempts": max_attempts})`` —
  ``retry_mode`` ``"adaptive"`` (default: client-side rate limiting on top of backoff, the mode AWS
  suggests for Bedrock throttling), ``"standard"`` or ``"legacy"``; ``max_attempts`` counts the first
  try (default 4), as ``AWS_MAX_ATTEMPTS`` does — botocore's own ``retries["max_attempts"]`` counts
  retries only, hence ``total_max_attempts`` — plus ``connect_timeout`` and ``read_timeout``.
  Throttling, 5xx and timeouts are retried by botocore's handler; this module adds no retry loop, except
  under a deadline (``dormant.models.base.calls_end_by``, set by the Lambda handlers from the function's
  remaining time): then each attempt is made by a client whose read timeout is what is left, and a retry
  only when its backoff leaves time for it (at most ``max_attempts`` in all), so a slow model ends the step
  with ``BedrockModelUnavailable`` rather than a killed function.
  An injected client keeps its own config.
- request options: ``max_tokens``, ``temperature``, ``top_p``, ``stop_sequences`` (into
  ``inferenceConfig``) and Converse's own top-level fields by their API names (``inferenceConfig``,
  ``additionalModelRequestFields``, ``guardrailConfig``, ``performanceConfig``, ``serviceTier``, ...).
  Anything else is refused with a ``ConfigurationError`` rather than silently dropped.

Structured output (an agent's ``output=`` model): by default (``output_mode="tool"``) a tool named after
the output model, whose input schema is the output schema, is added and forced with ``toolChoice`` —
``{"tool": ...}`` when the agent has no tools, ``{"any": {}}`` when it has (the model may still call
them, and answers by calling the output tool). The output tool's input comes back as JSON text, which
the loop validates. Forced tool choice is the portable way (Claude, Nova, Mistral Large); botocore
versions with ``outputConfig.textFormat`` can use ``output_mode="json_schema"`` for models that
support Bedrock's native structured output.

``wire_request`` is the pure function from a ``ModelRequest`` to ``client.converse`` keyword arguments;
``complete`` sends exactly that. boto3/botocore are imported only when a client is first needed.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from .. import aws
from ..errors import (
    ConfigurationError,
    ModelError,
)
from ..events import Usage
from .base import MIN_ATTEMPT_SECONDS, Message, ModelRequest, ModelResponse, ToolCall, time_left
from .errors import BedrockMalformedResponse, BedrockModelError, BedrockModelUnavailable

# The errors are defined next door (dormant.models.errors, one tree) and re-exported here, where callers look.
__all__ = ["BedrockAdapter", "BedrockMalformedResponse", "BedrockModelError", "BedrockModelUnavailable"]

_CLIENT_OPTIONS = frozenset(
    {
        "client",
        "region_name",
        "endpoint_url",
        "profile_name",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "retry_mode",
        "max_attempts",
        "connect_timeout",
        "read_timeout",
        "output_mode",
    }
)
_INFERENCE = {
    "max_tokens": "maxTokens",
    "temperature": "temperature",
    "top_p": "topP",
    "stop_sequences": "stopSequences",
}
# Converse request fields an option may set as is (modelId, messages, system and toolConfig are built here).
_CONVERSE_FIELDS = frozenset(
    {
        "inferenceConfig",
        "additionalModelRequestFields",
        "additionalModelResponseFieldPaths",
        "guardrailConfig",
        "performanceConfig",
        "promptVariables",
        "requestMetadata",
        "serviceTier",
        "outputConfig",
    }
)
_RETRY_MODES = ("adaptive", "standard", "legacy")
_RETRYABLE_CODES = frozenset(
    {
        "ThrottlingException",
        "ServiceUnavailableException",
        "InternalServerException",
        "ModelNotReadyException",
        "ModelTimeoutException",
    }
)
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
_OUTPUT_TOOL_DESCRIPTION = "Give your final answer by calling this tool once, with the answer as its input."


class BedrockAdapter:
    """A ``ModelAdapter`` over ``bedrock-runtime`` ``converse``."""

    def __init__(self, **options: Any) -> None:
        self.retry_mode = options.get("retry_mode", "adaptive")
        if self.retry_mode not in _RETRY_MODES:
            raise ConfigurationError(f"retry_mode is one of {', '.join(_RETRY_MODES)}, not {self.retry_mode!r}")
        self.max_attempts = options.get("max_attempts", 4)
        if not isinstance(self.max_attempts, int) or isinstance(self.max_attempts, bool) or self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts is an int >= 1 (the first try included), not {self.max_attempts!r}")
        self.output_mode: str = _output_mode(options.get("output_mode", "tool"))
        self.client_options = {k: v for k, v in options.items() if k in _CLIENT_OPTIONS}
        self.request_options = _request_options(options)
        self._client: Any = options.get("client")
        self._injected = self._client is not None
        self._session: Any = None
        self._lock = threading.Lock()

    # -- the request ------------------------------------------------------------------------

    def wire_request(self, request: ModelRequest) -> dict[str, Any]:
        """The exact ``client.converse(**kwargs)`` arguments for ``request`` (pure: no client, no I/O)."""
        options = {**self.request_options}
        for key, value in _request_options(request.model.options).items():
            merge = key == "inferenceConfig" and isinstance(options.get(key), Mapping)
            options[key] = {**options[key], **value} if merge else value
        system, messages = _wire_messages(request.messages)
        payload: dict[str, Any] = {"modelId": request.model.name, "messages": messages}
        if system:
            payload["system"] = system
        tools = [_wire_tool(t) for t in request.tools]
        choice: dict[str, Any] | None = None
        if request.output_schema is not None:
            if self._output_mode(request) == "tool":
                name = self.output_tool_name(request)
                if any(t["name"] == name for t in request.tools):
                    raise ConfigurationError(f"the output tool name {name!r} is already a tool of this agent")
                tools.append(
                    _wire_tool(
                        {"name": name, "description": _OUTPUT_TOOL_DESCRIPTION, "parameters": request.output_schema}
                    )
                )
                choice = {"tool": {"name": name}} if len(tools) == 1 else {"any": {}}
            elif "outputConfig" not in options:
                options["outputConfig"] = {
                    "textFormat": {
                        "type": "json_schema",
                        "structure": {
                            "jsonSchema": {
                                "name": self.output_tool_name(request),
                                "schema": json.dumps(request.output_schema),
                            }
                        },
                    }
                }
        if tools:
            payload["toolConfig"] = {"tools": tools, **({"toolChoice": choice} if choice else {})}
        payload.update(options)
        return payload

    def _output_mode(self, request: ModelRequest) -> str:
        """The agent's model spec may choose its own mode; else the adapter's."""
        return _output_mode(request.model.options.get("output_mode", self.output_mode))

    @staticmethod
    def output_tool_name(request: ModelRequest) -> str:
        """The forced tool's name: the output model's name, as Converse allows tool names."""
        title = request.output_name or str((request.output_schema or {}).get("title") or "final_answer")
        return _TOOL_NAME.sub("_", title)[:64] or "final_answer"

    def retry_config(self) -> dict[str, Any]:
        """botocore's ``retries`` setting for clients this adapter builds (attempts include the first try)."""
        return {"mode": self.retry_mode, "total_max_attempts": self.max_attempts}

    def client_config(self) -> Any:
        """The ``botocore.config.Config`` a built client gets: retries and timeouts."""
        from botocore.config import Config

        extra = {k: self.client_options[k] for k in ("connect_timeout", "read_timeout") if k in self.client_options}
        return Config(retries=self.retry_config(), user_agent_extra="dormant", **extra)

    # -- the call ---------------------------------------------------------------------------

    def complete(self, request: ModelRequest) -> ModelResponse:
        payload = self.wire_request(request)
        if time_left() is not None:
            return self.parse_response(self._converse_by_deadline(payload, request.model.name), request)
        client = self._get_client()
        try:
            response = client.converse(**payload)
        except Exception as exc:
            raise _translate(exc, request.model.name) from exc
        return self.parse_response(response, request)

    def _converse_by_deadline(self, payload: dict[str, Any], model_id: str) -> Any:
        """``converse`` under a deadline: one attempt per client call, timed out when the deadline comes; a
        retry only when its backoff leaves at least ``MIN_ATTEMPT_SECONDS``."""
        attempt = 0
        while True:
            left = time_left() or 0.0
            if left < MIN_ATTEMPT_SECONDS:
                tried = f" after {attempt} {'retry' if attempt == 1 else 'retries'}" if attempt else ""
                raise BedrockModelUnavailable(
                    f"Bedrock Converse ({model_id}): the function's time ran out{tried} before "
                    f"{'a retry' if attempt else 'the call'} could be made"
                )
            client = self._get_client() if self._injected else self._bounded_client(left)
            try:
                return client.converse(**payload)
            except Exception as exc:
                pause = _retry_pause(exc, attempt) if attempt + 1 < self.max_attempts else None
                if pause is None or (time_left() or 0.0) - pause < MIN_ATTEMPT_SECONDS:
                    raise _translate(exc, model_id) from exc
                time.sleep(pause)
                attempt += 1

    def _bounded_client(self, seconds: float) -> Any:
        """A client that makes one attempt and gives up reading after ``seconds``."""
        from botocore.config import Config

        connect = min(float(self.client_options.get("connect_timeout", 60)), seconds)
        config = Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=connect,
            read_timeout=seconds,
            user_agent_extra="dormant",
        )
        return self._build_client(config)

    def parse_response(self, response: Any, request: ModelRequest | None = None) -> ModelResponse:
        """Map a Converse response to a ``ModelResponse``; the forced output tool's input becomes the text."""
        output = response.get("output") if isinstance(response, Mapping) else None
        message = output.get("message") if isinstance(output, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            raise BedrockMalformedResponse(f"the Converse response has no output message: {_clip(response)}")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in content:
            if not isinstance(block, Mapping):
                raise BedrockMalformedResponse(f"a content block is not an object: {_clip(block)}")
            if isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif "toolUse" in block:
                calls.append(_tool_call(block["toolUse"]))
        text = "".join(texts) if texts else None
        if request is not None and request.output_schema is not None and self._output_mode(request) == "tool":
            name = self.output_tool_name(request)
            answers = [c for c in calls if c.name == name]
            others = [c for c in calls if c.name != name]
            if answers and not others:  # the final answer; any preamble text is not part of it
                text, calls = json.dumps(answers[0].args), []
            else:  # real tool calls first: the model is asked again after they ran
                calls = others
        stop = response.get("stopReason")
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=_usage(response.get("usage")),
            finish_reason=stop if isinstance(stop, str) else None,
        )

    # -- the client -------------------------------------------------------------------------

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._build_client()
            return self._client

    def _build_client(self, config: Any = None) -> Any:
        """A ``bedrock-runtime`` client: from the process's shared botocore session (``dormant.aws``), unless a
        ``profile_name`` asks for a session of its own (then boto3's)."""
        try:
            from botocore.exceptions import BotoCoreError
        except ImportError as exc:
            raise ConfigurationError(
                f"the Bedrock adapter needs boto3: pip install 'dormant[bedrock]' ({exc})"
            ) from exc
        options: dict[str, Any] = {
            k: self.client_options[k]
            for k in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region_name")
            if k in self.client_options
        }
        options.update(endpoint_url=self.client_options.get("endpoint_url"), config=config or self.client_config())
        try:
            if "profile_name" not in self.client_options:
                return aws.client("bedrock-runtime", **options)
            if self._session is None:
                try:
                    import boto3
                except ImportError as exc:
                    raise ConfigurationError(f"a Bedrock profile_name needs boto3: pip install boto3 ({exc})") from exc
                self._session = boto3.session.Session(profile_name=self.client_options["profile_name"])
            return self._session.client("bedrock-runtime", **options)
        except BotoCoreError as exc:  # no region, unknown profile...
            raise ConfigurationError(
                f"could not build the bedrock-runtime client: {exc} (set AWS_REGION or pass bedrock(model_id, "
                "region_name=...))"
            ) from exc


# -- options --------------------------------------------------------------------------------


def _request_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Request-level options as Converse fields; unknown names are refused, not dropped."""
    fields: dict[str, Any] = {}
    inference: dict[str, Any] = {}
    for key, value in options.items():
        if key in _CLIENT_OPTIONS:
            continue
        if key in _INFERENCE:
            inference[_INFERENCE[key]] = value
        elif key in _CONVERSE_FIELDS:
            fields[key] = value
        else:
            known = ", ".join(sorted({*_INFERENCE, *_CONVERSE_FIELDS, *_CLIENT_OPTIONS}))
            raise ConfigurationError(f"unknown Bedrock option {key!r} (known: {known})")
    if inference:
        given = fields.get("inferenceConfig")
        fields["inferenceConfig"] = {**(given if isinstance(given, Mapping) else {}), **inference}
    return fields


def _output_mode(value: Any) -> str:
    if value not in ("tool", "json_schema"):
        raise ConfigurationError(f"output_mode is 'tool' or 'json_schema', not {value!r}")
    return str(value)


# -- neutral -> wire ------------------------------------------------------------------------


def _wire_messages(messages: list[Message]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """System prompts apart; turns as content blocks, consecutive same-role turns merged.

    Converse wants user and assistant to alternate and every ``toolResult`` of a turn in the one user
    message after the ``toolUse``: merging consecutive tool results (and a user text after them) does both.
    Blank text blocks are refused by Converse and left out.
    """
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            if message.content:
                system.append({"text": message.content})
            continue
        blocks: list[dict[str, Any]] = []
        if message.role == "tool":
            if message.tool_call_id is None:
                raise ConfigurationError("a tool message needs the tool_call_id it answers")
            result = {"toolUseId": message.tool_call_id, "content": [{"text": message.content or "null"}]}
            blocks.append({"toolResult": result})
        elif message.content:
            blocks.append({"text": message.content})
        for call in message.tool_calls:
            blocks.append({"toolUse": {"toolUseId": call.call_id, "name": call.name, "input": call.args}})
        if not blocks:
            continue
        role = "assistant" if message.role == "assistant" else "user"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return system, turns


def _wire_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description"):  # Converse refuses an empty description
        spec["description"] = tool["description"]
    spec["inputSchema"] = {"json": tool.get("parameters") or {"type": "object", "properties": {}}}
    return {"toolSpec": spec}


# -- wire -> neutral ------------------------------------------------------------------------


def _tool_call(raw: Any) -> ToolCall:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise BedrockMalformedResponse(f"a toolUse block has no name: {_clip(raw)}")
    call_id = raw.get("toolUseId") if isinstance(raw.get("toolUseId"), str) else None
    args = raw.get("input")
    if args is None:
        return ToolCall(name=raw["name"], call_id=call_id)
    if not isinstance(args, dict):
        return ToolCall(name=raw["name"], call_id=call_id, error=f"tool input is not a JSON object: {_clip(args)}")
    return ToolCall(name=raw["name"], call_id=call_id, args=args)


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, Mapping):
        return Usage()
    prompt, completion = _int(raw.get("inputTokens")), _int(raw.get("outputTokens"))
    return Usage(
        input_tokens=prompt, output_tokens=completion, total_tokens=_int(raw.get("totalTokens")) or prompt + completion
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# -- errors ---------------------------------------------------------------------------------


def _retry_pause(exc: Exception, attempt: int) -> float | None:
    """Seconds to wait before retrying after ``exc`` (throttling, 5xx-like codes, timeouts, dropped
    connections), or ``None`` for an error a retry would not mend."""
    from botocore.exceptions import ClientError, ConnectionError, ReadTimeoutError

    if isinstance(exc, ClientError):
        if str(exc.response.get("Error", {}).get("Code")) not in _RETRYABLE_CODES:
            return None
    elif not isinstance(exc, ReadTimeoutError | ConnectionError):
        return None
    return float(min(0.5 * 2**attempt, 8.0) * (1 - 0.25 * random.random()))


def _translate(exc: Exception, model_id: str) -> ModelError | ConfigurationError:
    """A botocore failure as a typed dormant error: the AWS code, its message and how often it was tried."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        NoCredentialsError,
        ParamValidationError,
        ReadTimeoutError,
    )

    where = f"Bedrock Converse ({model_id})"
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        meta = exc.response.get("ResponseMetadata", {})
        code = str(error.get("Code") or "Unknown")
        retries = _int(meta.get("RetryAttempts"))
        tried = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
        kind = BedrockModelUnavailable if code in _RETRYABLE_CODES else BedrockModelError
        return kind(
            f"{where} failed{tried}: {code}: {error.get('Message') or exc}",
            code=code,
            status_code=meta.get("HTTPStatusCode"),
            request_id=meta.get("RequestId"),
        )
    if isinstance(exc, NoCredentialsError):
        return ConfigurationError(f"{where}: no AWS credentials found ({exc})")
    if isinstance(exc, ParamValidationError):
        return BedrockModelError(f"{where}: botocore refused the request: {exc}")
    if isinstance(exc, ReadTimeoutError | ConnectionError):
        return BedrockModelUnavailable(f"{where} could not be reached: {exc}")
    if isinstance(exc, BotoCoreError):
        return BedrockModelError(f"{where} failed: {exc}")
    return BedrockModelError(f"{where} failed: {type(exc).__name__}: {exc}")


def _clip(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
