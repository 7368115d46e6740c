"""The worker's loop for one queue message: drain check, governor, admission, claim, model, settle.

Tokens come first: under a queue most tries are refused by the governor, and such a try then
costs the governor's request alone (no ledger read); tokens granted to a unit that turns out to
have nothing to run (settled, held by another worker, refused admission) are given back. Then,
nearly always, the claim and the settlement are one write each and nothing is read
(``Ledger.claim_queued``, ``Ledger.settle_claimed``; docs/explanation/ledger.md).

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

import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

from swarm.core.agent import is_agent_input
from swarm.core.burndown import call_quota, unit_draw, unit_output_bound
from swarm.core.errors import InvalidInput
from swarm.core.governor import Ticket, acquire
from swarm.core.lanes import QueuedUnit
from swarm.core.ledger import Fate
from swarm.core.ports import (
    MAX_SQS_DELAY_S,
    MAX_SQS_VISIBILITY_S,
    ClaimedSettlement,
    Closures,
    DrainSwitch,
    Events,
    Governor,
    Ledger,
    ModelPlane,
    ModelRequest,
    ModelResult,
    ModelThrottled,
    ResultStore,
    RunningWork,
    TicketBooker,
    ToolRunner,
    requeue_delay,
)
from swarm.core.pricing import Prices, priced
from swarm.core.records import Lane, Reservation, UnitState
from swarm.core.results import outcome_of
from swarm.core.routes import ModelRoute, ModelRoutes
from swarm.service.agent_loop import KillHook, run_agent
from swarm.service.finalizer import wake
from swarm.service.pages import keep_outcome, settle_claimed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerTimings:
    lease_s: float  # a claim's lease: the lanes' visibility timeout
    max_wait_s: float  # the governor's bounded wait before the unit goes back to its lane
    retry_backoff_s: float = 10.0  # a failed attempt is redelivered after this long
    requeue_delay_s: float = 30.0  # draining / throttled / busy: try again after this long
    # the longest the invocation holds on for tokens (and at most max_wait_s): a unit requeued
    # with its ticket comes back when its tokens are there, in whole seconds (SQS's delays), so
    # holding on longer only bills Lambda-seconds (docs/explanation/governor.md, "Waiting")
    max_hold_s: float = 1.0
    # SQS's longest delay (900 s, on this clock): a unit whose tokens are further away than that
    # is hidden in its lane instead of requeued (Requeue.hide)
    longest_delay_s: float = float(MAX_SQS_DELAY_S)
    # the longest a message is hidden for (SQS's 12-hour visibility limit, counted from the
    # receive, less a margin for the time since it)
    longest_hide_s: float = float(MAX_SQS_VISIBILITY_S - 300)
    #: the longest an agent unit's model call and its turn's writes may take: a worker starts
    #: no turn (after its first) with less time left in its invocation (docs/agents.md, "The
    #: loop on the stack"; Wiring.turn_seconds)
    turn_s: float = 60.0
    #: how long a gated tool call waits for a person's decision before the sweeper rejects it
    #: (cdk.json ``approvals.timeout_hours``; docs/agents.md, "Human gates")
    approval_timeout_s: float = 24 * 3600.0
    #: how long an agent unit waits in its lane for its tools to be listed (an MCP server that
    #: is down) before it fails, named so in its transcript: a server gone for good does not
    #: keep a unit cycling through its lane forever (docs/agents.md, "MCP tools")
    tools_wait_s: float = 900.0


@dataclass(frozen=True)
class Ack:
    reason: str


@dataclass(frozen=True)
class RetryLater:
    after_s: float  # on the worker's clock (SQS rounds it up to its whole seconds)
    reason: str


@dataclass(frozen=True)
class Requeue:
    delay_s: float  # on the worker's clock (SQS rounds it up to its whole seconds)
    reason: str
    # the governor booking the copy carries (tokens booked for this attempt); None: none, and a
    # ticket a grant spent never travels
    ticket: Ticket | None = None
    #: its tokens (or its place in its tenant's queue) are further away than SQS delays a
    #: message (a unit deep in its tenant's queue): hide the message it came in for that long
    #: (a visibility timeout, up to 12 hours) rather than send a copy that would come back every
    #: 15 minutes until its turn (functions/worker.py)
    hide: bool = False
    #: the unit's tools could not be listed: since when (``QueuedUnit.tools_down_since``), which
    #: the copy carries
    tools_down_since: float | None = None


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


_delay = requeue_delay

#: reads of the drain switch an invocation makes when SSM fails it with nothing cached, with
#: a doubling pause from DRAIN_READ_PAUSE_S between; then its units go back for the ordinary
#: short delay (never a claim's lease)
DRAIN_READ_TRIES = 3
DRAIN_READ_PAUSE_S = 0.1


@dataclass
class WorkerInvocation:
    """One worker invocation: the drain switch as it read it once at its start (every unit
    thread acts on this value), and its entry in the register of running work, made by the
    first of its units about to claim (:meth:`Worker.enter`) and removed at its end
    (:meth:`Worker.end`)."""

    id: str
    #: the drain switch at the start; None: it could not be read (the units go back shortly)
    draining: bool | None
    #: the units it holds, by run (its entry's counts)
    runs: Mapping[str, int]
    entered: bool = False
    #: why no unit of it may claim (the switch turned on, or the entry could not be written)
    refused: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


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
    #: the run's closer wakes its finalize loop (None: nobody waits; tests)
    closures: Closures | None = None
    #: books the tokens of a batch's units together (None: each unit draws on its own)
    tickets: TicketBooker | None = None
    #: the register of running work each invocation enters before its first claim (None: no
    #: register; the simulator and some tests)
    running: RunningWork | None = None
    #: the deployment's tools, which agent units call (None: none are registered)
    tools: ToolRunner | None = None
    #: fault injection (the local stack): True to kill the worker at this point of a turn
    kill: KillHook | None = None
    #: the registry's models: a unit draws from its model's governor, calls its model and is
    #: priced at its model's prices (each route's governor books tickets: a TicketBooker).
    #: None: one model, ``governor`` and ``prices``
    models: ModelRoutes | None = None
    #: the one model's prices, without ``models``: each attempt's usage is priced at its
    #: settlement (None: unpriced)
    prices: Prices | None = None
    #: EventBridge: a parked agent unit announces ``unit.awaiting_approval`` (None: nobody)
    events: Events | None = None

    def route(self, item: QueuedUnit) -> ModelRoute:
        """The model ``item`` names (or the default), with its governor; InvalidInput when this
        deployment's registry has no such model."""
        if self.models is None:
            return ModelRoute("default", None, self.governor, self.prices)
        return self.models.of(item.input)

    def quota_draw(self, item: QueuedUnit, governor: Governor | None = None) -> int:
        """What a single-call unit draws from its model's governor, in quota tokens: its
        projection, its output bound counted at the model's burndown (exactly its tokens at
        burndown 1)."""
        config = (governor or self.route(item).governor).config
        return unit_draw(item.tokens, item.input, config.output_burndown)

    def begin(self, items: Sequence[QueuedUnit]) -> WorkerInvocation:
        """An invocation of ``items``: the drain switch read once for all of them (the switch
        is cached and read by one thread at a time, see SsmDrainSwitch; a read SSM fails with
        nothing cached is tried again briefly)."""
        draining: bool | None = None
        for attempt in range(DRAIN_READ_TRIES):
            if attempt:
                self.sleep(DRAIN_READ_PAUSE_S * 2 ** (attempt - 1))
            try:
                draining = self.drain.draining()
                break
            except Exception:
                log.warning("reading the drain switch failed (try %d)", attempt + 1, exc_info=True)
        runs: dict[str, int] = {}
        for item in items:
            runs[item.run_id] = runs.get(item.run_id, 0) + 1
        return WorkerInvocation(uuid.uuid4().hex, draining, runs)

    def enter(self, invocation: WorkerInvocation) -> str | None:
        """Before a unit's first claim: the invocation enters the register of running work,
        once (its other units wait for it), after checking the drain switch again (cached: no
        request while the value is younger than its lifetime). Once the drain view says the
        switch is settled, no invocation that has not entered can claim, so an empty register
        means nothing runs. None: go ahead; else why not (the unit goes back shortly)."""
        with invocation.lock:
            if invocation.entered or invocation.refused is not None:
                return invocation.refused
            try:
                if self.drain.draining():
                    invocation.refused = "draining"
                    return invocation.refused
            except Exception:
                log.warning("reading the drain switch failed", exc_info=True)
                invocation.refused = "drain switch unreadable"
                return invocation.refused
            if self.running is not None:
                try:
                    now = self.now()
                    expires = now + self.config.lease_s  # its claims' lease
                    self.running.enter(invocation.id, invocation.runs, expires, now)
                except Exception:
                    log.exception("entering the register of running work failed")
                    invocation.refused = "register of running work unwritable"
                    return invocation.refused
            invocation.entered = True
            return None

    def end(self, invocation: WorkerInvocation) -> None:
        """The invocation's settlements are written: it leaves the register (a failure is
        logged; its entry expires with its claims' lease)."""
        if not invocation.entered or self.running is None:
            return
        try:
            self.running.leave(invocation.id)
        except Exception:
            log.exception("leaving the register of running work failed: the entry expires")

    def book_together(
        self, items: Sequence[QueuedUnit], invocation: WorkerInvocation | None = None
    ) -> list[QueuedUnit]:
        """The units of one delivery (each message's first), with the tokens of those on a lane
        without a reserve booked together, a lane's at a time (:class:`TicketBooker`): each
        booked unit carries its ticket, ready now or back to back with the others', so those
        that must wait go back to their lane due together (a bundle) instead of each among the
        fleet's other bookings. Units that carry a ticket or a place already, a lane with one
        such unit, a drain (as ``invocation`` read the switch; None: read it now), or a booking
        that fails: unchanged (each unit draws on its own)."""
        out = list(items)
        booker = self.tickets
        if booker is None:
            return out
        lanes: dict[tuple[Lane, str], list[int]] = {}
        for index, item in enumerate(out):
            if item.ticket is None and not is_agent_input(item.input):  # agents draw per turn
                model = "" if self.models is None else self.models.name_of(item.input)
                lanes.setdefault((item.lane, model), []).append(index)
        for (lane, _), indexes in lanes.items():
            if len(indexes) < 2:
                continue
            try:
                draining = self.drain.draining() if invocation is None else invocation.draining
                if draining is not False:  # the units go back as they came (Worker.process)
                    break
                governor = self.route(out[indexes[0]]).governor  # their model's
                if self.models is not None:
                    booker = cast(TicketBooker, governor)
                amounts = [self.quota_draw(out[i], governor) for i in indexes]  # as process()
                draws = booker.book_tickets(amounts, lane, self.now())
            except Exception:  # as if never booked: each unit draws on its own
                log.exception("booking %d units' tokens on %s failed", len(indexes), lane)
                continue
            for i, draw in zip(indexes, draws, strict=True):
                if draw.ticket is not None:  # bound to the attempt, as process() books it
                    out[i] = replace(out[i], ticket=replace(draw.ticket, tag=str(out[i].attempt)))
        return out

    def process(
        self,
        item: QueuedUnit,
        first_delivery: bool = True,
        invocation: WorkerInvocation | None = None,
        deadline: float | None = None,
    ) -> WorkReport:
        """One unit of ``invocation`` (None: an invocation of this unit alone, begun and ended
        here). See :meth:`_process`. ``deadline``: the latest an agent unit may start a model
        turn, on this worker's clock (the invocation's end less a turn; None: no limit)."""
        if invocation is not None:
            return self._process(item, first_delivery, invocation, deadline)
        alone = self.begin([item])
        try:
            return self._process(item, first_delivery, alone, deadline)
        finally:
            self.end(alone)

    def _process(
        self,
        item: QueuedUnit,
        first_delivery: bool,
        invocation: WorkerInvocation,
        deadline: float | None = None,
    ) -> WorkReport:
        """``first_delivery``: SQS delivers this copy of the message for the first time (its
        receive count is 1). A copy delivered again may carry a ticket an earlier delivery
        spent (a failed attempt is retried by redelivering the same message), so only a first
        delivery's ticket is presented, and only one booked for the message's attempt; a place
        in a queue is never spent, and is presented on any delivery."""
        ticket = item.ticket
        if ticket is not None and (
            ticket.tag != str(item.attempt) or not (first_delivery or ticket.slot)
        ):
            ticket = None
        # read once per invocation (Worker.begin), so a fleet of hundreds of workers does not
        # read the parameter once per message
        if invocation.draining is not False:
            delay = _delay(self.config.requeue_delay_s)
            why = "draining" if invocation.draining else "drain switch unreadable"
            return WorkReport(Requeue(delay, why, ticket=ticket))
        if is_agent_input(item.input):  # a loop of turns, each drawing its own tokens
            return run_agent(self, item, invocation, deadline)
        unknown: InvalidInput | None = None
        try:
            route = self.route(item)
        except InvalidInput as e:  # accepted under another registry: its attempts fail unbilled
            route, unknown = ModelRoute("default", None, self.governor, None), e
        governor = route.governor
        # Tokens first: under a queue most tries are refused (the unit goes back until its
        # tokens are there), and such a try then costs the governor's request alone, no ledger
        # read. The message names the tokens (the unit's projection, which its reservation
        # holds); what the ledger then finds (a settled unit, another worker's claim, a refused
        # admission) gives them back.
        hold_s = min(self.config.max_wait_s, self.config.max_hold_s)
        got = acquire(
            governor,
            self.quota_draw(item, governor),  # quota tokens: the output at the model's burndown
            item.lane,
            self.now,
            self.sleep,
            hold_s,
            ticket=ticket,
            tenant=item.tenant,
        )
        if not got.granted:
            # back to the lane until its tokens will really be there (the queue booked ahead
            # included), with the tokens (or the place) booked for it
            booked = None if got.ticket is None else replace(got.ticket, tag=str(item.attempt))
            # a place (a slot) stays in the message's body, so the message may wait hidden; a
            # token booking may not (a message received again never presents one)
            unspent = booked is None or booked.slot
            deep = unspent and got.retry_after_s > self.config.longest_delay_s
            return WorkReport(
                Requeue(
                    _delay(got.retry_after_s), "governor: tokens not there yet", booked, hide=deep
                ),
                attempt=item.attempt,
                waited_s=got.waited_s,
            )
        assert got.grant is not None
        grant = got.grant
        refused = self.enter(invocation)  # before the first claim: running work is counted
        if refused is not None:
            governor.true_up(grant, 0, self.now())  # nothing runs: tokens go back
            delay = _delay(self.config.requeue_delay_s)
            return WorkReport(Requeue(delay, refused), waited_s=got.waited_s)
        lease_s, lost_tokens = self.config.lease_s, 0
        # nearly always the unit waits in flight for the message's attempt: claim it with one
        # conditional write; anything else (a retry to admit, a duplicate, a dead worker's
        # claim) is read and decided
        claim = self.ledger.claim_queued(
            item.run_id, item.unit_id, item.attempt, self.now(), lease_s
        )
        if claim is None:
            ready = self._ready(item)
            if isinstance(ready, WorkReport):
                governor.true_up(grant, 0, self.now())  # nothing to run: tokens go back
                return replace(ready, waited_s=got.waited_s)
            queued, lost_tokens = ready
            claim = self.ledger.claim(
                item.run_id, item.unit_id, queued.attempt, self.now(), lease_s
            )
        res = claim.unit.reservation
        if not claim.claimed or res is None:
            governor.true_up(grant, 0, self.now())
            return WorkReport(
                Requeue(_delay(self.config.requeue_delay_s), f"claim refused: {claim.reason}"),
                attempt=item.attempt,
                waited_s=got.waited_s,
                lost_attempt_tokens=lost_tokens,
            )
        attempt = res.attempt
        # the reservation caps what the attempt may bill: settlement can never exceed it (a
        # reservation in micro-dollars holds the unit's projected tokens' cost: those tokens)
        cap = item.tokens if res.usd else res.projected
        request = ModelRequest(
            item.run_id,
            item.unit_id,
            attempt,
            cap,
            item.input,
            max_tokens=cap,
            model_id=route.model_id,
        )
        try:
            if unknown is not None:
                result = ModelResult(False, 0, error=f"InvalidInput: {unknown}")
            else:
                result = self.model.invoke(request)
        except ModelThrottled:
            governor.report_throttle(self.now())
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
        # (with the batch's other outcomes, in one object: swarm.service.pages)
        key = keep_outcome(
            self.results, outcome_of(item.run_id, item.unit_id, attempt, result, self.now())
        )
        # from the unit the claim wrote, one write (with the invocation's other units': swarm.
        # service.pages); if anything changed it since (or this is the run's last unit, or the
        # run is exhausting), read and decide
        # its usage priced at the prices of this settlement (a deploy's new prices apply to the
        # attempts settled after it)
        money = priced(result.usage(), route.prices)
        fate = settle_claimed(
            self.ledger,
            ClaimedSettlement(
                claim.unit, attempt, result.tokens, result.succeeded, self.now(), key, priced=money
            ),
        )
        duplicate = False
        if fate is None:
            settlement = self.ledger.settle(
                item.run_id,
                item.unit_id,
                attempt,
                result.tokens,
                result.succeeded,
                self.now(),
                key,
                priced=money,
            )
            fate, duplicate = settlement.fate, settlement.duplicate
            # the write that closes a run is settle()'s (settle_claimed never ends a run)
            if not duplicate and settlement.run.state.closed:
                self._closed(item.run_id)
        # the governor learns what the model really counted (quota tokens: the output at the
        # model's burndown): unused tokens go back, an overrun is drawn (after the books, so a
        # failed debit cannot cost the settlement)
        governor.true_up(grant, self._quota_used(item, result, governor), self.now())
        outcome: Outcome
        if fate is Fate.RETRY:
            outcome = RetryLater(_delay(self.config.retry_backoff_s), "attempt failed: retry")
        else:
            outcome = Ack(fate.value)
        return WorkReport(
            outcome,
            attempt=attempt,
            tokens=0 if duplicate else result.tokens,
            succeeded=result.succeeded,
            fate=fate,
            waited_s=got.waited_s,
            lost_attempt_tokens=lost_tokens,
        )

    def _quota_used(self, item: QueuedUnit, result: ModelResult, governor: Governor) -> int:
        """The quota tokens ``result`` counted (its billed tokens at burndown 1)."""
        burndown = governor.config.output_burndown
        if burndown == 1:
            return result.tokens
        return call_quota(
            result.tokens,
            result.input_tokens,
            result.output_tokens,
            unit_output_bound(item.tokens, item.input),
            burndown,
        )

    def _closed(self, run_id: str) -> None:
        """This worker's write closed the run: wake its finalize loop."""
        if self.closures is not None:
            wake(self.closures, run_id)

    def _ready(self, item: QueuedUnit, loop: bool = False) -> tuple[Reservation, int] | WorkReport:
        """Bring the unit to "in flight, unclaimed" for its attempt (admitting a retry, settling
        a dead worker's attempt: its tokens are the int), or report why nothing is to be run.
        ``loop``: an agent unit, whose dead worker's claim is taken over, never settled as lost
        (its log tells what that worker did)."""
        lost_tokens = 0
        for _ in range(4):
            unit = self.ledger.unit(item.run_id, item.unit_id)
            if unit.state.terminal or unit.state is UnitState.AWAITING_APPROVAL:
                # parked: a person's decision sends it back to its lane
                return WorkReport(
                    Ack(f"unit is {unit.state.value}"), lost_attempt_tokens=lost_tokens
                )
            res = unit.reservation
            if unit.state is UnitState.PENDING:
                admission = self.ledger.admit(
                    item.run_id, item.unit_id, unit.attempts, self.now(), self.config.lease_s
                )
                if not admission.admitted:
                    if admission.run.state.closed:  # the refusal ended an exhausting run
                        self._closed(item.run_id)
                    return WorkReport(Ack(f"not admitted: {admission.reason}"))
                continue
            assert res is not None
            if not res.claimed:
                return res, lost_tokens
            if res.lease_expires > self.now():
                wait = _delay(res.lease_expires - self.now())
                return WorkReport(Requeue(wait, "busy: another worker holds this attempt"))
            if loop or res.loop:  # the claim takes it over
                return res, lost_tokens
            lost = self.ledger.reclaim_unit(item.run_id, item.unit_id, self.now())
            lost_tokens += lost.attempt.tokens if lost is not None else 0
        return WorkReport(  # pragma: no cover - four transitions always reach a decision
            Requeue(_delay(self.config.requeue_delay_s), "unsettled unit state")
        )
