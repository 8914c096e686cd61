"""The errors of one provider's adapter, next to the adapters (``openai.py``, ``bedrock.py``) that raise them.

They stay branches of the one tree (``dormant.errors`` draws them, with their statuses): each is a
``ModelProviderError``, and a transient or malformed answer is also the provider-neutral ``ModelUnavailable`` or
``MalformedModelResponse``, whose HTTP status it inherits. ``dormant.errors`` re-exports every name, so
``from dormant.errors import OpenAIModelError`` works as before. This module imports no provider SDK.
"""

from __future__ import annotations

from ..errors import MalformedModelResponse, ModelProviderError, ModelUnavailable

__all__ = [
    "BedrockMalformedResponse",
    "BedrockModelError",
    "BedrockModelUnavailable",
    "OpenAIMalformedResponse",
    "OpenAIModelError",
    "OpenAIModelUnavailable",
    "OpenAIRefusal",
]


class OpenAIModelError(ModelProviderError):
    """The Chat Completions call failed (after the SDK's retries, when the failure was retryable)."""


class OpenAIModelUnavailable(OpenAIModelError, ModelUnavailable):
    """Chat Completions answered 408, 409, 429 or 5xx, timed out, or could not be reached."""


class OpenAIMalformedResponse(OpenAIModelError, MalformedModelResponse):
    """The server answered 2xx with something that is not a chat completion (no choices, no message...)."""


class OpenAIRefusal(OpenAIModelError):
    """The model refused to answer in the structured output asked for."""


class BedrockModelError(ModelProviderError):
    """The Converse call failed (after botocore's retries, when the failure was retryable).

    ``code`` is the AWS error code (``ThrottlingException``, ``ValidationException``...).
    """


class BedrockModelUnavailable(BedrockModelError, ModelUnavailable):
    """Converse throttled, timed out, was unavailable or could not be reached."""


class BedrockMalformedResponse(BedrockModelError, MalformedModelResponse):
    """Converse answered with something that has no output message."""
