"""The fleet-wide token governor: a token bucket every worker draws from before calling the model,
with priority lanes and AIMD throttle feedback.

Pure arithmetic: :class:`BucketState` (the bucket in memory) and :class:`ShardState` (the same
bucket in the cumulative form the DynamoDB adapter updates with conditional writes,
:func:`plan_write`); :class:`Ticket` (tokens booked ahead, which a unit carries back to its lane);
:class:`Grant` and :class:`TrueUp` (settling a grant with the model's real count); and
:func:`acquire`, a worker's bounded wait on the :class:`~swarm.core.ports.Governor` port. The
design and its arithmetic: docs/explanation/governor.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal, InvalidOperation, localcontext
from typing import TYPE_CHECKING, Any

from swarm.core.burndown import check_burndown
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
    #: how many quota tokens one output token counts as (Bedrock's token burndown rate): the
    #: workers draw and true up quota tokens (swarm.core.burndown); the bucket itself is in them
    output_burndown: float = 1.0
    #: the model's requests per minute (Bedrock's second quota): None, no request bucket; else
    #: every draw also takes one request per model call it covers from a bucket of requests
    #: governed at ``rpm / 60 x share`` a second, holding one minute of that
    #: (docs/explanation/governor.md, "Requests per minute")
    rpm: int | None = None

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
        if self.rpm is not None and (
            not isinstance(self.rpm, int) or isinstance(self.rpm, bool) or self.rpm < 1
        ):
            raise InvalidInput(
                "quota_rpm", f"must be a whole number of requests per minute >= 1, got {self.rpm!r}"
            )
        try:
            check_burndown(self.output_burndown)
        except ValueError as e:
            raise InvalidInput("output_burndown", str(e)) from None
        cap = self.request_capacity
        if cap is not None:
            for lane, reserve in self.reserves.items():
                if 1 + reserve * cap > cap:
                    raise InvalidInput(
                        "quota_rpm",
                        f"{self.rpm} requests per minute at share {self.share:g} hold "
                        f"{cap:g} requests, too few for one request of lane {lane.value} "
                        f"above its reserve ({reserve:g} of them): raise the model's rpm",
                    )

    @property
    def rate(self) -> float:
        """The governed rate in tokens per second."""
        return self.quota_tpm / 60 * self.share

    @property
    def bucket_capacity(self) -> float:
        return float(self.quota_tpm) if self.capacity is None else float(self.capacity)

    @property
    def fill_s(self) -> float:
        """How long the empty bucket takes to fill at the governed rate: the longest a booking
        is honoured after it is ready, by default (``DynamoDBGovernor.ticket_grace_s``)."""
        return self.bucket_capacity / self.rate

    def reserve(self, lane: Lane) -> float:
        """Tokens a draw from ``lane`` must leave in the bucket."""
        return self.reserves.get(lane, 0.0) * self.bucket_capacity

    @property
    def request_rate(self) -> float | None:
        """The governed rate in requests per second (None: no request bucket)."""
        return None if self.rpm is None else self.rpm / 60 * self.share

    @property
    def request_capacity(self) -> float | None:
        """The request bucket's capacity: one minute of the governed rate (None: no bucket)."""
        return None if self.rpm is None else self.rpm * self.share

    def request_reserve(self, lane: Lane) -> float:
        """Requests a draw from ``lane`` must leave in the request bucket: the lane's reserve is
        the same fraction of either bucket."""
        cap = self.request_capacity
        return 0.0 if cap is None else self.reserves.get(lane, 0.0) * cap


MICRO = Decimal("0.000001")  # tokens and seconds are stored with micro resolution
_CTX = Context(prec=34)
ZERO = Decimal(0)


@dataclass(frozen=True)
class Grant:
    """Tokens a draw gave: what :meth:`~swarm.core.ports.Governor.true_up` needs to settle them
    with what the model really counted (docs/explanation/governor.md, "True-up")."""

    amount: int
    lane: Lane
    since: float  # when the tokens left the bucket's account (a ticket's: when it was booked)
    shard: int = 0
    # the shard's refunded total and count of half-full sightings right after the write that
    # drew the tokens (DynamoDB): a refund is sound only while no write since saw the bucket at
    # least half full (docs/explanation/governor.md, "True-up")
    refunded: Decimal = ZERO
    highs: int = 0
    seq: int = 0  # in memory: the change the grant was (LevelHistory)
    #: with a request bucket: the request it took (1; 0: none), and what bounds giving it back
    #: unused (the call never went out): ``level - credit - refunded`` of the request bucket
    #: right after the write that took it (docs/explanation/governor.md, "Requests per minute")
    requests: int = 0
    requests_mark: Decimal | None = None


@dataclass(frozen=True)
class Ticket:
    """Tokens booked ahead of the refill: the holder's from ``ready_at``.

    Portable: nothing of it lives in the governor client that booked it, so a unit carries it
    back to its lane in its message and any worker's client grants it, without a request, once
    it is ready (and not more than the governor's grace after). ``tag`` is the holder's label (the
    worker binds a ticket to the attempt it was booked for); the governor ignores it.
    """

    governor: str  # the bucket's name: a ticket of another bucket is not honoured
    shard: int
    amount: int
    lane: Lane
    ready_at: float
    position: Decimal  # the shard's position after the booking: ready when the credit reaches it
    base_time: Decimal  # the credit function ``ready_at`` was computed with
    booked_at: float
    refunded: Decimal = ZERO  # as in Grant: the shard's marks right after the booking
    highs: int = 0
    tag: str = ""
    #: a place in its tenant's queue in a reserved lane, not tokens: from ``ready_at`` its holder
    #: draws ahead of that queue (one conditional write that still keeps the lane's reserve),
    #: where a draw without one waits behind it (docs/explanation/governor.md, "Lanes with a reserve
    #: queue, tenant by tenant")
    slot: bool = False
    #: with a request bucket, the request booked with the tokens: ready when the request
    #: bucket's credit reaches ``requests_position`` too; ``requests_mark`` as in Grant
    requests_position: Decimal | None = None
    requests_mark: Decimal | None = None

    def grant(self) -> Grant:
        booked = self.requests_position is not None
        return Grant(
            self.amount,
            self.lane,
            self.booked_at,
            self.shard,
            self.refunded,
            self.highs,
            requests=1 if booked else 0,
            requests_mark=self.requests_mark if booked else None,
        )


def ticket_to_doc(ticket: Ticket) -> dict[str, Any]:
    """A ticket as the JSON a queue message carries."""
    return {
        "governor": ticket.governor,
        "shard": ticket.shard,
        "amount": ticket.amount,
        "lane": ticket.lane.value,
        "ready_at": ticket.ready_at,
        "position": format(ticket.position, "f"),
        "base_time": format(ticket.base_time, "f"),
        "booked_at": ticket.booked_at,
        "refunded": format(ticket.refunded, "f"),
        "highs": ticket.highs,
        "tag": ticket.tag,
        **({"slot": True} if ticket.slot else {}),
        **(
            {
                "requests_position": format(ticket.requests_position, "f"),
                "requests_mark": format(ticket.requests_mark, "f"),
            }
            if ticket.requests_position is not None and ticket.requests_mark is not None
            else {}
        ),
    }


def ticket_from_doc(doc: object) -> Ticket | None:
    """The ticket a queue message carries; None when it carries none or one that cannot be read
    (the unit then draws afresh: its booked tokens go unused, an under-grant, never more)."""
    if not isinstance(doc, dict):
        return None
    try:
        return Ticket(
            governor=str(doc["governor"]),
            shard=int(doc["shard"]),
            amount=int(doc["amount"]),
            lane=Lane(str(doc["lane"])),
            ready_at=float(doc["ready_at"]),
            position=Decimal(str(doc["position"])),
            base_time=Decimal(str(doc["base_time"])),
            booked_at=float(doc["booked_at"]),
            refunded=Decimal(str(doc.get("refunded", "0"))),
            highs=int(doc.get("highs", 0)),
            tag=str(doc.get("tag", "")),
            slot=doc.get("slot") is True,
            requests_position=_decimal_or_none(doc.get("requests_position")),
            requests_mark=_decimal_or_none(doc.get("requests_mark")),
        )
    except (KeyError, TypeError, ValueError, InvalidOperation):
        return None


def _decimal_or_none(raw: object) -> Decimal | None:
    return None if raw is None else Decimal(str(raw))


@dataclass(frozen=True)
class Draw:
    granted: bool
    # 0 when granted; else seconds until the tokens are there for this draw (the queue booked
    # ahead included), or until ``ticket`` is ready
    wait_s: float
    available: float  # tokens in the bucket after the decision
    grant: Grant | None = None  # granted: what a true-up needs
    ticket: Ticket | None = None  # refused: tokens booked for the caller, theirs at its ready_at


@dataclass(frozen=True)
class TrueUp:
    """What a true-up did with a grant's tokens, against what the model really counted."""

    refunded: int = 0  # unused tokens back in the bucket now
    pending: int = 0  # unused tokens that go back with this client's next write to the shard
    dropped: int = 0  # unused tokens that cannot go back without risking an over-grant
    debited: int = 0  # tokens the model used beyond the grant, drawn now


@dataclass(frozen=True)
class BucketState:
    """Tokens at ``updated_at``, plus the AIMD cut (if any) the effective rate recovers from;
    with a request bucket (``GovernorConfig.rpm``), its requests at ``updated_at`` too, which
    refill at the same fraction of their governed rate as the tokens (a throttle cuts both)."""

    tokens: float
    updated_at: float
    cut_rate: float | None = None  # effective rate right after the last multiplicative decrease
    cut_at: float = 0.0
    throttles: int = 0  # throttles reported since the bucket was created
    last_throttle_at: float | None = None
    requests: float = 0.0  # requests in the request bucket (0 and unused without one)
    #: the request bucket's credit so far (its initial fill and every refill, before the
    #: capacity) and the requests given back: what bounds giving one back (``requests_mark``)
    request_credit: float = 0.0
    requests_refunded: float = 0.0

    @classmethod
    def fresh(cls, config: GovernorConfig, now: float) -> BucketState:
        requests = config.initial_fill * (config.request_capacity or 0.0)
        return cls(
            tokens=config.initial_fill * config.bucket_capacity,
            updated_at=now,
            requests=requests,
            request_credit=requests,
        )

    def effective_rate(self, config: GovernorConfig, now: float) -> float:
        if self.cut_rate is None:
            return config.rate
        recovered = self.cut_rate + config.recovery_per_s * config.rate * max(
            0.0, now - self.cut_at
        )
        return min(config.rate, recovered)

    def effective_request_rate(self, config: GovernorConfig, now: float) -> float:
        """The request bucket's refill rate: its governed rate, cut and recovering as the
        tokens' is (0 without a request bucket)."""
        return (config.request_rate or 0.0) * self.effective_rate(config, now) / config.rate

    def available(self, config: GovernorConfig, now: float) -> float:
        elapsed = max(0.0, now - self.updated_at)
        refill = self.effective_rate(config, self.updated_at) * elapsed
        return min(config.bucket_capacity, self.tokens + refill)

    def _request_refill(self, config: GovernorConfig, now: float) -> float:
        return self.effective_request_rate(config, self.updated_at) * max(
            0.0, now - self.updated_at
        )

    def available_requests(self, config: GovernorConfig, now: float) -> float:
        """Requests in the request bucket at ``now`` (0 without one)."""
        cap = config.request_capacity
        if cap is None:
            return 0.0
        return min(cap, self.requests + self._request_refill(config, now))

    def at(self, config: GovernorConfig, now: float) -> BucketState:
        """The same bucket with its refill up to ``now`` banked."""
        if now <= self.updated_at:
            return self
        return replace(
            self,
            tokens=self.available(config, now),
            requests=self.available_requests(config, now),
            request_credit=self.request_credit + self._request_refill(config, now),
            updated_at=now,
        )

    def draw(
        self, config: GovernorConfig, amount: float, lane: Lane, now: float, requests: int = 1
    ) -> tuple[BucketState, Draw]:
        """Draw ``amount`` tokens and, with a request bucket, ``requests`` requests: granted
        only when both are there; refused, the wait is the later of the two."""
        check_amount(config, amount, lane)
        available = self.available(config, now)
        floor = config.reserve(lane)
        counted = config.rpm is not None and requests > 0
        req_available = self.available_requests(config, now)
        req_floor = config.request_reserve(lane)
        req_ok = not counted or req_available - requests >= req_floor - 1e-9
        if available - amount >= floor and req_ok:
            left = available - amount
            state = self.at(config, now)
            if counted:
                state = replace(state, requests=req_available - requests)
            return replace(state, tokens=left, updated_at=now), Draw(True, 0.0, left)
        wait = max(0.0, amount + floor - available) / self.effective_rate(config, now)
        if not req_ok:
            short = requests + req_floor - req_available
            wait = max(wait, short / self.effective_request_rate(config, now))
        return self, Draw(False, wait, available)

    def throttled(self, config: GovernorConfig, now: float) -> BucketState:
        """Multiplicative decrease, once per cool-down; recovery is additive over time. It cuts
        the request bucket's rate with the tokens' (a throttle does not say which was hit)."""
        state = replace(self, throttles=self.throttles + 1, last_throttle_at=now)
        if self.cut_rate is not None and now - self.cut_at < config.throttle_cooldown_s:
            return state
        current = self.effective_rate(config, now)
        floor = config.rate * config.min_rate_fraction
        # bank the refill earned at the old rate before the rate changes
        banked = self.at(config, now)
        state = replace(
            state,
            tokens=banked.tokens,
            requests=banked.requests,
            request_credit=banked.request_credit,
            updated_at=now,
        )
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
    #: the request bucket (None: the governor has none): its governed and effective rates
    #: (requests/s), the requests in it, its capacity
    request_rate: float | None = None
    effective_request_rate: float | None = None
    requests_available: float | None = None
    request_capacity: float | None = None

    @property
    def utilization_cap(self) -> float:
        """Effective rate as a fraction of the governed rate (1.0 = not slowed by throttles)."""
        return self.effective_rate / self.governed_rate

    def throttled_recently(self, now: float, window_s: float) -> bool:
        return self.last_throttle_at is not None and now - self.last_throttle_at <= window_s


def snapshot_of(state: BucketState, config: GovernorConfig, now: float) -> GovernorSnapshot:
    return GovernorSnapshot(
        available=max(0.0, state.available(config, now)),  # in debt after an overrun's debit
        capacity=config.bucket_capacity,
        governed_rate=config.rate,
        effective_rate=state.effective_rate(config, now),
        throttles=state.throttles,
        last_throttle_at=state.last_throttle_at,
        request_rate=config.request_rate,
        effective_request_rate=(
            None if config.rpm is None else state.effective_request_rate(config, now)
        ),
        requests_available=(
            None if config.rpm is None else max(0.0, state.available_requests(config, now))
        ),
        request_capacity=config.request_capacity,
    )


class LevelHistory:
    """The in-memory bucket's refund bound (docs/explanation/governor.md, "True-up").

    A refund of ``R`` unused tokens of a grant is sound when, at every instant since the grant,
    the bucket's level plus the refunds given back after that instant plus ``R`` stayed within
    capacity: then a bucket debited with what the model really used would never have overflowed
    either, and the refund makes this bucket exactly that one. Between two changes the level
    only rises (refill), so it is enough to remember the level just before each change (and
    just after each grant), net of the refunds so far (the *gross* level), as a stack of suffix
    maxima numbered by change. Entries older than ``keep_s`` are forgotten; a grant older than
    what is remembered gets no refund.
    """

    def __init__(self, keep_s: float = 3_600.0) -> None:
        self.keep_s = keep_s
        self.refunded = 0.0  # refunds given back so far
        self.seq = 0  # changes seen so far
        self._peaks: deque[tuple[int, float, float]] = deque()  # (seq, time, gross), decreasing
        self._forgotten = -1  # entries up to this seq were forgotten

    def observe(self, t: float, level: float) -> int:
        """Remember the level at ``t`` (just before a change, or just after a grant); returns
        the change's number."""
        self.seq += 1
        gross = level - self.refunded
        while self._peaks and self._peaks[-1][2] <= gross:
            self._peaks.pop()
        self._peaks.append((self.seq, t, gross))
        while len(self._peaks) > 1 and self._peaks[0][1] < t - self.keep_s:
            self._forgotten = self._peaks.popleft()[0]
        return self.seq

    def room(self, since: int, level_now: float, capacity: float) -> float:
        """The most of a refund for the grant observed as change ``since`` (its level just after)
        that may go back now."""
        if since <= self._forgotten:
            return 0.0
        highest = level_now - self.refunded
        for seq, _, gross in self._peaks:  # the first entry from ``since`` on dominates the rest
            if seq >= since:
                highest = max(highest, gross)
                break
        return max(0.0, capacity - self.refunded - highest)


# ---------------------------------------------------------------- shards: the cumulative form


def micro(value: float | int | Decimal, rounding: str = ROUND_FLOOR) -> Decimal:
    """``value`` as a Decimal of micro units (rounded down unless told otherwise)."""
    with localcontext(_CTX):
        d = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
        return d.quantize(MICRO, rounding=rounding)


@dataclass(frozen=True)
class ShardState:
    """One shard of the bucket, with the credit function C(t) it defines
    (docs/explanation/governor.md).

    Its position ``drawn + lost - refunded`` is what the bucket has given out: ``drawn`` (tokens
    drawn, debits included), ``lost`` (refill lost to the capacity), ``refunded`` (unused tokens
    given back); the first two only grow, and ``highs`` counts the writes that saw the bucket
    at least half full (a refund needs none since its grant).
    """

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
    lost: Decimal = ZERO
    refunded: Decimal = ZERO
    highs: int = 0
    #: stored before lost/refunded/highs or the lanes' queues existed: add them before a write
    legacy: bool = False
    #: per reserved lane (its name), each tenant's queue in it: the credit C(t) must reach for
    #: every unit the tenant queued to have its tokens (:func:`plan_slot`)
    queues: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)
    #: the shard's request bucket (``GovernorConfig.rpm``), in the same cumulative form and the
    #: same item: its credit function shares ``base_time`` and ``cut_at`` and is cut in the same
    #: proportion (None: no request bucket)
    requests: ShardState | None = None

    @property
    def position(self) -> Decimal:
        """Tokens the shard has given out (net of refunds and of refill lost to capacity)."""
        with localcontext(_CTX):
            return self.drawn + self.lost - self.refunded

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
            return min(self.capacity, self.credit(t) - self.position)

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


def request_shape(config: GovernorConfig, shards: int) -> tuple[Decimal, Decimal, Decimal] | None:
    """Each shard's request bucket's rate, capacity and recovery (None: no request bucket)."""
    if config.request_rate is None or config.request_capacity is None:
        return None
    return (
        micro(config.request_rate / shards),
        micro(config.request_capacity / shards),
        micro(config.recovery_per_s * config.request_rate / shards),
    )


def initial_shard(config: GovernorConfig, shards: int, index: int, t: Decimal) -> ShardState:
    """Shard ``index`` as it is created at ``t``: the configured initial fill, nothing drawn."""
    rate, capacity, recovery = shard_shape(config, shards)
    requests: ShardState | None = None
    shape = request_shape(config, shards)
    if shape is not None:
        requests = ShardState(
            index=index,
            drawn=ZERO,
            base_credit=micro(config.initial_fill * (config.request_capacity or 0.0) / shards),
            base_time=t,
            rate=shape[0],
            capacity=shape[1],
            recovery=shape[2],
        )
    return ShardState(
        index=index,
        drawn=ZERO,
        base_credit=micro(config.initial_fill * config.bucket_capacity / shards),
        base_time=t,
        rate=rate,
        capacity=capacity,
        recovery=recovery,
        requests=requests,
    )


@dataclass(frozen=True)
class Refund:
    """Unused tokens of a grant, waiting to go back to its shard with the next write there;
    with ``requests``, the grant's request too (its call never went out)."""

    shard: int
    amount: Decimal
    refunded: Decimal  # the grant's marks (Grant.refunded, Grant.highs)
    highs: int
    requests: int = 0
    requests_mark: Decimal | None = None  # Grant.requests_mark


@dataclass(frozen=True)
class RequestWrite:
    """The request bucket's part of a :class:`ShardWrite`, in the same ``UpdateItem``::

    SET r_drawn = r_drawn + :r_add, r_lost = :r_lost [, r_refunded = r_refunded + :r_refund]
    IF r_lost <= :r_lost AND r_refunded <= :r_refunded_max [AND r_drawn <= :r_drawn_max]
    """

    add: Decimal  # requests drawn
    lost: Decimal
    refund: Decimal  # requests given back (calls that never went out)
    refunded_max: Decimal
    drawn_max: Decimal | None
    credit: Decimal
    floor: Decimal
    #: requests of the refund that can never go back (the bound only tightens with time and
    #: refunds): the client drops them
    dropped: int = 0


@dataclass(frozen=True)
class ShardWrite:
    """One conditional ``UpdateItem`` of a shard as last seen, at ``t``
    (docs/explanation/governor.md)::

        SET drawn = drawn + :add, lost = :lost [, refunded = refunded + :refund]
            [ADD highs 1]
        IF lost <= :lost AND refunded <= :refunded_max [AND drawn <= :drawn_max]
           [AND drawn >= :drawn_min] [AND base_time = :base_time] [AND highs = :highs_is]

    ``wait_s`` set: the shard cannot serve the draw now; no write.
    """

    add: Decimal  # tokens drawn (a draw, or a debit)
    lost: Decimal
    refund: Decimal
    refunded_max: Decimal
    drawn_max: Decimal | None  # a draw's limit; None: a debit, which lands in any case
    drawn_min: Decimal | None  # the caller's guess of ``drawn`` the bounds were computed with
    base_time: Decimal | None  # a draw's credit function
    highs_is: int | None  # a refund's: no write saw the bucket half full since its grant
    saw_high: bool  # this write saw the bucket at least half full: count it
    credit: Decimal  # C(t)
    floor: Decimal  # the lane's reserve on this shard, in tokens
    wait_s: float | None = None
    requests: RequestWrite | None = None  # the request bucket's part (None: none drawn)

    def ready_at(self, after: ShardState) -> Decimal | None:
        """When the drawn tokens (and requests) are the caller's, from the shard the write left:
        None if now (granted), else a ticket's time: the later of the two buckets'."""
        target = after.position + self.floor
        at = None if self.credit >= target else after.time_for_credit(target)
        r, rw = after.requests, self.requests
        if r is None or rw is None:
            return at
        rtarget = r.position + rw.floor
        if rw.credit >= rtarget:
            return at
        rat = r.time_for_credit(rtarget)
        return rat if at is None else max(at, rat)


#: with a request bucket, a full bucket's ``lost`` is raised to a whole multiple of this
#: fraction of its capacity (docs/explanation/governor.md, "Requests per minute")
FULL_QUANTUM = Decimal("0.01")


def _full_quantum(needed: Decimal, cap: Decimal) -> Decimal:
    """``needed`` rounded up to a whole multiple of ``FULL_QUANTUM x cap``.

    With two buckets, the one that does not bind sits full, and every write raises its
    ``lost``: raised exactly, the value depends on the ``drawn`` its writer saw, so writers with
    views a few draws apart would write different values and all but the first would fail
    (``lost <= :lost``). Rounded up, they write the same value for a while: the bucket holds up to
    1% of its capacity less (an under-grant, only while it is full, i.e. not binding)."""
    with localcontext(_CTX):
        q = (cap * FULL_QUANTUM).quantize(MICRO, rounding=ROUND_CEILING)
        if q <= 0:
            return needed
        return (needed / q).to_integral_value(rounding=ROUND_CEILING) * q


def _grid_after(t: Decimal, grid_s: float) -> Decimal:
    """The first multiple of ``grid_s`` at or after ``t``."""
    if grid_s <= 0:
        return t
    with localcontext(_CTX):
        g = micro(grid_s)
        return (t / g).to_integral_value(rounding=ROUND_CEILING) * g


def plan_write(
    s: ShardState,
    t: Decimal,
    *,
    add: int,
    reserve: float = 0.0,
    ahead: Decimal | None = ZERO,
    refund: Refund | None = None,
    margin_s: float = 0.0,
    grid_s: float = 0.0,
    drawn_floor: Decimal | None = None,
    requests: int = 0,
) -> ShardWrite:
    """The write that draws ``add`` tokens at ``t`` from a lane keeping ``reserve`` (a fraction
    of capacity), booking up to ``ahead`` tokens past the refill (a ticket); ``ahead=None``: a
    debit, drawn whatever the bucket holds. It carries as much of ``refund`` as is sound.

    * ``lost``: a view that shows the bucket over capacity raises ``lost`` so that it holds
      exactly its capacity, at the next multiple of ``grid_s`` (a little early: an under-grant
      of at most ``grid_s`` of refill), so every worker that saw the same full bucket writes the
      same value and none of them fails; ``refunded <= :refunded_max`` keeps that value right
      against refunds that landed meanwhile.
    * a write certifies (by a condition) that the bucket held less than half its capacity just
      before it, ``margin_s`` of clock included, or counts ``highs`` if it cannot.
    * ``drawn_floor``: the caller's guess that ``drawn`` has grown to at least this since its view
      (other workers booked meanwhile); the bounds above use it, under ``drawn >= :drawn_min``,
      so a view that is merely old still certifies and carries refunds (a wrong guess costs the
      failed write the old view would have cost).
    * a refund is sound while no write since its grant counted ``highs`` (then the bucket stayed
      below half full) and neither the refunds landed since nor the present can make it
      overflow (docs/explanation/governor.md, "True-up"); it never exceeds ``add``, so a request the
      SDK repeats after a lost answer takes back at least what it gives.
    * ``requests``: with a request bucket (``s.requests``), the requests the write draws from it
      in the same write (:func:`plan_requests`); the draw waits for the later of the two.
    """
    a = Decimal(add)
    with localcontext(_CTX):
        cap = s.capacity
        floor = micro(reserve * float(cap), ROUND_CEILING)
        credit = s.credit(t)
        late = s.credit(t + micro(margin_s, ROUND_CEILING))
        # what ``drawn`` is at least now: as last seen, or the caller's guess (then a condition)
        drawn = s.drawn if drawn_floor is None else max(s.drawn, drawn_floor)
        lost = s.lost
        if credit - cap - drawn + s.refunded > s.lost:  # over capacity as last seen
            needed = s.credit(_grid_after(t, grid_s)) - cap - drawn + s.refunded
            if s.requests is not None:  # two buckets: one of them usually sits full
                needed = _full_quantum(needed, cap)
            lost = max(s.lost, needed)
        # ``lost`` must keep the level at most capacity however many refunds landed meanwhile
        refunded_max = drawn + lost - credit + cap
        half = cap / 2
        back = ZERO
        highs_is: int | None = None
        if refund is not None and refund.shard == s.index and refund.highs == s.highs:
            # below half full at every write since the grant, so refunds landed since plus this
            # one stay within the other half; and the present bucket, by t + margin, cannot
            # overflow with it
            room = min(refund.refunded + half, cap - late + drawn + s.lost) - s.refunded
            back = max(ZERO, min(refund.amount, room, a))
            if back > 0:
                highs_is = s.highs
                refunded_max = min(
                    refunded_max,
                    refund.refunded + half - back,
                    cap - back - late + drawn + s.lost,
                )
        saw_high = late - (drawn + s.lost - s.refunded) > half - MICRO
        if not saw_high:  # below half full until t + margin, whatever refunds land: certify it
            refunded_max = min(refunded_max, drawn + s.lost - late + half - MICRO)
        drawn_max: Decimal | None = None
        wait_s: float | None = None
        if ahead is not None:
            drawn_max = credit - floor + ahead - a - lost + s.refunded + back
            if s.drawn > drawn_max:
                # until the tokens are there for it, the queue booked ahead included; + 2 us:
                # ``now`` and the credit are rounded down to micro units, so a caller that sleeps
                # exactly this long finds the tokens there
                short = s.drawn + lost - s.refunded + a + floor - credit
                wait_s = max(0.0, float(short) / float(s.rate_at(t))) + 2e-6
            elif drawn > drawn_max:  # the guess leaves no room for the draw: plan without it
                return plan_write(
                    s,
                    t,
                    add=add,
                    reserve=reserve,
                    ahead=ahead,
                    refund=refund,
                    margin_s=margin_s,
                    grid_s=grid_s,
                    requests=requests,
                )
    rw: RequestWrite | None = None
    if s.requests is not None and requests > 0:
        ahead_r = None
        if ahead is not None:  # the same horizon of the request bucket's rate
            with localcontext(_CTX):
                ahead_r = micro(ahead * s.requests.rate_at(t) / s.rate_at(t))
        rw, wait_r = plan_requests(
            s.requests, t, requests, reserve, ahead_r, refund, margin_s, grid_s
        )
        if wait_r is not None:
            wait_s = wait_r if wait_s is None else max(wait_s, wait_r)
    return ShardWrite(
        add=a,
        lost=lost,
        refund=back,
        refunded_max=refunded_max,
        drawn_max=drawn_max,
        drawn_min=drawn if drawn > s.drawn else None,
        base_time=s.base_time if ahead is not None else None,
        highs_is=highs_is,
        saw_high=saw_high,
        credit=credit,
        floor=floor,
        wait_s=wait_s,
        requests=rw,
    )


def plan_requests(
    r: ShardState,
    t: Decimal,
    n: int,
    reserve: float,
    ahead: Decimal | None,
    refund: Refund | None,
    margin_s: float,
    grid_s: float,
) -> tuple[RequestWrite, float | None]:
    """The request bucket's part of a write drawing ``n`` requests at ``t`` (``ahead``: how far
    past the refill it may book; None: a draw that lands whatever the bucket holds), and the
    wait if the requests are not there.

    As for tokens: ``lost`` keeps the bucket at its capacity (on the grid), and the draw's
    ``r_drawn <= :r_drawn_max`` leaves its position at most the credit less the lane's reserve
    (plus what it may book). A refund (requests of grants whose calls never went out) goes back
    only if the bucket, had nobody drawn since the grant, would still hold it by ``t +
    margin_s``: ``refunded + back <= capacity - C(t + margin) - mark``, ``mark`` being the
    grant's ``level - credit - refunded`` right after its write. Since the grant the level rose
    by at most the credit and the refunds landed, so the bucket with that request never drawn
    would never have overflowed: giving it back mints nothing.
    """
    a = Decimal(n)
    with localcontext(_CTX):
        cap = r.capacity
        floor = micro(reserve * float(cap), ROUND_CEILING)
        credit = r.credit(t)
        lost = r.lost
        if credit - cap - r.drawn + r.refunded > r.lost:
            needed = r.credit(_grid_after(t, grid_s)) - cap - r.drawn + r.refunded
            lost = max(r.lost, _full_quantum(needed, cap))
        refunded_max = r.drawn + lost - credit + cap
        back = ZERO
        dropped = 0
        if (
            refund is not None
            and refund.shard == r.index
            and refund.requests > 0
            and refund.requests_mark is not None
        ):
            late = r.credit(t + micro(margin_s, ROUND_CEILING))
            bound = cap - late - refund.requests_mark  # refunded + back may reach this
            room = (bound - r.refunded).to_integral_value(rounding=ROUND_FLOOR)
            back = max(ZERO, min(Decimal(refund.requests), a, room))
            dropped = max(0, refund.requests - max(0, int(room)))
            if back > 0:
                refunded_max = min(refunded_max, bound - back)
        drawn_max: Decimal | None = None
        wait_s: float | None = None
        if ahead is not None:
            drawn_max = credit - floor + ahead - a - lost + r.refunded + back
            if r.drawn > drawn_max:
                short = r.drawn + lost - r.refunded + a + floor - credit
                wait_s = max(0.0, float(short) / float(r.rate_at(t))) + 2e-6
    return RequestWrite(a, lost, back, refunded_max, drawn_max, credit, floor, dropped), wait_s


def requests_mark(r: ShardState) -> Decimal:
    """A grant's mark on the request bucket ``r`` as its write left it: ``level - credit -
    refunded`` = ``-(drawn + lost)`` (:func:`plan_requests`)."""
    with localcontext(_CTX):
        return -(r.drawn + r.lost)


@dataclass(frozen=True)
class SlotWrite:
    """A place in a tenant's queue in a reserved lane, planned on a view of the shard
    (docs/explanation/governor.md, "Lanes with a reserve queue, tenant by tenant")::

        extend:  SET q.#tenant = q.#tenant + :step  IF q.#tenant >= :start
        start:   SET q.#tenant = :start + :step     IF attribute_not_exists(q.#tenant)
                                                       OR q.#tenant < :start

    ``start`` is the shard's position plus the lane's reserve, as seen: the credit at which a
    unit with nothing queued ahead of it would have its tokens' first token. Each tenant queues
    apart, at its share of the refill: its units are ``step = amount x tenants`` of credit apart,
    ``tenants`` being the tenants queued in the lane as seen (this one included), so a tenant
    that comes to a lane where another has queued a thousand units is served within a few of
    theirs, not behind them all. A tenant's units queueing at once all extend its queue
    (additions commute: none of their writes fails). The slot is the tenant's queue end after
    the write: ready when C(t) reaches it. The shares are an estimate made at booking time (a
    tenant that comes later takes its share of tokens slots booked before it counted on): a
    slot whose tokens are not there when it comes keeps its place until they are.
    ``stale``: tenants whose queues were served more than a bucket ago, removed by the write.
    """

    extend: bool
    start: Decimal
    step: Decimal
    target: Decimal  # the tenant's queue end after the write, if the view is current
    stale: tuple[str, ...] = ()


#: the most served tenants' queues one slot write removes
MAX_STALE_REMOVALS = 8


def plan_slot(
    s: ShardState, t: Decimal, lane: Lane, tenant: str, amount: int, reserve: float
) -> SlotWrite:
    plan, _ = plan_places(s, t, lane, tenant, (amount,), reserve)
    return plan


def plan_places(
    s: ShardState, t: Decimal, lane: Lane, tenant: str, amounts: Sequence[int], reserve: float
) -> tuple[SlotWrite, tuple[Decimal, ...]]:
    """Places for a tenant's units, in order, in one write: as if each took its place in turn
    (:class:`SlotWrite`; each a step of its amount x the tenants queued further), the write's
    ``step`` their sum. Also each unit's place, as the credit from the queue's end before the
    write (``target - step``) to the queue's end after that unit: its slot."""
    if not amounts:
        raise InvalidInput("amounts", "at least one unit's amount")
    with localcontext(_CTX):
        floor = micro(reserve * float(s.capacity), ROUND_CEILING)
        start = s.position + floor
        queues = s.queues.get(lane.value, {})
        credit = s.credit(t)
        queued = {u for u, end in queues.items() if end > credit} | {tenant}
        ends: list[Decimal] = []
        step = ZERO
        for amount in amounts:
            step += Decimal(amount) * len(queued)
            ends.append(step)
        stale = tuple(
            sorted(u for u, end in queues.items() if end < credit - s.capacity and u != tenant)
        )[:MAX_STALE_REMOVALS]
        own = queues.get(tenant)
        if own is not None and own >= start:
            return SlotWrite(True, start, step, own + step, stale), tuple(ends)
        return SlotWrite(False, start, step, start + step, stale), tuple(ends)


def ticket_ready_at(ticket: Ticket, seen: ShardState | None) -> float:
    """When a ticket's tokens (and request) are its holder's: the time it was booked with, or
    later if the shard's rate was cut since (the holder's client has seen a newer credit
    function)."""
    if seen is None or seen.base_time <= ticket.base_time:
        return ticket.ready_at
    at = max(ticket.ready_at, float(seen.time_for_credit(ticket.position)))
    if seen.requests is not None and ticket.requests_position is not None:
        at = max(at, float(seen.requests.time_for_credit(ticket.requests_position)))
    return at


def booking_ahead(s: ShardState, t: Decimal, horizon_s: float) -> Decimal:
    """How far past the refill a booking may go: ``horizon_s`` of the shard's rate at ``t``."""
    return micro(float(s.rate_at(t)) * horizon_s)


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
    requests = s.requests
    if requests is not None:  # cut in the same proportion: a throttle does not say which limit
        with localcontext(_CTX):
            cut_r = micro(cut * requests.rate / s.rate)
        requests = replace(
            requests, base_credit=requests.credit(at), base_time=at, cut_rate=cut_r, cut_at=at
        )
    return replace(
        s, base_credit=s.credit(at), base_time=at, cut_rate=cut, cut_at=at, requests=requests
    )


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
    buckets = [s.requests for s in states if s.requests is not None]
    if buckets and config.rpm is not None:
        snapshot = replace(
            snapshot,
            request_rate=config.request_rate,
            effective_request_rate=float(sum((r.rate_at(t) for r in buckets), ZERO)),
            requests_available=float(sum((max(ZERO, r.tokens(t)) for r in buckets), ZERO)),
            request_capacity=config.request_capacity,
        )
    return ShardsView(snapshot, float(debt), float(debt / rate) if rate > 0 else math.inf)


@dataclass(frozen=True)
class Acquired:
    granted: bool
    waited_s: float  # how long the caller held on for the tokens
    draws: int
    grant: Grant | None = None  # granted: what the true-up after the call needs
    # refused: tokens booked for the caller (it carries them back to its lane), and when it
    # should try again: when its tokens will really be there, the queue booked ahead included
    ticket: Ticket | None = None
    retry_after_s: float = 0.0


def acquire(
    governor: Governor,
    amount: int,
    lane: Lane,
    now: Callable[[], float],
    sleep: Callable[[float], None],
    max_wait_s: float,
    ticket: Ticket | None = None,
    tenant: str = "",
) -> Acquired:
    """Draw ``amount`` (with the ``ticket`` the caller already holds for it, if any), sleeping
    exactly as long as the governor says, for at most ``max_wait_s``.

    A ``granted=False`` result is backpressure, not failure: the caller puts the unit back on its
    queue for ``retry_after_s``, with the result's ``ticket`` (tokens booked for it), instead of
    calling the model; the ticket makes its next try a grant without a request.
    """
    start = now()
    draws = 0
    while True:
        draws += 1
        asked_at = now()
        result = governor.draw(amount, lane, asked_at, ticket=ticket, tenant=tenant)
        current = now()
        waited = current - start
        if result.granted:
            return Acquired(True, waited, draws, grant=result.grant)
        ticket = result.ticket
        # the wait runs from the instant the draw was decided at, not from its return: a draw
        # that made a DynamoDB round trip has already spent part of it (sleeping the whole wait
        # after the round trip picked a ticket up late by the request's latency, and, under
        # load, a whole queue of them at once: a burst above the rate at the model). And the
        # bound is on when the tokens are ours, not on how long the answer took: a ticket that
        # matured while a slow answer was on its way is picked up, not handed back.
        ready_at = asked_at + result.wait_s
        if ready_at - start > max_wait_s:
            return Acquired(
                False,
                waited,
                draws,
                ticket=ticket,
                retry_after_s=max(0.0, ready_at - current),
            )
        # never sleep zero (a float rounding could leave a tiny deficit): at least 1 ms
        sleep(max(ready_at - current, 0.001))


def ticks_until(wait_s: float) -> int:
    """Whole seconds to skip on a 1-second virtual clock without ever skipping past a grant."""
    return max(1, math.floor(wait_s))
