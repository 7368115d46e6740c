"""Adapters: the core's ports on AWS services. boto3 lives here and nowhere else.

Clients are injected (tests, the local runtime) or created lazily on first use (Lambda), never
at import time. botocore ``ClientError`` is mapped to the domain exceptions by *error code*
(:func:`error_code`), never by message text.

One DynamoDB table holds the governor and the ledger (single-table design):

========================  ===============================  =====================================
item                      ``pk`` (S)                       ``sk`` (S)
========================  ===============================  =====================================
governor shard            ``gov#<name>``                   ``shard#0000`` ... ``shard#NNNN``
run spec (immutable)      ``run#<run_id>``                 ``spec``
run books                 ``run#<run_id>``                 ``books``
unit                      ``run#<run_id>``                 ``unit#<unit_id>``
settled attempt           ``run#<run_id>``                 ``attempt#<unit_id>#<attempt:05d>``
========================  ===============================  =====================================

TTL attribute: ``expires_at`` (epoch seconds, on settled-attempt items only). Billing: on
demand. One sparse global secondary index, ``OpenRuns`` (``watch`` / ``sweep_at``): the books of
runs the sweeper watches (:mod:`swarm.adapters.dynamodb_watch`).
"""

from __future__ import annotations

from typing import Any

PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"

# error codes (botocore ClientError.response["Error"]["Code"])
CONDITIONAL_CHECK_FAILED = "ConditionalCheckFailedException"
TRANSACTION_CANCELED = "TransactionCanceledException"
TRANSACTION_CONFLICT = "TransactionConflictException"
RESOURCE_NOT_FOUND = "ResourceNotFoundException"
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


def error_code(error: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (None for anything else)."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    code = response.get("Error", {}).get("Code")
    return str(code) if code is not None else None


def client_error_type() -> type[Exception]:
    """botocore's ClientError, imported lazily so importing an adapter never imports botocore."""
    from botocore.exceptions import ClientError

    return ClientError  # type: ignore[no-any-return]


def default_client() -> Any:
    """A DynamoDB client from the environment's configuration (Lambda's role), made on first use."""
    import boto3

    return boto3.client("dynamodb")


def create_table(client: Any, table_name: str) -> None:
    """Create the single table (tests and the local runtime; CDK owns it in AWS).

    Idempotent: an existing table is left as it is.
    """
    from swarm.adapters.dynamodb_watch import (
        EXECUTION,
        OPEN_RUNS_INDEX,
        REPAIRS,
        SWEEP_AT,
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
                }
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
    import random
    import time

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
