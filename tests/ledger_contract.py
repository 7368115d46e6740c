"""The Ledger port's contract: one suite every implementation must pass with the same results.

Subclass :class:`LedgerContract` and provide a ``ledger`` fixture returning a fresh, empty
ledger. The scenario tests pin the semantics of swarm/core/ledger.py; the differential test
replays random operation sequences against the implementation and the in-memory reference and
requires identical answers and identical books after every step.
"""

from __future__ import annotations

import datetime as dt
import random
import sys
from dataclasses import replace
from typing import Any

import pytest

from swarm.core.errors import Conflict, Contended, InvalidInput, NotFound
from swarm.core.ledger import Fate, remainder_of
from swarm.core.memory import InMemoryLedger
from swarm.core.ports import ClaimedSettlement, LeaseKey, Ledger
from swarm.core.pricing import Priced, Prices, Usage, cost_micro, priced
from swarm.core.records import Lane, Reservation, RunSpec, RunState, UnitSpec, UnitState
from swarm.core.tenancy import HOLD_WINDOW_S


def spec(
    run_id: str = "run-1", units: int = 4, tokens: int = 100, budget: int = 1_000, attempts: int = 3
) -> RunSpec:
    return RunSpec(
        run_id=run_id,
        tenant="tenant-a",
        lane=Lane.NORMAL,
        budget=budget,
        units=tuple(UnitSpec(f"u{i}", tokens) for i in range(units)),
        max_attempts=attempts,
    )


#: the prices of the money scenarios: $0.80 / $4.00 / $0.08 / $1.00 per million tokens
PRICES = Prices(dt.date(2026, 12, 6), 800_000, 4_000_000, 80_000, 1_000_000)
#: another deploy's prices (settled after it: the attempts record these)
DEARER = Prices(dt.date(2027, 1, 1), 1_000_000, 5_000_000, 100_000, 1_250_000)


def usd_spec(
    run_id: str = "run-1", units: int = 4, micro: int = 1_000, budget: int = 2_500
) -> RunSpec:
    """A run whose budget is ``budget`` micro-dollars, each unit projected at 100 tokens and
    ``micro`` micro-dollars."""
    return RunSpec(
        run_id=run_id,
        tenant="tenant-a",
        lane=Lane.NORMAL,
        budget=budget,
        units=tuple(UnitSpec(f"u{i}", 100, micro) for i in range(units)),
        max_attempts=3,
        usd=True,
        prices=PRICES,
    )


def balanced(ledger: Ledger, run_id: str) -> None:
    """The books agree with the units and the attempts (the invariants of the design sketch),
    in tokens and in micro-dollars: spent is exactly the sum of every attempt's bill."""
    run = ledger.run(run_id)
    units = ledger.units(run_id)
    attempts = ledger.attempts(run_id)
    assert run.spent == sum(u.spent for u in units)
    assert run.spent_micro == sum(u.spent_micro for u in units)
    if all(u.turns == 0 for u in units):
        assert run.spent == sum(a.tokens for a in attempts)
        assert run.spent_micro == sum(a.cost_micro for a in attempts)
    else:  # an agent loop's turns are spent as they settle, its attempt's record bills them
        # once it settles (a paused or released loop's turns are in its unit's spent only)
        in_flight = sum(u.reservation.used for u in units if u.reservation)
        assert sum(a.tokens for a in attempts) + in_flight <= run.spent
        in_flight_micro = sum(u.reservation.used_micro for u in units if u.reservation)
        assert sum(a.cost_micro for a in attempts) + in_flight_micro <= run.spent_micro
    assert run.reserved == sum(u.reservation.held for u in units if u.reservation)
    assert run.in_flight == sum(1 for u in units if u.state is UnitState.IN_FLIGHT)
    assert run.awaiting == sum(1 for u in units if u.state is UnitState.AWAITING_APPROVAL)
    assert run.completed == sum(1 for u in units if u.state is UnitState.COMPLETED)
    assert run.dead_lettered == sum(1 for u in units if u.state is UnitState.DEAD_LETTERED)
    assert run.remainder == sum(1 for u in units if u.state is UnitState.REMAINDER)
    assert run.attempts == len(attempts) == sum(u.attempts for u in units)


class LedgerContract:
    """Scenario tests of the Ledger port (Given/When/Then)."""

    @pytest.fixture
    def ledger(self) -> Ledger:  # pragma: no cover - overridden
        raise NotImplementedError

    # -- opening
    def test_open_is_idempotent_for_the_same_spec_and_conflicts_for_another(
        self, ledger: Ledger
    ) -> None:
        first = ledger.open_run(spec(), now=1.0)
        assert ledger.open_run(spec(), now=2.0) == first
        with pytest.raises(Conflict):
            ledger.open_run(spec(budget=5), now=3.0)
        assert [u.unit_id for u in ledger.units("run-1")] == ["u0", "u1", "u2", "u3"]
        assert first.state is RunState.OPEN and first.opened_at == 1.0

    def test_a_run_opened_in_pages_is_opening_until_its_last_unit_then_open(
        self, ledger: Ledger
    ) -> None:
        # Given a run recorded as opening (the submit's O(1) writes)
        s = spec(units=60)
        opening = ledger.begin_open(s, "manifests/run-1/spec.json", now=1.0)
        assert opening.state is RunState.OPENING and opening.units_total == 60
        assert opening.pending == 60 and opening.units_written == 0
        # Then it is no run to anyone but its status, and nothing can be admitted
        with pytest.raises(NotFound):
            ledger.run("run-1")
        with pytest.raises(NotFound):
            ledger.admit("run-1", "u0", 0, now=2.0)
        # and a replay of the same spec returns it, another spec is a Conflict
        assert ledger.begin_open(s, "manifests/run-1/spec.json", now=3.0) == opening
        with pytest.raises(Conflict):
            ledger.begin_open(spec(units=61), "manifests/run-1/spec.json", now=3.0)
        with pytest.raises(Conflict):
            ledger.begin_open(replace(s, budget=5), "manifests/run-1/spec.json", now=3.0)
        # When the open step writes a page of 30, then dies and is restarted from cursor 10
        assert ledger.open_units(s, 0, 30, now=4.0) == 30
        assert ledger.run("run-1", opening=True).units_written == 30
        assert ledger.open_units(s, 10, 30, now=5.0) == 40
        with pytest.raises(NotFound):
            ledger.run("run-1")
        # and goes on to the end
        assert ledger.open_units(s, 40, 30, now=6.0) == 60
        # Then the run is open with every unit once, in submission order, as if opened at once
        run = ledger.run("run-1")
        assert run.state is RunState.OPEN and run.opened_at == 1.0 and run.units_total == 60
        assert run.units_written is None
        assert [u.unit_id for u in ledger.units("run-1")] == [f"u{i}" for i in range(60)]
        assert ledger.begin_open(s, "manifests/run-1/spec.json", now=7.0) == run
        # and an open step run again (a restarted execution) changes nothing
        assert ledger.admit("run-1", "u7", 0, now=8.0).admitted
        assert ledger.open_units(s, 0, 60, now=9.0) == 60
        assert ledger.unit("run-1", "u7").state is UnitState.IN_FLIGHT
        balanced(ledger, "run-1")

    def test_an_open_step_stops_when_told_and_resumes_where_it_stopped(
        self, ledger: Ledger
    ) -> None:
        s = spec(units=80)
        ledger.begin_open(s, "k", now=0.0)
        pages = iter([True, True, False])
        cursor = ledger.open_units(s, 0, 80, now=1.0, keep_going=lambda: next(pages))
        assert cursor == 50  # two pages of 25, then told to stop
        assert ledger.open_units(s, cursor, 80, now=2.0) == 80
        assert len(ledger.units("run-1")) == 80

    def test_an_opening_run_counts_in_its_tenants_queued_units(self, ledger: Ledger) -> None:
        ledger.begin_open(spec(units=7), "k", now=0.0)
        assert ledger.queued_units("tenant-a") == 7

    def test_units_page_through_every_unit_once_in_id_order_with_effective_states(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(units=7, budget=250), now=0.0)
        assert ledger.admit("run-1", "u3", 0, now=1.0).admitted
        ledger.settle("run-1", "u3", 0, 100, True, now=2.0)
        assert ledger.admit("run-1", "u5", 0, now=3.0).admitted
        assert ledger.admit("run-1", "u6", 0, now=3.0).reason == "budget"  # exhausting
        seen: list[tuple[str, UnitState]] = []
        after: str | None = None
        for _ in range(10):
            page = ledger.units_page("run-1", after, 3)
            assert len(page.units) <= 3
            seen += [(u.unit_id, u.state) for u in page.units]
            if page.last is None:
                break
            after = page.last
        assert [uid for uid, _ in seen] == [f"u{i}" for i in range(7)]
        states = dict(seen)
        assert states["u3"] is UnitState.COMPLETED and states["u5"] is UnitState.IN_FLIGHT
        assert states["u0"] is UnitState.REMAINDER  # the effective state, as units() says
        assert ledger.units_page("run-1", "u6", 3).units == []
        with pytest.raises(NotFound):
            ledger.units_page("nope", None, 3)

    def test_unknown_runs_and_units_are_not_found(self, ledger: Ledger) -> None:
        with pytest.raises(NotFound):
            ledger.run("nope")
        ledger.open_run(spec(), now=0.0)
        with pytest.raises(NotFound):
            ledger.unit("run-1", "nope")
        with pytest.raises(NotFound):
            ledger.admit("run-1", "nope", 0, now=0.0)

    # -- admission and settlement
    def test_admission_reserves_and_settlement_replaces_the_reservation(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(), now=0.0)
        admission = ledger.admit("run-1", "u0", 0, now=1.0)
        assert admission.admitted and admission.reason == "admitted"
        assert ledger.run("run-1").reserved == 100
        assert ledger.admit("run-1", "u0", 0, now=1.5).reason == "already_admitted"
        settled = ledger.settle("run-1", "u0", 0, tokens=70, succeeded=True, now=2.0)
        assert settled.fate is Fate.COMPLETED and not settled.duplicate
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.completed, run.attempts) == (70, 0, 1, 1)
        balanced(ledger, "run-1")

    def test_a_repeated_settlement_returns_the_first_and_changes_nothing(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(), now=0.0)
        ledger.admit("run-1", "u0", 0, now=1.0)
        first = ledger.settle("run-1", "u0", 0, tokens=80, succeeded=False, now=2.0)
        before = ledger.run("run-1")
        again = ledger.settle("run-1", "u0", 0, tokens=999, succeeded=True, now=3.0)
        assert again.duplicate and again.fate is first.fate is Fate.RETRY
        assert again.attempt == first.attempt
        assert ledger.run("run-1") == before
        balanced(ledger, "run-1")

    def test_wrong_attempts_conflict_and_bad_tokens_are_invalid(self, ledger: Ledger) -> None:
        ledger.open_run(spec(), now=0.0)
        with pytest.raises(Conflict):
            ledger.admit("run-1", "u0", 1, now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        with pytest.raises(Conflict):
            ledger.settle("run-1", "u0", 1, tokens=1, succeeded=True, now=1.0)
        with pytest.raises(InvalidInput):
            ledger.settle("run-1", "u0", 0, tokens=-1, succeeded=True, now=1.0)

    def test_failed_attempts_retry_then_dead_letter_and_the_run_completes(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(units=2, attempts=2), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        assert ledger.settle("run-1", "u0", 0, 10, False, now=1.0).fate is Fate.RETRY
        ledger.admit("run-1", "u0", 1, now=1.0)
        assert ledger.settle("run-1", "u0", 1, 10, False, now=2.0).fate is Fate.DEAD_LETTERED
        ledger.admit("run-1", "u1", 0, now=2.0)
        ledger.settle("run-1", "u1", 0, 50, True, now=3.0)
        run = ledger.run("run-1")
        assert run.state is RunState.COMPLETED and run.closed_at == 3.0
        assert (run.spent, run.retries, run.dead_lettered) == (70, 1, 1)
        assert ledger.admit("run-1", "u1", 1, now=4.0).reason == "terminal"
        balanced(ledger, "run-1")

    # -- exhaustion, draining, resume
    def test_exhaustion_drains_in_flight_then_closes_with_the_remainder(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(units=5, budget=250), now=0.0)
        assert ledger.admit("run-1", "u0", 0, now=0.0).admitted
        assert ledger.admit("run-1", "u1", 0, now=0.0).admitted
        refused = ledger.admit("run-1", "u2", 0, now=1.0)
        assert not refused.admitted and refused.reason == "budget" and refused.exhausted_run
        assert ledger.run("run-1").state is RunState.EXHAUSTING
        assert ledger.admit("run-1", "u3", 0, now=1.0).reason == "exhausting"
        assert remainder_of(ledger, "run-1") == ["u2", "u3", "u4"]
        # a failure during the drain is owed a retry, admitted while the budget covers it
        assert ledger.settle("run-1", "u0", 0, 100, False, now=2.0).fate is Fate.RETRY
        assert ledger.unit("run-1", "u0").state is UnitState.PENDING
        refused_retry = ledger.admit("run-1", "u0", 1, now=2.0)  # 100 + 100 + 100 > 250
        assert refused_retry.reason == "budget"
        assert remainder_of(ledger, "run-1") == ["u0", "u2", "u3", "u4"]
        ledger.settle("run-1", "u1", 0, 90, True, now=3.0)
        run = ledger.run("run-1")
        assert run.state is RunState.EXHAUSTED and run.closed_at == 3.0
        assert run.remainder == 4
        balanced(ledger, "run-1")
        # resume: a top-up reopens the run and hands back the remainder
        top = ledger.top_up("run-1", 1_000, now=4.0)
        assert top.run.state is RunState.OPEN and set(top.requeue) == {"u0", "u2", "u3", "u4"}
        assert ledger.run("run-1").budget == 1_250 and remainder_of(ledger, "run-1") == []
        for uid, attempt in (("u0", 1), ("u2", 0), ("u3", 0), ("u4", 0)):
            assert ledger.admit("run-1", uid, attempt, now=5.0).admitted
            ledger.settle("run-1", uid, attempt, 100, True, now=6.0)
        assert ledger.run("run-1").state is RunState.COMPLETED
        balanced(ledger, "run-1")

    def test_an_exhausted_run_with_nothing_in_flight_closes_at_once(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2, budget=50), now=0.0)
        refused = ledger.admit("run-1", "u0", 0, now=1.0)
        assert refused.reason == "budget" and refused.run.state is RunState.EXHAUSTED
        assert ledger.admit("run-1", "u1", 0, now=1.0).reason == "closed"
        assert remainder_of(ledger, "run-1") == ["u0", "u1"]
        with pytest.raises(InvalidInput):
            ledger.top_up("run-1", 0, now=2.0)

    def test_top_ups_cannot_take_the_budget_past_the_ceiling(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2, budget=50), now=0.0)
        ledger.admit("run-1", "u0", 0, now=1.0)  # refused: the run is exhausted
        ledger.top_up("run-1", 950, now=2.0, max_budget=1_000)  # exactly the ceiling: fine
        with pytest.raises(InvalidInput, match="top up at most 0"):
            ledger.top_up("run-1", 1, now=3.0, max_budget=1_000)
        with pytest.raises(InvalidInput, match="top_up"):
            ledger.top_up("run-1", 10**40, now=3.0, max_budget=1_000)
        assert ledger.run("run-1").budget == 1_000  # nothing written by the refusals

    def test_a_completed_run_cannot_be_topped_up(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=1), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.settle("run-1", "u0", 0, 5, True, now=1.0)
        with pytest.raises(Conflict):
            ledger.top_up("run-1", 10, now=2.0)

    # -- a tenant's queued units (the front door's per-tenant cap: swarm.core.tenancy)
    def test_queued_units_count_a_tenants_open_units_only(self, ledger: Ledger) -> None:
        # Given two runs of tenant-a (4 and 3 units) and one of tenant-b (2 units)
        ledger.open_run(spec("run-1", units=4), now=0.0)
        ledger.open_run(spec("run-2", units=3), now=0.0)
        ledger.open_run(replace(spec("run-b", units=2), tenant="tenant-b"), now=0.0)
        # Then each tenant counts its own units, nobody else's
        assert ledger.queued_units("tenant-a") == 7
        assert ledger.queued_units("tenant-b") == 2
        assert ledger.queued_units("nobody") == 0
        # When a unit completes, it is no longer queued (an admitted one still is)
        ledger.admit("run-1", "u0", 0, now=1.0)
        assert ledger.queued_units("tenant-a") == 7
        ledger.settle("run-1", "u0", 0, 100, True, now=2.0)
        assert ledger.queued_units("tenant-a") == 6

    def test_an_exhausted_runs_remainder_is_not_queued_until_a_top_up(self, ledger: Ledger) -> None:
        # Given tenant-a's run that exhausts at its first admission (its remainder: both units)
        ledger.open_run(spec(units=2, budget=50), now=0.0)
        assert ledger.admit("run-1", "u0", 0, now=1.0).run.state is RunState.EXHAUSTED
        # Then none of it is queued
        assert ledger.queued_units("tenant-a") == 0
        # When a top-up reopens it, its units are queued again
        ledger.top_up("run-1", 500, now=2.0)
        assert ledger.queued_units("tenant-a") == 2

    def test_a_hold_counts_a_run_before_it_exists_then_its_own_units_once(
        self, ledger: Ledger
    ) -> None:
        # Given tenant-a with one open run of 4 units
        ledger.open_run(spec("run-1", units=4), now=0.0)
        view = ledger.tenant_queue("tenant-a", now=1.0)
        assert view.units == 4
        # When a submission holds 6 units for run-2, which does not exist yet
        ledger.hold_queue("tenant-a", view.version, "run-2", 6, now=1.0)
        # Then the next decision counts them (an index may not show run-2 for a moment)
        assert ledger.tenant_queue("tenant-a", now=2.0).units == 10
        assert ledger.tenant_queue("tenant-b", now=2.0).units == 0  # nobody else's
        # When run-2 opens and one of its units completes, it counts as itself, once
        ledger.open_run(spec("run-2", units=6), now=3.0)
        ledger.admit("run-2", "u0", 0, now=3.0)
        ledger.settle("run-2", "u0", 0, 100, True, now=4.0)
        assert ledger.tenant_queue("tenant-a", now=5.0).units == 9
        # and a hold for a run never created stops counting after the window
        again = ledger.tenant_queue("tenant-a", now=5.0)
        ledger.hold_queue("tenant-a", again.version, "run-never", 50, now=5.0)
        assert ledger.tenant_queue("tenant-a", now=6.0).units == 59
        assert ledger.tenant_queue("tenant-a", now=5.0 + HOLD_WINDOW_S).units == 9

    def test_the_tenant_queue_reads_each_open_runs_drain_for_its_retry_after(
        self, ledger: Ledger
    ) -> None:
        # Given tenant-a's run opened at 10 with one unit completed and one dead-lettered, and
        # a run of tenant-b
        ledger.open_run(spec("run-1", units=4), now=10.0)
        ledger.open_run(replace(spec("run-b", units=3), tenant="tenant-b"), now=11.0)
        ledger.admit("run-1", "u0", 0, now=12.0)
        ledger.settle("run-1", "u0", 0, 100, True, now=13.0)
        ledger.admit("run-1", "u1", 0, now=12.0)
        ledger.dead_letter("run-1", "u1", now=14.0)
        # Then the tenant's queue reads when its run opened and the two units drained
        view = ledger.tenant_queue("tenant-a", now=20.0)
        assert view.units == 2 and view.progress == ((10.0, 2),)
        assert ledger.tenant_queue("tenant-b", now=20.0).progress == ((11.0, 0),)

    def test_a_hold_on_a_version_another_decision_held_since_is_contended(
        self, ledger: Ledger
    ) -> None:
        # Given two submissions of tenant-a that read the same count
        first = ledger.tenant_queue("tenant-a", now=0.0)
        second = ledger.tenant_queue("tenant-a", now=0.0)
        assert first == second
        # When the first holds, the second's hold on the same version is refused
        ledger.hold_queue("tenant-a", first.version, "run-1", 5, now=1.0)
        with pytest.raises(Contended):
            ledger.hold_queue("tenant-a", second.version, "run-2", 5, now=1.0)
        # and its fresh read sees the first's units, on which it may hold
        fresh = ledger.tenant_queue("tenant-a", now=2.0)
        assert fresh.units == 5 and fresh.version != first.version
        ledger.hold_queue("tenant-a", fresh.version, "run-2", 5, now=2.0)
        assert ledger.tenant_queue("tenant-a", now=3.0).units == 10
        # and another tenant's holds are its own
        other = ledger.tenant_queue("tenant-b", now=3.0)
        ledger.hold_queue("tenant-b", other.version, "run-b", 1, now=3.0)

    def test_a_tenant_holds_at_most_max_holds_runs_a_window(
        self, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(sys.modules[type(ledger).__module__], "MAX_HOLDS", 2)
        for i in range(2):
            view = ledger.tenant_queue("tenant-a", now=float(i))
            ledger.hold_queue("tenant-a", view.version, f"run-{i}", 1, now=float(i))
        view = ledger.tenant_queue("tenant-a", now=2.0)
        with pytest.raises(Contended, match="2 submissions in the last minute"):
            ledger.hold_queue("tenant-a", view.version, "run-2", 1, now=2.0)
        # once the first has left the window there is room again
        later = ledger.tenant_queue("tenant-a", now=HOLD_WINDOW_S + 0.5)
        ledger.hold_queue("tenant-a", later.version, "run-2", 1, now=HOLD_WINDOW_S + 0.5)

    # -- a worker invocation's settlements, together
    def test_claimed_attempts_settled_together_are_settled_as_one_by_one(
        self, ledger: Ledger
    ) -> None:
        # Given two runs with units claimed by one invocation's messages (same attempt numbers)
        reference = InMemoryLedger()
        handed: list[ClaimedSettlement] = []
        for led in (ledger, reference):
            handed = []
            for run_id in ("run-1", "run-2"):
                led.open_run(spec(run_id, units=5), now=0.0)
                for i in range(4):
                    led.admit(run_id, f"u{i}", 0, now=0.0)
                    claim = led.claim_queued(run_id, f"u{i}", 0, now=1.0, lease_s=30)
                    assert claim is not None
                    ok = i != 1  # u1 fails: a retry
                    handed.append(ClaimedSettlement(claim.unit, 0, 60 + i, ok, 2.0, f"page-{i}"))
            # When ``ledger`` settles them together and the reference one by one
            if led is ledger:
                fates = ledger.settle_claimed_many(handed)
            else:
                fates = [
                    reference.settle_claimed(
                        c.claimed, c.attempt, c.tokens, c.succeeded, c.now, c.outcome_key
                    )
                    for c in handed
                ]
            assert fates == [Fate.COMPLETED, Fate.RETRY, Fate.COMPLETED, Fate.COMPLETED] * 2
        # Then the books, the units and the attempts are the same
        for run_id in ("run-1", "run-2"):
            assert ledger.run(run_id) == reference.run(run_id)
            assert ledger.units(run_id) == reference.units(run_id)
            assert ledger.attempts(run_id) == reference.attempts(run_id)
            balanced(ledger, run_id)
        # and settling any of them again settles nothing
        assert ledger.settle_claimed_many(handed[:2]) == [None, None]
        assert ledger.settle("run-1", "u0", 0, 60, True, now=3.0).duplicate

    def test_claimed_attempts_that_would_end_the_run_are_left_to_settle(
        self, ledger: Ledger
    ) -> None:
        # Given a run of two units, both claimed
        ledger.open_run(spec(units=2), now=0.0)
        handed = []
        for uid in ("u0", "u1"):
            ledger.admit("run-1", uid, 0, now=0.0)
            claim = ledger.claim_queued("run-1", uid, 0, now=1.0, lease_s=30)
            assert claim is not None
            handed.append(ClaimedSettlement(claim.unit, 0, 50, True, 2.0))
        # When both are settled together, and the one it left is settled by settle()
        fates = ledger.settle_claimed_many(handed)
        assert fates[0] in (Fate.COMPLETED, None) and fates[1] is None  # the last closes the run
        for c, fate in zip(handed, fates, strict=True):
            if fate is None:
                ledger.settle("run-1", c.claimed.unit_id, 0, 50, True, now=3.0)
        # Then the run closed with each attempt counted once
        run = ledger.run("run-1")
        assert (run.state, run.completed, run.spent) == (RunState.COMPLETED, 2, 100)
        balanced(ledger, "run-1")

    # -- claims and leases
    def test_claims_make_duplicate_deliveries_busy_and_reclaim_charges_lost_work(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=1_000)
        assert ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30).claimed
        assert ledger.claim("run-1", "u0", 0, now=2.0, lease_s=30).reason == "busy"
        assert ledger.reclaim_unit("run-1", "u0", now=20.0) is None  # lease still live
        # the message's next delivery finds the claim stale once its lease expired, and
        # reclaims it (the sweep would only at the admission's lease: Reservation.sweep_at)
        assert ledger.claim("run-1", "u0", 0, now=31.0, lease_s=30).reason == "stale"
        assert ledger.reclaim_expired("run-1", now=31.0) == []
        reclaimed = ledger.reclaim_unit("run-1", "u0", now=31.0)
        assert reclaimed is not None
        lost = [reclaimed]
        assert [s.attempt.reclaimed for s in lost] == [True]
        assert lost[0].attempt.tokens == 100 and lost[0].fate is Fate.RETRY
        # the worker was only slow: its late settlement is a duplicate, counted once
        late = ledger.settle("run-1", "u0", 0, 40, True, now=32.0)
        assert late.duplicate and late.fate is Fate.RETRY
        assert ledger.run("run-1").spent == 100
        assert ledger.claim("run-1", "u0", 0, now=33.0, lease_s=30).reason == "settled"
        balanced(ledger, "run-1")

    def test_a_unit_waiting_for_its_attempt_is_claimed_by_one_write(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=3), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=100)
        # When a worker claims the attempt the unit waits for in its lane, without a read
        claim = ledger.claim_queued("run-1", "u0", 0, now=1.0, lease_s=30)
        # Then it holds it, as a claim after a read would
        assert claim is not None and claim.claimed and claim.reason == "claimed"
        assert claim.unit == ledger.unit("run-1", "u0")
        # (the sweep still looks at it when the admission's lease ends: a claim never moves it)
        assert claim.unit.reservation == Reservation(0, 100, 31.0, claimed=True, sweep_at=100.0)
        # and a unit in any other state is left to a read: claimed, waiting for another attempt,
        # pending, settled, or unknown
        assert ledger.claim_queued("run-1", "u0", 0, now=2.0, lease_s=30) is None
        assert ledger.claim_queued("run-1", "u0", 1, now=2.0, lease_s=30) is None
        assert ledger.claim_queued("run-1", "u1", 0, now=2.0, lease_s=30) is None
        ledger.settle("run-1", "u0", 0, 50, True, now=3.0)
        assert ledger.claim_queued("run-1", "u0", 0, now=4.0, lease_s=30) is None
        assert ledger.claim_queued("run-1", "nope", 0, now=4.0, lease_s=30) is None
        assert ledger.claim_queued("run-x", "u0", 0, now=4.0, lease_s=30) is None
        assert ledger.unit("run-1", "u0").state is UnitState.COMPLETED
        balanced(ledger, "run-1")

    def test_a_claimed_attempt_is_settled_from_its_claim_unless_the_books_must_decide(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(units=3, attempts=2), now=0.0)
        for uid in ("u0", "u1", "u2"):
            ledger.admit("run-1", uid, 0, now=0.0, lease_s=100)
        claims = {u: ledger.claim_queued("run-1", u, 0, now=1.0, lease_s=30) for u in ("u0", "u1")}
        u0, u1 = (c.unit for c in claims.values() if c is not None)
        # When a worker settles the attempt it claimed, from the unit its claim wrote
        assert ledger.settle_claimed(u0, 0, 70, True, now=2.0) is Fate.COMPLETED
        assert ledger.settle_claimed(u1, 0, 40, False, now=2.0) is Fate.RETRY
        # Then the books are those a settlement after a read leaves
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.completed, run.retries) == (110, 100, 1, 1)
        assert ledger.unit("run-1", "u0").state is UnitState.COMPLETED
        assert ledger.unit("run-1", "u1").state is UnitState.PENDING
        # and nothing is written where the claim is not what is stored, or where the books
        # must decide: a second settlement, an unclaimed or changed unit, the run's last unit
        assert ledger.settle_claimed(u0, 0, 70, True, now=3.0) is None
        assert ledger.settle_claimed(ledger.unit("run-1", "u2"), 0, 10, True, now=3.0) is None
        ledger.admit("run-1", "u1", 1, now=3.0, lease_s=100)
        assert ledger.settle_claimed(u1, 0, 40, False, now=3.0) is None
        last = ledger.claim("run-1", "u2", 0, now=4.0, lease_s=30)
        retry = ledger.claim("run-1", "u1", 1, now=4.0, lease_s=30)
        assert ledger.settle_claimed(retry.unit, 1, 30, True, now=5.0) is Fate.COMPLETED
        assert ledger.settle_claimed(last.unit, 0, 20, True, now=5.0) is None  # closes the run
        assert ledger.run("run-1").state is RunState.OPEN
        assert ledger.settle("run-1", "u2", 0, 20, True, now=5.0).fate is Fate.COMPLETED
        assert ledger.run("run-1").state is RunState.COMPLETED
        balanced(ledger, "run-1")

    def test_an_exhausting_runs_claimed_attempt_is_settled_after_a_read(
        self, ledger: Ledger
    ) -> None:
        # Given a run whose budget ran out while u0's attempt was claimed
        ledger.open_run(spec(units=3, budget=150), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=100)
        claimed = ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30).unit
        assert not ledger.admit("run-1", "u1", 0, now=1.0).admitted
        assert ledger.run("run-1").state is RunState.EXHAUSTING
        # Then its settlement is left to settle(), which drains it into the remainder's epoch
        assert ledger.settle_claimed(claimed, 0, 50, False, now=2.0) is None
        assert ledger.settle("run-1", "u0", 0, 50, False, now=2.0).fate is Fate.RETRY
        balanced(ledger, "run-1")

    def test_an_expired_unclaimed_reservation_is_released_not_charged(self, ledger: Ledger) -> None:
        ledger.open_run(spec(), now=0.0)
        ledger.admit("run-1", "u1", 0, now=0.0, lease_s=10)
        assert ledger.reclaim_expired("run-1", now=11.0) == []
        run = ledger.run("run-1")
        assert (run.reserved, run.in_flight, run.spent) == (0, 0, 0)
        assert ledger.unit("run-1", "u1").state is UnitState.PENDING
        assert ledger.admit("run-1", "u1", 0, now=12.0).admitted
        balanced(ledger, "run-1")

    def test_unclaim_hands_the_attempt_back_unstarted(self, ledger: Ledger) -> None:
        ledger.open_run(spec(), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        assert ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30).claimed
        assert ledger.unclaim("run-1", "u0", 0, now=2.0, lease_s=500)
        assert ledger.claim("run-1", "u0", 0, now=3.0, lease_s=30).claimed
        assert not ledger.unclaim("run-1", "u1", 0, now=3.0, lease_s=30)

    def test_dead_letter_settles_a_claimed_attempt_first(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=0.0, lease_s=30)
        unit = ledger.dead_letter("run-1", "u0", now=1.0)
        assert unit.state is UnitState.DEAD_LETTERED and unit.spent == 100
        assert ledger.dead_letter("run-1", "u1", now=2.0).state is UnitState.DEAD_LETTERED
        assert ledger.run("run-1").state is RunState.COMPLETED
        balanced(ledger, "run-1")

    # -- the fan-out's reservations: not in the lease index, found by the run's scan
    def test_a_fan_outs_reservations_are_found_by_the_runs_scan_not_the_index(
        self, ledger: Ledger
    ) -> None:
        # Given three units admitted by the fan-out (by_scan), one of them claimed by a worker
        # that died with its message, and one admitted by a worker (in the lease index)
        ledger.open_run(spec(units=4), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=100, by_scan=True)
        ledger.admit("run-1", "u1", 0, now=0.0, lease_s=100, by_scan=True)
        ledger.admit("run-1", "u2", 0, now=50.0, lease_s=100, by_scan=True)
        ledger.admit("run-1", "u3", 0, now=0.0, lease_s=100)
        assert ledger.claim("run-1", "u1", 0, now=1.0, lease_s=30).claimed
        # Then the index lists only the worker's, and the run's horizon is the latest lease
        assert ledger.expired_leases("run-1", now=1e12) == ["u3"]
        assert ledger.run("run-1").scan_at == 150.0
        # When the sweep runs before the horizon: only the index's expired entry is released
        assert ledger.reclaim_expired("run-1", now=120.0) == []
        assert ledger.unit("run-1", "u3").state is UnitState.PENDING
        assert [ledger.unit("run-1", u).state for u in ("u0", "u1", "u2")] == [
            UnitState.IN_FLIGHT
        ] * 3
        # and at the horizon: every unit is read, the lost attempt settled, the others released
        lost = ledger.reclaim_expired("run-1", now=150.0)
        assert [(s.unit.unit_id, s.attempt.reclaimed, s.fate) for s in lost] == [
            ("u1", True, Fate.RETRY)
        ]
        run = ledger.run("run-1")
        assert (run.in_flight, run.reserved, run.spent, run.scan_at) == (0, 0, 100, None)
        assert ledger.reclaim_expired("run-1", now=1e12) == []  # nothing left to find
        balanced(ledger, "run-1")

    def test_a_scan_cut_short_keeps_its_horizon_and_the_next_sweep_goes_on(
        self, ledger: Ledger
    ) -> None:
        # Given three units admitted by the fan-out whose messages are gone (the horizon passed)
        ledger.open_run(spec(units=3), now=0.0)
        ledger.admit_many("run-1", ["u0", "u1", "u2"], now=0.0, lease_s=100, by_scan=True)
        assert ledger.run("run-1").scan_at == 100.0
        # When a sweep has no time left: it decides one of them (every call makes progress)
        cut = ledger.reclaim_expired("run-1", now=100.0, keep_going=lambda: False)
        assert cut == []  # releases: no attempt lost
        # Then one is released, and the horizon stays, so the rest are not forgotten
        states = [ledger.unit("run-1", u).state for u in ("u0", "u1", "u2")]
        assert sorted(states) == [UnitState.IN_FLIGHT] * 2 + [UnitState.PENDING]
        assert ledger.run("run-1").scan_at == 100.0
        # When the next sweep has time: the others are released and the horizon is gone
        assert ledger.reclaim_expired("run-1", now=101.0) == []
        run = ledger.run("run-1")
        assert (run.in_flight, run.reserved, run.scan_at) == (0, 0, None)
        assert {ledger.unit("run-1", u).state for u in ("u0", "u1", "u2")} == {UnitState.PENDING}
        balanced(ledger, "run-1")

    def test_a_fan_outs_reservation_is_claimed_and_settled_as_any(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2), now=0.0)
        ledger.admit_many("run-1", ["u0", "u1"], now=0.0, lease_s=1_000, by_scan=True)
        claim = ledger.claim_queued("run-1", "u0", 0, now=1.0, lease_s=30)
        assert claim is not None and claim.unit.reservation is not None
        assert claim.unit == ledger.unit("run-1", "u0")
        assert claim.unit.reservation.lease_expires == 31.0  # the claim's own lease
        assert ledger.settle_claimed(claim.unit, 0, 80, True, now=2.0) is Fate.COMPLETED
        # a stale claim is reclaimed by its message's next delivery, as any
        assert ledger.claim("run-1", "u1", 0, now=3.0, lease_s=30).claimed
        assert ledger.claim("run-1", "u1", 0, now=40.0, lease_s=30).reason == "stale"
        lost = ledger.reclaim_unit("run-1", "u1", now=40.0)
        assert lost is not None and lost.attempt.reclaimed
        assert ledger.expired_leases("run-1", now=1e12) == []
        balanced(ledger, "run-1")

    # -- the lease index: only units holding a lease, found by expiry
    def test_an_expired_lease_is_reclaimed_exactly_once(self, ledger: Ledger) -> None:
        # Given a claimed attempt whose worker died (its admission's lease ends at 20, its claim's
        # at 31), and a unit whose lease is still live
        ledger.open_run(spec(), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=20)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30)
        ledger.admit("run-1", "u1", 0, now=0.0, lease_s=1_000)
        assert ledger.expired_leases("run-1", now=19.9) == []
        # the sweep looks at the claimed unit when its admission's lease ends (the claim did not
        # move it), and leaves it alone while the claim's lease is live
        assert ledger.expired_leases("run-1", now=20.0) == ["u0"]
        assert ledger.reclaim_expired("run-1", now=30.9) == []
        # When two polls look after the claim's lease expired
        assert ledger.expired_leases("run-1", now=31.0) == ["u0"]
        first = ledger.reclaim_expired("run-1", now=31.0)
        second = ledger.reclaim_expired("run-1", now=32.0)
        # Then the attempt is settled as lost once, and the unit left the index
        assert [(s.unit.unit_id, s.attempt.reclaimed, s.fate) for s in first] == [
            ("u0", True, Fate.RETRY)
        ]
        assert second == []
        assert ledger.expired_leases("run-1", now=10_000.0) == ["u1"]  # only the live lease
        assert ledger.run("run-1").spent == 100
        balanced(ledger, "run-1")

    def test_a_renewed_lease_is_not_reclaimed(self, ledger: Ledger) -> None:
        # Given u0 claimed until 31 (the sweep looks at it at 20) and u1 waiting in its lane
        # until 10
        ledger.open_run(spec(), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=20)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30)
        ledger.admit("run-1", "u1", 0, now=0.0, lease_s=10)
        # When both leases are seen expired, then renewed before the reclaim acts: u0 by its
        # worker handing it back unstarted (unclaim: a fresh lease), u1 claimed by its worker
        assert ledger.expired_leases("run-1", now=35.0) == ["u1", "u0"]  # oldest expiry first
        assert ledger.unclaim("run-1", "u0", 0, now=35.0, lease_s=30)
        assert ledger.claim("run-1", "u1", 0, now=35.0, lease_s=30).claimed
        # Then neither is reclaimed (decided from the fresh records, not the index's entries)
        assert ledger.reclaim_unit("run-1", "u0", now=35.0) is None
        assert ledger.reclaim_unit("run-1", "u1", now=35.0) is None
        assert ledger.reclaim_expired("run-1", now=36.0) == []
        # u1's claim kept its place (its admission's lease, 10): the sweep looks at it, and
        # leaves it alone until its claim's lease ends; u0's unclaim moved it to its new lease
        assert ledger.expired_leases("run-1", now=64.0) == ["u1"]
        assert ledger.expired_leases("run-1", now=65.0) == ["u1", "u0"]
        for uid, claimed in (("u0", False), ("u1", True)):
            unit = ledger.unit("run-1", uid)
            assert unit.state is UnitState.IN_FLIGHT and unit.reservation is not None
            assert unit.reservation.claimed is claimed and unit.reservation.lease_expires == 65.0
        # and the next delivery's claim renews u0's lease again
        assert ledger.claim("run-1", "u0", 0, now=36.0, lease_s=500).claimed
        assert ledger.expired_leases("run-1", now=100.0) == ["u1", "u0"]
        assert ledger.reclaim_unit("run-1", "u0", now=100.0) is None  # claimed until 536
        assert (ledger.run("run-1").spent, ledger.run("run-1").in_flight) == (0, 2)
        balanced(ledger, "run-1")

    def test_settled_and_terminal_units_leave_the_lease_index(self, ledger: Ledger) -> None:
        # Given six units admitted (each takes a lease), two of them claimed
        ledger.open_run(spec(units=6, attempts=2), now=0.0)
        for i in range(6):
            ledger.admit("run-1", f"u{i}", 0, now=0.0, lease_s=100)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30)
        ledger.claim("run-1", "u1", 0, now=1.0, lease_s=30)
        assert len(ledger.expired_leases("run-1", now=1_000.0)) == 6
        # When u0 completes, u1 fails (a retry: pending, no lease), u2 is dead-lettered
        # unclaimed, u3 is dead-lettered claimed, u4's lease is released by a reclaim
        ledger.settle("run-1", "u0", 0, 80, True, now=2.0)
        assert ledger.settle("run-1", "u1", 0, 80, False, now=2.0).fate is Fate.RETRY
        ledger.dead_letter("run-1", "u2", now=3.0)
        ledger.claim("run-1", "u3", 0, now=3.0, lease_s=30)
        ledger.dead_letter("run-1", "u3", now=4.0)
        assert ledger.reclaim_expired("run-1", now=101.0) == []  # u4, u5: released
        # Then no unit holds a lease any more, and the index is empty even far in the future
        assert ledger.expired_leases("run-1", now=1e12) == []
        states = {u.unit_id: u.state for u in ledger.units("run-1")}
        assert states == {
            "u0": UnitState.COMPLETED,
            "u1": UnitState.PENDING,
            "u2": UnitState.DEAD_LETTERED,
            "u3": UnitState.DEAD_LETTERED,
            "u4": UnitState.PENDING,
            "u5": UnitState.PENDING,
        }
        # a retry admitted takes a lease again, and settling it ends it
        ledger.admit("run-1", "u1", 1, now=102.0, lease_s=100)
        assert ledger.expired_leases("run-1", now=202.0) == ["u1"]
        ledger.settle("run-1", "u1", 1, 50, True, now=103.0)
        assert ledger.expired_leases("run-1", now=1e12) == []
        balanced(ledger, "run-1")

    def test_expired_leases_of_an_unknown_run_is_not_found(self, ledger: Ledger) -> None:
        with pytest.raises(NotFound):
            ledger.expired_leases("nope", now=0.0)

    def test_the_lease_index_reads_a_page_at_a_time_from_a_position(self, ledger: Ledger) -> None:
        # Given seven leased units, two pairs of them with the same lease (ties by unit id),
        # one of them past the bound, and another run's leases
        ledger.open_run(spec(units=8), now=0.0)
        ledger.open_run(spec("run-2", units=2), now=0.0)
        for uid, lease in (("u5", 10), ("u2", 30), ("u0", 20), ("u6", 20), ("u3", 40)):
            ledger.admit("run-1", uid, 0, now=0.0, lease_s=lease)
        ledger.admit("run-1", "u1", 0, now=0.0, lease_s=30)
        ledger.admit("run-1", "u4", 0, now=0.0, lease_s=500)  # past the bound
        ledger.admit("run-2", "u0", 0, now=0.0, lease_s=5)
        whole = ledger.expired_leases("run-1", now=100.0)
        assert whole == ["u5", "u0", "u6", "u1", "u2", "u3"]
        # When the index is read a few entries at a time, each page after the last one's key
        for size in (1, 2, 4, 6, 7):
            keys: list[LeaseKey] = []
            after: LeaseKey | None = None
            while True:
                page = ledger.leases_page("run-1", 100.0, after, size)
                assert len(page.keys) <= size
                keys += page.keys
                if not page.more:
                    break
                assert page.keys, "a page that says more follows names where to go on from"
                after = page.keys[-1]
            # Then the pages hold the entries once each, in lease order, with their leases (the
            # order of ties is the index's own: DynamoDB does not promise one)
            assert sorted(k.unit_id for k in keys) == sorted(whole), size
            assert [k.lease for k in keys] == [10.0, 20.0, 20.0, 30.0, 30.0, 40.0]
        # a position between two ties goes on with the second; a position past the last, none
        listed = ledger.leases_page("run-1", 100.0, None, 10).keys
        assert listed[1].lease == listed[2].lease == 20.0
        tie = ledger.leases_page("run-1", 100.0, listed[1], 10)
        assert tie.keys == listed[2:] and not tie.more
        assert ledger.leases_page("run-1", 100.0, listed[-1], 10).keys == []
        with pytest.raises(NotFound):
            ledger.leases_page("nope", 100.0, None, 10)

    # -- batched admission (the fan-out of a manifest chunk)
    @pytest.mark.parametrize("budget", [20_000, 6_050, 100])
    def test_admit_many_decides_as_admit_does_one_by_one(self, ledger: Ledger, budget: int) -> None:
        # Given a run of 150 units (more than one transaction's worth) with some history:
        # u0 in flight, u1 completed
        reference = InMemoryLedger()
        s = spec(units=150, tokens=100, budget=budget)
        for led in (ledger, reference):
            led.open_run(s, now=0.0)
            if budget >= 200:
                led.admit("run-1", "u0", 0, now=1.0)
                led.admit("run-1", "u1", 0, now=1.0)
                led.settle("run-1", "u1", 0, 90, True, now=2.0)
        # When every unit is admitted in one call (out of submission order)
        order = [f"u{i}" for i in (*range(149, 74, -1), *range(75))]
        admissions = ledger.admit_many("run-1", order, now=3.0, lease_s=50.0)
        # Then each decision is the one admit would make one unit at a time, in that order:
        # the budget's units admitted, the first one past it starts the exhaustion, the rest
        # refused; u0 admitted already, u1 terminal
        expected = []
        for uid in order:
            unit = reference.unit("run-1", uid)
            attempt = unit.next_attempt
            expected.append(reference.admit("run-1", uid, attempt, now=3.0, lease_s=50.0))
        assert admissions == expected
        assert ledger.run("run-1") == reference.run("run-1")
        assert ledger.units("run-1") == reference.units("run-1")
        run = ledger.run("run-1")
        assert run.spent + run.reserved <= run.budget
        balanced(ledger, "run-1")
        # and a repeat (a retried chunk) changes nothing
        again = ledger.admit_many("run-1", order, now=4.0, lease_s=50.0)
        assert [a.admitted for a in again] == [a.admitted for a in admissions]
        assert ledger.run("run-1") == run

    def test_admit_many_of_an_unknown_unit_admits_those_before_it(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=3), now=0.0)
        with pytest.raises(NotFound):
            ledger.admit_many("run-1", ["u0", "nope", "u1"], now=1.0)
        assert ledger.unit("run-1", "u0").state is UnitState.IN_FLIGHT
        assert ledger.unit("run-1", "u1").state is UnitState.PENDING
        with pytest.raises(NotFound):
            ledger.admit_many("run-2", ["u0"], now=1.0)

    # -- agent loops: an attempt of many model turns, each settled once (docs/explanation/ledger.md)
    def test_turns_settle_once_in_order_and_spent_is_the_sum_of_their_bills(
        self, ledger: Ledger
    ) -> None:
        # Given an agent unit admitted (its loop's cap, 100, reserved) and claimed as a loop
        ledger.open_run(spec(units=2, tokens=100, budget=1_000), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        claim = ledger.claim_queued("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        assert claim is not None and claim.unit.reservation is not None
        assert claim.unit.reservation.loop and claim.unit.reservation.used == 0
        assert ledger.run("run-1").available == 900
        # When its first turn settles with the turn's log events
        first = [(0, {"type": "turn_started", "turn": 1}), (1, {"type": "model_turn", "n": 1})]
        settled = ledger.settle_turn("run-1", "u0", 0, 1, 30, now=2.0, events=first)
        # Then it is spent, released from the reservation, and available has not moved
        assert settled.settled and settled.run_state is RunState.OPEN
        assert (settled.unit.turns, settled.unit.spent) == (1, 30)
        assert settled.unit == ledger.unit("run-1", "u0")
        assert settled.unit.log_key is not None
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.available) == (30, 70, 900)
        assert ledger.read_log("run-1", "u0") == [event for _, event in first]
        balanced(ledger, "run-1")
        # and settling it again (a redelivery) is a duplicate: nothing written, events included
        again = ledger.settle_turn("run-1", "u0", 0, 1, 30, now=3.0, events=[(2, {"x": 1})])
        assert not again.settled and again.unit == settled.unit
        assert ledger.run("run-1") == run and len(ledger.read_log("run-1", "u0")) == 2
        # out of order is a Conflict, a bad turn or bill is refused, nothing written
        with pytest.raises(Conflict, match="turn 2"):
            ledger.settle_turn("run-1", "u0", 0, 3, 10, now=3.0)
        with pytest.raises(Conflict):
            ledger.settle_turn("run-1", "u0", 1, 2, 10, now=3.0)  # not its attempt
        with pytest.raises(InvalidInput, match="turn"):
            ledger.settle_turn("run-1", "u0", 0, 0, 10, now=3.0)
        with pytest.raises(InvalidInput, match="tokens"):
            ledger.settle_turn("run-1", "u0", 0, 2, -1, now=3.0)
        assert ledger.run("run-1") == run
        # When turns 2..4 settle, the third past what the reservation still holds (an overrun)
        spent = 30
        for turn, tokens, reserved in ((2, 50, 20), (3, 60, 0), (4, 10, 0)):
            settled = ledger.settle_turn("run-1", "u0", 0, turn, tokens, now=3.0 + turn)
            spent += tokens
            run = ledger.run("run-1")
            # Then at every step spent is the sum of the turns' bills, and available drops
            # only by what a turn billed beyond the reservation
            assert (run.spent, run.reserved) == (spent, reserved)
            assert run.available == 1_000 - max(100, spent)
            assert settled.unit.spent == spent and settled.unit.turns == turn
            balanced(ledger, "run-1")
        # When the attempt ends with every turn settled (tokens 0)
        final = ledger.settle("run-1", "u0", 0, 0, True, now=9.0)
        # Then the attempt bills its turns once, and nothing is spent twice
        assert final.fate is Fate.COMPLETED and final.attempt.tokens == 150
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.in_flight, run.completed) == (150, 0, 0, 1)
        assert ledger.settle_turn("run-1", "u0", 0, 4, 10, now=10.0).settled is False
        with pytest.raises(Conflict):
            ledger.settle_turn("run-1", "u0", 0, 5, 10, now=10.0)
        balanced(ledger, "run-1")

    def test_a_loops_final_settlement_bills_what_its_turns_did_not(self, ledger: Ledger) -> None:
        # Given an agent unit whose first attempt settled one turn of 30
        ledger.open_run(spec(units=3, tokens=100, budget=1_000), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        ledger.settle_turn("run-1", "u0", 0, 1, 30, now=2.0)
        # When the attempt fails with 25 billed beyond its turn (a call made, never recorded)
        failed = ledger.settle("run-1", "u0", 0, 25, False, now=3.0)
        # Then the attempt bills 55, the reservation's rest is released, the unit retries
        assert failed.fate is Fate.RETRY and failed.attempt.tokens == 55
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.available) == (55, 0, 945)
        unit = ledger.unit("run-1", "u0")
        assert (unit.state, unit.turns, unit.spent, unit.attempts) == (UnitState.PENDING, 1, 55, 1)
        # and its next attempt goes on from turn 2 (turn 1 is a duplicate)
        ledger.admit("run-1", "u0", 1, now=4.0)
        claimed = ledger.claim("run-1", "u0", 1, now=4.0, lease_s=30, loop=True)
        assert claimed.claimed
        assert not ledger.settle_turn("run-1", "u0", 1, 1, 30, now=5.0).settled
        turn = ledger.settle_turn("run-1", "u0", 1, 2, 40, now=5.0)
        assert turn.settled
        # When it completes from the unit its last turn answered (no read)
        assert ledger.settle_claimed(turn.unit, 1, 5, True, now=6.0) is Fate.COMPLETED
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.completed) == (100, 0, 1)
        assert [a.tokens for a in ledger.attempts("run-1")] == [55, 45]
        balanced(ledger, "run-1")

    def test_a_turns_events_are_written_with_it_or_not_at_all(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        ledger.append_log("run-1", "u0", 0, [{"e": 0}, {"e": 1}])
        # When a turn settles with an event at a seq another worker took
        with pytest.raises(Contended):
            ledger.settle_turn("run-1", "u0", 0, 1, 30, now=2.0, events=[(2, {"e": 2}), (1, {})])
        # Then nothing was written: not the turn, not the books, not its free event
        assert ledger.unit("run-1", "u0").turns == 0 and ledger.run("run-1").spent == 0
        assert ledger.read_log("run-1", "u0") == [{"e": 0}, {"e": 1}]
        balanced(ledger, "run-1")
        # and with free seqs it settles with them
        ok = ledger.settle_turn("run-1", "u0", 0, 1, 30, now=3.0, events=[(2, {"e": 2})])
        assert ok.settled and ledger.read_log("run-1", "u0")[-1] == {"e": 2}
        # an append is all or nothing, each seq only if free
        with pytest.raises(Contended):
            ledger.append_log("run-1", "u0", 2, [{"e": "x"}, {"e": 3}])
        ledger.append_log("run-1", "u0", 3, [{"e": 3}])
        assert [e["e"] for e in ledger.read_log("run-1", "u0")] == [0, 1, 2, 3]
        # (in seq order whatever order they were written in, and unit by unit)
        ledger.append_log("run-1", "u0", 10, [{"e": 10}])
        ledger.append_log("run-1", "u0", 5, [{"e": 5}])
        assert [e["e"] for e in ledger.read_log("run-1", "u0")] == [0, 1, 2, 3, 5, 10]
        assert ledger.read_log("run-1", "u1") == []
        # and what a DynamoDB item cannot hold is refused, naming the event
        with pytest.raises(InvalidInput, match=r"events\[11\].*400 KB|events\[11\].*409,600"):
            ledger.append_log("run-1", "u0", 11, [{"tool": "x" * 410_000}])
        with pytest.raises(InvalidInput, match=r"events\[11\]"):
            ledger.append_log("run-1", "u0", 11, ["not an object"])  # type: ignore[list-item]
        with pytest.raises(InvalidInput, match="seq"):
            ledger.append_log("run-1", "u0", -1, [{}])
        with pytest.raises(InvalidInput, match=r"events\[11\].*not JSON"):
            ledger.append_log("run-1", "u0", 11, [{"text": "\ud800"}])  # not UTF-8
        with pytest.raises(InvalidInput, match=r"events\[3\]"):
            ledger.settle_turn("run-1", "u0", 0, 2, 1, now=4.0, events=[(3, {"x": {1, 2}})])
        with pytest.raises(InvalidInput, match=r"events\[0\].*pair"):
            ledger.settle_turn("run-1", "u0", 0, 2, 1, now=4.0, events=[{"x": 1}])  # type: ignore[list-item]
        assert len(ledger.read_log("run-1", "u0")) == 6
        assert ledger.unit("run-1", "u0").turns == 1

    def test_a_stale_loop_claim_is_taken_over_and_a_live_one_is_busy(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=1_000)
        assert ledger.claim_queued("run-1", "u0", 0, now=1.0, lease_s=30, loop=True) is not None
        ledger.settle_turn("run-1", "u0", 0, 1, 40, now=5.0)
        # a second delivery while the worker lives is busy
        assert ledger.claim("run-1", "u0", 0, now=10.0, lease_s=30, loop=True).reason == "busy"
        # the claim's one write is only for an unclaimed reservation: the rest is read
        assert ledger.claim_queued("run-1", "u0", 0, now=40.0, lease_s=30, loop=True) is None
        # When the worker died and the message comes back after its lease
        taken = ledger.claim("run-1", "u0", 0, now=40.0, lease_s=30, loop=True)
        # Then the next worker takes it over with a lease of its own, the turns kept
        assert taken.claimed and taken.reason == "taken_over"
        res = taken.unit.reservation
        assert res is not None and (res.loop, res.used, res.lease_expires) == (True, 40, 70.0)
        assert taken.unit.turns == 1 and taken.unit == ledger.unit("run-1", "u0")
        assert ledger.claim("run-1", "u0", 0, now=41.0, lease_s=30, loop=True).reason == "busy"
        # and goes on from the next turn; nothing was charged as lost
        assert ledger.settle_turn("run-1", "u0", 0, 2, 10, now=42.0).settled
        assert ledger.attempts("run-1") == [] and ledger.run("run-1").spent == 50
        # a single call's claim of a stale loop reservation is still stale
        assert ledger.claim("run-1", "u0", 0, now=80.0, lease_s=30).reason == "stale"
        balanced(ledger, "run-1")

    def test_a_loop_paused_on_an_exhausting_run_joins_the_remainder_and_resumes_on_top_up(
        self, ledger: Ledger
    ) -> None:
        # Given an agent unit mid-loop when the run's budget runs out
        ledger.open_run(spec(units=2, tokens=100, budget=150), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        assert ledger.settle_turn("run-1", "u0", 0, 1, 40, now=2.0).run_state is RunState.OPEN
        assert not ledger.admit("run-1", "u1", 0, now=3.0).admitted
        assert ledger.run("run-1").state is RunState.EXHAUSTING
        # When its next turn ends: billed, and told the run is no longer open
        turn = ledger.settle_turn("run-1", "u0", 0, 2, 20, now=4.0)
        assert turn.settled and turn.run_state is RunState.EXHAUSTING
        # and the worker pauses it at this boundary
        run = ledger.pause("run-1", "u0", 0, now=5.0)
        # Then its reservation is released, its turns stay spent, and the run closes exhausted
        assert run == ledger.run("run-1")
        assert (run.state, run.spent, run.reserved, run.in_flight, run.remainder) == (
            RunState.EXHAUSTED, 60, 0, 0, 2,
        )  # fmt: skip
        unit = ledger.unit("run-1", "u0")
        assert (unit.state, unit.turns, unit.spent, unit.attempts) == (
            UnitState.REMAINDER, 2, 60, 0,
        )  # fmt: skip
        assert unit.reservation is None and ledger.attempts("run-1") == []
        assert sorted(remainder_of(ledger, "run-1")) == ["u0", "u1"]
        balanced(ledger, "run-1")
        # a repeated pause changes nothing
        assert ledger.pause("run-1", "u0", 0, now=6.0) == run
        # When a top-up resumes the run
        top = ledger.top_up("run-1", 200, now=7.0)
        assert sorted(top.requeue) == ["u0", "u1"] and top.run.state is RunState.OPEN
        # Then the unit is pending, admitted again at its cap, and its loop goes on at turn 3
        assert ledger.unit("run-1", "u0").state is UnitState.PENDING
        assert ledger.admit("run-1", "u0", 0, now=8.0).admitted
        assert ledger.run("run-1").reserved == 100
        ledger.claim("run-1", "u0", 0, now=8.0, lease_s=30, loop=True)
        assert not ledger.settle_turn("run-1", "u0", 0, 2, 20, now=9.0).settled
        assert ledger.settle_turn("run-1", "u0", 0, 3, 30, now=9.0).settled
        assert ledger.settle("run-1", "u0", 0, 0, True, now=10.0).attempt.tokens == 30
        assert ledger.run("run-1").spent == 90
        balanced(ledger, "run-1")

    # -- human gates (docs/agents.md, "Human gates")
    def test_a_parked_loop_keeps_its_reservation_and_a_decision_sends_it_back(
        self, ledger: Ledger
    ) -> None:
        # Given an agent loop whose turn 1 is settled and whose turn 2 asked for a gated call
        ledger.open_run(spec(units=2, tokens=100, budget=1_000), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        ledger.settle_turn("run-1", "u0", 0, 1, 40, now=2.0, events=[(0, {"e": 0})])
        asked = {"type": "approval_requested", "toolUseId": "t1"}
        # When the worker parks it with its request, its lease the approvals' timeout
        run = ledger.park("run-1", "u0", 0, now=3.0, until=3_603.0, events=[(1, asked)])
        # Then the unit awaits approval, its reservation kept and unclaimed, nothing in flight
        assert run == ledger.run("run-1")
        assert (run.in_flight, run.awaiting, run.reserved, run.spent) == (0, 1, 60, 40)
        unit = ledger.unit("run-1", "u0")
        assert unit.state is UnitState.AWAITING_APPROVAL and unit.turns == 1
        res = unit.reservation
        assert res is not None and not res.claimed and res.lease_expires == 3_603.0
        assert ledger.read_log("run-1", "u0") == [{"e": 0}, asked]
        balanced(ledger, "run-1")
        # and no delivery may claim or admit it, and the lease sweep leaves it alone
        assert not ledger.claim("run-1", "u0", 0, now=4.0, lease_s=30, loop=True).claimed
        assert ledger.admit("run-1", "u0", 0, now=4.0).reason == "awaiting_approval"
        assert ledger.reclaim_expired("run-1", now=9_999.0) == []
        assert ledger.unit("run-1", "u0").state is UnitState.AWAITING_APPROVAL
        # (its expired lease is what the approvals' sweep finds)
        assert ledger.expired_leases("run-1", now=9_999.0) == ["u0"]
        # a repeated park changes nothing
        assert ledger.park("run-1", "u0", 0, now=5.0, until=9.0) == run
        # When the decision is recorded with the unit's move out of awaiting_approval
        decided = {"type": "approval_decided", "toolUseId": "t1"}
        with pytest.raises(Contended):  # at a seq taken: nothing written
            ledger.unpark("run-1", "u0", now=6.0, lease_s=30, events=[(1, decided)])
        assert ledger.unit("run-1", "u0").state is UnitState.AWAITING_APPROVAL
        run, unit, queued = ledger.unpark("run-1", "u0", now=6.0, lease_s=30, events=[(2, decided)])
        # Then it is in flight again, unclaimed with a fresh lease, to be sent to its lane
        assert queued and unit == ledger.unit("run-1", "u0") and run == ledger.run("run-1")
        assert (run.in_flight, run.awaiting, run.reserved) == (1, 0, 60)
        res = unit.reservation
        assert unit.state is UnitState.IN_FLIGHT and res is not None and not res.claimed
        assert res.lease_expires == 36.0 and res.loop and res.used == 40
        assert ledger.read_log("run-1", "u0")[-1] == decided
        with pytest.raises(Conflict):  # it is no longer parked
            ledger.unpark("run-1", "u0", now=7.0, lease_s=30, events=[])
        # and the next delivery claims it and goes on from turn 2
        assert ledger.claim("run-1", "u0", 0, now=7.0, lease_s=30, loop=True).claimed
        assert ledger.settle_turn("run-1", "u0", 0, 2, 30, now=8.0).settled
        assert ledger.settle("run-1", "u0", 0, 0, True, now=9.0).fate is Fate.COMPLETED
        assert ledger.run("run-1").spent == 70
        balanced(ledger, "run-1")

    def test_a_drain_does_not_wait_for_a_parked_loop_and_a_late_decision_joins_the_remainder(
        self, ledger: Ledger
    ) -> None:
        # Given a parked loop when the run's budget runs out
        ledger.open_run(spec(units=2, tokens=100, budget=150), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        ledger.settle_turn("run-1", "u0", 0, 1, 40, now=2.0)
        ledger.park("run-1", "u0", 0, now=3.0, until=1_000.0, events=[(0, {"e": 0})])
        # When the other unit is refused: the run exhausts and closes at once (nothing in
        # flight: a drain does not wait for a person)
        assert not ledger.admit("run-1", "u1", 0, now=4.0).admitted
        run = ledger.run("run-1")
        assert (run.state, run.awaiting, run.remainder, run.reserved) == (
            RunState.EXHAUSTED, 1, 1, 60,
        )  # fmt: skip
        assert ledger.unit("run-1", "u0").state is UnitState.AWAITING_APPROVAL
        balanced(ledger, "run-1")
        # When its call is decided after that
        run, unit, queued = ledger.unpark("run-1", "u0", now=5.0, lease_s=30, events=[(1, {})])
        # Then no turn runs: its reservation is released and it joins the remainder
        assert not queued and unit.state is UnitState.REMAINDER and unit.reservation is None
        assert (run.state, run.awaiting, run.remainder, run.reserved, run.spent) == (
            RunState.EXHAUSTED, 0, 2, 0, 40,
        )  # fmt: skip
        assert sorted(remainder_of(ledger, "run-1")) == ["u0", "u1"]
        balanced(ledger, "run-1")
        # and a top-up's resume runs it from its log
        assert sorted(ledger.top_up("run-1", 200, now=6.0).requeue) == ["u0", "u1"]
        assert ledger.admit("run-1", "u0", 0, now=7.0).admitted
        balanced(ledger, "run-1")

    def test_only_a_loops_claimed_attempt_parks(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30)  # a single call's claim
        with pytest.raises(Conflict, match="not an agent loop"):
            ledger.park("run-1", "u0", 0, now=2.0, until=100.0)
        with pytest.raises(Conflict, match="holds no reservation"):
            ledger.park("run-1", "u1", 0, now=2.0, until=100.0)
        with pytest.raises(Conflict, match="not awaiting"):
            ledger.unpark("run-1", "u1", now=2.0, lease_s=30, events=[])
        balanced(ledger, "run-1")

    def test_a_loop_whose_run_was_topped_up_before_its_pause_goes_on(self, ledger: Ledger) -> None:
        # Given a loop told at its turn's end that its run is exhausting
        ledger.open_run(spec(units=2, tokens=100, budget=150), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        assert not ledger.admit("run-1", "u1", 0, now=2.0).admitted
        assert ledger.settle_turn("run-1", "u0", 0, 1, 40, now=3.0).run_state is (
            RunState.EXHAUSTING
        )
        # When a top-up reopens the run before the worker pauses it (the top-up's requeue did
        # not name it: it was in flight)
        assert ledger.top_up("run-1", 500, now=4.0).requeue == ("u1",)
        run = ledger.pause("run-1", "u0", 0, now=5.0)
        # Then nothing is released: the answer is open, and the loop goes on with its claim
        assert run.state is RunState.OPEN and run.in_flight == 1 and run.reserved == 60
        unit = ledger.unit("run-1", "u0")
        assert unit.state is UnitState.IN_FLIGHT and unit.reservation is not None
        assert unit.reservation.claimed
        assert ledger.settle_turn("run-1", "u0", 0, 2, 10, now=6.0).settled
        balanced(ledger, "run-1")

    def test_a_loops_claim_is_released_by_reclaim_and_dead_letter_charging_nothing(
        self, ledger: Ledger
    ) -> None:
        ledger.open_run(spec(units=4, tokens=100, budget=1_000), now=0.0)
        for uid, turn_tokens in (("u0", 40), ("u1", 30), ("u2", 20)):
            ledger.admit("run-1", uid, 0, now=0.0, lease_s=10)
            ledger.claim("run-1", uid, 0, now=1.0, lease_s=30, loop=True)
            ledger.settle_turn("run-1", uid, 0, 1, turn_tokens, now=2.0)
        # When the lease sweep finds u0's worker dead (its claim's lease passed)
        assert ledger.reclaim_expired("run-1", now=20.0) == []  # the claims are live
        ledger.unclaim("run-1", "u2", 0, now=20.0, lease_s=100)  # u2: between deliveries
        assert ledger.reclaim_expired("run-1", now=50.0) == []
        # Then u0 and u1 are released: pending with their turns spent, no attempt charged
        for uid, spent in (("u0", 40), ("u1", 30)):
            unit = ledger.unit("run-1", uid)
            assert (unit.state, unit.turns, unit.spent, unit.attempts) == (
                UnitState.PENDING, 1, spent, 0,
            )  # fmt: skip
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.in_flight) == (90, 80, 1)
        assert ledger.attempts("run-1") == []
        # and an unclaimed loop keeps its turns' tokens with its reservation (u2)
        u2 = ledger.unit("run-1", "u2")
        assert u2.reservation is not None
        assert (u2.reservation.loop, u2.reservation.used, u2.reservation.claimed) == (
            True, 20, False,
        )  # fmt: skip
        again = ledger.claim_queued("run-1", "u2", 0, now=51.0, lease_s=30, loop=True)
        assert again is not None and again.unit.reservation == replace(
            u2.reservation, claimed=True, lease_expires=81.0, sweep_at=120.0
        )
        # When a loop's claimed unit is dead-lettered
        ended = ledger.dead_letter("run-1", "u2", now=52.0)
        # Then it ends with its turns' tokens spent, and no projection charged
        assert ended.state is UnitState.DEAD_LETTERED and ended.spent == 20
        run = ledger.run("run-1")
        assert (run.spent, run.reserved, run.dead_lettered) == (90, 0, 1)
        balanced(ledger, "run-1")

    def test_a_refused_attempt_ends_dead_lettered_without_a_retry(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=3, attempts=3), now=0.0)
        for uid in ("u0", "u1"):
            ledger.admit("run-1", uid, 0, now=0.0)
        # a loop's attempt the model refused (guardrail): not retried, whatever attempts left
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        ledger.settle_turn("run-1", "u0", 0, 1, 30, now=2.0)
        refused = ledger.settle("run-1", "u0", 0, 0, False, now=3.0, retry=False)
        assert refused.fate is Fate.DEAD_LETTERED and refused.attempt.tokens == 30
        assert ledger.unit("run-1", "u0").state is UnitState.DEAD_LETTERED
        assert ledger.settle("run-1", "u0", 0, 0, False, now=4.0).duplicate
        # and from a claim, settled together
        claim = ledger.claim("run-1", "u1", 0, now=1.0, lease_s=30)
        settled = ledger.settle_claimed_many(
            [ClaimedSettlement(claim.unit, 0, 10, False, 5.0, retry=False)]
        )
        assert settled == [Fate.DEAD_LETTERED]
        run = ledger.run("run-1")
        assert (run.dead_lettered, run.retries, run.spent) == (2, 0, 40)
        balanced(ledger, "run-1")

    def test_turns_and_pauses_need_a_loops_reservation(self, ledger: Ledger) -> None:
        ledger.open_run(spec(units=2), now=0.0)
        with pytest.raises(Conflict, match="holds no reservation"):
            ledger.settle_turn("run-1", "u0", 0, 1, 10, now=1.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30)  # a single call's claim
        with pytest.raises(Conflict, match="loop=True"):
            ledger.settle_turn("run-1", "u0", 0, 1, 10, now=2.0)
        with pytest.raises(Conflict, match="loop"):
            ledger.pause("run-1", "u0", 0, now=2.0)
        with pytest.raises(NotFound):
            ledger.settle_turn("run-1", "nope", 0, 1, 10, now=2.0)
        assert ledger.run("run-1").spent == 0
        balanced(ledger, "run-1")

    # -- money: a budget in dollars (docs/explanation/ledger.md, "Money")
    def test_a_budget_in_dollars_admits_exhausts_and_resumes_as_tokens_do(
        self, ledger: Ledger
    ) -> None:
        # Given a run of 3 units projected at 1,000 micro-dollars each, a budget of 2,500
        ledger.open_run(usd_spec(units=3), now=0.0)
        # When two are admitted, the third does not fit what is left: exhaustion begins
        assert ledger.admit("run-1", "u0", 0, now=1.0).admitted
        assert ledger.admit("run-1", "u1", 0, now=1.0).admitted
        refused = ledger.admit("run-1", "u2", 0, now=1.0)
        assert (refused.admitted, refused.reason) == (False, "budget")
        run = ledger.run("run-1")
        assert (run.state, run.reserved, run.available) == (RunState.EXHAUSTING, 2_000, 500)
        # the reservations are in micro-dollars
        u0 = ledger.unit("run-1", "u0").reservation
        assert u0 is not None and (u0.projected, u0.usd) == (1_000, True)
        # and settlement bills the priced usage, in tokens and dollars, releasing the projection
        usage = Usage(input=200, output=100, cache_read=300, cache_write=50)  # 660 micro-dollars
        assert cost_micro(usage, PRICES) == 160 + 400 + 24 + 50 == 634
        first = ledger.settle("run-1", "u0", 0, 650, True, 2.0, priced=priced(usage, PRICES))
        assert (first.attempt.tokens, first.attempt.cost_micro) == (650, 634)
        assert first.attempt.prices == PRICES
        ledger.settle("run-1", "u1", 0, 700, True, 3.0, priced=Priced(900, PRICES))
        run = ledger.run("run-1")
        assert (run.state, run.spent, run.spent_micro, run.reserved) == (
            RunState.EXHAUSTED, 1_350, 1_534, 0,
        )  # fmt: skip
        assert run.available == 2_500 - 1_534
        assert remainder_of(ledger, "run-1") == ["u2"]
        # When topped up by 300 micro-dollars (966 + 300 >= 1,000)
        top = ledger.top_up("run-1", 300, now=4.0)
        assert top.requeue == ("u2",) and top.run.budget == 2_800
        assert ledger.admit("run-1", "u2", 0, now=5.0).admitted
        ledger.settle("run-1", "u2", 0, 90, True, 6.0, priced=Priced(999, PRICES))
        # Then it completes with books exact in both
        run = ledger.run("run-1")
        assert (run.state, run.spent, run.spent_micro) == (RunState.COMPLETED, 1_440, 2_533)
        balanced(ledger, "run-1")

    def test_a_top_up_in_dollars_is_whole_positive_micro_dollars(self, ledger: Ledger) -> None:
        ledger.open_run(usd_spec(units=2, budget=500), now=0.0)
        assert not ledger.admit("run-1", "u0", 0, now=1.0).admitted
        with pytest.raises(InvalidInput) as e:
            ledger.top_up("run-1", 0, now=2.0)
        assert e.value.field == "top_up_usd"
        with pytest.raises(InvalidInput) as e:
            ledger.top_up("run-1", 600, now=2.0, max_budget=1_000)
        assert e.value.field == "top_up_usd" and "at most 500" in e.value.message

    def test_each_attempt_keeps_the_prices_it_was_settled_at(self, ledger: Ledger) -> None:
        # Given a run in tokens whose attempts are priced too (spend shown in both)
        ledger.open_run(spec(units=3, tokens=100, budget=1_000), now=0.0)
        for uid in ("u0", "u1", "u2"):
            ledger.admit("run-1", uid, 0, now=0.0)
        usage = Usage(input=60, output=20)
        # When a deploy changes the prices between two settlements
        ledger.settle("run-1", "u0", 0, 80, True, 1.0, priced=priced(usage, PRICES))
        ledger.settle("run-1", "u1", 0, 80, False, 2.0, priced=priced(usage, DEARER))
        # Then each attempt records its own, and a repeat at other prices changes nothing
        again = ledger.settle("run-1", "u0", 0, 80, True, 3.0, priced=priced(usage, DEARER))
        assert again.duplicate and again.attempt.prices == PRICES
        ledger.settle("run-1", "u2", 0, 50, True, 4.0)  # unpriced: 0, no prices
        kept = {a.unit_id: (a.cost_micro, a.prices) for a in ledger.attempts("run-1")}
        assert kept == {"u0": (128, PRICES), "u1": (160, DEARER), "u2": (0, None)}
        run = ledger.run("run-1")
        # the budget is in tokens: the money is shown, never counted against it
        assert (run.spent, run.spent_micro, run.available) == (210, 288, 1_000 - 210)
        balanced(ledger, "run-1")

    def test_a_lost_attempt_in_dollars_is_billed_its_projection_once(self, ledger: Ledger) -> None:
        ledger.open_run(usd_spec(units=2, budget=5_000), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0, lease_s=1_000)
        assert ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30).claimed
        # When its worker dies and the next delivery reclaims it
        lost = ledger.reclaim_unit("run-1", "u0", now=40.0)
        # Then it is billed its projected tokens and cost, at the submit's prices
        assert lost is not None and lost.attempt.reclaimed
        assert (lost.attempt.tokens, lost.attempt.cost_micro, lost.attempt.prices) == (
            100, 1_000, PRICES,
        )  # fmt: skip
        # and the slow worker's own settlement is a duplicate: counted once
        late = ledger.settle("run-1", "u0", 0, 40, True, 41.0, priced=Priced(300, PRICES))
        assert late.duplicate
        # a dead letter of a claimed attempt settles it as lost the same way
        ledger.admit("run-1", "u1", 0, now=42.0)
        ledger.claim("run-1", "u1", 0, now=42.0, lease_s=30)
        ledger.dead_letter("run-1", "u1", now=43.0)
        run = ledger.run("run-1")
        assert (run.spent, run.spent_micro, run.reserved) == (200, 2_000, 0)
        balanced(ledger, "run-1")

    def test_claimed_attempts_settled_together_keep_their_money(self, ledger: Ledger) -> None:
        reference = InMemoryLedger()
        for led in (ledger, reference):
            led.open_run(usd_spec(units=4, budget=10_000), now=0.0)
            handed = []
            for i in range(3):
                led.admit("run-1", f"u{i}", 0, now=0.0)
                claim = led.claim_queued("run-1", f"u{i}", 0, now=1.0, lease_s=30)
                assert claim is not None
                money = Priced(100 * (i + 1), PRICES)
                handed.append(ClaimedSettlement(claim.unit, 0, 50, i != 1, 2.0, priced=money))
            if led is ledger:
                assert ledger.settle_claimed_many(handed) == [
                    Fate.COMPLETED, Fate.RETRY, Fate.COMPLETED,
                ]  # fmt: skip
            else:
                for c in handed:
                    reference.settle_claimed(
                        c.claimed, c.attempt, c.tokens, c.succeeded, c.now, priced=c.priced
                    )
            # settled again (a duplicate delivery's): nothing
            assert led.settle_claimed_many(handed) == [None, None, None]
        assert ledger.run("run-1") == reference.run("run-1")
        assert ledger.run("run-1").spent_micro == 600
        assert ledger.units("run-1") == reference.units("run-1")
        balanced(ledger, "run-1")

    def test_a_loops_turns_in_dollars_are_priced_as_they_settle(self, ledger: Ledger) -> None:
        ledger.open_run(usd_spec(units=2, micro=1_000, budget=5_000), now=0.0)
        ledger.admit("run-1", "u0", 0, now=0.0)
        ledger.claim("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
        # When two turns settle, priced, the second past what the reservation holds
        assert ledger.settle_turn("run-1", "u0", 0, 1, 30, 2.0, priced=Priced(700, PRICES)).settled
        run = ledger.run("run-1")
        assert (run.spent, run.spent_micro, run.reserved) == (30, 700, 300)
        assert ledger.settle_turn("run-1", "u0", 0, 2, 40, 3.0, priced=Priced(500, PRICES)).settled
        run = ledger.run("run-1")
        assert (run.spent_micro, run.reserved, run.available) == (1_200, 0, 3_800)
        # a turn settled again changes nothing
        assert not ledger.settle_turn(
            "run-1", "u0", 0, 2, 40, 4.0, priced=Priced(9, PRICES)
        ).settled
        # Then the attempt's record bills every turn, in tokens and dollars
        done = ledger.settle("run-1", "u0", 0, 0, True, 5.0, priced=Priced(0, DEARER))
        assert (done.attempt.tokens, done.attempt.cost_micro) == (70, 1_200)
        assert ledger.run("run-1").spent_micro == 1_200
        balanced(ledger, "run-1")

    # -- the reference, differentially
    @pytest.mark.parametrize("seed", range(6))
    def test_random_operations_match_the_in_memory_reference(
        self, ledger: Ledger, seed: int
    ) -> None:
        replay(ledger, seed, steps=120)

    @pytest.mark.parametrize("seed", range(4))
    def test_random_agent_loops_match_the_in_memory_reference(
        self, ledger: Ledger, seed: int
    ) -> None:
        replay(ledger, seed, steps=150, ops=LOOP_OPS)


#: the random operations' units claimed as agent loops (the others as single calls)
AGENT_UNITS = ("u0", "u1", "u2")


def _apply(led: Ledger, op: str, uid: str, attempt: int, now: float, args: Any) -> Any:
    lease, tokens, ok = args
    money = Priced(3 * tokens, PRICES)  # every settlement priced: its cost kept exactly too
    if op == "admit":
        return led.admit("run-1", uid, attempt, now, lease)
    if op == "settle":
        return led.settle("run-1", uid, attempt, tokens, ok, now, priced=money)
    agent = uid in AGENT_UNITS  # claimed as agent loops
    if op == "claim":
        return led.claim("run-1", uid, attempt, now, lease, loop=agent)
    if op == "quick":
        return led.claim_queued("run-1", uid, attempt, now, lease, loop=agent)
    if op == "fast":  # settled from the unit as it stands (the claim's answer, if claimed)
        return led.settle_claimed(led.unit("run-1", uid), attempt, tokens, ok, now, priced=money)
    if op == "unclaim":
        return led.unclaim("run-1", uid, attempt, now, lease)
    if op == "reclaim":
        return led.reclaim_expired("run-1", now)
    if op == "dead":
        return led.dead_letter("run-1", uid, now)
    if op == "leases":
        return led.expired_leases("run-1", now + lease)
    if op == "loop":  # an agent loop's claim (a stale one taken over)
        return led.claim("run-1", uid, attempt, now, lease, loop=True)
    if op == "turn":  # its next turn, or (not ok) the last one again: a duplicate
        turn = max(1, led.unit("run-1", uid).turns + (1 if ok else 0))
        seq = len(led.read_log("run-1", uid))
        events = [(seq, {"turn": turn})]
        return led.settle_turn("run-1", uid, attempt, turn, tokens, now, events, priced=money)
    if op == "pause":
        return led.pause("run-1", uid, attempt, now)
    return led.top_up("run-1", 400, now)


def _outcome(led: Ledger, *call: Any) -> tuple[str, Any]:
    try:
        return "ok", _apply(led, *call)
    except (Conflict, NotFound, InvalidInput, Contended) as e:
        return type(e).__name__, None


OPS = (
    "admit", "admit", "settle", "settle", "claim", "quick", "fast", "unclaim", "reclaim", "dead",
    "top", "leases", "many", "loop", "turn", "pause",
)  # fmt: skip
#: agent loops' operations, mostly turns (test_random_agent_loops_match_the_in_memory_reference)
LOOP_OPS = (
    "admit", "admit", "admit", "quick", "quick", "quick", "loop", *("turn",) * 12, "settle",
    "fast", "unclaim", "reclaim", "pause", "top",
)  # fmt: skip


def replay(ledger: Ledger, seed: int, steps: int, ops: tuple[str, ...] = OPS) -> None:
    """Random operations on ``ledger`` and the reference: same answers, same books."""
    rng = random.Random(seed)
    reference = InMemoryLedger()
    budget = rng.choice([300, 600, 1_200]) * (4 if ops is LOOP_OPS else 1)  # loops: many turns
    s = spec(units=6, tokens=100, budget=budget, attempts=rng.randint(1, 3))
    if seed % 2:  # in dollars: each unit projected at 250 micro-dollars, costs 3 per token
        s = replace(
            usd_spec(units=6, micro=250, budget=budget * 2),
            max_attempts=s.max_attempts,
        )
    assert ledger.open_run(s, now=0.0) == reference.open_run(s, now=0.0)
    now = 0.0
    for _ in range(steps):
        now += rng.choice([0.5, 1.0, 7.0])
        uid = rng.choice(AGENT_UNITS[:2]) if ops is LOOP_OPS else f"u{rng.randrange(6)}"
        unit = reference.unit("run-1", uid)
        attempt = unit.next_attempt
        attempt += rng.choice([0, 0, 0, 0, -1])
        op = rng.choice(ops)
        args = (rng.choice([5.0, 20.0]), rng.randint(0, 150), rng.random() < 0.5)
        if op == "many":  # batched admission against admit() one unit at a time
            uids = rng.sample([f"u{i}" for i in range(6)], rng.randint(1, 6))
            actual = ledger.admit_many("run-1", uids, now, args[0])
            expected = []
            for u in uids:
                record = reference.unit("run-1", u)
                next_attempt = record.next_attempt
                expected.append(reference.admit("run-1", u, next_attempt, now, args[0]))
            assert actual == expected, f"step many {uids} at {now}"
        else:
            expected = _outcome(reference, op, uid, attempt, now, args)
            actual = _outcome(ledger, op, uid, attempt, now, args)
            assert actual == expected, f"step {op} {uid} attempt {attempt} at {now}"
        assert ledger.run("run-1") == reference.run("run-1")
        assert ledger.units("run-1") == reference.units("run-1")
    assert sorted(ledger.attempts("run-1"), key=_akey) == sorted(
        reference.attempts("run-1"), key=_akey
    )
    for i in range(6):
        assert ledger.read_log("run-1", f"u{i}") == reference.read_log("run-1", f"u{i}")
    balanced(ledger, "run-1")


def _akey(a: Any) -> tuple[str, int]:
    return (a.unit_id, a.attempt)
