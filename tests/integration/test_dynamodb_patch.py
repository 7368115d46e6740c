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
