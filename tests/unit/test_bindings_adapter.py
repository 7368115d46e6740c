"""The DynamoDB tenant bindings (swarm.adapters.dynamodb_bindings) on a recording client: a
binding is written once, at the tenant's first call; confirming it afterwards only reads."""

from __future__ import annotations

from typing import Any

from swarm.adapters.dynamodb_bindings import DynamoDBBindings


class RecordingTable:
    """The few DynamoDB calls the bindings make, on one table in memory, each one recorded."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def batch_get_item(self, RequestItems: dict[str, Any]) -> dict[str, Any]:
        self.calls.append("BatchGetItem")
        ((table, request),) = RequestItems.items()
        found = [self.items[k["pk"]["S"]] for k in request["Keys"] if k["pk"]["S"] in self.items]
        return {"Responses": {table: found}}

    def update_item(self, Key: dict[str, Any], ExpressionAttributeValues: Any, **_: Any) -> Any:
        self.calls.append("UpdateItem")
        item = self.items.setdefault(Key["pk"]["S"], dict(Key))
        item.setdefault("role_id", ExpressionAttributeValues[":id"])
        return {}


def test_a_binding_is_written_once_and_confirmed_by_reading() -> None:
    table = RecordingTable()
    bindings = DynamoDBBindings("ledger", table)
    assert bindings.bind("acme", "AROA1", 1.0)
    assert table.calls == ["BatchGetItem", "UpdateItem"]
    # before: every confirmation was a conditional UpdateItem, a write call on any request
    assert bindings.bind("acme", "AROA1", 400.0)
    assert not bindings.bind("acme", "AROA2", 401.0)  # a recreated role: refused, unwritten
    assert table.calls == ["BatchGetItem", "UpdateItem", "BatchGetItem", "BatchGetItem"]
