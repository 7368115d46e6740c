"""The fleet-wide token governor on DynamoDB: one conditional ``UpdateItem`` per grant.

The bucket's arithmetic (:class:`~swarm.core.governor.ShardState`, :func:`plan_draw`) is in
:mod:`swarm.core.governor`; this adapter keeps the shard items, the requests and their retries,
and each worker's ticket. Design, item layout and arithmetic: docs/governor.md.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from swarm.adapters.client_errors import client_error_type, error_code
from swarm.adapters.dynamodb import (
    CONDITIONAL_CHECK_FAILED,
    PARTITION_KEY,
    SORT_KEY,
    call,
    default_client,
)
from swarm.core.errors import Conflict, InvalidInput
from swarm.core.governor import (
    ZERO,
    Draw,
    GovernorConfig,
    GovernorSnapshot,
    ShardState,
    check_amount,
    cut_rate,
    initial_shard,
    micro,
    plan_draw,
    predicted_wait,
    rebase,
    shard_shape,
    view_of,
)
from swarm.core.records import Lane

# ------------------------------------------------------------------ shard items


def _num(value: Decimal) -> dict[str, str]:
    return {"N": format(value, "f")}


def _n(item: Mapping[str, Any], name: str) -> Decimal | None:
    raw = item.get(name)
    if raw is None or "N" not in raw:
        return None
    return Decimal(raw["N"])


def shard_from_item(item: Mapping[str, Any]) -> ShardState:
    """A shard item as the core's :class:`ShardState`."""

    def need(name: str) -> Decimal:
        value = _n(item, name)
        if value is None:
            raise Conflict(f"governor item {item.get(SORT_KEY)} lacks {name!r}")
        return value

    last = _n(item, "last_throttle_at")
    return ShardState(
        index=int(item[SORT_KEY]["S"].split("#", 1)[1]),
        drawn=need("drawn"),
        base_credit=need("base_credit"),
        base_time=need("base_time"),
        rate=need("rate"),
        capacity=need("capacity"),
        recovery=need("recovery"),
        cut_rate=_n(item, "cut_rate"),
        cut_at=_n(item, "cut_at") or ZERO,
        throttles=int(_n(item, "throttles") or 0),
        last_throttle_at=None if last is None else float(last),
    )


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
        #: never write: a missing shard reads as its initial state (docs/governor.md, "Read-only
        #: clients")
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
    def _initial_item(self, index: int, t: Decimal) -> dict[str, Any]:
        """Shard ``index`` as :meth:`create` puts it at ``t``: the configured initial state."""
        s = initial_shard(self.config, self.shards, index, t)
        return {
            **self._key(index),
            "drawn": _num(s.drawn),
            "base_credit": _num(s.base_credit),
            "base_time": _num(s.base_time),
            "rate": _num(s.rate),
            "capacity": _num(s.capacity),
            "recovery": _num(s.recovery),
            "shards": _num(Decimal(self.shards)),
            "throttles": _num(Decimal(s.throttles)),
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
        t = micro(now)
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
                states = [shard_from_item(it) for it in items]
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
        stored = {s.index: s for s in (shard_from_item(it) for it in items)}
        if items:
            self._check_config(items[0], stored[min(stored)])
        t = micro(now)
        return [
            stored[i] if i in stored else initial_shard(self.config, self.shards, i, t)
            for i in range(self.shards)
        ]

    def _check_config(self, item: Mapping[str, Any], state: ShardState) -> None:
        stored_shards = int(_n(item, "shards") or 0)
        rate, capacity, _ = shard_shape(self.config, self.shards)
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
        t = micro(now)
        reserve = self.config.reserves.get(lane, 0.0)
        book = self.horizon_s > 0 and reserve == 0
        requests = 0
        best_wait: float | None = None
        best_tokens = ZERO
        for index in self._shard_order(amount, reserve, t, now):
            while requests < self._max_requests:
                s = self._shard(index, now)
                plan = plan_draw(
                    s,
                    t,
                    amount,
                    reserve,
                    horizon_s=self.horizon_s,
                    book=book,
                    busy=index in self._busy,
                )
                if plan.wait_s is not None:
                    if best_wait is None or plan.wait_s < best_wait:
                        best_wait, best_tokens = plan.wait_s, plan.tokens
                    break  # this shard cannot serve it now: try the next one
                values: dict[str, Decimal]
                if plan.full:
                    # full: the refill above capacity is lost, so reset drawn instead of adding
                    update = "SET drawn = :newd"
                    condition = "drawn <= :full AND base_time = :bt"
                    values = {":newd": plan.reset_to, ":full": plan.full_mark}
                else:
                    update = "SET drawn = drawn + :a"
                    condition = "drawn <= :limit AND drawn > :full AND base_time = :bt"
                    values = {":a": plan.amount, ":limit": plan.limit, ":full": plan.full_mark}
                values[":bt"] = s.base_time
                requests += 1
                written, s = self._update_shard(index, update, condition, values, now)
                self._cache[index] = s
                self._observe(index, t)
                if not written:
                    self.stats.condition_failures += 1
                    continue
                left = float(plan.credit - s.drawn)
                ready_at = plan.ready_at(s)
                if ready_at is None:
                    self.stats.grants += 1
                    self.last_grant_at = now
                    self._waits.append(0.0)
                    return Draw(True, 0.0, left)
                ready = float(ready_at)
                self._ticket = Ticket(amount, lane, index, ready, s.base_time, now)
                self._waits.append(ready - now)
                return Draw(False, ready - now, left)
            if requests >= self._max_requests:
                break
        if best_wait is None:  # every try collided: back off briefly, with jitter
            best_wait = 0.005 + 0.02 * self._rng.random()
        return Draw(False, best_wait, float(best_tokens))

    def _update_shard(
        self, index: int, update: str, condition: str, values: Mapping[str, Decimal], now: float
    ) -> tuple[bool, ShardState]:
        """One conditional UpdateItem of a shard: whether it was written, and the shard as it
        is now (a failed write returns the item for free; without it, every shard is read)."""
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
            item = getattr(e, "response", {}).get("Item")
            return False, shard_from_item(item) if item else self._load(now)[index]
        return True, shard_from_item(result["Attributes"])

    def _observe(self, index: int, t: Decimal) -> None:
        """Remember whether the shard was in debt when this client last saw it."""
        if self._cache[index].tokens(t) < 0:
            self._busy.add(index)
        else:
            self._busy.discard(index)

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
            return predicted_wait(self._cache[i], t, amount, reserve)

        first = sorted((self._home, other), key=predicted)
        rest = [i for i in range(n) if i not in first]
        self._rng.shuffle(rest)
        return first + rest

    def _shard_tokens(self, index: int, now: float) -> float:
        s = self._cache.get(index)
        return 0.0 if s is None else float(s.tokens(micro(now)))

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
        t = micro(now)
        with self._lock:
            states = self._load(now)
            s0 = states[0]
            if s0.cooling(t, self.config.throttle_cooldown_s):
                self._count_throttle(0, t)
                return
            cut = cut_rate(self.config, self.shards, s0, t)
            for s in states:
                self._rebase(s, t, cut, count=s.index == 0, now=now)

    def _count_throttle(self, index: int, t: Decimal) -> None:
        self._call(
            "update_item",
            TableName=self.table_name,
            Key=self._key(index),
            UpdateExpression="ADD throttles :one SET last_throttle_at = :now",
            ExpressionAttributeValues={":one": _num(Decimal(1)), ":now": _num(t)},
        )

    def _rebase(self, s: ShardState, t: Decimal, cut: Decimal, *, count: bool, now: float) -> None:
        """Bank the credit earned at the old rate, then start the cut rate (:func:`rebase`)."""
        for _ in range(self._max_requests):
            new = rebase(s, t, cut, self.config.throttle_cooldown_s)
            if new is None:
                # another reporter cut this shard meanwhile: just count the throttle
                if count:
                    self._count_throttle(s.index, t)
                return
            update = "SET base_credit = :bc, base_time = :at, cut_rate = :cut, cut_at = :at"
            values = {
                ":bc": new.base_credit,
                ":at": new.base_time,
                ":cut": cut,
                ":old": s.base_time,
            }
            if count:
                update = "ADD throttles :one " + update + ", last_throttle_at = :now"
                values.update({":one": Decimal(1), ":now": t})
            written, s = self._update_shard(s.index, update, "base_time = :old", values, now)
            if written:
                self._cache[s.index] = s
                return

    # -- reads
    def snapshot(self, now: float) -> GovernorSnapshot:
        return self.state(now).snapshot

    def state(self, now: float) -> FleetGovernorState:
        """One Query: tokens, effective rate, throttles, the queue booked ahead, recent waits."""
        with self._lock:
            states = self._load(now)
            waits = tuple(self._waits)
        view = view_of(states, self.config, micro(now))
        return FleetGovernorState(view.snapshot, view.backlog_tokens, view.backlog_wait_s, waits)
