"""The worker's governor part on in-memory ports: a unit refused by the governor goes back to
its lane until its tokens will really be there, with the tickets booked for it; it holds its
invocation no longer than it must; the governor is trued up after every model call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal

import pytest

from swarm.core.governor import Draw, GovernorConfig, Grant, Ticket, TrueUp
from swarm.core.lanes import QueuedUnit
from swarm.core.memory import InMemoryGovernor
from swarm.core.ports import ModelRequest, ModelResult, ModelThrottled, sqs_seconds
from swarm.core.records import Lane
from swarm.service.worker import Ack, Requeue, Worker, WorkerTimings
from tests.unit.test_service_flow import Plane

CONFIG = GovernorConfig(600_000, 0.95, initial_fill=1.0)


class BookingGovernor(InMemoryGovernor):
    """Books every fresh draw ``ahead_s`` in the future, as the DynamoDB governor does under a
    queue; grants a ticket presented when it is ready; notes true-ups."""

    def __init__(self, ahead_s: float, slot: bool = False) -> None:
        super().__init__(CONFIG)
        self.ahead_s = ahead_s
        self.slot = slot  # books places in a tenant's queue (a reserved lane) rather than tokens
        self.bookings = 0
        self.presented: list[Ticket | None] = []
        self.true_ups: list[tuple[Grant, int]] = []

    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        self.presented.append(ticket)
        if ticket is None:
            self.bookings += 1
            ready = now + self.ahead_s
            booked = Ticket(
                "g", 0, amount, lane, ready, Decimal(0), Decimal(0), now, slot=self.slot
            )
            return Draw(False, self.ahead_s, 0.0, ticket=booked)
        if now >= ticket.ready_at:
            return Draw(True, 0.0, 0.0, grant=ticket.grant())
        return Draw(False, ticket.ready_at - now, 0.0, ticket=ticket)

    def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        self.true_ups.append((grant, used))
        return TrueUp()


def worker(plane: Plane, governor: InMemoryGovernor, model: object = None) -> Worker:
    return Worker(
        plane.ledger,
        governor,
        model or plane.model,  # type: ignore[arg-type]
        plane.results,
        plane.drain,
        WorkerTimings(lease_s=300, max_wait_s=20),
        plane.clock.now,
        plane.clock.sleep,
    )


def one_unit(plane: Plane) -> QueuedUnit:
    plane.submit(1)
    plane.fan_out()
    item = plane.queue.receive()
    assert item is not None
    return item


def test_a_refused_unit_goes_back_until_its_booked_tokens_are_there_with_its_ticket() -> None:
    plane = Plane()
    gov = BookingGovernor(ahead_s=42.3)
    w = worker(plane, gov)
    item = one_unit(plane)
    start = plane.clock.now()
    # When the governor books the unit's tokens 42.3 s ahead
    report = w.process(item)
    # Then it did not hold its invocation for them, and goes back until they are there (SQS:
    # 43 whole seconds, never before) with the ticket, bound to its attempt
    assert plane.clock.now() == start
    outcome = report.outcome
    assert isinstance(outcome, Requeue) and outcome.delay_s == pytest.approx(42.3)
    assert sqs_seconds(outcome.delay_s) == 43
    assert outcome.ticket is not None and outcome.ticket.tag == "0"
    assert outcome.ticket.ready_at == start + 42.3
    # When it comes back with it, Then it is granted without a new booking, calls the model,
    # and the governor learns what the model counted
    plane.clock.t += outcome.delay_s
    back = w.process(replace(item, ticket=outcome.ticket))
    assert back.outcome == Ack("completed") and gov.bookings == 1
    assert gov.presented[-1] == outcome.ticket
    [(grant, used)] = gov.true_ups
    assert grant == outcome.ticket.grant() and used == back.tokens > 0


def test_a_worker_holds_on_only_for_tokens_due_within_its_hold() -> None:
    plane = Plane()
    gov = BookingGovernor(ahead_s=0.6)
    w = worker(plane, gov)
    item = one_unit(plane)
    report = w.process(item)  # due in 0.6 s, within the 1 s hold (max_wait_s is 20)
    assert report.outcome == Ack("completed") and 0.6 <= report.waited_s <= 1.0
    plane2 = Plane()
    gov2 = BookingGovernor(ahead_s=1.5)  # due beyond the hold: back to the lane, not held
    w2 = worker(plane2, gov2)
    before = plane2.clock.now()
    late = w2.process(one_unit(plane2))
    assert isinstance(late.outcome, Requeue) and late.outcome.delay_s == pytest.approx(1.5)
    assert plane2.clock.now() == before


def test_a_ticket_of_another_attempt_or_of_a_message_delivered_again_is_not_presented() -> None:
    plane = Plane()
    gov = BookingGovernor(ahead_s=5.0)
    w = worker(plane, gov)
    item = one_unit(plane)
    stale = Ticket("g", 0, 10_000, item.lane, 0.0, Decimal(0), Decimal(0), 0.0, tag="7")
    report = w.process(replace(item, ticket=stale))
    assert gov.presented == [None] and isinstance(report.outcome, Requeue)
    # a message SQS delivers again (a failed attempt's retry, a dead worker's unit) may carry
    # the ticket an earlier delivery spent: it is not presented; a place in a queue is (a place
    # is not tokens: drawing with it twice cannot grant more)
    own = replace(stale, tag=str(item.attempt))
    w.process(replace(item, ticket=own), first_delivery=False)
    assert gov.presented[-1] is None
    place = replace(own, slot=True)
    w.process(replace(item, ticket=place), first_delivery=False)
    assert gov.presented[-1] == place


def test_tokens_granted_to_a_unit_with_nothing_to_run_go_back() -> None:
    """The worker asks for tokens before it reads the unit (a refused try then costs no ledger
    read): a grant for a unit already settled, or held by another worker, is given back."""
    plane = Plane()
    gov = BookingGovernor(ahead_s=0.0)
    w = worker(plane, gov)
    item = one_unit(plane)
    first = w.process(item)
    assert first.outcome == Ack("completed")
    again = w.process(item)  # SQS delivered the same message again
    assert again.outcome == Ack("unit is completed")
    (_, used), (regrant, unused) = gov.true_ups
    assert used > 0 and (regrant.amount, unused) == (item.tokens, 0)


def test_a_spent_ticket_never_travels_and_a_draining_unit_keeps_its_own() -> None:
    plane = Plane()

    class Throttling:
        def invoke(self, request: ModelRequest) -> ModelResult:
            raise ModelThrottled("slow down")

    gov = BookingGovernor(ahead_s=0.0)
    w = worker(plane, gov, Throttling())
    item = one_unit(plane)
    ticket = Ticket("g", 0, item.tokens, item.lane, 0.0, Decimal(0), Decimal(0), 0.0, tag="0")
    throttled = w.process(replace(item, ticket=ticket))
    assert isinstance(throttled.outcome, Requeue) and throttled.outcome.ticket is None
    plane.drain.set(True)
    drained = w.process(replace(item, ticket=ticket))
    assert isinstance(drained.outcome, Requeue) and drained.outcome.ticket == ticket


def test_the_governor_is_trued_up_once_per_call_with_what_the_model_counted() -> None:
    plane = Plane()

    class Spy(InMemoryGovernor):
        def __init__(self) -> None:
            super().__init__(CONFIG)
            self.true_ups: list[tuple[Grant, int, TrueUp]] = []

        def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
            done = super().true_up(grant, used, now)
            self.true_ups.append((grant, used, done))
            return done

    gov = Spy()
    w = worker(plane, gov)
    item = one_unit(plane)
    report = w.process(item)
    assert report.outcome == Ack("completed")
    [(grant, used, done)] = gov.true_ups
    # the grant was the unit's projection; the true-up settles it with the billed count
    assert grant.amount == item.tokens and used == report.tokens
    assert done.refunded + done.dropped == max(0, item.tokens - used)
    assert done.debited == max(0, used - item.tokens)


class DeepQueue(InMemoryGovernor):
    """A unit deep in its tenant's queue, past the booking horizon: refused without a ticket,
    told how long its tokens take behind the queue."""

    def __init__(self, wait_s: float) -> None:
        super().__init__(CONFIG)
        self.wait_s = wait_s

    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        return Draw(False, self.wait_s, 0.0)


@pytest.mark.parametrize(("wait_s", "hide"), [(600.0, False), (900.0, False), (3_600.0, True)])
def test_a_unit_whose_tokens_are_further_than_sqs_delays_is_hidden_not_requeued(
    wait_s: float, hide: bool
) -> None:
    plane = Plane()
    report = worker(plane, DeepQueue(wait_s)).process(one_unit(plane))
    # back to its lane for as long as its tokens take; past SQS's 900 s delay, the message it
    # came in is hidden for that long instead (functions/worker.py), not copied every 15 min
    assert report.outcome == Requeue(wait_s, "governor: tokens not there yet", None, hide=hide)
    # a unit holding a token booking is never hidden (a message received again never presents
    # one: its tokens would go unused); one holding a place is (the place stays in the body)
    other = Plane()
    booked = worker(other, BookingGovernor(ahead_s=3_600.0)).process(one_unit(other))
    assert isinstance(booked.outcome, Requeue) and not booked.outcome.hide
    slotted = Plane()
    placed = worker(slotted, BookingGovernor(ahead_s=3_600.0, slot=True)).process(one_unit(slotted))
    assert isinstance(placed.outcome, Requeue) and placed.outcome.hide
    assert placed.outcome.ticket is not None and placed.outcome.ticket.slot


class TogetherBooker:
    """Books a call's units back to back, ``spacing_s`` apart, the first ready now."""

    def __init__(self, spacing_s: float, broken: bool = False) -> None:
        self.spacing_s = spacing_s
        self.broken = broken
        self.calls: list[tuple[list[int], Lane]] = []

    def book_tickets(self, amounts: Sequence[int], lane: Lane, now: float) -> list[Draw]:
        self.calls.append((list(amounts), lane))
        if self.broken:
            raise RuntimeError("DynamoDB is unreachable")
        draws = []
        for i, amount in enumerate(amounts):
            wait = i * self.spacing_s
            ticket = Ticket("g", 0, amount, lane, now + wait, Decimal(i), Decimal(0), now)
            draws.append(Draw(False, wait, 0.0, ticket=ticket))
        return draws


def received(plane: Plane, units: int) -> list[QueuedUnit]:
    plane.submit(units, lane=Lane.HIGH)
    plane.fan_out()
    items = []
    while (item := plane.queue.receive()) is not None:
        items.append(item)
    assert len(items) == units
    return items


def test_a_deliverys_units_are_booked_together_and_those_that_wait_go_back_back_to_back() -> None:
    plane = Plane()
    gov = BookingGovernor(ahead_s=600.0)  # a unit's own draw would wait 10 minutes
    booker = TogetherBooker(spacing_s=2.5)
    w = replace(worker(plane, gov), tickets=booker)
    # Given a delivery of three units on the high lane (two tenants'), one on another lane, and
    # one carrying a ticket
    items = received(plane, 5)
    carried = Ticket("g", 0, items[4].tokens, Lane.HIGH, 0.0, Decimal(9), Decimal(0), 0.0)
    items[1] = replace(items[1], tenant="other")
    items[3] = replace(items[3], lane=Lane.LOW)
    items[4] = replace(items[4], ticket=replace(carried, tag=str(items[4].attempt)))
    # When the worker books them together
    booked = w.book_together(items)
    # Then one booking covers the lane's three units, whatever their tenants (tokens are not
    # queued tenant by tenant); the lone unit of the other lane and the unit with a ticket are
    # left as they were
    assert booker.calls == [([i.tokens for i in items[:3]], Lane.HIGH)]
    assert booked[3:] == items[3:]
    for unit, before in zip(booked[:3], items[:3], strict=True):
        assert unit.ticket is not None and unit.ticket.tag == str(before.attempt)
    # and each runs with its ticket: the first at once, the others back to their lane with
    # theirs, due back to back, with no draw of their own
    reports = [w.process(unit) for unit in booked[:3]]
    assert isinstance(reports[0].outcome, Ack)
    requeued = [r.outcome for r in reports[1:]]
    assert all(isinstance(r, Requeue) for r in requeued)
    assert [r.delay_s for r in requeued] == [2.5, 5.0]  # type: ignore[union-attr]
    assert [r.ticket for r in requeued] == [u.ticket for u in booked[1:3]]  # type: ignore[union-attr]
    assert gov.bookings == 0


def test_nothing_is_booked_together_while_draining_or_when_the_booking_fails() -> None:
    plane = Plane()
    items = received(plane, 3)
    draining = TogetherBooker(spacing_s=2.5)
    plane.drain.set(True)
    assert (
        replace(worker(plane, BookingGovernor(1.0)), tickets=draining).book_together(items) == items
    )
    assert draining.calls == []
    plane.drain.set(False)
    broken = TogetherBooker(spacing_s=2.5, broken=True)
    assert (
        replace(worker(plane, BookingGovernor(1.0)), tickets=broken).book_together(items) == items
    )
    assert len(broken.calls) == 1
