"""The session table, built from the store's own table shape so the two can never drift apart."""

from __future__ import annotations

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


class SessionTable(Construct):
    """One on-demand table: point-in-time recovery, TTL on the shape's expiry attribute, kept on stack deletion,
    and (``deletion_protection``) refused to any delete, by CloudFormation or by hand, until that is turned off."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        shape: TableShape = TABLE,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
        deletion_protection: bool = True,
    ) -> None:
        super().__init__(scope, id)
        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=_attribute(shape.partition_key),
            sort_key=_attribute(shape.sort_key),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
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
