"""The token bucket's arithmetic: refill, capacity, precise waits, lane reserves, AIMD; and the
same bucket in the cumulative form the DynamoDB adapter writes (credit, tickets, shards)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.bench.governor import over_granted
from swarm.core.errors import InvalidInput
from swarm.core.governor import (
    MICRO,
    ZERO,
    Draw,
    GovernorConfig,
    Grant,
    LevelHistory,
    Refund,
    ShardState,
    ShardWrite,
    Ticket,
    TrueUp,
    acquire,
    booking_ahead,
    cut_rate,
    initial_shard,
    micro,
    plan_places,
    plan_slot,
    plan_write,
    predicted_wait,
    rebase,
    shard_shape,
    ticket_from_doc,
    ticket_ready_at,
    ticket_to_doc,
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


def apply(s: ShardState, w: ShardWrite) -> ShardState | None:
    """What DynamoDB does with the write on the item ``s`` (None: a condition failed)."""
    holds = s.lost <= w.lost and s.refunded <= w.refunded_max
    holds = holds and (w.drawn_max is None or s.drawn <= w.drawn_max)
    holds = holds and (w.drawn_min is None or s.drawn >= w.drawn_min)
    holds = holds and (w.base_time is None or s.base_time == w.base_time)
    holds = holds and (w.highs_is is None or s.highs == w.highs_is)
    if not holds:
        return None
    return replace(
        s,
        drawn=s.drawn + w.add,
        lost=w.lost,
        refunded=s.refunded + w.refund,
        highs=s.highs + (1 if w.saw_high else 0),
    )


def test_a_full_bucket_raises_lost_so_that_it_holds_exactly_its_capacity() -> None:
    t = Decimal(200)  # credit 110,000: the bucket is full (60,000), 50,000 of refill lost
    w = plan_write(shard(), t, add=5_000)
    assert w.wait_s is None and w.lost == 50_000 and w.add == 5_000
    after = apply(shard(), w)
    assert after is not None and after.tokens(t) == 55_000 and w.ready_at(after) is None
    # below capacity: nothing lost, drawn grows by the amount
    s = shard(drawn=Decimal(80_000))  # 30,000 tokens
    below = plan_write(s, t, add=5_000)
    assert below.lost == 0 and below.drawn_max == 110_000 - 5_000
    after = apply(s, below)
    assert after is not None and after.tokens(t) == 25_000


def test_workers_with_the_same_full_view_all_draw_without_a_failed_write() -> None:
    # Given three workers that saw the same full bucket, drawing 0.1 s apart on a 0.5 s grid
    seen, item = shard(), shard()
    times = [Decimal("200.1"), Decimal("200.2"), Decimal("200.3")]
    plans = [plan_write(seen, t, add=5_000, grid_s=0.5) for t in times]
    # Then they raise lost to the same value (the credit at 200.5 less the capacity)...
    assert {p.lost for p in plans} == {seen.credit(Decimal("200.5")) - 60_000}
    # ...and every write lands, in any order, each drawing its own 5,000
    for p in reversed(plans):
        landed = apply(item, p)
        assert landed is not None
        item = landed
    assert item.drawn == 15_000
    # the bucket then holds its capacity less the draws, less at most half a second of refill
    assert 60_000 - 15_000 - 500 <= item.tokens(Decimal("200.3")) <= 60_000 - 15_000


def test_a_draw_the_shard_cannot_serve_waits_until_its_tokens_are_there() -> None:
    # 2,000 tokens at t=100, a lane keeping 10% (6,000) of the capacity
    s = shard(base_credit=Decimal(2_000))
    refused = plan_write(s, Decimal(100), add=5_000, reserve=0.1)
    assert refused.wait_s == pytest.approx((5_000 + 6_000 - 2_000) / 1_000 + 2e-6)
    # in debt (tickets booked ahead): the queue ahead is part of the wait
    owed = shard(base_credit=Decimal(2_000), drawn=Decimal(12_000))  # 10,000 booked ahead
    assert plan_write(owed, Decimal(100), add=5_000).wait_s == pytest.approx(15.0 + 2e-6)


def test_a_booking_lane_draws_into_debt_within_its_horizon_and_gets_a_ticket_time() -> None:
    s = shard(base_credit=Decimal(2_000))  # 2,000 tokens, 1,000/s: 10 s of horizon = 10,000
    ahead = booking_ahead(s, Decimal(100), 10.0)
    plan = plan_write(s, Decimal(100), add=5_000, ahead=ahead)
    assert plan.wait_s is None and plan.drawn_max == 2_000 - 5_000 + 10_000
    after = apply(s, plan)
    assert after is not None
    assert plan.ready_at(after) == Decimal(103)  # the credit reaches 5,000 three seconds later
    # beyond the horizon: refused, told when its tokens will really be there (15 s: the 2,000
    # in the bucket and 13,000 of refill), not merely when a booking would fit
    far = plan_write(s, Decimal(100), add=15_000, ahead=ahead)
    assert far.wait_s == pytest.approx(13.0 + 2e-6)


def test_a_write_certifies_the_bucket_below_half_full_or_counts_a_sighting() -> None:
    in_debt = shard(drawn=Decimal(40_000))  # 30,000 booked ahead at t=100; half full: 30,000
    w = plan_write(in_debt, Decimal(100), add=1_000, ahead=Decimal(60_000), margin_s=10.0)
    # 20,000 in debt 10 s later: below half full, certified by a condition on refunded (refunds
    # landed meanwhile may not have lifted it to half full)
    assert not w.saw_high
    assert w.refunded_max == 40_000 - 20_000 + 30_000 - MICRO
    assert apply(replace(in_debt, refunded=Decimal(50_000)), w) is None
    # half full by the write margin (60 s later): counted as a sighting instead
    w = plan_write(in_debt, Decimal(100), add=1_000, ahead=Decimal(60_000), margin_s=60.0)
    assert w.saw_high
    after = apply(in_debt, w)
    assert after is not None and after.highs == 1


def test_an_old_view_certifies_with_a_guess_of_what_was_drawn_since() -> None:
    seen = shard(drawn=Decimal(40_000))  # 30,000 booked ahead at t=100, as this client saw it
    # since then others booked 90,000 and 60,000 went back: the item is still far below half
    item = replace(seen, drawn=Decimal(130_000), refunded=Decimal(60_000))
    plain = plan_write(seen, Decimal(100), add=1_000, ahead=Decimal(200_000), margin_s=10.0)
    assert apply(item, plain) is None  # the old view's bound is too tight: a failed write
    guess = plan_write(
        seen,
        Decimal(100),
        add=1_000,
        ahead=Decimal(200_000),
        margin_s=10.0,
        drawn_floor=Decimal(120_000),
    )
    assert guess.drawn_min == 120_000 and not guess.saw_high
    after = apply(item, guess)
    assert after is not None and after.drawn == 131_000
    # a guess that overshoots fails, as the old view would have
    assert apply(replace(item, drawn=Decimal(110_000)), guess) is None


def test_a_refund_rides_on_a_draw_only_while_the_bucket_stayed_below_half_full() -> None:
    s = shard(drawn=Decimal(40_000), highs=3)  # 30,000 booked ahead at t=100
    pending = Refund(shard=0, amount=Decimal(4_000), refunded=ZERO, highs=3)
    w = plan_write(s, Decimal(100), add=5_000, ahead=Decimal(60_000), refund=pending)
    assert w.refund == 4_000 and w.highs_is == 3
    after = apply(s, w)
    assert after is not None and after.position == 40_000 + 5_000 - 4_000
    # never more than the write draws: a request repeated by the SDK takes back what it gives
    small = plan_write(s, Decimal(100), add=1_000, ahead=Decimal(60_000), refund=pending)
    assert small.refund == 1_000
    # a write since the grant saw the bucket out of debt: the refund cannot ride any more
    assert plan_write(replace(s, highs=4), Decimal(100), add=5_000, refund=pending).refund == 0
    # near capacity: only what keeps it within capacity goes back
    full = shard(drawn=Decimal(59_000), base_credit=Decimal(110_000))  # 51,000 tokens
    big = Refund(shard=0, amount=Decimal(12_000), refunded=ZERO, highs=0)
    assert plan_write(full, Decimal(100), add=15_000, refund=big).refund == 60_000 - 51_000


def test_a_debit_lands_whatever_the_bucket_holds() -> None:
    s = shard(drawn=Decimal(40_000))  # in debt already
    w = plan_write(s, Decimal(100), add=20_000, ahead=None)
    assert w.wait_s is None and w.drawn_max is None and w.base_time is None
    after = apply(s, w)
    assert after is not None and after.tokens(Decimal(100)) == -50_000


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
    in-memory bucket grants (no tickets, no grid)."""
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
        plan = plan_write(s, micro(now), add=amount, reserve=config.reserves.get(lane, 0.0))
        if plan.wait_s is not None:
            assert not expected.granted
            assert plan.wait_s == pytest.approx(expected.wait_s, abs=1e-5)
            continue
        after = apply(s, plan)  # the write's condition holds on the item it was planned from
        assert after is not None
        s = after
        assert plan.ready_at(s) is None and expected.granted
        assert float(plan.credit - s.position) == pytest.approx(expected.available, abs=1e-3)


# ---------------------------------------------------------------- tickets and true-ups


def test_acquire_hands_back_the_ticket_and_when_its_tokens_are_there() -> None:
    """A ticket maturing beyond the hold goes back with the unit; presented when ready, it is a
    grant without another booking."""
    ticket = Ticket("g", 0, 5_000, Lane.HIGH, 130.0, Decimal(1), Decimal(0), 100.0)

    class Booking(InMemoryGovernor):
        """Books every fresh draw 30 s ahead; grants a ticket presented when it is ready."""

        def __init__(self) -> None:
            super().__init__(LAB)
            self.presented: list[Ticket | None] = []

        def draw(
            self,
            amount: int,
            lane: Lane,
            now: float,
            ticket: Ticket | None = None,
            tenant: str = "",
        ) -> Draw:
            self.presented.append(ticket)
            if ticket is None:
                return Draw(False, 30.0, -10_000.0, ticket=ticket_for_now)
            if now >= ticket.ready_at:
                return Draw(True, 0.0, 0.0, grant=ticket.grant())
            return Draw(False, ticket.ready_at - now, 0.0, ticket=ticket)

    ticket_for_now = ticket
    time = FakeTime()
    time.t = 100.0
    gov = Booking()
    got = acquire(gov, 5_000, Lane.HIGH, time.now, time.sleep, max_wait_s=1.0)
    assert not got.granted and got.ticket == ticket and got.retry_after_s == pytest.approx(30.0)
    assert time.sleeps == []  # never held on for a ticket 30 s away
    time.t = 130.0  # the unit is back in 30 s, with its ticket
    back = acquire(gov, 5_000, Lane.HIGH, time.now, time.sleep, max_wait_s=1.0, ticket=got.ticket)
    assert back.granted and back.grant == ticket.grant() and gov.presented[-1] == ticket
    # a ticket ready within the hold is waited for, in the same call
    time.t = 129.5
    early = acquire(gov, 5_000, Lane.HIGH, time.now, time.sleep, max_wait_s=1.0, ticket=ticket)
    assert early.granted and time.sleeps == [pytest.approx(0.5)]


def test_a_ticket_travels_as_json_and_an_unreadable_one_is_dropped() -> None:
    ticket = Ticket(
        "q300000",
        2,
        12_345,
        Lane.HIGH,
        1_700_000_123.25,
        Decimal("987654.000001"),
        Decimal("1700000000"),
        1_700_000_100.5,
        Decimal("42.5"),
        7,
        tag="1",
    )
    assert ticket_from_doc(ticket_to_doc(ticket)) == ticket
    assert ticket_from_doc(None) is None
    assert ticket_from_doc({"governor": "g"}) is None  # missing fields
    assert ticket_from_doc({**ticket_to_doc(ticket), "position": "NaN?"}) is None
    assert ticket.grant() == Grant(12_345, Lane.HIGH, 1_700_000_100.5, 2, Decimal("42.5"), 7)
    # a place in a tenant's queue travels as one too; a message written before slots has none
    slot = replace(ticket, lane=Lane.NORMAL, slot=True)
    assert ticket_from_doc(ticket_to_doc(slot)) == slot
    assert "slot" not in ticket_to_doc(ticket)
    assert ticket_from_doc({**ticket_to_doc(slot), "slot": "yes"}) == replace(slot, slot=False)


def test_a_tenant_queues_at_its_share_of_the_refill_behind_its_own_units() -> None:
    s = shard(drawn=Decimal(10_000))  # 1,000/s; credit 10,000 at t=100, all of it given out
    t = Decimal(100)
    # Given nothing queued: a unit starts its tenant's queue above the reserve (10% of 60,000)
    first = plan_slot(s, t, Lane.NORMAL, "a", 2_000, 0.1)
    assert (first.extend, first.start, first.target) == (False, Decimal(16_000), Decimal(18_000))
    # When the tenant's queue is ahead: its next unit extends it
    queued = replace(s, queues={"normal": {"a": Decimal(18_000)}})
    assert plan_slot(queued, t, Lane.NORMAL, "a", 2_000, 0.1).target == Decimal(20_000)
    # and another tenant coming queues at its share: two tenants queued, two units' step
    other = plan_slot(queued, t, Lane.NORMAL, "b", 2_000, 0.1)
    assert (other.extend, other.step, other.target) == (False, Decimal(4_000), Decimal(20_000))
    # a queue served more than a bucket ago goes with the next write; one served lately stays
    old = replace(s, queues={"normal": {"gone": Decimal(-60_000), "lately": Decimal(5_000)}})
    assert plan_slot(old, t, Lane.NORMAL, "a", 2_000, 0.1).stale == ("gone",)


def test_places_planned_together_are_a_tenants_slots_in_turn() -> None:
    s = shard(drawn=Decimal(10_000))
    t = Decimal(100)
    queued = replace(s, queues={"normal": {"a": Decimal(18_000)}})
    # tenant b comes to a's queue: each of its units a step of two units' amount further
    plan, ends = plan_places(queued, t, Lane.NORMAL, "b", [2_000, 1_000, 3_000], 0.1)
    assert ends == (Decimal(4_000), Decimal(6_000), Decimal(12_000))
    assert (plan.extend, plan.start, plan.step) == (False, Decimal(16_000), Decimal(12_000))
    assert plan.target == Decimal(28_000)  # the queue's end after the three
    # one amount: plan_slot's write
    single, _ = plan_places(queued, t, Lane.NORMAL, "b", [2_000], 0.1)
    assert single == plan_slot(queued, t, Lane.NORMAL, "b", 2_000, 0.1)
    with pytest.raises(InvalidInput):
        plan_places(queued, t, Lane.NORMAL, "b", [], 0.1)


def test_a_ticket_is_retimed_after_a_rate_cut_its_holder_has_seen() -> None:
    s = shard()  # 1,000/s from t=100 with 10,000 credited
    ticket = Ticket("g", 0, 5_000, Lane.HIGH, 120.0, Decimal(30_000), Decimal(100), 100.0)
    assert ticket_ready_at(ticket, None) == 120.0
    assert ticket_ready_at(ticket, s) == 120.0  # the same credit function
    cut = rebase(s, Decimal(110), Decimal(500), cooldown_s=5.0)  # half the rate from t=110
    assert cut is not None
    # 20,000 at t=110, then 500/s recovering by 10/s per second: 30,000 is reached later
    assert ticket_ready_at(ticket, cut) == float(cut.time_for_credit(Decimal(30_000))) > 120.0


def test_the_level_history_bounds_a_refund_by_the_highest_level_since_the_grant() -> None:
    h = LevelHistory()
    h.observe(0.0, 50_000)  # before a grant of 30,000
    grant = h.observe(0.0, 20_000)  # just after it
    h.observe(5.0, 60_000)  # before another draw: the bucket had refilled to 60,000
    h.observe(5.0, 10_000)
    # the highest level since the grant was 60,000: of a capacity of 70,000, 10,000 may go back
    assert h.room(grant, level_now=15_000, capacity=70_000) == 10_000
    h.refunded += 10_000  # given back: the gross levels before it count it now
    assert h.room(grant, level_now=25_000, capacity=70_000) == 0
    # a grant made after the peak is bounded by what came after it only
    later = h.observe(6.0, 12_000)
    assert h.room(later, level_now=25_000, capacity=70_000) == 70_000 - 10_000 - 15_000
    # what is forgotten gives no refund
    old = LevelHistory(keep_s=10.0)
    first = old.observe(0.0, 100)
    old.observe(5.0, 500)
    old.observe(20.0, 200)
    assert old.room(first, 0.0, 1_000) == 0.0


def test_an_in_memory_true_up_refunds_what_is_sound_and_debits_the_rest() -> None:
    config = GovernorConfig(60_000, 1.0, initial_fill=1.0)  # 1,000/s, capacity 60,000
    gov = InMemoryGovernor(config, now=0)
    got = gov.draw(20_000, Lane.NORMAL, now=0)
    assert got.grant is not None
    # the model used 12,000 at once: the other 8,000 go back exactly
    assert gov.true_up(got.grant, 12_000, now=0) == TrueUp(refunded=8_000)
    assert gov.snapshot(now=0).available == 48_000
    # a grant whose refund would only come after the bucket filled up again: dropped
    late = gov.draw(10_000, Lane.NORMAL, now=0)
    assert late.grant is not None
    assert gov.true_up(late.grant, 0, now=100) == TrueUp(dropped=10_000)
    assert gov.snapshot(now=100).available == 60_000
    # an overrun is drawn, into debt: the next draw waits for it
    over = gov.draw(60_000, Lane.NORMAL, now=100)
    assert over.grant is not None
    assert gov.true_up(over.grant, 65_000, now=100) == TrueUp(debited=5_000)
    refused = gov.draw(1_000, Lane.NORMAL, now=100)
    assert not refused.granted and refused.wait_s == pytest.approx(6.0)
    assert gov.snapshot(now=100).available == 0


def test_a_refund_the_bucket_could_have_filled_meanwhile_would_mint_tokens() -> None:
    """Why the bound: 30,000 unused tokens of a grant at t=0 cannot go back at t=30 once the
    bucket refilled to capacity and was drawn empty again (a bucket debited with what the
    model used would have lost that refill); given back, they would be granted a second time."""
    config = GovernorConfig(60_000, 1.0, initial_fill=1.0)  # 1,000/s, capacity 60,000
    gov = InMemoryGovernor(config, now=0)
    first = gov.draw(30_000, Lane.NORMAL, now=0)
    assert first.grant is not None
    assert gov.draw(60_000, Lane.NORMAL, now=30).granted  # refilled to 60,000, drawn empty
    assert gov.true_up(first.grant, 0, now=30) == TrueUp(dropped=30_000)
    assert not gov.draw(30_000, Lane.NORMAL, now=30).granted
    judged = [(0.0, 0.0, 0), (30.0, 30.0, 60_000)]
    assert over_granted(judged, 0.0, 60_000, 60_000, 1_000) == 0
    # had the refund gone back, the window at t=30 would hold 90,000 used tokens
    assert over_granted([*judged, (30.0, 30.0, 30_000)], 0.0, 60_000, 60_000, 1_000) == 30_000


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from([0.0, 1.0, 10.0, 30.0, 60.0]),  # seconds since the previous one
            st.integers(1, 60_000),  # a draw's amount
            st.sampled_from([0.0, 0.25, 1.0]),  # the fraction of it the model uses
            st.integers(0, 5),  # how many operations later its call ends
        ),
        max_size=60,
    ),
    fill=st.floats(0, 1),
)
def test_refunds_never_let_the_bucket_give_more_than_the_model_could_use(
    ops: list[tuple[float, int, float, int]], fill: float
) -> None:
    """Judged by what the model really used, over every window, against the bucket's capacity
    and refill (the benchmark's yardstick), however the true-ups interleave with draws."""
    config = GovernorConfig(60_000, 1.0, initial_fill=fill)
    gov = InMemoryGovernor(config, now=0)
    now = 0.0
    calls: list[tuple[int, Grant, int]] = []  # (ends after op, grant, used)
    judged: list[tuple[float, float, int]] = []
    for i, (gap, amount, fraction, length) in enumerate(ops):
        now += gap
        for ending in [c for c in calls if c[0] <= i]:
            calls.remove(ending)
            gov.true_up(ending[1], ending[2], now)
        got = gov.draw(amount, Lane.NORMAL, now)
        if got.grant is not None:
            used = round(amount * fraction)
            judged.append((now, now, used))
            calls.append((i + length, got.grant, used))
    assert over_granted(judged, 0.0, fill * 60_000, 60_000, 1_000) <= 1e-6


@pytest.mark.parametrize("stale", ["draw", "true_up"])
def test_a_callers_stale_clock_never_turns_the_buckets_clock_back(stale: str) -> None:
    # Threads read the clock, then wait for the bucket's lock: one may arrive with a time
    # before the last draw's. Its operation must not set the bucket's clock back, or the next
    # draw is refilled twice for the same seconds (seen as a worker test's model throttles).
    config = GovernorConfig(quota_tpm=60_000, share=1.0, initial_fill=0.0)
    governor = InMemoryGovernor(config, now=0.0)
    first = governor.draw(1_000, Lane.NORMAL, now=10.0)  # the 10,000 tokens refilled by t=10
    assert first.granted
    if stale == "draw":
        assert governor.draw(1_000, Lane.NORMAL, now=5.0).granted  # a thread's clock of t=5
    else:  # the call used 500 tokens more than drawn: debited at a thread's clock of t=5
        assert first.grant is not None
        governor.true_up(first.grant, 1_500, now=5.0)
    # by t=20 the bucket has refilled 20,000 tokens in all: what is left is never more
    left = governor.snapshot(20.0).available
    assert left <= 20_000 - (2_000 if stale == "draw" else 1_500)
