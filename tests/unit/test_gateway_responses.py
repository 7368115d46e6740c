"""API Gateway's own errors (swarm.api.gateway): variables substituted as API Gateway does, the
type's response or its DEFAULT_4XX/5XX, and the local API answering with them."""

from __future__ import annotations

import json

from swarm.api.gateway import (
    ERROR_TEMPLATE,
    GatewayError,
    GatewayResponse,
    GatewayResponses,
    render,
)
from swarm.api.models import Error
from swarm.local.apiserver import LocalApi


def test_message_string_is_a_json_literal_and_the_others_are_inserted_as_they_are() -> None:
    error = GatewayError("ACCESS_DENIED", 'a "b"\n', validation='[("x")]')
    template = (
        "$context.error.messageString|$context.error.message|${context.error.responseType}|"
        "$context.error.validationErrorString"
    )
    assert render(template, error) == '"a \\"b\\"\\n"|a "b"\n|ACCESS_DENIED|[("x")]'


def test_a_quoted_message_string_is_not_json() -> None:
    """What the stack deployed before: ``"$context.error.messageString"`` in quotes."""
    before = '{"error": "$context.error.responseType", "message": "$context.error.messageString"}'
    rendered = render(before, GatewayError("ACCESS_DENIED", "Forbidden"))
    assert rendered.endswith('""Forbidden""}')
    doc = json.loads(render(ERROR_TEMPLATE, GatewayError("ACCESS_DENIED", 'say "no"\\')))
    assert Error.model_validate(doc).message == 'say "no"\\'


def test_a_type_without_its_own_response_takes_the_default_with_its_own_status() -> None:
    responses = GatewayResponses.of()
    status, headers, body = responses.answer(GatewayError("EXPIRED_TOKEN", "expired"))
    assert status == 403 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"error": "EXPIRED_TOKEN", "message": "expired"}
    status, _, body = responses.answer(GatewayError("INTEGRATION_TIMEOUT", "Endpoint timed out"))
    assert status == 504 and json.loads(body)["error"] == "INTEGRATION_TIMEOUT"
    status, headers, _ = responses.answer(GatewayError("THROTTLED", "Too Many Requests"))
    assert status == 429 and headers["Retry-After"] == "1"


def test_without_gateway_responses_api_gateways_own_body() -> None:
    status, _, body = GatewayResponses({}).answer(GatewayError("ACCESS_DENIED", 'no "way"'))
    assert (status, json.loads(body)) == (403, {"message": 'no "way"'})


def test_a_template_read_back_from_a_template_resource() -> None:
    template = {
        "Resources": {
            "ApiTooLarge": {
                "Type": "AWS::ApiGateway::GatewayResponse",
                "Properties": {
                    "ResponseType": "REQUEST_TOO_LARGE",
                    "StatusCode": "413",
                    "ResponseParameters": {"gatewayresponse.header.X-Why": "'size'"},
                    "ResponseTemplates": {"application/json": ERROR_TEMPLATE},
                    "RestApiId": {"Ref": "Api"},
                },
            },
            "Other": {"Type": "AWS::SQS::Queue"},
        }
    }
    responses = GatewayResponses.from_template(template)
    assert responses.responses == {
        "REQUEST_TOO_LARGE": GatewayResponse(
            "ApiTooLarge",
            "REQUEST_TOO_LARGE",
            413,
            {"X-Why": "size"},
            {"application/json": ERROR_TEMPLATE},
        )
    }


def test_the_local_api_refuses_with_the_responses_it_is_given() -> None:
    custom = GatewayResponses(
        {
            "DEFAULT_4XX": GatewayResponse(
                "Default4xx",
                "DEFAULT_4XX",
                templates={"application/json": '{"custom": $context.error.messageString}'},
            )
        }
    )
    api = LocalApi(
        None, "unused", "123456789012", "us-east-1", "abc", lambda *a: (404, None), responses=custom
    )
    try:
        refused = api.authenticate("GET", "/fleet", "", {}, b"")
    finally:
        api.server.server_close()
    assert refused == (403, {"custom": "Missing Authentication Token"})
