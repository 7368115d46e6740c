"""The in-memory reference ledger against the shared Ledger contract."""

from __future__ import annotations

import json
import math

import pytest

from swarm.core import codec
from swarm.core.ledger import Fate, scan_leases
from swarm.core.memory import InMemoryLedger
from swarm.core.ports import Ledger
from swarm.core.records import Reservation, UnitRecord, UnitState
from tests.ledger_contract import LedgerContract, spec


class TestInMemoryLedger(LedgerContract):
    @pytest.fixture
    def ledger(self) -> Ledger:
        return InMemoryLedger()


def test_a_scan_finds_the_expired_reservations_the_index_does_not_hold_and_the_next_horizon() -> (
    None
):
    def unit(uid: str, lease: float, sweep_at: float | None, claimed: bool = False) -> UnitRecord:
        res = Reservation(0, 100, lease, claimed=claimed, sweep_at=sweep_at)
        return UnitRecord("r", uid, 100, UnitState.IN_FLIGHT, reservation=res)

    units = [
        unit("late", 90.0, math.inf),  # expired, not in the index
        unit("early", 50.0, math.inf, claimed=True),  # a claim expired: its worker died
        unit("waiting", 300.0, math.inf),  # still waiting: holds the horizon
        unit("running", 500.0, math.inf, claimed=True),  # a live claim: its message comes back
        unit("indexed", 10.0, None),  # the index's: not the scan's
        UnitRecord("r", "pending", 100),
    ]
    assert scan_leases(units, now=100.0) == (["early", "late"], 300.0)
    assert scan_leases(units[:2], now=100.0) == (["early", "late"], None)


def test_the_simulators_state_keeps_a_loops_turns_and_a_refused_attempts_fate() -> None:
    # Given a loop mid-turn and a unit dead-lettered without a retry (attempts left)
    ledger = InMemoryLedger()
    ledger.open_run(spec(units=3, attempts=3), now=0.0)
    for uid in ("u0", "u1"):
        ledger.admit("run-1", uid, 0, now=0.0)
        ledger.claim("run-1", uid, 0, now=1.0, lease_s=30, loop=True)
    ledger.settle_turn("run-1", "u0", 0, 1, 40, now=2.0)
    refused = ledger.settle("run-1", "u1", 0, 5, False, now=3.0, retry=False)
    # When its records go through the state file's codec and back
    runs, units, attempts = ledger.records()
    back = InMemoryLedger.from_records(
        runs,
        [codec.unit_from_doc(json.loads(json.dumps(codec.unit_to_doc(u)))) for u in units],
        [codec.attempt_from_doc(codec.attempt_to_doc(a)) for a in attempts],
    )
    # Then the loop's turns, bill and reservation are kept, and the refusal's fate
    assert back.unit("run-1", "u0") == ledger.unit("run-1", "u0")
    assert back.unit("run-1", "u0").reservation == Reservation(
        0, 100, 31.0, claimed=True, sweep_at=900.0, loop=True, used=40
    )
    again = back.settle("run-1", "u1", 0, 5, False, now=4.0)
    assert again.duplicate and again.fate is refused.fate is Fate.DEAD_LETTERED
