"""The register of running work (swarm.core.ports.RunningWork): what the drain view and the
batch status count as running. Run against the in-memory register (tests/unit) and DynamoDB
(tests/integration)."""

from __future__ import annotations

import pytest

from swarm.core.errors import InvalidInput
from swarm.core.ports import RunningUnits, RunningWork


class RunningContract:
    @pytest.fixture
    def register(self) -> RunningWork:
        raise NotImplementedError

    def test_an_empty_register_runs_nothing(self, register: RunningWork) -> None:
        assert register.running(0.0) == RunningUnits(0, 0, {})

    def test_entries_count_by_run_until_they_leave(self, register: RunningWork) -> None:
        register.enter("inv-a", {"run-1": 3, "run-2": 1}, expires_at=100.0, now=0.0)
        register.enter("inv-b", {"run-1": 2}, expires_at=100.0, now=0.0)
        assert register.running(1.0) == RunningUnits(6, 2, {"run-1": 5, "run-2": 1})
        register.leave("inv-a")
        assert register.running(1.0) == RunningUnits(2, 1, {"run-1": 2})
        register.leave("inv-a")  # leaving twice changes nothing
        register.leave("inv-b")
        assert register.running(1.0) == RunningUnits(0, 0, {})

    def test_an_entry_stops_counting_when_it_expires(self, register: RunningWork) -> None:
        # a worker that died never leaves: its entry counts until its claims' lease ends
        register.enter("dead", {"run-1": 4}, expires_at=50.0, now=0.0)
        assert register.running(49.9).units == 4
        assert register.running(50.0) == RunningUnits(0, 0, {})

    def test_many_invocations_count_across_shards(self, register: RunningWork) -> None:
        for n in range(40):
            register.enter(f"inv-{n}", {f"run-{n % 3}": 1}, expires_at=100.0, now=0.0)
        running = register.running(1.0)
        assert (running.units, running.invocations) == (40, 40)
        assert dict(running.by_run) == {"run-0": 14, "run-1": 13, "run-2": 13}

    def test_entering_again_replaces_the_entry(self, register: RunningWork) -> None:
        register.enter("inv-a", {"run-1": 3}, expires_at=100.0, now=0.0)
        register.enter("inv-a", {"run-1": 1}, expires_at=100.0, now=0.0)
        assert register.running(1.0) == RunningUnits(1, 1, {"run-1": 1})

    def test_a_bad_entry_is_refused_by_name(self, register: RunningWork) -> None:
        with pytest.raises(InvalidInput, match="runs"):
            register.enter("inv-a", {"run-1": 0}, expires_at=100.0, now=0.0)
        with pytest.raises(InvalidInput, match="invocation"):
            register.enter("", {"run-1": 1}, expires_at=100.0, now=0.0)
        assert register.running(0.0).units == 0
