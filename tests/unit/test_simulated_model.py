"""The simulated model plane: outcomes that tests can compute, and honest billing."""

from __future__ import annotations

import pytest

from swarm.adapters.simulated_model import (
    USAGE_SPREAD,
    SimulatedModelPlane,
    attempt_fails,
    simulated_usage,
)
from swarm.core.ports import ModelRequest, ModelThrottled


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def request(
    unit: str, attempt: int = 0, projected: int = 10_000, cap: int | None = None
) -> ModelRequest:
    return ModelRequest("run-1", unit, attempt, projected, max_tokens=cap)


def test_outcomes_are_functions_of_seed_unit_and_attempt_alone() -> None:
    # Given two planes with the same seed, and one with another
    a, b = SimulatedModelPlane(10**9, 0.3, seed=5), SimulatedModelPlane(10**9, 0.3, seed=5)
    other = SimulatedModelPlane(10**9, 0.3, seed=6)
    units = [f"u-{i}" for i in range(200)]
    # When the same units run, in different runs, in another order
    first = [a.invoke(request(u)) for u in units]
    second = [b.invoke(ModelRequest("run-2", u, 0, 10_000)) for u in reversed(units)][::-1]
    third = [other.invoke(request(u)) for u in units]
    # Then the same seed gives the same outcomes, another seed others, and both match the
    # functions tests use to predict them
    assert first == second
    assert first != third
    assert [not r.succeeded for r in first] == [attempt_fails(5, u, 0, 0.3) for u in units]
    assert [r.tokens for r in first] == [simulated_usage(5, u, 0, 10_000) for u in units]


def test_usage_differs_from_the_projection_both_ways_and_the_cap_holds() -> None:
    plane = SimulatedModelPlane(10**9, seed=1)
    uncapped = [plane.invoke(request(f"u-{i}")).tokens for i in range(200)]
    low, high = USAGE_SPREAD
    assert min(uncapped) < 10_000 < max(uncapped)  # under and over the estimate
    assert all(low * 10_000 - 1 <= t <= high * 10_000 + 1 for t in uncapped)
    capped = [plane.invoke(request(f"u-{i}", cap=10_000)).tokens for i in range(200)]
    assert max(capped) == 10_000 and capped == [min(t, 10_000) for t in uncapped]
    log = plane.log("run-1")
    assert sum(c.truncated for c in log) == sum(t >= 10_000 for t in uncapped)


def test_counters_and_the_call_log_are_kept_per_run_with_the_time_received() -> None:
    clock = Clock()
    plane = SimulatedModelPlane(60_000, seed=3, clock=clock)  # 1,000 tokens/s, 60k bucket
    plane.invoke(ModelRequest("a", "u-1", 0, 50_000, max_tokens=50_000))
    clock.t += 2
    with pytest.raises(ModelThrottled):  # it uses at least 120k tokens: more than the bucket
        plane.invoke(ModelRequest("b", "u-2", 0, 200_000))
    a, b = plane.of_run("a"), plane.of_run("b")
    assert (a.calls, a.throttles) == (1, 0) and a.tokens_billed > 0
    assert (b.calls, b.throttles, b.tokens_billed) == (1, 1, 0)
    assert plane.calls == 2 and plane.throttles == 1 and plane.tokens_billed == a.tokens_billed
    [call] = plane.log("b")
    assert call.received_at == 1_002.0 and call.throttled and call.tokens == 0
    assert plane.log("nobody") == []
