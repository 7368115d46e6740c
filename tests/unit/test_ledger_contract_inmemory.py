"""The in-memory reference ledger against the shared Ledger contract."""

from __future__ import annotations

import math

import pytest

from swarm.core.ledger import scan_leases
from swarm.core.memory import InMemoryLedger
from swarm.core.ports import Ledger
from swarm.core.records import Reservation, UnitRecord, UnitState
from tests.ledger_contract import LedgerContract


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
