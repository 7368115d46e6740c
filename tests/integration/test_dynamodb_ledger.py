"""The DynamoDB ledger (moto in-process, patched) against the shared Ledger contract."""

from __future__ import annotations

import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from swarm.adapters import dynamodb_items as items
from swarm.adapters.dynamodb_ledger import DynamoDBLedger
from swarm.core.codec import MAX_SPEC_BLOB_BYTES, check_spec_fits, spec_blob
from swarm.core.errors import InvalidInput
from swarm.core.ports import Ledger
from swarm.core.records import Lane, RunSpec, RunState, UnitSpec
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


def _random_ids_spec(units: int) -> RunSpec:
    rng = random.Random(0)  # UUID-like ids: random hex, as incompressible as real UUIDs
    ids = (f"{rng.getrandbits(128):032x}" for _ in range(units))
    return RunSpec("run-1", "acme", Lane.NORMAL, 10**9, tuple(UnitSpec(i, 10_000) for i in ids))


def test_the_spec_limit_at_submit_is_what_one_dynamodb_item_holds(dynamodb: Any) -> None:
    # Given the most units with random ids whose spec the submit check lets through
    low, high = 1, 40_000
    while low < high:  # bisect on the check itself
        mid = (low + high + 1) // 2
        low, high = (
            (mid, high)
            if len(spec_blob(_random_ids_spec(mid))) <= MAX_SPEC_BLOB_BYTES
            else (low, mid - 1)
        )
    fits, too_many = _random_ids_spec(low), _random_ids_spec(low + 200)
    check_spec_fits(fits)
    with pytest.raises(InvalidInput) as refused:
        check_spec_fits(too_many)
    assert refused.value.field == "units"
    # When the ledger stores each spec's item, on a DynamoDB with AWS's 400 KB item limit
    dynamodb.put_item(TableName=TABLE, Item=items.spec_item(fits))
    # Then the one the check passes is stored, and the one it refuses DynamoDB refuses too
    with pytest.raises(ClientError, match="Item size has exceeded"):
        dynamodb.put_item(TableName=TABLE, Item=items.spec_item(too_many))
    assert low > 10_000  # a batch of random ids still holds well over the inline maximum


def test_a_batched_admission_that_a_concurrent_write_cancels_is_decided_again(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run of 5 units, and another fan-out (another Lambda) that admits u2 right after
    # this batch has read the books and the units
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    other = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=5, tokens=100, budget=1_000), now=0.0)
    read = ledger._get_many
    raced: list[bool] = []

    def get_many(keys: list[Any]) -> list[Any]:
        found = read(keys)
        if len(keys) > 2 and not raced:
            raced.append(True)
            other.admit("run-1", "u2", 0, now=1.0)
        return found

    monkeypatch.setattr(ledger, "_get_many", get_many)
    transactions: list[int] = []
    call = ledger._call

    def counted(op: str, **kw: Any) -> Any:
        if op == "transact_write_items":
            transactions.append(len(kw["TransactItems"]))
        return call(op, **kw)

    monkeypatch.setattr(ledger, "_call", counted)
    # When the batch is written: its transaction is cancelled (u2 is not as read)
    admissions = ledger.admit_many("run-1", [f"u{i}" for i in range(5)], now=1.0)
    # Then u0 is admitted on its own, the rest batched again: u2 admitted already, once
    assert raced and transactions == [6, 2, 4]
    assert [a.reason for a in admissions] == [
        "admitted",
        "admitted",
        "already_admitted",
        "admitted",
        "admitted",
    ]
    run = ledger.run("run-1")
    assert (run.in_flight, run.reserved) == (5, 500)
