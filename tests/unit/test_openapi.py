"""The OpenAPI document and the API handler's routes stay in sync."""

from __future__ import annotations

import json
import re
from pathlib import Path

from functions.api import app
from swarm.core.records import LANES
from swarm.service.api_models import MAX_INLINE_UNITS, MAX_INPUT_CHARS, UnitBody

SPEC = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openapi.json").read_text())


def handler_routes() -> set[tuple[str, str]]:
    routes = {(r.method, r.path) for r in (*app._static_routes, *app._dynamic_routes)}
    return {(method, re.sub(r"<(\w+)>", r"{\1}", path)) for method, path in routes}


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    documented = {(method.upper(), path) for path, ops in SPEC["paths"].items() for method in ops}
    assert documented == handler_routes()


def test_documented_limits_match_the_code() -> None:
    submission = SPEC["components"]["schemas"]["BatchSubmission"]["properties"]
    assert submission["lane"]["enum"] == [lane.value for lane in LANES]
    assert submission["units"]["maxItems"] == MAX_INLINE_UNITS


def test_every_operation_documents_auth_errors() -> None:
    for ops in SPEC["paths"].values():
        for op in ops.values():
            assert {"401", "403"} <= set(op["responses"])


def test_the_documented_unit_is_the_one_the_api_validates() -> None:
    unit = SPEC["components"]["schemas"]["Unit"]
    required = {name for name, field in UnitBody.model_fields.items() if field.is_required()}
    assert set(unit["required"]) == required == {"unit_id", "projected_tokens", "input"}
    assert unit["properties"]["input"]["maxLength"] == MAX_INPUT_CHARS
