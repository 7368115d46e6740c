"""The worker's loop for one queue message: drain check, admission, governor, claim, model, settle.

Outcomes map onto SQS (the handler does the mapping):

* :class:`Ack`: delete the message (the unit completed, was dead-lettered, joined the remainder,
  or this delivery is a duplicate of settled work).
* :class:`RetryLater`: report a batch item failure so SQS redelivers the message after
  ``after_s``; this is how a failed attempt is retried ("retries by redelivery").
* :class:`Requeue`: send a copy with ``DelaySeconds`` and delete the original. Used when the unit
  did not run for reasons that are not the unit's fault (draining, the governor's bounded wait
  ran out, the model plane throttled, another worker holds the attempt), so the receive count,
  and with it the DLQ's maxReceiveCount, only counts real attempts.

Exactly-once settlement: the ledger settles each ``(unit, attempt)`` once; a duplicate delivery
finds the attempt settled, claimed by a live worker (busy) or stale (its worker died: the lost
attempt is settled with its projected tokens, then the unit retries).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from swarm.core.governor import Ticket, acquire
from swarm.core.lanes import QueuedUnit
from swarm.core.ledger import Fate
from swarm.core.ports import (
    MAX_SQS_DELAY_S,
    DrainSwitch,
    Governor,
    Ledger,
    ModelPlane,
    ModelRequest,
    ModelThrottled,
    ResultStore,
)
from swarm.core.records import UnitState
from swarm.core.results import outcome_of


@dataclass(frozen=True)
class WorkerTimings:
    lease_s: float  # a claim's lease: the lanes' visibility timeout
    max_wait_s: float  # the governor's bounded wait before the unit goes back to its lane
    retry_backoff_s: float = 10.0  # a failed attempt is redelivered after this long
    requeue_delay_s: float = 30.0  # draining / throttled / busy: try again after this long
    # the longest the invocation holds on for tokens (and at most max_wait_s): a unit requeued
    # with its ticket comes back when its tokens are there, in whole seconds (SQS's delays), so
    # holding on longer only bills Lambda-seconds (docs/governor.md, "Waiting")
    max_hold_s: float = 1.0


@dataclass(frozen=True)
class Ack:
    reason: str


@dataclass(frozen=True)
class RetryLater:
    after_s: int
    reason: str


@dataclass(frozen=True)
class Requeue:
    delay_s: int
    reason: str
    # the governor booking the copy carries (tokens booked for this attempt); None: none, and a
    # ticket a grant spent never travels
    ticket: Ticket | None = None


Outcome = Ack | RetryLater | Requeue


@dataclass(frozen=True)
class WorkReport:
    """What happened, for the handler's metrics and logs."""

    outcome: Outcome
    attempt: int | None = None
    tokens: int = 0
    succeeded: bool | None = None
    fate: Fate | None = None
    waited_s: float = 0.0
    throttled: bool = False
    lost_attempt_tokens: int = 0  # tokens of a dead worker's attempt settled on its behalf


def requeue_delay(seconds: float) -> int:
    """A requeued unit's delay: whole seconds, within what SQS takes (1..MAX_SQS_DELAY_S)."""
    return int(min(MAX_SQS_DELAY_S, max(1, math.ceil(seconds))))


_delay = requeue_delay


@dataclass
class Worker:
    ledger: Ledger
    governor: Governor
    model: ModelPlane
    results: ResultStore
    drain: DrainSwitch
    config: WorkerTimings
    now: Callable[[], float]
    sleep: Callable[[float], None]

    def process(self, item: QueuedUnit) -> WorkReport:
        # cached for a few seconds: the handler refreshes it once per batch, so a fleet of
        # hundreds of workers does not read the parameter once per message
        if self.drain.draining():
            delay = _delay(self.config.requeue_delay_s)
            return WorkReport(Requeue(delay, "draining", ticket=item.ticket))
        lost_tokens = 0
        # Bring the unit to "in flight, unclaimed" (or find out there is nothing to do).
        for _ in range(4):
            unit = self.ledger.unit(item.run_id, item.unit_id)
            if unit.state.terminal:
                return WorkReport(
                    Ack(f"unit is {unit.state.value}"), lost_attempt_tokens=lost_tokens
                )
            res = unit.reservation
            if unit.state is UnitState.PENDING:
                admission = self.ledger.admit(
                    item.run_id, item.unit_id, unit.attempts, self.now(), self.config.lease_s
                )
                if not admission.admitted:
                    return WorkReport(Ack(f"not admitted: {admission.reason}"))
                continue
            assert res is not None
            if not res.claimed:
                break
            if res.lease_expires > self.now():
                wait = _delay(res.lease_expires - self.now())
                return WorkReport(Requeue(wait, "busy: another worker holds this attempt"))
            lost = self.ledger.reclaim_unit(item.run_id, item.unit_id, self.now())
            lost_tokens += lost.attempt.tokens if lost is not None else 0
        else:  # pragma: no cover - four transitions always reach a decision
            return WorkReport(Requeue(_delay(self.config.requeue_delay_s), "unsettled unit state"))

        attempt = res.attempt
        # tokens booked for this attempt on an earlier try come back with the unit (a ticket of
        # an earlier attempt was spent or abandoned with it)
        held = item.ticket if item.ticket is not None and item.ticket.tag == str(attempt) else None
        hold_s = min(self.config.max_wait_s, self.config.max_hold_s)
        got = acquire(
            self.governor,
            res.projected,
            item.lane,
            self.now,
            self.sleep,
            hold_s,
            ticket=held,
            tenant=item.tenant,
        )
        if not got.granted:
            # back to the lane until its tokens will really be there (the queue booked ahead
            # included), with the tokens booked for it
            ticket = None if got.ticket is None else replace(got.ticket, tag=str(attempt))
            return WorkReport(
                Requeue(_delay(got.retry_after_s), "governor: tokens not there yet", ticket),
                attempt=attempt,
                waited_s=got.waited_s,
                lost_attempt_tokens=lost_tokens,
            )
        assert got.grant is not None
        claim = self.ledger.claim(
            item.run_id, item.unit_id, attempt, self.now(), self.config.lease_s
        )
        if not claim.claimed:
            return WorkReport(
                Requeue(_delay(self.config.requeue_delay_s), f"claim refused: {claim.reason}"),
                attempt=attempt,
                waited_s=got.waited_s,
            )
        # the reservation caps what the attempt may bill: settlement can never exceed it
        request = ModelRequest(
            item.run_id, item.unit_id, attempt, res.projected, item.input, max_tokens=res.projected
        )
        try:
            result = self.model.invoke(request)
        except ModelThrottled:
            self.governor.report_throttle(self.now())
            self.ledger.unclaim(item.run_id, item.unit_id, attempt, self.now(), self.config.lease_s)
            return WorkReport(
                Requeue(_delay(self.config.requeue_delay_s), "model plane throttled"),
                attempt=attempt,
                waited_s=got.waited_s,
                throttled=True,
            )
        # the outcome is kept before the settlement that may complete the unit, so a completed
        # unit always has its output; a write refused as a second one changes nothing (the
        # first record of this attempt stands, see swarm/core/results.py)
        self.results.record(outcome_of(item.run_id, item.unit_id, attempt, result, self.now()))
        settlement = self.ledger.settle(
            item.run_id, item.unit_id, attempt, result.tokens, result.succeeded, self.now()
        )
        # the governor learns what the model really counted: unused tokens go back, an overrun
        # is drawn (after the books, so a failed debit cannot cost the settlement)
        self.governor.true_up(got.grant, result.tokens, self.now())
        outcome: Outcome
        if settlement.fate is Fate.RETRY:
            outcome = RetryLater(_delay(self.config.retry_backoff_s), "attempt failed: retry")
        else:
            outcome = Ack(settlement.fate.value)
        return WorkReport(
            outcome,
            attempt=attempt,
            tokens=0 if settlement.duplicate else result.tokens,
            succeeded=result.succeeded,
            fate=settlement.fate,
            waited_s=got.waited_s,
            lost_attempt_tokens=lost_tokens,
        )
