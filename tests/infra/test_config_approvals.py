"""cdk.json's human gates (docs/agents.md, "Human gates"): ``approvals.timeout_hours``,
``approvals.deciders`` and a tool's ``approval``, each refused naming its key, and what
reaches the functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.config import ConfigError, load_config
from infra.context import cdk_json_context
from tests.infra.conftest import synthesize
from tests.infra.test_config import _context

_TOOLS = cdk_json_context()["tools"]


def _gated(name: str, deciders: list[str]) -> dict[str, Any]:
    """cdk.json's tools with ``name`` gated, decided by ``deciders``."""
    return {**_TOOLS, name: {**_TOOLS[name], "approval": {"deciders": deciders}}}


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
            {"approvals": {"deciders": ["swarm-operator-a,b"]}},
            "approvals.deciders[0]",
            "may not contain ',', '=' or ';'",
        ),
        (
            {"tools": {**_TOOLS, "notes_write": {**_TOOLS["notes_write"], "approval": "maybe"}}},
            "tools.notes_write.approval",
            'must be "required", "none" or {"deciders"',
        ),
        (
            {"tools": {**_TOOLS, "bfcl": {**_TOOLS["bfcl"], "approval": "required"}}},
            "tools.bfcl.approval",
            "a toolset is not gated as a whole",
        ),
        (
            {"tools": _gated("notes_write", ["swarm-operator-ok", "swarm-tenant-acme"])},
            "tools.notes_write.approval.deciders[1]",
            "not an operator role",
        ),
        (
            {"tools": _gated("notes_write", ["no such role!"])},
            "tools.notes_write.approval.deciders[0]",
            "neither an IAM role name nor a role ARN",
        ),
        (
            {"tools": _gated("bfcl", ["swarm-operator-ok"])},
            "tools.bfcl.approval",
            "a toolset is not gated as a whole",
        ),
        (
            {"tools": {**_TOOLS, "notes_write": {"source": "notes", "approval": {"who": []}}}},
            "tools.notes_write.approval",
            "'who' is not a key of it",
        ),
        (
            {
                "tools": {
                    **_TOOLS,
                    "remote": {
                        "mcp": {"url": "https://mcp.example.com/mcp"},
                        "approval": {"deciders": ["swarm-operator-ok"]},
                    },
                }
            },
            "tools.remote.approval.deciders",
            "must list its tools (mcp.tools)",
        ),
        (
            {"tools": _gated("notes_write", [f"swarm-operator-{'x' * 47}{i}" for i in range(8)])},
            "tools.*.approval.deciders",
            "more than 512",
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


def test_a_tools_own_deciders_reach_the_api_and_gate_it_in_the_workers_registry() -> None:
    arn = "arn:aws:iam::123456789012:role/ops/swarm-operator-security"
    tools = {
        **_gated("notes_write", [arn, "swarm-operator-legal"]),
        "notes_read": {**_TOOLS["notes_read"], "approval": {"deciders": []}},  # as "required"
        "calculator": {**_TOOLS["calculator"], "approval": {"deciders": ["swarm-operator-legal"]}},
        "remote": {
            "mcp": {"url": "https://mcp.example.com/mcp", "tools": ["pay", "refund"]},
            "approval": {"deciders": ["swarm-operator-legal", "swarm-operator-security"]},
        },
    }
    config = load_config(_context(approvals={"deciders": ["swarm-operator-approver"]}, tools=tools))
    # each tool naming deciders (an mcp entry: each listed tool), by role name
    assert config.tool_deciders() == {
        "calculator": ["swarm-operator-legal"],
        "notes_write": ["swarm-operator-legal", "swarm-operator-security"],
        "pay": ["swarm-operator-legal", "swarm-operator-security"],
        "refund": ["swarm-operator-legal", "swarm-operator-security"],
    }
    # compact: tools sharing their roles grouped, a tool naming none left out
    assert config.tool_deciders_value() == (
        "calculator=swarm-operator-legal;"
        "notes_write,pay,refund=swarm-operator-legal,swarm-operator-security"
    )
    # the worker only learns that the calls wait (whoever decides them)
    registry = json.loads(config.tool_registry_value(dict.fromkeys(config.tool_sources(), "a")))
    assert registry["tools"]["notes_write"]["approval"] == "required"
    assert registry["tools"]["notes_read"]["approval"] == "required"
    assert registry["mcp"]["remote"]["approval"] == "required"
    assert "approval" not in registry["tools"]["object_read"]
    # the shipped cdk.json names none: an empty variable
    assert load_config(cdk_json_context()).tool_deciders_value() == ""


def test_only_the_api_function_learns_a_tools_deciders(tmp_path: Path) -> None:
    tools = _gated("notes_write", ["arn:aws:iam::123456789012:role/ops/swarm-operator-security"])
    synthesized = synthesize(tmp_path, _context(tools=tools), nag=False)
    stack = synthesized.stack

    def variables(function: Any) -> dict[str, Any]:
        props = synthesized.resources[synthesized.logical_id(function)]["Properties"]
        found: dict[str, Any] = props["Environment"]["Variables"]
        return found

    api = variables(stack.control_plane.lambda_functions["api"])
    assert api["APPROVAL_TOOL_DECIDERS"] == "notes_write=swarm-operator-security"
    assert api["APPROVAL_DECIDERS"] == ""  # the other gated calls: the tenant's
    # the worker only learns that the calls wait (its registry: the test above), not who
    # decides them
    assert "APPROVAL_TOOL_DECIDERS" not in variables(stack.workers.worker.function)


def test_deciders_that_do_not_fit_the_api_beside_the_tenants_fail_synth_naming_both(
    tmp_path: Path,
) -> None:
    tools = _gated("notes_write", [f"swarm-operator-{'x' * 47}{i}" for i in range(7)])
    tenants = cdk_json_context()["tenants"]
    many = {f"tenant-{'y' * 30}-{i}": {"max_queued_units": 5000} for i in range(12)}
    context = _context(tools=tools, tenants={**tenants, "overrides": many})
    with pytest.raises(ConfigError) as error:  # each fits its own cap, not both together
        synthesize(tmp_path, context, nag=False)
    message = str(error.value)
    assert "api function's environment" in message, message
    assert "APPROVAL_TOOL_DECIDERS 459 bytes (from tools.*.approval.deciders)" in message
    assert "TENANT_LIMITS" in message and "approval.deciders" in message.rsplit(";", 1)[1]
