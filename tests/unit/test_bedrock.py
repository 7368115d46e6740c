"""The Bedrock Converse model plane: usage -> tokens, throttles -> ModelThrottled, never a blank
prompt, the configured read timeout and no SDK retries."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
from botocore.stub import Stubber

from swarm.adapters.bedrock import (
    CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    MAX_OUTPUT_TOKENS,
    BedrockModelPlane,
    call_bound_s,
    minimum_read_timeout_s,
)
from swarm.core.ports import ModelRequest, ModelThrottled
from swarm.wiring import Wiring

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


# -- the prompt, the timeouts, the retries ---------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\n\t  \n"])
def test_an_empty_or_whitespace_prompt_is_never_sent(text: str) -> None:
    model, stub = plane()  # no response queued: any call would fail the test
    with stub:
        result = model.invoke(replace(REQUEST, input=text))
    stub.assert_no_pending_responses()
    assert not result.succeeded and result.tokens == 0 and "EmptyInput" in result.error


def test_the_prompt_is_sent_as_given() -> None:
    model, stub = plane()
    expected = {
        "modelId": "anthropic.claude-test",
        "messages": [{"role": "user", "content": [{"text": REQUEST.input}]}],
        "inferenceConfig": {"maxTokens": MAX_OUTPUT_TOKENS},
    }
    stub.add_response("converse", converse_response(), expected)
    with stub:
        assert model.invoke(REQUEST).succeeded


def test_the_default_read_timeout_covers_the_longest_answer_at_the_slowest_rate() -> None:
    assert minimum_read_timeout_s() == 167  # ceil(4,096 / 30 tokens/s) + 30 s to a first token
    assert minimum_read_timeout_s() <= DEFAULT_READ_TIMEOUT_S
    assert DEFAULT_READ_TIMEOUT_S > 60  # boto3's default read timeout
    assert call_bound_s(DEFAULT_READ_TIMEOUT_S) == CONNECT_TIMEOUT_S + DEFAULT_READ_TIMEOUT_S


WORKER_ENV = {
    "SWARM_FUNCTION": "worker",
    "STAGE": "dev",
    "POWERTOOLS_SERVICE_NAME": "swarm-dev",
    "POWERTOOLS_METRICS_NAMESPACE": "Swarm",
    "POWERTOOLS_LOG_LEVEL": "INFO",
    "LEDGER_TABLE_NAME": "ledger",
    "GOVERNOR_TABLE_NAME": "governor",
    "DRAIN_PARAMETER_NAME": "/swarm/dev/drain",
    "EVENT_BUS_NAME": "bus",
    "QUOTA_TPM": "300000",
    "GOVERNOR_SHARE": "0.95",
    "GOVERNOR_MAX_WAIT_SECONDS": "20",
    "MAX_ATTEMPTS": "3",
    "LEASE_SECONDS": "1440",
    "MODEL_ADAPTER": "bedrock",
    "BEDROCK_MODEL_ID": "anthropic.claude-test",
    "BEDROCK_READ_TIMEOUT_SECONDS": "240",
    "SIM_MODEL_QUOTA_TPM": "300000",
    "SIM_MODEL_FAILURE_RATE": "0",
    "SIM_MODEL_SEED": "7",
    **{f"QUEUE_URL_{lane}": f"https://sqs/{lane}" for lane in ("HIGH", "NORMAL", "LOW")},
    **{f"LANE_RESERVE_{lane}": "0.1" for lane in ("HIGH", "NORMAL", "LOW")},
}


def worker_model(monkeypatch: pytest.MonkeyPatch, **env: str) -> BedrockModelPlane:
    """The model the worker's Lambda wiring builds, with its real boto3 client (offline)."""
    for name, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(name, value)
    model = Wiring.from_env({**WORKER_ENV, **env}).model()
    assert isinstance(model, BedrockModelPlane)
    return model


def test_the_workers_client_waits_the_configured_read_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = worker_model(monkeypatch).client.meta.config
    assert (config.read_timeout, config.connect_timeout) == (240, CONNECT_TIMEOUT_S)
    assert config.retries == {"mode": "standard", "total_max_attempts": 1}
    unset = worker_model(monkeypatch, BEDROCK_READ_TIMEOUT_SECONDS="").client.meta.config
    assert unset.read_timeout == DEFAULT_READ_TIMEOUT_S


def _answer(status: int, code: str) -> AWSResponse:
    body = json.dumps({"message": code}).encode()
    return AWSResponse("https://bedrock", status, {"x-amzn-ErrorType": code}, _Raw(body))


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_: Any) -> Any:
        yield self.body


def test_a_throttle_reaches_the_governor_on_the_first_answer_not_after_sdk_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """botocore's default retries ThrottlingException 4 times on its own: the governor would not
    hear of it, and every retry draws on the quota the governor protects."""
    model = worker_model(monkeypatch)
    sent: list[str] = []

    def throttle(request: Any, **_: Any) -> AWSResponse:
        sent.append(request.url)
        return _answer(429, "ThrottlingException")

    model.client.meta.events.register("before-send.bedrock-runtime.Converse", throttle)
    with pytest.raises(ModelThrottled):
        model.invoke(REQUEST)
    assert len(sent) == 1


def test_a_read_timeout_is_one_failed_attempt_settled_at_the_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not retried by the SDK (the same prompt again, while the first generation may be billed)
    and not an exception that would leave the claim to expire: a failed attempt, settled at the
    most it may have cost (the unit's reservation)."""
    model = worker_model(monkeypatch)
    sent: list[str] = []

    def time_out(request: Any, **_: Any) -> None:
        sent.append(request.url)
        raise ReadTimeoutError(endpoint_url=request.url)

    model.client.meta.events.register("before-send.bedrock-runtime.Converse", time_out)
    result = model.invoke(replace(REQUEST, max_tokens=5_000))
    assert len(sent) == 1
    assert not result.succeeded and result.tokens == 5_000 and result.error == "ReadTimeoutError"


def test_a_call_that_never_connected_costs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = worker_model(monkeypatch)

    def unreachable(request: Any, **_: Any) -> None:
        raise ConnectTimeoutError(endpoint_url=request.url)

    model.client.meta.events.register("before-send.bedrock-runtime.Converse", unreachable)
    result = model.invoke(REQUEST)
    assert not result.succeeded and result.tokens == 0 and result.error == "ConnectTimeoutError"
