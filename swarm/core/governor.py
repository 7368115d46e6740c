"""The fleet-wide token governor: a token bucket every worker draws from before calling the model.

Workers *wait* rather than collide: a refused draw says how long until the deficit refills, so a
caller sleeps precisely instead of spinning. The governed rate is ``quota TPM / 60 x share``; the
bucket holds at most ``capacity`` tokens (default: one minute of quota, as in Lab 6.1).

Priority lanes: a draw from a lane may only leave the bucket at or above that lane's *reserve*
(tokens kept for higher lanes), so the incident responder is not starved by the overnight batch.

Throttle feedback (AIMD): when the model plane throttles anyway, the effective rate is cut
multiplicatively (at most once per cool-down) and recovers additively over time, back to the
governed rate. Recovery is a function of time, so it costs no writes.

The arithmetic is pure (:class:`BucketState`); :class:`Governor` is the port, implemented in
memory here and on DynamoDB with conditional writes in ``swarm.adapters``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from swarm.core.errors import InvalidInput
from swarm.core.records import Lane

if TYPE_CHECKING:
    from swarm.core.ports import Governor


@dataclass(frozen=True)
class GovernorConfig:
    quota_tpm: int
    share: float = 0.95
    capacity: float | None = None  # tokens; None = one minute of the full quota
    reserves: Mapping[Lane, float] = field(default_factory=dict)  # fraction of capacity per lane
    initial_fill: float = 0.0  # fraction of capacity a fresh bucket starts with
    decrease_factor: float = 0.5  # multiplicative decrease on a throttle
    min_rate_fraction: float = 0.1  # the effective rate never drops below this x governed rate
    recovery_per_s: float = 0.01  # additive increase: fraction of the governed rate per second
    throttle_cooldown_s: float = 5.0  # throttles closer together than this cut the rate once

    def __post_init__(self) -> None:
        if not isinstance(self.quota_tpm, int) or self.quota_tpm <= 0:
            raise InvalidInput(
                "quota_tpm", f"must be a positive whole number, got {self.quota_tpm!r}"
            )
        if not 0 < self.share <= 1:
            raise InvalidInput("governor_share", f"must be in (0, 1], got {self.share!r}")
        if self.capacity is not None and self.capacity <= 0:
            raise InvalidInput("capacity", f"must be > 0 tokens, got {self.capacity!r}")
        for lane, reserve in self.reserves.items():
            if not 0 <= reserve < 1:
                raise InvalidInput(f"reserves.{lane.value}", f"must be in [0, 1), got {reserve!r}")
        if not 0 <= self.initial_fill <= 1:
            raise InvalidInput("initial_fill", f"must be in [0, 1], got {self.initial_fill!r}")
        if not 0 < self.decrease_factor < 1:
            raise InvalidInput(
                "decrease_factor", f"must be in (0, 1), got {self.decrease_factor!r}"
            )
        if not 0 < self.min_rate_fraction <= 1:
            raise InvalidInput(
                "min_rate_fraction", f"must be in (0, 1], got {self.min_rate_fraction!r}"
            )
        if self.recovery_per_s <= 0:
            raise InvalidInput("recovery_per_s", f"must be > 0, got {self.recovery_per_s!r}")

    @property
    def rate(self) -> float:
        """The governed rate in tokens per second."""
        return self.quota_tpm / 60 * self.share

    @property
    def bucket_capacity(self) -> float:
        return float(self.quota_tpm) if self.capacity is None else float(self.capacity)

    def reserve(self, lane: Lane) -> float:
        """Tokens a draw from ``lane`` must leave in the bucket."""
        return self.reserves.get(lane, 0.0) * self.bucket_capacity


@dataclass(frozen=True)
class Draw:
    granted: bool
    wait_s: float  # 0 when granted; else seconds until the deficit refills at the current rate
    available: float  # tokens in the bucket after the decision


@dataclass(frozen=True)
class BucketState:
    """Tokens at ``updated_at``, plus the AIMD cut (if any) the effective rate recovers from."""

    tokens: float
    updated_at: float
    cut_rate: float | None = None  # effective rate right after the last multiplicative decrease
    cut_at: float = 0.0
    throttles: int = 0  # throttles reported since the bucket was created
    last_throttle_at: float | None = None

    @classmethod
    def fresh(cls, config: GovernorConfig, now: float) -> BucketState:
        return cls(tokens=config.initial_fill * config.bucket_capacity, updated_at=now)

    def effective_rate(self, config: GovernorConfig, now: float) -> float:
        if self.cut_rate is None:
            return config.rate
        recovered = self.cut_rate + config.recovery_per_s * config.rate * max(
            0.0, now - self.cut_at
        )
        return min(config.rate, recovered)

    def available(self, config: GovernorConfig, now: float) -> float:
        elapsed = max(0.0, now - self.updated_at)
        refill = self.effective_rate(config, self.updated_at) * elapsed
        return min(config.bucket_capacity, self.tokens + refill)

    def draw(
        self, config: GovernorConfig, amount: float, lane: Lane, now: float
    ) -> tuple[BucketState, Draw]:
        check_amount(config, amount, lane)
        available = self.available(config, now)
        floor = config.reserve(lane)
        if available - amount >= floor:
            left = available - amount
            return replace(self, tokens=left, updated_at=now), Draw(True, 0.0, left)
        deficit = amount + floor - available
        return self, Draw(False, deficit / self.effective_rate(config, now), available)

    def throttled(self, config: GovernorConfig, now: float) -> BucketState:
        """Multiplicative decrease, once per cool-down; recovery is additive over time."""
        state = replace(self, throttles=self.throttles + 1, last_throttle_at=now)
        if self.cut_rate is not None and now - self.cut_at < config.throttle_cooldown_s:
            return state
        current = self.effective_rate(config, now)
        floor = config.rate * config.min_rate_fraction
        # bank the refill earned at the old rate before the rate changes
        state = replace(state, tokens=self.available(config, now), updated_at=now)
        return replace(state, cut_rate=max(floor, current * config.decrease_factor), cut_at=now)


def check_amount(config: GovernorConfig, amount: float, lane: Lane) -> None:
    if amount <= 0:
        raise InvalidInput("amount", f"a draw must be > 0 tokens, got {amount!r}")
    if amount + config.reserve(lane) > config.bucket_capacity:
        raise InvalidInput(
            "amount",
            f"{amount:,.0f} tokens from lane {lane.value} can never be granted: the bucket "
            f"holds {config.bucket_capacity:,.0f} and keeps {config.reserve(lane):,.0f} for "
            "higher lanes; split the unit or raise the governor capacity",
        )


@dataclass(frozen=True)
class GovernorSnapshot:
    """What backpressure decisions read."""

    available: float
    capacity: float
    governed_rate: float
    effective_rate: float
    throttles: int
    last_throttle_at: float | None

    @property
    def utilization_cap(self) -> float:
        """Effective rate as a fraction of the governed rate (1.0 = not slowed by throttles)."""
        return self.effective_rate / self.governed_rate

    def throttled_recently(self, now: float, window_s: float) -> bool:
        return self.last_throttle_at is not None and now - self.last_throttle_at <= window_s


def snapshot_of(state: BucketState, config: GovernorConfig, now: float) -> GovernorSnapshot:
    return GovernorSnapshot(
        available=state.available(config, now),
        capacity=config.bucket_capacity,
        governed_rate=config.rate,
        effective_rate=state.effective_rate(config, now),
        throttles=state.throttles,
        last_throttle_at=state.last_throttle_at,
    )


@dataclass(frozen=True)
class Acquired:
    granted: bool
    waited_s: float
    draws: int


def acquire(
    governor: Governor,
    amount: int,
    lane: Lane,
    now: Callable[[], float],
    sleep: Callable[[float], None],
    max_wait_s: float,
) -> Acquired:
    """Draw ``amount``, sleeping exactly as long as the governor says, for at most ``max_wait_s``.

    A ``granted=False`` result is backpressure, not failure: the caller puts the unit back on its
    queue (with a delay) instead of calling the model.
    """
    start = now()
    draws = 0
    while True:
        draws += 1
        asked_at = now()
        result = governor.draw(amount, lane, asked_at)
        current = now()
        waited = current - start
        if result.granted:
            return Acquired(True, waited, draws)
        # the wait runs from the instant the draw was decided at, not from its return: a draw
        # that made a DynamoDB round trip has already spent part of it (sleeping the whole wait
        # after the round trip picked a ticket up late by the request's latency, and, under
        # load, a whole queue of them at once: a burst above the rate at the model). And the
        # bound is on when the tokens are ours, not on how long the answer took: a ticket that
        # matured while a slow answer was on its way is picked up, not abandoned unused.
        ready_at = asked_at + result.wait_s
        if ready_at - start > max_wait_s:
            governor.cancel(current)  # a ticket booked for us is abandoned
            return Acquired(False, waited, draws)
        # never sleep zero (a float rounding could leave a tiny deficit): at least 1 ms
        sleep(max(ready_at - current, 0.001))


def ticks_until(wait_s: float) -> int:
    """Whole seconds to skip on a 1-second virtual clock without ever skipping past a grant."""
    return max(1, math.floor(wait_s))
