"""Property-based tests of the design sketch's invariants on the scheduler core."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from swarm.core.lanes import Policy
from swarm.core.ledger import Fate
from swarm.core.memory import InMemoryLedger
from swarm.core.records import Lane, RunSpec, RunState, UnitSpec, UnitState
from swarm.sim.engine import RUN_ID, FleetConfig, Simulation
from swarm.sim.workload import Workload


@settings(max_examples=40, deadline=None)
@given(
    units=st.integers(1, 120),
    workers=st.integers(1, 150),
    budget=st.integers(0, 2_000_000),
    failure_rate=st.floats(0, 0.5),
    max_attempts=st.integers(1, 4),
    share=st.floats(0.05, 1.0),
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(list(Policy)),
)
def test_every_simulated_run_keeps_the_invariants(
    units: int,
    workers: int,
    budget: int,
    failure_rate: float,
    max_attempts: int,
    share: float,
    seed: int,
    policy: Policy,
) -> None:
    workload = Workload(units=units, failure_rate=failure_rate, seed=seed)
    fleet = FleetConfig(
        workers=workers, budget=budget, max_attempts=max_attempts, share=share, policy=policy
    )
    sim = Simulation.fresh(workload, fleet)
    result = sim.run_until()
    run = result.run
    attempts = sim.ledger.attempts(RUN_ID)
    # the run closes, and the ledger never admitted beyond the budget
    assert run.state.closed
    assert run.spent <= run.budget
    assert run.reserved == 0 and run.in_flight == 0
    # spent equals the sum of every attempt's tokens
    assert run.spent == sum(a.tokens for a in attempts)
    # every unit ends completed, dead-lettered or in the remainder, and the counts agree
    states = Counter(u.state for u in sim.ledger.units(RUN_ID))
    assert sum(states.values()) == units
    assert set(states) <= {UnitState.COMPLETED, UnitState.DEAD_LETTERED, UnitState.REMAINDER}
    assert states[UnitState.COMPLETED] == run.completed
    assert states[UnitState.DEAD_LETTERED] == run.dead_lettered
    assert states[UnitState.REMAINDER] == run.remainder == len(result.remainder)
    assert (run.state is RunState.EXHAUSTED) == (run.remainder > 0)
    # no unit ran more often than max_attempts, none succeeded twice
    per_unit = Counter(a.unit_id for a in attempts)
    assert max(per_unit.values(), default=0) <= max_attempts
    assert max(Counter(a.unit_id for a in attempts if a.succeeded).values(), default=0) <= 1


UNITS = 6


class LedgerMachine(RuleBasedStateMachine):
    """Random admissions, settlements (actual tokens above or below the projection), duplicate
    deliveries, top-ups and lease expiries against one run."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = InMemoryLedger()
        self.now = 0.0
        self.spec = RunSpec(
            "r1",
            "tenant-a",
            Lane.NORMAL,
            budget=30_000,
            units=tuple(UnitSpec(f"u{i}", 4_000 + 1_000 * i) for i in range(UNITS)),
            max_attempts=2,
        )
        self.ledger.open_run(self.spec, self.now)
        self.settled: dict[tuple[str, int], Fate] = {}

    def _unit(self, i: int) -> str:
        return f"u{i}"

    @rule(i=st.integers(0, UNITS - 1))
    def admit(self, i: int) -> None:
        unit = self.ledger.unit("r1", self._unit(i))
        before = self.ledger.run("r1")
        if unit.state not in (UnitState.PENDING, UnitState.REMAINDER):
            return
        admission = self.ledger.admit("r1", unit.unit_id, unit.attempts, self.now, lease_s=50)
        after = self.ledger.run("r1")
        if admission.admitted:
            assert before.state is RunState.OPEN or unit.drain_epoch == before.exhaustions
            assert after.spent + after.reserved <= after.budget
        else:
            assert after.reserved == before.reserved

    @rule(i=st.integers(0, UNITS - 1), ok=st.booleans(), drift=st.integers(-3_000, 3_000))
    def settle(self, i: int, ok: bool, drift: int) -> None:
        unit = self.ledger.unit("r1", self._unit(i))
        if unit.state is not UnitState.IN_FLIGHT or unit.reservation is None:
            return
        attempt = unit.reservation.attempt
        tokens = max(0, unit.projected_tokens + drift)
        s = self.ledger.settle("r1", unit.unit_id, attempt, tokens, ok, self.now)
        assert not s.duplicate
        self.settled[(unit.unit_id, attempt)] = s.fate
        # the same delivery again settles nothing
        before = self.ledger.run("r1")
        again = self.ledger.settle("r1", unit.unit_id, attempt, tokens + 7, ok, self.now)
        assert again.duplicate and again.fate is s.fate
        assert self.ledger.run("r1") == before

    @rule(amount=st.integers(1, 20_000))
    def top_up(self, amount: int) -> None:
        run = self.ledger.run("r1")
        if run.state is RunState.COMPLETED:
            return
        top = self.ledger.top_up("r1", amount, self.now)
        assert top.run.budget == run.budget + amount
        assert top.run.state is RunState.OPEN

    @rule(dt=st.floats(0, 40))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(i=st.integers(0, UNITS - 1), lease=st.floats(1, 60))
    def claim(self, i: int, lease: float) -> None:
        unit = self.ledger.unit("r1", self._unit(i))
        claim = self.ledger.claim("r1", unit.unit_id, unit.attempts, self.now, lease)
        res = unit.reservation
        if res is None:
            assert not claim.claimed
        elif res.claimed:
            assert claim.reason == ("busy" if res.lease_expires > self.now else "stale")
        else:
            assert claim.claimed and claim.unit.reservation is not None
            assert claim.unit.reservation.lease_expires == self.now + lease

    @rule(i=st.integers(0, UNITS - 1))
    def unclaim(self, i: int) -> None:
        unit = self.ledger.unit("r1", self._unit(i))
        before = self.ledger.run("r1")
        handed_back = self.ledger.unclaim("r1", unit.unit_id, unit.attempts, self.now, 100)
        assert handed_back == (unit.state is UnitState.IN_FLIGHT)
        assert self.ledger.run("r1") == before  # the books do not move
        if handed_back:
            res = self.ledger.unit("r1", unit.unit_id).reservation
            assert res is not None and not res.claimed

    @precondition(lambda self: self.ledger.run("r1").in_flight > 0)
    @rule()
    def reclaim(self) -> None:
        before = self.ledger.run("r1")
        # the sweep looks at a reservation from its admission's (or unclaim's) lease on
        # (Reservation.sweep_at: a claim does not move it), and acts once its lease ended
        expired = [
            u
            for u in self.ledger.units("r1")
            if u.reservation is not None
            and u.reservation.lease_expires <= self.now
            and u.reservation.swept_from <= self.now
        ]
        reclaimed = self.ledger.reclaim_expired("r1", self.now)
        # claimed attempts are lost (their projected tokens charged); unclaimed ones released
        assert len(reclaimed) == sum(1 for u in expired if u.reservation and u.reservation.claimed)
        for s in reclaimed:
            assert s.attempt.reclaimed and not s.attempt.succeeded
            assert s.attempt.tokens == self.ledger.unit("r1", s.attempt.unit_id).projected_tokens
            self.settled[(s.attempt.unit_id, s.attempt.attempt)] = s.fate
        assert self.ledger.run("r1").in_flight == before.in_flight - len(expired)

    @rule(i=st.integers(0, UNITS - 1))
    def dead_letter(self, i: int) -> None:
        unit = self.ledger.unit("r1", self._unit(i))
        res = unit.reservation
        after = self.ledger.dead_letter("r1", unit.unit_id, self.now)
        if res is not None and res.claimed:
            self.settled[(unit.unit_id, res.attempt)] = Fate.RETRY  # settled as lost first
        if unit.state.terminal and unit.state is not UnitState.REMAINDER:
            assert after.state is unit.state
        else:
            assert after.state is UnitState.DEAD_LETTERED

    @invariant()
    def books_balance(self) -> None:
        run = self.ledger.run("r1")
        units = self.ledger.units("r1")
        attempts = self.ledger.attempts("r1")
        assert run.spent == sum(a.tokens for a in attempts) == sum(u.spent for u in units)
        assert run.reserved == sum(u.reservation.projected for u in units if u.reservation)
        assert run.reserved >= 0
        assert len(attempts) == len(self.settled) == run.attempts
        states = Counter(u.state for u in units)
        assert states[UnitState.IN_FLIGHT] == run.in_flight
        assert states[UnitState.COMPLETED] == run.completed
        assert states[UnitState.DEAD_LETTERED] == run.dead_lettered
        assert states[UnitState.REMAINDER] == run.remainder
        if run.state.closed:
            assert all(u.state.terminal for u in units)
        if run.state is RunState.OPEN:
            assert run.remainder == 0


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
