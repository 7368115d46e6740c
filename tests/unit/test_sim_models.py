"""The simulator and the planner on several models: each with its own quota (TPM, and RPM when
given), output burndown and prices; a unit mix across them; exact costs; Lab 6.1 unchanged."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import date
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.core.errors import InvalidInput
from swarm.core.pricing import parse_usd
from swarm.core.scheduling import Schedule, ServiceModel
from swarm.sim.engine import FleetConfig, ModelSimulation, SimResult, simulate
from swarm.sim.models import (
    Catalog,
    Mix,
    Models,
    Prices,
    dollars,
    parse_catalog,
    parse_mix,
)
from swarm.sim.plan import binding_limits, model_limits, plan_models
from swarm.sim.workload import Workload

BOOK = Schedule.BOOK

HAIKU_PRICES = {
    "as_of": "2026-12-01",
    "input": 0.80,
    "output": 4.00,
    "cache_read": 0.08,
    "cache_write": 1.00,
}


def catalog(**entries: dict[str, Any]) -> Catalog:
    return parse_catalog({"default": next(iter(entries)), "catalog": entries})


def lab61_model() -> Models:
    """Lab 6.1's model as a catalog entry: 300,000 TPM, burndown 1, no rpm."""
    return Models.default(catalog(lab={"model_id": "x", "tpm": 300_000, "output_burndown": 1}))


# ---------------------------------------------------------------------- Lab 6.1 unchanged


@pytest.mark.parametrize(
    ("workers", "elapsed"), [(25, 5_091), (50, 2_815), (100, 1_746), (200, 1_604)]
)
def test_lab61_sweep_is_unchanged_on_one_model(workers: int, elapsed: int) -> None:
    fleet = FleetConfig(workers=workers, schedule=BOOK, models=lab61_model())
    result = simulate(Workload(), fleet)
    assert result.elapsed == elapsed
    assert result.run.spent == 4_905_337 and result.run.retries == 9


def test_lab61_budget_capped_run_is_unchanged_on_one_model() -> None:
    fleet = FleetConfig(budget=2_500_000, schedule=BOOK, models=lab61_model())
    result = simulate(Workload(), fleet)
    assert result.run.state.value == "exhausted"
    assert (result.elapsed, result.run.completed, result.run.spent) == (1_031, 206, 2_498_987)


@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize("workers", [25, 150])
@pytest.mark.parametrize("seed", [0, 7])
def test_one_model_runs_exactly_as_the_single_quota_simulator(
    schedule: Schedule, workers: int, seed: int
) -> None:
    # Given one model of burndown 1 and no rpm (whatever the output share)
    workload = Workload(seed=seed)
    plain = FleetConfig(workers=workers, schedule=schedule, budget=4_000_000)
    models = replace(lab61_model(), output_share=0.7)
    a, b = simulate(workload, plain), simulate(workload, replace(plain, models=models))
    # Then every figure is today's simulator's
    assert (a.elapsed, a.floor, a.remainder) == (b.elapsed, b.floor, b.remainder)
    assert a.run == b.run


# ---------------------------------------------------------------------- the catalog


def test_the_catalog_takes_cdk_json_models_shape_with_its_defaults() -> None:
    c = parse_catalog(
        {
            "default": "haiku",
            "catalog": {
                "haiku": {
                    "model_id": "anthropic.claude-3-5-haiku-20241022-v1:0",
                    "tpm": 300_000,
                    "rpm": 1_000,
                    "output_burndown": 1,
                    "governor_share": 0.9,
                    "prices": HAIKU_PRICES,
                },
                "sonnet": {
                    "model_id": "us.anthropic.claude-sonnet-4-20250514-v1:0",
                    "tpm": 200_000,
                },
            },
        }
    )
    haiku, sonnet = c["haiku"], c["sonnet"]
    assert (haiku.tpm, haiku.rpm, haiku.output_burndown, haiku.share(0.95)) == (
        300_000,
        1_000,
        1.0,
        0.9,
    )
    assert haiku.prices == Prices(date(2026, 12, 1), 800_000, 4_000_000, 80_000, 1_000_000)
    # absent: no request bucket, the burndown Bedrock documents for the id, the fleet's share
    assert (sonnet.rpm, sonnet.output_burndown, sonnet.share(0.95), sonnet.prices) == (
        None,
        5.0,
        0.95,
        None,
    )


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"model_id": "m"}, "models.catalog.m.tpm"),
        ({"model_id": "m", "tpm": 0}, "models.catalog.m.tpm"),
        ({"model_id": "m", "tpm": 10, "rpm": 1.5}, "models.catalog.m.rpm"),
        ({"tpm": 10}, "models.catalog.m.model_id"),
        ({"model_id": "m", "tpm": 10, "output_burndown": 0.5}, "models.catalog.m.output_burndown"),
        ({"model_id": "m", "tpm": 10, "governor_share": 1.5}, "models.catalog.m.governor_share"),
        (
            {"model_id": "m", "tpm": 10, "prices": {**HAIKU_PRICES, "input": 0.1234567}},
            "models.catalog.m.prices.input",
        ),
        (
            {"model_id": "m", "tpm": 10, "prices": {**HAIKU_PRICES, "as_of": "December"}},
            "models.catalog.m.prices.as_of",
        ),
        (
            {"model_id": "m", "tpm": 10, "prices": {"as_of": "2026-12-01", "input": 1}},
            "models.catalog.m.prices.output",
        ),
    ],
)
def test_a_bad_catalog_entry_is_refused_by_its_key(entry: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_catalog({"default": "m", "catalog": {"m": entry}})
    assert e.value.field == field


def test_the_default_must_be_in_the_catalog() -> None:
    with pytest.raises(InvalidInput) as e:
        parse_catalog({"default": "opus", "catalog": {"m": {"model_id": "m", "tpm": 10}}})
    assert e.value.field == "models.default" and "'opus'" in e.value.message


def test_prices_are_exact_micro_dollars() -> None:
    assert parse_usd(0.8, "p") == 800_000 and parse_usd("0.000001", "p") == 1
    assert dollars(10_914_055) == "$10.914055" and dollars(5_000_000) == "$5.00"


# ---------------------------------------------------------------------- the mix


def test_the_mix_splits_units_by_largest_remainder_on_the_seed() -> None:
    c = catalog(a={"model_id": "a", "tpm": 10}, b={"model_id": "b", "tpm": 10})
    mix = parse_mix("a=0.8, b=0.2", c)
    assert mix.counts(7) == {"a": 6, "b": 1}  # 5.6 and 1.4: the larger remainder wins
    assigned = mix.assign(400, seed=3)
    assert (assigned.count("a"), assigned.count("b")) == (320, 80)
    assert assigned == mix.assign(400, seed=3) != mix.assign(400, seed=4)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a=0.5,opus=0.5", "'opus' is not a model of the catalog: use one of a, b"),
        ("a=0.5,b=0.4", "the fractions add up to 0.9, not 1"),
        ("a=1.5", "a's fraction must be a number in (0, 1]"),
        ("a=x", "a's fraction must be a number in (0, 1]"),
        ("a", "'a' is not name=fraction"),
        ("a=0.5,a=0.5", "'a' appears more than once"),
    ],
)
def test_a_bad_mix_is_refused(text: str, says: str) -> None:
    c = catalog(a={"model_id": "a", "tpm": 10}, b={"model_id": "b", "tpm": 10})
    with pytest.raises(InvalidInput) as e:
        parse_mix(text, c)
    assert e.value.field == "--mix" and says in e.value.message


# ---------------------------------------------------------------------- limits and buckets

#: many small calls: a large TPM, a small RPM
ROUTER = {"model_id": "anthropic.claude-3-5-haiku-20241022-v1:0", "tpm": 1_000_000, "rpm": 60}
#: output-heavy at burndown 5: an RPM it never reaches
WRITER = {"model_id": "us.anthropic.claude-sonnet-4-20250514-v1:0", "tpm": 200_000, "rpm": 10_000}
SMALL_CALLS = Workload(
    units=600, min_tokens=200, max_tokens=400, failure_rate=0.0, seed=1, service=ServiceModel(5)
)


def two_models(output_share: float = 0.6) -> Models:
    c = catalog(router=ROUTER, writer=WRITER)
    return Models(c, Mix((("router", 0.5), ("writer", 0.5))), output_share)


def _starts(result: SimResult, sim: ModelSimulation, model: str) -> list[tuple[int, int]]:
    """(start second, quota tokens drawn) of ``model``'s attempts, by start."""
    out = []
    for a in sim.ledger.attempts("sim-run"):
        if sim.model_of[sim.workload.index_of(a.unit_id)] == model:
            start = int(a.settled_at) - sim.workload.service_s(a.tokens)
            out.append((start, sim.models.draw(model, a.tokens)))
    return sorted(out)


def test_the_planner_names_rpm_for_many_small_calls_and_tpm_for_burndown_5_output() -> None:
    fleet = FleetConfig(workers=400, models=two_models())
    limits = {m.name: m for m in model_limits(SMALL_CALLS, fleet)}
    router, writer = limits["router"], limits["writer"]
    # the router's 300-token calls: 52.8 units/s by TPM, 0.95 by RPM
    assert router.quota == "RPM" and router.units_per_s_tpm > 50 > 1 > (router.rpm_rate or 0)
    # the writer's outputs count 5 times: 300 billed tokens draw ~1,020 quota tokens (its
    # output, floor(0.6 x tokens), a token short at most, 4 quota tokens less)
    assert writer.mean_quota_tokens == pytest.approx(writer.mean_tokens * (1 + 4 * 0.6), abs=4)
    assert writer.quota == "TPM"
    # N*: Little's law on the rate that binds
    assert router.n_star == math.ceil(0.95 * router.mean_seconds)
    assert binding_limits(tuple(limits.values()), 400) == {"router": "RPM", "writer": "TPM"}
    writer_rate = 200_000 / 60 * 0.95 / writer.mean_quota_tokens  # units/s
    assert writer.n_star == math.ceil(writer_rate * writer.mean_seconds)
    assert (router.n_star, writer.n_star) == (8, 24)
    # a fleet that covers the router's N* but not the writer's: the writer's workers bind
    assert binding_limits(tuple(limits.values()), 20) == {"router": "RPM", "writer": "workers"}
    assert binding_limits(tuple(limits.values()), 10) == {"router": "workers", "writer": "workers"}
    # the plan says the same
    p = plan_models(SMALL_CALLS, fleet, seeds=1)
    assert p.binding(p.outcome) == {"router": "RPM", "writer": "TPM"}
    assert p.sizing.per_lane >= router.n_star + writer.n_star


def test_each_models_buckets_are_never_over_granted() -> None:
    # Given the two models on a fleet large enough that only the quotas bind
    fleet = FleetConfig(workers=400, models=two_models())
    sim = ModelSimulation.fresh(SMALL_CALLS, fleet)
    result = sim.run_until()
    assert result.run.state.value == "completed"
    router = sim.states["router"].requests
    writer = sim.states["writer"].governor
    assert router is not None
    # Then by any second t the router started at most rate x t requests (an empty bucket at 0)
    for k, (start, _) in enumerate(_starts(result, sim, "router")):
        assert k + 1 <= router.config.rate * start + 1e-9
    # and the writer drew at most rate x t quota tokens, outputs counted 5 times
    drawn = 0
    for start, quota in _starts(result, sim, "writer"):
        drawn += quota
        assert drawn <= writer.config.rate * start + 1e-9
    figures = {m.name: m for m in result.models}
    w = figures["writer"]
    assert w.quota_tokens == w.billed_tokens + 4 * w.output_tokens
    # the RPM sets the router's end: its last attempt is no sooner than its requests allow
    r = figures["router"]
    assert r.rpm_floor_s is not None and r.last_end_s >= r.rpm_floor_s > r.tpm_floor_s


def test_without_its_rpm_the_router_finishes_far_sooner() -> None:
    # the request bucket is what holds the router back
    slow = simulate(SMALL_CALLS, FleetConfig(workers=400, models=two_models()))
    c = catalog(router={**ROUTER, "rpm": None}, writer=WRITER)
    fast_models = Models(c, Mix((("router", 0.5), ("writer", 0.5))), 0.6)
    fast = simulate(SMALL_CALLS, FleetConfig(workers=400, models=fast_models))
    end = {m.name: m.last_end_s for m in slow.models}
    fast_end = {m.name: m.last_end_s for m in fast.models}
    assert fast_end["router"] * 3 < end["router"]


def test_a_unit_too_large_for_its_models_bucket_is_refused_by_name() -> None:
    c = catalog(tiny={"model_id": "t", "tpm": 1_000})
    with pytest.raises(InvalidInput) as e:
        simulate(Workload(units=3), FleetConfig(models=Models.default(c)))
    assert e.value.field == "units[0].projected_tokens" and "on model tiny" in e.value.message


# ---------------------------------------------------------------------- cost


def test_the_cost_is_the_hand_computation() -> None:
    # Given two units that never fail on a haiku-priced model, a quarter of their tokens output
    c = catalog(haiku={"model_id": "h", "tpm": 300_000, "prices": HAIKU_PRICES})
    workload = Workload.from_sizes([1_000, 3_001], failure_rate=0.0)
    result = simulate(workload, FleetConfig(models=Models.default(c, output_share=0.25)))
    (haiku,) = result.models
    # 1,000 tokens: 750 in x $0.80 + 250 out x $4.00 per million = 600 + 1,000 micro-dollars
    # 3,001 tokens: 2,251 in x 0.80 + 750 out x 4.00 = 1,800.8 + 3,000 = 4,800.8, so 4,801
    assert (haiku.input_tokens, haiku.output_tokens) == (750 + 2_251, 250 + 750)
    assert haiku.cost_micro_usd == 1_600 + 4_801
    assert dollars(haiku.cost_micro_usd) == "$0.006401"


def test_every_attempt_is_priced_failed_ones_too() -> None:
    c = catalog(haiku={"model_id": "h", "tpm": 300_000, "prices": HAIKU_PRICES})
    models = Models.default(c, output_share=0.25)
    result = simulate(Workload(), FleetConfig(models=models))
    (haiku,) = result.models
    assert haiku.attempts == 409 and haiku.billed_tokens == result.run.spent == 4_905_337
    prices = c["haiku"].prices
    assert prices is not None
    out = haiku.output_tokens
    # each attempt rounds up to the micro-dollar: at most one micro-dollar per attempt above
    exact = (haiku.input_tokens * 800_000 + out * 4_000_000) / 1e6
    assert exact <= haiku.cost_micro_usd < exact + haiku.attempts


def test_a_unit_waiting_for_its_models_quota_holds_its_worker() -> None:
    # Given one worker, a unit on a model whose empty bucket needs ~11 s to cover it, and a
    # unit on a model with quota to spare, queued in that order
    c = catalog(slow={"model_id": "s", "tpm": 6_000}, fast={"model_id": "f", "tpm": 1_000_000})
    workload = Workload.from_sizes([1_000, 1_000], failure_rate=0.0, service=ServiceModel(10))
    models = Models.named(c, ["slow", "fast"])
    sim = ModelSimulation.fresh(workload, FleetConfig(workers=1, models=models))
    result = sim.run_until()
    ends = {a.unit_id: a.settled_at for a in sim.ledger.attempts("sim-run")}
    # Then the fast unit waits for the worker the slow one holds: 1,000 tokens at 95 tokens/s
    # are granted at 11 s, the slow unit runs 20 s, then the fast one 20 s
    assert ends == {"unit-00000": 31, "unit-00001": 51}
    assert result.elapsed == 51


@settings(max_examples=30, deadline=None)
@given(
    units=st.integers(1, 60),
    fraction=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    rpm=st.one_of(st.none(), st.integers(6, 200)),
    max_tokens=st.sampled_from([400, 4_000]),
    burndown=st.sampled_from([1, 2.5, 5]),
    output_share=st.sampled_from([0.0, 0.3, 0.9]),
    workers=st.integers(1, 40),
    schedule=st.sampled_from(list(Schedule)),
    seed=st.integers(0, 1_000),
)
def test_no_models_bucket_is_ever_over_granted(
    units: int,
    fraction: float,
    rpm: int | None,
    max_tokens: int,
    burndown: float,
    output_share: float,
    workers: int,
    schedule: Schedule,
    seed: int,
) -> None:
    """Whatever the mix, quotas, burndown and fleet: by any second t, each model's attempts
    started have drawn at most rate x t quota tokens and (with an rpm) rate x t requests from
    its buckets, empty at 0; and the books add up across the models."""
    c = catalog(
        a={"model_id": "a", "tpm": 60_000, "rpm": rpm, "output_burndown": burndown},
        b={"model_id": "b", "tpm": 120_000, "rpm": 60},
    )
    parts = (("a", fraction),) if fraction == 1.0 else (("a", fraction), ("b", 1 - fraction))
    models = Models(c, Mix(parts), output_share)
    workload = Workload(units=units, min_tokens=50, max_tokens=max_tokens, seed=seed)
    sim = ModelSimulation.fresh(
        workload, FleetConfig(workers=workers, schedule=schedule, models=models)
    )
    result = sim.run_until()
    for name, state in sim.states.items():
        starts = _starts(result, sim, name)
        drawn = 0
        for k, (start, quota) in enumerate(starts):
            drawn += quota
            assert drawn <= state.governor.config.rate * start + 1e-6
            if state.requests is not None:
                assert k + 1 <= state.requests.config.rate * start + 1e-6
    assert sum(m.billed_tokens for m in result.models) == result.run.spent
    assert sum(m.units for m in result.models) == units
