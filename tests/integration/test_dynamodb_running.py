"""The register of running work on the ledger table (moto in-process, patched)."""

from __future__ import annotations

from typing import Any

import pytest

from swarm.adapters.dynamodb_running import SHARDS, DynamoDBRunning, shard_key, shard_of
from swarm.core.ports import RunningWork
from tests.integration.conftest import TABLE
from tests.running_contract import RunningContract


class TestDynamoDBRunning(RunningContract):
    @pytest.fixture
    def register(self, dynamodb: Any) -> RunningWork:
        return DynamoDBRunning(TABLE, dynamodb)


def shard_entries(dynamodb: Any, shard: int) -> set[str]:
    item = dynamodb.get_item(TableName=TABLE, Key=shard_key(shard), ConsistentRead=True)
    return {name for name in item.get("Item", {}) if name.startswith("inv#")}


def test_a_dead_workers_entry_is_removed_by_the_next_writer_of_its_shard(dynamodb: Any) -> None:
    # Given a worker that entered and died (it never leaves)
    dead = DynamoDBRunning(TABLE, dynamodb)
    dead.enter("dead", {"run-1": 2}, expires_at=10.0, now=0.0)
    # and another invocation of the same shard entering after the dead one's lease
    other = next(f"inv-{n}" for n in range(1_000) if shard_of(f"inv-{n}") == shard_of("dead"))
    live = DynamoDBRunning(TABLE, dynamodb)
    live.enter(other, {"run-1": 1}, expires_at=100.0, now=20.0)
    assert shard_entries(dynamodb, shard_of("dead")) == {"inv#dead", f"inv#{other}"}
    # When it leaves
    live.leave(other)
    # Then the dead entry went with it: the shard item does not grow with dead workers
    assert shard_entries(dynamodb, shard_of("dead")) == set()


def test_the_register_is_shard_items_of_partitions_of_their_own(dynamodb: Any) -> None:
    register = DynamoDBRunning(TABLE, dynamodb)
    for n in range(50):
        register.enter(f"inv-{n}", {"run-1": 1}, expires_at=100.0, now=0.0)
    items = dynamodb.scan(TableName=TABLE)["Items"]
    keys = {(i["pk"]["S"], i["sk"]["S"]) for i in items}
    assert keys <= {(f"running#{n}", "register") for n in range(SHARDS)}
    # the writes spread over several partition keys, not one hot partition
    assert len({pk for pk, _ in keys}) > SHARDS // 2
