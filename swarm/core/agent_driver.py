"""An in-memory driver of the agent loop (:mod:`swarm.core.agent`): it runs a unit's steps
against a Converse-shaped model and a tool executor, appending to a log store and settling each
turn in a book of turns, and can be killed at each point of a turn and resumed from the log.

It is the reference the Lambda worker will follow (it is not wired into it yet:
docs/agents.md, "Status"), and what the unit tests drive with crashes injected:

* every event is appended on a condition, that the log still has the length the step was
  decided on (:meth:`LogStore.append`, :class:`~swarm.core.errors.Contended` otherwise): a
  worker that decided on an old log (a zombie whose lease expired) records nothing;
* ``turn_started`` is recorded before the model is called, so a call made but never recorded
  is known, and settled at what was drawn for it (the next worker's step);
* each tool runs with its idempotency key (``batch/unit/toolUseId``): a tool that honours it
  (the BFCL backends here, the shipped write tools later) has no second effect when a crash
  between its effect and the record of its result makes the next worker run the call again;
* a turn is settled in the books under (batch, unit, turn), once: a crash between the books and
  the log's ``turn_settled`` makes the next worker settle again, which the books answer as a
  duplicate without billing twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from swarm.core import agent
from swarm.core.agent import AgentSpec, Event, ToolCall, ToolOutcome
from swarm.core.clock import Clock
from swarm.core.errors import Contended, SwarmError
from swarm.core.ports import ModelThrottled

#: a Converse-shaped model: a request in, a Converse response out (output.message, stopReason,
#: usage)
ConverseModel = Callable[[dict[str, Any]], Mapping[str, Any]]


class ToolExecutor(Protocol):
    def __call__(self, call: ToolCall) -> ToolOutcome:
        """Run ``call`` at most once per ``call.key``: a second call with the same key answers
        the first outcome and has no second effect."""
        ...


class LogStore(Protocol):
    def read(self, key: str) -> list[Event]: ...

    def append(self, key: str, seq: int, event: Event) -> None:
        """Append ``event`` as the log's event ``seq``, only if the log holds ``seq`` events:
        Contended otherwise (another worker moved it), and nothing written."""
        ...


class TurnBooks(Protocol):
    def settle_turn(self, batch: str, unit: str, turn: int, tokens: int) -> bool:
        """Bill turn ``turn`` of the unit ``tokens``, once: False (and nothing billed) if it was
        settled before."""
        ...


class KillPoint(StrEnum):
    """Where a worker can die in a turn (the driver asks its ``kill`` hook at each)."""

    BEFORE_MODEL_CALL = "before_model_call"  # turn_started recorded, model not called
    AFTER_MODEL_CALL = "after_model_call"  # the model answered; the answer not recorded
    WHILE_TOOLS = "while_tools"  # the answer recorded; a tool ran, its result not recorded
    BEFORE_SETTLEMENT = "before_settlement"  # every result recorded; the turn not settled
    AFTER_BOOKS = "after_books"  # the books settled the turn; turn_settled not recorded


class Killed(SwarmError):
    """The worker died here (injected)."""

    def __init__(self, point: KillPoint, turn: int) -> None:
        super().__init__(f"killed at {point.value} of turn {turn}")
        self.point = point
        self.turn = turn


#: the kill hook: True to die at this point of this turn
KillHook = Callable[[KillPoint, int], bool]


def never(point: KillPoint, turn: int) -> bool:
    return False


@dataclass
class MemoryLogStore:
    """Event logs in memory, each event kept as its JSON text (so a log holds only what a
    durable store can, and reads back as one would), appended on the length condition (as a
    DynamoDB conditional put on the event's sequence number, or an S3 conditional write,
    would)."""

    logs: dict[str, list[str]] = field(default_factory=dict)

    def read(self, key: str) -> list[Event]:
        return [json.loads(event) for event in self.logs.get(key, [])]

    def append(self, key: str, seq: int, event: Event) -> None:
        log = self.logs.setdefault(key, [])
        if len(log) != seq:
            raise Contended(f"log {key!r} holds {len(log)} events, not {seq}: another worker")
        log.append(json.dumps(event, allow_nan=False))


@dataclass
class MemoryTurnBooks:
    """Each turn's billed tokens, settled once; repeats are counted, not billed."""

    billed: dict[tuple[str, str, int], int] = field(default_factory=dict)
    duplicates: int = 0

    def settle_turn(self, batch: str, unit: str, turn: int, tokens: int) -> bool:
        key = (batch, unit, turn)
        if key in self.billed:
            self.duplicates += 1
            return False
        self.billed[key] = tokens
        return True

    def spent(self, batch: str, unit: str) -> int:
        return sum(t for (b, u, _), t in self.billed.items() if (b, u) == (batch, unit))


def log_key(spec: AgentSpec) -> str:
    return f"{spec.batch}/{spec.unit}"


@dataclass
class LoopRunner:
    """One worker running one unit's loop."""

    spec: AgentSpec
    store: LogStore
    model: ConverseModel
    tools: ToolExecutor
    books: TurnBooks
    clock: Clock
    kill: KillHook = never
    #: the log and the step this worker last decided on (what a zombie of it would carry out)
    decided: tuple[list[Event], agent.Step] | None = None

    def run(self, max_steps: int = 10_000) -> agent.Finished:
        """Run the unit until it has stopped (Killed if the hook says so; Contended if another
        worker moves its log under it; ModelThrottled, once recorded, when the model plane
        refused a call for quota: the caller runs the unit again later)."""
        for _ in range(max_steps):
            log = self.store.read(log_key(self.spec))
            step = agent.next_step(log, self.spec)
            if isinstance(step, agent.Finished):
                return step
            self.decided = (log, step)
            self.advance(log, step)
        raise SwarmError(f"unit {self.spec.unit}: no end after {max_steps} steps")

    def advance(self, log: Sequence[Event], step: agent.Step) -> None:
        """Carry out ``step``, decided on ``log`` (each append conditional on its length)."""
        key, seq = log_key(self.spec), len(log)
        if isinstance(step, agent.CallModel):
            self.store.append(key, seq, agent.turn_started(step, self.clock.now()))
            self._die(KillPoint.BEFORE_MODEL_CALL, step.turn)
            began = self.clock.now()
            try:
                response = self.model(step.request)
            except ModelThrottled:  # nothing billed: settle the turn at 0, the caller waits
                settle = agent.throttled(step.turn, step.draw)
                self.books.settle_turn(self.spec.batch, self.spec.unit, step.turn, 0)
                self.store.append(key, seq + 1, agent.turn_settled(settle, self.clock.now()))
                raise
            self._die(KillPoint.AFTER_MODEL_CALL, step.turn)
            ended = self.clock.now()
            self.store.append(
                key, seq + 1, agent.model_turn(step.turn, response, ended - began, ended)
            )
        elif isinstance(step, agent.RunTools):
            # in toolUse order, one at a time: a unit's tools may share state (BFCL's backends)
            for call in step.calls:
                began = self.clock.now()
                if call.refused is not None:
                    outcome = ToolOutcome("error", call.refused)
                else:
                    outcome = self._run_tool(call)
                    self._die(KillPoint.WHILE_TOOLS, step.turn)
                ended = self.clock.now()
                event = agent.tool_result(call, outcome.status, outcome.value, ended - began, ended)
                self.store.append(key, seq, event)
                seq += 1
        elif isinstance(step, agent.SettleTurn):
            self._die(KillPoint.BEFORE_SETTLEMENT, step.turn)
            self.books.settle_turn(self.spec.batch, self.spec.unit, step.turn, step.billed)
            self._die(KillPoint.AFTER_BOOKS, step.turn)
            self.store.append(key, seq, agent.turn_settled(step, self.clock.now()))
        elif isinstance(step, agent.Stop):
            self.store.append(key, seq, agent.stopped(step, self.clock.now()))

    def _run_tool(self, call: ToolCall) -> ToolOutcome:
        try:
            return self.tools(call)
        except Killed:
            raise
        except Exception as e:  # a tool's failure is a result the model can act on
            return ToolOutcome("error", f"{call.name} failed: {type(e).__name__}: {e}")

    def _die(self, point: KillPoint, turn: int) -> None:
        if self.kill(point, turn):
            raise Killed(point, turn)
