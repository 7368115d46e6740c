"""A stack update changes a table's global secondary indexes on the emulator as on AWS.

moto's CloudFormation leaves an ``AWS::DynamoDB::Table`` untouched on a stack update (the model
has no ``update_from_cloudformation_json``): a redeploy that adds an index reported
UPDATE_COMPLETE with the index missing, and one that adds two passed where CloudFormation fails.
:func:`patch_table_index_updates` applies the index changes of an update the way DynamoDB's
UpdateTable does, one create or delete per table per update, and refuses what CloudFormation
refuses: more than one index created or deleted, or an index whose key schema or projection
changed under the same name (infra/indexes.py refuses both at synth already). Every other table
property is left as moto leaves it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

_GUARD = threading.Lock()
_APPLIED = False


def _shape(index: dict[str, Any]) -> str:
    projection = dict(index.get("Projection", {}))
    if "NonKeyAttributes" in projection:
        projection["NonKeyAttributes"] = sorted(projection["NonKeyAttributes"])
    return json.dumps({"KeySchema": index["KeySchema"], "Projection": projection}, sort_keys=True)


def index_changes(
    table: str, before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """UpdateTable's ``GlobalSecondaryIndexUpdates`` from one template's indexes to the next,
    or ValueError with CloudFormation's reason for refusing them."""
    old = {index["IndexName"]: index for index in before}
    new = {index["IndexName"]: index for index in after}
    changed = [n for n in new if n in old and _shape(new[n]) != _shape(old[n])]
    if changed:
        raise ValueError(
            f"{table}: cannot update index {', '.join(changed)} in place (key schema or "
            "projection changed); CloudFormation updates neither"
        )
    updates = [{"Delete": {"IndexName": n}} for n in old if n not in new]
    updates += [{"Create": new[n]} for n in new if n not in old]
    if len(updates) > 1:
        raise ValueError(
            f"{table}: Cannot perform more than one GSI creation or deletion in a single update "
            f"({len(updates)} requested)"
        )
    return updates


def patch_table_index_updates() -> None:
    global _APPLIED
    with _GUARD:
        if _APPLIED:
            return
        from moto.cloudformation.exceptions import ValidationError
        from moto.dynamodb.models import dynamodb_backends
        from moto.dynamodb.models.table import Table

        def update_from_cloudformation_json(
            cls: Any,
            /,
            original_resource: Any,
            new_resource_name: str,
            cloudformation_json: Any,
            account_id: str,
            region_name: str,
        ) -> Any:
            table = original_resource
            properties = cloudformation_json.get("Properties", {})
            before = [
                {"IndexName": i.name, "KeySchema": i.schema, "Projection": i.projection}
                for i in table.global_indexes
            ]
            try:
                updates = index_changes(
                    table.name, before, list(properties.get("GlobalSecondaryIndexes", []))
                )
            except ValueError as e:
                raise ValidationError(message=str(e)) from None
            if updates:
                table.attr = properties.get("AttributeDefinitions", table.attr)
                backend = dynamodb_backends[account_id][region_name]
                backend.update_table_global_indexes(table, updates)
            return table

        Table.update_from_cloudformation_json = classmethod(  # type: ignore[method-assign,assignment]
            update_from_cloudformation_json
        )
        _APPLIED = True
