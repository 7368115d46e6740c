"""The calculator tool's arithmetic, the tool protocol, and the registry cdk.json declares:
validated at synth, every error naming the key at fault (tools.<name>.<field>)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from infra.config import ConfigError, load_config
from infra.constants import ROOT
from infra.context import cdk_json_context
from swarm.adapters.tools import ToolRegistry, grants_from_json
from swarm.core.calculator import MAX_DIGITS, CalculatorError, evaluate
from swarm.core.tool_protocol import ToolEventError, parse_event

ARN = "arn:aws:lambda:us-east-1:123456789012:function:their-tool"


# --- calculator -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 * (3 + 4)", 14),
        ("7 // 2 + 7 % 2", 4),
        ("-2 ** 2", -4),
        ("2 ** -1", 0.5),
        ("sqrt(16) + abs(-3)", 7.0),
        ("max(1, 5, 3) - min(4, 2)", 3),
        ("round(pi, 2)", 3.14),
        ("1e3 / 4", 250.0),
    ],
)
def test_the_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert evaluate(expression) == pytest.approx(value)


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("__import__('os').system('true')", "unknown function"),
        ("(1).__class__", "not supported"),
        ("open('/etc/passwd')", "unknown function"),
        ("x + 1", "unknown name 'x'"),
        ("'a' * 3", "not a number"),
        ("9 ** 9 ** 9", "exponent"),
        ("10 ** 400", f"more than {MAX_DIGITS} digits"),
        ("1 / 0", "division by zero"),
        ("sqrt(-1)", "math error"),
        ("1 +", "not valid arithmetic"),
        ("", "non-empty"),
        ("1" * 501, "more than 500"),
        ("True + 1", "not a number"),
        ("[1, 2]", "not supported"),
        ("lambda: 1", "not supported"),
        ("exp(1000)", "math error"),
    ],
)
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression: str, says: str) -> None:
    with pytest.raises(CalculatorError, match=None) as raised:
        evaluate(expression)
    assert says in str(raised.value)


def test_a_large_but_bounded_power_is_exact() -> None:
    assert evaluate("2 ** 900") == 2**900
    assert math.isclose(float(evaluate("2.5 ** 10")), 2.5**10)


# --- the protocol -----------------------------------------------------------------------------
def _event(**overrides: Any) -> dict[str, Any]:
    event = {
        "tool": "calculator",
        "input": {"expression": "1+1"},
        "idempotency_key": "b-1/u-1/tooluse_1",
        "tenant": "acme",
        "batch": "b-1",
        "unit": "u-1",
    }
    return {**event, **overrides}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tool": "rm"}, "tool:"),
        ({"input": [1]}, "input:"),
        ({"input": "1+1"}, "input:"),
        ({"tenant": "a/b"}, "tenant:"),
        ({"tenant": None}, "tenant:"),
        ({"idempotency_key": ""}, "idempotency_key:"),
    ],
)
def test_a_malformed_event_is_refused_naming_the_field(
    overrides: dict[str, Any], field: str
) -> None:
    with pytest.raises(ToolEventError) as raised:
        parse_event(_event(**overrides), {"calculator": {}})
    assert str(raised.value).startswith(field)


# --- the registry in cdk.json -----------------------------------------------------------------
def _config(tools: Any = None, defaults: Any = None, overrides: Any = None) -> Any:
    context = cdk_json_context()
    if tools is not None:
        context["tools"] = tools
    tenants = json.loads(json.dumps(context["tenants"]))
    if defaults is not None:
        tenants["defaults"]["tools"] = defaults
    if overrides is not None:
        tenants["overrides"] = overrides
    context["tenants"] = tenants
    return load_config(context)


def test_the_shipped_registry_resolves_each_tool_from_its_source() -> None:
    config = load_config(cdk_json_context())
    tools = config.resolved_tools()
    shipped = {"calculator", "notes_read", "notes_write", "object_read"}
    declared = json.loads((ROOT / "functions/tools/bfcl.tools.json").read_text())
    assert set(tools) == shipped | set(declared)  # and BFCL's toolset
    assert config.tool_sources() == {
        "bfcl": sorted(declared),
        "calculator": ["calculator"],
        "notes": ["notes_read", "notes_write"],
        "object_read": ["object_read"],
    }
    assert tools["notes_write"].effect == "write"
    assert tools["notes_read"].effect == "read"
    assert tools["calculator"].input_schema["required"] == ["expression"]
    assert set(config.tenants.defaults.tools) == shipped | {"bfcl"}
    assert set(grants_from_json(config.tool_grants_value()).allowed("any")) == set(tools)


def test_the_registry_json_round_trips_to_the_runtime_registry() -> None:
    config = _config(
        tools={
            "calculator": {"source": "calculator", "timeout_seconds": 3},
            "theirs": {
                "function_arn": ARN,
                "description": "Their tool",
                "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
                "effect": "write",
            },
        },
        defaults=["calculator"],
        overrides={"acme": {"tools": ["calculator", "theirs"]}},
    )
    arns = {"calculator": "arn:aws:lambda:us-east-1:123456789012:function:calc"}
    registry = ToolRegistry.from_json(config.tool_registry_value(arns))
    assert registry.get("theirs") is not None
    entry = registry.get("calculator")
    assert entry is not None
    assert (entry.function_arn, entry.timeout_s, entry.effect) == (arns["calculator"], 3, "read")
    assert registry.get("theirs").function_arn == ARN  # type: ignore[union-attr]
    assert registry.allowed("someone") == {"calculator"}
    assert registry.allowed("acme") == {"calculator", "theirs"}
    assert registry.specs()["calculator"].tool_spec()["toolSpec"]["name"] == "calculator"
    grants = grants_from_json(config.tool_grants_value())
    assert grants.names == {"calculator", "theirs"}
    assert grants.allowed("acme") == {"calculator", "theirs"}
    assert grants.allowed("other") == {"calculator"}


@pytest.mark.parametrize(
    ("tools", "defaults", "overrides", "key"),
    [
        (
            {"bad name!": {"source": "calculator"}},
            [],
            None,
            "context key 'tools.bad name!': 'bad name!' is not a tool name",
        ),
        ({"x" * 65: {"source": "calculator"}}, [], None, f"context key 'tools.{'x' * 65}': "),
        ({"c": {}}, [], None, "context key 'tools.c': give exactly one of source"),
        (
            {"c": {"source": "calculator", "function_arn": ARN}},
            [],
            None,
            "context key 'tools.c': give exactly one of source",
        ),
        ({"c": {"source": "nosuch"}}, [], None, "context key 'tools.c.source': there is no module"),
        ({"c": {"source": "../api"}}, [], None, "tools.c.source"),
        ({"c": {"function_arn": "arn:aws:s3:::bucket"}}, [], None, "tools.c.function_arn"),
        ({"c": {"function_arn": ARN}}, [], None, "context key 'tools.c.description': required"),
        (
            {"c": {"function_arn": ARN, "description": "d"}},
            [],
            None,
            "context key 'tools.c.input_schema': required",
        ),
        (
            {"c": {"function_arn": ARN, "description": "d", "input_schema": {"type": "string"}}},
            [],
            None,
            'context key \'tools.c.input_schema\': must have "type": "object"',
        ),
        (
            {
                "c": {
                    "function_arn": ARN,
                    "description": "d",
                    "input_schema": {"type": "object", "required": ["q"]},
                }
            },
            [],
            None,
            "context key 'tools.c.input_schema': \"required\" names",
        ),
        (
            {"c": {"function_arn": ARN, "description": "d", "input_schema": {"type": "object"}}},
            [],
            None,
            "context key 'tools.c.effect': required",
        ),
        ({"c": {"source": "calculator", "effect": "delete"}}, [], None, "tools.c.effect"),
        (
            {"calculator": {"source": "calculator", "timeout_seconds": 0}},
            [],
            None,
            "tools.calculator.timeout_seconds",
        ),
        (
            {"calculator": {"source": "calculator", "timeout_seconds": 301}},
            [],
            None,
            "tools.calculator.timeout_seconds",
        ),
        (
            {"calculator": {"source": "calculator", "colour": 1}},
            [],
            None,
            "tools.calculator.colour",
        ),
        # a source that declares no tool of that name: its description must be given
        (
            {"sum": {"source": "calculator"}},
            [],
            None,
            "context key 'tools.sum.description': required",
        ),
        (
            {"calculator": {"source": "calculator"}},
            ["nope"],
            None,
            "context key 'tenants.defaults.tools[0]': 'nope'",
        ),
        (
            {"calculator": {"source": "calculator"}},
            ["calculator"],
            {"acme": {"tools": ["calculator", "nope"]}},
            "context key 'tenants.overrides.acme.tools[1]': 'nope'",
        ),
        (
            {"calculator": {"source": "calculator"}},
            ["calculator", "calculator"],
            None,
            "context key 'tenants.defaults.tools': lists a tool twice",
        ),
        (
            {
                f"t{i}": {
                    "function_arn": ARN,
                    "description": "d" * 500,
                    "input_schema": {"type": "object"},
                    "effect": "read",
                }
                for i in range(5)
            },
            [],
            None,
            "context key 'tools': the registry takes up to",
        ),
    ],
)
def test_a_bad_registry_fails_synth_naming_the_key(
    tools: Any, defaults: Any, overrides: Any, key: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        _config(tools, defaults, overrides)
    assert key in str(raised.value)


def test_a_function_arn_with_a_qualifier_and_a_source_override_are_accepted() -> None:
    config = _config(
        tools={
            "theirs": {
                "function_arn": ARN + ":live",
                "description": "Their tool",
                "input_schema": {"type": "object"},
                "effect": "read",
                "timeout_seconds": 300,
            },
            "calculator": {"source": "calculator", "description": "Adds things up"},
        },
        defaults=["theirs"],
    )
    tools = config.resolved_tools()
    assert tools["theirs"].function_arn == ARN + ":live"
    assert tools["calculator"].description == "Adds things up"
    assert tools["calculator"].input_schema["type"] == "object"  # from the module
    assert config.tool_sources() == {"calculator": ["calculator"]}


# --- the wiring ---------------------------------------------------------------------------------
def test_the_worker_reads_the_registry_and_the_api_the_grants_from_their_environment() -> None:
    from swarm import contract as env
    from swarm.settings import Settings, SettingsError
    from swarm.wiring import Wiring
    from tests.unit.test_settings import environment

    config = _config()
    arns = {s: f"arn:aws:lambda:us-east-1:123456789012:function:{s}" for s in config.tool_sources()}
    worker_env = {**environment("worker"), env.TOOL_REGISTRY: config.tool_registry_value(arns)}
    worker = Wiring(Settings.from_env(worker_env), lambda service: object())
    registry = worker.tool_registry()
    shipped = {"calculator", "notes_read", "notes_write", "object_read"}
    assert shipped < set(registry.tools) and len(registry.tools) == len(shipped) + 128  # BFCL's
    assert registry.get("notes_write").function_arn == arns["notes"]  # type: ignore[union-attr]
    assert worker.tool_executor().registry == registry
    api_env = {**environment("api"), env.TOOL_GRANTS: config.tool_grants_value()}
    api = Wiring(Settings.from_env(api_env), lambda service: object())
    assert api.tool_grants().allowed("anyone") == set(registry.tools)
    with pytest.raises(SettingsError, match="the api function has no TOOL_REGISTRY"):
        api.tool_registry()
    # no tools deployed (empty variable): an empty registry, not an error
    bare = Wiring(Settings.from_env(environment("worker")), lambda service: object())
    assert bare.tool_registry().tools == {}


def test_a_toolset_registers_every_tool_its_source_declares_and_grants_them_by_its_name() -> None:
    config = _config(
        tools={
            "calculator": {"source": "calculator"},
            "bfcl": {"source": "bfcl", "toolset": True, "timeout_seconds": 4},
        },
        defaults=["calculator"],
        overrides={"acme": {"tools": ["bfcl", "calculator"]}},
    )
    declared = json.loads((ROOT / "functions/tools/bfcl.tools.json").read_text())
    tools = config.resolved_tools()
    assert set(tools) == {"calculator", *declared}
    assert tools["mkdir"].effect == "write" and tools["mkdir"].timeout_seconds == 4
    assert config.tool_sources() == {"bfcl": sorted(declared), "calculator": ["calculator"]}
    # the API's and the worker's variables hold the toolset by its source, not its 128 specs
    grants_text = config.tool_grants_value()
    registry_text = config.tool_registry_value({"bfcl": "arn-b", "calculator": "arn-c"})
    assert "mkdir" not in grants_text and "mkdir" not in registry_text
    grants = grants_from_json(grants_text)
    assert grants.allowed("acme") == {*declared, "calculator"}
    assert grants.allowed("other") == {"calculator"}
    registry = ToolRegistry.from_json(registry_text)
    assert registry.allowed("acme") == {*declared, "calculator"}
    mkdir = registry.get("mkdir")
    assert mkdir is not None and mkdir.function_arn == "arn-b" and mkdir.timeout_s == 4
    assert mkdir.tool.input_schema == declared["mkdir"]["input_schema"]


def test_a_source_tools_spec_reaches_the_worker_from_the_asset_with_what_cdk_json_changes() -> None:
    # Given a toolset of a source declaring its tools as a literal, and a source tool whose
    # description cdk.json replaces
    config = _config(
        tools={
            "notes": {"source": "notes", "toolset": True},
            "calculator": {"source": "calculator", "description": "Adds up, exactly."},
        },
        defaults=["notes", "calculator"],
    )
    text = config.tool_registry_value({"notes": "arn-n", "calculator": "arn-c"})
    # Then the variable holds no declared spec, only the change
    assert "input_schema" not in text and "Adds up, exactly." in text
    registry = ToolRegistry.from_json(text)
    assert set(registry.tools) == {"notes_read", "notes_write", "notes_publish", "calculator"}
    calculator = registry.get("calculator")
    assert calculator is not None and calculator.tool.description == "Adds up, exactly."
    assert calculator.tool.input_schema == config.resolved_tools()["calculator"].input_schema
    notes_write = registry.get("notes_write")
    assert notes_write is not None and notes_write.effect == "write"
    assert notes_write.function_arn == "arn-n"


@pytest.mark.parametrize(
    ("tools", "defaults", "key"),
    [
        (
            {"bfcl": {"source": "bfcl", "toolset": True}, "mkdir": {"source": "bfcl"}},
            [],
            "context key 'tools.mkdir': registers the tool 'mkdir', which another entry",
        ),
        (
            {"bfcl": {"source": "bfcl", "toolset": True, "description": "d"}},
            [],
            "context key 'tools.bfcl.description': a toolset's tools each take theirs",
        ),
        (
            {"notes": {"function_arn": ARN, "toolset": True}},
            [],
            "context key 'tools.notes.toolset': a toolset needs a source",
        ),
        (
            {"bfcl": {"source": "bfcl", "toolset": True}},
            ["bfcl", "mkdir"],
            "context key 'tenants.defaults.tools': lists a tool twice",
        ),
    ],
)
def test_a_bad_toolset_fails_synth_naming_the_key(tools: Any, defaults: Any, key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _config(tools, defaults)
    assert key in str(raised.value)
