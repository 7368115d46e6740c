"""The worker function's handler (functions/worker.py): a batch's messages run at once, each
message's outcome on SQS is its own, and a dying sandbox fails the whole batch."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest

import functions.worker as worker_handler
from swarm.core.codec import bundle_body, message_body
from swarm.core.governor import Ticket
from swarm.core.lanes import Bundle, Bundling, QueuedUnit
from swarm.core.records import Lane
from swarm.local.events import LambdaContext, sqs_event
from swarm.service.worker import (
    Ack,
    Requeue,
    RetryLater,
    WorkerInvocation,
    WorkerTimings,
    WorkReport,
)

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
    config: WorkerTimings = field(default_factory=lambda: WorkerTimings(lease_s=60, max_wait_s=1))
    #: each book_together's units; the ticket it gives each of them (none: unchanged)
    booked: list[list[str]] = field(default_factory=list)
    tickets: dict[str, Ticket] = field(default_factory=dict)
    presented: dict[str, Ticket | None] = field(default_factory=dict)  # what process() got
    deadlines: list[float | None] = field(default_factory=list)  # each process()'s deadline

    #: each invocation begun and ended (the handler ends every one it begins)
    begun: list[WorkerInvocation] = field(default_factory=list)
    ended: list[WorkerInvocation] = field(default_factory=list)

    def begin(self, items: list[QueuedUnit]) -> WorkerInvocation:
        invocation = WorkerInvocation(f"inv-{len(self.begun)}", False, {"run-1": len(items)})
        self.begun.append(invocation)
        return invocation

    def end(self, invocation: WorkerInvocation) -> None:
        self.ended.append(invocation)

    def book_together(
        self, items: list[QueuedUnit], invocation: WorkerInvocation | None = None
    ) -> list[QueuedUnit]:
        self.booked.append([i.unit_id for i in items])
        return [replace(i, ticket=self.tickets.get(i.unit_id, i.ticket)) for i in items]

    def process(
        self,
        queued: QueuedUnit,
        first_delivery: bool = True,
        invocation: WorkerInvocation | None = None,
        deadline: float | None = None,
    ) -> WorkReport:
        self.seen.append(queued.unit_id)
        self.deadlines.append(deadline)
        self.first[queued.unit_id] = first_delivery
        self.presented[queued.unit_id] = queued.ticket
        if self.together is not None:
            self.together.wait()  # BrokenBarrierError if the messages run one after another
        outcome = self.outcomes[queued.unit_id]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


@dataclass
class FakeLanes:
    sends: list[list[tuple[str, float]]] = field(default_factory=list)  # each send's units
    bundles: list[list[Bundle]] = field(default_factory=list)  # each send's bundles
    visibility: list[tuple[str, float]] = field(default_factory=list)
    broken: bool = False

    def send_bundles(self, bundles: list[Bundle]) -> None:
        if self.broken:
            raise RuntimeError("SQS is unreachable")
        self.bundles.append(list(bundles))
        self.sends.append([(i.unit_id, b.delay_s) for b in bundles for i in b.units])

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


def run(
    monkeypatch: pytest.MonkeyPatch,
    worker: FakeWorker,
    lanes: FakeLanes,
    ev: Any,
    bundling: Bundling | None = None,
) -> Any:
    services = (worker, lanes, bundling or Bundling())
    monkeypatch.setattr(worker_handler, "_services", lambda: services)
    return worker_handler.handler(ev, LambdaContext("worker"))


def test_a_batchs_messages_run_at_once(monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes) -> None:
    units = [f"u{i}" for i in range(5)]
    worker = FakeWorker(
        {u: WorkReport(Ack("completed")) for u in units}, together=threading.Barrier(5, timeout=10)
    )
    assert run(monkeypatch, worker, lanes, event(*units)) == {"batchItemFailures": []}
    assert sorted(worker.seen) == units


def test_every_unit_is_given_the_invocations_end_less_its_margin_as_its_deadline(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # the local context says 300 s are left: an agent unit starts no turn past 290 s from now
    worker = FakeWorker({u: WorkReport(Ack("completed")) for u in ("a", "b")})
    before = time.time()
    run(monkeypatch, worker, lanes, event("a", "b"))
    left = 300.0 - worker_handler.END_MARGIN_S
    assert len(worker.deadlines) == 2
    assert all(d is not None and before + left <= d <= time.time() + left for d in worker.deadlines)


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


def test_an_invocation_is_begun_once_for_all_its_units_and_ended_whatever_they_did(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # the drain switch is read once (Worker.begin) and every unit acts on that reading; the
    # invocation leaves the register of running work (Worker.end) even when a unit raised
    worker = FakeWorker(
        {
            "done": WorkReport(Ack("completed")),
            "failed": WorkReport(RetryLater(10, "attempt failed: retry")),
            "broken": RuntimeError("the ledger could not be reached"),
        }
    )
    seen: list[object] = []
    process = worker.process

    def noting(
        queued: QueuedUnit,
        first_delivery: bool = True,
        invocation: object = None,
        deadline: float | None = None,
    ) -> Any:
        seen.append(invocation)
        return process(queued, first_delivery)

    monkeypatch.setattr(worker, "process", noting)
    run(monkeypatch, worker, lanes, event("done", "failed", "broken"))
    assert len(worker.begun) == 1 and worker.ended == worker.begun
    assert seen == [worker.begun[0]] * 3


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


def bundle_event(*bundles: tuple[str, list[QueuedUnit]], receives: str = "1") -> dict[str, Any]:
    """An SQS batch of bundles (message id, its units), each delivered ``receives`` times."""
    messages = [
        {"MessageId": mid, "ReceiptHandle": f"r-{mid}", "Body": bundle_body(units)}
        for mid, units in bundles
    ]
    ev = sqs_event(ARN, messages, "us-east-1")
    for record in ev["Records"]:
        record["attributes"]["ApproximateReceiveCount"] = receives
    return ev


def test_a_bundles_units_run_at_once_each_with_its_own_outcome(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # Given a bundle whose units end every way a unit can, beside a message of one unit
    worker = FakeWorker(
        {
            "done": WorkReport(Ack("completed")),
            "later": WorkReport(Requeue(7, "governor: tokens not there yet")),
            "failed": WorkReport(RetryLater(10, "attempt failed: retry")),
            "broken": RuntimeError("the ledger could not be reached"),
            "alone": WorkReport(Ack("completed")),
        },
        together=threading.Barrier(5, timeout=10),  # all five at once
    )
    names = ["done", "later", "failed", "broken"]
    ev = bundle_event(("b-1", [item(u) for u in names]), ("m-alone", [item("alone")]))
    # When the worker runs the batch
    response = run(monkeypatch, worker, lanes, ev)
    # Then both messages are deleted: each unit that must come back does so as a copy of its
    # own, delayed as its outcome says (a retry after its backoff, a requeue after its delay, a
    # unit that raised after its claim's lease), never by redelivering the bundle
    assert response == {"batchItemFailures": []}
    assert sorted(worker.seen) == sorted([*names, "alone"])
    assert sorted(sent(lanes)[0]) == [("broken", 60), ("failed", 10), ("later", 7)]
    assert lanes.visibility == []


def test_a_bundle_delivered_a_third_time_is_split_each_unit_alone(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # Given a bundle SQS delivers a third time (its invocations died, or it died once after it
    # was hidden), one unit carrying a token booking (which an invocation may have spent) and
    # one its place in a queue
    tokens = Ticket("g", 0, 10_000, Lane.NORMAL, 5.0, Decimal(1), Decimal(0), 1.0, tag="0")
    place = replace(tokens, slot=True)
    units = [replace(item("u0"), ticket=tokens), replace(item("u1"), ticket=place)]
    worker = FakeWorker({})
    # When the worker gets it (with bundling on: the split must not bundle them again)
    response = run(
        monkeypatch, worker, lanes, bundle_event(("b-1", units), receives="3"), Bundling(10, 5)
    )
    # Then nothing runs: each unit goes back alone, at once, the spent-able booking dropped and
    # the place kept, and the bundle is deleted
    assert worker.seen == []
    assert response == {"batchItemFailures": []}
    [bundles] = lanes.bundles
    assert [[u.unit_id for u in b.units] for b in bundles] == [["u0"], ["u1"]]
    assert [b.units[0].ticket for b in bundles] == [None, place]
    assert [b.delay_s for b in bundles] == [0.0, 0.0]


def test_copies_due_together_go_back_in_one_bundle_or_their_messages_are_redelivered(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # Given three messages whose units go back 3, 4 and 5 s later, and a 10 s bundling window
    later = {
        f"u{i}": WorkReport(Requeue(3 + i, "governor: tokens not there yet")) for i in range(3)
    }
    worker = FakeWorker(later)
    # When the worker runs them
    assert run(monkeypatch, worker, lanes, event(*later), Bundling(10, 5)) == {
        "batchItemFailures": []
    }
    # Then they go back as one message, delayed until the last is due
    [[bundle]] = lanes.bundles
    assert [u.unit_id for u in bundle.units] == ["u0", "u1", "u2"]
    assert 4 < bundle.delay_s <= 5
    # and when SQS cannot take it, each original is redelivered instead
    lanes.broken = True
    response = run(monkeypatch, worker, lanes, event(*later), Bundling(10, 5))
    assert sorted(f["itemIdentifier"] for f in response["batchItemFailures"]) == [
        "m-u0",
        "m-u1",
        "m-u2",
    ]


def test_a_bundle_whose_copies_cannot_be_sent_is_redelivered_whole(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    worker = FakeWorker(
        {"done": WorkReport(Ack("completed")), "later": WorkReport(Requeue(7, "throttled"))}
    )
    lanes.broken = True
    ev = bundle_event(("b-1", [item("done"), item("later")]))
    # the completed unit's settlement stands; its next delivery finds it completed
    assert run(monkeypatch, worker, lanes, ev) == {"batchItemFailures": [{"itemIdentifier": "b-1"}]}


def deep(delay_s: float) -> WorkReport:
    return WorkReport(Requeue(delay_s, "governor: tokens not there yet", hide=True))


def test_a_message_whose_units_wait_further_than_sqs_delays_is_hidden_until_the_last(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # Given a unit alone and a bundle whose units all wait an hour or more (deep in their
    # tenant's queue, past SQS's 900 s delay), one of the bundle's done already
    worker = FakeWorker(
        {
            "alone": deep(3_600),
            "a": deep(7_200),
            "b": deep(5_400),
            "c": WorkReport(Ack("completed")),
            "far": deep(100_000),
        }
    )
    ev = bundle_event(
        ("m-alone", [item("alone")]),
        ("b-1", [item("a"), item("b"), item("c")]),
        ("m-far", [item("far")]),
    )
    # When the worker runs them
    response = run(monkeypatch, worker, lanes, ev)
    # Then no copy is sent: each message is hidden in its lane until its last unit is due (at
    # most SQS's 12 hours, less a margin), and reported for SQS to keep
    assert lanes.sends == []
    longest = worker.config.longest_hide_s
    assert sorted(lanes.visibility) == sorted(
        [("r-m-alone", 3_600), ("r-b-1", 7_200), ("r-m-far", longest)]
    )
    assert longest < 43_200
    assert sorted(f["itemIdentifier"] for f in response["batchItemFailures"]) == [
        "b-1",
        "m-alone",
        "m-far",
    ]


def test_a_deep_message_received_again_or_mixed_goes_back_as_copies(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # a bundle whose units do not all wait long: copies (the short wait must come back soon)
    worker = FakeWorker({"a": deep(7_200), "b": WorkReport(Requeue(30, "draining"))})
    assert run(monkeypatch, worker, lanes, bundle_event(("b-1", [item("a"), item("b")]))) == {
        "batchItemFailures": []
    }
    assert lanes.visibility == [] and sorted(u for u, _ in sent(lanes)[0]) == ["a", "b"]
    # a message hidden once already (its second receive): a fresh copy, whose receive count
    # starts afresh, so waiting never brings it to the lanes' maxReceiveCount
    lanes.sends.clear()
    ev = event("again")
    ev["Records"][0]["attributes"]["ApproximateReceiveCount"] = "2"
    worker = FakeWorker({"again": deep(7_200)})
    assert run(monkeypatch, worker, lanes, ev) == {"batchItemFailures": []}
    assert lanes.visibility == [] and [u for u, _ in sent(lanes)[0]] == ["again"]


def test_the_units_of_first_deliveries_are_booked_together_and_run_with_their_tickets(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # Given a bundle and a message of one unit delivered for the first time, and a bundle
    # delivered again (its units may carry tickets an earlier delivery spent)
    high = [replace(item(u), lane=Lane.HIGH) for u in ("h0", "h1")]
    again = [item("a0"), item("a1")]
    ev = bundle_event(("b-new", high), ("m-one", [item("one")]))
    ev["Records"] += bundle_event(("b-again", again), receives="2")["Records"]
    booked = Ticket("g", 0, 10_000, Lane.HIGH, 5.0, Decimal(1), Decimal(0), 1.0, tag="0")
    units = ["h0", "h1", "one", "a0", "a1"]
    worker = FakeWorker({u: WorkReport(Ack("completed")) for u in units}, tickets={"h1": booked})
    # When the worker gets them
    assert run(monkeypatch, worker, lanes, ev) == {"batchItemFailures": []}
    # Then the first deliveries' units are booked in one call, and each unit runs with what
    # that booking gave it; the redelivered bundle's units draw on their own
    assert worker.booked == [["h0", "h1", "one"]]
    assert worker.presented == {"h0": None, "h1": booked, "one": None, "a0": None, "a1": None}
    assert worker.first == {"h0": True, "h1": True, "one": True, "a0": False, "a1": False}


def test_an_invocation_ends_its_mcp_sessions_whatever_its_units_did(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    # an MCP server's session lives for one invocation (swarm.adapters.mcp_tools): the handler
    # ends them once, after its units, even when one raised
    ended: list[int] = []

    class Sessions:
        def end_invocation(self) -> None:
            ended.append(len(worker.seen))

    worker = FakeWorker(
        {"done": WorkReport(Ack("completed")), "broken": RuntimeError("the ledger is away")}
    )
    worker.tools = Sessions()  # type: ignore[attr-defined]
    run(monkeypatch, worker, lanes, event("done", "broken"))
    assert ended == [2]


def test_a_unit_waiting_for_its_tools_goes_back_saying_since_when(
    monkeypatch: pytest.MonkeyPatch, lanes: FakeLanes
) -> None:
    """The copy carries ``tools_down_since`` (its wait is bounded by it); any other requeue
    carries none (a unit whose tools were listed starts its count afresh)."""
    down = Requeue(10, "tools unavailable: the MCP server 'm' is down", tools_down_since=42.0)
    worker = FakeWorker(
        {"u0": WorkReport(down), "u1": WorkReport(Requeue(3, "governor: tokens not there yet"))}
    )
    run(monkeypatch, worker, lanes, event("u0", "u1"))
    copies = {u.unit_id: u for bundles in lanes.bundles for b in bundles for u in b.units}
    assert copies["u0"].tools_down_since == 42.0
    assert copies["u1"].tools_down_since is None
