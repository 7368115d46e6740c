"""Output burndown: the governor counts quota tokens as Bedrock does (an output token of the
Claude 4 family counts 5 against tokens per minute), while budgets stay in billed tokens.

The arithmetic (draws and true-ups of single-call units and agent turns, at burndown 1 and 5),
the documented default per model id, and on in-memory ports: output-heavy units of a
burndown-5 model never take more quota tokens than the governor credits (they took ~5x before),
and an agent loop's turns draw and true up in quota tokens while its books stay billed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from swarm.core import agent
from swarm.core.burndown import (
    DEFAULT_OUTPUT_CAP,
    call_draw,
    call_output_bound,
    call_quota,
    documented_burndown,
    turn_draw,
    turn_quota,
)
from swarm.core.errors import InvalidInput
from swarm.core.governor import Draw, GovernorConfig, Grant, Ticket, TrueUp
from swarm.core.memory import InMemoryGovernor
from swarm.core.ports import ConverseCall, ModelRequest, ModelResult
from swarm.core.records import Lane, RunState
from swarm.service.batches import SubmitRequest, UnitInput
from swarm.service.worker import Worker
from tests.unit.test_agent_worker import AgentPlane, Tools, agent_units, assert_books_exact
from tests.unit.test_service_flow import Plane

TOOLS = Tools().specs()

# -- the documented default ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "rate"),
    [
        ("anthropic.claude-sonnet-4-20250514-v1:0", 5.0),
        ("anthropic.claude-opus-4-20250514-v1:0", 5.0),
        ("anthropic.claude-opus-4-1-20250805-v1:0", 5.0),
        ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 5.0),  # a cross-region profile
        ("global.anthropic.claude-haiku-4-5-20251001-v1:0", 5.0),
        ("eu.anthropic.claude-opus-4-5-20251101-v1:0", 5.0),
        ("anthropic.claude-3-5-haiku-20241022-v1:0", 1.0),  # the shipped cdk.json's model
        ("anthropic.claude-3-haiku-20240307-v1:0", 1.0),
        ("amazon.nova-pro-v1:0", 1.0),
        ("meta.llama3-70b-instruct-v1:0", 1.0),
    ],
)
def test_the_documented_burndown_is_5_for_the_claude_4_family_and_1_for_others(
    model_id: str, rate: float
) -> None:
    assert documented_burndown(model_id) == rate


# -- the arithmetic -----------------------------------------------------------------------------


def test_a_single_call_draws_its_projection_plus_its_output_bound_at_the_burndown() -> None:
    # a unit of 10,000 tokens asking for at most 2,000 output tokens
    bound = call_output_bound(10_000, 2_000)
    assert bound == 2_000
    assert call_draw(10_000, bound, 1.0) == 10_000  # burndown 1: exactly its projection
    assert call_draw(10_000, bound, 5.0) == 10_000 + 4 * 2_000  # input + 5 x output bound
    # no maxTokens of its own: the model plane's default, and never more than the projection
    assert call_output_bound(10_000, None, 4_096) == 4_096
    assert call_output_bound(3_000, None, 4_096) == 3_000
    assert call_output_bound(3_000, None, None) == 3_000
    assert call_output_bound(3_000, 8_000, 4_096) == 3_000


def test_a_single_call_is_trued_up_to_its_input_plus_its_output_at_the_burndown() -> None:
    # billed 1,800 = 300 input + 1,500 output
    assert call_quota(1_800, 300, 1_500, 2_000, 1.0) == 1_800  # burndown 1: the billed tokens
    assert call_quota(1_800, 300, 1_500, 2_000, 5.0) == 300 + 5 * 1_500
    # a lost answer (billed at its cap, no usage reported): its output counted at its bound
    assert call_quota(10_000, 0, 0, 2_000, 5.0) == 10_000 + 4 * 2_000
    assert call_quota(10_000, 0, 0, 2_000, 1.0) == 10_000
    assert call_quota(0, 0, 0, 2_000, 5.0) == 0  # refused before the call: nothing


def test_an_agent_turn_draws_its_input_estimate_plus_burndown_x_its_output_bound() -> None:
    assert turn_draw(3_000, 512, 1.0) == 3_512
    assert turn_draw(3_000, 512, 5.0) == 3_000 + 5 * 512
    assert turn_draw(3_000, 512, 1.5) == 3_000 + 768


def test_an_agent_turn_is_trued_up_without_its_cache_reads() -> None:
    usage = {
        "inputTokens": 400,
        "outputTokens": 120,
        "cacheReadInputTokens": 2_000,  # reserved with the input, released at settlement
        "cacheWriteInputTokens": 300,
    }
    assert turn_quota(usage, 1.0) == 400 + 300 + 120
    assert turn_quota(usage, 5.0) == 400 + 300 + 5 * 120
    assert agent.billed_of(usage) == 2_820  # the books still bill every token


def test_a_turns_steps_carry_the_billed_draw_and_the_quota_draw() -> None:
    [unit] = agent_units(1)
    spec = agent.parse_agent_input(
        unit.input, batch="b", unit="a", projected_tokens=60_000, registry=TOOLS
    )
    one = agent.next_step([], spec)
    five = agent.next_step([], replace(spec, output_burndown=5.0))
    assert isinstance(one, agent.CallModel) and isinstance(five, agent.CallModel)
    assert one.draw == one.quota_draw == one.input_estimate + 512
    assert five.draw == one.draw  # the budget's figure does not change
    assert five.quota_draw == five.input_estimate + 5 * 512
    assert agent.first_draw(replace(spec, output_burndown=5.0)) == five.quota_draw


def test_a_turn_whose_quota_draw_the_bucket_cannot_grant_stops_the_unit_naming_the_burndown() -> (
    None
):
    [unit] = agent_units(1)
    spec = agent.parse_agent_input(
        unit.input, batch="b", unit="a", projected_tokens=60_000, registry=TOOLS
    )
    step = agent.next_step([], spec)
    assert isinstance(step, agent.CallModel)
    # a lane that grants the billed draw but not 5 x its output bound
    tight = replace(spec, max_draw=step.draw + 100, output_burndown=5.0)
    stop = agent.next_step([], tight)
    assert isinstance(stop, agent.Stop) and stop.reason == "limit_tokens"
    assert "x burndown 5" in stop.detail and f"{step.input_estimate + 5 * 512:,}" in stop.detail
    assert isinstance(agent.next_step([], replace(tight, output_burndown=1.0)), agent.CallModel)


@pytest.mark.parametrize("bad", [0.5, 0, -5, float("inf"), float("nan")])
def test_the_governor_refuses_a_burndown_below_1_naming_it(bad: float) -> None:
    with pytest.raises(InvalidInput) as error:
        GovernorConfig(100_000, output_burndown=bad)
    assert "output_burndown" in str(error.value)


# -- single-call units through the worker -------------------------------------------------------

QUOTA_TPM = 120_000
BURNDOWN = 5.0
INPUT = 200  # output-heavy units: their answers are nearly all of their tokens


@dataclass
class BurndownModel:
    """A model plane that counts its own quota as Bedrock does for a burndown-5 model: each
    call's ``input + 5 x output``, at the instant of the call. Its answers fill the output
    bound as Bedrock's adapter sets it: the reservation less the input, at most 4,096."""

    clock: Any
    calls: list[tuple[float, int]] = field(default_factory=list)  # (at, quota tokens)

    def invoke(self, request: ModelRequest) -> ModelResult:
        cap = request.max_tokens or request.projected_tokens
        output = min(cap - INPUT, DEFAULT_OUTPUT_CAP)
        self.calls.append((self.clock.now(), INPUT + int(BURNDOWN * output)))
        billed = INPUT + output
        return ModelResult(
            True, billed, "ok", stop_reason="max_tokens", input_tokens=INPUT, output_tokens=output
        )

    def converse(self, call: ConverseCall) -> Mapping[str, Any]:  # pragma: no cover
        raise AssertionError("no agent units here")


def run_output_heavy(counted: float, units: int = 24) -> tuple[Plane, BurndownModel, float, str]:
    """``units`` output-heavy units through one worker on a governor that counts output
    ``counted`` times, from an empty bucket; the model counts it 5 times. Returns the plane,
    the model and the instant the fleet started."""
    plane = Plane()
    config = GovernorConfig(QUOTA_TPM, 0.95, initial_fill=0.0, output_burndown=counted)
    plane.governor = InMemoryGovernor(config, now=plane.clock.now())
    plane.batches = replace(plane.batches, governor=plane.governor)
    model = BurndownModel(plane.clock)
    plane.worker = replace(plane.worker, governor=plane.governor, model=model)
    start = plane.clock.now()
    run_id = plane.submit(units)
    plane.run(run_id)
    assert plane.ledger.run(run_id).state is RunState.COMPLETED
    return plane, model, start, run_id


def test_output_heavy_units_of_a_burndown_5_model_stay_within_the_quota() -> None:
    # Given a burndown-5 model and a governor that knows it
    plane, model, start, run_id = run_output_heavy(counted=BURNDOWN)
    rate = QUOTA_TPM / 60 * 0.95
    # Then at every call the quota tokens the model counted since the start are within what
    # the governor credited (it started empty): the governed share of the quota per minute
    used = 0
    for at, quota in model.calls:
        used += quota
        assert used <= rate * (at - start) + 1e-6, f"{used:,} quota tokens by {at - start:.1f} s"
    # and over the run, per minute, within the quota
    minutes = (model.calls[-1][0] - start) / 60
    assert used / minutes <= QUOTA_TPM
    # while the ledger's books stay in billed tokens: input + output, once
    run = plane.ledger.run(run_id)
    assert run.spent == sum(a.tokens for a in plane.ledger.attempts(run_id))
    assert run.spent * BURNDOWN > used > run.spent


def test_before_output_burndown_the_same_fleet_sent_about_5x_the_quota() -> None:
    # the governor of before: output counted once, the model counting it 5 times
    _, model, start, _ = run_output_heavy(counted=1.0)
    used = sum(quota for _, quota in model.calls)
    minutes = (model.calls[-1][0] - start) / 60
    assert used / minutes > 3 * QUOTA_TPM


class RecordingGovernor(InMemoryGovernor):
    def __init__(self, config: GovernorConfig, now: float) -> None:
        super().__init__(config, now)
        self.draws: list[int] = []
        self.true_ups: list[int] = []

    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        got = super().draw(amount, lane, now, ticket, tenant)
        if got.granted:
            self.draws.append(amount)
        return got

    def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        self.true_ups.append(used)
        return super().true_up(grant, used, now)


@pytest.mark.parametrize("burndown", [1.0, 5.0])
def test_a_single_call_unit_draws_and_trues_up_in_quota_tokens(burndown: float) -> None:
    plane = Plane()
    gov = RecordingGovernor(
        GovernorConfig(600_000, 0.95, initial_fill=1.0, output_burndown=burndown),
        plane.clock.now(),
    )
    model = BurndownModel(plane.clock)
    plane.worker = replace(plane.worker, governor=gov, model=model)
    run_id = plane.submit(1)
    plane.run(run_id)
    [attempt] = plane.ledger.attempts(run_id)
    projected = 10_000  # the first unit's (test_service_flow.Plane.submit)
    # its draw: the projection, and 4,096 output tokens (the plane's cap) at the burndown
    assert gov.draws == [projected + int((burndown - 1) * 4_096)]
    # its true-up: 200 input + 4,096 output at the burndown; its bill: 4,296
    assert gov.true_ups == [INPUT + int(burndown * 4_096)]
    assert attempt.tokens == INPUT + 4_096


# -- agent turns through the worker -------------------------------------------------------------


@pytest.mark.parametrize("burndown", [1.0, 5.0])
def test_agent_turns_draw_and_true_up_in_quota_tokens_and_bill_in_tokens(burndown: float) -> None:
    ap = AgentPlane()
    p = ap.plane
    gov = RecordingGovernor(
        GovernorConfig(600_000, 0.95, initial_fill=1.0, output_burndown=burndown),
        p.clock.now(),
    )
    p.governor = gov
    p.worker = replace(p.worker, governor=gov)
    p.batches = replace(p.batches, governor=gov)
    run_id = ap.submit(agent_units(2, turns=3))
    ap.pump()
    assert p.ledger.run(run_id).state is RunState.COMPLETED
    started = [e for log in ap.logs(run_id).values() for e in log if e["type"] == "turn_started"]
    answered = [e for log in ap.logs(run_id).values() for e in log if e["type"] == "model_turn"]
    assert len(started) == len(answered) == 6
    # each turn drew its input estimate plus burndown x its output bound (512)...
    expected = [e["input_estimate"] + int(burndown * e["output_bound"]) for e in started]
    assert sorted(gov.draws) == sorted(expected)
    assert all(e["drawn"] == e["input_estimate"] + 512 for e in started)  # the billed draw
    # ...and was trued up to input + cache writes + burndown x output
    usages: list[Mapping[str, int]] = [e["usage"] for e in answered]
    assert sorted(gov.true_ups) == sorted(turn_quota(u, burndown) for u in usages)
    # the books stay in billed tokens, every token once
    assert_books_exact(ap, run_id)
    assert p.ledger.run(run_id).spent == sum(agent.billed_of(u) for u in usages)


def test_a_worker_without_burndown_draws_exactly_its_units_tokens() -> None:
    # burndown 1: the draw is the unit's tokens, never reading its prompt
    plane = Plane()
    w: Worker = plane.worker
    assert w.governor.config.output_burndown == 1.0
    plane.submit(1)
    plane.fan_out()
    item = plane.queue.receive()
    assert item is not None
    assert w.quota_draw(item) == item.tokens == 10_000


# -- swarm fleet / GET /fleet -------------------------------------------------------------------


def test_the_fleet_view_shows_the_burndown_beside_the_governors_figures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from swarm.cli import ops
    from tests.unit.helpers import run_cli

    plane = Plane()
    gov = InMemoryGovernor(GovernorConfig(600_000, 0.95, output_burndown=5.0), plane.clock.now())
    plane.batches = replace(plane.batches, governor=gov)
    doc = plane.batches.fleet(plane.clock.now())  # GET /fleet's body
    assert doc["governor"]["output_burndown"] == 5.0
    assert doc["governor"]["capacity_tokens"] == 600_000  # quota tokens

    class Client:
        def fleet(self) -> dict[str, Any]:
            return doc

    monkeypatch.setattr(ops, "client_of", lambda args: Client())
    code, out, _ = run_cli(["fleet"], capsys)
    assert code == 0
    assert out.splitlines()[0].endswith("0 throttles, output burndown x5"), out


def test_the_fan_out_books_places_for_the_draw_the_worker_will_present() -> None:
    from tests.unit.test_chunked_fanout import Booker

    booker = Booker()
    plane = Plane()
    gov = InMemoryGovernor(GovernorConfig(600_000, 0.95, output_burndown=5.0), plane.clock.now())
    plane.fanout = replace(
        plane.fanout, places=booker, hold_s=1.0, clock=plane.clock.now, output_burndown=5.0
    )
    plane.worker = replace(plane.worker, governor=gov)
    plane.batches = replace(plane.batches, governor=gov)
    units = [UnitInput(f"u{i:02d}", 1_000 + i, f"in {i}") for i in range(4)]
    request = SubmitRequest(lane=Lane.LOW, budget=10**8, max_attempts=3, units=units)
    plane.batches.submit("acme", request, None, plane.clock.now())
    plane.fan_out()
    sent = plane.queue.sent
    # a string prompt asks for no maxTokens: its whole projection may be output, at 5x
    assert booker.calls == [([5 * q.tokens for q in sent], Lane.LOW, "acme")]
    # and its worker draws exactly the amount its place was booked for (so it is honoured)
    assert all(q.ticket is not None and q.ticket.amount == plane.worker.quota_draw(q) for q in sent)


def test_the_submit_refuses_a_unit_whose_quota_draw_the_bucket_can_never_grant() -> None:
    plane = Plane()
    gov = InMemoryGovernor(GovernorConfig(110_000, 0.95, output_burndown=5.0), plane.clock.now())
    plane.batches = replace(plane.batches, governor=gov)

    def unit(max_tokens: int) -> UnitInput:
        prompt = {
            "messages": [{"role": "user", "content": [{"text": "write at length"}]}],
            "inferenceConfig": {"maxTokens": max_tokens},
        }
        return UnitInput("u0", 100_000, prompt)

    # 100,000 tokens fit the bucket (110,000) billed, but not in quota tokens: 100,000 + 4 x
    # 4,096 (it asks for 8,000 output tokens, Bedrock's adapter sends at most 4,096)
    request = SubmitRequest(lane=Lane.HIGH, budget=10**8, max_attempts=3, units=[unit(8_000)])
    with pytest.raises(InvalidInput) as error:
        plane.batches.submit("acme", request, None, plane.clock.now())
    assert error.value.field == "units[0].projected_tokens"
    assert "116,384 tokens" in error.value.message
    # asking for at most 2,000 output tokens, it draws 108,000: accepted
    request = SubmitRequest(lane=Lane.HIGH, budget=10**8, max_attempts=3, units=[unit(2_000)])
    assert plane.batches.submit("acme", request, None, plane.clock.now()).run.run_id
