"""Lab 6.2 semantics: kill the fleet mid-run, resume from the saved state, books reconcile."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.cli import main
from swarm.core.records import RunState, UnitState
from swarm.core.scheduling import Schedule
from swarm.sim import state
from swarm.sim.engine import RUN_ID, FleetConfig, Simulation
from swarm.sim.workload import Workload


def assert_books_reconcile(sim: Simulation) -> None:
    run = sim.run
    attempts = sim.ledger.attempts(RUN_ID)
    # spent is the sum over every attempt's tokens, lost ones included
    assert run.spent == sum(a.tokens for a in attempts)
    assert run.attempts == len(attempts)
    # no unit succeeds twice, and nothing runs after a unit's success
    successes = Counter(a.unit_id for a in attempts if a.succeeded)
    assert max(successes.values(), default=0) <= 1
    for unit_id in successes:
        tries = sorted(a.attempt for a in attempts if a.unit_id == unit_id)
        winner = next(a.attempt for a in attempts if a.unit_id == unit_id and a.succeeded)
        assert tries[-1] == winner
        assert tries == list(range(len(tries)))
    # every unit ends completed, dead-lettered or in the remainder
    units = sim.ledger.units(RUN_ID)
    if run.state.closed:
        assert all(u.state.terminal for u in units)
    counts = Counter(u.state for u in units)
    assert counts[UnitState.COMPLETED] == run.completed == len(successes)
    assert counts[UnitState.DEAD_LETTERED] == run.dead_lettered


def test_kill_then_resume_counts_the_lost_attempts_and_reruns_nothing_completed(
    tmp_path: Path,
) -> None:
    # Given Lab 6.1's fleet killed at t=900s with 100 attempts in flight
    sim = Simulation.fresh(Workload(), FleetConfig())
    killed = sim.run_until(kill_at=900)
    assert killed.killed and killed.in_flight == 100
    done_before = {u.unit_id for u in sim.ledger.units(RUN_ID) if u.state is UnitState.COMPLETED}
    spent_before = sim.run.spent
    in_flight_tokens = sum(r.item.tokens for r in sim.in_flight)
    path = tmp_path / "state.json"
    state.save(sim, path)

    # When it resumes from the file
    resumed = state.load(path)
    assert resumed.recover_after_kill() == 100
    # Then the lost attempts' tokens are spent and counted
    assert resumed.run.spent == spent_before + in_flight_tokens
    result = resumed.run_until()
    assert result.run.state.closed
    assert_books_reconcile(resumed)
    # and no unit that had completed before the kill ran again
    for attempt in resumed.ledger.attempts(RUN_ID):
        if attempt.unit_id in done_before:
            assert attempt.settled_at < 900


@pytest.mark.parametrize("schedule", list(Schedule))
def test_resume_after_a_top_up_completes_an_exhausted_run(
    tmp_path: Path, schedule: Schedule
) -> None:
    sim = Simulation.fresh(Workload(), FleetConfig(budget=2_500_000, schedule=schedule))
    exhausted = sim.run_until()
    assert exhausted.run.state is RunState.EXHAUSTED
    if schedule is Schedule.BOOK:  # Lab 6.1's capped run
        assert len(exhausted.remainder) == 194
    path = tmp_path / "capped.json"
    state.save(sim, path)
    resumed = state.load(path)
    assert resumed.fleet.schedule is schedule  # the policy travels with the state
    assert resumed.top_up(3_500_000) == len(exhausted.remainder)
    result = resumed.run_until()
    assert result.run.state is RunState.COMPLETED
    assert result.run.completed + result.run.dead_lettered == 400
    assert_books_reconcile(resumed)


@settings(max_examples=25, deadline=None)
@given(
    kill_at=st.integers(min_value=1, max_value=1_800),
    workers=st.integers(1, 250),
    schedule=st.sampled_from(list(Schedule)),
)
def test_any_kill_time_reconciles(kill_at: int, workers: int, schedule: Schedule) -> None:
    fleet = FleetConfig(workers=workers, budget=900_000, schedule=schedule)
    sim = Simulation.fresh(Workload(units=60), fleet)
    first = sim.run_until(kill_at=kill_at)
    if first.killed:
        resumed = state.from_doc(json.loads(json.dumps(state.to_doc(sim))))
        resumed.recover_after_kill()
        resumed.run_until()
        sim = resumed
    assert sim.run.state.closed
    assert_books_reconcile(sim)


def test_cli_kill_and_resume_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    assert main(["sim", "run", "--kill-at", "900", "--state", str(path), "--policy", "book"]) == 0
    assert "killed at 900s: 203/400 complete, 100 attempts in flight" in capsys.readouterr().out
    assert main(["sim", "resume", "--state", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # 100 attempts' tokens were lost at the kill, so the 6M budget no longer covers everything
    assert doc["lost_attempts"] == 100
    assert doc["state"] == "exhausted"
    assert doc["completed"] + doc["dead_lettered"] + doc["remainder"] == 400
    assert doc["spent"] <= doc["budget"]
    assert main(["sim", "resume", "--state", str(path), "--top-up", "1000000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "completed" and doc["completed"] + doc["dead_lettered"] == 400
