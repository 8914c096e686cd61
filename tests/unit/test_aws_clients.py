"""Every AWS client a function builds comes from the process's one botocore session (``dormant.aws``).

A client made from a session of its own loads botocore's endpoints and its service's model again (about 10 MB a
session: the difference between a turn function that fits in 128 MB and one that does not). The clients are
compared by the loader they were built from: one loader, one copy of what it loaded.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("botocore")
pytest.importorskip("aws_lambda_powertools")


@pytest.fixture(autouse=True)
def _region(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


def _loader(client: Any) -> Any:
    return client._loader


def test_the_store_the_workflow_idempotency_model_and_secret_clients_share_one_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aws_lambda_powertools.utilities import parameters
    from aws_lambda_powertools.utilities.parameters.constants import DEFAULT_PROVIDERS

    from dormant import aws
    from dormant.models.bedrock import BedrockAdapter
    from dormant.models.secrets import Secret
    from dormant.serving.idempotency import DynamoDBIdempotency
    from dormant.serving.workflow import StepFunctions
    from dormant.stores.url import store_from_url

    shared = _loader(aws.client("dynamodb"))
    deployed = store_from_url("dynamodb://sessions-table?region=eu-west-1")  # as DORMANT_STORE names it on AWS
    local = store_from_url("dynamodb://sessions-table?endpoint=http://127.0.0.1:1", create=False)  # DynamoDB Local
    DEFAULT_PROVIDERS.pop("secrets", None)
    DEFAULT_PROVIDERS.pop("ssm", None)
    try:
        # Powertools' reads, once its default providers are there: the call itself is the provider's own.
        monkeypatch.setattr(parameters, "get_secret", lambda name, **_: DEFAULT_PROVIDERS["secrets"] and "key")
        monkeypatch.setattr(parameters, "get_parameter", lambda name, **_: DEFAULT_PROVIDERS["ssm"] and "key")
        assert Secret("dormant/openai").value() == Secret("ssm:/dormant/openai").value() == "key"
        clients = {
            "store": deployed.client,  # type: ignore[attr-defined]
            "local store": local.client,  # type: ignore[attr-defined]
            "step functions": StepFunctions("arn:aws:states:eu-west-1:123456789012:stateMachine:m").client,
            "idempotency": DynamoDBIdempotency("sessions-table")._boto(),
            "bedrock": BedrockAdapter()._build_client(),
            "secrets": DEFAULT_PROVIDERS["secrets"].client,
            "parameters": DEFAULT_PROVIDERS["ssm"].client,
        }
        assert {name: _loader(c) is shared for name, c in clients.items()} == {name: True for name in clients}
    finally:
        DEFAULT_PROVIDERS.pop("secrets", None)
        DEFAULT_PROVIDERS.pop("ssm", None)


def test_a_bedrock_profile_gets_a_session_of_its_own() -> None:
    """A profile names its own credentials and region: that client cannot come from the environment's session."""
    from dormant import aws
    from dormant.errors import ConfigurationError
    from dormant.models.bedrock import BedrockAdapter

    with pytest.raises(ConfigurationError, match="could not build the bedrock-runtime client"):
        BedrockAdapter(profile_name="no-such-profile-here")._build_client()
    assert aws.session().profile is None


def test_importing_the_module_imports_no_aws_sdk() -> None:
    import subprocess
    import sys

    code = "import sys, dormant.aws; print(sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'boto3')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
