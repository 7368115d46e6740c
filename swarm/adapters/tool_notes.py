"""The ``notes`` tools' store: a tenant-scoped key-value store in a DynamoDB table of its own.

Why a table of its own, not items of the ledger under a tenant prefix: the notes function's role
then holds item rights on that table alone, so a tool the model drives can never read or write
the books, the governor or another function's items, whatever its input says (an IAM boundary,
not a convention of key prefixes); and its throughput and its capacity for growth are its own.

Keys: the partition key is the tenant (``t#<tenant>``), the sort key the note
(``n#<name>``) or a write's idempotency record (``k#<key>``). Every request names the partition
from the tenant the worker passed, so a tenant's reads and writes never reach another tenant's
items: the model's input only chooses the sort key, under the tenant's own partition.

At most once: ``write`` puts the note and its idempotency record in one TransactWriteItems, the
record under the condition that it does not exist. Two workers running the same call at once:
one transaction commits, the other is cancelled (its condition fails, or DynamoDB reports the
conflict and the retry's condition fails) and answers the first one's stored outcome. The check
and the effect are one atomic step, so a note is written once per key.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Final

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.core.tool_protocol import ToolInputError

PARTITION_KEY: Final = "pk"
SORT_KEY: Final = "sk"
TTL_ATTRIBUTE: Final = "expires_at"
#: how long a write's idempotency record is kept: far longer than any unit's loop (a loop
#: resumes from its log for as long as its batch is open)
KEY_RECORD_TTL_S: Final = 30 * 86_400
#: a note's name: what the model gives as ``name``
NOTE_NAME: Final = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
#: the longest value a note may hold (characters; a DynamoDB item stops at 400 KB)
MAX_NOTE_CHARS: Final = 16_000
#: the most names ``notes_read`` lists at once
MAX_LISTED: Final = 100


def note_name(value: Any, field: str = "name") -> str:
    if not isinstance(value, str) or not NOTE_NAME.match(value):
        raise ToolInputError(
            f"{field} must be 1 to 128 letters, digits or _.:/- (got {json.dumps(value)[:80]})"
        )
    return value


@dataclass
class DynamoDBNotes:
    """Notes of every tenant in one table; every call is scoped to one tenant."""

    table: str
    client: Any

    def read(self, tenant: str, name: Any) -> dict[str, Any]:
        """The note ``name`` of ``tenant``: ``{"name", "found", "value"}``."""
        name = note_name(name)
        item = self.client.get_item(
            TableName=self.table,
            Key=_key(tenant, f"n#{name}"),
            ConsistentRead=True,
        ).get("Item")
        if item is None:
            return {"name": name, "found": False}
        return {"name": name, "found": True, "value": item["value"]["S"]}

    def names(self, tenant: str) -> dict[str, Any]:
        """The tenant's note names (the first :data:`MAX_LISTED`, in order)."""
        page = self.client.query(
            TableName=self.table,
            KeyConditionExpression="#pk = :pk AND begins_with(#sk, :n)",
            ExpressionAttributeNames={"#pk": PARTITION_KEY, "#sk": SORT_KEY},
            ExpressionAttributeValues={":pk": {"S": _partition(tenant)}, ":n": {"S": "n#"}},
            ProjectionExpression="#sk",
            Limit=MAX_LISTED,
        )
        names = [item[SORT_KEY]["S"][2:] for item in page.get("Items", [])]
        return {"names": names, "more": "LastEvaluatedKey" in page}

    def write(self, tenant: str, key: str, name: Any, value: Any, now: float) -> dict[str, Any]:
        """Set the note ``name`` of ``tenant`` to ``value``, once per idempotency ``key``: a
        second call with the key answers the first call's outcome and writes nothing."""
        name = note_name(name)
        if not isinstance(value, str) or len(value) > MAX_NOTE_CHARS:
            raise ToolInputError(
                f"value must be a text of at most {MAX_NOTE_CHARS:,} characters"
                + (f" (got {len(value):,})" if isinstance(value, str) else "")
            )
        outcome = {"name": name, "written": True, "chars": len(value)}
        record = {
            **_key(tenant, f"k#{key}"),
            "outcome": {"S": json.dumps(outcome, separators=(",", ":"))},
            TTL_ATTRIBUTE: {"N": str(int(now + KEY_RECORD_TTL_S))},
        }
        note = {**_key(tenant, f"n#{name}"), "value": {"S": value}, "key": {"S": key}}
        for attempt in range(8):
            try:
                self.client.transact_write_items(
                    TransactItems=[
                        {
                            "Put": {
                                "TableName": self.table,
                                "Item": record,
                                "ConditionExpression": "attribute_not_exists(#pk)",
                                "ExpressionAttributeNames": {"#pk": PARTITION_KEY},
                            }
                        },
                        {"Put": {"TableName": self.table, "Item": note}},
                    ]
                )
                return outcome
            except client_error_type() as error:
                code = error_code(error)
                reasons = [
                    r.get("Code")
                    for r in getattr(error, "response", {}).get("CancellationReasons", [])
                ]
                if code == "TransactionCanceledException" and "ConditionalCheckFailed" in reasons:
                    return self._recorded(tenant, key)
                retryable = code in (
                    "TransactionCanceledException",  # a conflict with the same call's twin
                    "TransactionConflictException",
                    "TransactionInProgressException",
                    "ProvisionedThroughputExceededException",
                    "ThrottlingException",
                )
                if not retryable or attempt == 7:
                    raise
                time.sleep(min(1.0, 0.02 * 2**attempt) * random.random())
        raise AssertionError("unreachable")

    def _recorded(self, tenant: str, key: str) -> dict[str, Any]:
        item = self.client.get_item(
            TableName=self.table, Key=_key(tenant, f"k#{key}"), ConsistentRead=True
        )["Item"]
        outcome: dict[str, Any] = json.loads(item["outcome"]["S"])
        return outcome


def _partition(tenant: str) -> str:
    return f"t#{tenant}"


def _key(tenant: str, sort: str) -> dict[str, dict[str, str]]:
    return {PARTITION_KEY: {"S": _partition(tenant)}, SORT_KEY: {"S": sort}}


def create_notes_table(client: Any, table_name: str) -> None:
    """The notes table as the stack builds it (tests and tools; CDK owns it in AWS)."""
    try:
        client.create_table(
            TableName=table_name,
            AttributeDefinitions=[
                {"AttributeName": PARTITION_KEY, "AttributeType": "S"},
                {"AttributeName": SORT_KEY, "AttributeType": "S"},
            ],
            KeySchema=[
                {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
                {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    except client_error_type() as error:
        if error_code(error) != "ResourceInUseException":
            raise
