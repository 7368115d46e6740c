"""The fleet-wide token governor: a token bucket every worker draws from before calling the model,
with priority lanes and AIMD throttle feedback.

Pure arithmetic: :class:`BucketState` (the bucket in memory) and :class:`ShardState` (the same
bucket in the cumulative form the DynamoDB adapter updates with conditional writes); and
:func:`acquire`, a worker's bounded wait on the :class:`~swarm.core.ports.Governor` port. The
design and its arithmetic: docs/governor.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal, localcontext
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


# ---------------------------------------------------------------- shards: the cumulative form

MICRO = Decimal("0.000001")  # tokens and seconds are stored with micro resolution
_CTX = Context(prec=34)
ZERO = Decimal(0)


def micro(value: float | int | Decimal, rounding: str = ROUND_FLOOR) -> Decimal:
    """``value`` as a Decimal of micro units (rounded down unless told otherwise)."""
    with localcontext(_CTX):
        d = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
        return d.quantize(MICRO, rounding=rounding)


@dataclass(frozen=True)
class ShardState:
    """One shard of the bucket, with the credit function C(t) it defines (docs/governor.md)."""

    index: int
    drawn: Decimal
    base_credit: Decimal
    base_time: Decimal
    rate: Decimal  # governed rate of this shard, tokens/s
    capacity: Decimal
    recovery: Decimal  # additive increase, tokens/s per second (this shard's share)
    cut_rate: Decimal | None = None
    cut_at: Decimal = ZERO
    throttles: int = 0
    last_throttle_at: float | None = None

    def _full_at(self) -> Decimal | None:
        """When a cut rate has recovered to the governed rate (None: not cut)."""
        if self.cut_rate is None:
            return None
        with localcontext(_CTX):
            return self.cut_at + (self.rate - self.cut_rate) / self.recovery

    def rate_at(self, t: Decimal) -> Decimal:
        if self.cut_rate is None:
            return self.rate
        with localcontext(_CTX):
            return min(self.rate, self.cut_rate + self.recovery * max(ZERO, t - self.cut_at))

    def _integral(self, a: Decimal, b: Decimal) -> Decimal:
        """Tokens credited between a and b (a <= b, both >= cut_at)."""
        with localcontext(_CTX):
            full = self._full_at()
            if full is None or a >= full:
                return self.rate * (b - a)
            end = min(b, full)
            assert self.cut_rate is not None
            u0, u1 = a - self.cut_at, end - self.cut_at
            linear = self.cut_rate * (end - a) + self.recovery / 2 * (u1 * u1 - u0 * u0)
            return linear + (self.rate * (b - full) if b > full else ZERO)

    def credit(self, t: Decimal) -> Decimal:
        """C(t), rounded down (a rounding error can only under-grant)."""
        if t <= self.base_time:
            return self.base_credit
        with localcontext(_CTX):
            c = self.base_credit + self._integral(self.base_time, t)
            return c.quantize(MICRO, rounding=ROUND_FLOOR)

    def tokens(self, t: Decimal) -> Decimal:
        """Tokens in the bucket at t; negative while tickets are booked ahead (debt)."""
        with localcontext(_CTX):
            return min(self.capacity, self.credit(t) - self.drawn)

    def time_for_credit(self, target: Decimal) -> Decimal:
        """The earliest t with C(t) >= target (rounded up, then checked exactly)."""
        if target <= self.base_credit:
            return self.base_time
        with localcontext(_CTX):
            a = self.base_time
            full = self._full_at()
            if full is not None and a < full:
                c_full = self.base_credit + self._integral(a, full)
                if target <= c_full:
                    assert self.cut_rate is not None
                    # solve recovery/2 u^2 + cut u - (recovery/2 u0^2 + cut u0 + need) = 0
                    u0 = a - self.cut_at
                    need = target - self.base_credit
                    k, c0 = self.recovery, self.cut_rate
                    rhs = k / 2 * u0 * u0 + c0 * u0 + need
                    u = (-c0 + (c0 * c0 + 2 * k * rhs).sqrt()) / k
                    t = self.cut_at + u
                else:
                    t = full + (target - c_full) / self.rate
            else:
                t = a + (target - self.base_credit) / self.rate
            t = t.quantize(MICRO, rounding=ROUND_CEILING)
            while self.credit(t) < target:  # guard against the last digit
                t += MICRO
            return t

    def cooling(self, t: Decimal, cooldown_s: float) -> bool:
        """The rate was cut less than ``cooldown_s`` before ``t``: a throttle now cuts nothing."""
        return self.cut_rate is not None and float(t - self.cut_at) < cooldown_s


def shard_shape(config: GovernorConfig, shards: int) -> tuple[Decimal, Decimal, Decimal]:
    """Each of ``shards`` shards' rate, capacity and recovery: a ``1/shards`` share of each."""
    return (
        micro(config.rate / shards),
        micro(config.bucket_capacity / shards),
        micro(config.recovery_per_s * config.rate / shards),
    )


def initial_shard(config: GovernorConfig, shards: int, index: int, t: Decimal) -> ShardState:
    """Shard ``index`` as it is created at ``t``: the configured initial fill, nothing drawn."""
    rate, capacity, recovery = shard_shape(config, shards)
    return ShardState(
        index=index,
        drawn=ZERO,
        base_credit=micro(config.initial_fill * config.bucket_capacity / shards),
        base_time=t,
        rate=rate,
        capacity=capacity,
        recovery=recovery,
    )


@dataclass(frozen=True)
class ShardDraw:
    """How to draw ``amount`` from a shard as last seen, at ``t`` (docs/governor.md).

    ``wait_s`` set: the shard cannot serve the draw now (no write). Else one conditional write:
    ``full``: the bucket is full, so ``drawn`` becomes ``reset_to`` if ``drawn <= full_mark``;
    otherwise ``drawn`` grows by the amount if ``full_mark < drawn <= limit``.
    """

    amount: Decimal
    floor: Decimal  # the lane's reserve on this shard, in tokens
    credit: Decimal  # C(t)
    tokens: Decimal  # in the bucket at t, as last seen
    full: bool
    full_mark: Decimal  # drawn <= this: the bucket is full
    limit: Decimal
    wait_s: float | None = None

    @property
    def reset_to(self) -> Decimal:
        return self.full_mark + self.amount

    def ready_at(self, after: ShardState) -> Decimal | None:
        """When the drawn tokens are the caller's, from the shard the write left: None if now
        (granted), else a ticket's time."""
        target = after.drawn + self.floor
        return None if self.credit >= target else after.time_for_credit(target)


def plan_draw(
    s: ShardState,
    t: Decimal,
    amount: int,
    reserve: float,
    *,
    horizon_s: float,
    book: bool,
    busy: bool,
) -> ShardDraw:
    """A draw of ``amount`` from a lane keeping ``reserve`` (a fraction of capacity).

    ``book``: the lane may draw into debt up to ``horizon_s`` of refill ahead (a ticket).
    ``busy``: the shard was last seen in debt, so a view that looks full is old: draw as below
    capacity (a wrong guess costs one failed write).
    """
    a = Decimal(amount)
    floor = micro(reserve * float(s.capacity), ROUND_CEILING)
    credit = s.credit(t)
    tokens = min(s.capacity, credit - s.drawn)
    ahead = micro(float(s.rate_at(t)) * horizon_s) if book else ZERO
    full_mark = credit - s.capacity
    if tokens >= s.capacity and not busy:
        return ShardDraw(a, floor, credit, tokens, True, full_mark, full_mark + a)
    limit = credit - a - floor + ahead
    plan = ShardDraw(a, floor, credit, tokens, False, full_mark, limit)
    if s.drawn <= limit:
        return plan
    # + 2 us: ``now`` and the credit are rounded down to micro units, so a caller that sleeps
    # exactly this long finds the tokens there
    short = s.drawn - limit if book else a + floor - tokens
    return replace(plan, wait_s=float(short) / float(s.rate_at(t)) + 2e-6)


def predicted_wait(s: ShardState, t: Decimal, amount: int, reserve: float) -> float:
    """Seconds until the shard, as last seen, holds ``amount`` above the lane's reserve."""
    need = Decimal(amount) + micro(reserve * float(s.capacity)) - s.tokens(t)
    return max(0.0, float(need)) / float(s.rate_at(t))


def cut_rate(config: GovernorConfig, shards: int, s0: ShardState, t: Decimal) -> Decimal:
    """A shard's rate after a throttle at ``t``: multiplied by the decrease factor, not below
    the floor."""
    floor = micro(config.rate * config.min_rate_fraction / shards)
    return max(floor, micro(float(s0.rate_at(t)) * config.decrease_factor))


def rebase(s: ShardState, t: Decimal, cut: Decimal, cooldown_s: float) -> ShardState | None:
    """Bank the credit earned at the old rate, then start the ``cut`` rate (at ``t``, or at
    the shard's base time if later). None: the shard was cut within the cool-down already."""
    at = max(t, s.base_time)
    if s.cooling(at, cooldown_s):
        return None
    return replace(s, base_credit=s.credit(at), base_time=at, cut_rate=cut, cut_at=at)


@dataclass(frozen=True)
class ShardsView:
    """The shards together: the snapshot, and the queue booked ahead of the refill."""

    snapshot: GovernorSnapshot
    backlog_tokens: float  # tokens booked ahead of the refill, over all shards
    backlog_wait_s: float  # how long a booking made now would wait (0 when tokens are there)


def view_of(states: Iterable[ShardState], config: GovernorConfig, t: Decimal) -> ShardsView:
    """The fleet's view of the shards (``states`` in index order: shard 0 counts throttles)."""
    states = list(states)
    tokens = [s.tokens(t) for s in states]
    rate = sum((s.rate_at(t) for s in states), ZERO)
    debt = sum((max(ZERO, -x) for x in tokens), ZERO)
    s0 = states[0]
    snapshot = GovernorSnapshot(
        available=float(sum((max(ZERO, x) for x in tokens), ZERO)),
        capacity=config.bucket_capacity,
        governed_rate=config.rate,
        effective_rate=float(rate),
        throttles=s0.throttles,
        last_throttle_at=s0.last_throttle_at,
    )
    return ShardsView(snapshot, float(debt), float(debt / rate) if rate > 0 else math.inf)


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
