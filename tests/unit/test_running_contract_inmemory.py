"""The in-memory register of running work against the shared contract."""

from __future__ import annotations

import pytest

from swarm.core.memory import MemoryRunning
from swarm.core.ports import RunningWork
from tests.running_contract import RunningContract


class TestMemoryRunning(RunningContract):
    @pytest.fixture
    def register(self) -> RunningWork:
        return MemoryRunning()
