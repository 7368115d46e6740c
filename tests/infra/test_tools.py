"""The tool registry's functions: one function and one role per source, each role holding only
what its tools call; the worker may invoke exactly the registered functions; the registry
reaches the worker and the API within Lambda's 4 KB of variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.config import LONGEST_FUNCTION_ARN, ConfigError
from infra.context import cdk_json_context
from swarm import contract as env
from swarm.adapters.tools import ToolRegistry, grants_from_json
from tests.infra.conftest import Synthesized, synthesize
from tests.infra.helpers import as_list, statements_of_role
from tests.infra.test_permissions import _COMMON, Table, granted

THEIRS = "arn:aws:lambda:us-east-1:123456789012:function:their-tool"

#: tool source -> resource -> actions, a comment per action naming the code that calls it
EXPECTED: dict[str, Table] = {
    # swarm.core.calculator: no AWS call at all
    "calculator": {**_COMMON},
    "notes": {
        **_COMMON,
        # DynamoDBNotes.read (GetItem, consistent), .names (Query of the tenant's partition),
        # .write (TransactWriteItems of two Puts: PutItem to IAM) and its first outcome (GetItem)
        "notes table": frozenset({"dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem"}),
    },
    # TenantObjects.read: GetObject of manifests/uploads/<tenant>/<key> (a Range request)
    "object_read": {**_COMMON, "manifests/uploads/*": frozenset({"s3:GetObject"})},
    # DynamoDBJournals.read (Query of the unit's journal) and .append (a conditional PutItem)
    "bfcl": {**_COMMON, "journals table": frozenset({"dynamodb:Query", "dynamodb:PutItem"})},
}


def _functions(synth: Synthesized) -> dict[str, dict[str, Any]]:
    return {v["Properties"]["Handler"]: v for v in synth.of_type("AWS::Lambda::Function").values()}


def test_one_function_and_one_role_per_tool_source(synth: Synthesized) -> None:
    tools = synth.stack.tools.functions
    # notes_read/write share one, and BFCL's 128 tools one
    assert set(tools) == {"bfcl", "calculator", "notes", "object_read"}
    roles = {synth.logical_id(t.role) for t in tools.values()}
    assert len(roles) == len(tools)
    others = {synth.logical_id(f.role) for f in synth.stack.functions.values()}
    assert not roles & others
    handlers = _functions(synth)
    worker = handlers["functions.worker.handler"]["Properties"]
    for source in tools:
        props = handlers[f"functions.tools.{source}.handler"]["Properties"]
        for same in ("Runtime", "Architectures", "TracingConfig"):
            assert props[same] == worker[same], (source, same)
        logging = {k: v for k, v in props["LoggingConfig"].items() if k != "LogGroup"}
        assert logging == {k: v for k, v in worker["LoggingConfig"].items() if k != "LogGroup"}
        assert props["LoggingConfig"]["LogGroup"] == {
            "Ref": synth.logical_id(tools[source].log_group)
        }
        assert props["Role"] == {"Fn::GetAtt": [synth.logical_id(tools[source].role), "Arn"]}
        variables = props["Environment"]["Variables"]
        assert variables[env.TOOL_SOURCE] == source
        assert env.LEDGER_TABLE_NAME not in variables and env.GOVERNOR_TABLE_NAME not in variables


@pytest.mark.parametrize("source", sorted(EXPECTED))
def test_each_tool_role_holds_only_what_its_tools_call(synth: Synthesized, source: str) -> None:
    assert granted(synth, f"tool:{source}") == EXPECTED[source]


def test_the_worker_may_invoke_exactly_the_registered_functions(synth: Synthesized) -> None:
    invokes = [
        s
        for s in statements_of_role(synth, synth.stack.workers.worker.role)
        if "lambda:InvokeFunction" in as_list(s["Action"])
    ]
    assert len(invokes) == 1 and as_list(invokes[0]["Action"]) == ["lambda:InvokeFunction"]
    expected = [
        {"Fn::GetAtt": [synth.logical_id(t.function), "Arn"]}
        for t in synth.stack.tools.functions.values()
    ]
    assert sorted(map(json.dumps, as_list(invokes[0]["Resource"]))) == sorted(
        map(json.dumps, expected)
    )
    # no other role may invoke a tool
    for name, function in synth.stack.functions.items():
        if function is synth.stack.workers.worker:
            continue
        actions = {
            a for s in statements_of_role(synth, function.role) for a in as_list(s["Action"])
        }
        assert "lambda:InvokeFunction" not in actions, name


def _resolve(value: Any, synth: Synthesized) -> str:
    """The registry's JSON with each function ARN at its longest (Fn::Join of GetAtts)."""
    if isinstance(value, str):
        return value
    parts = value["Fn::Join"][1]
    return "".join(p if isinstance(p, str) else "a" * LONGEST_FUNCTION_ARN for p in parts)


def test_the_registry_reaches_the_worker_and_the_api_within_4_kb(synth: Synthesized) -> None:
    handlers = _functions(synth)
    worker = handlers["functions.worker.handler"]["Properties"]["Environment"]["Variables"]
    registry = ToolRegistry.from_json(_resolve(worker[env.TOOL_REGISTRY], synth))
    shipped = {"calculator", "notes_read", "notes_write", "object_read"}
    # BFCL's toolset: its 128 specs come from the asset's declarations, not the 4 KB
    assert shipped < set(registry.tools) and len(registry.tools) == len(shipped) + 128
    assert registry.allowed("demo") == set(registry.tools)
    api = handlers["functions.api.handler"]["Properties"]["Environment"]["Variables"]
    assert grants_from_json(api[env.TOOL_GRANTS]).names == set(registry.tools)
    assert env.TOOL_REGISTRY not in api
    for name, variables in (("worker", worker), ("api", api)):
        size = sum(
            len(k) + len(_resolve(v, synth) if not isinstance(v, str) else v)
            if isinstance(v, str) or "Fn::Join" in v
            else len(k) + LONGEST_FUNCTION_ARN
            for k, v in variables.items()
        )
        assert size <= 4096, (name, size)


def test_a_function_whose_environment_would_pass_4_kb_is_refused_at_synth(tmp_path: Path) -> None:
    """Lambda refuses a function whose variables take more than 4 KB, and CloudFormation finds
    out mid-update: synth counts each function's at its longest and refuses it, naming what
    fills it. Here: eight models beside a registry near its own cap."""
    context = cdk_json_context()
    context["tools"] = {
        **context["tools"],
        **{
            f"theirs_{i}": {
                "function_arn": f"{THEIRS}-{i}",
                "description": "d" * 500,
                "input_schema": {"type": "object"},
                "effect": "read",
            }
            for i in range(2)
        },
    }
    catalog = {
        f"model-{i}": {"model_id": f"us.anthropic.claude-sonnet-4-{i:08d}-v1:0", "tpm": 100_000}
        for i in range(8)
    }
    context["models"] = {"default": "model-0", "catalog": catalog}
    with pytest.raises(ConfigError) as error:
        synthesize(tmp_path, context, nag=False)
    message = str(error.value)
    assert message.startswith("the worker function's environment would take up to "), message
    assert "more than Lambda's 4,096" in message
    assert "TOOL_REGISTRY" in message and "MODELS" in message and "models.catalog" in message
    # the same eight models beside the shipped registry fit
    context["tools"] = cdk_json_context()["tools"]
    synthesize(tmp_path / "fits", context, nag=False)


def test_a_function_arn_tool_is_invocable_and_a_registry_without_sources_builds_none(
    tmp_path: Path,
) -> None:
    context = cdk_json_context()
    context["tools"] = {
        "theirs": {
            "function_arn": THEIRS,
            "description": "Their tool",
            "input_schema": {"type": "object"},
            "effect": "read",
        }
    }
    context["tenants"] = {
        **context["tenants"],
        "defaults": {**context["tenants"]["defaults"], "tools": ["theirs"]},
    }
    synth = synthesize(tmp_path, context, nag=True)
    assert synth.stack.tools.functions == {}
    assert synth.stack.tools.notes_table is None
    invokes = [
        s
        for s in statements_of_role(synth, synth.stack.workers.worker.role)
        if "lambda:InvokeFunction" in as_list(s["Action"])
    ]
    assert [as_list(s["Resource"]) for s in invokes] == [[THEIRS]]
    worker = _functions(synth)["functions.worker.handler"]["Properties"]["Environment"]
    registry = ToolRegistry.from_json(worker["Variables"][env.TOOL_REGISTRY])
    assert registry.get("theirs").function_arn == THEIRS  # type: ignore[union-attr]
