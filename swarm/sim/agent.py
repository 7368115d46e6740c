"""Agent units on the virtual clock: each unit a loop of model turns (``swarm sim run --turns``).

The same governor and ledger as :mod:`swarm.sim.engine`, turn by turn
(:class:`swarm.sim.workload.TurnModel` has the growth model):

- a free worker takes the next unit of the lane; a unit starting an attempt is admitted by the
  ledger first (its reservation is its cap, ``projected_tokens``; the first refusal starts
  exhaustion and empties the queue, as in :class:`swarm.sim.engine.Simulation`);
- before each turn the worker checks the turn's draw against what is left of the unit's cap
  (the turns billed so far, lost ones included): a turn that does not fit is not called and the
  unit stops ``limit_tokens`` (settled as done: a retry would stop the same way);
- it draws the turn's tokens from the governor; a refusal whose wait fits in what is left of
  the bounded hold keeps the worker waiting, else the unit goes back to its lane with the
  delay (no worker held) and keeps its place in the loop and its reservation;
- the model call holds the worker for the turn's model time; then the turn is lost (a failure,
  deterministic per unit, attempt and turn: billed at its draw, the attempt fails and its
  retry calls the turn again) or trued up to its bill; the turn's tool calls then hold the
  worker for their latency (a Lambda worker waits for its tools);
- after its last turn the unit completes; each attempt settles in the ledger at the sum of its
  turns' bills, so the run's spent is the sum of every turn's billed tokens.

Unlike the one-call simulator there is no head-of-line blocking (every worker waits at the
governor for its own unit, as on the stack); the policy orders the fan-out and places retries.
Requeued units come back at the back of the lane. Kill and resume are not modelled here.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swarm.core.clock import VirtualClock
from swarm.core.errors import InvalidInput
from swarm.core.governor import Grant, ticks_until
from swarm.core.ledger import Fate, remainder_of
from swarm.core.memory import InMemoryGovernor, InMemoryLedger
from swarm.core.records import Lane, RunRecord, RunSpec, RunState, UnitSpec
from swarm.core.scheduling import fanout_order
from swarm.sim.workload import Turn, Workload

if TYPE_CHECKING:
    from swarm.sim.engine import FleetConfig

RUN_ID = "sim-run"
TENANT = "sim"


@dataclass(frozen=True)
class TurnRecord:
    """One model turn as it was billed."""

    unit_id: str
    attempt: int
    turn: int
    drawn: int
    billed: int
    lost: bool


@dataclass(frozen=True)
class AgentStats:
    """What an agent run did, turn by turn."""

    turns: tuple[TurnRecord, ...]
    turns_per_unit: tuple[int, ...]  # model turns each unit made (lost ones included)
    limit_tokens: int  # units stopped because their next turn did not fit their cap
    requeues: int  # turns sent back to the lane because the bounded hold could not cover them
    held_waiting_s: int  # worker seconds spent waiting for the governor within the hold
    elapsed: int

    @property
    def model_turns(self) -> int:
        return len(self.turns)

    @property
    def lost_turns(self) -> int:
        return sum(1 for t in self.turns if t.lost)

    @property
    def billed(self) -> int:
        return sum(t.billed for t in self.turns)

    @property
    def tokens_per_turn(self) -> float:
        return self.billed / self.model_turns if self.turns else 0.0

    @property
    def turns_per_minute(self) -> float:
        return self.model_turns * 60 / self.elapsed if self.elapsed else 0.0

    def doc(self) -> dict[str, Any]:
        per_unit = self.turns_per_unit
        return {
            "model_turns": self.model_turns,
            "lost_turns": self.lost_turns,
            "turns_per_unit": {
                "mean": round(statistics.fmean(per_unit), 3) if per_unit else 0,
                "min": min(per_unit, default=0),
                "max": max(per_unit, default=0),
            },
            "turns_per_minute": round(self.turns_per_minute, 3),
            "tokens_per_turn": round(self.tokens_per_turn, 1),
            "billed_by_turns": self.billed,
            "limit_tokens": self.limit_tokens,
            "requeues": self.requeues,
            "held_waiting_s": self.held_waiting_s,
        }

    def line(self) -> str:
        per_unit = self.turns_per_unit
        mean = statistics.fmean(per_unit) if per_unit else 0.0
        return (
            f"model turns {self.model_turns:,} ({mean:.1f} per unit, "
            f"{min(per_unit, default=0)}-{max(per_unit, default=0)}; {self.lost_turns} lost) | "
            f"{self.turns_per_minute:,.1f} turns/min | {self.tokens_per_turn:,.0f} tokens per "
            f"turn | limit_tokens {self.limit_tokens} | requeued between turns "
            f"{self.requeues} | {self.held_waiting_s:,} worker-s held waiting for tokens"
        )


@dataclass
class _Loop:
    """A unit's place in its loop (what its event log would say)."""

    index: int
    plan: tuple[Turn, ...]
    cap: int
    next_turn: int = 0
    billed: int = 0  # every turn of every attempt: what the cap is checked against
    attempt: int = 0
    admitted: bool = False  # this attempt holds a reservation
    attempt_billed: int = 0
    turns_made: int = 0


@dataclass
class _Job:
    """What a busy worker is doing until ``until``."""

    until: int
    seq: int
    unit_id: str
    phase: str  # "model", "tools", "hold"
    grant: Grant | None = None
    held: int = 0  # seconds this worker has waited at the governor for the coming turn


@dataclass
class AgentSimulation:
    workload: Workload
    workers: int
    clock: VirtualClock = field(default_factory=VirtualClock)
    ledger: InMemoryLedger = field(default_factory=InMemoryLedger)
    governor: InMemoryGovernor | None = None
    retries_first: bool = True
    loops: dict[str, _Loop] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    delayed: list[tuple[int, int, str]] = field(default_factory=list)  # (ready at, seq, unit)
    jobs: list[_Job] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    limit_tokens: int = 0
    requeues: int = 0
    held_waiting_s: int = 0
    _seq: int = 0

    @classmethod
    def fresh(cls, workload: Workload, fleet: FleetConfig) -> AgentSimulation:
        check_agent_units(workload, fleet)
        sim = cls(
            workload,
            fleet.workers,
            governor=InMemoryGovernor(fleet.governor, 0.0),
            retries_first=fleet.schedule.retries_first,
        )
        spec = RunSpec(
            RUN_ID, TENANT, Lane.NORMAL, fleet.budget, workload.specs(), fleet.max_attempts
        )
        sim.ledger.open_run(spec, sim.clock.now())
        for index in range(workload.units):
            unit_id = workload.unit_id(index)
            sim.loops[unit_id] = _Loop(index, workload.turn_plan(index), workload.tokens(index))
        for unit in fanout_order(spec.units, _projected, fleet.schedule):
            sim.ready.append(unit.unit_id)
        return sim

    @property
    def run(self) -> RunRecord:
        return self.ledger.run(RUN_ID)

    def run_until(self, horizon_s: int) -> tuple[int, bool]:
        """Run to the end; returns (elapsed, whether the horizon stopped it)."""
        t = 1  # the fleet's first second, as in the one-call simulator
        while not self.run.state.closed:
            if t > horizon_s:
                return t, True
            self.clock.advance_to(t)
            self._step(t)
            if self.run.state.closed:
                break
            candidates = [j.until for j in self.jobs] + [d[0] for d in self.delayed]
            if not candidates:
                raise RuntimeError(f"simulation stalled at {t}s with the run {self.run.state}")
            t = min(candidates)
        closed = self.run.closed_at
        return int(closed if closed is not None else t), False

    def stats(self, elapsed: int) -> AgentStats:
        return AgentStats(
            turns=tuple(self.turns),
            turns_per_unit=tuple(loop.turns_made for loop in self.loops.values()),
            limit_tokens=self.limit_tokens,
            requeues=self.requeues,
            held_waiting_s=self.held_waiting_s,
            elapsed=elapsed,
        )

    def remainder(self) -> tuple[str, ...]:
        if self.run.state is not RunState.EXHAUSTED:
            return ()
        return tuple(remainder_of(self.ledger, RUN_ID))

    # ------------------------------------------------------------ one second

    def _step(self, t: int) -> None:
        due = sorted((j for j in self.jobs if j.until <= t), key=lambda j: (j.until, j.seq))
        self.jobs = [j for j in self.jobs if j.until > t]
        for job in due:
            if self.run.state.closed:
                return
            self._finish(job, t)
        back = sorted(d for d in self.delayed if d[0] <= t)
        self.delayed = [d for d in self.delayed if d[0] > t]
        self.ready.extend(unit_id for _, _, unit_id in back)
        while len(self.jobs) < self.workers and self.ready and not self.run.state.closed:
            unit_id = self.ready.popleft()
            loop = self.loops[unit_id]
            if not loop.admitted:
                admission = self.ledger.admit(RUN_ID, unit_id, loop.attempt, t, lease_s=math.inf)
                if not admission.admitted:
                    self._empty_queue(t)
                    continue
                loop.admitted = True
            self._start_turn(unit_id, t, held=0)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _finish(self, job: _Job, t: int) -> None:
        loop = self.loops[job.unit_id]
        if job.phase == "hold":
            self._start_turn(job.unit_id, t, held=job.held)
            return
        if job.phase == "tools":
            self._start_turn(job.unit_id, t, held=0)
            return
        turn = loop.plan[loop.next_turn]
        assert job.grant is not None and self.governor is not None
        loop.turns_made += 1
        if self.workload.turn_fails(loop.index, loop.attempt, turn.turn):
            # the call was made and its answer lost: billed at its draw, called again
            self._bill(job.unit_id, loop, turn.draw, lost=True)
            self._settle(job.unit_id, loop, succeeded=False, t=t)
            return
        self.governor.true_up(job.grant, turn.billed, t)
        self._bill(job.unit_id, loop, turn.billed, lost=False)
        loop.next_turn += 1
        if loop.next_turn == len(loop.plan):
            self._settle(job.unit_id, loop, succeeded=True, t=t)
        elif turn.tool_s > 0:
            self._add_job(t + turn.tool_s, job.unit_id, "tools")
        else:
            self._start_turn(job.unit_id, t, held=0)

    def _start_turn(self, unit_id: str, t: int, held: int) -> None:
        """The worker holding ``unit_id`` draws for its next turn."""
        assert self.governor is not None
        loop = self.loops[unit_id]
        turn = loop.plan[loop.next_turn]
        if loop.billed + turn.draw > loop.cap:
            self.limit_tokens += 1
            self._settle(unit_id, loop, succeeded=True, t=t)
            return
        draw = self.governor.draw(turn.draw, Lane.NORMAL, t)
        if draw.granted:
            self._add_job(t + turn.model_s, unit_id, "model", grant=draw.grant)
            return
        wait = ticks_until(draw.wait_s)
        hold = self.workload.turns.hold_seconds
        if held + wait <= hold:
            self.held_waiting_s += wait
            self._add_job(t + wait, unit_id, "hold", held=held + wait)
            return
        # back to the lane with the delay; the worker is free, the reservation kept
        self.requeues += 1
        self.delayed.append((t + wait, self._next_seq(), unit_id))

    def _add_job(
        self, until: int, unit_id: str, phase: str, grant: Grant | None = None, held: int = 0
    ) -> None:
        self.jobs.append(_Job(until, self._next_seq(), unit_id, phase, grant, held))

    def _bill(self, unit_id: str, loop: _Loop, tokens: int, lost: bool) -> None:
        turn = loop.plan[loop.next_turn]
        self.turns.append(TurnRecord(unit_id, loop.attempt, turn.turn, turn.draw, tokens, lost))
        loop.billed += tokens
        loop.attempt_billed += tokens

    def _settle(self, unit_id: str, loop: _Loop, succeeded: bool, t: int) -> None:
        settlement = self.ledger.settle(
            RUN_ID, unit_id, loop.attempt, loop.attempt_billed, succeeded, t
        )
        loop.admitted = False
        loop.attempt_billed = 0
        loop.attempt += 1
        if settlement.fate is Fate.RETRY and not settlement.duplicate:
            if self.retries_first:
                self.ready.appendleft(unit_id)
            else:
                self.ready.append(unit_id)

    def _empty_queue(self, t: int) -> None:
        """As :meth:`swarm.sim.engine.Simulation._empty_queue`: what waited unadmitted is the
        remainder (units between turns keep their reservation and go on)."""
        waiting = list(self.ready)
        self.ready.clear()
        for unit_id in waiting:
            loop = self.loops[unit_id]
            if loop.admitted:  # back from a requeue between turns: it goes on
                self.ready.append(unit_id)
                continue
            if self.ledger.admit(RUN_ID, unit_id, loop.attempt, t, lease_s=0).admitted:
                self.ledger.reclaim_unit(RUN_ID, unit_id, t)


def check_agent_units(workload: Workload, fleet: FleetConfig) -> None:
    """Every turn's draw must be one the governor can ever grant."""
    capacity = fleet.governor.bucket_capacity
    for index in range(workload.units):
        for turn in workload.turn_plan(index):
            if turn.draw > capacity:
                raise InvalidInput(
                    "turns",
                    f"{workload.unit_id(index)}'s turn {turn.turn + 1} draws {turn.draw:,} "
                    f"tokens, more than the governor's bucket of {capacity:,.0f}: raise "
                    "--quota-tpm or give smaller units",
                )


def _projected(unit: UnitSpec) -> int:
    return unit.projected_tokens
