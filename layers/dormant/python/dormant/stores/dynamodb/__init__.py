"""The DynamoDB store (``pip install 'dormant[dynamodb]'``): one table, gated commits, sharded listing.

``table`` holds the table's shape and imports no AWS SDK, so the CDK app can build from it.
"""

from .table import LISTING_INDEX, PENDING_INDEX, TABLE, IndexShape, TableShape

__all__ = ["LISTING_INDEX", "PENDING_INDEX", "TABLE", "IndexShape", "TableShape"]
