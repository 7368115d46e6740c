"""The Bedrock Converse model plane: usage -> tokens, throttles -> ModelThrottled."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from swarm.adapters.bedrock import BedrockModelPlane
from swarm.modelplane import ModelRequest, ModelThrottled

REQUEST = ModelRequest("b-1", "u-1", 0, 5_000, "Summarise the incident.")


def plane() -> tuple[BedrockModelPlane, Stubber]:
    client = boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return BedrockModelPlane(client, "anthropic.claude-test"), Stubber(client)


def converse_response(stop: str = "end_turn") -> dict[str, object]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "All clear."}]}},
        "stopReason": stop,
        "usage": {"inputTokens": 1_200, "outputTokens": 300, "totalTokens": 1_500},
        "metrics": {"latencyMs": 420},
    }


def test_tokens_come_from_the_responses_usage() -> None:
    model, stub = plane()
    stub.add_response("converse", converse_response())
    with stub:
        result = model.invoke(REQUEST)
    assert result.succeeded and result.tokens == 1_500 and result.output == "All clear."


def test_a_throttle_becomes_model_throttled() -> None:
    model, stub = plane()
    stub.add_client_error("converse", "ThrottlingException", http_status_code=429)
    with stub, pytest.raises(ModelThrottled):
        model.invoke(REQUEST)


def test_other_model_errors_are_failed_attempts() -> None:
    model, stub = plane()
    stub.add_client_error("converse", "ModelErrorException", http_status_code=424)
    stub.add_response("converse", converse_response(stop="content_filtered"))
    with stub:
        failed = model.invoke(REQUEST)
        filtered = model.invoke(REQUEST)
    assert not failed.succeeded and failed.error == "ModelErrorException"
    assert not filtered.succeeded and filtered.tokens == 1_500  # billed all the same
