"""The fleet's digital twin: the scheduler core driven on a virtual clock.

A run's units enter their lane in the scheduling policy's order (:mod:`swarm.core.scheduling`).
Each simulated second, from the first, in this order: attempts whose service time is over settle
in the ledger (failed ones are retried, at the head of their lane or, for the book, at its back;
or dead-lettered), then free workers take units: ledger admission first (the first refusal starts
exhaustion and empties the queue, as in the book's loop), then a draw from the governor. A unit
whose draw is refused stays with its worker, blocking the lane behind it until the deficit
refills, except under ``largest-fit``, which admits the largest queued unit that fits the bucket
instead. The clock then jumps to the next second at which something can happen, so long runs
cost little.

With Lab 6.1's parameters and the ``book`` policy this reproduces the book's table to the token
and second, because the governor, ledger and lanes here are the same code the Lambda functions
run against DynamoDB/SQS (tests/unit/test_sim_differential.py holds it to the book's own loop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from swarm.core.clock import VirtualClock
from swarm.core.errors import InvalidInput
from swarm.core.governor import Draw, GovernorConfig, check_amount, ticks_until
from swarm.core.lanes import Policy, QueuedUnit
from swarm.core.ledger import Fate, remainder_of
from swarm.core.memory import InMemoryGovernor, InMemoryLanes, InMemoryLedger
from swarm.core.records import AttemptRecord, Lane, RunRecord, RunSpec, RunState, UnitSpec
from swarm.core.scheduling import (
    DEFAULT_SCHEDULE,
    Attempt,
    Floor,
    Schedule,
    fanout_order,
    makespan_floor,
)
from swarm.core.scheduling import crossover_workers as littles_law
from swarm.sim.agent import AgentSimulation, AgentStats
from swarm.sim.models import Models, ModelSpec
from swarm.sim.workload import Workload

RUN_ID = "sim-run"
TENANT = "sim"


@dataclass(frozen=True)
class FleetConfig:
    workers: int = 100
    quota_tpm: int = 300_000
    share: float = 0.95
    budget: int = 6_000_000
    max_attempts: int = 3
    policy: Policy = Policy.FIFO  # inside a lane: tenants in arrival order or round-robin
    schedule: Schedule = DEFAULT_SCHEDULE  # the order units are fanned out and admitted in
    horizon_s: int = 30 * 86_400  # a simulation that has not finished by then stops and says so
    #: several models (``--models``/``--mix``): each its own quota, burndown and prices; None:
    #: one model of ``quota_tpm`` at ``share``, burndown 1, no request bucket (Lab 6.1)
    models: Models | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InvalidInput("workers", f"must be >= 1, got {self.workers}")
        if self.budget < 0:
            raise InvalidInput("budget", f"must be >= 0 tokens, got {self.budget}")
        if not 1 <= self.max_attempts <= 100:
            raise InvalidInput("max_attempts", f"must be 1..100, got {self.max_attempts}")
        if self.horizon_s < 1:
            raise InvalidInput("horizon", f"must be >= 1 second, got {self.horizon_s}")
        _ = self.governor  # validates quota and share

    @property
    def governor(self) -> GovernorConfig:
        return GovernorConfig(quota_tpm=self.quota_tpm, share=self.share)


@dataclass(frozen=True)
class Running:
    finish: int
    item: QueuedUnit


@dataclass(frozen=True)
class ModelFigures:
    """One model's part of a simulated run (several models): its units, the attempts they made
    (one request each), the tokens billed (input and output), the quota tokens drawn (output at
    the model's burndown), the cost, and when its last attempt ended."""

    name: str
    units: int
    attempts: int
    billed_tokens: int
    input_tokens: int
    output_tokens: int
    quota_tokens: int
    cost_micro_usd: int | None  # None: the model has no prices
    last_end_s: int  # when its last attempt ended (0: none ran)
    tpm_floor_s: int  # its quota tokens at its governed TPM rate, from an empty bucket
    rpm_floor_s: int | None  # its requests at its governed RPM rate (None: no rpm)

    def doc(self) -> dict[str, object]:
        return {
            "model": self.name,
            "units": self.units,
            "attempts": self.attempts,
            "requests": self.attempts,
            "billed_tokens": self.billed_tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "quota_tokens": self.quota_tokens,
            "cost_micro_usd": self.cost_micro_usd,
            "last_end_s": self.last_end_s,
            "tpm_floor_s": self.tpm_floor_s,
            "rpm_floor_s": self.rpm_floor_s,
        }


@dataclass(frozen=True)
class SimResult:
    run: RunRecord
    elapsed: int
    killed: bool = False
    in_flight: int = 0  # attempts running when killed
    horizon_reached: bool = False
    remainder: tuple[str, ...] = ()
    lost_attempts: int = 0  # attempts that were running at a kill, settled on resume
    floor: Floor | None = None  # the makespan's lower bound for the attempts made (a closed run)
    agent: AgentStats | None = None  # agent units (--turns): what the turns did
    models: tuple[ModelFigures, ...] = ()  # several models: each one's figures, in mix order

    @property
    def floor_ratio(self) -> float | None:
        """Elapsed over the floor: 1.0 is a schedule nothing could beat."""
        if self.floor is None or self.floor.seconds == 0:
            return None
        return self.elapsed / self.floor.seconds


@dataclass
class Simulation:
    workload: Workload
    fleet: FleetConfig
    clock: VirtualClock = field(default_factory=VirtualClock)
    ledger: InMemoryLedger = field(default_factory=InMemoryLedger)
    lanes: InMemoryLanes | None = None
    governor: InMemoryGovernor | None = None
    in_flight: list[Running] = field(default_factory=list)
    lost_attempts: int = 0
    waiting: QueuedUnit | None = None  # admitted, off its lane, waiting for its tokens

    def __post_init__(self) -> None:
        if self.lanes is None:
            self.lanes = InMemoryLanes(self.fleet.policy)
        if self.governor is None:
            self.governor = InMemoryGovernor(self.fleet.governor, self.clock.now())

    # ------------------------------------------------------------ set-up

    @classmethod
    def fresh(cls, workload: Workload, fleet: FleetConfig) -> Simulation:
        sim = cls(workload, fleet)
        spec = RunSpec(
            RUN_ID, TENANT, Lane.NORMAL, fleet.budget, workload.specs(), fleet.max_attempts
        )
        sim.ledger.open_run(spec, sim.clock.now())
        for unit in fanout_order(spec.units, _projected, fleet.schedule):
            sim._enqueue(unit.unit_id, unit.projected_tokens, attempt=0)
        return sim

    @property
    def run(self) -> RunRecord:
        return self.ledger.run(RUN_ID)

    def _enqueue(self, unit_id: str, tokens: int, attempt: int, first: bool = False) -> None:
        assert self.lanes is not None
        spec = self.run.spec
        item = QueuedUnit(RUN_ID, unit_id, spec.tenant, spec.lane, attempt, tokens)
        self.lanes.push(item, first)

    # ------------------------------------------------------------ the loop

    def run_until(self, kill_at: int | None = None) -> SimResult:
        """Run to the end of the run (or to ``kill_at``, leaving the state resumable)."""
        t = int(self.clock.now())
        if kill_at is not None and kill_at <= t:
            raise InvalidInput("kill_at", f"must be after the current time {t}s, got {kill_at}s")
        # the fleet's first second is 1, as in the book's loop: the bucket starts empty, so
        # nothing could be granted at 0 and only a budget refusal would come a second early
        t = max(t, 1)
        while not self.run.state.closed:
            if kill_at is not None and t >= kill_at:
                self.clock.advance_to(kill_at)
                return self.result(kill_at, killed=True)
            if t > self.fleet.horizon_s:
                return self.result(t, horizon_reached=True)
            self.clock.advance_to(t)
            self._settle_finished(t)
            next_draw = None if self.run.state.closed else self._dispatch(t)
            if self.run.state.closed:
                break
            candidates = [r.finish for r in self.in_flight]
            if next_draw is not None:
                candidates.append(next_draw)
            if not candidates:
                raise RuntimeError(
                    f"simulation stalled at {t}s with the run {self.run.state.value}"
                )
            t = min(candidates)
        return self.result()

    def _settle_finished(self, t: int) -> None:
        still: list[Running] = []
        for running in self.in_flight:
            if running.finish > t:
                still.append(running)
                continue
            item = running.item
            failed = self.workload.fails(self.workload.index_of(item.unit_id), item.attempt)
            self._settle(item, succeeded=not failed, now=t)
        self.in_flight = still

    def _settle(self, item: QueuedUnit, succeeded: bool, now: float) -> None:
        settlement = self.ledger.settle(
            item.run_id, item.unit_id, item.attempt, item.tokens, succeeded, now
        )
        if settlement.fate is Fate.RETRY and not settlement.duplicate:
            first = self.fleet.schedule.retries_first
            self._enqueue(item.unit_id, item.tokens, item.attempt + 1, first)

    def _dispatch(self, t: int) -> int | None:
        """Fill free workers; returns when the governor can next grant what waits."""
        assert self.lanes is not None and self.governor is not None
        while len(self.in_flight) < self.fleet.workers:
            if self.waiting is not None:  # admitted, its worker waiting for the governor
                item = self.waiting
            else:
                head = self.lanes.peek()
                if head is None:
                    return None
                item = head
                if not self.fleet.schedule.head_of_line:
                    fitting, wait = self._largest_fitting(head, t)
                    if fitting is None:
                        return wait
                    item = fitting
                admission = self.ledger.admit(
                    item.run_id, item.unit_id, item.attempt, t, lease_s=math.inf
                )
                self._take(item, head)
                if not admission.admitted:
                    self._empty_queue(item.run_id, t)
                    continue
            draw = self.governor.draw(item.tokens, item.lane, t)
            if not draw.granted:
                # its worker holds it until the tokens are there: a retry queued meanwhile goes
                # to the head of the lane, behind this unit
                self.waiting = item
                return t + ticks_until(draw.wait_s)
            self.waiting = None
            self.in_flight.append(Running(t + self.workload.service_s(item.tokens), item))
        return None

    def _empty_queue(self, run_id: str, t: int) -> None:
        """A refusal empties the run's queue, as in the book's loop: what waited is the
        remainder now, and so are retries owed to attempts that failed during the drain (the
        ledger would admit one the budget still covers: it gets a zero queue lease instead, and
        its reservation is released at once)."""
        assert self.lanes is not None
        queued = [q for q in self.lanes.items() if q.run_id == run_id]
        for q in queued:
            if self.ledger.admit(run_id, q.unit_id, q.attempt, t, lease_s=0).admitted:
                self.ledger.reclaim_unit(run_id, q.unit_id, t)
        self.lanes.remove(run_id, {q.unit_id for q in queued})

    def _largest_fitting(self, head: QueuedUnit, t: int) -> tuple[QueuedUnit | None, int | None]:
        """``largest-fit``: the first unit of the head's queue (its lane; its tenant's units
        under fair lanes), in the lane's largest-first order, that the bucket covers now; else
        none, and when the smallest of them will fit."""
        assert self.lanes is not None and self.governor is not None
        fair = self.lanes.policy is Policy.FAIR
        queue = [
            q
            for q in self.lanes.items()
            if q.lane is head.lane and (not fair or q.tenant == head.tenant)
        ]
        # the governor's own test (BucketState.draw), so a unit chosen here is granted
        available = self.governor.snapshot(t).available
        reserve = self.governor.config.reserve(head.lane)
        for item in queue:
            if available - item.tokens >= reserve:
                return item, None
        smallest = min(queue, key=lambda q: q.tokens)
        return None, t + ticks_until(self.governor.draw(smallest.tokens, smallest.lane, t).wait_s)

    def _take(self, item: QueuedUnit, head: QueuedUnit) -> None:
        """Take ``item`` off its lane: the head with a pop (the tenants' rotation turns), any
        other unit by removing it."""
        assert self.lanes is not None
        if item is head:
            self.lanes.pop()
        else:
            self.lanes.remove(item.run_id, {item.unit_id})

    # ------------------------------------------------------------ kill / resume

    def recover_after_kill(self) -> int:
        """The fleet died: every attempt that was running is lost, its tokens billed anyway.

        Each is settled as a failed attempt charging its projected tokens (so spent stays the
        sum over every attempt), and retried or dead-lettered like any failure. Units that had
        completed are never touched.
        """
        lost = list(self.in_flight)
        self.in_flight = []
        now = self.clock.now()
        for running in lost:
            self._settle(running.item, succeeded=False, now=now)
        self.lost_attempts += len(lost)
        return len(lost)

    def top_up(self, amount: int) -> int:
        """Raise the budget and put the remainder back on its lane; returns how many."""
        top = self.ledger.top_up(RUN_ID, amount, self.clock.now())
        for unit_id in top.requeue:
            unit = self.ledger.unit(RUN_ID, unit_id)
            self._enqueue(unit_id, unit.projected_tokens, unit.attempts)
        return len(top.requeue)

    def result(
        self, elapsed: int | None = None, *, killed: bool = False, horizon_reached: bool = False
    ) -> SimResult:
        """The run as it stands; ``elapsed`` defaults to when it closed (or the clock)."""
        run = self.run
        if elapsed is None:
            elapsed = int(run.closed_at if run.closed_at is not None else self.clock.now())
        remainder = (
            tuple(remainder_of(self.ledger, RUN_ID)) if run.state is RunState.EXHAUSTED else ()
        )
        closed = run.state.closed and not killed and not horizon_reached
        return SimResult(
            run=run,
            elapsed=elapsed,
            killed=killed,
            in_flight=len(self.in_flight) if killed else 0,
            horizon_reached=horizon_reached,
            remainder=remainder,
            lost_attempts=self.lost_attempts,
            floor=self.floor() if closed else None,
        )

    def floor(self) -> Floor:
        """The makespan floor for the attempts this run made (:func:`makespan_floor`)."""
        attempts = [
            Attempt(a.unit_id, a.tokens, self.workload.service_s(a.tokens))
            for a in self.ledger.attempts(RUN_ID)
        ]
        return makespan_floor(attempts, self.fleet.governor.rate, self.fleet.workers)


@dataclass
class SimModelState:
    """One model's part of the fleet: its buckets (quota tokens; requests when it has an rpm),
    its queue of units, and the unit whose worker waits for its tokens."""

    spec: ModelSpec
    governor: InMemoryGovernor
    requests: InMemoryGovernor | None
    lanes: InMemoryLanes
    waiting: QueuedUnit | None = None


@dataclass
class ModelSimulation(Simulation):
    """The fleet on several models (``fleet.models``): each unit runs on its model, drawing its
    quota tokens (:meth:`Models.draw`: output at the model's burndown) from that model's token
    bucket and, when the model has an ``rpm``, one request from its request bucket, both or
    neither. Each model has its own queue and its own head of line, so a model waiting for its
    quota never holds up another's units; the workers, the ledger and the budget are shared.
    Free workers take units from the models in turn (one each, round the models, as long as
    some model's head can start); a unit waiting for its model's quota holds its worker. With
    one model of burndown 1 and no rpm it is :class:`Simulation` exactly
    (tests/unit/test_sim_models.py runs both)."""

    states: dict[str, SimModelState] = field(default_factory=dict)
    model_of: tuple[str, ...] = ()  # each unit's model, by index
    turn: int = 0  # the model the next free worker looks at first

    def __post_init__(self) -> None:
        super().__post_init__()
        models = self.fleet.models
        if models is None:
            raise InvalidInput("models", "a simulation on several models needs fleet.models")
        now = self.clock.now()
        for spec in models.used:
            share = spec.share(self.fleet.share)
            config = GovernorConfig(spec.tpm, share, output_burndown=spec.output_burndown)
            requests = None
            if spec.rpm is not None:
                requests = InMemoryGovernor(GovernorConfig(spec.rpm, share), now)
            self.states[spec.name] = SimModelState(
                spec, InMemoryGovernor(config, now), requests, InMemoryLanes(self.fleet.policy)
            )
        self.model_of = models.assign(self.workload.units, self.workload.seed)
        for index, name in enumerate(self.model_of):
            try:
                check_amount(
                    self.states[name].governor.config,
                    models.draw(name, self.workload.tokens(index)),
                    Lane.NORMAL,
                )
            except InvalidInput as e:
                raise InvalidInput(
                    f"units[{index}].projected_tokens", f"on model {name}: {e.message}"
                ) from None

    @property
    def models(self) -> Models:
        assert self.fleet.models is not None
        return self.fleet.models

    def _model(self, unit_id: str) -> str:
        return self.model_of[self.workload.index_of(unit_id)]

    def _enqueue(self, unit_id: str, tokens: int, attempt: int, first: bool = False) -> None:
        spec = self.run.spec
        item = QueuedUnit(RUN_ID, unit_id, spec.tenant, spec.lane, attempt, tokens)
        self.states[self._model(unit_id)].lanes.push(item, first)

    def _dispatch(self, t: int) -> int | None:
        """Fill free workers from the models in turn; returns when a waiting model's buckets
        can next grant what waits."""
        names = list(self.states)
        while True:
            waits: list[int] = []
            progressed = False
            for k in range(len(names)):
                name = names[(self.turn + k) % len(names)]
                st = self.states[name]
                # a unit waiting for its model's quota holds its worker (as in Simulation); a
                # new unit needs a worker that neither runs nor waits
                holding = sum(1 for s in self.states.values() if s.waiting is not None)
                if st.waiting is None and len(self.in_flight) + holding >= self.fleet.workers:
                    continue
                started, wait = self._dispatch_model(st, t)
                if started:
                    progressed = True
                    self.turn = (self.turn + k + 1) % len(names)
                    break
                if wait is not None:
                    waits.append(wait)
            if not progressed:
                return min(waits) if waits else None

    def _dispatch_model(self, st: SimModelState, t: int) -> tuple[bool, int | None]:
        """One step of :meth:`Simulation._dispatch` on one model's queue: (True, None) when it
        started a unit or a refusal emptied the queue; else (False, when it can next grant)."""
        if st.waiting is not None:
            item = st.waiting
        else:
            head = st.lanes.peek()
            if head is None:
                return False, None
            item = head
            if not self.fleet.schedule.head_of_line:
                fitting, wait = self._model_fitting(st, head, t)
                if fitting is None:
                    return False, wait
                item = fitting
            admission = self.ledger.admit(
                item.run_id, item.unit_id, item.attempt, t, lease_s=math.inf
            )
            if item is head:
                st.lanes.pop()
            else:
                st.lanes.remove(item.run_id, {item.unit_id})
            if not admission.admitted:
                self._empty_queue(item.run_id, t)
                return True, None
        wait = self._draw(st, item, t)
        if wait is not None:
            st.waiting = item
            return False, wait
        st.waiting = None
        self.in_flight.append(Running(t + self.workload.service_s(item.tokens), item))
        return True, None

    def _draw(self, st: SimModelState, item: QueuedUnit, t: int) -> int | None:
        """Draw the unit's quota tokens and (with an rpm) one request, both or neither; None
        when granted, else when both can be."""
        amount = self.models.draw(st.spec.name, item.tokens)
        if st.requests is None:
            draw = st.governor.draw(amount, item.lane, t)
            return None if draw.granted else t + ticks_until(draw.wait_s)
        g, r = st.governor, st.requests
        tokens: Draw = g.state.draw(g.config, amount, item.lane, t)[1]
        request: Draw = r.state.draw(r.config, 1, item.lane, t)[1]
        if tokens.granted and request.granted:
            g.draw(amount, item.lane, t)
            r.draw(1, item.lane, t)
            return None
        return t + max(ticks_until(d.wait_s) for d in (tokens, request) if not d.granted)

    def _model_fitting(
        self, st: SimModelState, head: QueuedUnit, t: int
    ) -> tuple[QueuedUnit | None, int | None]:
        """``largest-fit`` on one model's queue: its largest queued unit both buckets cover."""
        fair = st.lanes.policy is Policy.FAIR
        queue = [
            q
            for q in st.lanes.items()
            if q.lane is head.lane and (not fair or q.tenant == head.tenant)
        ]
        name = st.spec.name
        if st.requests is not None:
            room = st.requests.snapshot(t).available - st.requests.config.reserve(head.lane)
            if room < 1:
                smallest = min(queue, key=lambda q: q.tokens)
                wait = self._draw(st, smallest, t)
                return None, wait
        available = st.governor.snapshot(t).available
        reserve = st.governor.config.reserve(head.lane)
        for item in queue:
            if available - self.models.draw(name, item.tokens) >= reserve:
                return item, None
        smallest = min(queue, key=lambda q: q.tokens)
        return None, self._draw(st, smallest, t)

    def _empty_queue(self, run_id: str, t: int) -> None:
        for st in self.states.values():
            queued = [q for q in st.lanes.items() if q.run_id == run_id]
            for q in queued:
                if self.ledger.admit(run_id, q.unit_id, q.attempt, t, lease_s=0).admitted:
                    self.ledger.reclaim_unit(run_id, q.unit_id, t)
            st.lanes.remove(run_id, {q.unit_id for q in queued})

    def result(
        self, elapsed: int | None = None, *, killed: bool = False, horizon_reached: bool = False
    ) -> SimResult:
        base = super().result(elapsed, killed=killed, horizon_reached=horizon_reached)
        return replace(base, models=self.figures())

    def figures(self) -> tuple[ModelFigures, ...]:
        """Each model's figures from the ledger's attempts."""
        models = self.models
        attempts: dict[str, list[AttemptRecord]] = {name: [] for name in self.states}
        for a in self.ledger.attempts(RUN_ID):
            if a.tokens > 0:
                attempts[self._model(a.unit_id)].append(a)
        out = []
        for name, st in self.states.items():
            made = attempts[name]
            billed = [a.tokens for a in made]
            output = sum(models.output_tokens(b) for b in billed)
            quota = sum(models.draw(name, b) for b in billed)
            requests = st.requests
            out.append(
                ModelFigures(
                    name=name,
                    units=self.model_of.count(name),
                    attempts=len(made),
                    billed_tokens=sum(billed),
                    input_tokens=sum(billed) - output,
                    output_tokens=output,
                    quota_tokens=quota,
                    cost_micro_usd=models.cost_micro_usd(name, billed),
                    last_end_s=int(max((a.settled_at for a in made), default=0)),
                    tpm_floor_s=math.ceil(quota / st.governor.config.rate),
                    rpm_floor_s=(
                        None if requests is None else math.ceil(len(made) / requests.config.rate)
                    ),
                )
            )
        return tuple(out)

    def floor(self) -> Floor:
        """The floor on several models: each model's quota floor (its quota tokens at its TPM
        rate or its requests at its RPM rate, whichever is longer, then its shortest attempt)
        and retry chains at its own rate; the workers' floor over every attempt."""
        by_model: dict[str, list[Attempt]] = {name: [] for name in self.states}
        every: list[Attempt] = []
        for a in self.ledger.attempts(RUN_ID):
            name = self._model(a.unit_id)
            service = self.workload.service_s(a.tokens)
            every.append(Attempt(a.unit_id, a.tokens, service))
            by_model[name].append(Attempt(a.unit_id, self.models.draw(name, a.tokens), service))
        workers_s = makespan_floor(every, 1.0, self.fleet.workers).workers_s if every else 0
        quota_s = chain_s = 0
        for name, made in by_model.items():
            if not made:
                continue
            st = self.states[name]
            f = makespan_floor(made, st.governor.config.rate, self.fleet.workers)
            quota_s, chain_s = max(quota_s, f.quota_s), max(chain_s, f.chain_s)
            if st.requests is not None:
                grant_s = math.ceil(len(made) / st.requests.config.rate)
                quota_s = max(quota_s, grant_s + min(m.service_s for m in made))
        return Floor(quota_s=quota_s, workers_s=workers_s, chain_s=chain_s)


def simulate(workload: Workload, fleet: FleetConfig, kill_at: int | None = None) -> SimResult:
    if fleet.models is not None:
        if workload.turns.agent:
            raise InvalidInput(
                "turns", "agent units are not simulated on several models yet: leave out --turns"
            )
        return ModelSimulation.fresh(workload, fleet).run_until(kill_at)
    if workload.turns.agent:
        if kill_at is not None:
            raise InvalidInput("kill_at", "kill and resume are not simulated for agent units")
        return simulate_agent(workload, fleet)
    return Simulation.fresh(workload, fleet).run_until(kill_at)


def simulate_agent(workload: Workload, fleet: FleetConfig) -> SimResult:
    """A run of agent units, turn by turn (:mod:`swarm.sim.agent`); no floor: the one-call
    floor's arithmetic does not hold for loops of turns."""
    sim = AgentSimulation.fresh(workload, fleet)
    elapsed, horizon = sim.run_until(fleet.horizon_s)
    return SimResult(
        run=sim.run,
        elapsed=elapsed,
        horizon_reached=horizon,
        remainder=sim.remainder(),
        agent=sim.stats(elapsed),
    )


def crossover_workers(workload: Workload, fleet: FleetConfig) -> int:
    """Little's law: the workers the governed quota can actually feed (N* = rate x service time;
    an agent unit's service time is every second its loop holds a worker)."""
    count = workload.units
    avg_tokens = sum(workload.appetite(i) for i in range(count)) / count
    avg_service = sum(workload.held_s(i) for i in range(count)) / count
    return littles_law(fleet.governor.rate, avg_tokens, avg_service)


def _projected(unit: UnitSpec) -> int:
    return unit.projected_tokens
