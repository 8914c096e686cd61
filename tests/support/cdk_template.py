"""The synthesized CDK app, read back: shared by the template tests and the Step Functions run.

``synthesize`` builds the stack as ``cdk synth`` would, with the cdk-nag AwsSolutions plugin and CDK's
own template validation (a finding or a circular dependency fails it), without bundling the layer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

STACK = "Dormant"


class Synth:
    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self.path = outdir / f"{STACK}.template.json"
        self.template: dict[str, Any] = json.loads(self.path.read_text())
        self.resources: dict[str, dict[str, Any]] = self.template["Resources"]
        self.report: dict[str, Any] = json.loads((outdir / "validation-report.json").read_text())

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        return {key: r for key, r in self.resources.items() if r["Type"] == kind}

    def one(self, kind: str) -> tuple[str, dict[str, Any]]:
        found = self.of_type(kind)
        assert len(found) == 1, sorted(found)
        return next(iter(found.items()))


def synthesize(outdir: Path, context: Mapping[str, str] | None = None) -> Synth:
    """The stack synthesized into ``outdir`` (``context``: CDK context values on top, e.g. ``app=``)."""
    import aws_cdk as cdk
    import cdk_nag

    from infra.stack import DormantStack

    app = cdk.App(
        outdir=str(outdir),
        context={
            # Assets point at their sources: no pip download of the layer's wheels in the unit tests.
            "aws:cdk:bundling-stacks": [],
            "@aws-cdk/core:validateAgainstDefaultRules": True,
            # What the cdk CLI adds: construct paths (to find resources by name) and asset paths.
            "aws:cdk:enable-path-metadata": True,
            "aws:cdk:enable-asset-metadata": True,
            **(context or {}),
        },
    )
    DormantStack(app, STACK, env=cdk.Environment(account="123456789012", region="eu-west-1"))
    cdk.Validations.of(app).add_plugins(cdk_nag.AwsSolutionsChecks(app))
    app.synth()  # raises on any unacknowledged cdk-nag finding
    return Synth(outdir)


def function_of(synth: Synth, name: str) -> tuple[str, dict[str, Any]]:
    """The logical id and resource of the function serving ``functions/<name>``."""
    matches = [
        (key, r)
        for key, r in synth.of_type("AWS::Lambda::Function").items()
        if r["Metadata"]["aws:cdk:path"] == f"{STACK}/Functions/{name.capitalize()}/Function/Resource"
    ]
    assert len(matches) == 1, name
    return matches[0]


def machine_of(synth: Synth, which: str = "sessions") -> tuple[str, dict[str, Any]]:
    """(logical id, resource) of the state machine named ``<stack>-<which>``: ``sessions`` or ``waits``."""
    (found,) = [
        (key, r)
        for key, r in synth.of_type("AWS::StepFunctions::StateMachine").items()
        if r["Properties"]["StateMachineName"].endswith(f"-{which}")
    ]
    return found


def definition_of(synth: Synth, substitutions: dict[str, Any] | None = None, which: str = "sessions") -> dict[str, Any]:
    """A state machine's ASL (``machine_of``'s ``which``), each CloudFormation reference (``Ref``, ``Id.Arn``)
    replaced by its value in ``substitutions``, else by a ``<Ref>``/``<Id.Arn>`` placeholder."""
    _, machine = machine_of(synth, which)
    parts = machine["Properties"]["DefinitionString"]["Fn::Join"][1]
    text = ""
    for part in parts:
        if isinstance(part, str):
            text += part
            continue
        name = part["Ref"] if "Ref" in part else ".".join(part["Fn::GetAtt"])
        value = (substitutions or {}).get(name, f"<{name}>")
        inside_a_string = len(re.findall(r'(?<!\\)"', text)) % 2 == 1
        text += str(value) if inside_a_string else json.dumps(value)
    return json.loads(text)  # type: ignore[no-any-return]


def watched(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    """The metrics an alarm watches: ``{namespace, name, dimensions}`` (of a math expression, each it uses)."""
    props = alarm["Properties"]
    if "MetricName" in props:
        stats = [{key: props[key] for key in ("Namespace", "MetricName", "Dimensions")}]
    else:
        stats = [m["MetricStat"]["Metric"] for m in props["Metrics"] if "MetricStat" in m]
    return [
        {
            "namespace": s["Namespace"],
            "name": s["MetricName"],
            "dimensions": {d["Name"]: d["Value"] for d in s.get("Dimensions", [])},
        }
        for s in stats
    ]


def alarms(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A template's alarms by their construct name (``.../Alarms/<name>/Resource``)."""
    return {
        r["Metadata"]["aws:cdk:path"].split("/")[-2]: r
        for r in template["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    }
