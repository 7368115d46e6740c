"""The front door: IAM auth on every method, validation, throttling, access logs."""

from __future__ import annotations

import json

from swarm.api.gateway import GatewayError, GatewayResponses, render
from swarm.api.models import (
    MAX_MANIFEST_BYTES,
    ApprovalDecision,
    BatchResume,
    BatchSubmission,
    Error,
    UploadRequest,
)
from swarm.api.openapi import ROUTES, gateway_schema
from tests.infra.conftest import Synthesized
from tests.infra.helpers import as_list

PATHS = {
    ("POST", "batches"),
    ("GET", "{batch_id}"),
    ("GET", "results"),
    ("POST", "resume"),
    ("POST", "uploads"),
    ("POST", "rebind"),
    ("GET", "fleet"),
    ("GET", "drain"),
    ("GET", "transcript"),
    ("GET", "approvals"),
    ("POST", "{tool_use_id}"),
}


def test_every_method_requires_iam_and_validates(synth: Synthesized) -> None:
    methods = synth.of_type("AWS::ApiGateway::Method")
    resources = synth.of_type("AWS::ApiGateway::Resource")
    validators = synth.of_type("AWS::ApiGateway::RequestValidator")
    assert len(validators) == 1
    ((validator_id, validator),) = validators.items()
    assert validator["Properties"]["ValidateRequestBody"] is True
    assert validator["Properties"]["ValidateRequestParameters"] is True
    seen = set()
    for method in methods.values():
        props = method["Properties"]
        assert props["AuthorizationType"] == "AWS_IAM"
        assert props["RequestValidatorId"] == {"Ref": validator_id}
        assert props["Integration"]["Type"] == "AWS_PROXY"
        path_part = resources[props["ResourceId"]["Ref"]]["Properties"]["PathPart"]
        seen.add((props["HttpMethod"], path_part))
    assert seen == PATHS == {(r.method, r.path.rsplit("/", 1)[-1]) for r in ROUTES}


def test_submit_and_resume_bodies_have_models(synth: Synthesized) -> None:
    models = {
        m["Properties"]["Schema"]["title"]: m["Properties"]["Schema"]
        for m in synth.of_type("AWS::ApiGateway::Model").values()
    }
    submission = models["BatchSubmission"]
    assert submission["properties"]["lane"]["enum"] == ["high", "normal", "low"]
    assert submission["properties"]["units"]["items"]["required"] == [
        "unit_id",
        "projected_tokens",
        "input",
    ]
    assert models["BatchResume"]["properties"]["top_up"]["minimum"] == 1
    for method in synth.of_type("AWS::ApiGateway::Method").values():
        if method["Properties"]["HttpMethod"] == "POST" and "RequestModels" in method["Properties"]:
            assert "application/json" in method["Properties"]["RequestModels"]


def test_the_gateway_validates_with_the_handlers_own_models(synth: Synthesized) -> None:
    """Each request model is exactly the JSON schema of the pydantic model the handler parses
    the body with (draft 4, inlined), and each method carries its route's model."""
    models = {
        logical_id: m["Properties"]["Schema"]
        for logical_id, m in synth.of_type("AWS::ApiGateway::Model").items()
    }
    assert sorted(schema["title"] for schema in models.values()) == [
        "ApprovalDecision",
        "BatchResume",
        "BatchSubmission",
        "UploadRequest",
    ]
    by_title = {
        m.__name__: m for m in (BatchSubmission, BatchResume, UploadRequest, ApprovalDecision)
    }
    for schema in models.values():
        assert schema == gateway_schema(by_title[schema["title"]])
    (upload,) = [s for s in models.values() if s["title"] == "UploadRequest"]
    assert upload["properties"]["size_bytes"]["maximum"] == MAX_MANIFEST_BYTES
    resources = synth.of_type("AWS::ApiGateway::Resource")
    for method in synth.of_type("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        path_part = resources[props["ResourceId"]["Ref"]]["Properties"]["PathPart"]
        (route,) = [
            r
            for r in ROUTES
            if r.method == props["HttpMethod"] and r.path.rsplit("/", 1)[-1] == path_part
        ]
        if route.request is None:
            assert "RequestModels" not in props
        else:
            (ref,) = props["RequestModels"].values()
            assert models[ref["Ref"]]["title"] == route.request.__name__
        expected = {f"method.request.path.{name}": True for name in route.path_params}
        if route.idempotency_key:
            expected["method.request.header.Idempotency-Key"] = False
        if route.path.endswith("/results"):  # optional: the handler names a bad one (400)
            for name in ("state", "limit", "next_token"):
                expected[f"method.request.querystring.{name}"] = False
        if route.path.endswith("/transcript"):
            expected["method.request.querystring.from_turn"] = False
        if route.path.endswith("/approvals"):
            for name in ("limit", "next_token"):
                expected[f"method.request.querystring.{name}"] = False
        assert props.get("RequestParameters", {}) == expected


def test_stage_throttles_logs_and_traces(synth: Synthesized) -> None:
    ((_, stage),) = synth.of_type("AWS::ApiGateway::Stage").items()
    props = stage["Properties"]
    assert props["StageName"] == synth.config.stage
    assert props["TracingEnabled"] is True
    # The log group's ARN without the ":*" suffix (the logGroupDestinationArnWithoutWildcard flag)
    destination = json.dumps(props["AccessLogSetting"]["DestinationArn"])
    assert synth.logical_id(synth.stack.front_door.access_logs) in destination
    access_format = json.loads(props["AccessLogSetting"]["Format"])
    assert {"requestId", "caller", "user", "status"} <= set(access_format)
    assert access_format["userArn"] == "$context.identity.userArn"  # the tenant's role
    (settings,) = props["MethodSettings"]
    assert settings["ThrottlingRateLimit"] == synth.config.api.throttle_rate_limit
    assert settings["ThrottlingBurstLimit"] == synth.config.api.throttle_burst_limit
    assert settings["LoggingLevel"] == "ERROR"
    assert settings["DataTraceEnabled"] is False


def test_stage_logging_deploys_on_a_fresh_account(synth: Synthesized) -> None:
    """Access and execution logging need the region's account-level CloudWatch role for API
    Gateway; a fresh account has none, and the stage fails to create without it. By default the
    stack sets it (api.create_cloudwatch_role: true), before the stage is created."""
    assert synth.config.api.create_cloudwatch_role
    ((account_id, account),) = synth.of_type("AWS::ApiGateway::Account").items()
    role_id = account["Properties"]["CloudWatchRoleArn"]["Fn::GetAtt"][0]
    role = synth.resources[role_id]
    assert role["Type"] == "AWS::IAM::Role"
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "apigateway.amazonaws.com"
    }
    assert json.dumps(role["Properties"]["ManagedPolicyArns"]).endswith(
        'service-role/AmazonAPIGatewayPushToCloudWatchLogs"]]}]'
    )
    # It outlives the stack: other APIs of the account and region log through the same setting
    assert account["DeletionPolicy"] == "Retain"
    assert role["DeletionPolicy"] == "Retain"
    # And the stage (which turns logging on) waits for the account setting
    ((_, stage),) = synth.of_type("AWS::ApiGateway::Stage").items()
    assert account_id in as_list(stage.get("DependsOn", []))


#: messages as API Gateway may hold them: quotes, backslashes, newlines, non-ASCII, braces
HOSTILE_MESSAGES = (
    'User: arn:aws:sts::123456789012:assumed-role/a"b/s is not authorized',
    'a \\ backslash, a\nnewline, a\ttab and a "quoted" word',
    "Request Too Long",
    "{not json} ' single ' quotes and é ✓",
)
#: $context.error.validationErrorString as AWS formats it: a plain string holding quotes
VALIDATIONS = (
    '[object has missing required properties (["units"])]',
    '[instance value ("x\\"y") not found in enum (possible values: ["high","low"])]',
)


def test_every_gateway_response_renders_json_as_api_gateway_substitutes(
    synth: Synthesized,
) -> None:
    """Each template, rendered with API Gateway's variable semantics ($context.error.messageString
    is a JSON string literal, quotes included; validationErrorString is inserted unescaped), is
    the API's Error body: before, a quoted messageString rendered ``""Forbidden""``."""
    responses = GatewayResponses.from_template(synth.template)
    assert set(responses.responses) == {
        "BAD_REQUEST_BODY",
        "BAD_REQUEST_PARAMETERS",
        "THROTTLED",
        "REQUEST_TOO_LARGE",
        "DEFAULT_4XX",
        "DEFAULT_5XX",
    }
    for response in responses.responses.values():
        template = response.templates["application/json"]
        for message in HOSTILE_MESSAGES:
            for validation in VALIDATIONS:
                error = GatewayError(response.response_type, message, validation)
                doc = json.loads(render(template, error))
                Error.model_validate(doc)
                assert doc["message"] == message, response.name
                expected = "invalid_request" if "BAD_REQUEST" in response.response_type else None
                assert doc["error"] == (expected or response.response_type)


def test_gateway_responses_are_the_declared_ones_with_their_status(synth: Synthesized) -> None:
    # the local API answers from the synthesized template; its default (tests) is this table
    deployed = GatewayResponses.from_template(synth.template).responses
    declared = GatewayResponses.of().responses
    assert {t: (r.status, r.headers, r.templates) for t, r in deployed.items()} == {
        t: (r.status, r.headers, r.templates) for t, r in declared.items()
    }
    assert deployed["THROTTLED"].status == 429
    assert deployed["THROTTLED"].headers == {"Retry-After": "1"}
    # a body API Gateway cannot pass to the function (past 10 MB, or an event past Lambda's
    # 6 MB payload) is a JSON 413 too
    status, headers, body = GatewayResponses.from_template(synth.template).answer(
        GatewayError("REQUEST_TOO_LARGE", "Request Too Long")
    )
    assert (status, headers["Content-Type"]) == (413, "application/json")
    assert json.loads(body) == {"error": "REQUEST_TOO_LARGE", "message": "Request Too Long"}
