"""The yardsticks the concurrency proofs judge the governor by, checked on known sequences.

The over-grant check (:func:`swarm.bench.governor.over_granted`) judges grants by when the
*workers* asked for them and saw them, never by what the governor says about itself; these tests
pin its arithmetic against a window-by-window reference, show that it catches a grant seen
before its tokens existed, and that a late sighting is not mistaken for one. Also here:
``acquire()`` waits from the instant its draw was decided, not from the draw's return.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from swarm.bench.governor import could_have_granted, over_grant_tolerance, over_granted
from swarm.core.governor import (
    Draw,
    GovernorConfig,
    GovernorSnapshot,
    Grant,
    Ticket,
    TrueUp,
    acquire,
)
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import Lane
from tests.unit.test_governor import FakeTime

Sighting = tuple[float, float, int]  # (asked, seen, tokens)


def every_window(
    grants: Sequence[Sighting],
    start: float,
    initial: float,
    capacity: float,
    credit: Callable[[float], float],
) -> float:
    """The reference: every window [t1, t2] (t1 an ask or the start, t2 a sighting), counted
    one by one, O(n^3)."""
    rel = [(max(0.0, a - start), max(0.0, s - start), t) for a, s, t in grants]
    worst = 0.0
    for t1 in {a for a, _, _ in rel} | {0.0}:
        seen_before = sum(t for _, s, t in rel if s < t1)
        held = min(capacity, initial + credit(t1) - seen_before)
        for t2 in {s for _, s, _ in rel if s >= t1} | {t1}:
            inside = sum(t for a, s, t in rel if a >= t1 and s <= t2)
            worst = max(worst, inside - held - (credit(t2) - credit(t1)))
    return worst


def linear(rate: float) -> Callable[[float], float]:
    def credit(x: float) -> float:
        return rate * x

    return credit


def test_the_window_scan_agrees_with_every_window_counted_one_by_one() -> None:
    rng = random.Random(20261129)
    start = 1_764_450_000.0  # an epoch second, as the benchmark's start is
    for case in range(1_500):
        grants: list[Sighting] = []
        for _ in range(rng.randint(0, 12)):
            asked = start + rng.choice([rng.uniform(-1, 5), float(rng.randint(0, 5))])
            seen = asked + rng.choice([0.0, rng.uniform(0, 2), float(rng.randint(0, 2))])
            grants.append((asked, seen, rng.choice([1, 2, 5])))
        capacity, rate = rng.choice([2.0, 5.0]), rng.choice([0.5, 1.0, 3.0])
        initial = min(capacity, rng.choice([0.0, 1.0, 2.0]))
        fast = over_granted(grants, start, initial, capacity, rate)
        slow = every_window(grants, start, initial, capacity, linear(rate))
        assert fast == pytest.approx(slow, abs=1e-6), f"case {case}: {grants}"


RATE = 1_000.0  # tokens/s
UNIT = 1_000  # one second of refill
CAPACITY = 2_000.0


def queue(n: int, start: float = 0.0) -> list[Sighting]:
    """What a correct governor does under full demand: n workers ask at the start, the k-th
    draw's tokens exist k seconds in, and each worker sees its grant then."""
    return [(start, start + k * UNIT / RATE, UNIT) for k in range(1, n + 1)]


def test_a_correct_queue_is_within_the_bucket_and_a_grant_seen_early_is_over_granted() -> None:
    grants = queue(10)
    assert over_granted(grants, 0.0, 0.0, CAPACITY, RATE) == 0.0
    # one worker is told "granted" 0.25 s before its tokens exist: 250 tokens too early
    early = [*grants[:4], (0.0, 4.75, UNIT), *grants[5:]]
    assert over_granted(early, 0.0, 0.0, CAPACITY, RATE) == pytest.approx(250.0)
    # one extra draw granted, on time: a whole draw too many
    extra = [*grants, (0.0, 10.0, UNIT)]
    assert over_granted(extra, 0.0, 0.0, CAPACITY, RATE) == pytest.approx(UNIT)
    # the tolerance is the clock's resolution, far below either
    assert over_grant_tolerance(RATE) == pytest.approx(1e-3)


def test_late_sightings_are_not_over_grants_though_the_calls_bunch() -> None:
    # workers that see their (correct) grants late, all at once at 10 s: the model would see a
    # burst of 9 draws, more than a bucket of 2 could release, but nothing was granted early
    late = [(a, max(s, 10.0), t) for a, s, t in queue(10)]
    assert over_granted(late, 0.0, 0.0, CAPACITY, RATE) == 0.0
    # judged by the sightings alone (asked = seen), the burst shows, 8 draws beyond the bucket
    # at 10 s, which is why the check takes when each grant was asked for
    sightings = [(s, s, t) for _, s, t in late]
    assert over_granted(sightings, 0.0, 0.0, CAPACITY, RATE) == pytest.approx(8 * UNIT)


def test_a_bucket_that_filled_while_nobody_asked_allows_only_its_capacity_at_once() -> None:
    # nobody asks for 5 s (the bucket holds its capacity, 2,000), then 3 draws at once
    burst = [(5.0, 5.0, UNIT), (5.0, 5.0, UNIT), (5.0, 5.0, UNIT)]
    assert over_granted(burst, 0.0, 0.0, CAPACITY, RATE) == pytest.approx(UNIT)
    assert over_granted(burst[:2], 0.0, 0.0, CAPACITY, RATE) == 0.0


def test_a_varying_rate_is_judged_by_its_credit() -> None:
    def cut_at_5(x: float) -> float:  # 1,000/s, then 500/s from 5 s
        return RATE * min(x, 5.0) + RATE / 2 * max(0.0, x - 5.0)

    # one draw a second throughout, as if nothing had been cut: 10 draws in 10 s where the
    # credit is 5 s at 1,000/s and 5 s at 500/s
    grants = [(k - 1.0, float(k), UNIT) for k in range(1, 11)]
    assert over_granted(grants, 0.0, 0.0, CAPACITY, RATE) == 0.0
    excess = over_granted(grants, 0.0, 0.0, CAPACITY, RATE, credit=cut_at_5)
    assert excess == pytest.approx(10 * UNIT - (5 * RATE + 5 * RATE / 2))
    assert excess == every_window(grants, 0.0, 0.0, CAPACITY, cut_at_5)


def test_what_the_bucket_could_have_given_follows_the_demand() -> None:
    # asked throughout: the whole refill
    assert could_have_granted([(0.0, 10.0)], 0.0, 10.0, 0.0, CAPACITY, RATE) == 10 * RATE
    # nobody asked for the first 4 s: the bucket held only its capacity when they came
    assert could_have_granted([(4.0, 10.0)], 0.0, 10.0, 0.0, CAPACITY, RATE) == pytest.approx(
        CAPACITY + 6 * RATE
    )
    # overlapping asks count once; a gap refills up to the capacity again
    spans = [(0.0, 2.0), (1.0, 3.0), (8.0, 9.0)]
    assert could_have_granted(spans, 0.0, 10.0, 0.0, CAPACITY, RATE) == pytest.approx(
        3 * RATE + CAPACITY + RATE
    )


# ------------------------------------------------------------------ acquire()


class SlowGovernor:
    """An in-memory governor whose every draw takes ``latency`` seconds to come back, as a
    DynamoDB round trip does: it decides at the ``now`` it is given, then the clock moves."""

    def __init__(self, config: GovernorConfig, clock: FakeTime, latency: float) -> None:
        self.config = config
        self.inner = InMemoryGovernor(config, now=0.0)
        self.clock, self.latency = clock, latency
        self.asked: list[float] = []

    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        self.asked.append(now)
        result = self.inner.draw(amount, lane, now)
        self.clock.t += self.latency
        return result

    def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        return self.inner.true_up(grant, used, now)

    def report_throttle(self, now: float) -> None:
        self.inner.report_throttle(now)

    def snapshot(self, now: float) -> GovernorSnapshot:
        return self.inner.snapshot(now)


def test_acquire_waits_from_when_the_draw_was_decided_not_from_its_return() -> None:
    # 1,000 tokens/s from empty: 2,000 tokens exist at 2 s
    config = GovernorConfig(quota_tpm=60_000, share=1.0, capacity=4_000.0)
    clock = FakeTime()
    gov = SlowGovernor(config, clock, latency=0.3)
    got = acquire(gov, 2_000, Lane.NORMAL, clock.now, clock.sleep, max_wait_s=2.1)
    # Then it asks again exactly when the tokens exist (2 s), not 0.3 s late (the round trip):
    # a worker late by its round trip picks its ticket up late, and a fleet of them bursts
    assert got.granted and got.draws == 2
    assert gov.asked == [0.0, pytest.approx(2.0)]
    assert clock.sleeps == [pytest.approx(1.7)]
    # and the bound counts from the start: a 2 s wait fits in 2.1 s though the answer took 0.3
    assert math.isclose(got.waited_s, 2.3)


def test_acquire_picks_up_tokens_that_came_due_while_a_slow_answer_was_on_its_way() -> None:
    config = GovernorConfig(quota_tpm=60_000, share=1.0, capacity=4_000.0)
    clock = FakeTime()
    gov = SlowGovernor(config, clock, latency=2.5)  # the answer takes longer than the bound
    got = acquire(gov, 2_000, Lane.NORMAL, clock.now, clock.sleep, max_wait_s=2.1)
    # the tokens were due at 2 s, within the bound: they are taken, not abandoned unused
    assert got.granted and got.draws == 2
    assert gov.asked == [0.0, pytest.approx(2.501)]
    # but a wait beyond the bound is refused at once, however fast the answer
    clock = FakeTime()
    slow = SlowGovernor(config, clock, latency=0.0)
    assert not acquire(slow, 3_000, Lane.NORMAL, clock.now, clock.sleep, max_wait_s=2.1).granted
    assert clock.sleeps == []
