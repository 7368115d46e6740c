"""The simulated model plane: outcomes and answers that tests can compute, and honest billing."""

from __future__ import annotations

import pytest

from swarm.adapters.simulated_model import (
    MODEL_ID,
    USAGE_SPREAD,
    SimulatedModelPlane,
    attempt_fails,
    billed_tokens,
    simulated_input_tokens,
    simulated_output,
    simulated_usage,
)
from swarm.core.errors import InvalidInput
from swarm.core.ports import ModelRequest, ModelThrottled
from swarm.core.prompts import Prompt


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def request(
    unit: str, attempt: int = 0, projected: int = 10_000, cap: int | None = None
) -> ModelRequest:
    return ModelRequest("run-1", unit, attempt, projected, max_tokens=cap)


def test_outcomes_are_functions_of_seed_unit_and_attempt_alone() -> None:
    # Given two planes with the same seed, and one with another
    a, b = SimulatedModelPlane(10**9, 0.3, seed=5), SimulatedModelPlane(10**9, 0.3, seed=5)
    other = SimulatedModelPlane(10**9, 0.3, seed=6)
    units = [f"u-{i}" for i in range(200)]
    # When the same units run, in different runs, in another order
    first = [a.invoke(request(u)) for u in units]
    second = [b.invoke(ModelRequest("run-2", u, 0, 10_000)) for u in reversed(units)][::-1]
    third = [other.invoke(request(u)) for u in units]
    # Then the same seed gives the same outcomes, another seed others, and both match the
    # functions tests use to predict them
    assert first == second
    assert first != third
    assert [not r.succeeded for r in first] == [attempt_fails(5, u, 0, 0.3) for u in units]
    assert [r.tokens for r in first] == [simulated_usage(5, u, 0, 10_000) for u in units]


def test_usage_differs_from_the_projection_both_ways_and_the_cap_holds() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    uncapped = [plane.invoke(request(f"u-{i}")).tokens for i in range(200)]
    low, high = USAGE_SPREAD
    assert min(uncapped) < 10_000 < max(uncapped)  # under and over the estimate
    assert all(low * 10_000 - 1 <= t <= high * 10_000 + 1 for t in uncapped)
    capped = [plane.invoke(request(f"u-{i}", cap=10_000)).tokens for i in range(200)]
    assert max(capped) == 10_000 and capped == [min(t, 10_000) for t in uncapped]
    log = plane.log("run-1")
    assert sum(c.truncated for c in log) == sum(t >= 10_000 for t in uncapped)


def test_counters_and_the_call_log_are_kept_per_run_with_the_time_received() -> None:
    clock = Clock()
    plane = SimulatedModelPlane(60_000, seed=3, clock=clock)  # 1,000 tokens/s, 60k bucket
    plane.invoke(ModelRequest("a", "u-1", 0, 50_000, max_tokens=50_000))
    clock.t += 2
    with pytest.raises(ModelThrottled):  # it uses at least 120k tokens: more than the bucket
        plane.invoke(ModelRequest("b", "u-2", 0, 200_000))
    a, b = plane.of_run("a"), plane.of_run("b")
    assert (a.calls, a.throttles) == (1, 0) and a.tokens_billed > 0
    assert (b.calls, b.throttles, b.tokens_billed) == (1, 1, 0)
    assert plane.calls == 2 and plane.throttles == 1 and plane.tokens_billed == a.tokens_billed
    [call] = plane.log("b")
    assert call.received_at == 1_002.0 and call.throttled and call.tokens == 0
    assert plane.log("nobody") == []


# -- answers derived from the prompt --------------------------------------------------------

CONVERSATION = {
    "system": [{"text": "You are terse."}],
    "messages": [
        {"role": "user", "content": [{"text": "Summarise the incident."}]},
        {"role": "assistant", "content": [{"text": "Which one?"}]},
        {"role": "user", "content": [{"text": "The outage of 3 May."}]},
    ],
}


def ask(
    prompt: Prompt, unit: str = "u-1", attempt: int = 0, projected: int = 10_000, cap: int = 10_000
) -> ModelRequest:
    return ModelRequest("run-1", unit, attempt, projected, prompt, max_tokens=cap)


def test_answers_are_a_function_of_the_prompt_the_unit_and_the_attempt() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    result = plane.invoke(ask(CONVERSATION))
    assert result.succeeded
    assert result.output == simulated_output(CONVERSATION, "u-1", 0)
    assert result.output.endswith(": The outage of 3 May.")  # it quotes the last user turn
    # another prompt, unit or attempt: another answer; the same again: the same answer
    others = [
        plane.invoke(ask("Summarise the incident.")).output,
        plane.invoke(ask(CONVERSATION, unit="u-2")).output,
        plane.invoke(ask(CONVERSATION, attempt=1)).output,
        plane.invoke(ask({**CONVERSATION, "system": "Be verbose."})).output,
    ]
    assert len({result.output, *others}) == 5
    assert SimulatedModelPlane(10**9, seed=9).invoke(ask(CONVERSATION)).output == result.output
    # a request is answered in its normal form: a string system prompt is one text block
    as_string = {**CONVERSATION, "system": "You are terse."}
    assert plane.invoke(ask(as_string)).output == result.output


def test_a_result_splits_the_billed_tokens_into_input_and_answer() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    assert simulated_usage(1, "u-2", 0, 10_000) == 6_166  # under the reservation
    result = plane.invoke(ask(CONVERSATION, unit="u-2"))
    text = "You are terse.\nSummarise the incident.\nWhich one?\nThe outage of 3 May."
    assert simulated_input_tokens(CONVERSATION) == -(-len(text) // 4) == 18
    assert (result.tokens, result.input_tokens, result.output_tokens) == (6_166, 18, 6_148)
    assert result.tokens == billed_tokens(1, "u-2", 0, 10_000, 10_000, 18)
    assert (result.stop_reason, result.model_id) == ("end_turn", MODEL_ID)


def test_the_answer_is_bounded_by_the_reservation_and_the_requests_max_tokens() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    assert simulated_usage(1, "u-1", 0, 10_000) == 11_701  # over a reservation of 10,000
    capped = plane.invoke(ask(CONVERSATION))
    assert (capped.tokens, capped.output_tokens, capped.stop_reason) == (
        10_000,
        9_982,
        "max_tokens",
    )
    short = {**CONVERSATION, "inferenceConfig": {"maxTokens": 300}}
    asked = plane.invoke(ask(short))
    assert (asked.tokens, asked.output_tokens, asked.stop_reason) == (318, 300, "max_tokens")
    assert [call.truncated for call in plane.log("run-1")] == [True, True]
    # the unit's own maxTokens without a reservation still bounds the answer
    free = plane.invoke(ModelRequest("run-2", "u-1", 0, 10_000, short))
    assert free.tokens == 318


def test_an_input_the_reservation_cannot_pay_for_fails_at_no_cost_and_is_not_a_call() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    result = plane.invoke(ask(CONVERSATION, cap=18))  # 18 input tokens, no room for an answer
    assert not result.succeeded and result.tokens == 0 and result.output == ""
    assert result.error.startswith(
        "InputExceedsReservation: the input is 18 tokens (simulated count) and the unit's "
        "reservation is 18 tokens"
    )
    assert plane.log("run-1") == [] and plane.calls == 0
    assert plane.invoke(ask(CONVERSATION, cap=19)).tokens == 19  # one token of answer


def test_a_request_converse_would_refuse_fails_at_no_cost() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    alone = {"messages": CONVERSATION["messages"][:2]}  # ends with the assistant
    result = plane.invoke(ask(alone))
    assert not result.succeeded and result.tokens == 0
    assert result.error.startswith("InvalidInput: input.messages: must end with a user message")
    assert plane.calls == 0


def test_the_call_log_keeps_what_the_model_returned() -> None:
    plane = SimulatedModelPlane(10**9, 0.3, seed=5)
    results = [plane.invoke(ask(f"prompt {i}", unit=f"u-{i}")) for i in range(40)]
    log = plane.log("run-1")
    assert [c.output for c in log] == [r.output for r in results]
    assert [(c.input_tokens, c.output_tokens, c.stop_reason) for c in log] == [
        (r.input_tokens, r.output_tokens, r.stop_reason) for r in results
    ]
    failed = [r for r in results if not r.succeeded]
    assert failed and all(r.output == "" and r.tokens > 0 for r in failed)  # billed, no answer
    assert all(
        r.output == simulated_output(f"prompt {i}", f"u-{i}", 0)
        for i, r in enumerate(results)
        if r.succeeded
    )


def test_without_a_cache_share_no_cache_tokens_are_reported() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    results = [plane.invoke(ModelRequest("run-1", f"u-{i}", 0, 10_000, "same")) for i in range(5)]
    assert all((r.cache_read_tokens, r.cache_write_tokens) == (0, 0) for r in results)
    assert all(r.input_tokens == simulated_input_tokens("same") for r in results)


def test_a_repeated_prompt_writes_its_prefix_to_the_cache_once_then_reads_it() -> None:
    # Given a plane whose prompts are half cacheable prefix
    plane = SimulatedModelPlane(10**9, seed=1, cache_share=0.5)
    prompt = "p" * 400  # 100 input tokens
    same = [plane.invoke(ModelRequest("run-1", f"u-{i}", 0, 10_000, prompt)) for i in range(3)]
    other = plane.invoke(ModelRequest("run-1", "u-9", 0, 10_000, "q" * 40))
    # Then the first call of a prompt writes 50 tokens, each later one reads them, and the
    # rest is input: the billed total is what it was without a cache, only its kinds differ
    kinds = [(r.input_tokens, r.cache_read_tokens, r.cache_write_tokens) for r in same]
    assert kinds == [(50, 0, 50), (50, 50, 0), (50, 50, 0)]
    assert (other.input_tokens, other.cache_read_tokens, other.cache_write_tokens) == (5, 0, 5)
    plain = SimulatedModelPlane(10**9, seed=1)
    assert [r.tokens for r in same] == [
        plain.invoke(ModelRequest("run-1", f"u-{i}", 0, 10_000, prompt)).tokens for i in range(3)
    ]
    for r in same:
        assert r.usage().tokens == r.tokens
    # and the log keeps them as the results do
    log = plane.log("run-1")
    assert [(c.cache_read_tokens, c.cache_write_tokens) for c in log[:3]] == [
        (0, 50), (50, 0), (50, 0),
    ]  # fmt: skip


def test_a_throttled_call_caches_nothing() -> None:
    clock = Clock()
    plane = SimulatedModelPlane(10**9, seed=3, clock=clock, cache_share=1.0)
    plane.storm(60, until=clock.t + 10)  # a bystander takes the quota for a while
    with pytest.raises(ModelThrottled):
        plane.invoke(ModelRequest("run-1", "u-1", 0, 10_000, "p" * 400))
    clock.t += 100
    # the prompt's first answered call writes its prefix: the throttled one wrote nothing
    first = plane.invoke(ModelRequest("run-1", "u-1", 0, 10_000, "p" * 400))
    assert (first.cache_read_tokens, first.cache_write_tokens) == (0, 100)


def test_a_cache_share_outside_0_to_1_is_refused() -> None:
    with pytest.raises(InvalidInput, match="cache_share"):
        SimulatedModelPlane(10**9, cache_share=1.5)
