"""The DynamoDB governor (moto in-process, patched): the in-memory semantics, tickets, shards."""

from __future__ import annotations

import random
from typing import Any

import pytest

from swarm.adapters.dynamodb_governor import DynamoDBGovernor
from swarm.core.errors import Conflict, InvalidInput
from swarm.core.governor import GovernorConfig
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import Lane
from tests.integration.conftest import TABLE

LAB = GovernorConfig(quota_tpm=300_000, share=0.95)


def gov(client: Any, config: GovernorConfig = LAB, **kwargs: Any) -> DynamoDBGovernor:
    return DynamoDBGovernor(config, TABLE, client=client, **kwargs)


def test_without_tickets_it_answers_exactly_like_the_in_memory_governor(dynamodb: Any) -> None:
    # Given both governors with lane reserves on the same timeline
    config = GovernorConfig(300_000, 0.95, reserves={Lane.LOW: 0.3}, initial_fill=0.5)
    ref, dyn = InMemoryGovernor(config, now=0.0), gov(dynamodb, config)
    dyn.create(0.0)
    rng = random.Random(7)
    now = 0.0
    for step in range(150):
        now += rng.choice([0.0, 0.5, 3.0, 20.0])
        amount, lane = rng.choice([5_000, 40_000, 120_000]), rng.choice(list(Lane))
        # When both draw, Then they agree on the decision, the wait and the tokens left
        a, b = ref.draw(amount, lane, now), dyn.draw(amount, lane, now)
        assert a.granted == b.granted, f"step {step}"
        assert b.wait_s == pytest.approx(a.wait_s, abs=1e-5)
        assert b.available == pytest.approx(a.available, abs=1e-3)
    assert dyn.snapshot(now).available == pytest.approx(ref.snapshot(now).available, abs=1e-3)


def test_a_cut_rate_credits_exactly_its_recovering_rate(dynamodb: Any) -> None:
    """After a cut the refill is the integral of the recovering effective rate. (The in-memory
    governor keeps the rate of its last grant until the next one, so it credits a little less
    while the rate recovers: a conservative approximation; both agree before and after.)"""
    ref, dyn = InMemoryGovernor(LAB, now=0.0), gov(dynamodb)
    dyn.create(0.0)
    assert dyn.draw(1_000, Lane.HIGH, 10.0) == ref.draw(1_000, Lane.HIGH, 10.0)
    ref.report_throttle(20.0)
    dyn.report_throttle(20.0)
    # 94,000 at the cut, then 10 s of 2,375/s recovering by 47.5/s per second
    assert dyn.snapshot(30.0).available == pytest.approx(94_000 + 23_750 + 47.5 * 50)
    assert dyn.snapshot(30.0).available >= ref.snapshot(30.0).available
    assert dyn.snapshot(30.0).effective_rate == pytest.approx(ref.snapshot(30.0).effective_rate)
    assert dyn.snapshot(500.0) == ref.snapshot(500.0)  # full again, rate recovered


def test_refill_is_capped_and_a_refused_draw_waits_exactly(dynamodb: Any) -> None:
    g = gov(dynamodb)
    g.create(0.0)
    refused = g.draw(10_000, Lane.NORMAL, now=1.0)
    assert not refused.granted
    assert refused.wait_s == pytest.approx((10_000 - 4_750) / 4_750, abs=1e-5)
    assert g.draw(10_000, Lane.NORMAL, now=1.0 + refused.wait_s).granted
    assert g.snapshot(now=10_000.0).available == pytest.approx(300_000)
    # a full bucket: the refill above capacity is lost, not banked
    assert g.draw(300_000, Lane.HIGH, now=10_000.0).granted
    assert not g.draw(1_000, Lane.HIGH, now=10_000.0).granted


def test_lower_lanes_leave_the_reserve(dynamodb: Any) -> None:
    config = GovernorConfig(300_000, 1.0, reserves={Lane.LOW: 0.5}, initial_fill=1.0)
    g = gov(dynamodb, config, horizon_s=30.0)
    g.create(0.0)
    assert g.draw(140_000, Lane.LOW, now=0.0).granted
    refused = g.draw(20_000, Lane.LOW, now=0.0)  # would leave less than the reserve
    assert not refused.granted and g.ticket is None  # a reserved-against lane never books
    assert g.draw(150_000, Lane.HIGH, now=0.0).granted
    with pytest.raises(InvalidInput, match="can never be granted"):
        g.draw(200_000, Lane.LOW, now=0.0)


def test_tickets_queue_workers_fifo_with_one_request_per_grant(dynamodb: Any) -> None:
    # Given an empty bucket refilling 100 tokens/s and three workers with a 60 s horizon
    config = GovernorConfig(quota_tpm=6_000, share=1.0)
    workers = [gov(dynamodb, config, horizon_s=60.0) for _ in range(3)]
    workers[0].create(0.0)
    # When each asks for 100 tokens at t=0, Then they are booked one second apart
    waits = [w.draw(100, Lane.NORMAL, now=0.0) for w in workers]
    assert [d.granted for d in waits] == [False, False, False]
    assert [d.wait_s for d in waits] == pytest.approx([1.0, 2.0, 3.0], abs=1e-5)
    before = sum(w.stats.requests for w in workers)
    # and each is granted at its time without another request
    assert workers[1].draw(100, Lane.NORMAL, now=1.999).wait_s == pytest.approx(0.001, abs=1e-5)
    assert all(w.draw(100, Lane.NORMAL, now=3.0).granted for w in workers)
    assert sum(w.stats.requests for w in workers) == before
    assert sum(w.stats.grants for w in workers) == 3


def test_a_ticket_given_up_is_abandoned_not_refunded_and_the_horizon_bounds_the_queue(
    dynamodb: Any,
) -> None:
    config = GovernorConfig(quota_tpm=6_000, share=1.0)
    a, b = gov(dynamodb, config, horizon_s=2.0), gov(dynamodb, config, horizon_s=2.0)
    a.create(0.0)
    assert a.draw(150, Lane.HIGH, now=0.0).wait_s == pytest.approx(1.5, abs=1e-5)
    # b would wait 3.0 s > 2.0 s horizon: refused without booking
    refused = b.draw(150, Lane.HIGH, now=0.0)
    assert not refused.granted and b.ticket is None
    assert refused.wait_s == pytest.approx(1.0, abs=1e-5)  # until it fits in the horizon
    # a gives up: its ticket is forgotten, its 150 tokens are not refunded (a late refund could
    # mint tokens), so they go unused
    assert not a.cancel(now=0.5)
    assert a.ticket is None and a.stats.abandoned == 1
    # b books behind the abandoned ticket once that fits in its horizon
    booked = b.draw(150, Lane.HIGH, now=1.0)
    assert booked.wait_s == pytest.approx(2.0, abs=1e-5)  # 300 drawn, 100 tokens/s
    assert not b.draw(150, Lane.HIGH, now=2.9).granted
    assert b.draw(150, Lane.HIGH, now=3.0).granted


def test_shards_split_rate_and_capacity_and_never_exceed_them(dynamodb: Any) -> None:
    config = GovernorConfig(quota_tpm=60_000, share=1.0, capacity=4_000.0, initial_fill=1.0)
    workers = [gov(dynamodb, config, shards=4, rng=random.Random(i)) for i in range(8)]
    workers[0].create(0.0)
    granted = 0
    for t in range(0, 100):
        for w in workers:
            if w.draw(100, Lane.NORMAL, now=t * 0.1).granted:
                granted += 100
    # 4,000 at start + 1,000/s for 9.9 s
    assert granted <= 4_000 + 1_000 * 9.9 + 1e-6
    assert granted >= 0.9 * (4_000 + 1_000 * 9.9)
    assert gov(dynamodb, config, shards=4).snapshot(now=10.0).governed_rate == 1_000
    with pytest.raises(Conflict, match="shards"):
        gov(dynamodb, config, shards=2).snapshot(now=10.0)
    with pytest.raises(InvalidInput, match="can never be granted"):
        workers[0].draw(1_500, Lane.NORMAL, now=10.0)  # a shard holds 1,000


def test_throttles_cut_every_shard_once_per_cooldown_and_recover(dynamodb: Any) -> None:
    g = gov(dynamodb, LAB, shards=3, horizon_s=10.0)
    g.create(0.0)
    g.report_throttle(now=100.0)
    g.report_throttle(now=101.0)  # inside the cool-down: counted, no second cut
    state = g.state(now=101.0)
    assert state.snapshot.throttles == 2 and state.snapshot.last_throttle_at == 101.0
    assert state.snapshot.effective_rate == pytest.approx(4_750 * 0.51, rel=1e-6)
    assert g.snapshot(now=1_000.0).effective_rate == pytest.approx(4_750)
    # credit under the cut: 100 s at the full rate, then 0.5 -> recovering by 1%/s
    other = gov(dynamodb, LAB, shards=3)
    assert other.snapshot(now=102.0).available == pytest.approx(
        100 * 4_750 if 100 * 4_750 < 300_000 else 300_000
    )


def test_state_reports_the_queue_booked_ahead(dynamodb: Any) -> None:
    config = GovernorConfig(quota_tpm=6_000, share=1.0)
    workers = [gov(dynamodb, config, horizon_s=60.0) for _ in range(5)]
    workers[0].create(0.0)
    for w in workers:
        w.draw(100, Lane.NORMAL, now=0.0)
    state = workers[0].state(now=0.0)
    assert state.backlog_tokens == pytest.approx(500)
    assert state.backlog_wait_s == pytest.approx(5.0)
    assert state.snapshot.available == 0
    assert state.recent_waits == pytest.approx((1.0,))
