"""Each unit's tool journal in DynamoDB: the durable state of a stateful tool (BFCL's backends,
swarm.workloads.bfcl ``Backends``), an append-only list of the calls that ran, each under its
idempotency key with its outcome.

Items: ``pk = j#<unit>``, ``sk = <seq>`` (zero-padded, so a Query reads them in order). An append
of call ``seq`` is a PutItem conditional on that item not existing. A caller appends ``seq`` only
after reading ``seq`` entries, and entries are only ever appended, so "item ``seq`` does not
exist" is "the journal still holds ``seq`` calls": of two processes that read the same journal and
ran the same (or another) call, one append succeeds and the other is refused with
:class:`~swarm.core.errors.Contended`, its run void (it reads the journal again, and finds the
call's outcome there when it was the same call). The check and the effect's record are one step.

A journal item holds one call (a DynamoDB item stops at 400 KB; BFCL's answers are small); the
Query pages through a long journal. Each item expires (the table's TTL) :data:`JOURNAL_TTL_S`
after it was written: a journal is an evaluation's state, judged once its batch closed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.core.errors import Contended

PARTITION_KEY: Final = "pk"
SORT_KEY: Final = "sk"
#: digits of a journal entry's sequence number (sorted as text)
SEQ_DIGITS: Final = 8
#: the table's TTL attribute (infra/constants.py TTL_ATTRIBUTE), and a call's lifetime
TTL_ATTRIBUTE: Final = "expires_at"
JOURNAL_TTL_S: Final = 30 * 86_400


@dataclass
class DynamoDBJournals:
    table: str
    client: Any
    clock: Callable[[], float] = field(default=time.time)

    def read(self, unit: str) -> list[dict[str, Any]]:
        """The unit's journal, in order (a strongly consistent Query, every page)."""
        entries: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self.table,
                "KeyConditionExpression": "#pk = :pk",
                "ExpressionAttributeNames": {"#pk": PARTITION_KEY},
                "ExpressionAttributeValues": {":pk": {"S": _partition(unit)}},
                "ConsistentRead": True,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            page = self.client.query(**kwargs)
            entries += [json.loads(item["entry"]["S"]) for item in page.get("Items", [])]
            start = page.get("LastEvaluatedKey")
            if start is None:
                return entries

    def append(self, unit: str, seq: int, entry: dict[str, Any]) -> None:
        """Append ``entry`` as call ``seq``, only if the journal holds ``seq`` calls:
        :class:`Contended` (and nothing written) otherwise."""
        try:
            self.client.put_item(
                TableName=self.table,
                Item={
                    PARTITION_KEY: {"S": _partition(unit)},
                    SORT_KEY: {"S": f"{seq:0{SEQ_DIGITS}d}"},
                    "entry": {"S": json.dumps(entry, allow_nan=False, separators=(",", ":"))},
                    TTL_ATTRIBUTE: {"N": str(int(self.clock() + JOURNAL_TTL_S))},
                },
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames={"#pk": PARTITION_KEY},
            )
        except client_error_type() as error:
            if error_code(error) == "ConditionalCheckFailedException":
                raise Contended(f"journal of {unit!r} holds more than {seq} calls") from None
            raise


def _partition(unit: str) -> str:
    return f"j#{unit}"
