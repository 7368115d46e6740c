"""The fleet-wide token governor on DynamoDB: one conditional ``UpdateItem`` per grant.

The port and its arithmetic are :mod:`swarm.core.governor`; this adapter keeps the same bucket
in a form DynamoDB can update atomically with conditions that only compare a stored attribute
with client-computed constants (DynamoDB conditions cannot do arithmetic between attributes).

Cumulative (GCRA-like) form
---------------------------
A shard item stores ``drawn`` (tokens ever drawn, D) and the *credit function* C(t): tokens ever
credited, ``base_credit + integral of the effective rate from base_time to t``. The effective
rate is the AIMD rate of the core (governed rate, or a cut recovering linearly back to it), so
C(t) is computed client-side from attributes that change only when the rate changes. Then::

    tokens(t) = min(capacity, C(t) - D)

and a draw of ``a`` tokens from a lane whose reserve is ``f`` is one conditional write with
``c = C(now)`` (rounded *down*, so a rounding error can only under-grant):

* bucket below capacity: ``SET drawn = drawn + :a`` if ``drawn <= :c - :a - :f`` and
  ``drawn > :c - :capacity`` (the second clause proves the bucket is not full, else the refill
  above capacity would be counted);
* bucket full: ``SET drawn = :c - :capacity + :a`` if ``drawn <= :c - :capacity``.

Both also require ``base_time = :base_time`` so a draw computed with a stale rate function
(another worker cut the rate meanwhile) fails instead of over-granting. A failed write returns
the current item (``ReturnValuesOnConditionCheckFailure=ALL_OLD``) for free; the client caches
the last item it saw, picks the right case from it, and computes waits from it exactly.

Why at most capacity + refill is ever granted: every successful write leaves
``D <= C(now) - f`` (or books a ticket, below), D only grows, and the "full" case only fires
when the bucket really holds ``capacity``. Over any window the grants are bounded by the tokens
the bucket held at its start plus ``C(end) - C(start)``.

Waiting instead of colliding: tickets
-------------------------------------
With hundreds of workers, "deny, sleep until the deficit refills, retry" makes every waiter
wake at the same instant and all but one collide: ~N requests per grant. Instead, a lane allowed
to *book* (``horizon_s > 0`` and no reserve, i.e. nothing is protected from it) draws into debt,
at most ``horizon_s`` of refill ahead (``drawn <= :c - :a + rate x horizon``). The write returns
the new ``drawn``; the tokens are the caller's at the instant C(t) reaches it, so the caller is
told to wait exactly until then (a *ticket*, kept in this client) and its next ``draw`` of the
same amount is granted without a request. The queue lives in ``drawn``: FIFO, no herd, one
request per grant. A ticket given up before it matures is abandoned, not refunded (:meth:`cancel`).
Lanes with a reserve never book (a booked low-lane ticket would delay a later high-lane draw);
they get the core's immediate grant-or-deny semantics. With ``horizon_s=0`` the adapter
behaves exactly like :class:`swarm.core.governor.InMemoryGovernor`.

One behavioural difference: a rate cut applies to draws after it; tickets booked before the cut
keep their times (bounded by ``horizon_s`` of the old rate).

Sharding and the write arithmetic
---------------------------------
A DynamoDB partition serves ~1,000 WCU/s, so one hot item tops out below ~1,000 conditional
writes/s, and a *failed* conditional write still costs a WCU. At one request per grant and
grants of ``u`` tokens, one item sustains a governed rate of about ``1,000 x u`` tokens/s
(e.g. 10,000-token units: 10M tokens/s, 600M TPM), minus failures. Beyond that, or to keep
headroom, use ``shards=K``: K items, each with rate/K and capacity/K (and the same reserves
as fractions), so the fleet still never exceeds rate and capacity in total. A worker picks the
better of two shards by its cached view (power of two choices) and falls back to the others
when one is beyond its booking horizon. Keep ``capacity/K`` >= the largest draw plus its lane
reserve: a draw never spans shards. Rule of thumb: ``K = ceil(peak grants/s / 500)``.

Read-only clients (the API)
---------------------------
The batch API only *reads* the bucket (shedding and the fleet view), and on AWS its role may only
``Query`` the governor table. A client built with ``read_only=True`` never writes: a shard that
does not exist yet (a fresh stack, or a changed quota/share/capacity, which names a fresh bucket)
reads as the item :meth:`DynamoDBGovernor.create` would put at that instant, i.e. the bucket's
configured initial state; the workers create the real items on their first draw. Its ``draw``,
``report_throttle`` and ``create`` raise :class:`GovernorReadOnly`.

AIMD feedback: :meth:`report_throttle` cuts the rate of every shard (a conditional write per
shard that rebases ``base_credit/base_time``, at most once per cool-down); recovery is a function
of time and costs no writes. The throttle counter lives on shard 0.
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal, localcontext
from typing import Any

from swarm.adapters import (
    CONDITIONAL_CHECK_FAILED,
    PARTITION_KEY,
    SORT_KEY,
    call,
    client_error_type,
    default_client,
    error_code,
)
from swarm.core.errors import Conflict, InvalidInput
from swarm.core.governor import Draw, GovernorConfig, GovernorSnapshot, check_amount
from swarm.core.records import Lane

_Q = Decimal("0.000001")  # tokens and seconds are stored with micro resolution
_CTX = Context(prec=34)
_ZERO = Decimal(0)


def _dec(value: float | int | Decimal, rounding: str = ROUND_FLOOR) -> Decimal:
    with localcontext(_CTX):
        d = value if isinstance(value, Decimal) else Decimal(repr(float(value)))
        return d.quantize(_Q, rounding=rounding)


def _num(value: Decimal) -> dict[str, str]:
    return {"N": format(value, "f")}


def _n(item: Mapping[str, Any], name: str) -> Decimal | None:
    raw = item.get(name)
    if raw is None or "N" not in raw:
        return None
    return Decimal(raw["N"])


# ------------------------------------------------------------------ shard arithmetic (pure)


@dataclass(frozen=True)
class ShardState:
    """One shard item, with the credit function C(t) it defines."""

    index: int
    drawn: Decimal
    base_credit: Decimal
    base_time: Decimal
    rate: Decimal  # governed rate of this shard, tokens/s
    capacity: Decimal
    recovery: Decimal  # additive increase, tokens/s per second (this shard's share)
    cut_rate: Decimal | None = None
    cut_at: Decimal = _ZERO
    throttles: int = 0
    last_throttle_at: float | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> ShardState:
        def need(name: str) -> Decimal:
            value = _n(item, name)
            if value is None:
                raise Conflict(f"governor item {item.get(SORT_KEY)} lacks {name!r}")
            return value

        last = _n(item, "last_throttle_at")
        return cls(
            index=int(item[SORT_KEY]["S"].split("#", 1)[1]),
            drawn=need("drawn"),
            base_credit=need("base_credit"),
            base_time=need("base_time"),
            rate=need("rate"),
            capacity=need("capacity"),
            recovery=need("recovery"),
            cut_rate=_n(item, "cut_rate"),
            cut_at=_n(item, "cut_at") or _ZERO,
            throttles=int(_n(item, "throttles") or 0),
            last_throttle_at=None if last is None else float(last),
        )

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
            return min(self.rate, self.cut_rate + self.recovery * max(_ZERO, t - self.cut_at))

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
            return linear + (self.rate * (b - full) if b > full else _ZERO)

    def credit(self, t: Decimal) -> Decimal:
        """C(t), rounded down (a rounding error can only under-grant)."""
        if t <= self.base_time:
            return self.base_credit
        with localcontext(_CTX):
            c = self.base_credit + self._integral(self.base_time, t)
            return c.quantize(_Q, rounding=ROUND_FLOOR)

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
            t = t.quantize(_Q, rounding=ROUND_CEILING)
            while self.credit(t) < target:  # guard against the last digit
                t += _Q
            return t


# ------------------------------------------------------------------ the adapter


class GovernorReadOnly(RuntimeError):
    """A write through a read-only governor client (the API's role may not write the table)."""


@dataclass(frozen=True)
class Ticket:
    """Tokens booked ahead on one shard: the caller's at ``ready_at``."""

    amount: int
    lane: Lane
    shard: int
    ready_at: float
    base_time: Decimal
    booked_at: float


@dataclass(frozen=True)
class FleetGovernorState:
    """What backpressure reads, beyond the core snapshot: the queue ahead and recent waits."""

    snapshot: GovernorSnapshot
    backlog_tokens: float  # tokens booked ahead of the refill, over all shards
    backlog_wait_s: float  # how long a booking made now would wait (0 when tokens are there)
    recent_waits: tuple[float, ...]  # waits this client handed out, newest last


@dataclass
class GovernorStats:
    """Request accounting of one client (the benchmark reads it)."""

    requests: int = 0
    condition_failures: int = 0
    grants: int = 0
    abandoned: int = 0  # tickets given up before they matured (their tokens go unused)


class DynamoDBGovernor:
    """The Governor port on DynamoDB. One instance per worker (it holds that worker's ticket);
    the boto3 client may be shared by every instance of a process (it is thread-safe).
    """

    def __init__(
        self,
        config: GovernorConfig,
        table_name: str,
        *,
        client: Any = None,
        client_factory: Callable[[], Any] | None = None,
        name: str = "default",
        shards: int = 1,
        horizon_s: float = 0.0,
        max_requests_per_draw: int = 6,
        rng: random.Random | None = None,
        recent_waits: int = 256,
        read_only: bool = False,
    ) -> None:
        if not isinstance(shards, int) or not 1 <= shards <= 1000:
            raise InvalidInput("shards", f"must be a whole number in 1..1000, got {shards!r}")
        if horizon_s < 0:
            raise InvalidInput("horizon_s", f"must be >= 0 seconds, got {horizon_s!r}")
        if max_requests_per_draw < 1:
            raise InvalidInput("max_requests_per_draw", "must be >= 1")
        self.config = config
        self.table_name = table_name
        self.name = name
        self.shards = shards
        self.horizon_s = horizon_s
        #: never write: a missing shard reads as its initial state (see "Read-only clients")
        self.read_only = read_only
        self.stats = GovernorStats()
        self._client = client
        self._client_factory = client_factory
        self._max_requests = max_requests_per_draw
        self._rng = rng or random.Random()
        self._home = self._rng.randrange(shards)
        # a shard's view of the config: capacity and reserves checked per shard
        self._shard_config = replace(config, capacity=config.bucket_capacity / shards)
        self._cache: dict[int, ShardState] = {}
        # shards last seen in debt (tickets booked ahead): other workers are drawing from them,
        # so a cached view that looks full is just old; guess "below capacity" (a wrong guess
        # costs one failed write, which returns the item and corrects the next try)
        self._busy: set[int] = set()
        self._ticket: Ticket | None = None
        # when the tokens of the last grant became the caller's (a ticket's ready time)
        self.last_grant_at: float | None = None
        self._waits: deque[float] = deque(maxlen=recent_waits)
        self._lock = threading.Lock()  # one instance may be shared by threads; keep it safe

    # -- plumbing
    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = (self._client_factory or default_client)()
        return self._client

    @property
    def pk(self) -> str:
        return f"gov#{self.name}"

    def _key(self, shard: int) -> dict[str, Any]:
        return {PARTITION_KEY: {"S": self.pk}, SORT_KEY: {"S": f"shard#{shard:04d}"}}

    def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        """One DynamoDB request, counted (retryable throttling is retried with backoff)."""
        self.stats.requests += 1
        return call(self.client, op, self._rng, **kwargs)

    # -- shard items
    def _expected(self) -> tuple[Decimal, Decimal, Decimal]:
        n = self.shards
        return (
            _dec(self.config.rate / n),
            _dec(self.config.bucket_capacity / n),
            _dec(self.config.recovery_per_s * self.config.rate / n),
        )

    def _initial_item(self, index: int, t: Decimal) -> dict[str, Any]:
        """Shard ``index`` as :meth:`create` puts it at ``t``: the configured initial state."""
        rate, capacity, recovery = self._expected()
        initial = _dec(self.config.initial_fill * self.config.bucket_capacity / self.shards)
        return {
            **self._key(index),
            "drawn": _num(_ZERO),
            "base_credit": _num(initial),
            "base_time": _num(t),
            "rate": _num(rate),
            "capacity": _num(capacity),
            "recovery": _num(recovery),
            "shards": _num(Decimal(self.shards)),
            "throttles": _num(_ZERO),
        }

    def _writable(self, operation: str) -> None:
        if self.read_only:
            raise GovernorReadOnly(
                f"governor {self.name!r}: {operation} needs a write, and this client is "
                "read-only (the API reads the bucket; the workers create and draw from it)"
            )

    def create(self, now: float) -> None:
        """Create the shard items if absent (idempotent; called lazily by every operation)."""
        self._writable("create")
        t = _dec(now)
        for i in range(self.shards):
            try:
                self._call(
                    "put_item",
                    TableName=self.table_name,
                    Item=self._initial_item(i, t),
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except client_error_type() as e:
                if error_code(e) != CONDITIONAL_CHECK_FAILED:
                    raise

    def _load(self, now: float) -> list[ShardState]:
        """Read every shard (one strongly consistent Query), creating them on first use."""
        for _ in range(2):
            items: list[dict[str, Any]] = []
            kwargs: dict[str, Any] = {
                "TableName": self.table_name,
                "KeyConditionExpression": "pk = :pk",
                "ExpressionAttributeValues": {":pk": {"S": self.pk}},
                "ConsistentRead": True,
            }
            while True:
                page = self._call("query", **kwargs)
                items.extend(page.get("Items", []))
                if "LastEvaluatedKey" not in page:
                    break
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
            if len(items) >= self.shards:
                states = [ShardState.from_item(it) for it in items]
                self._check_config(items[0], states[0])
                for s in states:
                    self._cache[s.index] = s
                return sorted(states, key=lambda s: s.index)
            if self.read_only:
                return self._as_initial(items, now)
            self.create(now)
        raise Conflict(f"governor {self.name!r}: could not create its {self.shards} shard items")

    def _as_initial(self, items: Sequence[Mapping[str, Any]], now: float) -> list[ShardState]:
        """Read-only: the stored shards, and each missing one as :meth:`create` would put it
        now (not cached: the workers' items replace it as soon as they exist)."""
        stored = {s.index: s for s in (ShardState.from_item(it) for it in items)}
        if items:
            self._check_config(items[0], stored[min(stored)])
        t = _dec(now)
        return [
            stored[i] if i in stored else ShardState.from_item(self._initial_item(i, t))
            for i in range(self.shards)
        ]

    def _check_config(self, item: Mapping[str, Any], state: ShardState) -> None:
        stored_shards = int(_n(item, "shards") or 0)
        rate, capacity, _ = self._expected()
        if stored_shards != self.shards or state.rate != rate or state.capacity != capacity:
            raise Conflict(
                f"governor {self.name!r} exists with {stored_shards} shards of rate "
                f"{state.rate}/s and capacity {state.capacity}; this client is configured for "
                f"{self.shards} shards of {rate}/s and {capacity}: use another governor name "
                "or align the configuration"
            )

    def _shard(self, index: int, now: float) -> ShardState:
        if index not in self._cache:
            self._load(now)
        return self._cache[index]

    # -- the port
    def draw(self, amount: int, lane: Lane, now: float) -> Draw:
        self._writable("draw")
        check_amount(self._shard_config, amount, lane)
        with self._lock:
            held = self._ticket
            if held is not None:
                if held.amount == amount and held.lane == lane:
                    if now >= held.ready_at:
                        self._ticket = None
                        self.stats.grants += 1
                        self.last_grant_at = held.ready_at
                        return Draw(True, 0.0, self._shard_tokens(held.shard, now))
                    return Draw(False, held.ready_at - now, self._shard_tokens(held.shard, now))
                self._cancel_locked(now)
            return self._draw_locked(amount, lane, now)

    def _draw_locked(self, amount: int, lane: Lane, now: float) -> Draw:
        t = _dec(now)
        a = Decimal(amount)
        reserve = self.config.reserves.get(lane, 0.0)
        book = self.horizon_s > 0 and reserve == 0
        requests = 0
        best_wait: float | None = None
        best_tokens = _ZERO
        for index in self._shard_order(amount, reserve, t, now):
            while requests < self._max_requests:
                s = self._shard(index, now)
                floor = _dec(reserve * float(s.capacity), ROUND_CEILING)
                credit = s.credit(t)
                tokens = min(s.capacity, credit - s.drawn)
                ahead = _dec(float(s.rate_at(t)) * self.horizon_s) if book else _ZERO
                if tokens >= s.capacity and index not in self._busy:
                    # full: the refill above capacity is lost, so reset drawn instead of adding
                    update = "SET drawn = :newd"
                    condition = "drawn <= :full AND base_time = :bt"
                    values = {":newd": credit - s.capacity + a, ":full": credit - s.capacity}
                else:
                    limit = credit - a - floor + ahead
                    if s.drawn > limit:
                        wait = self._deny_wait(s, t, s.drawn - limit, a + floor - tokens, book)
                        if best_wait is None or wait < best_wait:
                            best_wait, best_tokens = wait, tokens
                        break  # this shard cannot serve it now: try the next one
                    update = "SET drawn = drawn + :a"
                    condition = "drawn <= :limit AND drawn > :full AND base_time = :bt"
                    values = {":a": a, ":limit": limit, ":full": credit - s.capacity}
                values[":bt"] = s.base_time
                requests += 1
                try:
                    result = self._call(
                        "update_item",
                        TableName=self.table_name,
                        Key=self._key(index),
                        UpdateExpression=update,
                        ConditionExpression=condition,
                        ExpressionAttributeValues={k: _num(v) for k, v in values.items()},
                        ReturnValues="ALL_NEW",
                        ReturnValuesOnConditionCheckFailure="ALL_OLD",
                    )
                except client_error_type() as e:
                    if error_code(e) != CONDITIONAL_CHECK_FAILED:
                        raise
                    self.stats.condition_failures += 1
                    item = getattr(e, "response", {}).get("Item")
                    if item:
                        self._cache[index] = ShardState.from_item(item)
                    else:
                        self._load(now)
                    self._observe(index, t)
                    continue
                s = ShardState.from_item(result["Attributes"])
                self._cache[index] = s
                self._observe(index, t)
                target = s.drawn + floor
                left = float(credit - s.drawn)
                if credit >= target:
                    self.stats.grants += 1
                    self.last_grant_at = now
                    self._waits.append(0.0)
                    return Draw(True, 0.0, left)
                ready = float(s.time_for_credit(target))
                self._ticket = Ticket(amount, lane, index, ready, s.base_time, now)
                self._waits.append(ready - now)
                return Draw(False, ready - now, left)
            if requests >= self._max_requests:
                break
        if best_wait is None:  # every try collided: back off briefly, with jitter
            best_wait = 0.005 + 0.02 * self._rng.random()
        return Draw(False, best_wait, float(best_tokens))

    def _observe(self, index: int, t: Decimal) -> None:
        """Remember whether the shard was in debt when this client last saw it."""
        if self._cache[index].tokens(t) < 0:
            self._busy.add(index)
        else:
            self._busy.discard(index)

    def _deny_wait(
        self, s: ShardState, t: Decimal, over: Decimal, deficit: Decimal, book: bool
    ) -> float:
        """Seconds until this shard could serve the draw, at its current effective rate."""
        rate = float(s.rate_at(t))
        # + 2 us: ``now`` and the credit are rounded down to micro units, so a caller that
        # sleeps exactly this long finds the tokens there
        return float(over if book else deficit) / rate + 2e-6

    def _shard_order(self, amount: int, reserve: float, t: Decimal, now: float) -> list[int]:
        """Best of two (home and a random other) by cached wait, then the rest, shuffled."""
        n = self.shards
        if n == 1:
            return [0]
        if not self._cache:
            self._load(now)
        other = self._rng.randrange(n - 1)
        other = other if other < self._home else other + 1

        def predicted(i: int) -> float:
            s = self._cache[i]
            need = Decimal(amount) + _dec(reserve * float(s.capacity)) - s.tokens(t)
            return max(0.0, float(need)) / float(s.rate_at(t))

        first = sorted((self._home, other), key=predicted)
        rest = [i for i in range(n) if i not in first]
        self._rng.shuffle(rest)
        return first + rest

    def _shard_tokens(self, index: int, now: float) -> float:
        s = self._cache.get(index)
        return 0.0 if s is None else float(s.tokens(_dec(now)))

    # -- tickets
    @property
    def ticket(self) -> Ticket | None:
        return self._ticket

    def cancel(self, now: float) -> bool:
        """Forget a booked ticket the caller gave up on. Its tokens are *not* refunded.

        A refund (``drawn -= amount``) would be exact only if DynamoDB applied it before the
        ticket matured, and no condition can compare with the server's clock: a refund delayed
        past maturity, after the bucket refilled to capacity, mints tokens the bucket never held
        (seen as over-grants in the 64-worker concurrency test under load). The booked tokens
        are left unused instead: a small under-grant, never an over-grant. Callers avoid it by
        waiting at least ``horizon_s`` (the worker's bounded wait is the horizon). Returns False.
        """
        with self._lock:
            self._cancel_locked(now)
            return False

    def _cancel_locked(self, now: float) -> None:
        if self._ticket is not None and now < self._ticket.ready_at:
            self.stats.abandoned += 1
        self._ticket = None

    # -- throttle feedback
    def report_throttle(self, now: float) -> None:
        """The model plane throttled: count it; cut every shard's rate once per cool-down."""
        self._writable("report_throttle")
        cfg = self.config
        t = _dec(now)
        with self._lock:
            states = self._load(now)
            s0 = states[0]
            cooling = s0.cut_rate is not None and float(t - s0.cut_at) < cfg.throttle_cooldown_s
            if cooling:
                self._call(
                    "update_item",
                    TableName=self.table_name,
                    Key=self._key(0),
                    UpdateExpression="ADD throttles :one SET last_throttle_at = :now",
                    ExpressionAttributeValues={":one": _num(Decimal(1)), ":now": _num(t)},
                )
                return
            n = self.shards
            floor = _dec(cfg.rate * cfg.min_rate_fraction / n)
            cut = max(floor, _dec(float(s0.rate_at(t)) * cfg.decrease_factor))
            for s in states:
                self._rebase(s, t, cut, count=s.index == 0, now=now)

    def _rebase(self, s: ShardState, t: Decimal, cut: Decimal, *, count: bool, now: float) -> None:
        """Bank the credit earned at the old rate, then start the cut rate at ``at``."""
        cfg = self.config
        for _ in range(self._max_requests):
            at = max(t, s.base_time)
            if s.cut_rate is not None and float(at - s.cut_at) < cfg.throttle_cooldown_s:
                # another reporter cut this shard meanwhile: just count the throttle
                if count:
                    self._call(
                        "update_item",
                        TableName=self.table_name,
                        Key=self._key(s.index),
                        UpdateExpression="ADD throttles :one SET last_throttle_at = :now",
                        ExpressionAttributeValues={":one": _num(Decimal(1)), ":now": _num(t)},
                    )
                return
            update = "SET base_credit = :bc, base_time = :at, cut_rate = :cut, cut_at = :at"
            values = {":bc": s.credit(at), ":at": at, ":cut": cut, ":old": s.base_time}
            if count:
                update = "ADD throttles :one " + update + ", last_throttle_at = :now"
                values.update({":one": Decimal(1), ":now": t})
            try:
                result = self._call(
                    "update_item",
                    TableName=self.table_name,
                    Key=self._key(s.index),
                    UpdateExpression=update,
                    ConditionExpression="base_time = :old",
                    ExpressionAttributeValues={k: _num(v) for k, v in values.items()},
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except client_error_type() as e:
                if error_code(e) != CONDITIONAL_CHECK_FAILED:
                    raise
                item = getattr(e, "response", {}).get("Item")
                s = ShardState.from_item(item) if item else self._load(now)[s.index]
                continue
            self._cache[s.index] = ShardState.from_item(result["Attributes"])
            return

    # -- reads
    def snapshot(self, now: float) -> GovernorSnapshot:
        return self.state(now).snapshot

    def state(self, now: float) -> FleetGovernorState:
        """One Query: tokens, effective rate, throttles, the queue booked ahead, recent waits."""
        t = _dec(now)
        with self._lock:
            states = self._load(now)
            waits = tuple(self._waits)
        tokens = [s.tokens(t) for s in states]
        rate = sum((s.rate_at(t) for s in states), _ZERO)
        debt = sum((max(_ZERO, -x) for x in tokens), _ZERO)
        s0 = states[0]
        snap = GovernorSnapshot(
            available=float(sum((max(_ZERO, x) for x in tokens), _ZERO)),
            capacity=self.config.bucket_capacity,
            governed_rate=self.config.rate,
            effective_rate=float(rate),
            throttles=s0.throttles,
            last_throttle_at=s0.last_throttle_at,
        )
        backlog_wait = float(debt / rate) if rate > 0 else math.inf
        return FleetGovernorState(snap, float(debt), backlog_wait, waits)


def wait_percentiles(waits: Sequence[float], quantiles: Sequence[float]) -> list[float]:
    """Nearest-rank percentiles (0 for an empty sample): for snapshots and the benchmark."""
    if not waits:
        return [0.0 for _ in quantiles]
    ordered = sorted(waits)
    out = []
    for q in quantiles:
        rank = max(1, math.ceil(q * len(ordered)))
        out.append(ordered[min(rank, len(ordered)) - 1])
    return out


def new_client_token() -> str:
    """An id for a worker's governor instance (logs, shard choice)."""
    return uuid.uuid4().hex
