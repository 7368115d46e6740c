"""docs/openapi.json is generated from swarm/api, is valid OpenAPI 3, and matches the handler."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from openapi_spec_validator import validate

from functions.api import app
from swarm.api.models import (
    MAX_CONTENT_BLOCKS,
    MAX_INLINE_UNITS,
    MAX_INPUT_CHARS,
    MAX_MESSAGES,
    MAX_STOP_SEQUENCE_CHARS,
    MAX_STOP_SEQUENCES,
    Error,
    ErrorCode,
    Unit,
)
from swarm.api.openapi import ROUTES, render
from swarm.core.records import ID_PATTERN, LANES, TENANT_PATTERN

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
    assert SPEC["components"]["schemas"]["BatchResume"]["properties"]["top_up"]["minimum"] == 1


def test_every_id_is_documented_with_the_one_pattern_the_code_checks() -> None:
    unit = SPEC["components"]["schemas"]["Unit"]
    assert unit["properties"]["unit_id"]["pattern"] == ID_PATTERN
    patterns = {"batch_id": ID_PATTERN, "tenant": TENANT_PATTERN}
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
        "pattern": r"\S",
    }
    converse = resolve(request)
    assert set(converse["properties"]) == {"system", "messages", "inferenceConfig"}
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
