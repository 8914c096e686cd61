"""``MockAdapter``: a scripted model, so everything else — tools, state, ledger, store — runs for real."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

from ..errors import ConfigurationError, ScriptExhausted
from ..models.base import ModelRequest, ModelResponse

__all__ = ["MockAdapter", "ScriptedResponse"]

ScriptedResponse: TypeAlias = (
    ModelResponse | Mapping[str, Any] | BaseException | Callable[[ModelRequest], ModelResponse | Mapping[str, Any]]
)


class MockAdapter:
    """Answers model calls from a script, in order.

    Each response is a dict with ``text`` and/or ``tool_calls`` (``[{"name", "args", "call_id"?}]``,
    optionally ``usage`` and ``finish_reason``), a ``ModelResponse``, an exception to raise (a failing
    provider), or a function of the request. A call beyond the script raises ``ScriptExhausted``: the
    run ends with status ``error`` instead of hanging. Every request is kept on ``requests``.
    """

    def __init__(self, responses: Iterable[ScriptedResponse] | None = None) -> None:
        self._lock = threading.Lock()
        self._script: deque[ScriptedResponse] = deque()
        self.requests: list[ModelRequest] = []
        if responses is not None:
            self.set_responses(responses)

    def set_responses(self, responses: Iterable[ScriptedResponse]) -> None:
        """Replace the script."""
        script = deque(responses)
        for item in script:
            if not isinstance(item, ModelResponse | Mapping | BaseException) and not callable(item):
                raise ConfigurationError(
                    f"a scripted response is a dict, ModelResponse, exception or function, not {item!r}"
                )
        with self._lock:
            self._script = script

    @property
    def remaining(self) -> int:
        return len(self._script)

    def complete(self, request: ModelRequest) -> ModelResponse:
        with self._lock:
            self.requests.append(request)
            if not self._script:
                raise ScriptExhausted(
                    f"MockAdapter has no scripted response for model call {len(self.requests)}: "
                    "add one with set_responses([...])"
                )
            item = self._script.popleft()
        if isinstance(item, BaseException):
            raise item
        if callable(item) and not isinstance(item, ModelResponse | Mapping):
            item = item(request)
        if isinstance(item, ModelResponse):
            return item
        data = dict(item)
        data.setdefault("finish_reason", "tool_calls" if data.get("tool_calls") else "stop")
        return ModelResponse.model_validate(data)
