"""A stack update changes a table's global secondary indexes on the emulator as on AWS.

moto's CloudFormation leaves an ``AWS::DynamoDB::Table`` untouched on a stack update (the model
has no ``update_from_cloudformation_json``): a redeploy that adds an index reported
UPDATE_COMPLETE with the index missing, and one that adds two passed where CloudFormation fails.
:func:`patch_table_index_updates` applies the index changes of an update the way DynamoDB's
UpdateTable does, one create or delete per table per update, and refuses what CloudFormation
refuses: more than one index created or deleted, or an index whose key schema or projection
changed under the same name (infra/indexes.py refuses both at synth already). Every other table
property is left as moto leaves it.

It also keeps a resource moto cannot update as it was: for a type without
``update_from_cloudformation_json`` (a log group, say), moto's update recorded the resource as
``None``, so a changed log group (its metadata is enough) broke every ``Fn::GetAtt`` on it
("references undefined resource") and the whole update failed.
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

        from moto.cloudformation import parsing

        update_resource = parsing.parse_and_update_resource

        def parse_and_update_resource(
            logical_id: str,
            resource_json: dict[str, Any],
            resources_map: Any,
            account_id: str,
            region_name: str,
        ) -> Any:
            updated = update_resource(
                logical_id, resource_json, resources_map, account_id, region_name
            )
            if updated is None:  # a type moto cannot update: it stays as it was
                return resources_map._parsed_resources.get(logical_id)
            return updated

        parsing.parse_and_update_resource = parse_and_update_resource

        Table.update_from_cloudformation_json = classmethod(  # type: ignore[method-assign,assignment]
            update_from_cloudformation_json
        )
        _APPLIED = True
