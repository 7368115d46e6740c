"""An agent unit's loop in the worker: model turns and tool calls, each turn governed, budgeted
and recorded, resumable by any worker from the unit's event log (docs/agents.md).

One delivery of an agent unit runs turns until the unit stops, its tokens are not there within
the bounded hold, the invocation's time left cannot fit another turn, or its run is no longer
open; then the attempt is handed back (``Ledger.unclaim``) and the unit goes back to its lane
with the delay, or it joins the remainder (``Ledger.pause``). The next delivery, on any worker,
reads the log and continues from its last recorded step (:func:`swarm.core.agent.next_step`).

The writes of a turn n (docs/agents.md, "The bill of a turn"):

1. the governor draw for turn n (the conversation's input so far plus its output bound);
2. one ledger write: the previous turn's tool results, its settlement (``Ledger.settle_turn``:
   its billed tokens from the run's reservation to its spent, once) and ``turn_started`` of
   turn n, all or nothing (for turn 1, ``turn_started`` alone);
3. the model call, then its answer recorded (``model_turn``, one conditional put) and the
   governor trued up to what the model counted;
4. the tools, in parallel (calls of tools that share state in the model's order), each with its
   idempotency key; their results are written with step 2 of the next turn.

So a model turn costs four requests of the control plane: the tool invocations apart.

At most once: a recorded answer is never asked again (the log's next step is never a call of a
recorded turn); a recorded tool result is never run again; a tool whose result was lost with
its worker is run again with the same key, which the shipped tools answer with the first result;
a turn started and never recorded is settled at its draw (it may have been billed); a turn is
settled once (the ledger's condition). Every append is conditional on the log's length: a worker
whose lease was taken over records nothing more (``Contended``) and gives up its delivery.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

from swarm.core import agent
from swarm.core.agent import (
    AgentSpec,
    AskApproval,
    AwaitApproval,
    CallModel,
    Event,
    Finished,
    RunTools,
    SettleTurn,
    Stop,
    ToolCall,
    ToolOutcome,
)
from swarm.core.agent_driver import KillPoint
from swarm.core.burndown import turn_quota
from swarm.core.errors import Contended, InvalidInput
from swarm.core.governor import Grant, Ticket, acquire
from swarm.core.lanes import QueuedUnit
from swarm.core.ledger import Fate
from swarm.core.ports import (
    ClaimedSettlement,
    ConverseCall,
    Governor,
    ModelThrottled,
    ToolsUnavailable,
    requeue_delay,
)
from swarm.core.pricing import Prices, Usage, priced
from swarm.core.records import RunState, UnitRecord
from swarm.core.results import AttemptOutcome
from swarm.core.routes import ModelRoute
from swarm.service.pages import keep_outcome, settle_claimed

if TYPE_CHECKING:
    from swarm.service.worker import Outcome, Worker, WorkerInvocation, WorkReport

log = logging.getLogger(__name__)

#: a tool result's content is kept (and sent back to the model) up to this many bytes of JSON;
#: beyond, its text is cut with a note (a DynamoDB item stops at 400 KB, a Converse request at
#: the model's context)
MAX_TOOL_RESULT_BYTES: Final = 64 * 1024
#: stop reasons whose unit completed (the others failed: the model refused, or cut its answer)
SUCCEEDED: Final = ("completed", "limit_turns", "limit_tokens")
#: the tool calls of every unit of a worker sandbox run on these threads
_tool_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="tool")


class KilledHere(BaseException):
    """A worker killed at a point of a turn (the local stack's fault injection): a
    BaseException, so it takes the whole sandbox down, as a crash does."""


def ticket_tag(attempt: int, turn: int) -> str:
    """The label of a governor booking made for turn ``turn`` of attempt ``attempt``: a later
    delivery presents it only for that same turn (whose draw is the same, decided on the same
    log)."""
    return f"{attempt}/t{turn}"


def cut(value: Any) -> Any:
    """A tool's value as recorded: its JSON up to :data:`MAX_TOOL_RESULT_BYTES`, else its text
    cut there with a note."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    data = text.encode()
    size = len(data)
    if size <= MAX_TOOL_RESULT_BYTES:
        return value
    kept = data[:MAX_TOOL_RESULT_BYTES].decode(errors="ignore")
    return f"{kept}\n[cut: the tool returned {size:,} bytes; {MAX_TOOL_RESULT_BYTES:,} kept]"


@dataclass(frozen=True)
class Wait:
    """Why the unit goes back to its lane, and for how long (a Requeue, once its turn is
    settled and its attempt handed back)."""

    delay_s: float
    why: str
    ticket: Ticket | None = None
    hide: bool = False


@dataclass
class AgentLoop:
    """One delivery of one agent unit, claimed by ``worker``."""

    worker: Worker
    item: QueuedUnit
    spec: AgentSpec
    unit: UnitRecord  # the unit as the last ledger write left it
    attempt: int
    #: the latest the invocation may start a turn (on the worker's clock); None: no limit
    deadline: float | None
    #: the governor booking this delivery carries, if any (presented for its own turn only)
    ticket: Ticket | None = None
    #: the unit's model and its governor (None: the worker's one model)
    route: ModelRoute | None = None
    log: list[Event] = field(default_factory=list)
    #: events decided and not written yet, written with the turn's settlement: the turn's tool
    #: results, or an answer that asks for no tool (nothing runs before its settlement)
    pending: list[Event] = field(default_factory=list)
    billed: int = 0  # tokens this delivery settled
    started: int = 0  # model turns this delivery started (it always starts one at least)
    waited_s: float = 0.0
    throttled: bool = False

    @property
    def _ledger(self) -> Any:
        return self.worker.ledger

    @property
    def _prices(self) -> Prices | None:
        """The unit's model's prices: each turn's usage is priced at them as it settles."""
        return self.worker.prices if self.route is None else self.route.prices

    @property
    def _governor(self) -> Governor:
        """The unit's model's governor: each turn draws from it and is trued up to it."""
        return self.worker.governor if self.route is None else self.route.governor

    def _now(self) -> float:
        return self.worker.now()

    def _kill(self, point: KillPoint, turn: int) -> None:
        hook = self.worker.kill
        if hook is not None and hook(self.item, point, turn):
            raise KilledHere(f"killed at {point.value} of turn {turn}")

    # -- the loop

    def run(self) -> WorkReport:
        self.log = self._ledger.read_log(self.item.run_id, self.item.unit_id)
        while True:
            view = [*self.log, *self.pending]
            step = agent.next_step(view, self.spec)
            if isinstance(step, Finished):
                return self._finish(step)
            if isinstance(step, AskApproval | AwaitApproval):
                return self._park(step)
            if isinstance(step, RunTools):
                self.pending += self._run_tools(step)
                self._kill(KillPoint.BEFORE_SETTLEMENT, step.turn)
                continue
            if isinstance(step, Stop):  # a resumed unit whose next turn cannot be called
                self._append([agent.stopped(step, self._now())])
                continue
            if isinstance(step, SettleTurn):
                outcome = self._settle(step, view)
                if outcome is not None:
                    return outcome
                continue
            # the first turn, or the next one after a wait: nothing to settle before it. A
            # delivery that continues a started loop (after a wait in its lane, or a hand-back)
            # reads the run first: a batch that stopped admitting meanwhile pauses the loop at
            # this turn boundary, uncalled (a turn settled mid-delivery learns it from its
            # settlement). An admitted loop's first turn runs, as an admitted unit's call does
            if self.log and not self._run_open():
                return self._pause()
            started = self._start(step)
            if isinstance(started, Wait):
                return self._back(started)
            self._append([agent.turn_started(step, self._now())])
            outcome = self._call(step, started)
            if outcome is not None:
                return outcome

    def _run_open(self) -> bool:
        """Whether the unit's run still admits (one read of its books)."""
        return bool(self._ledger.run(self.item.run_id).state is RunState.OPEN)

    def _settle(self, step: SettleTurn, view: list[Event]) -> WorkReport | None:
        """Settle turn ``step.turn`` with what it left unwritten (its tool results, or its
        answer), and start the next turn in the same write when its tokens are there (or record
        the unit's stop)."""
        settled = agent.turn_settled(step, self._now())
        after = agent.next_step([*view, settled], self.spec)
        events, self.pending = [*self.pending, settled], []
        call: CallModel | None = None
        grant: Grant | None = None
        wait: Wait | None = None
        if isinstance(after, Stop):
            events.append(agent.stopped(after, self._now()))
        elif isinstance(after, CallModel):
            started = self._start(after)
            if isinstance(started, Grant):
                call, grant = after, started
                events.append(agent.turn_started(after, self._now()))
            else:
                wait = started
        result = self._settle_turn(step.turn, step.billed, events, step.usage)
        if result is None:  # another worker moved the log: this delivery is superseded
            if grant is not None:
                self._governor.true_up(grant, 0, self._now())
            return self._superseded()
        if call is not None and grant is not None:
            if result.run_state is not RunState.OPEN:  # started, but the run stopped admitting
                paused = agent.SettleTurn(call.turn, 0, call.draw, lost=False, refused="paused")
                self._governor.true_up(grant, 0, self._now())
                if self._settle_turn(call.turn, 0, [agent.turn_settled(paused, self._now())]):
                    return self._pause()
                return self._superseded()
            return self._call(call, grant)
        if result.run_state is not RunState.OPEN and not isinstance(after, Stop):
            return self._pause()
        return None if wait is None else self._back(wait)  # handed back once the turn is settled

    def _settle_turn(
        self, turn: int, tokens: int, events: Sequence[Event], usage: Usage | None = None
    ) -> Any:
        """The ledger's settlement of ``turn`` with ``events`` appended in the same write; None
        when another worker settled it or moved the log (this one is a zombie). ``usage``: the
        model's, by kind, which the turn is priced by (None: ``tokens`` priced as output, the
        dearest kind: a turn lost at its draw)."""
        item = self.item
        seq = len(self.log)
        money = priced(Usage(output=tokens) if usage is None else usage, self._prices)
        try:
            result = self._ledger.settle_turn(
                item.run_id,
                item.unit_id,
                self.attempt,
                turn,
                tokens,
                self._now(),
                events=[(seq + i, e) for i, e in enumerate(events)],
                known=self.unit,
                priced=money,
            )
        except Contended:
            return None
        if not result.settled:
            return None
        self.log += events
        self.unit = result.unit
        self.billed += tokens
        return result

    def _start(self, step: CallModel) -> Grant | Wait:
        """The governor's grant for ``step``'s draw, or why and for how long the unit goes back
        to its lane instead (its tokens are not there within the bounded hold; the invocation's
        time cannot fit the turn): nothing is written here, the caller settles first."""
        w = self.worker
        late = self.deadline is not None and self._now() + w.config.turn_s > self.deadline
        if late and self.started:
            return Wait(requeue_delay(0), "the invocation's time left cannot fit a turn: continued")
        ticket = self.ticket
        tag = ticket_tag(self.attempt, step.turn)
        if ticket is not None and (ticket.tag != tag or ticket.amount != step.quota_draw):
            ticket = None
        self.ticket = None  # presented once
        hold_s = min(w.config.max_wait_s, w.config.max_hold_s)
        got = acquire(
            self._governor,
            step.quota_draw,  # quota tokens: the output bound at the model's burndown
            self.item.lane,
            w.now,
            w.sleep,
            hold_s,
            ticket=ticket,
            tenant=self.item.tenant,
        )
        self.waited_s += got.waited_s
        if got.granted:
            assert got.grant is not None
            self.started += 1
            return got.grant
        booked = None if got.ticket is None else replace(got.ticket, tag=tag)
        unspent = booked is None or booked.slot
        deep = unspent and got.retry_after_s > w.config.longest_delay_s
        return Wait(
            requeue_delay(got.retry_after_s), "governor: tokens not there yet", booked, deep
        )

    def _call(self, step: CallModel, grant: Grant) -> WorkReport | None:
        """Call the model for ``step`` (its ``turn_started`` is recorded), record the answer,
        true the governor up. None: go on; else the delivery's outcome."""
        w, item = self.worker, self.item
        self._kill(KillPoint.BEFORE_MODEL_CALL, step.turn)
        began = self._now()
        try:
            model_id = None if self.route is None else self.route.model_id
            response = w.model.converse(
                ConverseCall(item.run_id, item.unit_id, step.turn, step.request, model_id)
            )
            self._kill(KillPoint.AFTER_MODEL_CALL, step.turn)
            event = agent.model_turn(step.turn, response, self._now() - began, self._now())
        except ModelThrottled:
            # nothing billed: the turn is settled at 0 (not counted against max_turns) and the
            # unit waits in its lane; its next delivery calls the model again
            self._governor.report_throttle(self._now())
            self._governor.true_up(grant, 0, self._now())
            self.throttled = True
            refused = agent.throttled(step.turn, step.draw)
            if self._settle_turn(step.turn, 0, [agent.turn_settled(refused, self._now())]):
                return self._back(Wait(requeue_delay(w.config.requeue_delay_s), "model throttled"))
            return self._superseded()
        except KilledHere:
            raise
        except Exception as e:
            # the call failed after it was sent (a timeout, an error): it may have been billed,
            # so the turn is settled at its draw, and the next delivery calls again
            log.exception("model turn %d of %s failed", step.turn, item.unit_id)
            lost = agent.SettleTurn(step.turn, step.draw, step.draw, lost=True)
            self._governor.true_up(grant, step.quota_draw, self._now())  # as reserved
            if self._settle_turn(step.turn, step.draw, [agent.turn_settled(lost, self._now())]):
                why = f"model call failed ({type(e).__name__}): retried"
                return self._back(Wait(requeue_delay(w.config.retry_backoff_s), why))
            return self._superseded()
        try:
            if any("toolUse" in block for block in event["message"]["content"]):
                self._append([event])  # recorded before any of its tools runs
            else:  # nothing runs before the turn's settlement: written with it, one write less
                self.pending.append(event)
        finally:  # the governor learns what the model counted, recorded or not
            # quota tokens: input, cache writes, the output at the burndown (cache reads are
            # released at settlement, swarm.core.burndown)
            quota = turn_quota(event["usage"], step.output_burndown)
            self._governor.true_up(grant, quota, self._now())
        return None

    def _run_tools(self, step: RunTools) -> list[Event]:
        """The results of ``step``'s calls, in the model's order: calls of tools that share state
        one after another, in that order; the others in parallel; each within its timeout."""
        runner = self.worker.tools
        outcomes: dict[str, tuple[ToolOutcome, float]] = {}
        ordered = [
            c
            for c in step.calls
            if c.refused is None and runner is not None and runner.in_order(c.name)
        ]
        apart = [c for c in step.calls if c.refused is None and c not in ordered]
        futures: list[tuple[list[ToolCall], Future[list[tuple[ToolOutcome, float]]]]] = []
        for group in ([ordered] if ordered else []) + [[c] for c in apart]:
            futures.append((group, _tool_pool.submit(self._run_group, group)))
        for group, future in futures:
            limit = sum(self._timeout(c) for c in group) + 5.0
            try:
                done = future.result(timeout=limit)
            except FutureTimeout:
                done = [
                    (ToolOutcome("error", f"{c.name} did not answer within {limit:.0f} s"), limit)
                    for c in group
                ]
            for c, outcome in zip(group, done, strict=True):
                outcomes[c.tool_use_id] = outcome
        now = self._now()
        events = []
        for c in step.calls:
            result, latency = outcomes.get(c.tool_use_id, (ToolOutcome("error", c.refused), 0.0))
            if result.status != "success":  # the model acts on it; the operator sees it here
                log.warning(
                    "tool call %s (%s) of %s, turn %d: %s after %.1f s: %.300s",
                    c.tool_use_id,
                    c.name,
                    self.item.unit_id,
                    c.turn,
                    result.status,
                    latency,
                    result.value,
                )
            events.append(agent.tool_result(c, result.status, cut(result.value), latency, now))
        return events

    def _timeout(self, call: ToolCall) -> float:
        runner = self.worker.tools
        return runner.timeout_s(call.name) if runner is not None else 0.0

    def _run_group(self, calls: list[ToolCall]) -> list[tuple[ToolOutcome, float]]:
        out = []
        for call in calls:
            began = time.monotonic()
            out.append((self._run_one(call), time.monotonic() - began))
            self._kill(KillPoint.WHILE_TOOLS, call.turn)  # its effect done, its result unrecorded
        return out

    def _run_one(self, call: ToolCall) -> ToolOutcome:
        runner = self.worker.tools
        if runner is None:
            return ToolOutcome("error", f"this deployment runs no tools (asked for {call.name!r})")
        try:
            return runner.run(call, self.item.tenant)
        except Exception as e:  # a runner's own failure is a result the model can act on
            log.exception("tool %s failed", call.name)
            return ToolOutcome("error", f"{call.name} failed: {type(e).__name__}: {e}")

    def _append(self, events: Sequence[Event]) -> None:
        self._ledger.append_log(self.item.run_id, self.item.unit_id, len(self.log), events)
        self.log += events

    # -- the delivery's end

    def _report(self, outcome: Outcome, fate: Fate | None = None) -> WorkReport:
        from swarm.service.worker import WorkReport

        return WorkReport(
            outcome,
            attempt=self.attempt,
            tokens=self.billed,
            fate=fate,
            waited_s=self.waited_s,
            throttled=self.throttled,
        )

    def _back(self, wait: Wait) -> WorkReport:
        """Hand the attempt back (its reservation stays, for as long as the delay and a lease)
        and send the unit back to its lane after the wait's delay."""
        from swarm.service.worker import Requeue

        w, item = self.worker, self.item
        lease_s = wait.delay_s + w.config.lease_s
        w.ledger.unclaim(item.run_id, item.unit_id, self.attempt, self._now(), lease_s)
        return self._report(Requeue(wait.delay_s, wait.why, ticket=wait.ticket, hide=wait.hide))

    def _pause(self) -> WorkReport:
        """The run stopped admitting (its budget ran out): the unit stops at this turn boundary,
        its log kept, and joins the remainder; a top-up's resume continues it from the log."""
        from swarm.service.worker import Ack

        run = self._ledger.pause(self.item.run_id, self.item.unit_id, self.attempt, self._now())
        if run.state.closed:
            self.worker._closed(self.item.run_id)
        return self._report(Ack("paused: the batch's budget ran out; the unit joins the remainder"))

    def _park(self, step: AskApproval | AwaitApproval) -> WorkReport:
        """A gated tool call waits for a person's decision (docs/agents.md, "Human gates"): its
        ``approval_requested`` recorded and the unit parked in one write (``Ledger.park``: the
        reservation kept, unclaimed, its lease the approvals' timeout), the message deleted, no
        worker held; ``unit.awaiting_approval`` announced. Nothing of the turn ran: its calls
        run, in the model's order, once every gated one is decided."""
        from swarm.service.worker import Ack

        w, item = self.worker, self.item
        now = self._now()
        asked = list(step.calls) if isinstance(step, AskApproval) else []
        events = [*self.pending, *(agent.approval_requested(c, now) for c in asked)]
        seq = len(self.log)
        until = now + w.config.approval_timeout_s
        try:
            run = self._ledger.park(
                item.run_id,
                item.unit_id,
                self.attempt,
                now,
                until,
                events=[(seq + i, e) for i, e in enumerate(events)],
            )
        except Contended:
            return self._superseded()
        self.log += events
        self.pending = []
        if run.state.closed:  # the last unit of a drain: the drain does not wait for a person
            w._closed(item.run_id)
        if asked and w.events is not None:
            try:
                w.events.publish(
                    "unit.awaiting_approval",
                    {
                        "batch_id": item.run_id,
                        "unit_id": item.unit_id,
                        "tenant": item.tenant,
                        "calls": [
                            {"toolUseId": c.tool_use_id, "tool": c.name, "turn": c.turn}
                            for c in asked
                        ],
                        "requested_at": now,
                        "timeout_at": until,
                    },
                )
            except Exception:  # the park stands: GET /batches/{id}/approvals lists it
                log.exception("announcing unit.awaiting_approval of %s failed", item.unit_id)
        names = ", ".join(sorted({c.name for c in asked})) or "its tool calls"
        return self._report(Ack(f"parked: awaiting approval of {names}"))

    def _superseded(self) -> WorkReport:
        from swarm.service.worker import Ack

        return self._report(Ack("superseded: another worker continues this unit"))

    def _finish(self, step: Finished) -> WorkReport:
        """The log ends with ``stopped``: keep the unit's outcome and settle its attempt (once:
        a delivery after that finds it settled)."""
        from swarm.service.worker import Ack

        w, item = self.worker, self.item
        now = self._now()
        summary = agent.summary(self.log)
        usage = summary["usage"]
        succeeded = step.reason in SUCCEEDED
        outcome = AttemptOutcome(
            run_id=item.run_id,
            unit_id=item.unit_id,
            attempt=self.attempt,
            succeeded=succeeded,
            tokens=summary["billed"],
            output=step.answer if succeeded else "",
            error="" if succeeded else f"{step.reason}: {step.detail}",
            stop_reason=step.reason,
            input_tokens=usage["inputTokens"]
            + usage["cacheReadInputTokens"]
            + usage["cacheWriteInputTokens"],
            output_tokens=usage["outputTokens"],
            # the unit's model's id (a plane of one model: its own)
            model_id=str(
                (self.route.model_id if self.route is not None else None)
                or getattr(w.model, "model_id", "")
            ),
            recorded_at=now,
            agent=agent_summary(summary, step),
        )
        key = keep_outcome(w.results, outcome)
        # nothing beyond its settled turns (each priced at its own settlement): the attempt
        # records the prices of this one
        money = priced(Usage(), self._prices)
        fate = settle_claimed(
            w.ledger,
            ClaimedSettlement(
                self.unit, self.attempt, 0, succeeded, now, key, retry=False, priced=money
            ),
        )
        if fate is None:
            settlement = w.ledger.settle(
                item.run_id,
                item.unit_id,
                self.attempt,
                0,
                succeeded,
                now,
                key,
                retry=False,
                priced=money,
            )
            fate = settlement.fate
            if not settlement.duplicate and settlement.run.state.closed:
                w._closed(item.run_id)
        return self._report(Ack(fate.value), fate)


def agent_summary(figures: dict[str, Any], stop: Finished | Stop) -> dict[str, Any]:
    """What a unit's outcome (and a results page) carries of its loop, from its log's
    ``figures`` (:func:`swarm.core.agent.summary`): turns, tool calls and errors, the stop's
    reason and detail; the transcript itself is read apart."""
    return {
        "turns": figures["turns"],
        "lost_turns": figures["lost_turns"],
        "refused_turns": figures["refused_turns"],
        "tool_calls": figures["tool_calls"],
        "tool_errors": figures["tool_errors"],
        "usage": figures["usage"],
        "stop": stop.reason,
        "detail": stop.detail,
    }


def run_agent(
    worker: Worker,
    item: QueuedUnit,
    invocation: WorkerInvocation,
    deadline: float | None,
) -> WorkReport:
    """One delivery of the agent unit ``item`` (its input asks for a loop): enter the register
    of running work, claim the attempt (a loop's claim: a dead worker's is taken over), run its
    turns (:class:`AgentLoop`)."""
    from swarm.service.worker import Ack, Requeue, WorkReport

    delay = requeue_delay(worker.config.requeue_delay_s)
    unavailable = _tools_unavailable(worker, item)
    gone: str | None = None  # the tools stayed unlisted too long: the unit fails, named so
    if unavailable is not None:  # an MCP server that cannot list its tools: wait, uncalled
        since = item.tools_down_since if item.tools_down_since is not None else worker.now()
        waited = worker.now() - since
        if waited < worker.config.tools_wait_s:
            why = f"tools unavailable: {unavailable}"
            back = requeue_delay(worker.config.retry_backoff_s)
            return WorkReport(Requeue(back, why, tools_down_since=since))
        gone = f"its tools could not be listed for {waited:.0f} s: {unavailable}"
    refused = worker.enter(invocation)
    if refused is not None:
        return WorkReport(Requeue(delay, refused))
    ledger, now = worker.ledger, worker.now
    lease_s = worker.config.lease_s
    claim = ledger.claim_queued(item.run_id, item.unit_id, item.attempt, now(), lease_s, loop=True)
    if claim is None:
        ready = worker._ready(item, loop=True)
        if isinstance(ready, WorkReport):
            return ready
        queued, _ = ready
        claim = ledger.claim(item.run_id, item.unit_id, queued.attempt, now(), lease_s, loop=True)
    res = claim.unit.reservation
    if not claim.claimed or res is None:
        return WorkReport(Requeue(delay, f"claim refused: {claim.reason}"), attempt=item.attempt)
    if gone is not None:
        return _fail(worker, item, claim.unit, res.attempt, deadline, gone)
    registry = worker.tools.specs() if worker.tools is not None else {}
    try:
        route = worker.route(item)  # a model of another registry: it cannot run here
        # Bedrock's id (the simulated plane has none): a toolChoice the API took for another
        # model fails the unit here, uncalled, instead of failing each of its turns at Bedrock
        model_id = route.model_id or getattr(worker.model, "model_id", None)
        spec = agent.parse_agent_input(
            item.input,
            batch=item.run_id,
            unit=item.unit_id,
            projected_tokens=claim.unit.projected_tokens,
            registry=registry,
            model_id=model_id if isinstance(model_id, str) else None,
        )
    except InvalidInput as e:  # accepted by an API of another registry: it cannot run here
        detail = f"the unit cannot run on this deployment: {e}"
        return _fail(worker, item, claim.unit, res.attempt, deadline, detail)
    config = route.governor.config  # a turn larger than the lane can be granted stops the unit
    spec = replace(
        spec,
        max_draw=int(config.bucket_capacity - config.reserve(item.lane)),
        output_burndown=config.output_burndown,  # a turn draws quota tokens
    )
    loop = AgentLoop(
        worker, item, spec, claim.unit, res.attempt, deadline, ticket=item.ticket, route=route
    )
    try:
        return loop.run()
    except Contended:  # an append refused: another worker moved the log
        return WorkReport(Ack("superseded: another worker continues this unit"))


def _fail(
    worker: Worker,
    item: QueuedUnit,
    unit: UnitRecord,
    attempt: int,
    deadline: float | None,
    detail: str,
) -> WorkReport:
    """End the claimed loop ``failed``, not retried, with ``detail`` in its transcript (once:
    a delivery again finds it stopped)."""
    log.warning("agent unit %s cannot run: %s", item.unit_id, detail)
    failed = Stop("failed", detail, "")
    loop = AgentLoop(worker, item, _unrunnable(item), unit, attempt, deadline)
    loop.log = worker.ledger.read_log(item.run_id, item.unit_id)
    if not loop.log or loop.log[-1].get("type") != "stopped":
        loop._append([agent.stopped(failed, worker.now())])
    return loop._finish(Finished(failed.reason, failed.detail, ""))


def _tools_unavailable(worker: Worker, item: QueuedUnit) -> str | None:
    """Why the tools the unit names cannot be looked up now (a server whose tools are listed at
    first use is down), or None; looked up before the claim, so the unit waits unclaimed."""
    names = item.input.get("tools") if isinstance(item.input, dict) else None
    if worker.tools is None or not isinstance(names, list):
        return None
    specs = worker.tools.specs()
    try:
        for name in names:
            _ = isinstance(name, str) and name in specs
    except ToolsUnavailable as e:
        log.warning("agent unit %s waits: %s", item.unit_id, e)
        return str(e)
    return None


def _unrunnable(item: QueuedUnit) -> AgentSpec:
    return AgentSpec(item.run_id, item.unit_id, {"messages": []}, 1)


#: the kill hook of the local stack's fault injection: True to kill the worker at this point of
#: this turn of this unit
KillHook = Callable[[QueuedUnit, KillPoint, int], bool]
