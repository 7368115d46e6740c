"""The services end to end on in-memory ports: submit, fan out, work, settle, finalize."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import pytest

from swarm.adapters.simulated_model import SimulatedModelPlane
from swarm.core.backpressure import ShedPolicy
from swarm.core.errors import Conflict, NotFound
from swarm.core.governor import GovernorConfig
from swarm.core.lanes import QueuedUnit
from swarm.core.memory import (
    InMemoryGovernor,
    InMemoryLedger,
    MemoryBlobs,
    MemoryClosures,
    MemoryDrain,
    MemoryEvents,
    MemoryExecutions,
    MemoryMappings,
    MemoryQueue,
    MemoryResults,
    MemoryRunning,
)
from swarm.core.records import Lane, RunState, UnitState
from swarm.core.tenancy import TenantPolicy
from swarm.service.batches import (
    Batches,
    BatchesConfig,
    Draining,
    Shedding,
    SubmitRequest,
    UnitInput,
    spec_key,
)
from swarm.service.drain import DrainController
from swarm.service.fanout import FanOut
from swarm.service.finalizer import Finalizer, dead_letter
from swarm.service.opener import Opener, open_at_once
from swarm.service.results import Results
from swarm.service.worker import Ack, Requeue, RetryLater, Worker, WorkerTimings

QUOTA = 600_000  # the model plane's TPM; the governor takes 95% of it


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@dataclass
class Plane:
    clock: Clock = field(default_factory=Clock)
    ledger: InMemoryLedger = field(default_factory=InMemoryLedger)
    queue: MemoryQueue = field(default_factory=MemoryQueue)
    blobs: MemoryBlobs = field(default_factory=MemoryBlobs)
    executions: MemoryExecutions = field(default_factory=MemoryExecutions)
    drain: MemoryDrain = field(default_factory=MemoryDrain)
    events: MemoryEvents = field(default_factory=MemoryEvents)
    results: MemoryResults = field(default_factory=MemoryResults)
    closures: MemoryClosures = field(default_factory=MemoryClosures)
    failure_rate: float = 0.0
    shed_limits: dict[Lane, int] = field(default_factory=dict)
    tenants: TenantPolicy = field(default_factory=TenantPolicy)

    def __post_init__(self) -> None:
        # the execution's open step runs as it starts (a test may set it to None: opening)
        self.executions.open_step = open_at_once(self.ledger, self.blobs)
        self.governor = InMemoryGovernor(
            GovernorConfig(QUOTA, 0.95, initial_fill=1.0), now=self.clock.now()
        )
        self.model = SimulatedModelPlane(
            QUOTA, self.failure_rate, seed=1, clock=self.clock.now, sleep=self.clock.sleep
        )
        self.batches = Batches(
            self.ledger,
            self.governor,
            self.queue,
            self.blobs,
            self.executions,
            self.drain,
            BatchesConfig(ShedPolicy(self.shed_limits), max_budget=10**9, tenants=self.tenants),
        )
        self.fanout = FanOut(self.ledger, self.queue, queue_lease_s=86_400)
        self.worker = Worker(
            self.ledger,
            self.governor,
            self.model,
            self.results,
            self.drain,
            WorkerTimings(lease_s=300, max_wait_s=20),
            self.clock.now,
            self.clock.sleep,
            closures=self.closures,
        )
        self.finalizer = Finalizer(
            self.ledger,
            self.queue,
            self.blobs,
            self.events,
            Results(self.ledger, self.results),
            closures=self.closures,
        )
        self.outcomes: Counter[str] = Counter()

    def submit(self, units: int, budget: int = 10**8, tenant: str = "acme", **kw: object) -> str:
        request = SubmitRequest(
            lane=kw.get("lane", Lane.NORMAL),  # type: ignore[arg-type]
            budget=budget,
            max_attempts=3,
            units=[UnitInput(f"u{i:03d}", 10_000 + 37 * i) for i in range(units)],
        )
        key = kw.get("key")
        submitted = self.batches.submit(tenant, request, key, self.clock.now())  # type: ignore[arg-type]
        return submitted.run.run_id

    def fan_out(self) -> None:
        """What the state machine does: each execution's items through the fan-out step."""
        for payload in list(self.executions.started.values()):
            if payload.get("done"):
                continue
            for item in self.blobs.get_json(payload["manifest_key"]):
                self.fanout.admit_and_enqueue_chunk(item, self.clock.now())
            payload["done"] = True

    def pump(self, max_steps: int = 100_000) -> None:
        """Workers drain the lanes; delayed messages come back when the lanes are empty."""
        for _ in range(max_steps):
            item = self.queue.receive()
            if item is None:
                if not self.queue.delayed:
                    return
                self.clock.t += max(d for d, _ in self.queue.delayed)
                self.queue.release_delayed()
                continue
            report = self.worker.process(item)
            self.outcomes[type(report.outcome).__name__] += 1
            match report.outcome:
                case RetryLater(after_s=after):
                    self.clock.t += after
                    self.queue.lanes[item.lane].append(item)
                case Requeue(delay_s=delay):
                    self.queue.send(item, delay)
                case Ack():
                    pass
        raise AssertionError("the lanes never drained")

    def run(self, run_id: str) -> dict[str, object]:
        self.fan_out()
        self.pump()
        return self.finalizer.finalize(run_id, self.clock.now())


def test_a_batch_completes_and_the_books_reconcile() -> None:
    plane = Plane(failure_rate=0.1)
    run_id = plane.submit(120)
    result = plane.run(run_id)
    run = plane.ledger.run(run_id)
    assert result["closed"] and run.state is RunState.COMPLETED
    assert run.completed + run.dead_lettered == 120
    attempts = plane.ledger.attempts(run_id)
    assert run.spent == sum(a.tokens for a in attempts) == plane.model.tokens_billed
    assert run.retries > 0  # 10% of attempts failed and were redelivered
    assert plane.model.throttles == 0  # the governor kept the fleet under the model quota
    event, detail = plane.events.published[-1]
    assert event == "run.completed" and detail["spent"] == run.spent
    assert plane.blobs.exists(result["results_key"])  # type: ignore[arg-type]


def test_exhaustion_then_resume_completes_the_exact_remainder() -> None:
    plane = Plane()
    run_id = plane.submit(50, budget=300_000)
    plane.run(run_id)
    status = plane.batches.status("acme", run_id, plane.clock.now())
    assert status["state"] == "exhausted"
    remainder = status["remainder"]
    assert len(remainder) == status["counts"]["remainder"] == 50 - status["counts"]["completed"]
    assert plane.events.published[-1][0] == "run.exhausted"
    remainder_file = plane.blobs.get_json(f"results/{run_id}/remainder-1.json")
    assert {item["unit_id"] for item in remainder_file} == set(remainder)
    completed_before = {
        u.unit_id for u in plane.ledger.units(run_id) if u.state is UnitState.COMPLETED
    }
    # When the tenant tops up and resumes
    resumed = plane.batches.resume("acme", run_id, 1_000_000, plane.clock.now())
    assert resumed["requeued"] == len(remainder)
    plane.run(run_id)
    run = plane.ledger.run(run_id)
    assert run.state is RunState.COMPLETED and run.completed == 50
    # no unit that had completed ran again
    for attempt in plane.ledger.attempts(run_id):
        if attempt.unit_id in completed_before:
            assert attempt.attempt == 0
    assert plane.events.published[-1][0] == "run.completed"


def test_a_resume_whose_manifest_is_gone_is_refused_before_the_top_up_commits() -> None:
    # Given an exhausted run whose manifest has expired (the bucket's lifecycle rule)
    plane = Plane()
    run_id = plane.submit(20, budget=100_000)
    plane.run(run_id)
    before = plane.ledger.run(run_id)
    assert before.state is RunState.EXHAUSTED
    del plane.blobs.objects[f"manifests/{run_id}/units.json"]

    # When the tenant tries to resume it
    with pytest.raises(Conflict, match="manifest has expired"):
        plane.batches.resume("acme", run_id, 1_000_000, plane.clock.now())

    # Then nothing was committed: the budget, the remainder and the state are as they were
    after = plane.ledger.run(run_id)
    assert (after.budget, after.remainder, after.state) == (
        before.budget,
        before.remainder,
        RunState.EXHAUSTED,
    )


def test_a_duplicate_delivery_settles_once() -> None:
    plane = Plane()
    run_id = plane.submit(3)
    plane.fan_out()
    first = plane.queue.receive()
    assert first is not None
    plane.worker.process(first)
    duplicate = plane.worker.process(first)  # SQS delivered the same message again
    assert duplicate.outcome == Ack("unit is completed")
    assert len([a for a in plane.ledger.attempts(run_id) if a.unit_id == first.unit_id]) == 1


def test_a_worker_dying_mid_unit_is_retried_and_its_tokens_counted() -> None:
    plane = Plane()
    run_id = plane.submit(2)
    plane.fan_out()
    item = plane.queue.receive()
    assert item is not None
    # the worker claims the attempt, calls the model (tokens billed), then dies before settling
    unit = plane.ledger.unit(run_id, item.unit_id)
    assert plane.ledger.claim(run_id, item.unit_id, 0, plane.clock.now(), 300).claimed
    # a redelivery before the lease expires finds the attempt busy and waits, without running it
    busy = plane.worker.process(item)
    assert isinstance(busy.outcome, Requeue) and "busy" in busy.outcome.reason
    plane.clock.t += 301  # SQS redelivers after the visibility timeout
    report = plane.worker.process(item)
    assert report.outcome == Ack("completed")
    assert report.lost_attempt_tokens == unit.projected_tokens
    attempts = [a for a in plane.ledger.attempts(run_id) if a.unit_id == item.unit_id]
    assert [(a.attempt, a.succeeded, a.reclaimed) for a in attempts] == [
        (0, False, True),
        (1, True, False),
    ]
    # the lost attempt counts its whole reservation; the retry what the model billed for it
    billed = plane.model.log(run_id)[-1].tokens
    assert 0 < billed <= unit.projected_tokens
    assert plane.ledger.unit(run_id, item.unit_id).spent == unit.projected_tokens + billed


def test_draining_refuses_submissions_and_workers_take_nothing_new() -> None:
    plane = Plane()
    run_id = plane.submit(5)
    plane.fan_out()
    plane.drain.set(True)
    with pytest.raises(Draining):
        plane.submit(1, key="another")
    item = plane.queue.receive()
    assert item is not None
    report = plane.worker.process(item)
    assert report.outcome == Requeue(30, "draining")
    assert plane.ledger.run(run_id).spent == 0
    plane.queue.send(item, 30)
    plane.drain.set(False)
    plane.pump()
    assert plane.ledger.run(run_id).state is RunState.COMPLETED


def test_deep_lanes_shed_with_retry_after_and_higher_lanes_shed_last() -> None:
    plane = Plane(shed_limits={Lane.HIGH: 1_000, Lane.NORMAL: 100, Lane.LOW: 20})
    plane.submit(60, lane=Lane.NORMAL)
    plane.fan_out()
    with pytest.raises(Shedding) as shed:
        plane.submit(5, lane=Lane.LOW, key="low")
    assert shed.value.shed.reason == "lane_depth" and shed.value.retry_after_s >= 1
    # 60 units x ~11k tokens at 9,500 tokens/s governed: about 70s of work ahead
    assert 60 <= shed.value.retry_after_s <= 90
    plane.submit(5, lane=Lane.HIGH, key="high")  # the high lane is still open


def test_the_lanes_messages_count_as_many_units_as_a_message_may_carry() -> None:
    # Given lanes whose messages may carry up to 5 units each (worker.bundle_units), and 12
    # messages queued on the normal lane
    plane = Plane(shed_limits={Lane.HIGH: 1_000, Lane.NORMAL: 50, Lane.LOW: 50})
    plane.submit(12, lane=Lane.NORMAL)
    plane.fan_out()
    plane.batches.config = replace(plane.batches.config, units_per_message=5)
    # Then a low-lane submission sees up to 60 units ahead, past its limit of 50
    with pytest.raises(Shedding) as shed:
        plane.submit(1, lane=Lane.LOW, key="low")
    assert shed.value.shed.reason == "lane_depth" and shed.value.shed.depth_ahead == 60
    # and counted one unit a message, the same lanes are under it
    plane.batches.config = replace(plane.batches.config, units_per_message=1)
    plane.submit(1, lane=Lane.LOW, key="low")


def test_a_quota_storm_slows_the_governor_and_sheds_lower_lanes() -> None:
    plane = Plane()
    run_id = plane.submit(40)
    plane.fan_out()
    plane.model.storm(quota_tpm=20_000, until=plane.clock.now() + 120)
    for _ in range(5):
        item = plane.queue.receive()
        assert item is not None
        report = plane.worker.process(item)
        if report.throttled:
            plane.queue.send(item, 30)
    fleet = plane.batches.fleet(plane.clock.now())
    assert fleet["governor"]["throttles"] >= 1
    assert fleet["governor"]["effective_rate_tps"] < fleet["governor"]["governed_rate_tps"]
    with pytest.raises(Shedding) as shed:
        plane.submit(3, key="during-storm")
    assert shed.value.shed.reason == "throttling"
    plane.pump()  # the storm passes; everything completes
    assert plane.ledger.run(run_id).state is RunState.COMPLETED


def test_idempotency_key_returns_the_same_batch_and_refuses_a_different_one() -> None:
    plane = Plane()
    first = plane.submit(4, key="k1")
    assert plane.submit(4, key="k1") == first
    assert len(plane.executions.started) == 1
    with pytest.raises(Conflict):
        plane.submit(5, key="k1")


def test_a_submit_records_an_opening_batch_its_open_step_opens_it_a_replay_is_the_same() -> None:
    # Given a submit whose execution has not run its open step yet
    plane = Plane()
    plane.executions.open_step = None
    run_id = plane.submit(60, key="k1")
    # Then the batch is shown, opening, with nothing written or admitted yet
    doc = plane.batches.status("acme", run_id, plane.clock.now())
    assert doc["state"] == "opening" and doc["units"] == 60 and doc["units_written"] == 0
    assert doc["counts"]["pending"] == 60
    with pytest.raises(NotFound):
        plane.ledger.run(run_id)  # no hot path sees it
    (payload,) = plane.executions.started.values()
    assert payload["open"] == {"spec_key": spec_key(run_id), "cursor": 0, "done": False}
    # and the spec object holds every unit (ids and projections), in submission order
    spec = plane.blobs.get_json(spec_key(run_id))
    assert [uid for uid, _ in spec["units"]] == [f"u{i:03d}" for i in range(60)]
    # and a replay (same key, same body) is the same batch, still opening; another body a 409
    assert plane.submit(60, key="k1") == run_id
    with pytest.raises(Conflict):
        plane.submit(61, key="k1")
    with pytest.raises(Conflict):
        plane.batches.resume("acme", run_id, 10, plane.clock.now())  # nothing to resume yet
    # When the open step runs a page of 25 (its Lambda ran out of time), the status shows it
    state = Opener(plane.ledger, plane.blobs, page_units=25).open(
        run_id, spec_key(run_id), 0, plane.clock.now()
    )
    assert state == {"cursor": 25, "done": False, "units": 60, "spec_key": spec_key(run_id)}
    doc = plane.batches.status("acme", run_id, plane.clock.now())
    assert doc["state"] == "opening" and doc["units_written"] == 25
    # Then the rest of the loop opens the run, and the batch runs to completion
    open_at_once(plane.ledger, plane.blobs)({"batch_id": run_id, "open": state})
    doc = plane.batches.status("acme", run_id, plane.clock.now())
    assert doc["state"] == "open" and "units_written" not in doc
    assert plane.run(run_id)["closed"]
    assert plane.ledger.run(run_id).completed == 60


def test_an_open_step_refuses_a_spec_object_of_another_batch() -> None:
    plane = Plane()
    plane.executions.open_step = None
    a, b = plane.submit(3, key="a"), plane.submit(4, key="b")
    with pytest.raises(Conflict, match="not the spec"):
        Opener(plane.ledger, plane.blobs).open(a, spec_key(b), 0, plane.clock.now())
    with pytest.raises(NotFound):
        plane.ledger.run(a)


def test_other_tenants_cannot_see_a_batch() -> None:
    plane = Plane()
    run_id = plane.submit(2)
    with pytest.raises(NotFound):
        plane.batches.status("someone-else", run_id, plane.clock.now())


def test_dead_letter_queue_ends_a_poison_unit() -> None:
    plane = Plane()
    run_id = plane.submit(1)
    plane.fan_out()
    item = plane.queue.receive()
    assert isinstance(item, QueuedUnit)
    assert dead_letter(plane.ledger, item, plane.clock.now()) is UnitState.DEAD_LETTERED
    assert plane.ledger.run(run_id).state is RunState.COMPLETED
    assert plane.ledger.run(run_id).dead_lettered == 1


def test_drain_controller_reports_when_it_is_safe_to_deploy() -> None:
    plane = Plane()
    controller = DrainController(plane.drain, MemoryMappings(), plane.queue, MemoryRunning())
    assert controller.apply(plane.clock.now())["mappings"] == {
        "high": "Enabled",
        "normal": "Enabled",
        "low": "Enabled",
    }
    plane.drain.set(True)
    report = controller.apply(plane.clock.now())
    assert set(report["mappings"].values()) == {"Disabled"}
    assert report["safe_to_deploy"]


def test_the_finalizer_sweeps_a_lost_claim_and_requeues_the_unit_with_its_input() -> None:
    plane = Plane()
    request = SubmitRequest(Lane.NORMAL, 10**8, 3, [UnitInput("only", 9_000, "the prompt")])
    run_id = plane.batches.submit("acme", request, None, plane.clock.now()).run.run_id
    plane.fan_out()
    item = plane.queue.receive()  # a worker takes it, claims the attempt, and dies; the
    assert item is not None  # message is gone too (an earlier duplicate delivery was acked)
    assert plane.ledger.claim(run_id, "only", 0, plane.clock.now(), 300).claimed
    assert not plane.finalizer.finalize(run_id, plane.clock.now())["closed"]
    assert plane.queue.receive() is None  # nothing to redeliver yet: the lease is live
    # the claim's lease ends; a redelivery would reclaim it now, but the message is gone: the
    # sweep finds it when its admission's lease (SQS's retention, here a day) ends
    plane.clock.t += 301
    plane.finalizer.finalize(run_id, plane.clock.now())
    assert plane.queue.receive() is None
    plane.clock.t += 86_400
    plane.finalizer.finalize(run_id, plane.clock.now())
    retry = plane.queue.receive()
    assert retry is not None and (retry.attempt, retry.input) == (1, "the prompt")
    assert plane.worker.process(retry).outcome == Ack("completed")
    result = plane.finalizer.finalize(run_id, plane.clock.now())
    # the lost attempt counts its reservation, the retry what the model billed
    billed = plane.model.log(run_id)[-1].tokens
    assert result["closed"] and plane.ledger.run(run_id).spent == 9_000 + billed


def test_the_finalize_loop_waits_and_the_settlement_that_closes_the_run_wakes_it() -> None:
    # Given a run whose units are fanned out, and its finalize loop's first poll
    plane = Plane()
    run_id = plane.submit(3)
    plane.fan_out()
    assert plane.finalizer.poll(run_id, plane.clock.now(), "token-1") is False
    assert plane.closures.tokens == {run_id: "token-1"}  # it waits, its token kept
    # When the workers run the units: the settlements that leave the run open wake no one
    for _ in range(2):
        item = plane.queue.receive()
        assert item is not None
        plane.worker.process(item)
        assert plane.closures.woken == []
    # Then the one that ends the last unit closes the run and hands the token back, once
    item = plane.queue.receive()
    assert item is not None
    plane.worker.process(item)
    assert plane.ledger.run(run_id).state is RunState.COMPLETED
    assert plane.closures.woken == [(run_id, "token-1")]
    # and the loop's next poll finds the run closed at once, keeping no token
    assert plane.finalizer.poll(run_id, plane.clock.now(), "token-2") is True
    assert plane.closures.tokens == {}
    assert plane.finalizer.finalize(run_id, plane.clock.now())["closed"] is True
    # a duplicate delivery of the last unit settles nothing and wakes no one again
    plane.worker.process(item)
    assert plane.closures.woken == [(run_id, "token-1")]


def test_a_run_closed_while_the_poll_kept_its_token_is_seen_by_that_poll() -> None:
    plane = Plane()
    run_id = plane.submit(1)
    plane.fan_out()
    received = plane.queue.receive()
    assert received is not None
    item: QueuedUnit = received

    class Racing(MemoryClosures):
        """The last unit's settlement lands between the token kept and the run read again:
        its worker found no token to hand back (it read before the poll kept one)."""

        def wait(self, run_id: str, token: str, now: float) -> None:
            plane.worker.closures = None  # that worker's wake finds no token
            plane.worker.process(item)
            super().wait(run_id, token, now)

    plane.finalizer.closures = Racing()
    assert plane.finalizer.poll(run_id, plane.clock.now(), "token-1") is True


def test_a_dead_letter_that_ends_the_last_unit_wakes_the_finalize_loop() -> None:
    plane = Plane()
    run_id = plane.submit(1)
    plane.fan_out()
    assert plane.finalizer.poll(run_id, plane.clock.now(), "token-1") is False
    item = plane.queue.receive()
    assert item is not None
    state = dead_letter(plane.ledger, item, plane.clock.now(), plane.closures)
    assert state is UnitState.DEAD_LETTERED
    assert plane.closures.woken == [(run_id, "token-1")]


def test_a_wake_that_fails_never_fails_the_unit() -> None:
    plane = Plane()
    run_id = plane.submit(1)
    plane.fan_out()

    class Down(MemoryClosures):
        def notify(self, run_id: str) -> bool:
            raise ConnectionError("Step Functions is unreachable")

    plane.worker.closures = Down()
    item = plane.queue.receive()
    assert item is not None
    assert plane.worker.process(item).outcome == Ack("completed")
    assert plane.ledger.run(run_id).state is RunState.COMPLETED  # the loop's timeout finds it
