"""The finalizer function's poll (functions/finalizer.py): its sweep stops in time for its task.

The loop's ``Poll`` task times out ``wait_seconds`` after it starts, its Lambda invocation
included; a poll still sweeping then would lose its answer, so the sweep stops within half of
it (and, as every step of the function, a minute before the function's own timeout)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import functions.finalizer as finalizer_handler
from swarm.local.events import LambdaContext


@dataclass
class Clock:
    now: float = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


@dataclass
class RecordingFinalizer:
    """Records the poll's ``keep_going`` and answers the run is open."""

    keep_going: list[Callable[[], bool]] = field(default_factory=list)

    def poll(
        self, run_id: str, now: float, token: str, execution: Any, keep_going: Callable[[], bool]
    ) -> bool:
        self.keep_going.append(keep_going)
        return False


def polled(monkeypatch: pytest.MonkeyPatch, **extra: Any) -> tuple[Clock, Callable[[], bool]]:
    clock, recorder = Clock(), RecordingFinalizer()
    monkeypatch.setattr(finalizer_handler, "time", clock)
    monkeypatch.setattr(finalizer_handler, "finalizer", lambda: recorder)
    event = {"action": "poll", "batch_id": "b-1", "polls": 3, "max_polls": 10, **extra}
    answer = finalizer_handler.poll(
        {**event, "task_token": "t"}, "b-1", None, LambdaContext("finalizer")
    )
    assert answer == {"run_id": "b-1", "waiting": True}
    [keep_going] = recorder.keep_going
    return clock, keep_going


def test_a_polls_sweep_stops_within_half_of_its_tasks_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a poll whose task times out 30 s after it starts (the function has 300 s)
    clock, keep_going = polled(monkeypatch, wait_seconds=30)
    # Then its sweep goes on for 15 s, and stops there: the poll ends long before its task
    clock.now += 14.9
    assert keep_going()
    clock.now += 0.2
    assert not keep_going()


def test_a_poll_of_an_earlier_definition_sweeps_until_the_functions_margin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a poll of an execution started before the definition passed wait_seconds
    clock, keep_going = polled(monkeypatch)
    # Then its sweep stops a minute before the function's 300 s, as before
    clock.now += 239.9
    assert keep_going()
    clock.now += 0.2
    assert not keep_going()
