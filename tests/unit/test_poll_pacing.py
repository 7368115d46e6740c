"""The finalize loop's pacing: how long it waits before its next poll (each poll is four state
transitions of the Standard parent: a fixed interval billed in proportion to the run's length)."""

from __future__ import annotations

import pytest

from swarm.core.records import Lane, RunRecord, RunSpec, RunState, UnitSpec
from swarm.service.finalizer import PollPacing

PACING = PollPacing(min_s=30, max_s=300)
OPENED = 1_000.0


def run(
    units: int, *, completed: int = 0, dead: int = 0, spent: int = 0, budget: int = 10**9
) -> RunRecord:
    spec = RunSpec(
        "b-1",
        "acme",
        Lane.NORMAL,
        budget,
        tuple(UnitSpec(f"u{i}", 10_000) for i in range(units)),
        units_total=units,
    )
    return RunRecord(spec, completed=completed, dead_lettered=dead, spent=spent, opened_at=OPENED)


def test_a_run_with_no_progress_yet_is_polled_at_the_shortest_wait() -> None:
    assert PACING.wait_s(run(300), OPENED + 120) == 30
    assert PACING.wait_s(run(300), OPENED) == 30  # no time has passed


def test_the_wait_is_half_the_time_the_run_still_needs_at_its_pace() -> None:
    # Given 100 of 300 units done in 200 s: 200 outstanding need 400 s more at that pace
    assert PACING.wait_s(run(300, completed=90, dead=10), OPENED + 200) == 200
    # near the end the wait shrinks to the shortest, far from it it is capped
    assert PACING.wait_s(run(300, completed=299), OPENED + 600) == 30
    assert PACING.wait_s(run(100_000, completed=10), OPENED + 60) == 300


def test_a_budget_running_out_first_sets_the_pace() -> None:
    # Given 100 of 1,000 units done, but 90% of the budget spent, in 1,000 s: at that spending
    # rate the budget runs out in ~111 s, long before the units (9,000 s)
    record = run(1_000, completed=100, spent=900_000, budget=1_000_000)
    assert PACING.wait_s(record, OPENED + 1_000) == 56
    assert (
        PACING.wait_s(run(1_000, completed=100, spent=1_000_000, budget=1_000_000), OPENED + 1_000)
        == 30
    )


def test_the_polls_of_a_run_thin_out_as_its_end_nears() -> None:
    """A run at a steady pace: about log2(duration / min) polls, not duration / min."""
    units, rate = 10_000, 0.4  # units per second: a ~7 h run
    t, polls = OPENED, 0
    while True:
        done = min(units, int((t - OPENED) * rate))
        record = run(units, completed=done)
        if done == units:
            break
        t += PACING.wait_s(record, t)
        polls += 1
    duration = units / rate
    assert polls < duration / 300 + 20  # at most the capped waits plus a short tail
    assert polls < duration / 30 / 8  # an eighth of a fixed 30 s loop's polls, at least
    assert t - OPENED - duration <= 30  # the closure is seen within the shortest wait


def test_a_closed_run_answers_the_shortest_wait() -> None:
    closed = run(3, completed=3).with_(state=RunState.COMPLETED, closed_at=OPENED + 10)
    assert PACING.wait_s(closed, OPENED + 10) == 30


@pytest.mark.parametrize(("low", "high"), [(0, 10), (30, 10)])
def test_bounds_out_of_order_are_refused(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="min_s <= max_s"):
        PollPacing(low, high)
