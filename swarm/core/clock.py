"""Clocks. The core never reads the time itself: every decision takes ``now`` from a clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds on a monotonic-enough timeline shared by every piece of one deployment."""

    def now(self) -> float: ...


class SystemClock:
    """Wall-clock time (epoch seconds); what the Lambda functions use."""

    def now(self) -> float:
        return time.time()


class VirtualClock:
    """A clock the simulator moves by hand; it never goes backwards."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {t}")
        self._now = t
