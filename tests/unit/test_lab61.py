"""Lab 6.1's figures, produced by the scheduler core on the simulator's virtual clock."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from swarm.cli import main
from swarm.core.records import RunState, UnitState
from swarm.core.scheduling import Schedule
from swarm.sim import lab61
from swarm.sim.engine import FleetConfig, Simulation, crossover_workers, simulate
from swarm.sim.workload import Workload

SEED_CHAPTER = Path(__file__).resolve().parents[2].parent / "shared" / "seeds"
BOOK = Schedule.BOOK  # Lab 6.1's schedule: submission order, retries at the back


def test_the_workload_is_the_books() -> None:
    assert Workload().first_attempt_tokens == 4_797_958


def test_baseline_run_is_the_healthy_line_of_the_book() -> None:
    # Given Lab 6.1's fleet: 100 workers, 300k TPM governed at 95%, a 6M budget
    result = simulate(Workload(), FleetConfig(schedule=BOOK))
    # Then every figure of the book's baseline line comes out of the core
    run = result.run
    assert run.state is RunState.COMPLETED
    assert (run.completed, run.units_total) == (400, 400)
    assert result.elapsed == 1_746
    assert run.spent == 4_905_337
    assert run.retries == 9
    assert run.dead_lettered == 0
    assert run.reserved == 0


@pytest.mark.parametrize(
    ("workers", "elapsed"), [(25, 5_091), (50, 2_815), (100, 1_746), (200, 1_604)]
)
def test_worker_scaling_sweep(workers: int, elapsed: int) -> None:
    assert simulate(Workload(), FleetConfig(workers=workers, schedule=BOOK)).elapsed == elapsed


def test_littles_law_crossover() -> None:
    assert crossover_workers(Workload(), FleetConfig()) == 119


def test_budget_capped_run_exhausts_cleanly_with_the_remainder_enumerated() -> None:
    sim = Simulation.fresh(Workload(), FleetConfig(budget=2_500_000, schedule=BOOK))
    result = sim.run_until()
    run = result.run
    assert run.state is RunState.EXHAUSTED
    assert result.elapsed == 1_031
    assert run.completed == 206
    assert run.spent == 2_498_987
    assert run.spent <= run.budget
    # the remainder is every unit that neither completed nor was dead-lettered, by name
    units = sim.ledger.units("sim-run")
    remainder = {u.unit_id for u in units if u.state is UnitState.REMAINDER}
    assert len(remainder) == 194 == run.remainder
    assert set(result.remainder) == remainder
    assert all(u.state in {UnitState.COMPLETED, UnitState.REMAINDER} for u in units)


def _words(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def test_report_prints_every_line_of_the_books_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "lab61"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == lab61.report().strip()
    expected = [
        "400 units, 4,797,958 tokens of first-attempt work | quota 300,000 TPM | governor at 95%",
        "--- baseline: 100 workers, budget 6.0M tokens ---",
        "completed 400/400 in 1,746s | spent 4,905,337 tokens | retries 9 | dead-lettered 0",
        "--- the worker-scaling sweep (same quota, same work) ---",
        "workers elapsed note",
        "25 5,091s worker-bound",
        "50 2,815s worker-bound",
        "100 1,746s worker-bound",
        "200 1,604s quota-bound (81 workers surplus)",
        "Little's law crossover: N* = 119 workers; beyond it, the quota is the fleet",
        "--- budget-capped run: same fleet, budget 2.5M tokens ---",
        "run.exhausted at 1,031s: 206/400 units complete, 2,498,987 tokens spent",
        "partial results are usable and the run is resumable (Lab 6.2) once the budget is "
        "topped up",
    ]
    assert _words(printed) == expected


@pytest.mark.skipif(not SEED_CHAPTER.is_dir(), reason="the seed chapters are not beside the repo")
def test_report_matches_the_seed_chapter_verbatim() -> None:
    chapter = next(SEED_CHAPTER.glob("000_*.txt")).read_text()
    match = re.search(r"python3 swarm_sim\.py\n(.*?)\nThree readings:", chapter, re.S)
    assert match is not None
    assert _words(lab61.report()) == _words(match.group(1))


def test_the_cli_book_policy_reproduces_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """`--policy book` on the command line is Lab 6.1's loop, whatever the default policy."""
    figures = {25: 5_091, 50: 2_815, 100: 1_746, 200: 1_604}
    for workers, elapsed in figures.items():
        assert main(["sim", "run", "--policy", "book", "--workers", str(workers), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert (doc["elapsed_s"], doc["spent"], doc["retries"]) == (elapsed, 4_905_337, 9)
        assert doc["policy"] == "book"
    assert main(["sim", "run", "--policy", "book", "--budget", "2500000", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["state"], doc["elapsed_s"], doc["completed"], doc["spent"]) == (
        "exhausted",
        1_031,
        206,
        2_498_987,
    )
    args = ["sim", "sweep", "--policy", "book", "--workers", "25,50,100,200", "--json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_star"] == 119
    assert {r["workers"]: r["elapsed_s"] for r in doc["rows"]} == figures
