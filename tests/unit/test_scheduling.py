"""The scheduling policy and the fleet's arithmetic (swarm.core.scheduling)."""

from __future__ import annotations

import pytest

from swarm.core.errors import InvalidInput
from swarm.core.scheduling import (
    DEFAULT_SCHEDULE,
    Attempt,
    FleetSizing,
    Schedule,
    ServiceModel,
    UnitProfile,
    busy_workers,
    crossover_workers,
    expected_attempts,
    fanout_order,
    makespan_floor,
    size_fleet,
    small_unit_tokens,
)

SEED_RATE = 300_000 / 60 * 0.95  # 4,750 tokens/s


def test_the_policies_and_what_sets_them_apart() -> None:
    assert DEFAULT_SCHEDULE is Schedule.LARGEST_FIRST
    assert Schedule.parse("book") is Schedule.BOOK
    # the book: retries at the back, a head that does not fit blocks the lane
    assert not Schedule.BOOK.retries_first and Schedule.BOOK.head_of_line
    assert Schedule.LARGEST_FIRST.retries_first and Schedule.LARGEST_FIRST.head_of_line
    assert Schedule.LARGEST_FIT.retries_first and not Schedule.LARGEST_FIT.head_of_line
    with pytest.raises(InvalidInput, match="'fifo' is not a policy; use one of book, largest"):
        Schedule.parse("fifo")


def test_fanout_order_is_largest_first_with_ties_in_submission_order() -> None:
    units = [("a", 5), ("b", 20), ("c", 10), ("d", 20), ("e", 1)]
    assert fanout_order(units, lambda u: u[1], Schedule.BOOK) == units
    order = fanout_order(units, lambda u: u[1])
    assert [u[0] for u in order] == ["b", "d", "c", "a", "e"]
    assert fanout_order(units, lambda u: u[1], Schedule.LARGEST_FIT) == order


def test_n_star_is_the_books_littles_law() -> None:
    # Lab 6.1: 11,994.9 tokens and 299.4 s per unit on average at 4,750 tokens/s
    assert crossover_workers(SEED_RATE, 11_994.895, 299.4225) == 119
    # twice the quota feeds twice the workers
    assert crossover_workers(2 * SEED_RATE, 11_994.895, 299.4225) == 238
    with pytest.raises(InvalidInput):
        crossover_workers(0, 12_000, 300)


def test_small_units_need_the_most_workers_to_keep_the_quota_busy() -> None:
    # 8,000 tokens hold a worker 260 s: 4,750 tokens/s keep 154.4 of them busy
    assert busy_workers(SEED_RATE, 8_000, 260) == 155
    # 16,000 tokens hold one 340 s: 101 suffice
    assert busy_workers(SEED_RATE, 16_000, 340) == 101
    assert busy_workers(1.0, 10**9, 1) == 1  # never fewer than one


def test_the_small_unit_is_not_set_by_a_handful_of_outliers() -> None:
    # 5% of the tokens: a few tiny units do not make every unit "small"
    sizes = [10] * 3 + [10_000] * 97
    assert small_unit_tokens(sizes) == 10_000
    assert small_unit_tokens([8_000, 9_000, 16_000], share=0.5) == 9_000
    assert small_unit_tokens([7]) == 7
    with pytest.raises(InvalidInput):
        small_unit_tokens([])


def test_a_fleet_is_sized_per_lane_and_reserved_for_all_three() -> None:
    profile = UnitProfile.of([8_000, 12_000, 16_000], ServiceModel(180, 100))
    assert profile.mean_seconds == pytest.approx(300)
    sizing = size_fleet(SEED_RATE, profile)
    assert sizing.n_star == 119
    assert sizing.per_lane == busy_workers(SEED_RATE, profile.small_tokens, profile.small_seconds)
    assert sizing.reserved == 3 * sizing.per_lane
    # a tiny quota still gives every lane's event source mapping its minimum of 2
    assert size_fleet(0.01, profile).per_lane == 2
    with pytest.raises(InvalidInput, match="small_tokens"):
        UnitProfile(12_000, 300, 0, 260)


@pytest.mark.parametrize(
    ("per_lane", "limit", "problem"),
    [
        (146, 1000, None),  # 438 of the 900 a fresh account can reserve
        (300, 1000, None),  # exactly 900
        (301, 1000, "an account limit of 1000 can reserve at most 900"),
        (146, 10, "can reserve at most 0"),  # a new account's quota of 10
        (1001, 10_000, "MaximumConcurrency of 1000"),
    ],
)
def test_a_fleet_must_fit_the_account(per_lane: int, limit: int, problem: str | None) -> None:
    found = FleetSizing(n_star=1, per_lane=per_lane).problem(limit)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_the_floor_of_the_seed_workload_is_the_issues_arithmetic() -> None:
    # 4,905,337 tokens at 4,750 tokens/s (1,032.7 s, so the last grant at 1,033 s) plus the
    # shortest attempt's 260 s
    attempts = [Attempt(f"u{i}", 12_000, 300) for i in range(408)] + [Attempt("s", 9_337, 260)]
    assert sum(a.tokens for a in attempts) == 4_905_337
    floor = makespan_floor(attempts, SEED_RATE, workers=200)
    assert floor.quota_s == 1_293 and floor.seconds == 1_293 and floor.bound_by == "quota"


def test_the_floor_is_the_workers_or_a_retry_chain_when_they_bind() -> None:
    attempts = [Attempt(f"u{i}", 10, 100) for i in range(10)]
    # ten 100 s attempts on two workers: 500 s, whatever the quota
    assert makespan_floor(attempts, 1_000.0, workers=2).bound_by == "workers"
    assert makespan_floor(attempts, 1_000.0, workers=2).seconds == 500
    # one unit tried three times runs 3 x 100 s in a row, after its first tokens
    chain = [Attempt("u", 10, 100)] * 3
    floor = makespan_floor(chain, 1_000.0, workers=10)
    assert (floor.chain_s, floor.bound_by) == (301, "retries")
    assert makespan_floor([], 1.0, 1).seconds == 0


def test_expected_attempts() -> None:
    assert expected_attempts(0.0, 3) == 1
    assert expected_attempts(0.5, 3) == 1.75
    assert expected_attempts(0.04, 1) == 1
