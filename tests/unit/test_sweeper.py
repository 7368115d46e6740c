"""The sweeper on the in-memory twins: runs whose execution died are closed or restarted; runs
with a live execution are left alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from swarm.core.backpressure import ShedPolicy
from swarm.core.governor import GovernorConfig
from swarm.core.memory import (
    InMemoryGovernor,
    InMemoryLedger,
    MemoryBlobs,
    MemoryDrain,
    MemoryEvents,
    MemoryExecutions,
    MemoryQueue,
    MemoryResults,
    MemoryRunWatch,
)
from swarm.core.ports import WatchedRun
from swarm.core.records import Lane, RunState, UnitState
from swarm.service.batches import (
    Batches,
    BatchesConfig,
    SubmitRequest,
    UnitInput,
    manifest_key,
    spec_key,
)
from swarm.service.fanout import FanOut
from swarm.service.finalizer import Finalizer
from swarm.service.opener import open_at_once
from swarm.service.results import Results
from swarm.service.sweeper import (
    MAX_EXECUTION_NAME,
    SweepConfig,
    Sweeper,
    Verdict,
    candidate_executions,
    execution_name,
    repair_execution_name,
    restart_kind,
    resume_execution_name,
)

INTERVAL = 900.0  # the schedule's rate: 15 minutes
GRACE = 300.0


#: how long an admitted unit may wait in its lane (the fan-out's lease; SQS's retention)
QUEUE_LEASE_S = 86_400


@dataclass
class Plane:
    now: float = 10_000.0
    ledger: InMemoryLedger = field(default_factory=InMemoryLedger)
    queue: MemoryQueue = field(default_factory=MemoryQueue)
    blobs: MemoryBlobs = field(default_factory=MemoryBlobs)
    executions: MemoryExecutions = field(default_factory=MemoryExecutions)
    events: MemoryEvents = field(default_factory=MemoryEvents)

    def __post_init__(self) -> None:
        # the execution's open step runs as it starts (a test may set it to None: opening)
        self.executions.open_step = open_at_once(self.ledger, self.blobs)
        self.watch = MemoryRunWatch(self.ledger, grace_s=GRACE)
        governor = InMemoryGovernor(GovernorConfig(600_000, 0.95), now=self.now)
        self.batches = Batches(
            self.ledger,
            governor,
            self.queue,
            self.blobs,
            self.executions,
            MemoryDrain(),
            # a chunk per unit: a map that dies after its first item admitted one unit
            BatchesConfig(ShedPolicy({}), max_budget=10**9, units_per_child=1),
        )
        self.fanout = FanOut(self.ledger, self.queue, queue_lease_s=QUEUE_LEASE_S)
        self.finalizer = Finalizer(
            self.ledger,
            self.queue,
            self.blobs,
            self.events,
            Results(self.ledger, MemoryResults()),
            watch=self.watch,
        )
        self.sweeper = Sweeper(
            self.ledger,
            self.watch,
            self.executions,
            self.finalizer,
            SweepConfig(interval_s=INTERVAL),
        )

    def submit(self, units: int = 4, budget: int = 10**8, max_attempts: int = 3) -> str:
        request = SubmitRequest(
            lane=Lane.NORMAL,
            budget=budget,
            max_attempts=max_attempts,
            units=[UnitInput(f"u{i}", 1_000) for i in range(units)],
        )
        return self.batches.submit("acme", request, None, self.now).run.run_id

    def map(self, run_id: str, only: int | None = None) -> None:
        """The Distributed Map of the run's execution (or its first ``only`` items: chunks of
        one unit here)."""
        items = self.blobs.get_json(manifest_key(run_id))
        for item in items[:only]:
            self.fanout.admit_and_enqueue_chunk(item, self.now)

    def settle_all(self, run_id: str) -> None:
        """Workers run every admitted unit to success."""
        for unit in self.ledger.units(run_id):
            if unit.state is UnitState.IN_FLIGHT:
                assert unit.reservation is not None
                attempt = unit.reservation.attempt
                self.ledger.claim(run_id, unit.unit_id, attempt, self.now, 60)
                self.ledger.settle(run_id, unit.unit_id, attempt, 900, True, self.now)

    def first_poll(self, run_id: str, execution: str) -> dict[str, Any]:
        """The finalize loop's first poll, as the state machine makes it."""
        return self.finalizer.finalize(run_id, self.now, execution=execution)

    def tick(self, minutes: float = 15) -> list[tuple[str, Verdict]]:
        self.now += minutes * 60
        report = self.sweeper.sweep(self.now)
        return [(s.run_id, s.verdict) for s in report.swept]


# ---------------------------------------------------------------------- the decisions


def test_a_run_whose_execution_is_running_is_left_alone() -> None:
    # Given a run fanned out and polled by its live execution
    plane = Plane()
    run_id = plane.submit()
    plane.map(run_id)
    plane.first_poll(run_id, run_id)
    # When the sweeper looks at it
    assert plane.tick() == [(run_id, Verdict.RUNNING)]
    # Then nothing was started, finalized or announced, and it is looked at again next tick
    assert list(plane.executions.started) == [run_id]
    assert plane.events.published == []
    watched = plane.watch.get(run_id)
    assert watched is not None and watched.repairs == 0
    assert plane.now < watched.sweep_at <= plane.now + INTERVAL
    assert plane.tick() == [(run_id, Verdict.RUNNING)]


def test_a_run_is_not_looked_at_before_its_grace_and_not_after_its_closure_is_announced() -> None:
    plane = Plane()
    run_id = plane.submit()
    assert plane.tick(minutes=GRACE / 60 / 2) == []  # its execution is being started
    plane.map(run_id)
    plane.settle_all(run_id)
    assert plane.first_poll(run_id, run_id)["closed"]  # its execution announced it
    assert plane.watch.get(run_id) is None
    assert plane.tick() == []


def test_a_closed_run_whose_execution_died_is_announced_by_the_sweeper() -> None:
    # Given a run whose last unit settled, and whose execution died before it could announce
    plane = Plane()
    run_id = plane.submit()
    plane.map(run_id)
    plane.first_poll(run_id, run_id)
    plane.settle_all(run_id)
    plane.executions.statuses[run_id] = "FAILED"
    # When the sweeper looks at it
    assert plane.tick() == [(run_id, Verdict.ANNOUNCED)]
    # Then it is announced, with its results, exactly once, and nothing is restarted
    assert [e for e, _ in plane.events.published] == ["run.completed"]
    assert plane.blobs.exists(f"results/{run_id}/completed-0.json")
    assert list(plane.executions.started) == [run_id]
    assert plane.watch.get(run_id) is None
    assert plane.tick() == []


def test_a_closure_whose_results_file_the_sweep_has_no_time_for_gets_the_finalize_loop_back() -> (
    None
):
    # Given a closed run whose execution died, and a results file longer than one part
    plane = Plane()
    run_id = plane.submit(units=40)
    plane.map(run_id)
    plane.first_poll(run_id, run_id)
    plane.settle_all(run_id)
    plane.executions.statuses[run_id] = "FAILED"
    plane.finalizer.results.store.part_bytes = 1_000  # type: ignore[attr-defined]
    # When the sweeper looks at it with time for one part only
    plane.now += INTERVAL
    report = plane.sweeper.sweep(plane.now, out_of_time=iter([False, True]).__next__)
    # Then it restarts the finalize loop, which writes the rest and announces the closure once
    assert [(s.run_id, s.verdict) for s in report.swept] == [(run_id, Verdict.FINALIZE_LOOP)]
    assert plane.events.published == []
    (restart,) = [name for name in plane.executions.started if name != run_id]
    answer = plane.finalizer.finalize(run_id, plane.now, execution=restart)
    assert answer["closed"] and answer["announced"]
    assert [e for e, _ in plane.events.published] == ["run.completed"]


def test_units_never_admitted_are_fanned_out_again() -> None:
    # Given a run whose map died after admitting 1 unit of 4 (execution FAILED: FanOutFailed)
    plane = Plane()
    run_id = plane.submit(units=4)
    plane.map(run_id, only=1)
    plane.executions.statuses[run_id] = "FAILED"
    # When the sweeper looks at it
    assert plane.tick() == [(run_id, Verdict.FAN_OUT)]
    # Then a new execution runs the map over the batch's manifest (admission is idempotent)
    restart = repair_execution_name(run_id, 1)
    assert restart == f"{run_id}-r1"
    assert plane.executions.started[restart] == {
        "batch_id": run_id,
        "manifest_key": manifest_key(run_id),
    }
    # and the restart's map admits exactly the three that were missing
    before = {u.unit_id for u in plane.ledger.units(run_id) if u.state is UnitState.IN_FLIGHT}
    plane.map(run_id)
    after = {u.unit_id for u in plane.ledger.units(run_id) if u.state is UnitState.IN_FLIGHT}
    assert len(before) == 1 and len(after) == 4
    assert plane.ledger.run(run_id).reserved == 4_000  # nothing admitted twice
    watched = plane.watch.get(run_id)
    assert watched is not None and watched.repairs == 1 and watched.execution is None
    # and while the restart runs, the run is left alone
    assert plane.tick() == [(run_id, Verdict.RUNNING)]


def test_a_run_whose_open_never_finished_is_restarted_from_the_open_step() -> None:
    # Given a batch whose execution failed in its open step (the run is still opening)
    plane = Plane()
    plane.executions.open_step = None
    run_id = plane.submit(units=4)
    assert plane.ledger.run(run_id, opening=True).state is RunState.OPENING
    # While its execution runs, the sweeper leaves it alone
    assert plane.tick() == [(run_id, Verdict.RUNNING)]
    plane.executions.statuses[run_id] = "FAILED"
    # When the sweeper looks at it again
    plane.now += 3_600
    assert plane.tick() == [(run_id, Verdict.OPEN)]
    # Then it restarted the execution from the open step
    restart = repair_execution_name(run_id, 1)
    assert plane.executions.started[restart] == {
        "batch_id": run_id,
        "manifest_key": manifest_key(run_id),
        "open": {"spec_key": spec_key(run_id), "cursor": 0, "done": False},
    }
    watched = plane.watch.get(run_id)
    assert watched is not None and watched.repairs == 1
    # and that restart's open step opens the run: every unit pending, none admitted
    open_at_once(plane.ledger, plane.blobs)(plane.executions.started[restart])
    run = plane.ledger.run(run_id)
    assert run.state is RunState.OPEN and run.pending == 4 and run.reserved == 0


def test_units_in_flight_get_the_finalize_loop_back_without_the_map() -> None:
    # Given a run fanned out, polled once, whose execution then timed out (units in their lanes)
    plane = Plane()
    run_id = plane.submit(units=3)
    plane.map(run_id)
    plane.first_poll(run_id, run_id)
    plane.executions.statuses[run_id] = "TIMED_OUT"
    sent = len(plane.queue.sent)
    # When the sweeper looks at it
    assert plane.tick() == [(run_id, Verdict.FINALIZE_LOOP)]
    # Then a new execution enters the finalize loop directly (the map's input plus its state)
    restart = f"{run_id}-r1"
    assert plane.executions.started[restart] == {
        "batch_id": run_id,
        "manifest_key": manifest_key(run_id),
        "loop": {"root": restart, "generation": 0, "polls": 0},
    }
    assert len(plane.queue.sent) == sent  # nothing enqueued again
    # and once its first poll records it, it is the one the sweeper checks
    plane.first_poll(run_id, restart)
    watched = plane.watch.get(run_id)
    assert watched is not None and watched.execution == restart
    assert plane.tick() == [(run_id, Verdict.RUNNING)]


def test_the_sweeper_sweeps_expired_leases_of_a_run_without_an_execution() -> None:
    # Given a unit claimed by a worker that died (its lease expires), one attempt allowed
    plane = Plane()
    run_id = plane.submit(units=2, max_attempts=1)
    plane.map(run_id)
    plane.first_poll(run_id, run_id)
    plane.ledger.claim(run_id, "u0", 0, plane.now, 60)
    plane.ledger.claim(run_id, "u1", 0, plane.now, 60)
    plane.ledger.settle(run_id, "u1", 0, 900, True, plane.now)
    plane.executions.statuses[run_id] = "ABORTED"
    # When the sweeper looks at it after its claim's lease expired: its message would reclaim
    # it, not the sweep (it looks at a claim when its admission's lease ends)
    assert plane.tick() == [(run_id, Verdict.FINALIZE_LOOP)]
    assert plane.ledger.run(run_id).in_flight == 1
    # and once its admission's lease ended (its message is gone by then)
    plane.executions.statuses[f"{run_id}-r1"] = "ABORTED"
    assert plane.tick(minutes=QUEUE_LEASE_S / 60) == [(run_id, Verdict.ANNOUNCED)]
    # Then the lost attempt is settled (dead-lettered: no attempts left) and the run closes
    run = plane.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.dead_lettered == 1 and run.completed == 1
    assert [e for e, _ in plane.events.published] == ["run.completed"]


def test_a_restart_that_dies_too_is_restarted_again_later_and_later() -> None:
    plane = Plane()
    run_id = plane.submit(units=2)
    plane.map(run_id)
    plane.first_poll(run_id, run_id)
    plane.executions.statuses[run_id] = "FAILED"
    assert plane.tick() == [(run_id, Verdict.FINALIZE_LOOP)]
    first = plane.watch.get(run_id)
    assert first is not None
    # When every restart dies as well
    plane.executions.statuses[f"{run_id}-r1"] = "FAILED"
    assert plane.tick() == [(run_id, Verdict.FINALIZE_LOOP)]
    second = plane.watch.get(run_id)
    assert second is not None and second.repairs == 2
    plane.executions.statuses[f"{run_id}-r2"] = "FAILED"
    # Then the sweeper waits twice as long before the third restart
    assert plane.tick() == []
    assert plane.tick() == [(run_id, Verdict.FINALIZE_LOOP)]
    assert (second.sweep_at - plane.now + 2 * INTERVAL) == pytest.approx(2 * 0.9 * INTERVAL)
    assert sorted(plane.executions.started) == sorted(
        [run_id, f"{run_id}-r1", f"{run_id}-r2", f"{run_id}-r3"]
    )


def test_a_restart_started_by_a_sweep_that_died_is_not_started_twice() -> None:
    # Given a run whose execution died, and a sweep that started -r1 but died before recording it
    plane = Plane()
    run_id = plane.submit(units=2)
    plane.map(run_id)
    plane.first_poll(run_id, run_id)
    plane.executions.statuses[run_id] = "FAILED"
    plane.executions.start(f"{run_id}-r1", {"batch_id": run_id})
    # When the next sweep repairs the run
    assert plane.tick() == [(run_id, Verdict.FINALIZE_LOOP)]
    # Then it starts nothing new: the live -r1 is the restart, and is recorded as such
    assert sorted(plane.executions.started) == [run_id, f"{run_id}-r1"]
    watched = plane.watch.get(run_id)
    assert watched is not None and watched.repairs == 1
    assert plane.tick() == [(run_id, Verdict.RUNNING)]


def test_one_broken_run_does_not_stop_the_sweep() -> None:
    plane = Plane()
    broken, fine = plane.submit(), plane.submit()
    for run_id in (broken, fine):
        plane.map(run_id)
        plane.first_poll(run_id, run_id)
        plane.executions.statuses[run_id] = "FAILED"
    del plane.blobs.objects[manifest_key(broken)]  # a lost unit's requeue needs its input
    plane.ledger.claim(broken, "u0", 0, plane.now, 60)  # whose worker dies, its message lost
    swept = dict(plane.tick(minutes=QUEUE_LEASE_S / 60))
    # (the fine run's units waited out their admission's lease too: released, fanned out again)
    assert swept == {broken: Verdict.ERROR, fine: Verdict.FAN_OUT}


def test_a_sweep_stops_taking_runs_when_out_of_time() -> None:
    plane = Plane()
    for _ in range(3):
        run_id = plane.submit()
        plane.executions.statuses[run_id] = "FAILED"
    plane.now += INTERVAL
    calls = iter([False, True])
    report = plane.sweeper.sweep(plane.now, out_of_time=lambda: next(calls))
    assert len(report.swept) == 1 and report.out_of_time
    assert report.as_dict()["examined"] == 1


def test_a_run_reopened_by_a_top_up_is_watched_again() -> None:
    # Given an exhausted run whose closure was announced (the sweeper forgot it)
    plane = Plane()
    run_id = plane.submit(units=4, budget=2_500)
    plane.map(run_id)
    plane.settle_all(run_id)
    assert plane.first_poll(run_id, run_id)["state"] == "exhausted"
    plane.executions.statuses[run_id] = "SUCCEEDED"
    assert plane.watch.get(run_id) is None
    # When the tenant resumes it
    plane.batches.resume("acme", run_id, 10_000, plane.now)
    resume = resume_execution_name(run_id, 1)
    # Then the resume's execution is the one Batches started, and the run is watched again
    assert resume in plane.executions.started
    assert plane.watch.get(run_id) is not None
    assert plane.tick() == [(run_id, Verdict.RUNNING)]
    # and if that execution dies during its map, the remainder is fanned out again
    plane.executions.statuses[resume] = "FAILED"
    assert plane.tick() == [(run_id, Verdict.FAN_OUT)]


# ---------------------------------------------------------------------- the pieces


def test_restart_kind() -> None:
    plane = Plane()
    run_id = plane.submit(units=2)
    plane.map(run_id, only=1)
    run = plane.ledger.run(run_id)
    polled = WatchedRun(run_id, 0.0, execution=run_id)
    assert restart_kind(run, polled) is Verdict.FAN_OUT  # one unit waits for admission
    plane.map(run_id)
    run = plane.ledger.run(run_id)
    assert restart_kind(run, polled) is Verdict.FINALIZE_LOOP
    # no execution reached the finalize loop: the map may have died between admit and send
    assert restart_kind(run, WatchedRun(run_id, 0.0)) is Verdict.FAN_OUT


def test_candidate_executions_most_likely_first() -> None:
    plane = Plane()
    run_id = plane.submit(units=1)
    run = plane.ledger.run(run_id).with_(exhaustions=2)
    watched = WatchedRun(run_id, 0.0, execution=f"{run_id}-r3-c4", repairs=3)
    assert candidate_executions(run, watched) == [
        f"{run_id}-r3-c4",
        f"{run_id}-r3",
        f"{run_id}-resume-2",
        run_id,
    ]
    assert candidate_executions(plane.ledger.run(run_id), WatchedRun(run_id, 0.0)) == [run_id]


def test_execution_names_fit_step_functions() -> None:
    batch = "b-0123456789abcdef01234567"  # what the API makes
    assert execution_name(batch, "-r12") == f"{batch}-r12"
    long = "x" * 128
    name = execution_name(long, "-r1")
    assert len(name) == MAX_EXECUTION_NAME and name.endswith("-r1")
    assert execution_name(long, "-r1") == name  # deterministic
    assert execution_name("y" * 128, "-r1") != name
    odd = execution_name("a:b", "-r1")  # ':' is a valid run id character, not a name one
    assert ":" not in odd and odd.endswith("-r1")


def test_the_recheck_doubles_with_each_restart_up_to_a_day() -> None:
    config = SweepConfig(interval_s=INTERVAL)
    assert config.recheck_after() == config.recheck_after(1) == 0.9 * INTERVAL
    assert config.recheck_after(3) == 4 * 0.9 * INTERVAL
    assert config.recheck_after(40) == 86_400.0


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_the_sweepers_timers_follow_the_local_time_scale(scale: float) -> None:
    from swarm.contract import FUNCTION_ENV, OPTIONAL_VARS
    from swarm.settings import Settings
    from swarm.wiring import Wiring

    env = {name: f"value-{name.lower()}" for name in FUNCTION_ENV["sweeper"]}
    env.update(
        {
            "SWARM_FUNCTION": "sweeper",
            "STAGE": "dev",
            "POWERTOOLS_LOG_LEVEL": "INFO",
            "STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:fanout",
            "SWEEP_INTERVAL_SECONDS": "900",
            "LEASE_SECONDS": "720",
        }
    )
    for name in OPTIONAL_VARS:
        env.pop(name, None)
    runtime = Wiring(Settings.from_env(env), lambda service: object(), time_scale=scale)
    sweeper = runtime.sweeper()
    assert sweeper.config.interval_s == 900 / scale
    assert sweeper.config.max_backoff_s == 86_400 / scale
    assert sweeper.finalizer.watch is not None  # the finalizer it runs releases what it closes
    # and sweeps the human gates, a decided unit sent back with the lanes' lease
    assert sweeper.finalizer.approvals is not None
    assert sweeper.finalizer.approvals.lease_s == 720 / scale
    assert sweeper.ledger.watch_grace_s == 300 / scale  # type: ignore[attr-defined]
    arn = sweeper.executions.execution_arn("b-1-r2")  # type: ignore[attr-defined]
    assert arn == "arn:aws:states:us-east-1:123456789012:execution:fanout:b-1-r2"
