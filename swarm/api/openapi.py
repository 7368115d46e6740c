"""The batch API's routes, and what is generated from them and from :mod:`swarm.api.models`.

* ``docs/openapi.json`` (OpenAPI 3.0): ``python -m swarm.api.openapi docs/openapi.json``, or
  ``make openapi``; a unit test fails when the committed document is not what this produces.
* API Gateway's request models (``infra/api.py``): :func:`gateway_schema`, the model's JSON schema
  in the JSON Schema draft-4 subset API Gateway accepts, every ``$ref`` inlined.
* ``infra/api.py`` builds its resources and methods from :data:`ROUTES`; a unit test checks that
  the handler (``functions/api.py``) serves exactly these routes.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from swarm.api.models import (
    BATCH_ID_PATTERN,
    MAX_BODY_BYTES,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_INLINE_UNITS,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_UNITS,
    SAFE_BODY_BYTES,
    ApprovalDecision,
    Approvals,
    ApprovalsQuery,
    BatchResume,
    BatchStatus,
    BatchSubmission,
    Decided,
    Drain,
    Error,
    Fleet,
    Rebound,
    ResultsPage,
    ResultsQuery,
    Transcript,
    TranscriptQuery,
    Upload,
    UploadRequest,
)
from swarm.core import agent
from swarm.core.records import ID_PATTERN, TENANT_PATTERN

DRAFT4 = "http://json-schema.org/draft-04/schema#"
IDEMPOTENCY_KEY = "Idempotency-Key"


@dataclass(frozen=True)
class Link:
    """An OpenAPI link: what a response lets a client call next (a fuzzer's stateful
    sequences follow them): the target's operation id and its parameters (or request body) as
    runtime expressions (``$response.body#/batch_id``)."""

    operation_id: str
    description: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    request_body: Any = None

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"operationId": self.operation_id, "description": self.description}
        if self.parameters:
            doc["parameters"] = dict(self.parameters)
        if self.request_body is not None:
            doc["requestBody"] = self.request_body
        return doc


@dataclass(frozen=True)
class Reply:
    """One documented response of a route."""

    description: str
    body: type[BaseModel] = Error
    retry_after: bool = False  # with a Retry-After header (seconds)
    links: Mapping[str, Link] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # OpenAPI's form: /batches/{batch_id}
    operation_id: str
    summary: str
    replies: Mapping[int, Reply]
    request: type[BaseModel] | None = None
    idempotency_key: bool = False  # takes the optional Idempotency-Key header
    query: type[BaseModel] | None = None  # its fields are the query string's parameters

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{(\w+)\}", self.path))


#: what each path parameter may be
PATH_PATTERNS = {
    "batch_id": BATCH_ID_PATTERN,
    "tenant": TENANT_PATTERN,
    "unit_id": ID_PATTERN,
    "tool_use_id": agent.NAME_PATTERN,
}
_OPERATORS = Reply(
    "API Gateway refused the request (not signed, or not allowed execute-api:Invoke), or the "
    "caller is not an operator of this deployment (forbidden: a role named "
    "'<operator prefix><name>')"
)
_INVALID = Reply("invalid input; the message names the field")
_AUTH = {
    401: Reply(
        "the request reached the function without a caller identity (behind IAM auth, API "
        "Gateway answers an unsigned request with 403 before that)"
    ),
    403: Reply(
        "API Gateway refused the request (not signed, signed with credentials IAM does not "
        "accept, or not allowed execute-api:Invoke on the method), or the caller's role is not "
        "a tenant of this deployment (forbidden)"
    ),
}
_NO_BATCH = Reply("no such batch for this tenant")
_THROTTLED = Reply(
    "over the stage's throttle (THROTTLED): retry after Retry-After seconds", retry_after=True
)
_DRAINING = Reply("draining for a deploy: retry after Retry-After seconds", retry_after=True)
_MISCONFIGURED = Reply("the service is misconfigured (misconfigured); its operators are alerted")
#: the inline body's real limit: what the handler can see is what fits Lambda's payload
_BODY_LIMIT = (
    f"the body is over {MAX_BODY_BYTES:,} bytes (5.75 MiB) counted as API Gateway's event "
    "carries it, JSON-escaped: a quote or backslash counts 2 bytes, a control or non-ASCII "
    f"character 6 (any body of up to {SAFE_BODY_BYTES:,} bytes fits)"
)
#: what the handler never sees is refused by the gateway with the same body
_GATEWAY_TOO_LARGE = (
    "A body API Gateway cannot pass to the function at all (its event past Lambda's 6 MiB "
    "invocation payload, or the body past API Gateway's 10 MB) is the same 413 and Error body "
    "from API Gateway (REQUEST_TOO_LARGE)."
)
_BODY_TOO_LARGE = f"{_BODY_LIMIT} (too_large). {_GATEWAY_TOO_LARGE}"

#: a batch's id in a response that describes one (BatchStatus, ResultsPage)
_THIS_BATCH = {"batch_id": "$response.body#/batch_id"}
#: where a batch's answer leads: its status, its results, its resume
_BATCH_LINKS = {
    "GetBatch": Link("getBatch", "the batch's status", _THIS_BATCH),
    "GetBatchResults": Link("getBatchResults", "the batch's unit outcomes", _THIS_BATCH),
    "ResumeBatch": Link("resumeBatch", "top up the batch's budget", _THIS_BATCH),
}

#: Every route of the API: the handler serves these, the gateway routes these, the document
#: describes these.
ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/batches",
        "submitBatch",
        "Submit a batch (units inline or as an S3 manifest)",
        {
            201: Reply("the batch was created", BatchStatus, links=_BATCH_LINKS),
            200: Reply(
                "an earlier submit with this Idempotency-Key created it",
                BatchStatus,
                links=_BATCH_LINKS,
            ),
            400: _INVALID,
            **_AUTH,
            409: Reply("conflict: this Idempotency-Key was used for a different batch"),
            413: Reply(
                f"over a size limit (too_large: {_BODY_LIMIT}, more than {MAX_INLINE_UNITS:,} "
                f"inline units, or a manifest of more than {MAX_MANIFEST_UNITS:,} units or "
                f"{MAX_MANIFEST_BYTES // (1024 * 1024)} MiB): upload a manifest instead, or split "
                f"the batch. {_GATEWAY_TOO_LARGE}"
            ),
            429: Reply(
                "the caller's own queued units plus this batch pass its max_queued_units "
                "(tenant_queue); or shedding load (shedding): the lanes are past their shed depth "
                "and the caller is past its guaranteed_units (lane_depth), or the model plane is "
                "throttling; or over the stage's throttle (THROTTLED): retry after Retry-After "
                "seconds",
                retry_after=True,
            ),
            500: _MISCONFIGURED,
            503: _DRAINING,
        },
        request=BatchSubmission,
        idempotency_key=True,
    ),
    Route(
        "GET",
        "/batches/{batch_id}",
        "getBatch",
        "State, counts per outcome, spend against budget, the healthy line, and the remainder "
        "when exhausted",
        {
            200: Reply("the batch", BatchStatus, links=_BATCH_LINKS),
            **_AUTH,
            404: _NO_BATCH,
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
    ),
    Route(
        "GET",
        "/batches/{batch_id}/results",
        "getBatchResults",
        "A page of the batch's unit outcomes (state, tokens, attempts, the model's answer or the "
        "error), filterable by state; once the batch is closed, a short-lived download of its "
        "whole results file",
        {
            200: Reply(
                "a page of results",
                ResultsPage,
                links={
                    "NextPage": Link(
                        "getBatchResults",
                        "the next page (while next_token is present)",
                        {**_THIS_BATCH, "query.next_token": "$response.body#/next_token"},
                    ),
                    "GetBatch": _BATCH_LINKS["GetBatch"],
                },
            ),
            400: _INVALID,
            **_AUTH,
            404: _NO_BATCH,
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
        query=ResultsQuery,
    ),
    Route(
        "GET",
        "/batches/{batch_id}/units/{unit_id}/transcript",
        "getUnitTranscript",
        "An agent unit's transcript: every model turn (its draw and bill, the assistant's "
        "message, usage) and every tool call (input, status, result, latency), from from_turn "
        "on, as many turns as fit a response (next_turn gives the rest)",
        {
            200: Reply("the transcript (or its part from from_turn)", Transcript),
            400: _INVALID,
            **_AUTH,
            404: Reply("no such batch for this tenant, no such unit, or a unit without one"),
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
        query=TranscriptQuery,
    ),
    Route(
        "GET",
        "/batches/{batch_id}/approvals",
        "listApprovals",
        "A page of the batch's tool calls that wait for a person's decision (human gates): "
        "each with its unit, tool, input, toolUseId, how long it has waited and who may decide "
        "it, the calls of up to limit parked units (a unit's calls never split across pages); "
        "for the batch's tenant, an operator, or a decider role (cdk.json approvals.deciders, "
        "a tool's approval.deciders)",
        {
            200: Reply(
                "a page of waiting calls, the longest waiting unit first",
                Approvals,
                links={
                    "NextPage": Link(
                        "listApprovals",
                        "the next page (while next_token is not null)",
                        {**_THIS_BATCH, "query.next_token": "$response.body#/next_token"},
                    ),
                },
            ),
            400: _INVALID,
            **_AUTH,
            404: _NO_BATCH,
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
        query=ApprovalsQuery,
    ),
    Route(
        "POST",
        "/batches/{batch_id}/units/{unit_id}/approvals/{tool_use_id}",
        "decideApproval",
        "Approve or reject one waiting tool call: approved, the tool runs once; rejected, the "
        "model gets an error result carrying the reason. The same decision again answers the "
        "recorded one; a different one is a 409. By the batch's tenant, or only the decider "
        "roles when the call's tool names them (cdk.json tools.<name>.approval.deciders) or "
        "else cdk.json approvals.deciders does",
        {
            200: Reply("the decision as recorded", Decided),
            400: _INVALID,
            **_AUTH,
            404: Reply("no such batch for this tenant, no such unit, or no such call waiting"),
            409: Reply("the call was decided otherwise already"),
            413: Reply(_BODY_TOO_LARGE),
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
        request=ApprovalDecision,
    ),
    Route(
        "POST",
        "/batches/{batch_id}/resume",
        "resumeBatch",
        "Top up the budget and resume the remainder",
        {
            200: Reply(
                "the batch, with the number of units requeued", BatchStatus, links=_BATCH_LINKS
            ),
            400: _INVALID,
            **_AUTH,
            404: _NO_BATCH,
            409: Reply(
                "conflict (the batch is completed, or its manifest has expired under the "
                "bucket's lifecycle rule)"
            ),
            413: Reply(_BODY_TOO_LARGE),
            429: Reply(
                "the remainder requeued would take the caller past its max_queued_units "
                "(tenant_queue), or over the stage's throttle (THROTTLED): retry "
                "after Retry-After seconds",
                retry_after=True,
            ),
            500: _MISCONFIGURED,
            503: _DRAINING,
        },
        request=BatchResume,
    ),
    Route(
        "POST",
        "/uploads",
        "createUpload",
        "A short-lived URL to upload a manifest to: a new key under the caller's own prefix, "
        "written once, of exactly the size asked for; submit it as manifest.key. The caller "
        "needs no rights on the bucket",
        {
            200: Reply(
                "where and how to upload",
                Upload,
                links={
                    "SubmitManifest": Link(
                        "submitBatch",
                        "submit the uploaded manifest (after the PUT to url)",
                        request_body={"manifest": {"key": "$response.body#/key"}},
                    )
                },
            ),
            400: _INVALID,
            **_AUTH,
            413: Reply(_BODY_TOO_LARGE),
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
        request=UploadRequest,
    ),
    Route(
        "GET",
        "/fleet",
        "getFleet",
        "Governor state, lane depths, in flight, drain state (operators only)",
        {
            200: Reply("the fleet", Fleet),
            **_AUTH,
            403: _OPERATORS,
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
    ),
    Route(
        "GET",
        "/drain",
        "getDrain",
        "Drain switch state and whether it is safe to deploy (operators only)",
        {
            200: Reply("drain status", Drain),
            **_AUTH,
            403: _OPERATORS,
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
    ),
    Route(
        "POST",
        "/tenants/{tenant}/rebind",
        "rebindTenant",
        "Forget the role a tenant is bound to, so the role now named after it binds at its next "
        "call (operators only: after a tenant's role was deleted and created again)",
        {
            200: Reply("the binding is forgotten", Rebound),
            400: _INVALID,
            **_AUTH,
            403: _OPERATORS,
            429: _THROTTLED,
            500: _MISCONFIGURED,
        },
    ),
)

#: Limits the handler answers with 413 and a hint to upload a manifest instead: the gateway's
#: request models leave them to it rather than answer 400.
HANDLER_ONLY = frozenset({"maxItems"})


# ------------------------------------------------------------------ JSON schema conversions

_SUBSCHEMA = frozenset({"items", "not"})
_SUBSCHEMAS = frozenset({"anyOf", "allOf", "oneOf"})
_DROPPED = frozenset({"title"})  # pydantic's generated titles ("Unit Id"): noise
#: the order of a schema's keywords in the output (pydantic sorts them alphabetically)
_ORDER = (
    "$schema",
    "title",
    "$ref",
    "allOf",
    "type",
    "nullable",
    "description",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "anyOf",
    "oneOf",
    "not",
)


#: the JSON Schema keywords a model's schema may use (the rest of _ORDER is what the conversion
#: itself writes: the draft's $schema, the inlined $ref's title, OpenAPI's nullable)
_SCHEMA_KEYWORDS = frozenset(_ORDER) - {"$schema", "title", "$ref", "nullable"}


def _ordered(schema: Mapping[str, Any]) -> dict[str, Any]:
    return dict(sorted(schema.items(), key=lambda item: _ORDER.index(item[0])))


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _nullable(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The non-null branch of pydantic's ``anyOf: [X, {"type": "null"}]`` (an optional field)."""
    branches = node.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or {"type": "null"} not in branches:
        return None
    other: Mapping[str, Any] = next(b for b in branches if b != {"type": "null"})
    return other


def _convert(
    node: Mapping[str, Any], ref: Any, nullable: Any, omit: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """``node`` with every keyword checked against the subset both targets share.

    ``ref(node, siblings)`` renders a ``$ref``; ``nullable(converted, siblings)`` an optional
    field. A keyword outside the subset raises, so a model change cannot silently produce a
    schema API Gateway or OpenAPI 3.0 does not accept.
    """

    def walk(n: Mapping[str, Any]) -> dict[str, Any]:
        siblings = {k: v for k, v in n.items() if k not in ("$ref", "anyOf")}
        if "$ref" in n:
            return _ordered(ref(n["$ref"], walk(siblings)))
        inner = _nullable(n)
        if inner is not None:
            return _ordered(nullable(walk(inner), walk(siblings)))
        out: dict[str, Any] = {}
        for key, value in n.items():
            if key in _DROPPED or key in omit or (key == "default" and value is None):
                continue
            if key == "const":
                out["enum"] = [value]
            elif key == "description":
                out[key] = " ".join(value.split())  # a docstring's line breaks
            elif key not in _SCHEMA_KEYWORDS:
                raise ValueError(f"JSON schema keyword {key!r} is not converted: {dict(n)}")
            elif key == "properties":
                out[key] = {name: walk(sub) for name, sub in value.items()}
            elif key in _SUBSCHEMA or (key == "additionalProperties" and isinstance(value, dict)):
                out[key] = walk(value)
            elif key in _SUBSCHEMAS:
                out[key] = [walk(sub) for sub in value]
            else:
                out[key] = value
        return _ordered(out)

    return walk(node)


def gateway_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON schema as an API Gateway request model: JSON Schema draft 4, every
    ``$ref`` inlined (API Gateway resolves a ``$ref`` only to another model's URL), an optional
    field's null as a second type, without the limits the handler answers with 413
    (:data:`HANDLER_ONLY`)."""
    schema = model.model_json_schema()
    defs: dict[str, Any] = schema.pop("$defs", {})

    def ref(target: str, siblings: dict[str, Any]) -> dict[str, Any]:
        return {**inline(defs[_ref_name(target)]), **siblings}

    def nullable(inner: dict[str, Any], siblings: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(inner.get("type"), str):
            raise ValueError(f"an optional field without one type: {inner}")
        return {**inner, **siblings, "type": [inner["type"], "null"]}

    def inline(node: Mapping[str, Any]) -> dict[str, Any]:
        return _convert(node, ref, nullable, HANDLER_ONLY)

    return {"$schema": DRAFT4, "title": model.__name__, **inline(schema)}


def _openapi_schemas(models: list[type[BaseModel]]) -> dict[str, Any]:
    """The models and every model they use, as OpenAPI 3.0 schema objects (``nullable``; a
    ``$ref`` with siblings wrapped in ``allOf``, which 3.0 requires)."""
    _, top = models_json_schema(
        [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
    )
    defs: dict[str, Any] = top["$defs"]

    def ref(target: str, siblings: dict[str, Any]) -> dict[str, Any]:
        return {"allOf": [{"$ref": target}], **siblings} if siblings else {"$ref": target}

    def nullable(inner: dict[str, Any], siblings: dict[str, Any]) -> dict[str, Any]:
        if "allOf" in inner or "$ref" in inner:  # 3.0.3: nullable needs a type beside it
            target = inner.get("$ref") or inner["allOf"][0]["$ref"]
            kind = defs[_ref_name(target)]["type"]
            return {"allOf": [{"$ref": target}], "type": kind, "nullable": True, **siblings}
        return {**inner, **siblings, "nullable": True}

    return {name: _convert(schema, ref, nullable) for name, schema in defs.items()}


# ------------------------------------------------------------------ the document


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}


def _operation(route: Route) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": route.operation_id, "summary": route.summary}
    params: list[dict[str, Any]] = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": PATH_PATTERNS[name]},
        }
        for name in route.path_params
    ]
    if route.query is not None:
        params += _query_params(route.query)
    if route.idempotency_key:
        params.append(
            {
                "name": IDEMPOTENCY_KEY,
                "in": "header",
                "required": False,
                "schema": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_IDEMPOTENCY_KEY_CHARS,
                },
                "description": "A retried submit with the same key returns the same batch (200) "
                "instead of creating another.",
            }
        )
    if params:
        op["parameters"] = params
    if route.request is not None:
        op["requestBody"] = {"required": True, "content": _json_body(route.request)}
    responses: dict[str, Any] = {}
    for status, reply in route.replies.items():
        response: dict[str, Any] = {
            "description": reply.description,
            "content": _json_body(reply.body),
        }
        if reply.links:
            response["links"] = {name: link.document() for name, link in reply.links.items()}
        if reply.retry_after:
            response["headers"] = {
                "Retry-After": {
                    "schema": {"type": "integer", "minimum": 1},
                    "description": "seconds",
                }
            }
        responses[str(status)] = response
    op["responses"] = responses
    return op


def _query_params(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A query model's fields as optional query parameters (their schemas made draft-4 plain:
    a parameter is a string, an integer or an enum, never null)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    params = []
    for name, prop in schema["properties"].items():
        description = prop.pop("description", None)
        prop.pop("title", None)
        if prop.get("default", 0) is None:
            del prop["default"]
        options = [p for p in prop.pop("anyOf", []) if p.get("type") != "null"]
        if options:
            (only,) = options
            prop.update(only)
        if "$ref" in prop:
            prop = _resolve(schema, prop["$ref"])
        param: dict[str, Any] = {"name": name, "in": "query", "required": False}
        param["schema"] = {k: v for k, v in prop.items() if k != "title"}
        if description:
            param["description"] = description
        params.append(param)
    return params


def _resolve(schema: Mapping[str, Any], ref: str) -> dict[str, Any]:
    name = ref.rsplit("/", 1)[-1]
    return dict(schema["$defs"][name])


def document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of the API."""
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    models: list[type[BaseModel]] = [Error]
    for route in ROUTES:
        for model in (route.request, *(reply.body for reply in route.replies.values())):
            if model is not None and model not in models:
                models.append(model)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "swarm batch API",
            "version": "1.0.0",
            "description": "Submit batches of LLM agent work units and watch them run under the "
            "fleet's token quota and the batch's budget. Every request is SigV4-signed (IAM "
            "auth); the tenant is the caller's role name without the deployment's tenant "
            'prefix, never a field of the body. Errors are JSON {"error": code, "message": '
            "text}. Generated from swarm/api (make openapi): do not edit by hand.",
        },
        "security": [{"sigv4": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                "sigv4": {
                    "type": "apiKey",
                    "name": "Authorization",
                    "in": "header",
                    "x-amazon-apigateway-authtype": "awsSigv4",
                }
            },
            "schemas": _openapi_schemas(models),
        },
    }


def render() -> str:
    """The document as committed in ``docs/openapi.json``."""
    return json.dumps(document(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    """``python -m swarm.api.openapi [PATH]``: write the document to PATH, or to stdout."""
    if len(argv) > 1:
        print("usage: python -m swarm.api.openapi [PATH]", file=sys.stderr)
        return 2
    text = render()
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
