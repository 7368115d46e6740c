"""Index changes CloudFormation can apply: at most one global secondary index created or deleted
per table in one stack update, and no index changed in place.

DynamoDB's UpdateTable creates or deletes one global secondary index per call, so CloudFormation
fails (and rolls back) an update that adds two indexes to a table; and an index's key schema and
projection cannot be updated at all. Synth compares the indexes it builds with those the stack
already has and refuses such a change, saying how to stage it.

What the stack has: ``infra/released_indexes.json``, the indexes of the last release's template
per table (the release process rewrites it: ``python -m infra.indexes --write``), unless the
context's ``deployed_indexes`` names them (a stack deployed from an older release, or a staged
upgrade): ``-c deployed_indexes='{"Ledger": ["OpenRuns"]}'``. What synth builds: every index
the code needs, unless the context's ``index_rollout`` names the ones to build in this step:
``-c index_rollout='{"Ledger": ["OpenRuns", "TenantRuns"]}'``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infra.constants import ROOT

RECORD = ROOT / "infra" / "released_indexes.json"
#: context keys (``-c key='<json>'`` on the CDK CLI, or cdk.json's context)
DEPLOYED_CONTEXT = "deployed_indexes"
ROLLOUT_CONTEXT = "index_rollout"

#: a ``GlobalSecondaryIndexes`` entry of an ``AWS::DynamoDB::Table``
Index = dict[str, Any]


class IndexUpdateError(ValueError):
    """A template change CloudFormation cannot apply to a table's indexes in one update."""


def released(path: Path = RECORD) -> dict[str, dict[str, Index]]:
    """The last release's indexes: table construct id -> index name -> definition."""
    record = json.loads(path.read_text())
    tables = record.get("tables")
    if not isinstance(tables, dict):
        raise IndexUpdateError(f"{path.name} has no 'tables' object")
    return tables


def names_from_context(value: Any, key: str, tables: Sequence[str]) -> dict[str, list[str]]:
    """A ``{table: [index name, ...]}`` context value (the CLI passes it as a JSON string)."""
    if value is None:
        return {}
    example = f'-c {key}=\'{{"Ledger": ["OpenRuns"]}}\''
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise IndexUpdateError(f"context {key} is not JSON ({e}); e.g. {example}") from None
    if not isinstance(value, dict):
        raise IndexUpdateError(f"context {key} must map a table to index names, e.g. {example}")
    parsed: dict[str, list[str]] = {}
    for table, names in value.items():
        if table not in tables:
            raise IndexUpdateError(
                f"context {key} names table {table!r}; the tables are {', '.join(tables)}"
            )
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise IndexUpdateError(
                f"context {key}.{table} must be a list of index names, e.g. {example}"
            )
        parsed[table] = list(names)
    return parsed


def _canonical(index: Index) -> str:
    projection = dict(index.get("Projection", {}))
    if "NonKeyAttributes" in projection:
        projection["NonKeyAttributes"] = sorted(projection["NonKeyAttributes"])
    return json.dumps({"KeySchema": index["KeySchema"], "Projection": projection}, sort_keys=True)


def plan(
    table: str,
    wanted: Sequence[Index],
    *,
    record: Mapping[str, Mapping[str, Index]],
    deployed: Mapping[str, Sequence[str]],
    rollout: Mapping[str, Sequence[str]],
) -> list[Index]:
    """The indexes to build on ``table`` in this update, or :class:`IndexUpdateError` naming
    what CloudFormation would refuse and how to stage it."""
    released_table = record.get(table, {})
    build = list(wanted)
    if table in rollout:
        # a step may keep an index the code no longer defines (deleted in a later step)
        known = {**released_table, **{index["IndexName"]: index for index in wanted}}
        unknown = [n for n in rollout[table] if n not in known]
        if unknown:
            raise IndexUpdateError(
                f"context {ROLLOUT_CONTEXT}.{table} names {', '.join(unknown)}, which neither "
                f"this code nor the release record defines; they define {', '.join(known)}"
            )
        build = [known[name] for name in dict.fromkeys(rollout[table])]
    before = list(deployed[table]) if table in deployed else list(released_table)
    source = (
        f"context {DEPLOYED_CONTEXT}" if table in deployed else f"infra/{RECORD.name} (released)"
    )
    built = [index["IndexName"] for index in build]

    changed = [
        index["IndexName"]
        for index in build
        if index["IndexName"] in before
        and index["IndexName"] in released_table
        and _canonical(index) != _canonical(released_table[index["IndexName"]])
    ]
    if changed:
        raise IndexUpdateError(
            f"{table}: index {', '.join(changed)} changes its key schema or projection, which "
            "CloudFormation cannot update in place. Stage it: define the new shape under a new "
            "index name and deploy (one index created), move the code to it, then remove the "
            "old index in a later deploy (one index deleted)"
        )
    created = [n for n in built if n not in before]
    deleted = [n for n in before if n not in built]
    if len(created) + len(deleted) > 1:
        first = _first_step(before, created, deleted)
        step = f"-c {ROLLOUT_CONTEXT}='{json.dumps({table: first})}'"
        if table in deployed:
            step = f"-c {DEPLOYED_CONTEXT}='{json.dumps({table: before})}' {step}"
        changes = [f"create {n}" for n in created] + [f"delete {n}" for n in deleted]
        raise IndexUpdateError(
            f"{table}: this update would {', '.join(changes)} at once on a table that has "
            f"{', '.join(before) or 'no index'} ({source}); CloudFormation creates or deletes "
            "one global secondary index per table in an update, and the update fails. Stage "
            f"it, one deploy per index: first deploy with {step}, then deploy again with "
            f"-c {DEPLOYED_CONTEXT}='{json.dumps({table: first})}', and so on until no step is "
            "refused (docs/tutorials/first-deployment.md, 'Upgrading a deployed stack')"
        )
    return build


def _first_step(before: Sequence[str], created: Sequence[str], deleted: Sequence[str]) -> list[str]:
    """The indexes after the first change: the first deletion if any, else the first creation."""
    if deleted:
        return [n for n in before if n != deleted[0]]
    return [*before, created[0]]


def record_of(wanted: Mapping[str, Sequence[Index]]) -> dict[str, Any]:
    """The release record of these indexes (what ``--write`` stores)."""
    return {
        "comment": "The global secondary indexes of the last release's template, per table "
        "(infra/indexes.py). Rewritten when a release is cut: python -m infra.indexes --write",
        "tables": {
            table: {index["IndexName"]: index for index in indexes}
            for table, indexes in wanted.items()
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    from infra.tables import wanted_indexes

    parser = argparse.ArgumentParser(
        prog="python -m infra.indexes",
        description="Print (or --write) the record of this code's global secondary indexes: "
        "run it when a release is cut, so the next release's synth compares against it.",
    )
    parser.add_argument("--write", action="store_true", help=f"write infra/{RECORD.name}")
    args = parser.parse_args(argv)
    text = json.dumps(record_of(wanted_indexes()), indent=2) + "\n"
    if args.write:
        RECORD.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
