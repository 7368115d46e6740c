"""docs/openapi.json is generated from swarm/api, is valid OpenAPI 3, and matches the handler."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate

from functions.api import app
from swarm.api.models import (
    BATCH_ID_PATTERN,
    MAX_BUDGET_TOKENS,
    MAX_CONTENT_BLOCKS,
    MAX_INLINE_UNITS,
    MAX_INPUT_CHARS,
    MAX_MESSAGES,
    MAX_STOP_SEQUENCE_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_UNIT_TOOLS,
    NOT_WHITESPACE,
    Error,
    ErrorCode,
    Unit,
)
from swarm.api.openapi import ROUTES, render
from swarm.core import agent
from swarm.core.records import ID_PATTERN, LANES, TENANT_PATTERN
from swarm.service.batches import batch_id_for

PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
SPEC = json.loads(PATH.read_text())


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema object with its ``$ref`` (or a one-item ``allOf`` of one) followed."""
    ref = schema.get("$ref") or (schema.get("allOf") or [{}])[0].get("$ref")
    if ref is None:
        return schema
    target: dict[str, Any] = SPEC["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    return target


def handler_routes() -> set[tuple[str, str]]:
    routes = {(r.method, r.path) for r in (*app._static_routes, *app._dynamic_routes)}
    return {(method, re.sub(r"<(\w+)>", r"{\1}", path)) for method, path in routes}


def test_the_committed_document_is_what_the_generator_produces() -> None:
    assert PATH.read_text() == render(), (
        "docs/openapi.json is not what swarm/api generates: run `make openapi` and commit it"
    )


def test_the_document_is_valid_openapi_3() -> None:
    assert SPEC["openapi"].startswith("3.")
    validate(SPEC)


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    documented = {(method.upper(), path) for path, ops in SPEC["paths"].items() for method in ops}
    assert documented == handler_routes() == {(r.method, r.path) for r in ROUTES}


def test_documented_limits_match_the_code() -> None:
    submission = SPEC["components"]["schemas"]["BatchSubmission"]["properties"]
    assert resolve(submission["lane"])["enum"] == [lane.value for lane in LANES]
    assert submission["lane"]["default"] == "normal"
    assert submission["units"]["maxItems"] == MAX_INLINE_UNITS
    top_up = SPEC["components"]["schemas"]["BatchResume"]["properties"]["top_up"]
    assert (top_up["minimum"], top_up["maximum"]) == (1, MAX_BUDGET_TOKENS)
    # the fuzzer found a budget over the ceiling valid by the document and refused by the API
    assert submission["budget"]["maximum"] == MAX_BUDGET_TOKENS


def test_no_deployment_may_allow_a_budget_past_the_documents_ceiling() -> None:
    from pydantic import ValidationError

    from infra.config import BudgetConfig

    assert BudgetConfig(default_tokens=0, max_tokens=MAX_BUDGET_TOKENS).max_tokens > 0
    with pytest.raises(ValidationError):
        BudgetConfig(default_tokens=0, max_tokens=MAX_BUDGET_TOKENS + 1)


def test_a_submission_is_documented_as_exactly_one_of_units_and_manifest() -> None:
    # the fuzzer found {} valid by the document and refused by the API
    branches = SPEC["components"]["schemas"]["BatchSubmission"]["oneOf"]
    assert [b["required"] for b in branches] == [["units"], ["manifest"]]


def test_every_batch_id_matches_the_documented_pattern() -> None:
    for key in (None, "k", "é" * 255):
        assert re.fullmatch(BATCH_ID_PATTERN, batch_id_for("acme", key))


def test_every_link_names_an_operation_and_its_parameters() -> None:
    operations = {op["operationId"]: op for ops in SPEC["paths"].values() for op in ops.values()}
    links = [
        (op["operationId"], status, link)
        for op in operations.values()
        for status, response in op["responses"].items()
        for link in response.get("links", {}).values()
    ]
    assert {target["operationId"] for _, _, target in links} >= {
        "getBatch",
        "getBatchResults",
        "resumeBatch",
        "submitBatch",
    }
    for source, status, link in links:
        assert status.startswith("2"), (source, status)
        target = operations[link["operationId"]]
        names = {f"{p['in']}.{p['name']}" for p in target.get("parameters", [])}
        for name in link.get("parameters", {}):
            assert name in names or f"path.{name}" in names, (source, link)
        for expression in [*link.get("parameters", {}).values(), json.dumps(link)]:
            for field in re.findall(r"\$response\.body#/(\w+)", expression):
                body = resolve(source_schema(operations[source], status))
                assert field in body["properties"], (source, field)
        if "requestBody" in link:
            assert "requestBody" in target


def source_schema(operation: dict[str, Any], status: str) -> dict[str, Any]:
    schema: dict[str, Any] = operation["responses"][status]["content"]["application/json"]["schema"]
    return schema


def test_every_id_is_documented_with_the_one_pattern_the_code_checks() -> None:
    unit = SPEC["components"]["schemas"]["Unit"]
    assert unit["properties"]["unit_id"]["pattern"] == ID_PATTERN
    patterns = {
        "batch_id": BATCH_ID_PATTERN,
        "tenant": TENANT_PATTERN,
        "unit_id": ID_PATTERN,
        "tool_use_id": agent.NAME_PATTERN,  # a toolUseId: Converse's pattern
    }
    for path, ops in SPEC["paths"].items():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["in"] == "path":
                    assert param["schema"]["pattern"] == patterns[param["name"]], (path, param)


def test_every_operation_documents_auth_errors() -> None:
    for ops in SPEC["paths"].values():
        for op in ops.values():
            assert {"401", "403"} <= set(op["responses"])


def test_every_error_is_documented_with_the_error_model() -> None:
    error = {"$ref": f"#/components/schemas/{Error.__name__}"}
    for ops in SPEC["paths"].values():
        for op in ops.values():
            for status, response in op["responses"].items():
                schema = response["content"]["application/json"]["schema"]
                assert (schema == error) == (int(status) >= 400), (op["operationId"], status)
                if status in ("429", "503"):
                    assert "Retry-After" in response["headers"]
    codes = SPEC["components"]["schemas"]["Error"]["properties"]["error"]["description"]
    assert all(code.value in codes for code in ErrorCode)


def test_the_documented_unit_is_the_one_the_api_validates() -> None:
    unit = SPEC["components"]["schemas"]["Unit"]
    required = {name for name, field in Unit.model_fields.items() if field.is_required()}
    assert set(unit["required"]) == required == {"unit_id", "projected_tokens", "input"}
    assert unit["additionalProperties"] is False
    # the input: a string, or a Converse-shaped request, each with the documented limits
    text, request = unit["properties"]["input"]["anyOf"]
    assert text == {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_INPUT_CHARS,
        "pattern": NOT_WHITESPACE,
    }
    converse = resolve(request)
    assert set(converse["properties"]) == {
        "system",
        "messages",
        "inferenceConfig",
        "model",
        # an agent unit's (docs/agents.md)
        "tools",
        "toolChoice",
        "limits",
        "followUps",
    }
    assert converse["properties"]["tools"]["maxItems"] == MAX_UNIT_TOOLS
    assert converse["properties"]["tools"]["items"]["pattern"] == agent.NAME_PATTERN
    limits = resolve(converse["properties"]["limits"])["properties"]["max_turns"]
    assert (limits["minimum"], limits["maximum"]) == (1, agent.MAX_TURNS)
    assert converse["required"] == ["messages"] and converse["additionalProperties"] is False
    assert converse["properties"]["messages"]["maxItems"] == MAX_MESSAGES
    message = resolve(converse["properties"]["messages"]["items"])
    assert message["properties"]["role"]["enum"] == ["user", "assistant"]
    assert message["properties"]["content"]["maxItems"] == MAX_CONTENT_BLOCKS
    block = resolve(message["properties"]["content"]["items"])
    assert block["properties"]["text"] == text
    settings = resolve(converse["properties"]["inferenceConfig"])["properties"]
    assert set(settings) == {"maxTokens", "temperature", "topP", "stopSequences"}
    for name in ("temperature", "topP"):
        assert (settings[name]["minimum"], settings[name]["maximum"]) == (0, 1)
    assert settings["maxTokens"]["minimum"] == 1
    assert settings["stopSequences"]["maxItems"] == MAX_STOP_SEQUENCES
    assert settings["stopSequences"]["items"]["maxLength"] == MAX_STOP_SEQUENCE_CHARS


def test_the_documented_text_pattern_is_the_apis_whitespace_rule_for_every_character() -> None:
    # the fuzzer sent the text "\x1e": valid by the document's \S, whitespace to the API
    from swarm.core.prompts import text_problem

    # in every engine: \s is Python's str.isspace in Python, ASCII only in Java (API Gateway)
    # and re.ASCII, ECMA's own list in JavaScript; the pattern may use no such class
    for pattern in (re.compile(NOT_WHITESPACE), re.compile(NOT_WHITESPACE, re.ASCII)):
        for code in range(0x110000):
            if 0xD800 <= code <= 0xDFFF:
                continue  # not text (a lone surrogate is refused for that, whatever the pattern)
            char = chr(code)
            assert (pattern.search(char) is not None) == (text_problem(char) is None), hex(code)
