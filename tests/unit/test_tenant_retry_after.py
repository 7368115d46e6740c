"""A ``tenant_queue`` 429's Retry-After is the time the tenant's queue, at the rate it is measured
to drain, needs for the excess (swarm.core.backpressure.drain_rate, tenant_shed): before, it was
the governed rate's time for the excess at the units' *projected* tokens, 20 s and more for a
queue draining at 6 units a second."""

from __future__ import annotations

import pytest

from swarm.core.backpressure import (
    MAX_RETRY_AFTER_S,
    MIN_DRAIN_WINDOW_S,
    MIN_RETRY_AFTER_S,
    drain_rate,
    tenant_shed,
)
from swarm.core.governor import GovernorConfig, GovernorSnapshot
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import RunState
from swarm.core.tenancy import TenantLimits, TenantPolicy, TenantQueue
from swarm.service.batches import Shedding
from tests.unit.test_service_flow import Plane

NOW = 1_000.0
LIMITS = TenantLimits(max_queued_units=100)


def snapshot() -> GovernorSnapshot:
    # 300k TPM at 95%: 4,750 tokens/s governed, no throttles
    return InMemoryGovernor(GovernorConfig(300_000, 0.95), now=NOW).snapshot(NOW)


def test_a_queue_drains_at_its_runs_units_over_their_time_open_summed() -> None:
    # one run open 100 s with 600 units drained: 6 a second
    assert drain_rate([(NOW - 100, 600)], NOW) == pytest.approx(6.0)
    # two runs draining side by side: their rates add up
    assert drain_rate([(NOW - 100, 300), (NOW - 50, 150)], NOW) == pytest.approx(6.0)
    # a run opened a moment ago is measured over MIN_DRAIN_WINDOW_S, not its 0.5 s
    assert drain_rate([(NOW - 0.5, 20)], NOW) == pytest.approx(20 / MIN_DRAIN_WINDOW_S)


def test_too_little_drained_is_no_measure() -> None:
    assert drain_rate([], NOW) is None
    assert drain_rate([(NOW - 100, 9)], NOW) is None  # a first batch's first units
    assert drain_rate([(NOW - 100, 5), (NOW - 10, 5)], NOW) is not None


def test_the_retry_after_is_the_excess_at_the_measured_drain() -> None:
    # Given a tenant 20 units past its cap whose units project 10,000 tokens each
    measured = TenantQueue("acme", LIMITS, 100, 20, drain_units_s=6.0)
    estimated = TenantQueue("acme", LIMITS, 100, 20)
    # When its queue is measured to drain at 6 units/s: ceil(20 / 6) s
    shed = tenant_shed(measured, 10_000, snapshot())
    assert shed is not None and shed.retry_after_s == 4 and shed.drain_units_s == 6.0
    # while unmeasured, the governed rate's estimate stands: ceil(20 x 10,000 / 4,750) s
    fallback = tenant_shed(estimated, 10_000, snapshot())
    assert fallback is not None and fallback.retry_after_s == 43
    assert fallback.drain_units_s is None


@pytest.mark.parametrize(
    ("rate", "wait"),
    [(1e6, MIN_RETRY_AFTER_S), (0.001, MAX_RETRY_AFTER_S), (0.5, 40)],
)
def test_the_retry_after_is_bounded(rate: float, wait: int) -> None:
    shed = tenant_shed(TenantQueue("acme", LIMITS, 100, 20, drain_units_s=rate), 10, snapshot())
    assert shed is not None and shed.retry_after_s == wait


def test_a_tenants_429_says_when_its_excess_will_have_drained_at_its_real_pace() -> None:
    # Given tenant a (cap 100) whose batch of 100 opened 10 s ago and has completed 60 units:
    # its queue drains at 6 units a second, its units spending far less than projected
    p = Plane(tenants=TenantPolicy(TenantLimits(max_queued_units=100)))
    run_id = p.submit(100, tenant="a", budget=10**7)
    run = p.ledger._runs[run_id]
    assert run.state is RunState.OPEN
    p.ledger._runs[run_id] = run.with_(completed=60)
    p.clock.t = run.opened_at + 10
    # When it submits 80 more: 20 past its cap
    with pytest.raises(Shedding) as shed:
        p.submit(80, tenant="a", budget=10**7, key="more")
    # Then it is told to retry when 20 units have drained at 6 a second
    assert shed.value.shed.reason == "tenant_queue"
    assert shed.value.retry_after_s == 4  # ceil(20 / 6)
    assert "has 40 units queued" in str(shed.value)
    assert "it drains at 6.0 units/s" in str(shed.value)
