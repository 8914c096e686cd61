"""Administration: the table's recorded layout and shape, checked once per store; building a client; creating
the table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from ... import aws
from ...errors import ConfigurationError, DormantError, StoreError
from .calls import CLIENT_RETRIES, _Calls, _ConditionFailed
from .table import LAYOUT_FORMAT, TABLE

LAYOUT_KEY = {"pk": {"S": "#layout"}, "sk": {"S": "#layout"}}
"""The item recording the table's shard counts (outside every app's keys: ``S#``, ``X#``, ``B#``, ``I#``)."""


def client_config() -> Any:
    """The retry and timeout settings of every DynamoDB client the store builds (here and ``stores.url``)."""
    try:
        from botocore.config import Config
    except ImportError as exc:
        raise ConfigurationError("the DynamoDB store needs boto3: pip install 'dormant[dynamodb]'") from exc
    retries = {"mode": "standard", "max_attempts": CLIENT_RETRIES}
    return Config(retries=retries, connect_timeout=5, read_timeout=20, tcp_keepalive=True)


def _client(endpoint_url: str | None, region: str | None) -> Any:
    # botocore's own session, not boto3's: the same client without importing boto3 (and s3transfer),
    # which a Lambda cold start would otherwise pay for nothing; the process's one (``dormant.aws``).
    config = client_config()
    try:
        return aws.client("dynamodb", endpoint_url=endpoint_url, region_name=region, config=config)
    except Exception as exc:  # botocore says what is missing (a region, usually)
        raise ConfigurationError(f"cannot build a DynamoDB client: {exc}") from exc


def create_table(
    table_name: str,
    *,
    client: Any = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    wait: bool = True,
) -> bool:
    """Create the table from ``table.TABLE`` (on-demand, TTL on); ``False`` if it already exists.

    For local use and tests; deployments get the same table from the CDK stack.
    """
    own = client is None
    ddb = _client(endpoint_url, region) if own else client
    try:
        try:
            ddb.create_table(**TABLE.create_table_request(table_name))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceInUseException":
                return False
            raise
        if wait:
            ddb.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
        ddb.update_time_to_live(
            TableName=table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TABLE.ttl_attribute}
        )
        return True
    except DormantError:
        raise
    except Exception as exc:
        raise StoreError(f"could not create DynamoDB table {table_name!r}: {exc}") from exc
    finally:
        if own:
            ddb.close()


class _Admin(_Calls):
    """The table's layout, checked once per store against the one the table records."""

    def _check_layout(self) -> None:
        """Hold this store's layout and shard counts against the ones the table records (``LAYOUT_KEY``), once
        per store: one ``GetItem`` (a Lambda cold start), none per call after it.

        The first store on a table checks its shape (``DescribeTable``: no local index, the global indexes of
        ``table.TABLE``) and records ``format`` = ``LAYOUT_FORMAT`` with its counts (a conditional put, so two
        first stores agree). A table of an earlier layout (no ``format``: the ``ids`` local index, listing
        entries without the row) is refused, naming ``dormant migrate-table``: it cannot be served in place (a
        table's local indexes can never be dropped, nor a global index's projection changed). A store opened
        with other counts is refused before it reads or writes anything: listing over another count would hide
        every session whose entry is in a shard it does not query, and a sweeper over fewer pending shards would
        never see some markers."""
        mine = {"listing_shards": self._listing_shards, "pending_shards": self._pending_shards}
        item = {**LAYOUT_KEY, **{name: {"N": str(value)} for name, value in mine.items()}}
        item["format"] = {"N": str(LAYOUT_FORMAT)}
        recorded = self._call("get_item", TableName=self._table, Key=LAYOUT_KEY, ConsistentRead=True).get("Item")
        if recorded is None or recorded.get("format", {}).get("N") != str(LAYOUT_FORMAT):
            self._check_shape(recorded)
        if recorded is None:
            try:
                self._call(
                    "put_item",
                    TableName=self._table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(pk)",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
                return
            except _ConditionFailed as failed:  # another store recorded them first
                recorded = failed.item
                if recorded is None:
                    recorded = self._call("get_item", TableName=self._table, Key=LAYOUT_KEY, ConsistentRead=True).get(
                        "Item"
                    )
        theirs = {name: int(recorded[name]["N"]) for name in mine} if recorded else mine
        if theirs != mine:
            raise ConfigurationError(
                f"DynamoDB table {self._table!r} was made with listing_shards={theirs['listing_shards']} and "
                f"pending_shards={theirs['pending_shards']}; this store was opened with "
                f"listing_shards={mine['listing_shards']} and pending_shards={mine['pending_shards']}. "
                "Shard counts are fixed when the table is first used: open the store with the table's counts "
                "(a new table takes new ones: dormant migrate-table copies a table into one)"
            )

    def _check_shape(self, recorded: Mapping[str, Any] | None) -> None:
        """Refuse a table this release cannot serve: made by an earlier layout (its layout item has no
        ``format``), or shaped otherwise than ``table.TABLE`` (``DescribeTable``, once per table: the first
        store records the format). ``ConfigurationError`` naming ``dormant migrate-table``."""
        problems = []
        if recorded is not None:
            problems = [f"its layout item records format {recorded.get('format', {}).get('N', 1)}"]
        if not problems:
            described = self._call("describe_table", TableName=self._table)["Table"]
            problems = TABLE.differences(described)
        if problems and all(p.startswith("no global index") for p in problems):
            raise ConfigurationError(  # an index added since: added in place, no copy (docs/upgrading.md)
                f"DynamoDB table {self._table!r} lacks what this release reads: {'; '.join(problems)}. Add it in "
                "place: deploy the stack (CloudFormation adds a global index without replacing the table), or "
                "`aws dynamodb update-table` as docs/dynamodb.md shows"
            )
        if problems:
            raise ConfigurationError(
                f"DynamoDB table {self._table!r} has a layout this release does not serve (it serves format "
                f"{LAYOUT_FORMAT}): {'; '.join(problems)}. A table's local indexes cannot be dropped nor an index's "
                f"projection changed, so copy it into a new table: `dormant migrate-table --from {self._table} "
                "--to NEW_TABLE` (docs/dynamodb.md, Migration), then open the store on the new table"
            )
