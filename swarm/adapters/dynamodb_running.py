"""The :class:`swarm.core.ports.RunningWork` register on the ledger table.

Shard items, ``running#<n>`` / ``register``, each under a partition key of its own (so the
register's writes spread over DynamoDB's partitions instead of meeting one partition's 1,000
write units a second). An invocation's entry is one attribute of the shard its id hashes to,
``inv#<id>`` = ``{runs: {run id: units}, expires: epoch s}``, written with one UpdateItem SET
when it enters and removed with one UpdateItem REMOVE when it leaves (a top-level attribute: no
map to create first, and a REMOVE of a missing one is no error). Entries of dead workers stop
counting at ``expires``; the writer that enters a shard sees its entries in the answer
(``ReturnValues``, no extra request) and its leaving write removes the expired ones it saw. The
drain view and the batch status read every shard with one BatchGetItem (consistent reads).

A write is billed on the larger of the item's sizes before and after it (a write unit per KB),
so a shard's size is its cost: an entry is ~130 bytes, and 32 shards keep a shard under ~4 KB
(4 write units) at 1,000 concurrent worker invocations, one unit at the default fleet's 20.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from swarm.adapters.dynamodb import PARTITION_KEY, SORT_KEY, call
from swarm.core.ports import RunningUnits, check_entry, tally

#: the register's shard items: one BatchGetItem reads them all (at most 100 keys)
SHARDS = 32
REGISTER = "running"
ENTRY_PREFIX = "inv#"
#: expired entries a leaving write removes, at most (an UpdateItem's expression stays small)
PRUNE_AT_MOST = 20
#: BatchGetItem rounds for the shards DynamoDB left unprocessed
MAX_UNPROCESSED_ROUNDS = 8


def shard_of(invocation: str) -> int:
    return zlib.crc32(invocation.encode()) % SHARDS


def shard_key(shard: int) -> dict[str, Any]:
    return {PARTITION_KEY: {"S": f"{REGISTER}#{shard}"}, SORT_KEY: {"S": "register"}}


@dataclass
class DynamoDBRunning:
    table_name: str
    client: Any  # a dynamodb client (the wiring's)
    #: per invocation entered by this process: the expired entries its shard held then
    _stale: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def enter(
        self, invocation: str, runs: Mapping[str, int], expires_at: float, now: float
    ) -> None:
        check_entry(invocation, runs)
        entry = {
            "M": {
                "runs": {"M": {run: {"N": str(units)} for run, units in runs.items()}},
                "expires": {"N": repr(expires_at)},
            }
        }
        answer = call(
            self.client,
            "update_item",
            TableName=self.table_name,
            Key=shard_key(shard_of(invocation)),
            UpdateExpression="SET #e = :e",
            ExpressionAttributeNames={"#e": ENTRY_PREFIX + invocation},
            ExpressionAttributeValues={":e": entry},
            ReturnValues="ALL_NEW",
        )
        stale = [
            name
            for name, value in (answer.get("Attributes") or {}).items()
            if name.startswith(ENTRY_PREFIX) and _expires(value) <= now
        ]
        with self._lock:
            self._stale[invocation] = stale[:PRUNE_AT_MOST]

    def leave(self, invocation: str) -> None:
        with self._lock:
            stale = self._stale.pop(invocation, [])
        names = {f"#r{n}": name for n, name in enumerate([ENTRY_PREFIX + invocation, *stale])}
        call(
            self.client,
            "update_item",
            TableName=self.table_name,
            Key=shard_key(shard_of(invocation)),
            UpdateExpression="REMOVE " + ", ".join(names),
            ExpressionAttributeNames=names,
        )

    def running(self, now: float) -> RunningUnits:
        keys = [shard_key(n) for n in range(SHARDS)]
        items: list[dict[str, Any]] = []
        for _ in range(MAX_UNPROCESSED_ROUNDS):
            if not keys:
                break
            answer = call(
                self.client,
                "batch_get_item",
                RequestItems={self.table_name: {"Keys": keys, "ConsistentRead": True}},
            )
            items += answer.get("Responses", {}).get(self.table_name, [])
            keys = (answer.get("UnprocessedKeys") or {}).get(self.table_name, {}).get("Keys", [])
        else:
            raise RuntimeError(
                f"DynamoDB left the running register's shards unread {MAX_UNPROCESSED_ROUNDS} "
                "times (throttled): try again"
            )
        live = [
            {run: int(Decimal(u["N"])) for run, u in value["M"]["runs"]["M"].items()}
            for item in items
            for name, value in item.items()
            if name.startswith(ENTRY_PREFIX) and _expires(value) > now
        ]
        return tally(live)


def _expires(value: Mapping[str, Any]) -> float:
    return float(Decimal(value["M"]["expires"]["N"]))
