"""The DynamoDB ledger (moto in-process, patched) against the shared Ledger contract."""

from __future__ import annotations

from typing import Any

import pytest

from swarm.adapters.dynamodb_ledger import DynamoDBLedger
from swarm.core.ports import Ledger
from swarm.core.records import RunState
from tests.integration.conftest import TABLE
from tests.ledger_contract import LedgerContract, spec


class TestDynamoDBLedger(LedgerContract):
    @pytest.fixture
    def ledger(self, dynamodb: Any) -> Ledger:
        return DynamoDBLedger(TABLE, client=dynamodb)


def test_item_layout_keys_ttl_and_a_fresh_client_reads_the_same_books(dynamodb: Any) -> None:
    # Given a run with one settled attempt
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=2), now=0.0)
    ledger.admit("run-1", "u0", 0, now=1.0)
    ledger.settle("run-1", "u0", 0, 42, True, now=2.0)
    # When the table is read directly
    items = dynamodb.scan(TableName=TABLE)["Items"]
    keys = sorted((it["pk"]["S"], it["sk"]["S"]) for it in items)
    # Then it holds the documented single-table items, and attempts carry the TTL attribute
    assert keys == [
        ("run#run-1", "attempt#u0#00000"),
        ("run#run-1", "books"),
        ("run#run-1", "spec"),
        ("run#run-1", "unit#u0"),
        ("run#run-1", "unit#u1"),
    ]
    attempt = next(it for it in items if it["sk"]["S"].startswith("attempt#"))
    assert int(attempt["expires_at"]["N"]) == 2 + 30 * 24 * 3600
    books = next(it for it in items if it["sk"]["S"] == "books")
    assert books["available"]["N"] == str(1_000 - 42)
    # and another client (another Lambda) sees the same books
    assert DynamoDBLedger(TABLE, client=dynamodb).run("run-1") == ledger.run("run-1")


def test_a_crash_mid_open_is_finished_by_the_next_open(dynamodb: Any) -> None:
    # Given an open that wrote the books (not ready) but died before the units
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=3), now=0.0)
    dynamodb.update_item(
        TableName=TABLE,
        Key={"pk": {"S": "run#run-1"}, "sk": {"S": "books"}},
        UpdateExpression="SET ready = :f",
        ExpressionAttributeValues={":f": {"BOOL": False}},
    )
    dynamodb.delete_item(TableName=TABLE, Key={"pk": {"S": "run#run-1"}, "sk": {"S": "unit#u2"}})
    fresh = DynamoDBLedger(TABLE, client=dynamodb)
    with pytest.raises(Exception, match="no run"):
        fresh.run("run-1")
    # When the (retried) open runs again, Then the run is complete and usable
    assert fresh.open_run(spec(units=3), now=5.0).state is RunState.OPEN
    assert [u.unit_id for u in fresh.units("run-1")] == ["u0", "u1", "u2"]
    assert fresh.admit("run-1", "u2", 0, now=6.0).admitted


def test_a_large_run_opens_in_batches(dynamodb: Any) -> None:
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=130, budget=10**9), now=0.0)
    assert len(ledger.units("run-1")) == 130
