"""The worker function's handler (functions/worker.py): a batch's messages run at once, each
message's outcome on SQS is its own, and a dying sandbox fails the whole batch."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

import functions.worker as worker_handler
from swarm.core.codec import message_body
from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane
from swarm.local.events import LambdaContext, sqs_event
from swarm.service.worker import Ack, Requeue, RetryLater, WorkReport

ARN = "arn:aws:sqs:us-east-1:123456789012:lane-normal"


def item(unit_id: str) -> QueuedUnit:
    return QueuedUnit("run-1", unit_id, "acme", Lane.NORMAL, 0, 10_000, input=unit_id)


def event(*unit_ids: str) -> dict[str, Any]:
    messages = [
        {"MessageId": f"m-{u}", "ReceiptHandle": f"r-{u}", "Body": message_body(item(u))}
        for u in unit_ids
    ]
    return sqs_event(ARN, messages, "us-east-1")


class Crash(BaseException):
    """The sandbox going down (the local stack's simulated worker death is one)."""


@dataclass
class FakeWorker:
    """Each unit's scripted outcome: a report, or an exception to raise."""

    outcomes: dict[str, WorkReport | BaseException]
    #: every message waits here until this many are in process at once (None: no wait)
    together: threading.Barrier | None = None
    seen: list[str] = field(default_factory=list)
    first: dict[str, bool] = field(default_factory=dict)  # each unit's first_delivery

    def process(self, queued: QueuedUnit, first_delivery: bool = True) -> WorkReport:
        self.seen.append(queued.unit_id)
        self.first[queued.unit_id] = first_delivery
        if self.together is not None:
            self.together.wait()  # BrokenBarrierError if the messages run one after another
        outcome = self.outcomes[queued.unit_id]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


@dataclass
class FakeLanes:
    sends: list[list[tuple[str, float]]] = field(default_factory=list)  # each send_many's
    visibility: list[tuple[str, float]] = field(default_factory=list)
    broken: bool = False

    def send_many(self, items: list[QueuedUnit], delays_s: list[float]) -> None:
        if self.broken:
            raise RuntimeError("SQS is unreachable")
        self.sends.append([(i.unit_id, d) for i, d in zip(items, delays_s, strict=True)])

    def change_visibility(self, lane: Lane, receipt_handle: str, after_s: float) -> None:
        self.visibility.append((receipt_handle, after_s))


def sent(lanes: FakeLanes) -> list[list[tuple[str, float]]]:
    """Each send_many's units and delays, the delays as asked: what is left of a delay is sent,
    the time since the unit's decision cut down (a few milliseconds here)."""
    for batch in lanes.sends:
        assert all(delay >= 0 for _, delay in batch)
    return [[(unit, math.ceil(delay)) for unit, delay in batch] for batch in lanes.sends]


@pytest.fixture
def lanes(monkeypatch: pytest.MonkeyPatch) -> FakeLanes:
    fake = FakeLanes()
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    monkeypatch.setattr(worker_handler.metrics, "namespace", "Swarm")
    return fake


def run(monkeypatch: pytest.MonkeyPatch, worker: FakeWorker, lanes: FakeLanes, ev: Any) -> Any:
    monkeypatch.setattr(worker_handler, "_services", lambda: (worker, lanes))
    return worker_handler.handler(ev, LambdaContext("worker"))


def test_a_batchs_messages_run_at_once(monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes) -> None:
    units = [f"u{i}" for i in range(5)]
    worker = FakeWorker(
        {u: WorkReport(Ack("completed")) for u in units}, together=threading.Barrier(5, timeout=10)
    )
    assert run(monkeypatch, worker, lanes, event(*units)) == {"batchItemFailures": []}
    assert sorted(worker.seen) == units


def test_each_message_has_its_own_outcome_on_sqs(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    worker = FakeWorker(
        {
            "done": WorkReport(Ack("completed")),
            "later": WorkReport(Requeue(7, "governor: tokens not there yet")),
            "failed": WorkReport(RetryLater(10, "attempt failed: retry")),
            "broken": RuntimeError("the ledger could not be reached"),
        }
    )
    response = run(monkeypatch, worker, lanes, event("done", "later", "failed", "broken"))
    # a failed attempt and an unexpected error are redelivered; the others are deleted
    assert response == {
        "batchItemFailures": [{"itemIdentifier": "m-failed"}, {"itemIdentifier": "m-broken"}]
    }
    # a fresh copy of the requeued unit, delayed by what is left of its delay
    assert sent(lanes) == [[("later", 7)]]
    assert lanes.visibility == [("r-failed", 10)]  # redelivered after its backoff


def test_a_dying_sandbox_fails_the_whole_batch_after_every_message_has_stopped(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    worker = FakeWorker({"u0": WorkReport(Ack("completed")), "u1": Crash("killed")})
    with pytest.raises(Crash):
        run(monkeypatch, worker, lanes, event("u0", "u1"))
    assert sorted(worker.seen) == ["u0", "u1"]


def test_more_records_than_sqs_delivers_are_refused(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    units = [f"u{i}" for i in range(worker_handler.MAX_BATCH + 1)]
    worker = FakeWorker({u: WorkReport(Ack("completed")) for u in units})
    with pytest.raises(ValueError, match="at most 10"):
        run(monkeypatch, worker, lanes, event(*units))
    assert worker.seen == []


def test_the_units_to_requeue_go_back_together_and_are_redelivered_if_sqs_fails(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    later = {
        f"u{i}": WorkReport(Requeue(3 + i, "governor: tokens not there yet")) for i in range(3)
    }
    worker = FakeWorker({**later, "done": WorkReport(Ack("completed"))})
    assert run(monkeypatch, worker, lanes, event("u0", "done", "u1", "u2")) == {
        "batchItemFailures": []
    }
    assert sent(lanes) == [[("u0", 3), ("u1", 4), ("u2", 5)]]  # one SendMessageBatch
    # the copies could not be sent: their originals are redelivered, the completed one is not
    lanes.broken = True
    response = run(monkeypatch, worker, lanes, event("u0", "done", "u1"))
    assert response == {
        "batchItemFailures": [{"itemIdentifier": "m-u0"}, {"itemIdentifier": "m-u1"}]
    }


def test_a_message_delivered_again_is_processed_as_such(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    """A copy SQS delivers again may carry a ticket an earlier delivery spent: the worker is
    told (swarm.service.worker.Worker.process presents only a first delivery's ticket)."""
    ev = event("new", "again")
    ev["Records"][0]["attributes"]["ApproximateReceiveCount"] = "1"
    ev["Records"][1]["attributes"]["ApproximateReceiveCount"] = "2"
    worker = FakeWorker({u: WorkReport(Ack("completed")) for u in ("new", "again")})
    run(monkeypatch, worker, lanes, ev)
    assert worker.first == {"new": True, "again": False}
