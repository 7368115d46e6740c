"""The local API plays API Gateway in front of a Lambda that refuses an event past 6 MiB (as
Lambda does, swarm.local.patches.limits): a body whose event Lambda cannot take is API Gateway's
JSON 413 (REQUEST_TOO_LARGE), not a 5xx, a body within the handler's limit reaches it, and a
function error is API Gateway's 502, rendered by the same gateway responses."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.api.models import SAFE_BODY_BYTES, Error
from swarm.local import patches
from swarm.local.apiserver import LocalApi
from swarm.local.patches import limits

REGION = "us-east-1"
TENANT = "arn:aws:sts::123456789012:assumed-role/swarm-tenant-acme/cli"


class SignedApi(LocalApi):
    """The local API with every request taken as the tenant's (SigV4: tests/integration/
    test_local_iam.py)."""

    def authenticate(self, *args: Any, **kwargs: Any) -> str | tuple[int, dict[str, Any]]:
        return TENANT


@pytest.fixture
def api(aws_credentials: None) -> Iterator[LocalApi]:
    patches.apply_all()
    limits.apply_all()
    with mock_aws(config={"lambda": {"use_docker": False}}):  # type: ignore[arg-type]
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "lambda.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
        role = boto3.client("iam", region_name=REGION).create_role(
            RoleName="api", AssumeRolePolicyDocument=json.dumps(trust)
        )["Role"]["Arn"]
        arn = boto3.client("lambda", region_name=REGION).create_function(
            FunctionName="api",
            Runtime="python3.11",
            Role=role,
            Handler="index.handler",
            Code={"ZipFile": b"not run: moto's Docker-less backend echoes the event"},
        )["FunctionArn"]
        local = SignedApi(
            clients=lambda _name: boto3.client("lambda", region_name=REGION),
            function_arn=arn,
            account="123456789012",
            region=REGION,
            api_id="abc123",
            admin=lambda *a: (404, None),
        )
        local.start()
        try:
            yield local
        finally:
            local.stop()


def post(api: LocalApi, body: bytes) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", api.server.server_address[1], timeout=60)
    try:
        connection.request("POST", "/batches", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_body_whose_event_is_past_lambdas_payload_is_api_gateways_json_413(
    api: LocalApi,
) -> None:
    # 3.4 MB of \" (within API Gateway's 10 MB) is 6.8 MB in the event: before, Lambda's refusal
    # escaped the local API as a 502
    body = ('{"units": "' + '\\"' * 1_700_000 + '"}').encode()
    status, data = post(api, body)
    assert status == 413
    assert Error.model_validate(json.loads(data)).model_dump() == {
        "error": "REQUEST_TOO_LARGE",
        "message": "Request Too Long",
    }


def test_a_body_of_the_safe_size_reaches_the_function_whatever_it_escapes_to(
    api: LocalApi,
) -> None:
    body = ("\x01" * SAFE_BODY_BYTES).encode()  # 6 bytes each in the event: 6,000,000
    status, data = post(api, body)
    assert status == 200  # moto's echo: the function got the event, whose body is answered
    assert data == body


def test_a_function_error_is_api_gateways_502_with_the_error_body(api: LocalApi) -> None:
    from moto.awslambda_simple.models import lambda_simple_backends

    # a response past Lambda's 6 MB: the invocation is a function error
    results = lambda_simple_backends["123456789012"][REGION].lambda_simple_results_queue
    results.append("r" * (limits.LAMBDA_MAX_SYNC_RESPONSE_BYTES + 1))
    status, data = post(api, b"{}")
    assert status == 502
    assert json.loads(data) == {"error": "DEFAULT_5XX", "message": "Internal server error"}
