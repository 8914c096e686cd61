"""AWS's limits on the synthesized template (``infra.limits``), over every context that changes the template.

Each distinct combination is synthesized once per session (``synthesized``). The combinations are a covering
set, not the product of every key: each rule is a sum or a count over resources (statements of a function's
policy, characters of a role's policies, variables of a function, resources, bytes, reservations, timeouts),
and each opt-in key only adds to what it touches (CORS adds OPTIONS methods, machine clients usage plans and
keys, a model grants and variables, a topic alarm actions, shards and a quota a variable's characters, app
requirements a layer's description and size, WAF an ACL, SES the pool's settings) and removes nothing another
key adds. So every key alone shows a key whose effect is not additive, and everything at once (once per model
kind, the kinds being exclusive) is the largest each sum gets. Each rule also has a template made to cross it:
the check must go red.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.backend("cdk")

pytest.importorskip("aws_cdk", reason="the infra tests need the infra extra (pip install 'dormant[infra]')")

from dormant.serving.api import MAX_WAIT_SECONDS  # noqa: E402
from dormant.serving.http.waits import WAIT_MARGIN  # noqa: E402
from infra import limits  # noqa: E402
from infra.functions import API, HANDLERS  # noqa: E402
from infra.guardrails import Guardrails, _reservations  # noqa: E402
from tests.support.cdk_template import Synth, function_of, synthesize  # noqa: E402

ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:dormant/openai-AbCdEf"
MODELS = {
    "bedrock": {"model": "bedrock:anthropic.claude-3-haiku-20240307-v1:0"},
    "bedrock-profile": {"model": "bedrock:eu.anthropic.claude-3-7-sonnet-20250219-v1:0"},
    "openai-secret": {"model": "openai:gpt-4o-mini", "openai_secret": ARN, "openai_base_url": "https://llm.example/v1"},
    "openai-ssm": {"model": "openai:gpt-4o-mini", "openai_secret": "ssm:/dormant/openai"},
}
MACHINE_CLIENTS_JSON = json.dumps(
    {
        f"client-{n:02}": {
            "scopes": ["sessions.read", "runs.write", "answers.write", "admin"][: 1 + n % 4],
            "tenant": "own" if n % 3 == 0 else f"tenant-{n:030}",
        }
        for n in range(20)
    }
)
EVERY_KEY = {
    "cors": {"cors_origins": "https://a.example,https://b.example,https://c.example"},
    "machine-clients": {"machine_clients": "billing,crm,search,reports", "client_quota": "10000"},
    # the JSON form: an app client each with its own scopes, and the client -> tenant mapping in every API
    # function's environment (20 clients, tenant ids of 36 characters: the mapping near synth's 2 KB bound)
    "machine-clients-json": {"machine_clients": MACHINE_CLIENTS_JSON, "client_quota": "10000"},
    "roles": {"admin_group": "clinic-administrators", "pitr_days": "7"},
    "alarm-topic": {"alarm_topic": "arn:aws:sns:eu-west-1:123456789012:dormant-alarms"},
    "turn-quota": {"turn_quota": "100/3600"},
    "shards": {"listing_shards": "1000", "pending_shards": "1000"},
    "app-requirements": {"app_requirements": "<a requirements file>"},  # written by synth_of
    "account-concurrency": {"account_concurrency": "1000"},
    "reserved": {"account_concurrency": "400", "reserved_resume": "200", "run_cap": "50"},
    "waf": {"waf_rate_limit": "2000"},
    "tracing": {"tracing": "true"},
    "ses": {"ses_from": "no-reply@a.example", "ses_name": "Dormant", "ses_domain": "a.example"},
    "sizes": {"function_memory": "resume=1024,run=1024,tools=1024,sessions=512", "workflow_log_level": "ALL"},
    "names": {"tenant_claim": "custom:organisation", "auth_domain": "dormant-login-x", "removal": "destroy"},
}
EVERYTHING = {
    k: v for context in EVERY_KEY.values() for k, v in context.items() if context is not EVERY_KEY["reserved"]
}
COMBINATIONS: dict[str, dict[str, str]] = {
    "defaults": {},
    **{name: context for name, context in EVERY_KEY.items()},
    **{f"model-{name}": context for name, context in MODELS.items()},
    **{f"everything-{name}": {**EVERYTHING, **context} for name, context in MODELS.items()},
}
SYNTH_TIMES: dict[str, float] = {}


@pytest.fixture(scope="session")
def synthesized() -> dict[str, Synth]:
    """Each combination synthesized once per session, with cdk-nag (a finding fails the synthesis)."""
    return {}


def synth_of(synthesized: dict[str, Synth], name: str, tmp_path_factory: pytest.TempPathFactory) -> Synth:
    if name not in synthesized:
        context = dict(COMBINATIONS[name])
        if "app_requirements" in context:  # not fetched: the tests' synthesis bundles nothing
            requirements = tmp_path_factory.mktemp("app") / "requirements.txt"
            requirements.write_text("httpx>=0.27\nrich>=13\n")
            context["app_requirements"] = str(requirements)
        started = time.monotonic()
        synthesized[name] = synthesize(tmp_path_factory.mktemp(name), context)
        SYNTH_TIMES[name] = time.monotonic() - started
    return synthesized[name]


def _check(synth: Synth, context: Mapping[str, str]) -> list[limits.Breach]:
    declared = context.get("account_concurrency")
    return limits.check(
        synth.template,
        assets=synth.outdir,
        account_concurrency=int(declared) if declared else None,
        long_poll_s=MAX_WAIT_SECONDS,
        margin_s=WAIT_MARGIN,
    )


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_every_context_combination_is_within_every_limit(
    synthesized: dict[str, Synth], tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    synth = synth_of(synthesized, name, tmp_path_factory)
    assert _check(synth, COMBINATIONS[name]) == []
    # and the template's shape is what the rules read: one policy per API function, every function's assets
    policies = limits.resource_policies(synth.template)
    assert {len(statements) for statements in policies.values()} == {1}, policies
    sizes = limits.unzipped_bytes(synth.template, synth.outdir)
    assert len(sizes) == len(HANDLERS) and all(size > 0 for size in sizes.values())


def test_the_combinations_took_a_modest_time(synthesized: dict[str, Synth]) -> None:
    """Printed for the record (``-s``): about 75 s for the 21 here, 27 s of it the first (the jsii kernel)."""
    print({name: round(seconds, 1) for name, seconds in SYNTH_TIMES.items()}, round(sum(SYNTH_TIMES.values()), 1))
    assert sum(SYNTH_TIMES.values()) < 180


# -- each rule, crossed on purpose ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(synthesized: dict[str, Synth], tmp_path_factory: pytest.TempPathFactory) -> Synth:
    return synth_of(synthesized, "everything-openai-secret", tmp_path_factory)


def _template(base: Synth) -> dict[str, Any]:
    return copy.deepcopy(base.template)


def _rules(breaches: list[limits.Breach]) -> set[str]:
    return {b.rule.split(" (")[0] for b in breaches}


def _sessions(base: Synth) -> str:
    return function_of(base, "sessions")[0]


def test_a_function_policy_past_20480_bytes_with_room_for_4_routes_is_red(base: Synth) -> None:
    template = _template(base)
    sessions = _sessions(base)
    (permission,) = [
        p
        for p in template["Resources"].values()
        if p["Type"] == "AWS::Lambda::Permission"
        and p["Properties"]["FunctionName"] == {"Fn::GetAtt": [sessions, "Arn"]}
    ]
    assert limits.check_resource_policies(template) == []
    # a permission per method and per test-invoke, as CDK's default LambdaIntegration adds them: 2 x 20 methods
    for n in range(40):
        twin = copy.deepcopy(permission)
        twin["Properties"]["SourceArn"] = {
            "Fn::Join": [
                "",
                [
                    "arn:aws:execute-api:eu-west-1:123456789012:",
                    {"Ref": "AWS::StackName"},
                    f"/test-invoke-stage/GET/sessions/{{id}}/route{n}",
                ],
            ]
        }
        template["Resources"][f"Permission{n:02d}SessionsFunctionOfTheApiWithALongLogicalId"] = twin
    size = limits.policy_bytes(limits.resource_policies(template)[sessions])
    assert size < limits.RESOURCE_POLICY_BYTES  # fits today (about 19 KB)...
    assert _rules(limits.check_resource_policies(template)) == {"resource policy"}  # ...but not 4 more routes


def test_inline_policies_past_10240_characters_are_red(base: Synth) -> None:
    template = _template(base)
    resume_role = function_of(base, "resume")[1]["Properties"]["Role"]["Fn::GetAtt"][0]
    chars = limits.inline_policy_chars(template)[resume_role]
    assert chars < limits.ROLE_INLINE_CHARS
    statement = {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": {"Fn::GetAtt": [resume_role, "Arn"]}}
    statement_chars = len(
        json.dumps(limits.Resolver(template, limits.Deployment()).document(statement), separators=(",", ":"))
    )
    extra = (limits.ROLE_INLINE_CHARS - chars) // statement_chars + 1
    template["Resources"]["Extra"] = {
        "Type": "AWS::IAM::Policy",
        "Properties": {
            "PolicyName": "extra",
            "Roles": [{"Ref": resume_role}],
            "PolicyDocument": {"Version": "2012-10-17", "Statement": [statement] * extra},
        },
    }
    assert _rules(limits.check_roles(template)) == {"role inline policies"}


def test_whitespace_is_not_counted_in_a_policy(base: Synth) -> None:
    template = _template(base)
    role = next(iter(limits.inline_policy_chars(template)))
    before = limits.inline_policy_chars(template)[role]
    template["Resources"]["Spaced"] = {
        "Type": "AWS::IAM::Policy",
        "Properties": {"Roles": [{"Ref": role}], "PolicyDocument": {"Statement": [{"Sid": "a  b"}]}},
    }
    assert limits.inline_policy_chars(template)[role] == before + len('{"Statement":[{"Sid":"ab"}]}')


def test_an_environment_past_4_kb_is_red(base: Synth) -> None:
    template = _template(base)
    sessions = _sessions(base)
    variables = template["Resources"][sessions]["Properties"]["Environment"]["Variables"]
    variables["DORMANT_CORS_ORIGINS"] = ",".join(f"https://app{n}.example.com" for n in range(200))
    assert _rules(limits.check_environments(template)) == {"environment"}


def test_more_than_500_resources_or_a_template_past_1_mb_is_red(base: Synth) -> None:
    template = _template(base)
    assert limits.check_stack(template) == []
    for n in range(501 - len(template["Resources"])):
        template["Resources"][f"Queue{n}"] = {"Type": "AWS::SQS::Queue", "Properties": {}}
    assert _rules(limits.check_stack(template)) == {"resources"}
    template = _template(base)
    template["Description"] = "x" * limits.TEMPLATE_BYTES
    assert _rules(limits.check_stack(template)) == {"template size"}


def test_code_and_layers_past_250_mb_unzipped_is_red(base: Synth, tmp_path: Path) -> None:
    template = _template(base)
    sessions = _sessions(base)
    assert limits.check_assets(template, base.outdir) == []
    big = tmp_path / "asset.big"
    big.mkdir()
    with open(big / "weights.bin", "wb") as f:  # sparse: 250 MB counted, nothing written
        f.truncate(limits.UNZIPPED_BYTES)
    layer = template["Resources"][sessions]["Properties"]["Layers"][0]["Ref"]
    template["Resources"][layer]["Metadata"]["aws:asset:path"] = str(big)
    found = limits.check_assets(template, base.outdir)
    assert _rules(found) == {"code and layers unzipped"}
    assert len(found) == len(HANDLERS)  # every function carries the layer


def test_reservations_must_leave_100_unreserved_and_none_without_a_declared_limit(base: Synth) -> None:
    template = _template(base)
    assert sum(limits.reserved_concurrency(template).values()) == 31  # EVERYTHING declares 1000
    assert limits.check_concurrency(template, 1000) == []
    assert limits.check_concurrency(template, 131) == []
    assert _rules(limits.check_concurrency(template, 130)) == {"reserved concurrency"}
    assert _rules(limits.check_concurrency(template, None)) == {
        "reserved concurrency with no account_concurrency declared"
    }


def test_the_stack_reserves_nothing_undeclared_and_leaves_100_when_declared(
    synthesized: dict[str, Synth], tmp_path_factory: pytest.TempPathFactory
) -> None:
    assert limits.reserved_concurrency(synth_of(synthesized, "defaults", tmp_path_factory).template) == {}
    declared = synth_of(synthesized, "account-concurrency", tmp_path_factory)
    names = {function_of(declared, n)[0]: n for n in ("park", "resume", "sweeper")}
    assert {names[k]: v for k, v in limits.reserved_concurrency(declared.template).items()} == {
        "park": 5,
        "resume": 25,
        "sweeper": 1,
    }
    assert _reservations(120, {}) == {"park": 3, "resume": 16}  # 20 to share: the defaults scaled to fit
    assert sum(_reservations(156, {}).values()) == 31
    with pytest.raises(ValueError, match="account_concurrency"):
        _reservations(None, {"resume": 10})
    with pytest.raises(ValueError, match="at most 50"):
        _reservations(150, {"resume": 40, "run": 11})
    assert _reservations(None, {"resume": 0}) == {}


def test_a_synchronous_route_whose_function_and_a_cold_start_pass_29_s_is_red(base: Synth) -> None:
    template = _template(base)
    run = function_of(base, "run")[0]
    template["Resources"][run]["Properties"]["Timeout"] = limits.INTEGRATION_TIMEOUT_S - limits.COLD_START_S
    found = limits.check_timeouts(template, MAX_WAIT_SECONDS, WAIT_MARGIN)
    assert [(b.rule.split(" +")[0], b.where) for b in found] == [("function timeout", run)]
    assert API + limits.COLD_START_S < limits.INTEGRATION_TIMEOUT_S  # the stack's own


def test_a_long_poll_its_function_cannot_hold_is_red(base: Synth) -> None:
    template = _template(base)
    sessions = _sessions(base)
    template["Resources"][sessions]["Properties"]["Timeout"] = 15  # holds 12 s of a 25 s wait: a poll
    found = limits.check_timeouts(template, MAX_WAIT_SECONDS, WAIT_MARGIN)
    assert [(b.rule.split(" (")[0], b.where) for b in found] == [("long-poll held", sessions)]


def test_a_task_that_gives_up_before_its_function_is_red(base: Synth) -> None:
    template = _template(base)
    (machine,) = [
        k
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::StepFunctions::StateMachine" and r["Properties"]["StateMachineName"].endswith("-sessions")
    ]
    tasks = limits.state_machine_tasks(template)
    assert tasks[f"{machine}/Run"]["timeout"] == 930 and tasks[f"{machine}/RecordFailure"]["timeout"] == 90
    definition = template["Resources"][machine]["Properties"]["DefinitionString"]["Fn::Join"][1]
    text = json.dumps(definition).replace('\\"TimeoutSeconds\\":930', '\\"TimeoutSeconds\\":900', 1)
    template["Resources"][machine]["Properties"]["DefinitionString"]["Fn::Join"][1] = json.loads(text)
    found = limits.check_timeouts(template, MAX_WAIT_SECONDS, WAIT_MARGIN)
    assert [(b.rule.split(" (")[0], b.where.split("/")[1]) for b in found] == [("task timeout", "Run")]
    # and a task with no timeout at all (Step Functions' default: wait as long as the call takes)
    text = json.dumps(definition).replace('\\"TimeoutSeconds\\":930,', "", 1)
    template["Resources"][machine]["Properties"]["DefinitionString"]["Fn::Join"][1] = json.loads(text)
    assert [b.where.split("/")[1] for b in limits.check_timeouts(template, MAX_WAIT_SECONDS, WAIT_MARGIN)] == ["Run"]


def test_the_resource_policy_as_lambda_stores_it(base: Synth) -> None:
    """One statement as ``aws lambda get-policy`` shows it: the generated statement id, the function's ARN, the
    API's ARN as the source; about 490 bytes."""
    (statement,) = limits.resource_policies(base.template)[_sessions(base)]
    assert set(statement) == {"Sid", "Effect", "Principal", "Action", "Resource", "Condition"}
    assert statement["Principal"] == {"Service": "apigateway.amazonaws.com"}
    assert statement["Resource"].startswith("arn:aws:lambda:ap-southeast-2:123456789012:function:Dormant-")
    assert statement["Condition"]["ArnLike"]["AWS:SourceArn"].startswith("arn:aws:execute-api:")
    assert statement["Condition"]["ArnLike"]["AWS:SourceArn"].endswith("/*/*/*")
    assert len(statement["Sid"]) <= 100 and 400 < limits.policy_bytes([statement]) < 600


def test_held_routes_are_throttled_under_what_their_functions_can_hold() -> None:
    """A throttle admits at most burst + rate x hold requests within one hold: every held method together stays
    within half the unreserved pool, and under a capped function's cap, so the gateway's 429 comes first."""
    for context in (
        {},
        {"account_concurrency": "1000"},
        {"account_concurrency": "400", "reserved_resume": "200", "run_cap": "50"},
    ):
        guardrails = Guardrails.from_context(context.get)
        throttles = guardrails.held_throttling(hold_s=API)
        assert len(throttles) == 6 and "/clients/sessions/{id}/runs/POST" in throttles
        held = {path: burst + rate * API for path, (rate, burst) in throttles.items()}
        pool = int(context.get("account_concurrency", 1000)) - sum((guardrails.reserved or {}).values())
        assert sum(held.values()) <= pool / 2, (context, held)
        if "run_cap" in context:
            runs = held["/sessions/{id}/runs/POST"] + held["/clients/sessions/{id}/runs/POST"]
            assert runs <= int(context["run_cap"])


def test_the_command_line_checks_what_cdk_synth_wrote(base: Synth, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m infra.limits cdk.out [account concurrency]``: exit 0 within every limit, else 1 and a line each."""
    assert limits.main([str(base.outdir), "1000"]) == 0
    assert limits.main([str(base.outdir)]) == 1  # 31 reserved, no limit declared
    assert "reserved concurrency with no account_concurrency declared: stack at 31" in capsys.readouterr().out
