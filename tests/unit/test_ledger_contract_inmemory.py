"""The in-memory reference ledger against the shared Ledger contract."""

from __future__ import annotations

import pytest

from swarm.core.memory import InMemoryLedger
from swarm.core.ports import Ledger
from tests.ledger_contract import LedgerContract


class TestInMemoryLedger(LedgerContract):
    @pytest.fixture
    def ledger(self) -> Ledger:
        return InMemoryLedger()
