"""Throwaway servers the tests and the benchmark run against (kept out of the library and its layer).

``postgres.throwaway_postgres()`` starts a real PostgreSQL, ``dynamodb.dynamodb_local()`` a real DynamoDB
Local. Import as ``tests.support.servers.postgres``: the repository root is on the path for pytest
(``pythonpath``) and for ``python -m bench`` (run from it).
"""
