"""Budgets in dollars through the services on in-memory ports (docs/explanation/ledger.md, "Money"):
the API's budget_usd and top_up_usd, admission by projected cost, settlement by priced usage (cache
tokens at their own rates), duplicates and dead workers, prices changed by a deploy."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from swarm.api.models import BatchResume, BatchSubmission, ResultsQuery
from swarm.core.errors import InvalidInput
from swarm.core.pricing import Prices, Usage, cost_micro, usd
from swarm.core.records import RunState, UnitState
from swarm.core.tenancy import TenantLimits, TenantPolicy
from swarm.service.worker import Ack, Requeue
from tests.unit.test_service_flow import Plane

PRICES = Prices(dt.date(2026, 12, 6), 800_000, 4_000_000, 80_000, 1_000_000)
DEARER = Prices(dt.date(2027, 1, 1), 1_000_000, 5_000_000, 100_000, 1_250_000)


def money_plane(prices: Prices | None = PRICES, **kw: Any) -> Plane:
    """The services with the model's prices (cdk.json model.prices) and a prompt cache."""
    plane = Plane(**kw)
    plane.batches.config = replace(plane.batches.config, prices=prices)
    plane.worker.prices = prices
    plane.model.cache_share = 0.5
    return plane


def units(n: int) -> list[dict[str, Any]]:
    # a shared prefix, so the simulated cache reads it after its first call writes it
    return [
        {"unit_id": f"u{i:03d}", "projected_tokens": 2_000, "input": "x" * 2_000 if i else "x"}
        for i in range(n)
    ]


def submit(plane: Plane, tenant: str = "acme", **body: Any) -> str:
    doc = BatchSubmission.model_validate({"units": units(body.pop("n", 20)), **body})
    return plane.batches.submit_body(tenant, doc, None, plane.clock.now()).run.run_id


def modelled_cost(plane: Plane, run_id: str, prices: Prices) -> int:
    """What the model's own log of its calls costs at ``prices``, each call rounded up."""
    return sum(
        cost_micro(
            Usage(c.input_tokens, c.output_tokens, c.cache_read_tokens, c.cache_write_tokens),
            prices,
        )
        for c in plane.model.log(run_id)
        if not c.throttled
    )


def test_a_tenant_capped_in_dollars_gives_dollar_budgets_within_its_cap_top_ups_included() -> None:
    cap = TenantLimits(max_budget_micro_per_batch=3_000_000)  # $3 (cdk.json: 3)
    plane = money_plane(tenants=TenantPolicy(TenantLimits(), {"acme": cap}))
    # capped in dollars only, a budget in tokens would be uncapped: refused, saying what to give
    for body in ({"budget": 10**6}, {}):  # no budget: the deployment's default, in tokens
        with pytest.raises(InvalidInput) as e:
            submit(plane, n=2, **body)
        assert e.value.field == "budget" and "give budget_usd" in e.value.message
    with pytest.raises(InvalidInput) as e:
        submit(plane, budget_usd=Decimal("3.000001"), n=2)
    assert e.value.field == "budget_usd" and "above the maximum of $3.000000" in e.value.message
    assert plane.ledger.records()[0] == []  # nothing written by a refusal
    run_id = submit(plane, budget_usd=Decimal("2.5"), n=2)
    with pytest.raises(InvalidInput) as e:
        plane.batches.resume_body(
            "acme", run_id, BatchResume(top_up_usd=Decimal("0.6")), plane.clock.now()
        )
    assert e.value.field == "top_up_usd" and "top up at most $0.500000" in e.value.message
    assert plane.ledger.run(run_id).budget == 2_500_000
    # another tenant, uncapped, is not held to acme's cap
    submit(plane, "other", budget_usd=5, n=2)
    # capped in both units: either is taken, each within its own cap
    both = TenantLimits(max_budget_per_batch=10**6, max_budget_micro_per_batch=3_000_000)
    plane = money_plane(tenants=TenantPolicy(both))
    submit(plane, budget=10**6, n=2)
    submit(plane, budget_usd=3, n=2)
    with pytest.raises(InvalidInput) as e:
        submit(plane, budget=10**6 + 1, n=2)
    assert e.value.field == "budget"


def test_a_batch_in_dollars_completes_with_books_exact_in_tokens_and_dollars() -> None:
    plane = money_plane(failure_rate=0.1)
    run_id = submit(plane, budget_usd=5, n=30)
    plane.run(run_id)
    run = plane.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.spec.usd and run.budget == 5_000_000
    attempts = plane.ledger.attempts(run_id)
    # spent is every attempt's priced usage, exactly, and what the model's log costs
    assert (
        run.spent_micro
        == sum(a.cost_micro for a in attempts)
        == modelled_cost(plane, run_id, PRICES)
    )
    assert run.spent == sum(a.tokens for a in attempts) == plane.model.tokens_billed
    assert all(a.prices == PRICES for a in attempts)
    # the cache tokens were reported apart and priced at their own rates
    calls = plane.model.log(run_id)
    assert sum(c.cache_read_tokens for c in calls) > 0
    assert sum(c.cache_write_tokens for c in calls) > 0
    # each model call was capped at the unit's tokens, never at its projected micro-dollars
    assert {c.projected for c in calls} == {2_000}
    status = plane.batches.status("acme", run_id, plane.clock.now())
    assert status["usd"] == {
        "spent": usd(run.spent_micro),
        "budget": "5.000000",
        "reserved": "0.000000",
        "available": usd(5_000_000 - run.spent_micro),
    }
    assert status["tokens"] == {"spent": run.spent}
    assert f"spent ${usd(run.spent_micro)} of $5.000000" in status["healthy_line"]
    # each unit's result shows its spend in dollars beside its tokens
    page = plane.finalizer.results.page(run, ResultsQuery(limit=100))
    by_unit = {u.unit_id: u for u in plane.ledger.units(run_id)}
    assert {r["unit_id"]: (r["tokens"], r["usd"]) for r in page["units"]} == {
        u.unit_id: (u.spent, usd(u.spent_micro)) for u in by_unit.values()
    }


def test_a_batch_in_tokens_shows_its_spend_in_dollars_too() -> None:
    plane = money_plane()
    run_id = submit(plane, budget=10**6, n=5)
    plane.run(run_id)
    run = plane.ledger.run(run_id)
    status = plane.batches.status("acme", run_id, plane.clock.now())
    assert status["tokens"]["budget"] == 10**6
    assert status["usd"] == {"spent": usd(run.spent_micro)}
    assert run.spent_micro == modelled_cost(plane, run_id, PRICES) > 0
    assert status["healthy_line"].endswith(
        f"tokens ({run.spent / 10**6:.1%}), ${usd(run.spent_micro)} | retries 0 | dead-lettered 0"
    )


def test_dollars_run_out_then_a_top_up_in_dollars_completes_the_exact_remainder() -> None:
    plane = money_plane()
    # a unit asking no maxTokens may answer with all its 2,000 tokens, at $4.00 per million
    run_id = submit(plane, budget_usd=0.05, n=20)
    assert plane.ledger.unit(run_id, "u001").projected_micro == 8_000
    plane.run(run_id)
    status = plane.batches.status("acme", run_id, plane.clock.now())
    assert status["state"] == "exhausted"
    run = plane.ledger.run(run_id)
    assert 0 < run.completed < 20 and run.spent_micro <= run.budget
    # the top-up must be in the budget's unit
    with pytest.raises(InvalidInput) as e:
        plane.batches.resume_body("acme", run_id, BatchResume(top_up=1_000_000), plane.clock.now())
    assert e.value.field == "top_up" and "give top_up_usd" in e.value.message
    resumed = plane.batches.resume_body(
        "acme", run_id, BatchResume(top_up_usd=Decimal("1.5")), plane.clock.now()
    )
    assert resumed["requeued"] == status["counts"]["remainder"]
    assert resumed["usd"]["budget"] == "1.550000"
    plane.run(run_id)
    run = plane.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 20
    attempts = plane.ledger.attempts(run_id)
    assert (
        run.spent_micro
        == sum(a.cost_micro for a in attempts)
        == modelled_cost(plane, run_id, PRICES)
    )


def test_a_duplicate_delivery_and_a_dead_worker_keep_the_dollars_exact() -> None:
    plane = money_plane()
    run_id = submit(plane, budget_usd=10, n=3)
    plane.fan_out()
    first = plane.queue.receive()
    assert first is not None
    plane.worker.process(first)
    assert plane.worker.process(first).outcome == Ack("unit is completed")  # a duplicate
    item = plane.queue.receive()
    assert item is not None
    unit = plane.ledger.unit(run_id, item.unit_id)
    # a worker claims the attempt, then dies before settling
    assert plane.ledger.claim(run_id, item.unit_id, 0, plane.clock.now(), 300).claimed
    busy = plane.worker.process(item)
    assert isinstance(busy.outcome, Requeue)
    plane.clock.t += 301
    assert plane.worker.process(item).outcome == Ack("completed")
    lost = [a for a in plane.ledger.attempts(run_id) if a.reclaimed]
    assert [(a.tokens, a.cost_micro, a.prices) for a in lost] == [
        (unit.projected_tokens, unit.projected_micro, PRICES)
    ]
    plane.pump()
    run = plane.ledger.run(run_id)
    attempts = plane.ledger.attempts(run_id)
    assert run.state is RunState.COMPLETED and len(attempts) == 4
    # the lost attempt at its projection, the others at what the model reported
    assert run.spent_micro == sum(a.cost_micro for a in attempts)
    assert run.spent_micro == unit.projected_micro + modelled_cost(plane, run_id, PRICES)


def test_a_price_change_applies_to_the_attempts_settled_after_it() -> None:
    plane = money_plane()
    run_id = submit(plane, budget_usd=10, n=4)
    plane.fan_out()
    for _ in range(2):
        item = plane.queue.receive()
        assert item is not None
        plane.worker.process(item)
    plane.worker.prices = DEARER  # a deploy with new prices: its workers price by them
    plane.pump()
    attempts = sorted(plane.ledger.attempts(run_id), key=lambda a: a.settled_at)
    assert [a.prices for a in attempts] == [PRICES, PRICES, DEARER, DEARER]
    calls = plane.model.log(run_id)
    for attempt, call in zip(attempts, calls, strict=True):
        usage = Usage(
            call.input_tokens, call.output_tokens, call.cache_read_tokens, call.cache_write_tokens
        )
        assert attempt.cost_micro == cost_micro(usage, attempt.prices or PRICES)
    assert plane.ledger.run(run_id).spent_micro == sum(a.cost_micro for a in attempts)
    assert plane.ledger.units(run_id)[0].state is UnitState.COMPLETED


def test_bad_dollar_budgets_are_400s_naming_the_field() -> None:
    plane = money_plane()
    with pytest.raises(InvalidInput) as e:
        submit(plane, budget=1_000, budget_usd=5)
    assert e.value.field == "budget, budget_usd"
    unpriced = money_plane(prices=None)
    with pytest.raises(InvalidInput) as e:
        submit(unpriced, budget_usd=5)
    assert e.value.field == "budget_usd" and "has no prices" in e.value.message
    capped = money_plane(
        tenants=TenantPolicy(TenantLimits(), {"acme": TenantLimits(max_budget_per_batch=10**6)})
    )
    with pytest.raises(InvalidInput) as e:
        submit(capped, budget_usd=5)
    assert e.value.field == "budget_usd" and "max_budget_per_batch" in e.value.message
    # a batch in tokens takes a top-up in tokens
    run_id = submit(plane, budget=10**6, n=2)
    with pytest.raises(InvalidInput) as e:
        plane.batches.resume_body(
            "acme", run_id, BatchResume(top_up_usd=Decimal(1)), plane.clock.now()
        )
    assert e.value.field == "top_up_usd" and "give top_up" in e.value.message
