"""Tenants cannot hurt each other, at the front door (swarm.service.batches on in-memory ports):
a tenant's lanes, its budget per batch, its queue cap and its share of the lanes' ceiling; a
refused submission writes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from swarm.core.errors import InvalidInput
from swarm.core.records import Lane, RunState
from swarm.core.tenancy import TenantLimits, TenantPolicy
from swarm.service.batches import Shedding
from tests.unit.test_service_flow import Plane

#: every tenant: normal and low only, 100 units queued at most, 20 guaranteed, 2M tokens a batch
DEFAULTS = TenantLimits(
    lanes=frozenset({Lane.NORMAL, Lane.LOW}),
    max_queued_units=100,
    guaranteed_units=20,
    max_budget_per_batch=2_000_000,
)
#: "vip" may use high too, and queue more
VIP = TenantLimits(frozenset(Lane), max_queued_units=1_000, guaranteed_units=20)


def plane(**kw: object) -> Plane:
    return Plane(tenants=TenantPolicy(DEFAULTS, {"vip": VIP}), **kw)  # type: ignore[arg-type]


def written(p: Plane) -> tuple[int, int, int]:
    """What a submission writes: ledger runs, S3 objects, executions started."""
    return len(p.ledger._runs), len(p.blobs.objects), len(p.executions.started)


def test_tenant_a_over_its_queue_cap_gets_429_while_tenant_b_is_accepted() -> None:
    # Given tenant a with 80 of its 100 units queued (fanned out onto the normal lane)
    p = plane()
    p.submit(80, tenant="a", budget=1_000_000)
    p.fan_out()
    before = written(p)
    # When a submits 30 more
    with pytest.raises(Shedding) as shed:
        p.submit(30, tenant="a", budget=1_000_000, key="more")
    # Then it is shed for its own queue with a Retry-After, and nothing is written
    assert shed.value.shed.reason == "tenant_queue"
    assert shed.value.retry_after_s >= 1
    assert "'a' has 80 units queued" in str(shed.value) and "at most 100" in str(shed.value)
    assert written(p) == before
    # and tenant b, with nothing queued, submits the same batch and is accepted
    run_b = p.submit(30, tenant="b", budget=1_000_000)
    assert p.ledger.run(run_b).spec.tenant == "b"


def test_a_tenants_queue_frees_as_its_units_finish() -> None:
    # Given tenant a at its cap
    p = plane()
    run_id = p.submit(100, tenant="a", budget=2_000_000)
    with pytest.raises(Shedding):
        p.submit(1, tenant="a", budget=100_000, key="one-more")
    # When its batch runs to completion
    p.run(run_id)
    assert p.ledger.run(run_id).state is RunState.COMPLETED
    # Then it may submit again
    p.submit(100, tenant="a", budget=2_000_000, key="next")


def test_a_lane_the_tenant_may_not_use_is_a_400_naming_lane_and_nothing_is_written() -> None:
    # Given a tenant allowed normal and low
    p = plane()
    # When it submits to high
    with pytest.raises(InvalidInput) as refused:
        p.submit(3, tenant="a", budget=100_000, lane=Lane.HIGH)
    # Then the error names the lane field and its lanes, and nothing is written
    assert refused.value.field == "lane" and "normal, low" in refused.value.message
    assert written(p) == (0, 0, 0)
    # while a tenant allowed high submits there
    p.submit(3, tenant="vip", budget=100_000, lane=Lane.HIGH)


def test_a_budget_above_the_tenants_per_batch_maximum_is_a_400_naming_budget() -> None:
    # Given a tenant whose batches may have at most 2,000,000 tokens
    p = plane()
    # When it submits a batch with a budget of 2,000,001
    with pytest.raises(InvalidInput) as refused:
        p.submit(3, tenant="a", budget=2_000_001)
    # Then it is a 400 naming budget, and nothing is written
    assert refused.value.field == "budget" and "2,000,000" in refused.value.message
    assert written(p) == (0, 0, 0)


def test_a_batch_larger_than_the_cap_is_a_400_naming_units() -> None:
    # Given a tenant that may queue 100 units
    # When one batch holds 101
    p = plane()
    with pytest.raises(InvalidInput) as refused:
        p.submit(101, tenant="a", budget=2_000_000)
    # Then it is bad input (no retry could ever pass), naming units
    assert refused.value.field == "units"
    assert written(p) == (0, 0, 0)


def test_deep_lanes_do_not_refuse_a_tenant_within_its_share() -> None:
    # Given lanes past their ceiling (normal: 50), all of it vip's work
    p = plane(shed_limits={Lane.HIGH: 100, Lane.NORMAL: 50, Lane.LOW: 50})
    p.submit(400, tenant="vip", budget=10**7)
    p.fan_out()
    # When tenant b, with nothing queued, submits within its share (20 units)
    run_b = p.submit(20, tenant="b", budget=1_000_000)
    # Then it is accepted
    assert p.ledger.run(run_b).spec.tenant == "b"
    # but once past its share, the lanes' ceiling applies to b too
    with pytest.raises(Shedding) as shed:
        p.submit(5, tenant="b", budget=100_000, key="past-share")
    assert shed.value.shed.reason == "lane_depth"
    # and vip, far past its share, is shed by the ceiling it filled
    with pytest.raises(Shedding) as vip:
        p.submit(5, tenant="vip", budget=100_000, key="vip-more")
    assert vip.value.shed.reason == "lane_depth"


def test_resume_keeps_to_the_tenants_budget_per_batch_and_queue_cap() -> None:
    # Given tenant a's exhausted batch of 60 units (a small budget runs out)
    p = plane()
    run_id = p.submit(60, tenant="a", budget=300_000)
    p.run(run_id)
    run = p.ledger.run(run_id)
    assert run.state is RunState.EXHAUSTED and run.remainder > 0
    # When a top-up would take its budget past the tenant's 2,000,000 per batch
    with pytest.raises(InvalidInput) as refused:
        p.batches.resume("a", run_id, 1_800_000, p.clock.now())
    # Then it is a 400 naming top_up with what may still be added, and nothing changed
    assert refused.value.field == "top_up" and "at most 1,700,000" in refused.value.message
    assert p.ledger.run(run_id).budget == 300_000
    # When a's other work fills its queue so the remainder would not fit
    p.submit(100 - run.remainder + 1, tenant="a", budget=1_000_000, key="filler")
    with pytest.raises(Shedding) as shed:
        p.batches.resume("a", run_id, 1_000_000, p.clock.now())
    # Then the resume is refused with 429 for a's own queue, and the run stays exhausted
    assert shed.value.shed.reason == "tenant_queue"
    assert p.ledger.run(run_id).state is RunState.EXHAUSTED


def test_a_tenant_without_a_cap_or_a_share_costs_no_ledger_read() -> None:
    # Given a deployment whose tenants have no queue cap and no share of their own
    p = Plane()

    def unexpected(*args: object) -> Any:
        raise AssertionError("the ledger was read for a tenant without a cap or a share")

    p.ledger.tenant_queue = unexpected  # type: ignore[method-assign,assignment]
    p.ledger.hold_queue = unexpected  # type: ignore[method-assign,assignment]
    # When a tenant submits
    # Then the submission is decided without reading the tenant's queued units
    p.submit(3, tenant="a", budget=100_000)


def test_two_submissions_racing_for_a_tenants_last_room_cannot_both_pass() -> None:
    # Given tenant a with 60 of its 100 units queued, and two submissions of 30 that each fit
    p = plane()
    p.submit(60, tenant="a", budget=1_000_000)
    p.fan_out()
    real = p.ledger.tenant_queue
    raced: list[str] = []

    def tenant_queue(tenant: str, now: float) -> Any:
        view = real(tenant, now)
        if not raced:  # the first submission has read 60; the second is decided meanwhile
            raced.append("deciding")
            raced.append(p.submit(30, tenant="a", budget=1_000_000, key="second"))
        return view

    p.ledger.tenant_queue = tenant_queue  # type: ignore[method-assign]
    before = written(p)
    # When the first goes on with the count it read (60 + 30 fits)
    with pytest.raises(Shedding) as shed:
        p.submit(30, tenant="a", budget=1_000_000, key="first")
    # Then it decides again on the second's units and is refused: 60 + 30 + 30 is past 100
    assert shed.value.shed.reason == "tenant_queue"
    assert "'a' has 90 units queued" in str(shed.value)
    # and only the second's batch was written (its run, manifest and spec, and its execution)
    assert written(p) == (before[0] + 1, before[1] + 2, before[2] + 1)
    assert p.ledger.run(raced[1]).spec.units_total == 30


def test_a_tenant_whose_submissions_keep_colliding_is_told_to_retry() -> None:
    # Given a ledger on which another submission of the tenant always holds first
    p = plane()
    real = p.ledger.tenant_queue

    def stale(tenant: str, now: float) -> Any:
        view = real(tenant, now)
        p.ledger.hold_queue(tenant, view.version, f"other-{view.version}", 1, now)
        return view

    p.ledger.tenant_queue = stale  # type: ignore[method-assign]
    # When it submits
    with pytest.raises(Shedding) as shed:
        p.submit(3, tenant="a", budget=100_000)
    # Then it is a 429 with a short Retry-After that says why, and its batch is not written
    assert shed.value.shed.reason == "tenant_busy" and shed.value.retry_after_s == 1
    assert "being decided at the same moment" in str(shed.value)
    assert written(p)[0] == 0
