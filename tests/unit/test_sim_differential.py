"""The simulator's ``book`` policy against the seed chapter's own loop, on random parameters.

``reference_run`` is Lab 6.1's ``run_fleet`` (seed chapter 000, "Full source"), written out
again with its module constants as parameters and nothing else changed: per-second ticks, a
float bucket refilled by addition, a FIFO list, admission against ``spent``. The simulator gets
the same answers from the governor, ledger and lanes the Lambda functions use, on a clock that
jumps between events. The same loop with the queue sorted largest first and retries inserted at
its head checks the ``largest-first`` policy.

Floats: the seed's bucket adds ``REFILL * GOVERNOR_SHARE`` once a second, the governor
multiplies the rate by the elapsed time. Both are exact when the rate has few binary digits, so
the random quotas are whole tokens per second and the shares multiples of 1/64 (plus the book's
300,000 TPM at 0.95); elsewhere the two roundings can differ in the last bit, and a unit exactly
as large as the bucket would wait one second longer in one of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from swarm.core.records import RunState, UnitState
from swarm.core.scheduling import Schedule, ServiceModel
from swarm.sim.engine import RUN_ID, FleetConfig, Simulation
from swarm.sim.workload import Workload

#: The seed's loop gives up at 50,000 s, a safety stop; slow random fleets here run longer
HORIZON = 1_000_000


@dataclass(frozen=True)
class Params:
    units: int = 400
    min_tokens: int = 8_000
    max_tokens: int = 16_000
    failure_rate: float = 0.04
    seed: int = 0
    quota_tpm: int = 300_000
    share: float = 0.95
    max_attempts: int = 3
    workers: int = 100
    budget: int = 6_000_000


def reference_run(
    p: Params, kill_at: int | None = None, largest_first: bool = False
) -> dict[str, Any]:
    """The seed's ``run_fleet`` with its constants as parameters (resume left out)."""

    def unit_tokens(unit: int) -> int:
        return random.Random(f"{p.seed}:{unit}").randint(p.min_tokens, p.max_tokens)

    def attempt_fails(unit: int, attempt: int) -> bool:
        return random.Random(f"{p.seed}:{unit}:{attempt}").random() < p.failure_rate

    def service_secs(tokens: int) -> int:
        return 180 + tokens // 100

    refill = p.quota_tpm / 60
    done: set[int] = set()
    dead: set[int] = set()
    spent = 0
    queue = list(range(p.units))
    if largest_first:
        queue.sort(key=lambda u: -unit_tokens(u))
    attempt = dict.fromkeys(range(p.units), 0)
    in_flight: list[tuple[int, int, int]] = []  # (unit, finish_t, attempt)
    waiting = False  # largest-first: the head passed admission and waits for the bucket
    bucket = 0.0
    retries = exhausted = 0
    t = 0
    while (queue or in_flight) and t < HORIZON:
        t += 1
        if kill_at is not None and t >= kill_at:
            return {
                "killed_at": t,
                "done": sorted(done),
                "dead": sorted(dead),
                "spent": spent,
                "in_flight": len(in_flight),
            }
        bucket = min(bucket + refill * p.share, p.quota_tpm)
        still = []
        for unit, finish, att in in_flight:  # collect finished units
            if t < finish:
                still.append((unit, finish, att))
            elif attempt_fails(unit, att):  # tokens spent, work lost
                if att + 1 >= p.max_attempts:
                    dead.add(unit)
                else:
                    if largest_first:  # at the head, behind a unit waiting for tokens
                        queue.insert(1 if waiting else 0, unit)
                    else:
                        queue.append(unit)
                    retries += 1
            else:
                done.add(unit)
        in_flight = still
        while queue and len(in_flight) < p.workers:
            tokens = unit_tokens(queue[0])
            if spent + tokens > p.budget:  # admission control
                exhausted, queue = 1, []
                break
            if bucket < tokens:  # governor: wait, not 429
                waiting = True
                break
            waiting = False
            unit = queue.pop(0)
            bucket -= tokens
            spent += tokens
            in_flight.append((unit, t + service_secs(tokens), attempt[unit]))
            attempt[unit] += 1
    return {
        "elapsed": t,
        "done": sorted(done),
        "dead": sorted(dead),
        "spent": spent,
        "retries": retries,
        "exhausted": exhausted,
    }


def simulated_run(
    p: Params, kill_at: int | None = None, schedule: Schedule = Schedule.BOOK
) -> dict[str, Any]:
    """The same run through the simulator, reported in the reference's terms."""
    workload = Workload(
        p.units, p.min_tokens, p.max_tokens, p.failure_rate, p.seed, ServiceModel(180, 100)
    )
    fleet = FleetConfig(
        workers=p.workers,
        quota_tpm=p.quota_tpm,
        share=p.share,
        budget=p.budget,
        max_attempts=p.max_attempts,
        schedule=schedule,
    )
    sim = Simulation.fresh(workload, fleet)
    result = sim.run_until(kill_at)
    units = sim.ledger.units(RUN_ID)

    def indices(state: UnitState) -> list[int]:
        return sorted(workload.index_of(u.unit_id) for u in units if u.state is state)

    run = result.run
    if result.killed:
        return {
            "killed_at": result.elapsed,
            "done": indices(UnitState.COMPLETED),
            "dead": indices(UnitState.DEAD_LETTERED),
            # the seed charges an attempt when it starts; the ledger reserves it at admission
            # (a head waiting for the governor is reserved too) and charges it when it ends
            "spent": run.spent + sum(r.item.tokens for r in sim.in_flight),
            "in_flight": result.in_flight,
        }
    return {
        "elapsed": result.elapsed,
        "done": indices(UnitState.COMPLETED),
        "dead": indices(UnitState.DEAD_LETTERED),
        "spent": run.spent,
        "retries": run.retries,
        "exhausted": int(run.state is RunState.EXHAUSTED),
    }


def test_the_books_own_runs_are_identical() -> None:
    # Lab 6.1's four fleet sizes, its capped run, and a kill mid-run
    for p in (Params(workers=n) for n in (25, 50, 100, 200)):
        assert simulated_run(p) == reference_run(p)
    capped = Params(budget=2_500_000)
    assert simulated_run(capped) == reference_run(capped)
    assert simulated_run(Params(), kill_at=900) == reference_run(Params(), kill_at=900)


@st.composite
def params(draw: st.DrawFn) -> Params:
    min_tokens = draw(st.integers(1, 20_000))
    max_tokens = draw(st.integers(min_tokens, 25_000))
    # whole tokens per second, at least the largest unit per minute (else it never fits)
    per_s = draw(st.integers(max(1, -(-max_tokens // 60)), 20_000))
    units = draw(st.integers(1, 60))
    return Params(
        units=units,
        min_tokens=min_tokens,
        max_tokens=max_tokens,
        failure_rate=draw(st.sampled_from([0.0, 0.04, 0.1, 0.3, 0.6])),
        seed=draw(st.integers(0, 10**6)),
        quota_tpm=per_s * 60,
        share=draw(st.integers(4, 64)) / 64,
        max_attempts=draw(st.integers(1, 5)),
        workers=draw(st.integers(1, 300)),
        budget=draw(st.integers(0, units * max_tokens * 2)),
    )


def _finished(reference: dict[str, Any]) -> bool:
    return reference.get("elapsed", 0) < HORIZON


@settings(max_examples=60, deadline=None)
@given(p=params(), kill_at=st.one_of(st.none(), st.integers(1, 4_000)))
def test_the_book_policy_is_the_seeds_loop(p: Params, kill_at: int | None) -> None:
    # Given any workload, fleet, quota, share, budget, attempts and kill time
    reference = reference_run(p, kill_at)
    assert _finished(reference)
    # Then the simulator's book policy ends exactly where the seed's loop does
    assert simulated_run(p, kill_at) == reference


@settings(max_examples=30, deadline=None)
@given(p=params(), kill_at=st.one_of(st.none(), st.integers(1, 4_000)))
def test_the_largest_first_policy_is_the_seeds_loop_sorted(p: Params, kill_at: int | None) -> None:
    reference = reference_run(p, kill_at, largest_first=True)
    assert _finished(reference)
    assert simulated_run(p, kill_at, Schedule.LARGEST_FIRST) == reference
