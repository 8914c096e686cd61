"""A model provider's key, named by where it is kept, read when first needed and cached across invocations.

``Secret(ref)`` holds only the reference: a Secrets Manager secret (its name or ARN) or an SSM Parameter Store
parameter (``ssm:/name`` or the parameter's ARN; a SecureString is decrypted). Its value is read with Powertools'
parameters utility on the first model call and cached for ``max_age`` seconds in the process, so a warm Lambda
reads it once, not per invocation, and a rotated key is picked up within ``max_age``. The value never goes into
an environment variable, the template, a log or the ledger (``repr`` shows the reference).
"""

from __future__ import annotations

from .. import aws
from ..errors import ConfigurationError

__all__ = ["SECRET_MAX_AGE_SECONDS", "Secret"]

SECRET_MAX_AGE_SECONDS = 900
"""How long a read value is reused: a cold start reads it once, a sandbox that lives longer re-reads it every
15 minutes (a rotated key reaches warm functions without a deploy)."""


class Secret:
    """Where a secret is kept (see the module docstring); ``value()`` reads it, cached."""

    def __init__(self, ref: str, *, max_age: int = SECRET_MAX_AGE_SECONDS) -> None:
        ref = ref.strip()
        if ref.startswith("ssm:"):
            kind, name = "ssm", ref.removeprefix("ssm:")
        elif ref.startswith("arn:") and ":ssm:" in ref and ":parameter/" in ref:
            kind, name = "ssm", ref  # GetParameter takes the ARN as the name
        else:
            kind, name = "secretsmanager", ref
        if not name:
            raise ConfigurationError(f"a secret is a Secrets Manager name or ARN, or ssm:/parameter-name; not {ref!r}")
        self.ref, self.kind, self.name, self.max_age = ref, kind, name, max_age

    def value(self) -> str:
        """The secret's current value (Powertools' cache: at most one read per ``max_age`` per process)."""
        from aws_lambda_powertools.utilities import parameters

        _providers(self.kind)
        if self.kind == "ssm":
            got: object = parameters.get_parameter(self.name, decrypt=True, max_age=self.max_age)
        else:
            got = parameters.get_secret(self.name, max_age=self.max_age)
        text = got.decode() if isinstance(got, bytes) else str(got)
        if not text.strip():
            raise ConfigurationError(f"the secret {self.ref!r} is empty: put the provider's key in it")
        return text.strip()

    def __repr__(self) -> str:
        return f"Secret({self.ref!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other.ref == self.ref

    def __hash__(self) -> int:
        return hash(("Secret", self.ref))


def _providers(kind: str) -> None:
    """Powertools' default provider of ``kind`` (its cache, which ``get_secret``/``get_parameter`` use), made on a
    client of the process's shared botocore session (``dormant.aws``) unless one is there already: its own would
    be a boto3 session of its own, which loads botocore's endpoints and models again (about 8 MB)."""
    from aws_lambda_powertools.utilities import parameters
    from aws_lambda_powertools.utilities.parameters.constants import DEFAULT_PROVIDERS

    if kind == "ssm" and "ssm" not in DEFAULT_PROVIDERS:
        DEFAULT_PROVIDERS["ssm"] = parameters.SSMProvider(boto3_client=aws.client("ssm"))
    elif kind == "secretsmanager" and "secrets" not in DEFAULT_PROVIDERS:
        DEFAULT_PROVIDERS["secrets"] = parameters.SecretsProvider(boto3_client=aws.client("secretsmanager"))
