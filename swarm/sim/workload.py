"""The simulated workload: unit sizes, per-attempt failures and service times, all seeded.

With the defaults this is exactly Lab 6.1's workload: 400 units of 8,000-16,000 tokens, a 4%
per-attempt failure rate, ``180 + tokens // 100`` seconds of worker wall clock per attempt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from swarm.core.errors import InvalidInput
from swarm.core.records import UnitSpec


@dataclass(frozen=True)
class Workload:
    units: int = 400
    min_tokens: int = 8_000
    max_tokens: int = 16_000
    failure_rate: float = 0.04
    seed: int = 0

    def __post_init__(self) -> None:
        if self.units < 1:
            raise InvalidInput("units", f"must be >= 1, got {self.units}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise InvalidInput(
                "tokens", f"need 1 <= min <= max, got {self.min_tokens}..{self.max_tokens}"
            )
        if not 0 <= self.failure_rate < 1:
            raise InvalidInput("failure_rate", f"must be in [0, 1), got {self.failure_rate}")

    def unit_id(self, index: int) -> str:
        return f"unit-{index:05d}"

    def tokens(self, index: int) -> int:
        """Token appetite of one unit (model calls, all turns)."""
        return random.Random(f"{self.seed}:{index}").randint(self.min_tokens, self.max_tokens)

    def fails(self, index: int, attempt: int) -> bool:
        """Deterministic per (unit, attempt)."""
        return random.Random(f"{self.seed}:{index}:{attempt}").random() < self.failure_rate

    @staticmethod
    def service_s(tokens: int) -> int:
        """Worker wall clock for one attempt (~5 minutes on average for Lab 6.1's units)."""
        return 180 + tokens // 100

    def specs(self) -> tuple[UnitSpec, ...]:
        return tuple(UnitSpec(self.unit_id(i), self.tokens(i)) for i in range(self.units))

    def index_of(self, unit_id: str) -> int:
        return int(unit_id.rsplit("-", 1)[1])

    @property
    def first_attempt_tokens(self) -> int:
        return sum(self.tokens(i) for i in range(self.units))
