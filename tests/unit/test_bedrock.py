"""The Bedrock Converse model plane: the prompt sent as given, the answer bounded by the unit's
reservation (CountTokens when the bound is tight, a stated upper bound otherwise), usage ->
tokens, throttles -> ModelThrottled, never a blank prompt, the configured timeouts and no SDK
retries."""

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
    BOUND_TOKENS_PER_PART,
    BOUND_TOKENS_PER_REQUEST,
    CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    MAX_OUTPUT_TOKENS,
    BedrockModelPlane,
    call_bound_s,
    input_token_bound,
    minimum_read_timeout_s,
)
from swarm.adapters.routed_model import RoutedModelPlane
from swarm.contract import BEDROCK_COUNT_CONNECT_TIMEOUT_S, BEDROCK_COUNT_READ_TIMEOUT_S
from swarm.core.ports import ModelRequest, ModelThrottled
from swarm.core.pricing import Prices, Usage, cost_micro
from swarm.core.prompts import converse_request
from swarm.wiring import Wiring

MODEL = "anthropic.claude-test"
REQUEST = ModelRequest("b-1", "u-1", 0, 5_000, "Summarise the incident.")
STRUCTURED = {
    "system": [{"text": "You are terse."}, {"text": "Answer in English."}],
    "messages": [
        {"role": "user", "content": [{"text": "Summarise the incident."}]},
        {"role": "assistant", "content": [{"text": "Which incident?"}]},
        {"role": "user", "content": [{"text": "The outage of 3 May."}, {"text": "Be brief."}]},
    ],
    "inferenceConfig": {
        "maxTokens": 800,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["END"],
    },
}


def client() -> Any:
    return boto3.client(
        "bedrock-runtime",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def plane() -> tuple[BedrockModelPlane, Stubber]:
    c = client()
    return BedrockModelPlane(c, MODEL), Stubber(c)


def count_calls(model: BedrockModelPlane) -> list[dict[str, Any]]:
    """Every CountTokens request the plane makes, as sent (a stub error would be swallowed as a
    failed count, so calls are recorded before they reach the stubber)."""
    calls: list[dict[str, Any]] = []
    model.client.meta.events.register(
        "provide-client-params.bedrock-runtime.CountTokens",
        lambda params, **_: calls.append(params),
    )
    return calls


def converse_response(
    stop: str = "end_turn", usage: tuple[int, int] = (1_200, 300)
) -> dict[str, object]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "All clear."}]}},
        "stopReason": stop,
        "usage": {"inputTokens": usage[0], "outputTokens": usage[1], "totalTokens": sum(usage)},
        "metrics": {"latencyMs": 420},
    }


def sent(prompt: Any, max_tokens: int) -> dict[str, Any]:
    """The Converse request the plane must send for ``prompt`` with this answer bound."""
    request = converse_request(prompt)
    return {
        "modelId": MODEL,
        **{k: request[k] for k in ("system", "messages") if k in request},
        "inferenceConfig": {**request.get("inferenceConfig", {}), "maxTokens": max_tokens},
    }


def counted(prompt: Any) -> dict[str, Any]:
    """The CountTokens request the plane must send for ``prompt``."""
    request = converse_request(prompt)
    return {
        "modelId": MODEL,
        "input": {"converse": {k: request[k] for k in ("system", "messages") if k in request}},
    }


def test_the_result_carries_the_answer_and_the_providers_usage() -> None:
    model, stub = plane()
    stub.add_response("converse", converse_response())
    with stub:
        result = model.invoke(REQUEST)
    assert result.succeeded and result.tokens == 1_500 and result.output == "All clear."
    assert (result.stop_reason, result.input_tokens, result.output_tokens) == (
        "end_turn",
        1_200,
        300,
    )
    assert result.model_id == MODEL and result.error == ""


def test_the_prompt_caches_tokens_are_read_apart_and_priced_at_their_own_rates() -> None:
    model, stub = plane()
    response = converse_response(usage=(200, 300))
    # Converse reports the cache's reads and writes apart from inputTokens (the botocore stub
    # checks this response against the service's own model: the field names are Bedrock's)
    response["usage"] = {
        "inputTokens": 200,
        "outputTokens": 300,
        "totalTokens": 1_500,
        "cacheReadInputTokens": 900,
        "cacheWriteInputTokens": 100,
    }
    stub.add_response("converse", response)
    with stub:
        result = model.invoke(REQUEST)
    assert (result.input_tokens, result.output_tokens) == (200, 300)
    assert (result.cache_read_tokens, result.cache_write_tokens) == (900, 100)
    assert result.tokens == 1_500
    assert result.usage() == Usage(200, 300, 900, 100)
    prices = Prices.parse(
        {"as_of": "2026-12-06", "input": 0.8, "output": 4, "cache_read": 0.08,
         "cache_write": 1}
    )  # fmt: skip
    # 160 + 1,200 + 72 + 100 micro-dollars
    assert cost_micro(result.usage(), prices) == 1_532


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
    assert filtered.error == filtered.stop_reason == "content_filtered" and filtered.output == ""


# -- the prompt ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\n\t  \n"])
def test_an_empty_or_whitespace_prompt_is_never_sent(text: str) -> None:
    model, stub = plane()  # no response queued: any call would fail the test
    with stub:
        result = model.invoke(replace(REQUEST, input=text))
    stub.assert_no_pending_responses()
    assert not result.succeeded and result.tokens == 0
    assert result.error.startswith("InvalidInput: input: must contain text")


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        (
            {"messages": [{"role": "user", "content": [{"text": " "}]}]},
            "input.messages[0].content[0].text",
        ),
        ({"messages": [{"role": "assistant", "content": [{"text": "a"}]}]}, "input.messages"),
        ({"system": "\t", "messages": STRUCTURED["messages"]}, "input.system"),
        (
            {"messages": STRUCTURED["messages"], "inferenceConfig": {"temperature": 3}},
            "input.inferenceConfig.temperature",
        ),
    ],
)
def test_a_request_converse_would_refuse_is_never_sent(prompt: Any, field: str) -> None:
    model, stub = plane()
    with stub:
        result = model.invoke(replace(REQUEST, input=prompt))
    assert not result.succeeded and result.tokens == 0
    assert result.error.startswith(f"InvalidInput: {field}: ")


def test_a_string_prompt_is_sent_as_one_user_message() -> None:
    model, stub = plane()
    expected = {
        "modelId": MODEL,
        "messages": [{"role": "user", "content": [{"text": REQUEST.input}]}],
        "inferenceConfig": {"maxTokens": MAX_OUTPUT_TOKENS},
    }
    stub.add_response("converse", converse_response(), expected)
    with stub:
        assert model.invoke(REQUEST).succeeded
    stub.assert_no_pending_responses()


def test_a_converse_request_is_sent_as_given_with_its_settings() -> None:
    # Given a request whose reservation leaves its whole answer room even for the bound
    model, stub = plane()
    calls = count_calls(model)
    request = replace(REQUEST, input=STRUCTURED, max_tokens=100_000)
    # Then system, messages and every setting go as given, maxTokens the unit's own
    stub.add_response("converse", converse_response(), sent(STRUCTURED, 800))
    with stub:
        assert model.invoke(request).succeeded
    stub.assert_no_pending_responses()
    assert calls == []  # nothing to count: the bound already fits


def test_the_answer_asked_for_is_at_most_the_adapters_ceiling() -> None:
    model, stub = plane()
    prompt = {**STRUCTURED, "inferenceConfig": {"maxTokens": 50_000}}
    stub.add_response("converse", converse_response(), sent(prompt, MAX_OUTPUT_TOKENS))
    with stub:
        assert model.invoke(replace(REQUEST, input=prompt, max_tokens=10**6)).succeeded
    stub.assert_no_pending_responses()


# -- the answer's bound: the reservation minus the input --------------------------------------


def test_the_input_token_bound_is_its_bytes_plus_the_templates_allowance() -> None:
    request = converse_request(STRUCTURED)
    text_bytes = sum(
        len(t)
        for t in (
            "You are terse.",
            "Answer in English.",
            "Summarise the incident.",
            "Which incident?",
            "The outage of 3 May.",
            "Be brief.",
        )
    )
    parts = 2 + 3 + 4  # system blocks, messages, content blocks
    assert input_token_bound(request) == (
        text_bytes + BOUND_TOKENS_PER_PART * parts + BOUND_TOKENS_PER_REQUEST
    )
    # a byte per token at most: a character of 3 UTF-8 bytes may be 3 tokens
    wide = converse_request("漢" * 1_000)
    assert input_token_bound(wide) == 3_000 + BOUND_TOKENS_PER_PART * 2 + BOUND_TOKENS_PER_REQUEST


def test_a_tight_reservation_counts_the_input_and_bounds_the_answer_by_it() -> None:
    # Given a reservation of 1,000 tokens: the bound (250+ tokens of text and template) leaves
    # less than the 800 the unit asks for, so the input is counted: 412 tokens
    model, stub = plane()
    stub.add_response("count_tokens", {"inputTokens": 412}, counted(STRUCTURED))
    # Then the answer may have 1,000 - 412 = 588 tokens
    stub.add_response("converse", converse_response(usage=(412, 588)), sent(STRUCTURED, 588))
    with stub:
        result = model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=1_000))
    stub.assert_no_pending_responses()
    assert result.succeeded and result.tokens == 1_000 <= 1_000


def test_an_input_the_reservation_cannot_pay_for_is_never_sent() -> None:
    model, stub = plane()
    stub.add_response("count_tokens", {"inputTokens": 1_000}, counted(STRUCTURED))
    with stub:  # no Converse response queued: a call would fail the test
        result = model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=1_000))
    stub.assert_no_pending_responses()
    assert not result.succeeded and result.tokens == 0 and result.output == ""
    assert result.error == (
        "InputExceedsReservation: the input is 1,000 tokens (counted by CountTokens) and the "
        "unit's reservation is 1,000 tokens, which leaves no room for an answer: raise the "
        "unit's projected_tokens above its input"
    )


def test_a_model_that_cannot_count_is_bounded_from_above_and_remembered() -> None:
    # Given a model CountTokens refuses (e.g. an inference profile or a model without counting)
    model, stub = plane()
    calls = count_calls(model)
    bound = input_token_bound(converse_request(STRUCTURED))
    reservation = bound + 100
    stub.add_client_error("count_tokens", "ValidationException", http_status_code=400)
    # Then the answer is bounded by the reservation minus the input's upper bound
    stub.add_response("converse", converse_response(usage=(60, 40)), sent(STRUCTURED, 100))
    # and the next call does not ask again
    stub.add_response("converse", converse_response(usage=(60, 40)), sent(STRUCTURED, 100))
    with stub:
        first = model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=reservation))
        second = model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=reservation))
    stub.assert_no_pending_responses()
    assert first.succeeded and second.succeeded and len(calls) == 1 and not model.can_count
    # and a reservation below the bound refuses the attempt, naming the bound as such
    with stub:
        refused = model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=bound))
    assert not refused.succeeded and refused.tokens == 0
    assert refused.error.startswith(
        f"InputExceedsReservation: the input is {bound:,} tokens (an upper bound: {MODEL} did "
        f"not count them) and the unit's reservation is {bound:,} tokens"
    )


@pytest.mark.parametrize("code", ["ThrottlingException", "ServiceUnavailableException"])
def test_a_count_that_fails_for_now_falls_back_to_the_bound_and_is_tried_again(code: str) -> None:
    model, stub = plane()
    reservation = input_token_bound(converse_request(STRUCTURED)) + 50
    stub.add_client_error("count_tokens", code, http_status_code=429)
    stub.add_response("converse", converse_response(), sent(STRUCTURED, 50))
    stub.add_response("count_tokens", {"inputTokens": 100}, counted(STRUCTURED))
    stub.add_response("converse", converse_response(), sent(STRUCTURED, reservation - 100))
    with stub:  # a throttled count is not the model's throttle: no ModelThrottled
        assert model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=reservation)).succeeded
        assert model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=reservation)).succeeded
    stub.assert_no_pending_responses()
    assert model.can_count


def test_an_overrun_the_provider_reports_is_returned_as_billed() -> None:
    # The provider's own count disagreed with CountTokens: it billed 1,040 of a 1,000 reservation
    model, stub = plane()
    stub.add_response("count_tokens", {"inputTokens": 400}, counted(STRUCTURED))
    stub.add_response("converse", converse_response(usage=(440, 600)), sent(STRUCTURED, 600))
    with stub:
        result = model.invoke(replace(REQUEST, input=STRUCTURED, max_tokens=1_000))
    assert result.tokens == 1_040 and (result.input_tokens, result.output_tokens) == (440, 600)


# -- the timeouts and the retries --------------------------------------------------------------


def test_the_default_read_timeout_covers_the_longest_answer_at_the_slowest_rate() -> None:
    assert minimum_read_timeout_s() == 167  # ceil(4,096 / 30 tokens/s) + 30 s to a first token
    assert minimum_read_timeout_s() <= DEFAULT_READ_TIMEOUT_S
    assert DEFAULT_READ_TIMEOUT_S > 60  # boto3's default read timeout
    # a count (2 s to connect, 3 s to answer), then Converse (10 s to connect, the read timeout)
    count = BEDROCK_COUNT_CONNECT_TIMEOUT_S + BEDROCK_COUNT_READ_TIMEOUT_S
    assert count == 5
    assert (
        call_bound_s(DEFAULT_READ_TIMEOUT_S) == count + CONNECT_TIMEOUT_S + DEFAULT_READ_TIMEOUT_S
    )


WORKER_ENV = {
    "SWARM_FUNCTION": "worker",
    "STAGE": "dev",
    "POWERTOOLS_SERVICE_NAME": "swarm-dev",
    "POWERTOOLS_METRICS_NAMESPACE": "Swarm",
    "POWERTOOLS_LOG_LEVEL": "INFO",
    "LEDGER_TABLE_NAME": "ledger",
    "GOVERNOR_TABLE_NAME": "governor",
    "BUCKET_NAME": "bucket",
    "DRAIN_PARAMETER_NAME": "/swarm/dev/drain",
    "EVENT_BUS_NAME": "bus",
    "MODELS": json.dumps(
        {
            "default": "main",
            "catalog": {"main": {"model_id": MODEL, "tpm": 300000, "share": 0.95, "burndown": 1}},
        }
    ),
    "GOVERNOR_MAX_WAIT_SECONDS": "20",
    "MAX_ATTEMPTS": "3",
    "LEASE_SECONDS": "1440",
    "BUNDLE_WINDOW_SECONDS": "10",
    "BUNDLE_UNITS": "5",
    "BUNDLE_STRETCH": "0.1",
    "BUNDLE_MAX_WINDOW_SECONDS": "45",
    "MODEL_ADAPTER": "bedrock",
    "BEDROCK_READ_TIMEOUT_SECONDS": "240",
    "SIM_MODEL_QUOTA_TPM": "300000",
    "SIM_MODEL_FAILURE_RATE": "0",
    "SIM_MODEL_SEED": "7",
    **{f"QUEUE_URL_{lane}": f"https://sqs/{lane}" for lane in ("HIGH", "NORMAL", "LOW")},
    **{f"LANE_RESERVE_{lane}": "0.1" for lane in ("HIGH", "NORMAL", "LOW")},
}


def worker_model(monkeypatch: pytest.MonkeyPatch, **env: str) -> BedrockModelPlane:
    """The model the worker's Lambda wiring builds, with its real boto3 clients (offline)."""
    for name, value in {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(name, value)
    routed = Wiring.from_env({**WORKER_ENV, **env}).model()
    assert isinstance(routed, RoutedModelPlane)  # one plane per registered model id
    model = routed.planes[MODEL]
    assert isinstance(model, BedrockModelPlane) and model is routed.default
    return model


def test_the_workers_clients_wait_their_configured_timeouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = worker_model(monkeypatch)
    config = model.client.meta.config
    assert (config.read_timeout, config.connect_timeout) == (240, CONNECT_TIMEOUT_S)
    assert config.retries == {"mode": "standard", "total_max_attempts": 1}
    unset = worker_model(monkeypatch, BEDROCK_READ_TIMEOUT_SECONDS="").client.meta.config
    assert unset.read_timeout == DEFAULT_READ_TIMEOUT_S
    # CountTokens has its own client: short timeouts, no retries
    assert model.counter is not None and model.counter is not model.client
    counter = model.counter.meta.config
    assert (counter.connect_timeout, counter.read_timeout) == (2, 3)
    assert counter.retries == {"mode": "standard", "total_max_attempts": 1}


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
    hear of it, and every retry draws on the quota it protects."""
    model = worker_model(monkeypatch)
    sent_urls: list[str] = []

    def throttle(request: Any, **_: Any) -> AWSResponse:
        sent_urls.append(request.url)
        return _answer(429, "ThrottlingException")

    model.client.meta.events.register("before-send.bedrock-runtime.Converse", throttle)
    with pytest.raises(ModelThrottled):
        model.invoke(REQUEST)
    assert len(sent_urls) == 1


def answered(asked: list[int]) -> Any:
    """A before-send hook that answers Converse, recording the maxTokens it was sent."""

    def answer(request: Any, **_: Any) -> AWSResponse:
        asked.append(json.loads(request.body)["inferenceConfig"]["maxTokens"])
        body = json.dumps(converse_response()).encode()
        return AWSResponse(request.url, 200, {}, _Raw(body))

    return answer


@pytest.mark.parametrize("fails", ["throttled", "timed out"])
def test_a_count_that_fails_is_asked_once_and_the_bound_is_used(
    monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """A throttled count is not the model's throttle (no ModelThrottled), and a count that does
    not answer within its short timeouts is not retried: the call goes on with the bound."""
    model = worker_model(monkeypatch)
    counts: list[str] = []
    asked: list[int] = []

    def count(request: Any, **_: Any) -> AWSResponse:
        counts.append(request.url)
        if fails == "timed out":
            raise ReadTimeoutError(endpoint_url=request.url)
        return _answer(429, "ThrottlingException")

    model.counter.meta.events.register("before-send.bedrock-runtime.CountTokens", count)
    model.client.meta.events.register("before-send.bedrock-runtime.Converse", answered(asked))
    tight = input_token_bound(converse_request(REQUEST.input)) + 10
    assert model.invoke(replace(REQUEST, max_tokens=tight)).succeeded
    assert len(counts) == 1 and asked == [10] and model.can_count


def test_the_count_goes_through_the_count_client(monkeypatch: pytest.MonkeyPatch) -> None:
    model = worker_model(monkeypatch)
    asked: list[int] = []

    def count(request: Any, **_: Any) -> AWSResponse:
        assert request.url.endswith(f"/model/{MODEL}/count-tokens")
        assert json.loads(request.body) == {"input": counted(REQUEST.input)["input"]}
        body = json.dumps({"inputTokens": 9}).encode()
        return AWSResponse(request.url, 200, {}, _Raw(body))

    model.counter.meta.events.register("before-send.bedrock-runtime.CountTokens", count)
    model.client.meta.events.register("before-send.bedrock-runtime.Converse", answered(asked))
    assert model.invoke(replace(REQUEST, max_tokens=100)).succeeded
    assert asked == [91]


def test_a_read_timeout_is_one_failed_attempt_settled_at_the_reservation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not retried by the SDK (the same prompt again, while the first generation may be billed)
    and not an exception that would leave the claim to expire: a failed attempt, settled at the
    most it may have cost (the unit's reservation)."""
    model = worker_model(monkeypatch)
    sent_urls: list[str] = []

    def time_out(request: Any, **_: Any) -> None:
        sent_urls.append(request.url)
        raise ReadTimeoutError(endpoint_url=request.url)

    model.client.meta.events.register("before-send.bedrock-runtime.Converse", time_out)
    result = model.invoke(replace(REQUEST, max_tokens=5_000))
    assert len(sent_urls) == 1
    assert not result.succeeded and result.tokens == 5_000 and result.error == "ReadTimeoutError"


def test_a_call_that_never_connected_costs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = worker_model(monkeypatch)

    def unreachable(request: Any, **_: Any) -> None:
        raise ConnectTimeoutError(endpoint_url=request.url)

    model.client.meta.events.register("before-send.bedrock-runtime.Converse", unreachable)
    result = model.invoke(REQUEST)
    assert not result.succeeded and result.tokens == 0 and result.error == "ConnectTimeoutError"
