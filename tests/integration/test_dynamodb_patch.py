"""The moto patch's transactions: all or nothing, at the cost of the items they name.

moto rolls a cancelled ``TransactWriteItems`` back from a deep copy of every table it names; the
patch (swarm/local/patches/dynamodb.py) snapshots only the named items. These tests pin that a
cancelled transaction still leaves nothing half-written, in every way moto cancels one.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.conftest import TABLE


def _key(pk: str, sk: str = "x") -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _put(pk: str, n: int) -> dict[str, Any]:
    return {"Put": {"TableName": TABLE, "Item": {**_key(pk), "n": {"N": str(n)}}}}


def _add(pk: str, n: int, condition: str | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {
        "TableName": TABLE,
        "Key": _key(pk),
        "UpdateExpression": "ADD n :n",
        "ExpressionAttributeValues": {":n": {"N": str(n)}},
    }
    if condition:
        op["ConditionExpression"] = condition
    return {"Update": op}


def _items(dynamodb: Any) -> dict[str, int]:
    return {i["pk"]["S"]: int(i["n"]["N"]) for i in dynamodb.scan(TableName=TABLE).get("Items", [])}


@pytest.fixture
def seeded(dynamodb: Any) -> Any:
    dynamodb.transact_write_items(TransactItems=[_put("a", 1), _put("b", 2)])
    return dynamodb


def test_a_transaction_commits_every_write(seeded: Any) -> None:
    seeded.transact_write_items(TransactItems=[_add("a", 10), _add("b", 20), _put("c", 3)])
    assert _items(seeded) == {"a": 11, "b": 22, "c": 3}


def test_a_failed_condition_rolls_back_the_writes_before_it(seeded: Any) -> None:
    # the first two writes are applied by moto before the third's condition fails
    with pytest.raises(ClientError) as cancelled:
        seeded.transact_write_items(
            TransactItems=[_add("a", 10), _put("c", 3), _add("b", 20, "n > :n")]
        )
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert _items(seeded) == {"a": 1, "b": 2}  # "c" is gone again, "a" is back to 1


def test_a_twice_named_item_rolls_back_to_its_state_before_the_transaction(seeded: Any) -> None:
    with pytest.raises(ClientError):
        seeded.transact_write_items(TransactItems=[_add("a", 10), _put("d", 4), _add("a", 5)])
    assert _items(seeded) == {"a": 1, "b": 2}


def test_a_delete_in_a_cancelled_transaction_is_undone(seeded: Any) -> None:
    delete = {"Delete": {"TableName": TABLE, "Key": _key("a")}}
    with pytest.raises(ClientError):
        seeded.transact_write_items(TransactItems=[delete, _add("b", 1, "attribute_not_exists(n)")])
    assert _items(seeded) == {"a": 1, "b": 2}


def test_a_transaction_never_copies_a_whole_table(
    seeded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.dynamodb.models.table import Table

    def refuse(self: Table, memo: Any) -> Table:
        raise AssertionError("a transaction deep-copied a whole table")

    monkeypatch.setattr(Table, "__deepcopy__", refuse, raising=False)
    seeded.transact_write_items(TransactItems=[_add("a", 1)])
    with pytest.raises(ClientError):
        seeded.transact_write_items(TransactItems=[_add("a", 1), _add("b", 5, "n > :n")])
    assert _items(seeded) == {"a": 2, "b": 2}


def test_no_write_interleaves_inside_one_update_item_request(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto's UpdateItem handler reads the old item (and deep-copies it) before it updates: the
    whole request holds the lock, so another writer waits instead of tearing the item mid-copy."""
    from moto.dynamodb.models import DynamoDBBackend

    dynamodb.put_item(TableName=TABLE, Item={**_key("a"), "n": {"N": "1"}})
    locked_get_item = DynamoDBBackend.get_item
    other_done: list[bool] = []

    def get_item_then_race(self: Any, *args: Any, **kwargs: Any) -> Any:
        item = locked_get_item(self, *args, **kwargs)
        if not other_done and threading.current_thread() is threading.main_thread():
            other = threading.Thread(
                target=lambda: dynamodb.put_item(
                    TableName=TABLE, Item={**_key("a"), "n": {"N": "100"}}
                )
            )
            other.start()
            other.join(0.5)  # long enough for an unlocked PutItem to finish
            other_done.append(not other.is_alive())
        return item

    monkeypatch.setattr(DynamoDBBackend, "get_item", get_item_then_race)
    dynamodb.update_item(
        TableName=TABLE,
        Key=_key("a"),
        UpdateExpression="ADD n :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
        ReturnValues="UPDATED_OLD",
    )
    assert other_done == [False], "a PutItem ran inside another request's UpdateItem"


# ------------------------------------------------------------------ Query candidates
# The local stack's patch (swarm/local/patches/emulator.py) hands moto's Query only the items
# that can match; these tests pin that every Query the control plane makes answers as moto's own
# full-table pass did: the same items, in the same order, on the same pages.


def _query_pages(dynamodb: Any, limit: int | None = None, **kwargs: Any) -> list[list[Any]]:
    pages: list[list[Any]] = []
    while True:
        page = dynamodb.query(TableName=TABLE, **kwargs, **({"Limit": limit} if limit else {}))
        pages.append(page["Items"])
        if "LastEvaluatedKey" not in page:
            return pages
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@pytest.fixture
def many_partitions(dynamodb: Any) -> Any:
    from swarm.contract import LEASE_EXPIRY, OPEN_TENANT, SWEEP_AT, WATCH

    for run in ("run#a", "run#b", "run#c"):
        for i in range(12):
            item: dict[str, Any] = _key(run, f"unit#{i:03d}")
            if i % 3:  # a sparse index: only some units carry a lease
                item[LEASE_EXPIRY] = {"N": str(100 + (i * 7) % 12 + (0.5 if run == "run#b" else 0))}
            dynamodb.put_item(TableName=TABLE, Item=item)
            dynamodb.put_item(TableName=TABLE, Item=_key(run, f"attempt#{i:03d}"))
        books = {**_key(run, "books"), WATCH: {"S": "run"}, SWEEP_AT: {"N": str(len(run))}}
        books[OPEN_TENANT] = {"S": "t1" if run != "run#c" else "t2"}
        dynamodb.put_item(TableName=TABLE, Item=books)
    return dynamodb


@pytest.mark.parametrize("limit", [None, 1, 4])
@pytest.mark.parametrize(
    ("query", "found"),
    [
        (
            {  # a run's units (the ledger's pages of units)
                "KeyConditionExpression": "pk = :pk AND begins_with(sk, :p)",
                "ExpressionAttributeValues": {":pk": {"S": "run#b"}, ":p": {"S": "unit#"}},
                "ConsistentRead": True,
            },
            12,
        ),
        (
            {  # a partition nobody wrote
                "KeyConditionExpression": "pk = :pk",
                "ExpressionAttributeValues": {":pk": {"S": "run#zzz"}},
            },
            0,
        ),
        (
            {  # the finalizer's expired leases, newest first
                "IndexName": "Leases",
                "KeyConditionExpression": "pk = :pk AND res_lease <= :now",
                "ExpressionAttributeValues": {":pk": {"S": "run#a"}, ":now": {"N": "108"}},
                "ScanIndexForward": False,
            },
            6,
        ),
        (
            {  # a tenant's open runs (an index whose key is not the table's)
                "IndexName": "TenantRuns",
                "KeyConditionExpression": "open_tenant = :t",
                "ExpressionAttributeValues": {":t": {"S": "t1"}},
            },
            2,
        ),
        (
            {  # the sweeper's due runs
                "IndexName": "OpenRuns",
                "KeyConditionExpression": "#w = :w AND sweep_at <= :at",
                "ExpressionAttributeNames": {"#w": "watch"},
                "ExpressionAttributeValues": {":w": {"S": "run"}, ":at": {"N": "5"}},
            },
            3,
        ),
    ],
    ids=["units", "no-partition", "leases", "tenant-runs", "open-runs"],
)
def test_a_query_answers_as_moto_s_full_table_pass(
    many_partitions: Any, query: dict[str, Any], found: int, limit: int | None
) -> None:
    from swarm.local.patches import emulator

    emulator.patch_dynamodb_query_candidates()
    patched = _query_pages(many_partitions, limit, **query)
    with emulator.dynamodb_query_unpatched():
        unpatched = _query_pages(many_partitions, limit, **query)
    assert patched == unpatched
    assert len([item for page in patched for item in page]) == found
