"""The :class:`swarm.core.ports.TenantBindings` port on the ledger table: one item per tenant,
``tenant#<tenant>`` / ``binding``, holding the unique id (AROA...) of the role bound to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.adapters.dynamodb import PARTITION_KEY, SORT_KEY, call


@dataclass
class DynamoDBBindings:
    table_name: str
    client: Any  # a dynamodb client (the wiring's)

    @staticmethod
    def _key(tenant: str) -> dict[str, Any]:
        return {PARTITION_KEY: {"S": f"tenant#{tenant}"}, SORT_KEY: {"S": "binding"}}

    def bind(self, tenant: str, role_id: str, now: float) -> bool:
        # a binding already there is confirmed with a read: a request, refused or not, writes
        # nothing but a tenant's first binding (the e2e fuzzer checks that a refusal writes
        # nothing; a no-op write would be a write call all the same)
        answer = call(
            self.client,
            "batch_get_item",
            RequestItems={self.table_name: {"Keys": [self._key(tenant)], "ConsistentRead": True}},
        )
        found = answer.get("Responses", {}).get(self.table_name, [])
        bound = found[0].get("role_id", {}).get("S") if found else None
        if bound is not None:
            return bool(bound == role_id)
        try:  # binds at first use; a concurrent first binding of another role wins or loses here
            call(
                self.client,
                "update_item",
                TableName=self.table_name,
                Key=self._key(tenant),
                UpdateExpression="SET role_id = if_not_exists(role_id, :id), "
                "bound_at = if_not_exists(bound_at, :now)",
                ConditionExpression="attribute_not_exists(role_id) OR role_id = :id",
                ExpressionAttributeValues={":id": {"S": role_id}, ":now": {"N": repr(now)}},
            )
        except client_error_type() as e:
            if error_code(e) == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def unbind(self, tenant: str) -> bool:
        answer = call(
            self.client,
            "delete_item",
            TableName=self.table_name,
            Key=self._key(tenant),
            ReturnValues="ALL_OLD",
        )
        return "Attributes" in answer
