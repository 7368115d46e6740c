"""What the local stack had to change in the template that is a defect, not a moto limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarm.local.deploy import LocalOptions, governor_table_ids, synthesize


@pytest.mark.xfail(
    strict=True,
    reason="infra/tables.py creates the governor table without the sort key 'sk' that "
    "swarm/adapters/dynamodb_governor.py uses; the local stack adds it (docs/local.md). "
    "When infra is fixed this passes: delete this marker and fix_governor_key_schema.",
)
def test_the_governor_table_has_the_key_schema_the_adapter_uses(tmp_path: Path) -> None:
    template = json.loads(synthesize(tmp_path / "cdk.out", LocalOptions()).read_text())
    for logical in governor_table_ids(template):
        keys = template["Resources"][logical]["Properties"]["KeySchema"]
        assert {"AttributeName": "sk", "KeyType": "RANGE"} in keys, logical
