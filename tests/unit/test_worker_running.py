"""What the worker tells the register of running work, and how it reads the drain switch: once
per invocation, an entry before the first claim and none after the settlements, and a switch
SSM will not answer costs a unit the ordinary short delay."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from swarm.core.lanes import QueuedUnit
from swarm.core.memory import MemoryDrain, MemoryRunning
from swarm.core.ports import ModelRequest, ModelResult, RunningUnits
from swarm.service.worker import Ack, Requeue, Worker
from tests.unit.test_service_flow import Plane


@dataclass
class CountingDrain(MemoryDrain):
    """The switch, counting reads; ``failing``: every read fails (SSM throttling, nothing
    cached)."""

    reads: int = 0
    failing: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def draining(self, fresh: bool = False) -> bool:
        with self.lock:
            self.reads += 1
        if self.failing:
            raise RuntimeError("ThrottlingException: Rate exceeded")
        return self.on


@dataclass
class Watching:
    """A model that notes what the register says while each attempt runs."""

    model: object
    running: MemoryRunning
    now: object
    seen: list[RunningUnits] = field(default_factory=list)

    def invoke(self, request: ModelRequest) -> ModelResult:
        self.seen.append(self.running.running(self.now()))  # type: ignore[operator]
        return self.model.invoke(request)  # type: ignore[attr-defined, no-any-return]


def setup(units: int) -> tuple[Plane, Worker, MemoryRunning, CountingDrain, list[QueuedUnit]]:
    plane = Plane()
    plane.submit(units)
    plane.fan_out()
    items = []
    while (item := plane.queue.receive()) is not None:
        items.append(item)
    running, drain = MemoryRunning(), CountingDrain()
    worker = replace(plane.worker, running=running, drain=drain)
    return plane, worker, running, drain, items


def test_a_running_attempt_is_in_the_register_and_leaves_it_once_settled() -> None:
    plane, worker, running, _, items = setup(1)
    watching = Watching(plane.model, running, plane.clock.now)
    report = replace(worker, model=watching).process(items[0])
    assert isinstance(report.outcome, Ack)
    assert [r.by_run for r in watching.seen] == [{items[0].run_id: 1}]
    assert running.running(plane.clock.now()) == RunningUnits(0, 0, {})


def test_an_invocation_reads_the_switch_once_for_its_hundred_units_and_enters_once() -> None:
    plane, worker, running, drain, items = setup(100)
    entries: list[str] = []
    enter = running.enter

    def counted(invocation: str, *args: object) -> None:
        entries.append(invocation)
        enter(invocation, *args)  # type: ignore[arg-type]

    running.enter = counted  # type: ignore[method-assign, assignment]
    invocation = worker.begin(items)
    with ThreadPoolExecutor(100) as pool:
        reports = list(pool.map(lambda i: worker.process(i, invocation=invocation), items))
    worker.end(invocation)
    # (the bucket holds tokens for some of them: the others go back for their tokens)
    reasons = {r.outcome.reason for r in reports}
    assert "completed" in reasons and reasons <= {"completed", "governor: tokens not there yet"}
    # one read at the start, one (cached in a function: no request) before the entry
    assert drain.reads == 2 and entries == [invocation.id]
    assert running.running(plane.clock.now()).units == 0


def test_a_switch_ssm_will_not_answer_sends_the_units_back_for_the_short_delay() -> None:
    plane, worker, _, drain, items = setup(3)
    drain.failing = True
    invocation = worker.begin(items)
    assert invocation.draining is None
    reports = [worker.process(i, invocation=invocation) for i in items]
    for r in reports:
        assert isinstance(r.outcome, Requeue)
        assert r.outcome.delay_s == worker.config.requeue_delay_s < worker.config.lease_s
        assert r.outcome.reason == "drain switch unreadable"
    units = plane.ledger.units(items[0].run_id)
    assert all(u.reservation is not None and not u.reservation.claimed for u in units)


def test_a_switch_turned_on_before_the_entry_stops_every_claim() -> None:
    # the invocation read "off"; the switch is on by the time its first unit would claim: no
    # unit claims (it has not entered, so the drain view could not see it)
    plane, worker, running, drain, items = setup(2)
    invocation = worker.begin(items)
    drain.on = True
    reports = [worker.process(i, invocation=invocation) for i in items]
    assert [r.outcome.reason for r in reports] == ["draining", "draining"]
    assert running.entries == {}
    units = plane.ledger.units(items[0].run_id)
    assert all(u.reservation is not None and not u.reservation.claimed for u in units)


def test_an_entry_that_cannot_be_written_claims_nothing() -> None:
    plane, worker, running, _, items = setup(1)

    def broken(*args: object) -> None:
        raise RuntimeError("AccessDenied")

    running.enter = broken  # type: ignore[method-assign, assignment]
    report = worker.process(items[0])
    assert isinstance(report.outcome, Requeue)
    assert report.outcome.reason == "register of running work unwritable"
    assert not plane.ledger.units(items[0].run_id)[0].reservation.claimed  # type: ignore[union-attr]
