"""cdk.json's human gates (docs/agents.md, "Human gates"): ``approvals.timeout_hours``,
``approvals.deciders`` and a tool's ``approval``, each refused naming its key, and what
reaches the functions."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.config import ConfigError, load_config
from infra.context import cdk_json_context
from tests.infra.test_config import _context

_TOOLS = cdk_json_context()["tools"]


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        ({"approvals": {"timeout_hours": 0}}, "approvals.timeout_hours", "greater than or equal"),
        ({"approvals": {"timeout_hours": 400}}, "approvals.timeout_hours", "less than or equal"),
        (
            {"approvals": {"deciders": ["swarm-tenant-acme"]}},
            "approvals.deciders[0]",
            "not an operator role",
        ),
        (
            {"approvals": {"deciders": ["swarm-operator-ok", "no such role!"]}},
            "approvals.deciders[1]",
            "neither an IAM role name nor a role ARN",
        ),
        (
            {"tools": {**_TOOLS, "notes_write": {**_TOOLS["notes_write"], "approval": "maybe"}}},
            "tools.notes_write.approval",
            "'required' or 'none'",
        ),
        (
            {"tools": {**_TOOLS, "bfcl": {**_TOOLS["bfcl"], "approval": "required"}}},
            "tools.bfcl.approval",
            "a toolset is not gated as a whole",
        ),
    ],
)
def test_bad_approvals_fail_synth_naming_the_key(
    overrides: dict[str, Any], key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(_context(**overrides))
    message = str(error.value)
    assert f"'{key}'" in message and says in message, message


def test_approvals_reach_the_functions_and_a_gated_tool_the_workers_registry() -> None:
    arn = "arn:aws:iam::123456789012:role/ops/swarm-operator-security"
    tools = {**_TOOLS, "notes_write": {**_TOOLS["notes_write"], "approval": "required"}}
    config = load_config(
        _context(
            approvals={"timeout_hours": 2, "deciders": ["swarm-operator-approver", arn]},
            tools=tools,
        )
    )
    assert config.approvals.decider_names() == [
        "swarm-operator-approver",
        "swarm-operator-security",
    ]
    registry = json.loads(config.tool_registry_value(dict.fromkeys(config.tool_sources(), "a")))
    assert registry["tools"]["notes_write"]["approval"] == "required"
    assert "approval" not in registry["tools"]["notes_read"]
    # the shipped cdk.json: a day, the batch's tenant decides
    shipped = load_config(cdk_json_context())
    assert shipped.approvals.timeout_hours == 24 and shipped.approvals.deciders == ()
