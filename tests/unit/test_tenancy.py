"""Tenants cannot hurt each other: the pure decisions of swarm.core.tenancy and their use in
swarm.core.backpressure.shed_decision (lanes, budget per batch, the queue cap, the share)."""

from __future__ import annotations

import pytest

from swarm.core.backpressure import ShedPolicy, binding_snapshot, shed_decision, tenant_shed
from swarm.core.errors import InvalidInput
from swarm.core.governor import GovernorConfig, GovernorSnapshot
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import Lane
from swarm.core.tenancy import (
    TenantLimits,
    TenantPolicy,
    TenantQueue,
    check_batch_size,
    check_budget,
    check_lane,
)

NOW = 1_000.0
POLICY = ShedPolicy({Lane.HIGH: 1_000, Lane.NORMAL: 500, Lane.LOW: 100})
LIMITS = TenantLimits(
    lanes=frozenset({Lane.NORMAL, Lane.LOW}),
    max_queued_units=300,
    guaranteed_units=50,
    max_budget_per_batch=1_000_000,
)


def snapshot() -> GovernorSnapshot:
    # 300k TPM at 95%: 4,750 tokens/s governed, no throttles
    return InMemoryGovernor(GovernorConfig(300_000, 0.95), now=NOW).snapshot(NOW)


def decide(queued: int, adding: int, depth: int, lane: Lane = Lane.NORMAL):  # type: ignore[no-untyped-def]
    tenant = TenantQueue("acme", LIMITS, queued, adding)
    return shed_decision(POLICY, lane, {lane: depth}, snapshot(), 10_000, NOW, tenant)


def test_an_override_replaces_the_defaults_for_its_tenant_only() -> None:
    # Given defaults and one tenant named apart
    policy = TenantPolicy(TenantLimits(), {"acme": LIMITS})
    # When each tenant's limits are looked up
    # Then the named tenant gets its own, every other tenant the defaults
    assert policy.of("acme") is LIMITS
    assert policy.of("someone-else") == TenantLimits()


def test_a_lane_the_tenant_may_not_use_is_an_error_naming_lane_and_the_allowed_lanes() -> None:
    # Given a tenant allowed normal and low
    # When it asks for high
    with pytest.raises(InvalidInput) as refused:
        check_lane("acme", LIMITS, Lane.HIGH)
    # Then the error names the lane field and lists the lanes it may use, highest first
    assert refused.value.field == "lane"
    assert "'high'" in refused.value.message and "normal, low" in refused.value.message
    check_lane("acme", LIMITS, Lane.LOW)  # an allowed lane passes


def test_a_budget_above_the_tenants_per_batch_maximum_is_an_error_naming_budget() -> None:
    # Given a tenant whose batches may have at most 1,000,000 tokens
    # When a batch asks for one more
    with pytest.raises(InvalidInput) as refused:
        check_budget("acme", LIMITS, 1_000_001)
    # Then the error names budget and the maximum
    assert refused.value.field == "budget" and "1,000,000" in refused.value.message
    # and a top-up that would pass it names top_up and what may still be added
    with pytest.raises(InvalidInput) as top:
        check_budget("acme", LIMITS, 1_200_000, "top_up", room=400_000)
    assert top.value.field == "top_up" and "at most 400,000" in top.value.message
    check_budget("acme", LIMITS, 1_000_000)  # exactly the maximum is allowed
    check_budget("acme", TenantLimits(), 10**15)  # no maximum of its own


def test_a_batch_larger_than_the_tenants_whole_queue_cap_is_a_400_not_a_429() -> None:
    # Given a tenant that may have 300 units queued
    # When one batch alone holds 301
    with pytest.raises(InvalidInput) as refused:
        check_batch_size("acme", LIMITS, 301)
    # Then it is refused as bad input naming units (a 429 would be retried forever)
    assert refused.value.field == "units" and "300" in refused.value.message
    check_batch_size("acme", LIMITS, 300)


def test_a_tenant_past_its_queue_cap_is_shed_with_a_retry_after_for_its_excess() -> None:
    # Given a tenant with 280 of its 300 units queued and empty lanes
    # When it submits 40 more (20 past its cap)
    shed = decide(queued=280, adding=40, depth=0)
    # Then it is shed for its own queue, with the time 20 units of 10k tokens take at 4,750/s
    assert shed is not None and shed.reason == "tenant_queue"
    assert shed.retry_after_s == 43  # ceil(20 * 10,000 / 4,750)
    assert (shed.tenant_queued, shed.tenant_max) == (280, 300)
    # and exactly up to its cap it is admitted
    assert decide(queued=280, adding=20, depth=0) is None


def test_a_tenant_within_its_share_is_not_shed_by_lanes_another_tenant_filled() -> None:
    # Given lanes far past the normal lane's ceiling (500), filled by another tenant
    depth = 20_000
    # When a tenant with nothing queued submits 50 units (its guaranteed share)
    # Then it is admitted: the ceiling does not refuse a tenant within its share
    assert decide(queued=0, adding=50, depth=depth) is None
    # but one unit past its share, the ceiling applies to it
    shed = decide(queued=0, adding=51, depth=depth)
    assert shed is not None and shed.reason == "lane_depth"


def test_without_tenant_limits_the_lanes_depth_refuses_everyone_as_before() -> None:
    # Given lanes past the low lane's ceiling
    # When a submission comes without a tenant's queue (the old, global decision)
    shed = shed_decision(POLICY, Lane.LOW, {Lane.LOW: 100}, snapshot(), 10_000, NOW)
    # Then it is shed for lane depth
    assert shed is not None and shed.reason == "lane_depth"


def test_the_tenants_cap_comes_before_the_lanes_and_is_its_own_on_resume() -> None:
    # Given a tenant over its cap while the lanes are also deep
    shed = decide(queued=300, adding=10, depth=20_000)
    # Then the reason given is its own queue (what it can act on)
    assert shed is not None and shed.reason == "tenant_queue"
    # and the cap alone (a resume's remainder) decides the same way, lanes aside
    alone = tenant_shed(TenantQueue("acme", LIMITS, 300, 10), 10_000, snapshot())
    assert alone is not None and alone.reason == "tenant_queue"
    assert tenant_shed(TenantQueue("acme", LIMITS, 0, 10), 10_000, snapshot()) is None


def test_a_tenant_without_a_cap_is_never_shed_for_its_own_queue() -> None:
    # Given a tenant with no max_queued_units and a huge queue, lanes within their ceiling
    tenant = TenantQueue("big", TenantLimits(), 10**9, 10)
    # When it submits
    # Then only the lanes' ceiling could refuse it, and they are not past it
    assert shed_decision(POLICY, Lane.HIGH, {}, snapshot(), 10_000, NOW, tenant) is None


def test_a_submission_of_several_models_answers_to_the_throttled_or_the_slowest_bucket() -> None:
    fast = InMemoryGovernor(GovernorConfig(600_000, 0.95), now=NOW - 60)
    slow = InMemoryGovernor(GovernorConfig(60_000, 0.95), now=NOW - 60)
    # none throttled: the Retry-After of the work ahead is estimated at the slowest rate
    picked = binding_snapshot([fast.snapshot(NOW), slow.snapshot(NOW)], NOW, 60.0)
    assert picked == slow.snapshot(NOW)
    shed = shed_decision(POLICY, Lane.LOW, {Lane.LOW: 100}, picked, 10_000, NOW)
    alone = shed_decision(POLICY, Lane.LOW, {Lane.LOW: 100}, fast.snapshot(NOW), 10_000, NOW)
    assert shed is not None and alone is not None
    assert shed.retry_after_s > alone.retry_after_s
    # one throttled within the window: that one, whatever the rates
    fast.report_throttle(NOW - 5)
    picked = binding_snapshot([slow.snapshot(NOW), fast.snapshot(NOW)], NOW, 60.0)
    assert picked.last_throttle_at == NOW - 5
    # ... and not once the window has passed
    later = [fast.snapshot(NOW), slow.snapshot(NOW)]
    assert binding_snapshot(later, NOW + 100, 60.0) == later[1]
