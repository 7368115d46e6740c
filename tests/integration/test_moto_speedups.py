"""The patches that make moto's DynamoDB cheaper (swarm.local.patches.dynamodb) answer exactly as
moto does: the item operations' responses written with ``json.dumps`` are the responses moto's
serializer writes, and a cached expression parse behaves as a fresh one."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError

from swarm.local.patches import dynamodb as patch
from tests.integration.conftest import TABLE

PK, SK = "pk", "sk"  # swarm.adapters.dynamodb's key schema

EVERY_TYPE: dict[str, Any] = {
    "s": {"S": "text é"},
    "n": {"N": "12.5"},
    "b": {"B": b"\x00\xffbytes"},
    "t": {"BOOL": True},
    "z": {"NULL": True},
    "l": {"L": [{"S": "a"}, {"N": "1"}, {"B": b"\x01"}]},
    "m": {"M": {"inner": {"M": {"deep": {"SS": ["x", "y"]}}}}},
    "ns": {"NS": ["1", "2"]},
    "bs": {"BS": [b"\x02", b"\x03"]},
}


def key(sk: str) -> dict[str, Any]:
    return {PK: {"S": "speedups"}, SK: {"S": sk}}


def test_every_item_operation_answers_as_motos_serializer_does(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given responses checked against moto's own serializer (a difference raises)
    monkeypatch.setattr(patch, "VERIFY_JSON", True)
    capacity = {"ReturnConsumedCapacity": "INDEXES"}

    # When every item operation runs over items holding every attribute type
    for i in range(3):
        put = dynamodb.put_item(
            TableName=TABLE, Item={**key(f"item-{i}"), **EVERY_TYPE}, **capacity
        )
    replaced = dynamodb.put_item(
        TableName=TABLE, Item={**key("item-0"), **EVERY_TYPE}, ReturnValues="ALL_OLD"
    )
    got = dynamodb.get_item(TableName=TABLE, Key=key("item-1"), ConsistentRead=True, **capacity)
    missing = dynamodb.get_item(TableName=TABLE, Key=key("absent"))
    updated = dynamodb.update_item(
        TableName=TABLE,
        Key=key("item-2"),
        UpdateExpression="SET #n = #n + :one, fresh = :fresh REMOVE z",
        ConditionExpression="attribute_exists(#n)",
        ExpressionAttributeNames={"#n": "n"},
        ExpressionAttributeValues={":one": {"N": "1"}, ":fresh": {"B": b"new"}},
        ReturnValues="ALL_NEW",
        **capacity,
    )
    page = dynamodb.query(
        TableName=TABLE,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": PK},
        ExpressionAttributeValues={":pk": {"S": "speedups"}},
        Limit=2,
        **capacity,
    )
    counted = dynamodb.scan(TableName=TABLE, Select="COUNT")
    scanned = dynamodb.scan(TableName=TABLE)
    batch = dynamodb.batch_get_item(
        RequestItems={TABLE: {"Keys": [key("item-0"), key("item-1"), key("absent")]}}, **capacity
    )
    written = dynamodb.batch_write_item(
        RequestItems={TABLE: [{"PutRequest": {"Item": {**key("batch"), "s": {"S": "b"}}}}]},
        **capacity,
    )
    transacted = dynamodb.transact_get_items(
        TransactItems=[{"Get": {"TableName": TABLE, "Key": key("item-1")}}], **capacity
    )
    dynamodb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": TABLE, "Item": {**key("tx"), "n": {"N": "1"}}}},
            {
                "Update": {
                    "TableName": TABLE,
                    "Key": key("item-1"),
                    "UpdateExpression": "ADD n :one",
                    "ExpressionAttributeValues": {":one": {"N": "1"}},
                }
            },
        ],
        **capacity,
    )
    deleted = dynamodb.delete_item(TableName=TABLE, Key=key("tx"), ReturnValues="ALL_OLD")

    # Then each answer is moto's, down to the binary values
    assert put["ConsumedCapacity"]["TableName"] == TABLE
    assert replaced["Attributes"]["b"] == {"B": b"\x00\xffbytes"}
    assert got["Item"] == {**key("item-1"), **EVERY_TYPE}
    assert "Item" not in missing
    assert updated["Attributes"]["n"] == {"N": "13.5"}
    assert updated["Attributes"]["fresh"] == {"B": b"new"}
    assert "z" not in updated["Attributes"]
    assert page["Count"] == 2 and "LastEvaluatedKey" in page
    assert counted["Count"] == 3 and "Items" not in counted
    assert len(scanned["Items"]) == 3
    assert len(batch["Responses"][TABLE]) == 2 and batch["UnprocessedKeys"] == {}
    assert written["UnprocessedItems"] == {}
    assert transacted["Responses"][0]["Item"]["bs"] == {"BS": [b"\x02", b"\x03"]}
    assert deleted["Attributes"] == {**key("tx"), "n": {"N": "1"}}


def test_the_check_sees_a_fast_answer_that_differs(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given responses checked against moto's serializer, and a fast path that encodes binary
    # values wrongly
    monkeypatch.setattr(patch, "VERIFY_JSON", True)
    monkeypatch.setattr(patch, "_blob", lambda value: "d3Jvbmc=")
    dynamodb.put_item(TableName=TABLE, Item={**key("b"), "b": {"B": b"right"}})

    # When an item with a binary value is read, the difference is raised
    with pytest.raises(patch.SerializerMismatch, match="GetItem"):
        dynamodb.get_item(TableName=TABLE, Key=key("b"))


def test_a_cached_update_expression_applies_each_calls_own_values(dynamodb: Any) -> None:
    # Given one update expression string, parsed once
    expression = "SET tally = if_not_exists(tally, :zero) + :step, label = :label"
    for sk, step in (("a", "1"), ("b", "5"), ("a", "2")):
        dynamodb.update_item(
            TableName=TABLE,
            Key=key(sk),
            UpdateExpression=expression,
            ConditionExpression="attribute_not_exists(locked) OR locked = :no",
            ExpressionAttributeValues={
                ":zero": {"N": "0"},
                ":step": {"N": step},
                ":label": {"S": f"{sk}-{step}"},
                ":no": {"BOOL": False},
            },
        )

    # Then each item holds its own calls' values
    a = dynamodb.get_item(TableName=TABLE, Key=key("a"))["Item"]
    b = dynamodb.get_item(TableName=TABLE, Key=key("b"))["Item"]
    assert (a["tally"], a["label"]) == ({"N": "3"}, {"S": "a-2"})
    assert (b["tally"], b["label"]) == ({"N": "5"}, {"S": "b-5"})

    # And a condition of the same string is evaluated against each call's values
    dynamodb.put_item(TableName=TABLE, Item={**key("c"), "locked": {"BOOL": True}})
    with pytest.raises(ClientError, match="ConditionalCheckFailed"):
        dynamodb.update_item(
            TableName=TABLE,
            Key=key("c"),
            UpdateExpression=expression,
            ConditionExpression="attribute_not_exists(locked) OR locked = :no",
            ExpressionAttributeValues={
                ":zero": {"N": "0"},
                ":step": {"N": "1"},
                ":label": {"S": "c"},
                ":no": {"BOOL": False},
            },
        )


def test_an_update_expression_is_parsed_once_and_a_bad_one_refused_every_time(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.dynamodb.parsing import expressions

    tokenized: list[str] = []
    make_list = expressions.ExpressionTokenizer.make_list

    def counting(expression: str) -> Any:
        tokenized.append(expression)
        return make_list(expression)

    monkeypatch.setattr(expressions.ExpressionTokenizer, "make_list", counting)

    # When one new expression (new to this process's cache) is used by three requests
    marker = f"marker_{uuid.uuid4().hex}"
    expression = f"SET {marker} = :v"
    for value in "xyz":
        dynamodb.update_item(
            TableName=TABLE,
            Key=key("once"),
            UpdateExpression=expression,
            ExpressionAttributeValues={":v": {"S": value}},
        )

    # Then it was tokenized once (moto alone: twice per request)
    assert tokenized.count(expression) == 1
    item = dynamodb.get_item(TableName=TABLE, Key=key("once"))["Item"]
    assert item[marker] == {"S": "z"}

    # And a malformed expression is refused each time it is sent, not remembered as parsed
    for _ in range(2):
        with pytest.raises(ClientError, match="ValidationException"):
            dynamodb.update_item(
                TableName=TABLE,
                Key=key("once"),
                UpdateExpression="SET = :v",
                ExpressionAttributeValues={":v": {"S": "x"}},
            )
