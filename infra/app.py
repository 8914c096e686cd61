"""``cdk synth`` / ``cdk deploy`` entry point (see cdk.json). The account and region are explicit.

They come from ``-c account=... -c region=...``, else from the CLI's own ``CDK_DEFAULT_ACCOUNT`` and
``CDK_DEFAULT_REGION`` (the credentials in use).
"""

from __future__ import annotations

import os

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra.stack import DormantStack

app = cdk.App()
account = app.node.try_get_context("account") or os.environ.get("CDK_DEFAULT_ACCOUNT")
region = app.node.try_get_context("region") or os.environ.get("CDK_DEFAULT_REGION")
if not account or not region:
    raise SystemExit(
        "set the target: cdk synth -c account=123456789012 -c region=eu-west-1 (or configure AWS credentials)"
    )
DormantStack(
    app, app.node.try_get_context("stack_name") or "Dormant", env=cdk.Environment(account=account, region=region)
)
cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
app.synth()
