"""The token bucket's arithmetic: refill, capacity, precise waits, lane reserves, AIMD."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.core.errors import InvalidInput
from swarm.core.governor import GovernorConfig, acquire
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


@settings(max_examples=200, deadline=None)
@given(
    draws=st.lists(
        st.tuples(st.floats(0, 30), st.integers(1, 60_000), st.sampled_from(list(Lane))),
        max_size=60,
    ),
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
