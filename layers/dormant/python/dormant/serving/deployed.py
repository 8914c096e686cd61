"""The model a deployment chose (``cdk deploy -c model=...``), as the functions' environment names it.

* ``DORMANT_MODEL``: ``openai:<model>`` or ``bedrock:<model id, inference-profile id or ARN>``.
* ``DORMANT_OPENAI_BASE_URL``: an OpenAI-compatible server instead of OpenAI's.
* ``DORMANT_OPENAI_SECRET``: where the key is kept (a Secrets Manager name or ARN, or ``ssm:/name``): the
  *reference*, never the key. The key is read on the first model call, so a function that never calls the
  model (``run``, which only claims turns) never reads it (``dormant.models.secrets``).

``load_served`` gives this model to the app's factory as ``model=``; the factory decides what its agents use
(bookings uses it instead of its scripted model). A factory without ``model=`` cannot honour the deployment's
choice, so it is refused rather than silently ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ConfigurationError
from ..models.base import ModelSpec, bedrock, openai
from ..models.secrets import Secret

__all__ = ["MODEL", "OPENAI_BASE_URL", "OPENAI_SECRET", "model_from_env"]

MODEL = "DORMANT_MODEL"
OPENAI_BASE_URL = "DORMANT_OPENAI_BASE_URL"
OPENAI_SECRET = "DORMANT_OPENAI_SECRET"


def model_from_env(environ: Mapping[str, str] | None = None) -> ModelSpec | None:
    """The deployment's model (``None`` when it chose none: the app's own models serve)."""
    env = os.environ if environ is None else environ
    value = env.get(MODEL, "").strip()
    if not value:
        return None
    provider, _, name = value.partition(":")
    if provider == "openai" and name:
        options: dict[str, object] = {}
        if env.get(OPENAI_BASE_URL):
            options["base_url"] = env[OPENAI_BASE_URL]
        if env.get(OPENAI_SECRET):
            options["api_key"] = Secret(env[OPENAI_SECRET])
        return openai(name, **options)
    if provider == "bedrock" and name:
        return bedrock(name)
    raise ConfigurationError(f"{MODEL} is openai:<model> or bedrock:<model or inference-profile id>, not {value!r}")
