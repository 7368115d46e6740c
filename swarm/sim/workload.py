"""The simulated workload: unit sizes, per-attempt failures and service times, all seeded.

With the defaults this is exactly Lab 6.1's workload: 400 units of 8,000-16,000 tokens, a 4%
per-attempt failure rate, ``180 + tokens // 100`` seconds of worker wall clock per attempt. A
workload can also carry explicit unit sizes (a manifest's ``projected_tokens``, for ``swarm
plan``); its failures are still drawn from the seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from swarm.core.errors import InvalidInput
from swarm.core.records import UnitSpec
from swarm.core.scheduling import ServiceModel


@dataclass(frozen=True)
class Workload:
    units: int = 400
    min_tokens: int = 8_000
    max_tokens: int = 16_000
    failure_rate: float = 0.04
    seed: int = 0
    service: ServiceModel = field(default_factory=ServiceModel)
    sizes: tuple[int, ...] = ()  # explicit unit sizes (a manifest); else drawn from the seed
    ids: tuple[str, ...] = ()  # their unit ids (default unit-00000, unit-00001...)

    def __post_init__(self) -> None:
        if self.units < 1:
            raise InvalidInput("units", f"must be >= 1, got {self.units}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise InvalidInput(
                "tokens", f"need 1 <= min <= max, got {self.min_tokens}..{self.max_tokens}"
            )
        if not 0 <= self.failure_rate < 1:
            raise InvalidInput("failure_rate", f"must be in [0, 1), got {self.failure_rate}")
        if self.sizes and (
            len(self.sizes) != self.units
            or min(self.sizes) != self.min_tokens
            or max(self.sizes) != self.max_tokens
        ):
            raise InvalidInput("sizes", "build a workload of explicit sizes with from_sizes")
        if self.ids and len(self.ids) != self.units:
            raise InvalidInput("ids", f"need one id per unit, got {len(self.ids)} for {self.units}")

    @classmethod
    def from_sizes(
        cls,
        sizes: Sequence[int],
        ids: Sequence[str] = (),
        failure_rate: float = 0.04,
        seed: int = 0,
        service: ServiceModel | None = None,
    ) -> Workload:
        """A workload of given unit sizes (e.g. a manifest's ``projected_tokens``)."""
        if not sizes:
            raise InvalidInput("units", "a workload needs at least one unit")
        for index, size in enumerate(sizes):
            if not isinstance(size, int) or size < 1:
                raise InvalidInput(f"units[{index}].projected_tokens", f"must be >= 1, got {size}")
        return cls(
            units=len(sizes),
            min_tokens=min(sizes),
            max_tokens=max(sizes),
            failure_rate=failure_rate,
            seed=seed,
            service=service or ServiceModel(),
            sizes=tuple(sizes),
            ids=tuple(ids),
        )

    def unit_id(self, index: int) -> str:
        return self.ids[index] if self.ids else f"unit-{index:05d}"

    def tokens(self, index: int) -> int:
        """Token appetite of one unit (model calls, all turns)."""
        if self.sizes:
            return self.sizes[index]
        return random.Random(f"{self.seed}:{index}").randint(self.min_tokens, self.max_tokens)

    def fails(self, index: int, attempt: int) -> bool:
        """Deterministic per (unit, attempt)."""
        return random.Random(f"{self.seed}:{index}:{attempt}").random() < self.failure_rate

    def service_s(self, tokens: int) -> int:
        """Worker wall clock for one attempt (~5 minutes on average for Lab 6.1's units)."""
        return self.service.seconds(tokens)

    def specs(self) -> tuple[UnitSpec, ...]:
        return tuple(UnitSpec(self.unit_id(i), self.tokens(i)) for i in range(self.units))

    @cached_property
    def _index(self) -> dict[str, int]:
        return {self.unit_id(i): i for i in range(self.units)}

    def index_of(self, unit_id: str) -> int:
        return self._index[unit_id]

    @cached_property
    def all_tokens(self) -> tuple[int, ...]:
        return tuple(self.tokens(i) for i in range(self.units))

    @property
    def first_attempt_tokens(self) -> int:
        return sum(self.all_tokens)

    def with_seed(self, seed: int) -> Workload:
        """The same workload with another seed: other sizes (unless explicit) and failures."""
        return replace(self, seed=seed)
