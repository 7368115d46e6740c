"""The scheduling policies in the simulator: what each admits when, the floor under every run,
and the books that reconcile whatever the order."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.core.errors import InvalidInput
from swarm.core.lanes import Policy, QueuedUnit
from swarm.core.records import RunState
from swarm.core.scheduling import Schedule, ServiceModel
from swarm.sim import state
from swarm.sim.engine import FleetConfig, Simulation, simulate
from swarm.sim.workload import Workload
from tests.unit.test_sim_kill_resume import assert_books_reconcile


def admissions(sim: Simulation) -> list[tuple[int, QueuedUnit]]:
    """Run ``sim`` to its end; every attempt it started, with when, in order."""
    started: list[tuple[int, QueuedUnit]] = []
    dispatch = sim._dispatch

    def recording(t: int) -> int | None:
        before = len(sim.in_flight)
        wait = dispatch(t)
        started.extend((t, r.item) for r in sim.in_flight[before:])
        return wait

    sim._dispatch = recording  # type: ignore[method-assign]
    sim.run_until()
    return started


@pytest.mark.parametrize(
    ("schedule", "elapsed"),
    [(Schedule.BOOK, 1_604), (Schedule.LARGEST_FIRST, 1_524), (Schedule.LARGEST_FIT, 1_361)],
)
def test_the_seed_workload_at_200_workers(schedule: Schedule, elapsed: int) -> None:
    # Given Lab 6.1's workload on 200 workers (quota-bound: N* = 119)
    result = simulate(Workload(), FleetConfig(workers=200, schedule=schedule))
    # Then every policy makes the same attempts, so the same floor: 4,905,337 tokens at
    # 4,750 tokens/s (1,033 s) and the shortest attempt's 260 s
    assert result.run.spent == 4_905_337 and result.run.retries == 9
    assert result.floor is not None and result.floor.seconds == 1_293
    assert result.floor.bound_by == "quota"
    assert result.elapsed == elapsed
    assert result.floor_ratio == pytest.approx(elapsed / 1_293)


def test_largest_first_admits_the_largest_units_first() -> None:
    workload = Workload(units=60, failure_rate=0.0, seed=3)
    for workers in (5, 200):
        sim = Simulation.fresh(workload, FleetConfig(workers=workers))
        tokens = [item.tokens for _, item in admissions(sim)]
        assert tokens == sorted(tokens, reverse=True)
        assert len(tokens) == 60


def test_largest_first_retries_a_failed_unit_before_anything_else_queued() -> None:
    workload = Workload(units=80, failure_rate=0.2, seed=11)
    started = admissions(Simulation.fresh(workload, FleetConfig(workers=10)))
    retries = [(t, item) for t, item in started if item.attempt > 0]
    assert retries
    for t, retry in retries:
        # nothing that was queued when the retry came back started between its return and it
        # (only a unit already waiting for its tokens may go first)
        returned = max(t0 for t0, item in started if item.unit_id == retry.unit_id and t0 < t)
        returned += workload.service_s(retry.tokens)
        overtaking = [item for t1, item in started if returned < t1 < t and item.attempt == 0]
        assert len(overtaking) <= 1


def test_the_book_retries_at_the_back() -> None:
    workload = Workload(units=40, failure_rate=0.2, seed=11)
    started = admissions(Simulation.fresh(workload, FleetConfig(workers=5, schedule=Schedule.BOOK)))
    first_retry = next(i for i, (_, item) in enumerate(started) if item.attempt > 0)
    # every first attempt starts before any retry: the retries queued behind all of them
    assert all(item.attempt > 0 for _, item in started[first_retry:])
    assert [int(item.unit_id[-5:]) for _, item in started[:first_retry]] == list(range(40))


def test_largest_fit_lets_a_small_unit_past_a_large_one_that_does_not_fit_yet() -> None:
    # Given one unit of 6,000 tokens and five of 1,000 on a 60,000 TPM quota (1,000 tokens/s)
    workload = Workload.from_sizes([1_000, 6_000, 1_000, 1_000, 1_000, 1_000], failure_rate=0.0)
    fleet = FleetConfig(workers=10, quota_tpm=60_000, share=1.0)
    # Then largest-first waits 6 s for the large unit, and the small ones follow it
    first = admissions(Simulation.fresh(workload, fleet))
    assert [(t, item.tokens) for t, item in first][:2] == [(6, 6_000), (7, 1_000)]
    # while largest-fit admits a small unit each second the large one does not fit, and the
    # large one when the small ones are gone and its tokens are there
    fit = admissions(Simulation.fresh(workload, replace(fleet, schedule=Schedule.LARGEST_FIT)))
    assert [(t, item.tokens) for t, item in fit] == [
        (1, 1_000),
        (2, 1_000),
        (3, 1_000),
        (4, 1_000),
        (5, 1_000),
        (11, 6_000),
    ]


@settings(max_examples=40, deadline=None)
@given(
    units=st.integers(1, 80),
    sizes=st.tuples(st.integers(1, 20_000), st.integers(0, 20_000)),
    workers=st.integers(1, 250),
    failure_rate=st.sampled_from([0.0, 0.04, 0.2, 0.5]),
    max_attempts=st.integers(1, 4),
    share=st.floats(0.2, 1.0),
    budget=st.integers(0, 3_000_000),
    seed=st.integers(0, 10**6),
    schedule=st.sampled_from(list(Schedule)),
    fairness=st.sampled_from(list(Policy)),
)
def test_no_policy_beats_the_floor_and_the_books_reconcile(
    units: int,
    sizes: tuple[int, int],
    workers: int,
    failure_rate: float,
    max_attempts: int,
    share: float,
    budget: int,
    seed: int,
    schedule: Schedule,
    fairness: Policy,
) -> None:
    low, spread = sizes
    workload = Workload(units, low, low + spread, failure_rate, seed, ServiceModel(60, 200))
    fleet = FleetConfig(
        workers=workers,
        quota_tpm=60_000,
        share=share,
        budget=budget,
        max_attempts=max_attempts,
        policy=fairness,
        schedule=schedule,
    )
    sim = Simulation.fresh(workload, fleet)
    result = sim.run_until()
    assert result.run.state.closed
    assert_books_reconcile(sim)
    # the floor is a lower bound on the makespan of the attempts the run made
    assert result.floor is not None
    assert result.elapsed >= result.floor.seconds
    if result.run.attempts:
        assert result.floor_ratio is not None and result.floor_ratio >= 1


def test_the_policy_and_a_waiting_unit_travel_in_the_state_file() -> None:
    # Given a largest-first run killed while a unit waits for its tokens
    workload = Workload(units=30, min_tokens=20_000, max_tokens=30_000)
    sim = Simulation.fresh(workload, FleetConfig(workers=30, quota_tpm=60_000))
    assert sim.run_until(kill_at=45).killed
    assert sim.waiting is not None
    # When it is saved and loaded
    loaded = state.from_doc(json.loads(json.dumps(state.to_doc(sim))))
    # Then it resumes with the same policy, the same waiting unit, and ends as the original
    assert loaded.fleet.schedule is Schedule.LARGEST_FIRST and loaded.waiting == sim.waiting
    assert loaded.run_until().elapsed == sim.run_until().elapsed


def test_a_state_file_from_before_the_policies_resumes_with_the_books() -> None:
    sim = Simulation.fresh(Workload(units=20), FleetConfig(schedule=Schedule.BOOK))
    sim.run_until(kill_at=200)
    doc = state.to_doc(sim)
    del doc["fleet"]["schedule"], doc["waiting"]
    for key in ("base_s", "tokens_per_s", "sizes", "ids"):
        del doc["workload"][key]
    loaded = state.from_doc(doc)
    assert loaded.fleet.schedule is Schedule.BOOK
    assert loaded.workload == Workload(units=20)
    assert loaded.run_until().run.state is RunState.COMPLETED


def test_a_workload_of_given_sizes() -> None:
    workload = Workload.from_sizes([300, 100, 200], ["x", "y", "z"], failure_rate=0.5, seed=4)
    assert (workload.units, workload.min_tokens, workload.max_tokens) == (3, 100, 300)
    assert [workload.tokens(i) for i in range(3)] == [300, 100, 200]
    assert workload.index_of("z") == 2 and workload.unit_id(1) == "y"
    # another seed draws other failures, never other sizes
    other = workload.with_seed(5)
    assert other.all_tokens == workload.all_tokens and other.seed == 5
    result = simulate(workload, FleetConfig(workers=3, quota_tpm=60_000))
    assert result.run.units_total == 3
    with pytest.raises(InvalidInput, match=r"units\[1\].projected_tokens"):
        Workload.from_sizes([5, 0])
    with pytest.raises(InvalidInput, match="one id per unit"):
        Workload.from_sizes([5, 6], ["only-one"])
