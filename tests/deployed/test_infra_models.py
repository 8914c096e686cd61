"""The stack with a model chosen at deploy time (``-c model=...``): what each function is given and may call.

Which calls the grants must cover is the fidelity harness's to prove (``tests/deployed/test_fidelity_models.py``); here:
the model's grants go to the model functions only, name that model's (and its profile's) ARNs or that one secret,
never ``*``, the key is nowhere in the template, and cdk-nag passes (``synthesize`` raises otherwise).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.backend("cdk")

pytest.importorskip("aws_cdk", reason="the infra tests need the infra extra (pip install 'dormant[infra]')")
pytest.importorskip("cdk_nag", reason="the infra tests need cdk-nag (the infra extra)")

from infra.bundle import app_requirements  # noqa: E402
from infra.functions import HANDLERS  # noqa: E402
from infra.model import bedrock_arns  # noqa: E402
from infra.wiring import ENVIRONMENT, MODEL_FUNCTIONS  # noqa: E402
from tests.support.cdk_template import Synth, function_of, synthesize  # noqa: E402

ACCOUNT = "123456789012"
PROFILE = "eu.anthropic.claude-3-7-sonnet-20250219-v1:0"
MODEL_SERVICES = ("bedrock", "secretsmanager", "ssm")


def _text(value: Any) -> str:
    """A template value with ``{"Ref": "AWS::Partition"}`` written as ``aws`` and other references as <Id>."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(_text(p) for p in parts)
    if isinstance(value, dict) and "Ref" in value:
        return "aws" if value["Ref"] == "AWS::Partition" else f"<{value['Ref']}>"
    return json.dumps(value)


def _model_grants(synth: Synth, name: str) -> set[tuple[str, str]]:
    _, fn = function_of(synth, name)
    role = fn["Properties"]["Role"]["Fn::GetAtt"][0]
    found = set()
    for policy in synth.of_type("AWS::IAM::Policy").values():
        if {"Ref": role} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for action in actions:
                if action.split(":")[0] in MODEL_SERVICES:
                    found |= {(action, _text(r)) for r in resources}
    return found


def _environment(synth: Synth, name: str) -> dict[str, str]:
    _, fn = function_of(synth, name)
    return {k: _text(v) for k, v in fn["Properties"]["Environment"]["Variables"].items()}


@pytest.fixture(scope="module")
def bedrock_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synthesize(tmp_path_factory.mktemp("bedrock"), {"model": f"bedrock:{PROFILE}"})


def test_an_inference_profile_is_granted_with_its_model_in_every_region_to_resume_only(bedrock_synth: Synth) -> None:
    want = {
        ("bedrock:InvokeModel", f"arn:aws:bedrock:eu-west-1:123456789012:inference-profile/{PROFILE}"),
        ("bedrock:InvokeModel", "arn:aws:bedrock:*::foundation-model/anthropic.claude-3-7-sonnet-20250219-v1:0"),
    }
    for handler in HANDLERS:
        granted = _model_grants(bedrock_synth, handler.name)
        assert granted == (want if handler.name in MODEL_FUNCTIONS else set()), (handler.name, granted)
        environment = _environment(bedrock_synth, handler.name)
        assert environment["DORMANT_MODEL"] == f"bedrock:{PROFILE}"
        assert set(environment) == ENVIRONMENT[handler.name] | {"DORMANT_MODEL"}
    # run runs the turns whose caller waits (Prefer: wait), tools the rest of an answered one
    assert {"resume", "run", "tools"} == MODEL_FUNCTIONS


def test_a_model_id_is_granted_on_that_model_and_an_unknown_form_is_refused_at_synth() -> None:
    assert bedrock_arns("anthropic.claude-x-v1:0", "aws", "eu-west-1", "1") == [
        "arn:aws:bedrock:eu-west-1::foundation-model/anthropic.claude-x-v1:0"
    ]
    arn = "arn:aws:bedrock:us-east-1:1:inference-profile/us.amazon.nova-pro-v1:0"
    assert bedrock_arns(arn, "aws", "eu-west-1", "1") == [
        arn,
        "arn:aws:bedrock:*::foundation-model/amazon.nova-pro-v1:0",
    ]
    with pytest.raises(SystemExit, match="application inference profile"):
        bedrock_arns("arn:aws:bedrock:us-east-1:1:application-inference-profile/abc", "aws", "eu-west-1", "1")
    with pytest.raises(SystemExit, match=r"provider\.model"):
        bedrock_arns("claude", "aws", "eu-west-1", "1")


def test_an_openai_model_without_its_keys_secret_is_refused_at_synth(tmp_path: Path) -> None:
    """No secret is made for the key: one the stack created would hold no key (or a random one), and every model
    call would fail with 401 until someone noticed. The deployer names the secret that holds it."""
    with pytest.raises(SystemExit, match="needs -c openai_secret="):
        synthesize(tmp_path, {"model": "openai:gpt-4o-mini"})


@pytest.mark.parametrize(
    ("secret", "variable", "grant"),
    [
        (
            "dormant/openai",
            "dormant/openai",
            "arn:aws:secretsmanager:eu-west-1:123456789012:secret:dormant/openai-??????",
        ),
        ("ssm:/dormant/openai", "ssm:/dormant/openai", f"arn:aws:ssm:eu-west-1:{ACCOUNT}:parameter/dormant/openai"),
    ],
)
def test_a_referenced_secret_or_parameter_is_the_one_thing_the_model_functions_may_read(
    tmp_path: Path, secret: str, variable: str, grant: str
) -> None:
    context = {"model": "openai:m", "openai_secret": secret, "openai_base_url": "https://llm.example/v1"}
    synth = synthesize(tmp_path, context)
    assert not synth.of_type("AWS::SecretsManager::Secret")
    environment = _environment(synth, "resume")
    assert (environment["DORMANT_OPENAI_SECRET"], environment["DORMANT_OPENAI_BASE_URL"]) == (
        variable,
        "https://llm.example/v1",
    )
    action = "ssm:GetParameter" if secret.startswith("ssm:") else "secretsmanager:GetSecretValue"
    assert _model_grants(synth, "resume") == {(action, grant)}
    assert _model_grants(synth, "run") == {(action, grant)}  # it runs the turns whose caller waits
    assert _model_grants(synth, "park") == set()
    layers = {r["Properties"]["Description"] for r in synth.of_type("AWS::Lambda::LayerVersion").values()}
    assert any("openai>=" in d for d in layers), layers  # the SDK reaches Lambda in the app layer


def test_the_app_layer_requirements_are_the_apps_file_and_the_models_extra(tmp_path: Path) -> None:
    file = tmp_path / "requirements.txt"
    file.write_text("# the app's own\nhttpx>=0.27  # for its tools\n\nboto3>=1.34\n")
    assert app_requirements(file) == ["httpx>=0.27"]  # boto3: the runtime's own
    assert app_requirements(file, ("openai",)) == ["openai>=1.55.3", "httpx>=0.27"]
    file.write_text("--index-url https://elsewhere\n")
    with pytest.raises(SystemExit, match="not pip options"):
        app_requirements(file)
    with pytest.raises(SystemExit, match="no such file"):
        app_requirements(tmp_path / "missing.txt")


def _dist(target: Path, name: str, requires: tuple[str, ...] = ()) -> None:
    info = target / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n{lines}")
    (target / name).mkdir()
    (target / name / "__init__.py").write_text("")
    record = [f"{name}/__init__.py", f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in record))


def test_the_app_layer_leaves_out_what_the_library_layer_ships(tmp_path: Path) -> None:
    from infra.bundle import drop_closure

    # the library needs pydantic and powertools[tracer] (-> xray -> wrapt); the app needs openai (-> httpx, pydantic)
    _dist(tmp_path, "pydantic", ("typing-extensions>=4",))
    _dist(tmp_path, "typing_extensions")
    _dist(
        tmp_path, "aws_lambda_powertools", ('aws-xray-sdk; extra == "tracer"', 'fastjsonschema; extra == "validation"')
    )
    _dist(tmp_path, "aws_xray_sdk", ("wrapt",))
    _dist(tmp_path, "wrapt")
    _dist(tmp_path, "fastjsonschema")  # only the validation extra, which the library does not ask for
    _dist(tmp_path, "openai", ("httpx", "pydantic>=1.9"))
    _dist(tmp_path, "httpx")
    dropped = drop_closure(tmp_path, ["pydantic>=2.7,<3", "aws-lambda-powertools[tracer]>=3.5"])
    assert sorted(dropped) == ["aws-lambda-powertools", "aws-xray-sdk", "pydantic", "typing-extensions", "wrapt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            "fastjsonschema",
            "fastjsonschema-1.0.dist-info",
            "httpx",
            "httpx-1.0.dist-info",
            "openai",
            "openai-1.0.dist-info",
        ]
    )


@pytest.mark.backend("runtime-python")
def test_the_openai_sdk_reaches_the_app_layer_for_arm64_without_the_librarys_packages(tmp_path: Path) -> None:
    # The real build (pip fetches cp312 aarch64 wheels), as -c model=openai:... makes it.
    from infra.bundle import ROOT, bundle_app

    bundle_app(tmp_path / "out", [ROOT / "samples" / "bookings"], app_requirements(None, ("openai",)))
    layer = tmp_path / "out" / "python"
    top = {p.name for p in layer.iterdir() if not p.name.endswith(".dist-info")}
    assert {"openai", "bookings", "jiter"} <= top, sorted(top)
    assert [p.name for p in (layer / "jiter").glob("*.so")] == ["jiter.cpython-312-aarch64-linux-gnu.so"]
    # what the library layer ships is not shipped twice (both unpack into /opt/python)
    assert not top & {"pydantic", "pydantic_core", "typing_extensions", "aws_lambda_powertools", "boto3", "botocore"}
