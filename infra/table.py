"""The session table, built from the store's own table shape so the two can never drift apart."""

from __future__ import annotations

from collections.abc import Callable

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from constructs import Construct

from dormant.stores.dynamodb import TABLE, TableShape

_TYPES = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}
_PROJECTIONS = {
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
    "INCLUDE": dynamodb.ProjectionType.INCLUDE,
    "ALL": dynamodb.ProjectionType.ALL,
}


def _attribute(key: tuple[str, str]) -> dynamodb.Attribute:
    return dynamodb.Attribute(name=key[0], type=_TYPES[key[1]])


DEFAULT_RECOVERY_DAYS = 35
"""Point-in-time recovery's period when ``-c pitr_days`` gives none: AWS's default (and longest)."""


def recovery_days(context: Callable[[str], object]) -> int:
    """``-c pitr_days=N``: 1 to 35 days (``RecoveryPeriodInDays``), else a ``ValueError`` naming it."""
    value = context("pitr_days")
    if value is None:
        return DEFAULT_RECOVERY_DAYS
    text = str(value)
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 35:
        raise ValueError(f"-c pitr_days= is a whole number of days from 1 to 35, not {value!r}")
    return int(text)


class SessionTable(Construct):
    """One on-demand table: point-in-time recovery (for ``recovery_days``: an erased item stays restorable that
    long, which the store's erasure report names), TTL on the shape's expiry attribute, kept on stack deletion,
    and (``deletion_protection``) refused to any delete, by CloudFormation or by hand, until that is turned off."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        shape: TableShape = TABLE,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        deletion_protection: bool = True,
        recovery_days: int = DEFAULT_RECOVERY_DAYS,
    ) -> None:
        super().__init__(scope, id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=_attribute(shape.partition_key),
            sort_key=_attribute(shape.sort_key),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True, recovery_period_in_days=recovery_days
            ),
            time_to_live_attribute=shape.ttl_attribute,
            removal_policy=removal_policy,
            deletion_protection=deletion_protection,
        )
        for index in shape.indexes:
            if index.local:
                self.table.add_local_secondary_index(
                    index_name=index.name,
                    sort_key=_attribute(index.sort_key),
                    projection_type=_PROJECTIONS[index.projection],
                    non_key_attributes=list(index.non_key_attributes) or None,
                )
                continue
            self.table.add_global_secondary_index(
                index_name=index.name,
                partition_key=_attribute(index.partition_key),
                sort_key=_attribute(index.sort_key),
                projection_type=_PROJECTIONS[index.projection],
                non_key_attributes=list(index.non_key_attributes) or None,
            )
