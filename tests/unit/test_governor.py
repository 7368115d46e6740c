"""The token bucket's arithmetic: refill, capacity, precise waits, lane reserves, AIMD; and the
same bucket in the cumulative form the DynamoDB adapter writes (credit, tickets, shards)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.core.errors import InvalidInput
from swarm.core.governor import (
    MICRO,
    ZERO,
    GovernorConfig,
    ShardState,
    acquire,
    cut_rate,
    initial_shard,
    micro,
    plan_draw,
    predicted_wait,
    rebase,
    shard_shape,
    view_of,
)
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import Lane

LAB = GovernorConfig(quota_tpm=300_000, share=0.95)


def test_rate_and_capacity_follow_the_quota() -> None:
    assert LAB.rate == 4_750
    assert LAB.bucket_capacity == 300_000


def test_a_refused_draw_says_exactly_how_long_the_deficit_takes() -> None:
    gov = InMemoryGovernor(LAB, now=0)
    refused = gov.draw(10_000, Lane.NORMAL, now=1)  # holds 4,750
    assert not refused.granted
    assert refused.wait_s == pytest.approx((10_000 - 4_750) / 4_750)
    assert gov.draw(10_000, Lane.NORMAL, now=1 + refused.wait_s).granted


def test_refill_stops_at_capacity() -> None:
    gov = InMemoryGovernor(LAB, now=0)
    assert gov.snapshot(now=10_000).available == 300_000


def test_lower_lanes_leave_the_reserve_for_higher_lanes() -> None:
    config = GovernorConfig(300_000, 1.0, reserves={Lane.LOW: 0.5}, initial_fill=1.0)
    gov = InMemoryGovernor(config, now=0)
    assert gov.draw(140_000, Lane.LOW, now=0).granted  # 160,000 left
    refused = gov.draw(20_000, Lane.LOW, now=0)  # would leave 140,000 < 150,000 reserve
    assert not refused.granted
    assert gov.draw(150_000, Lane.HIGH, now=0).granted  # the high lane may use the reserve


def test_a_draw_that_can_never_fit_is_an_error_not_an_endless_wait() -> None:
    config = GovernorConfig(60_000, 1.0, reserves={Lane.LOW: 0.5})
    with pytest.raises(InvalidInput, match="can never be granted"):
        InMemoryGovernor(config).draw(40_000, Lane.LOW, now=0)


def test_throttles_cut_the_rate_once_per_cooldown_and_it_recovers_additively() -> None:
    gov = InMemoryGovernor(LAB, now=0)
    gov.report_throttle(now=100)
    gov.report_throttle(now=101)  # inside the cool-down: no second cut
    assert gov.snapshot(now=100).effective_rate == pytest.approx(4_750 * 0.5)
    snap = gov.snapshot(now=101)  # one second of additive recovery: +1% of the governed rate
    assert snap.effective_rate == pytest.approx(4_750 * 0.51)
    assert snap.throttles == 2
    assert snap.throttled_recently(now=101, window_s=60)
    gov.report_throttle(now=110)  # a later storm cuts again: (50% + 10 x 1%) / 2
    assert gov.snapshot(now=110).effective_rate == pytest.approx(4_750 * 0.30)
    # additive recovery: 1% of the governed rate per second, back to the governed rate
    assert gov.snapshot(now=120).effective_rate > gov.snapshot(now=111).effective_rate
    assert gov.snapshot(now=1_000).effective_rate == 4_750


def test_the_rate_never_drops_below_its_floor() -> None:
    gov = InMemoryGovernor(LAB, now=0)
    for t in range(0, 600, 6):
        gov.report_throttle(now=t)
    assert gov.snapshot(now=600).effective_rate >= LAB.rate * LAB.min_rate_fraction


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"quota_tpm": 0}, "quota_tpm"),
        ({"quota_tpm": 1000, "share": 0}, "governor_share"),
        ({"quota_tpm": 1000, "share": 1.01}, "governor_share"),
        ({"quota_tpm": 1000, "reserves": {Lane.LOW: 1.0}}, "reserves.low"),
    ],
)
def test_bad_configuration_names_the_setting(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        GovernorConfig(**kwargs)  # type: ignore[arg-type]


class FakeTime:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_acquire_sleeps_precisely_instead_of_spinning() -> None:
    time = FakeTime()
    gov = InMemoryGovernor(LAB, now=0)
    got = acquire(gov, 9_500, Lane.NORMAL, time.now, time.sleep, max_wait_s=10)
    assert got.granted and got.draws == 2
    assert time.sleeps == [pytest.approx(2.0)]


def test_acquire_gives_up_at_the_bound_without_sleeping_in_vain() -> None:
    time = FakeTime()
    gov = InMemoryGovernor(LAB, now=0)
    got = acquire(gov, 100_000, Lane.NORMAL, time.now, time.sleep, max_wait_s=5)
    assert not got.granted
    assert time.sleeps == []  # 21s of deficit > 5s bound: back to the queue at once


#: (seconds since the previous draw, amount, lane)
DRAWS = st.lists(
    st.tuples(st.floats(0, 30), st.integers(1, 60_000), st.sampled_from(list(Lane))), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(
    draws=DRAWS,
    fill=st.floats(0, 1),
    throttle_at=st.lists(st.floats(0, 1_000), max_size=5),
)
def test_the_governor_never_grants_more_than_it_holds(
    draws: list[tuple[float, int, Lane]], fill: float, throttle_at: list[float]
) -> None:
    config = GovernorConfig(60_000, 0.9, reserves={Lane.LOW: 0.2}, initial_fill=fill)
    gov = InMemoryGovernor(config, now=0)
    now, granted = 0.0, 0
    throttles = sorted(throttle_at)
    for gap, amount, lane in draws:
        now += gap
        while throttles and throttles[0] <= now:
            gov.report_throttle(throttles.pop(0))
        try:
            result = gov.draw(amount, lane, now)
        except InvalidInput:
            continue
        if result.granted:
            granted += amount
            assert result.available >= config.reserve(lane) - 1e-6
        assert 0 <= gov.state.tokens <= config.bucket_capacity + 1e-6
    # all grants together never exceed what the bucket started with plus what refilled
    assert granted <= fill * config.bucket_capacity + config.rate * now + 1e-6


# ---------------------------------------------------------------- the cumulative form (shards)


def shard(**kwargs: object) -> ShardState:
    """A shard of 1,000 tokens/s and capacity 60,000, created at t=100 holding 10,000."""
    fields: dict[str, object] = {
        "index": 0,
        "drawn": ZERO,
        "base_credit": Decimal(10_000),
        "base_time": Decimal(100),
        "rate": Decimal(1_000),
        "capacity": Decimal(60_000),
        "recovery": Decimal(10),
    }
    fields.update(kwargs)
    return ShardState(**fields)  # type: ignore[arg-type]


def test_the_credit_grows_at_the_rate_and_the_bucket_stops_at_capacity() -> None:
    s = shard(drawn=Decimal(4_000))
    assert s.credit(Decimal(50)) == 10_000  # before its base time: the base credit
    assert s.credit(Decimal("102.5")) == 12_500
    assert s.tokens(Decimal("102.5")) == 8_500  # credit - drawn
    assert s.tokens(Decimal(1_000)) == 60_000  # refill beyond capacity is not counted
    assert shard(drawn=Decimal(11_000)).tokens(Decimal(100)) == -1_000  # booked ahead: debt


def test_a_cut_rate_recovers_linearly_and_its_credit_is_the_exact_integral() -> None:
    # cut to 400/s at t=100, recovering by 10/s per second: back to 1,000/s at t=160
    s = shard(cut_rate=Decimal(400), cut_at=Decimal(100))
    assert s.rate_at(Decimal(100)) == 400
    assert s.rate_at(Decimal(130)) == 700
    assert s.rate_at(Decimal(500)) == 1_000
    # 30 s: 400 x 30 + 10/2 x 30^2; then 60 s in all (18,000 + 24,000 = 42,000) plus 40 s at 1,000
    assert s.credit(Decimal(130)) == 10_000 + 12_000 + 4_500
    assert s.credit(Decimal(200)) == 10_000 + 24_000 + 18_000 + 40_000


@settings(max_examples=200, deadline=None)
@given(
    need=st.decimals(min_value=0, max_value=500_000, places=6),
    cut=st.one_of(st.none(), st.decimals(min_value=100, max_value=999, places=6)),
    cut_ago=st.decimals(min_value=0, max_value=100, places=6),
)
def test_time_for_credit_is_the_earliest_instant_the_credit_reaches_the_target(
    need: Decimal, cut: Decimal | None, cut_ago: Decimal
) -> None:
    s = shard(cut_rate=cut, cut_at=Decimal(100) - cut_ago if cut is not None else ZERO)
    target = s.base_credit + need
    t = s.time_for_credit(target)
    assert s.credit(t) >= target
    assert t == s.base_time or s.credit(t - MICRO) < target


def test_initial_shards_split_rate_capacity_and_fill_evenly() -> None:
    config = GovernorConfig(300_000, 1.0, initial_fill=0.5)
    assert shard_shape(config, 4) == (Decimal(1_250), Decimal(75_000), micro(12.5))
    s = initial_shard(config, 4, 3, Decimal(7))
    assert s.index == 3 and s.drawn == 0 and s.base_credit == 37_500 and s.base_time == 7
    assert s.tokens(Decimal(7)) == 37_500 and s.cut_rate is None and s.throttles == 0


def test_a_full_bucket_is_drawn_by_resetting_drawn_and_otherwise_by_adding_to_it() -> None:
    t = Decimal(200)  # credit 110,000: the bucket is full (60,000)
    full = plan_draw(shard(), t, 5_000, 0.0, horizon_s=0.0, book=False, busy=False)
    assert full.full and full.wait_s is None
    assert full.full_mark == 50_000 and full.reset_to == 55_000  # leaves 55,000
    # last seen in debt (busy): drawn as below capacity, so an old full view costs one failure
    busy = plan_draw(shard(), t, 5_000, 0.0, horizon_s=0.0, book=False, busy=True)
    assert not busy.full and busy.limit == 105_000
    s = shard(drawn=Decimal(80_000))  # 30,000 tokens
    below = plan_draw(s, t, 5_000, 0.0, horizon_s=0.0, book=False, busy=False)
    assert not below.full and below.wait_s is None and below.tokens == 30_000
    assert below.ready_at(shard(drawn=Decimal(85_000))) is None  # granted at once


def test_a_draw_the_shard_cannot_serve_waits_exactly_for_the_deficit() -> None:
    # 2,000 tokens at t=100, a lane keeping 10% (6,000) of the capacity
    s = shard(base_credit=Decimal(2_000))
    refused = plan_draw(s, Decimal(100), 5_000, 0.1, horizon_s=0.0, book=False, busy=False)
    assert refused.wait_s == pytest.approx((5_000 + 6_000 - 2_000) / 1_000 + 2e-6)
    assert refused.tokens == 2_000


def test_a_booking_lane_draws_into_debt_within_its_horizon_and_gets_a_ticket_time() -> None:
    s = shard(base_credit=Decimal(2_000))  # 2,000 tokens, 1,000/s: 10 s of horizon = 10,000
    plan = plan_draw(s, Decimal(100), 5_000, 0.0, horizon_s=10.0, book=True, busy=False)
    assert plan.wait_s is None and plan.limit == 2_000 - 5_000 + 10_000
    after = shard(base_credit=Decimal(2_000), drawn=Decimal(5_000))
    assert plan.ready_at(after) == Decimal(103)  # the credit reaches 5,000 three seconds later
    # beyond the horizon: the wait is until the booking fits in it
    far = plan_draw(s, Decimal(100), 15_000, 0.0, horizon_s=10.0, book=True, busy=False)
    assert far.wait_s == pytest.approx(3.0 + 2e-6)


def test_predicted_wait_ranks_shards_by_their_cached_tokens() -> None:
    assert predicted_wait(shard(), Decimal(100), 5_000, 0.0) == 0.0
    assert predicted_wait(shard(), Decimal(100), 15_000, 0.0) == pytest.approx(5.0)


def test_a_throttle_banks_the_credit_then_cuts_once_per_cooldown() -> None:
    config = GovernorConfig(240_000, 1.0, decrease_factor=0.5, min_rate_fraction=0.1)
    s = shard(rate=Decimal(4_000))
    cut = cut_rate(config, 1, s, Decimal(110))
    assert cut == 2_000
    after = rebase(s, Decimal(110), cut, cooldown_s=5.0)
    assert after is not None
    assert after.base_credit == 50_000 and after.base_time == 110  # banked at the old rate
    assert after.cut_rate == 2_000 and after.cut_at == 110
    assert rebase(after, Decimal(112), cut, cooldown_s=5.0) is None  # within the cool-down
    assert after.cooling(Decimal(112), 5.0) and not after.cooling(Decimal(116), 5.0)
    low = shard(rate=Decimal(4_000), cut_rate=Decimal(500), cut_at=Decimal(100))
    assert cut_rate(config, 1, low, Decimal(100)) == 400  # never below 10% of the governed rate


def test_the_shards_view_adds_tokens_rates_and_the_queue_booked_ahead() -> None:
    config = GovernorConfig(120_000, 1.0)
    states = [shard(), shard(index=1, drawn=Decimal(15_000), throttles=3)]
    view = view_of(states, config, Decimal(100))
    assert view.snapshot.available == 10_000  # shard 1 is 5,000 in debt
    assert view.snapshot.effective_rate == 2_000
    assert view.backlog_tokens == 5_000 and view.backlog_wait_s == 2.5
    assert view.snapshot.throttles == 0  # shard 0 counts the throttles


@settings(max_examples=150, deadline=None)
@given(draws=DRAWS, fill=st.floats(0, 1))
def test_conditional_writes_of_the_plans_answer_like_the_in_memory_bucket(
    draws: list[tuple[float, int, Lane]], fill: float
) -> None:
    """A plan applied as DynamoDB applies its conditional write grants exactly what the
    in-memory bucket grants (no tickets: ``book=False``)."""
    config = GovernorConfig(60_000, 0.9, reserves={Lane.LOW: 0.2}, initial_fill=fill)
    ref = InMemoryGovernor(config, now=0)
    s = initial_shard(config, 1, 0, ZERO)
    now = 0.0
    for gap, amount, lane in draws:
        now += gap
        try:
            expected = ref.draw(amount, lane, now)
        except InvalidInput:
            continue
        reserve = config.reserves.get(lane, 0.0)
        plan = plan_draw(s, micro(now), amount, reserve, horizon_s=0.0, book=False, busy=False)
        if plan.wait_s is not None:
            assert not expected.granted
            assert plan.wait_s == pytest.approx(expected.wait_s, abs=1e-5)
            continue
        # the write's condition holds on the item it was planned from
        if plan.full:
            assert s.drawn <= plan.full_mark
            s = replace(s, drawn=plan.reset_to)
        else:
            assert plan.full_mark < s.drawn <= plan.limit
            s = replace(s, drawn=s.drawn + plan.amount)
        assert plan.ready_at(s) is None and expected.granted
        assert float(plan.credit - s.drawn) == pytest.approx(expected.available, abs=1e-3)
