"""DynamoDB plumbing shared by the governor, the ledger and the run watch: the tables' key
schema, the error codes the adapters act on, one retried request, and table creation for tests
and the local runtime. Item layouts: docs/explanation/governor.md and docs/explanation/ledger.md.
"""

from __future__ import annotations

import random
import time
from typing import Any

from swarm.adapters.client_errors import client_error_type, error_code

PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"

# error codes (botocore ClientError.response["Error"]["Code"])
CONDITIONAL_CHECK_FAILED = "ConditionalCheckFailedException"
TRANSACTION_CANCELED = "TransactionCanceledException"
TRANSACTION_CONFLICT = "TransactionConflictException"
# retryable by waiting: the SDK retries these too, but a hot item can outlast its retries
RETRYABLE_CODES = frozenset(
    {
        TRANSACTION_CONFLICT,
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
    }
)


def default_client() -> Any:
    """A DynamoDB client from the environment's configuration (Lambda's role), made on first use."""
    import boto3

    return boto3.client("dynamodb")


def create_table(client: Any, table_name: str) -> None:
    """Create a table with the adapters' key schema, TTL and the ledger's indexes (``OpenRuns``,
    ``TenantRuns``, ``Leases``) (tests and the local runtime; CDK owns the governor and ledger
    tables in AWS, see infra/tables.py). Idempotent: an existing table is left as it is.
    """
    from swarm.contract import (
        EXECUTION,
        LEASE_EXPIRY,
        LEASES_INDEX,
        OPEN_RUNS_INDEX,
        OPEN_TENANT,
        REPAIRS,
        SWEEP_AT,
        TENANT_RUNS_INDEX,
        WATCH,
    )

    try:
        client.create_table(
            TableName=table_name,
            AttributeDefinitions=[
                {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
                {"AttributeName": SORT_KEY, "AttributeType": "S"},
                {"AttributeName": WATCH, "AttributeType": "S"},
                {"AttributeName": SWEEP_AT, "AttributeType": "N"},
                {"AttributeName": OPEN_TENANT, "AttributeType": "S"},
                {"AttributeName": LEASE_EXPIRY, "AttributeType": "N"},
            ],
            KeySchema=[
                {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
            ],
            GlobalSecondaryIndexes=[
                {
                    "IndexName": OPEN_RUNS_INDEX,
                    "KeySchema": [
                        {"AttributeName": WATCH, "KeyType": "HASH"},
                        {"AttributeName": SWEEP_AT, "KeyType": "RANGE"},
                    ],
                    "Projection": {
                        "ProjectionType": "INCLUDE",
                        "NonKeyAttributes": [EXECUTION, REPAIRS],
                    },
                },
                {
                    "IndexName": TENANT_RUNS_INDEX,
                    "KeySchema": [{"AttributeName": OPEN_TENANT, "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
                {
                    "IndexName": LEASES_INDEX,
                    "KeySchema": [
                        {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                        {"AttributeName": LEASE_EXPIRY, "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                },
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    except client_error_type() as e:
        if error_code(e) != "ResourceInUseException":
            raise
        return
    client.get_waiter("table_exists").wait(TableName=table_name)
    client.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
    )


def call(client: Any, op: str, rng: Any = None, **kwargs: Any) -> dict[str, Any]:
    """One DynamoDB request; retryable throttling/conflicts are retried with jittered backoff.

    The SDK already retries these a few times; a hot item can outlast them, and the caller's
    operation is safe to repeat (every write the adapters make is conditional or idempotent).
    """
    jitter = rng.random if rng is not None else random.random
    for attempt in range(8):
        try:
            result: dict[str, Any] = getattr(client, op)(**kwargs)
            return result
        except client_error_type() as e:
            if error_code(e) in RETRYABLE_CODES and attempt < 7:
                time.sleep(min(1.0, 0.01 * 2**attempt) * jitter())
                continue
            raise
    raise AssertionError("unreachable")
