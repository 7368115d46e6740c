"""The fleet-wide token governor on DynamoDB: one conditional ``UpdateItem`` per grant.

The bucket's arithmetic (:class:`~swarm.core.governor.ShardState`,
:func:`~swarm.core.governor.plan_write`) is in :mod:`swarm.core.governor`; this adapter keeps
the shard items, the requests and their retries, and each worker's pending refund. Tickets are
the caller's (:class:`~swarm.core.governor.Ticket`): any client of the bucket grants one.
Design, item layout and arithmetic: docs/explanation/governor.md.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import ROUND_CEILING, Decimal
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
    Grant,
    Refund,
    ShardState,
    ShardWrite,
    Ticket,
    TrueUp,
    booking_ahead,
    check_amount,
    cut_rate,
    initial_shard,
    micro,
    plan_places,
    plan_slot,
    plan_write,
    predicted_wait,
    rebase,
    request_shape,
    requests_mark,
    shard_shape,
    ticket_ready_at,
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
    lost, refunded, highs = _n(item, "lost"), _n(item, "refunded"), _n(item, "highs")
    index = int(item[SORT_KEY]["S"].split("#", 1)[1])
    requests: ShardState | None = None
    if _n(item, "r_rate") is not None:  # the request bucket, in the same item
        requests = ShardState(
            index=index,
            drawn=need("r_drawn"),
            base_credit=need("r_base_credit"),
            base_time=need("base_time"),
            rate=need("r_rate"),
            capacity=need("r_capacity"),
            recovery=need("r_recovery"),
            cut_rate=_n(item, "r_cut_rate"),
            cut_at=_n(item, "cut_at") or ZERO,
            lost=need("r_lost"),
            refunded=need("r_refunded"),
        )
    return ShardState(
        index=index,
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
        lost=lost or ZERO,
        refunded=refunded or ZERO,
        highs=int(highs or 0),
        legacy=lost is None
        or refunded is None
        or highs is None
        or any(queue_attribute(lane) not in item for lane in Lane),
        queues={
            lane.value: {
                tenant: Decimal(end["N"])
                for tenant, end in item.get(queue_attribute(lane), {}).get("M", {}).items()
            }
            for lane in Lane
        },
        requests=requests,
    )


def queue_attribute(lane: Lane) -> str:
    """The shard attribute holding a reserved lane's queues, a map of tenant to the credit its
    queue ends at (``ShardState.queues``)."""
    return f"queue_{lane.value}"


def _request_attributes(r: ShardState) -> dict[str, Any]:
    """A fresh shard's request bucket (``ShardState.requests``) as item attributes (``r_*``: it
    shares ``base_time`` and ``cut_at`` with the tokens)."""
    return {
        "r_drawn": _num(r.drawn),
        "r_lost": _num(r.lost),
        "r_refunded": _num(r.refunded),
        "r_base_credit": _num(r.base_credit),
        "r_rate": _num(r.rate),
        "r_capacity": _num(r.capacity),
        "r_recovery": _num(r.recovery),
    }


# ------------------------------------------------------------------ the adapter


class GovernorReadOnly(RuntimeError):
    """A write through a read-only governor client (the API's role may not write the table)."""


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
    ticket_grants: int = 0  # grants of a ticket presented ready: no request
    refused_in_view: int = 0  # draws refused from the cached view: no request
    expired: int = 0  # tickets presented after their grace: drawn afresh, their tokens unused
    slots: int = 0  # places taken in a reserved lane's queue (one write each)
    slot_waits: int = 0  # slots presented whose tokens another unit took: they keep their place
    refunded: int = 0  # unused tokens given back (with a write that drew at least as many)
    refund_dropped: int = 0  # unused tokens that could not go back soundly
    requests_refunded: int = 0  # requests of released grants given back (calls never made)
    debited: int = 0  # tokens the model used beyond its grants, drawn after the call


#: the queue of draws that name no tenant (never a tenant's name: "*" is not in a role name)
ANONYMOUS = "*"
#: a debit's conditional write is retried this often before it lands unconditionally
DEBIT_TRIES = 12
#: defaults of the writes' timing (see DynamoDBGovernor): how late a write may land after its
#: client's clock, and the grid a full bucket is drawn on
WRITE_MARGIN_S = 30.0
FULL_GRID_S = 0.5


class DynamoDBGovernor:
    """The Governor port on DynamoDB. One instance per worker (it holds that worker's cached
    view of the shards and its pending refund); the boto3 client may be shared by every
    instance of a process (it is thread-safe).

    ``horizon_s``: how far past the refill a lane without a reserve may book (a ticket);
    ``place_horizon_s``: how far ahead a reserved lane's unit may take a place in its tenant's
    queue (a slot: an estimate, never tokens; default ``horizon_s``): a place further than SQS
    delays a message waits with its message hidden (swarm.service.worker ``Requeue.hide``);
    ``margin_s``: how late after its client's clock a write may land and still be judged
    right (a refund's bound and a write's certificate that the bucket is below half full use
    it);
    ``full_grid_s``: a full bucket is drawn as if at the next multiple of it, so that workers
    seeing the same full bucket write the same value; ``ticket_grace_s``: how long after its
    ready time a ticket is still honoured (default: the time the bucket takes to fill, so late
    tickets never add more than a full bucket's worth at once).
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
        margin_s: float = WRITE_MARGIN_S,
        full_grid_s: float = FULL_GRID_S,
        ticket_grace_s: float | None = None,
        place_horizon_s: float | None = None,
    ) -> None:
        if not isinstance(shards, int) or not 1 <= shards <= 1000:
            raise InvalidInput("shards", f"must be a whole number in 1..1000, got {shards!r}")
        if horizon_s < 0:
            raise InvalidInput("horizon_s", f"must be >= 0 seconds, got {horizon_s!r}")
        if max_requests_per_draw < 1:
            raise InvalidInput("max_requests_per_draw", "must be >= 1")
        for label, value in (("margin_s", margin_s), ("full_grid_s", full_grid_s)):
            if value < 0:
                raise InvalidInput(label, f"must be >= 0 seconds, got {value!r}")
        if ticket_grace_s is not None and ticket_grace_s < 0:
            raise InvalidInput("ticket_grace_s", f"must be >= 0 seconds, got {ticket_grace_s!r}")
        shape = request_shape(config, shards)
        if shape is not None:
            top = max((config.request_reserve(lane) for lane in Lane), default=0.0)
            if 1 + top / shards > float(shape[1]):
                raise InvalidInput(
                    "shards",
                    f"{shards} shards split the request bucket into {shape[1]} requests each, "
                    "too few for one request above a lane's reserve: use fewer shards or raise "
                    "quota_rpm",
                )
        self.config = config
        self.table_name = table_name
        self.name = name
        self.shards = shards
        self.horizon_s = horizon_s
        self.place_horizon_s = horizon_s if place_horizon_s is None else place_horizon_s
        if self.place_horizon_s < 0:
            raise InvalidInput("place_horizon_s", f"must be >= 0 seconds, got {place_horizon_s!r}")
        self.margin_s = margin_s
        self.full_grid_s = full_grid_s
        self.ticket_grace_s = config.fill_s if ticket_grace_s is None else ticket_grace_s
        #: never write: a missing shard reads as its initial state (docs/explanation/governor.md,
        #: "Read-only clients")
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
        self._seen_at: dict[int, float] = {}  # the ``now`` of each cached view
        self._others_rate: dict[int, Decimal] = {}  # tokens/s other workers drew, as last seen
        self._pending: Refund | None = None  # unused tokens waiting for the next write
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
            "lost": _num(s.lost),
            "refunded": _num(s.refunded),
            "highs": _num(Decimal(s.highs)),
            "base_credit": _num(s.base_credit),
            "base_time": _num(s.base_time),
            "rate": _num(s.rate),
            "capacity": _num(s.capacity),
            "recovery": _num(s.recovery),
            "shards": _num(Decimal(self.shards)),
            "throttles": _num(Decimal(s.throttles)),
            **{queue_attribute(lane): {"M": {}} for lane in Lane},
            **({} if s.requests is None else _request_attributes(s.requests)),
        }

    def _writable(self, operation: str) -> None:
        if self.read_only:
            raise GovernorReadOnly(
                f"governor {self.name!r}: {operation} needs a write, and this client is "
                "read-only (the API reads the bucket; the workers create and draw from it)"
            )

    def create(self, now: float) -> None:
        """Create the shard items if absent (idempotent; called lazily by every operation). A
        conditional UpdateItem, not a PutItem: every client that writes the governor updates
        its shards anyway, so none needs ``dynamodb:PutItem`` on its table (the fan-out's
        :meth:`book_places` may be the first to come)."""
        self._writable("create")
        t = micro(now)
        for i in range(self.shards):
            key = self._key(i)
            attributes = [(k, v) for k, v in self._initial_item(i, t).items() if k not in key]
            placeholders = range(len(attributes))
            try:
                self._call(
                    "update_item",
                    TableName=self.table_name,
                    Key=key,
                    UpdateExpression="SET " + ", ".join(f"#a{n} = :a{n}" for n in placeholders),
                    ConditionExpression="attribute_not_exists(pk)",
                    ExpressionAttributeNames={f"#a{n}": k for n, (k, _) in enumerate(attributes)},
                    ExpressionAttributeValues={f":a{n}": v for n, (_, v) in enumerate(attributes)},
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
                    self._remember(s, now)
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
        shape = request_shape(self.config, self.shards)
        stored = None if state.requests is None else (state.requests.rate, state.requests.capacity)
        if (
            stored_shards != self.shards
            or state.rate != rate
            or state.capacity != capacity
            or stored != (None if shape is None else shape[:2])
        ):
            raise Conflict(
                f"governor {self.name!r} exists with {stored_shards} shards of rate "
                f"{state.rate}/s and capacity {state.capacity}; this client is configured for "
                f"{self.shards} shards of {rate}/s and {capacity} (request buckets: stored "
                f"{stored}, configured {None if shape is None else shape[:2]}): use another "
                "governor name or align the configuration"
            )

    def _remember(self, s: ShardState, now: float, own: Decimal = ZERO) -> None:
        """Cache a view of a shard (after a write that drew ``own`` tokens), and from what the
        other workers drew since the last view, how fast they draw."""
        before, seen = self._cache.get(s.index), self._seen_at.get(s.index)
        if before is not None and seen is not None and now > seen:
            others = max(ZERO, s.drawn - before.drawn - own)
            self._others_rate[s.index] = others / micro(now - seen, ROUND_CEILING)
        self._cache[s.index] = s
        self._seen_at[s.index] = now

    def _drawn_floor(self, s: ShardState, t: Decimal) -> Decimal | None:
        """A guess of how far ``drawn`` has grown since this client's view: half of what the
        other workers would have drawn at the pace they drew before it. None until this client
        has seen them draw (a lone worker's view stays exact: it guesses nothing), and while
        nothing was ever refunded (the bounds it loosens only matter against refunds)."""
        if s.refunded <= 0 and self._pending is None:
            return None
        seen = micro(self._seen_at.get(s.index, 0.0))
        rate = self._others_rate.get(s.index, ZERO)
        if rate <= 0 or t <= seen:
            return None
        return s.drawn + micro(rate * (t - seen) / 2)

    def _shard(self, index: int, now: float) -> ShardState:
        if index not in self._cache:
            self._load(now)
        return self._cache[index]

    # -- the port
    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        self._writable("draw")
        check_amount(self._shard_config, amount, lane)
        tenant = tenant or ANONYMOUS  # a map key is never empty
        with self._lock:
            if ticket is not None and ticket.slot and self._honours(ticket, amount, lane):
                if now < ticket.ready_at:
                    left = self._shard_tokens(ticket.shard, now)
                    return Draw(False, ticket.ready_at - now, left, ticket=ticket)
                if now - ticket.ready_at <= self.ticket_grace_s:
                    # at the head of its tenant's queue: drawn ahead of it, or, if another unit
                    # took the tokens meanwhile, it keeps its place until they are there
                    drawn = self._draw_locked(amount, lane, now, tenant, slot=ticket.shard)
                    if drawn.granted:
                        return drawn
                    self.stats.slot_waits += 1
                    return replace(drawn, ticket=replace(ticket, ready_at=now + drawn.wait_s))
                self.stats.expired += 1  # too late: it queues again
                return self._draw_locked(amount, lane, now, tenant)
            if ticket is not None and self._honours(ticket, amount, lane):
                ready = ticket_ready_at(ticket, self._cache.get(ticket.shard))
                left = self._shard_tokens(ticket.shard, now)
                if now < ready:
                    seen = self._cache.get(ticket.shard)
                    if ready > ticket.ready_at and seen is not None:  # re-timed after a rate cut
                        ticket = replace(ticket, ready_at=ready, base_time=seen.base_time)
                    return Draw(False, ready - now, left, ticket=ticket)
                if now - ready <= self.ticket_grace_s:
                    self.stats.grants += 1
                    self.stats.ticket_grants += 1
                    self.last_grant_at = ready
                    return Draw(True, 0.0, left, grant=ticket.grant())
                self.stats.expired += 1  # too late to be honoured: its tokens went unused
            return self._draw_locked(amount, lane, now, tenant)

    def _honours(self, ticket: Ticket, amount: int, lane: Lane) -> bool:
        """A ticket of this bucket, for this draw."""
        return (
            ticket.governor == self.name
            and 0 <= ticket.shard < self.shards
            and ticket.amount == amount
            and ticket.lane == lane
        )

    def _draw_locked(
        self, amount: int, lane: Lane, now: float, tenant: str, slot: int | None = None
    ) -> Draw:
        """A fresh draw; ``slot``: the shard of the queue slot the caller presents (drawn from
        that shard only, ahead of its tenant's queue, and never queued again)."""
        t = micro(now)
        reserve = self.config.reserves.get(lane, 0.0)
        # a lane with a reserve never books tokens (they would delay a higher lane's draw): its
        # tenants queue for them instead (a slot: docs/explanation/governor.md), which a higher lane
        # overtakes
        book = self.horizon_s > 0 and reserve == 0
        queues = self.horizon_s > 0 and reserve > 0
        requests = 0
        best_wait: float | None = None
        best_tokens = ZERO
        behind: list[int] = []  # shards whose lane queue this draw must join
        order = [slot] if slot is not None else self._shard_order(amount, reserve, t, now)
        for index in order:
            while requests < self._max_requests:
                s = self._shard(index, now)
                guard = queues and slot is None
                if guard and self._queue_ahead(s, lane, tenant):
                    behind.append(index)  # the tenant's units queued ahead: join them
                    break
                ahead = booking_ahead(s, t, self.horizon_s) if book else ZERO
                plan = plan_write(
                    s,
                    t,
                    add=amount,
                    reserve=reserve,
                    ahead=ahead,
                    refund=self._refund_for(s),
                    margin_s=self.margin_s,
                    grid_s=self.full_grid_s,
                    drawn_floor=self._drawn_floor(s, t),
                    requests=self._requests,
                )
                if plan.wait_s is not None:
                    if best_wait is None or plan.wait_s < best_wait:
                        best_wait, best_tokens = plan.wait_s, s.tokens(t)
                    if guard:
                        behind.append(index)
                    break  # this shard cannot serve it now: try the next one
                requests += 1
                queue = (lane, tenant) if guard else None
                written, s = self._write(index, plan, now, queue=queue)
                if not written:
                    self.stats.condition_failures += 1
                    continue
                left = float(plan.credit - s.position)
                ready_at = plan.ready_at(s)
                if ready_at is None:
                    self.stats.grants += 1
                    self.last_grant_at = now
                    self._waits.append(0.0)
                    grant = Grant(
                        amount,
                        lane,
                        now,
                        index,
                        s.refunded,
                        s.highs,
                        requests=self._requests,
                        requests_mark=None if s.requests is None else requests_mark(s.requests),
                    )
                    return Draw(True, 0.0, left, grant=grant)
                ready = float(ready_at)
                ticket = Ticket(
                    governor=self.name,
                    shard=index,
                    amount=amount,
                    lane=lane,
                    ready_at=ready,
                    position=s.position + plan.floor,
                    base_time=s.base_time,
                    booked_at=now,
                    refunded=s.refunded,
                    highs=s.highs,
                    **self._request_booking(s, plan, 1, 1),
                )
                self._waits.append(ready - now)
                return Draw(False, ready - now, left, ticket=ticket)
            if requests >= self._max_requests:
                break
        if behind and requests < self._max_requests:
            tries = self._max_requests - requests
            return self._queue(behind, amount, lane, tenant, reserve, now, tries)
        if best_wait is None:  # every try collided: back off briefly, with jitter
            best_wait = 0.005 + 0.02 * self._rng.random()
        elif requests == 0:
            self.stats.refused_in_view += 1
        return Draw(False, best_wait, float(best_tokens))

    @property
    def _requests(self) -> int:
        """Requests one model call draws: 1 with a request bucket, else none."""
        return 0 if self.config.rpm is None else 1

    @staticmethod
    def _request_booking(s: ShardState, plan: ShardWrite, i: int, booked: int) -> dict[str, Any]:
        """A ticket's request fields: the ``i``-th (from 1) of the ``booked`` requests the write
        ``plan`` drew on the shard ``s`` it left (none without a request bucket)."""
        r, rw = s.requests, plan.requests
        if r is None or rw is None:
            return {}
        return {
            "requests_position": r.position - booked + i + rw.floor,
            "requests_mark": requests_mark(r),
        }

    def _queue_ahead(self, s: ShardState, lane: Lane, tenant: str) -> bool:
        """The tenant's units were queued in ``lane`` ahead of the credit when this client last
        saw the shard. Judged at that instant, not now: a view is often old (the unit was last
        drawn for by another worker's client), and the queue has grown since, so a view that
        showed one then joins it (one write, even if it was served meanwhile: the slot is then
        ready at once) rather than try a draw its write's guard would refuse (a failed write,
        then the same booking)."""
        end = s.queues.get(lane.value, {}).get(tenant)
        return end is not None and end > s.credit(micro(self._seen_at[s.index]))

    def _queue(
        self,
        shards: list[int],
        amount: int,
        lane: Lane,
        tenant: str,
        reserve: float,
        now: float,
        tries: int,
    ) -> Draw:
        """Join the tenant's queue in a reserved lane on the shard where the unit's tokens come
        first: one conditional write of the queue's end (:class:`SlotWrite`) gives the unit a
        slot, ready when the credit reaches it. Beyond the places' horizon it is refused without
        a slot, for as long as its tokens take to be there behind its queue."""
        t = micro(now)

        def ready(i: int) -> Decimal:
            s = self._shard(i, now)
            return s.time_for_credit(plan_slot(s, t, lane, tenant, amount, reserve).target)

        index = min(shards, key=ready)
        booked = self._book(index, (amount,), lane, tenant, reserve, now, tries)
        if booked is None:  # every try collided: back off briefly, with jitter
            return Draw(False, 0.005 + 0.02 * self._rng.random(), self._shard_tokens(index, now))
        return booked[0]

    def book_places(
        self, amounts: Sequence[int], lane: Lane, tenant: str, now: float
    ) -> list[Draw]:
        """Places for a tenant's units, in order, before they are sent (the fan-out's): in a
        lane with a reserve, one conditional write of the tenant's queue end books the place of
        every unit whose place is ready within the places' horizon, as those units would take
        them one by one on their first try (:meth:`_queue`), and each Draw carries its place
        (a slot :class:`Ticket`) and how long until it is ready; a unit past the horizon gets
        no place, and its Draw says when its tokens would be there behind the others. A lane
        without a reserve, a client without a horizon, or a write that kept colliding books
        nothing: every Draw's wait is 0 (send it now; the workers queue it)."""
        self._writable("book_places")
        for amount in amounts:
            check_amount(self._shard_config, amount, lane)
        reserve = self.config.reserves.get(lane, 0.0)
        nothing = [Draw(False, 0.0, 0.0) for _ in amounts]
        if not amounts or self.horizon_s <= 0 or reserve <= 0:
            return nothing
        tenant = tenant or ANONYMOUS
        t = micro(now)
        with self._lock:
            self._load(now)  # a fresh view: the fan-out's client books once per chunk

            def ready(i: int) -> Decimal:
                s = self._shard(i, now)
                return s.time_for_credit(plan_slot(s, t, lane, tenant, amounts[0], reserve).target)

            index = min(range(self.shards), key=ready)
            booked = self._book(index, amounts, lane, tenant, reserve, now, self._max_requests)
        return nothing if booked is None else booked

    def _book(
        self,
        index: int,
        amounts: Sequence[int],
        lane: Lane,
        tenant: str,
        reserve: float,
        now: float,
        tries: int,
    ) -> list[Draw] | None:
        """Places in the tenant's queue on shard ``index`` for the units whose places are ready
        within the horizon (:func:`plan_places`: one write for all of them); a Draw per unit, or
        None when every try collided."""
        t = micro(now)
        attribute = queue_attribute(lane)
        mine = f"{attribute}.#tenant"
        for _ in range(tries):
            s = self._shard(index, now)
            if s.legacy:
                self._upgrade(index, now)
                continue
            plan, ends = plan_places(s, t, lane, tenant, amounts, reserve)
            base = plan.target - plan.step  # the queue's end before the write, as seen
            waits = [float(s.time_for_credit(base + end)) - now for end in ends]
            horizon = self.place_horizon_s
            placed = next((i for i, wait in enumerate(waits) if wait > horizon), len(ends))
            if placed == 0:
                self.stats.refused_in_view += len(amounts)
                return [Draw(False, wait, float(s.tokens(t))) for wait in waits]
            plan = replace(plan, step=ends[placed - 1], target=base + ends[placed - 1])
            if plan.extend:
                update, condition = f"SET {mine} = {mine} + :step", f"{mine} >= :start"
            else:
                update = f"SET {mine} = :start + :step"
                condition = f"attribute_not_exists({mine}) OR {mine} < :start"
            names = {"#tenant": tenant}
            for i, stale in enumerate(plan.stale):
                names[f"#stale{i}"] = stale
            if plan.stale:
                update += " REMOVE " + ", ".join(
                    f"{attribute}.#stale{i}" for i in range(len(plan.stale))
                )
            values = {":step": plan.step, ":start": plan.start}
            written, s = self._update_shard(index, update, condition, values, now, names)
            self._remember(s, now)
            if not written:
                self.stats.condition_failures += 1
                continue
            self.stats.slots += placed
            # the queue's end after this write is the last place; the others are before it
            first = s.queues[lane.value][tenant] - plan.step
            places = [first + end for end in ends]
            ready = [float(s.time_for_credit(place)) for place in places]
            return self._draws(index, amounts, places, ready, placed, s, lane, now, slot=True)
        return None

    def book_tickets(self, amounts: Sequence[int], lane: Lane, now: float) -> list[Draw]:
        """Tokens for a worker's units, in order, booked together (its invocation's, when they
        arrive): in a lane without a reserve, one conditional write draws the tokens of every
        unit that fits within the booking horizon, as if those units had booked one after the
        other with no other booking between them, so their tickets are ready back to back (the
        units then go back to their lane together, a bundle, rather than each among the other
        workers' bookings). Each Draw is refused and carries its unit's :class:`Ticket` (ready
        now, or later: its holder presents it to :meth:`draw`, which grants it without a
        request); a unit past the horizon gets none, and its Draw says when its tokens would be
        there. A lane with a reserve, a client without a horizon, or a write that kept
        colliding books nothing: every Draw's wait is 0 (each unit draws on its own)."""
        self._writable("book_tickets")
        for amount in amounts:
            check_amount(self._shard_config, amount, lane)
        nothing = [Draw(False, 0.0, 0.0) for _ in amounts]
        if not amounts or self.horizon_s <= 0 or self.config.reserves.get(lane, 0.0) > 0:
            return nothing
        t = micro(now)
        ends = [sum(amounts[: i + 1]) for i in range(len(amounts))]
        with self._lock:
            requests = 0
            for index in self._shard_order(ends[-1], 0.0, t, now):
                while requests < self._max_requests:
                    s = self._shard(index, now)

                    def plan(k: int, s: ShardState = s) -> ShardWrite:
                        return plan_write(
                            s,
                            t,
                            add=ends[k - 1],
                            ahead=booking_ahead(s, t, self.horizon_s),
                            refund=self._refund_for(s),
                            margin_s=self.margin_s,
                            grid_s=self.full_grid_s,
                            drawn_floor=self._drawn_floor(s, t),
                            requests=k * self._requests,  # a request per unit booked
                        )

                    # the longest prefix of the units whose tokens (and requests) fit within the
                    # horizon
                    booked = next(
                        (k for k in range(len(ends), 0, -1) if plan(k).wait_s is None),
                        0,
                    )
                    if booked == 0:
                        break  # this shard books none of them: try the next one
                    write = plan(booked)
                    requests += 1
                    written, s = self._write(index, write, now)
                    if not written:
                        self.stats.condition_failures += 1
                        continue
                    # the write's tokens end at the shard's position: each unit's end is its
                    # ticket's (ready now if the credit is there already)
                    start = s.position - ends[booked - 1] + write.floor
                    ends_at = [start + end for end in ends]
                    ready = [
                        now if write.credit >= e else float(s.time_for_credit(e)) for e in ends_at
                    ]
                    r, rw = s.requests, write.requests
                    if r is not None and rw is not None:  # and when each unit's request is
                        first = r.position - booked + rw.floor
                        ready = [
                            max(at, float(r.time_for_credit(first + i + 1)))
                            if rw.credit < first + i + 1
                            else at
                            for i, at in enumerate(ready)
                        ]
                    return self._draws(
                        index, amounts, ends_at, ready, booked, s, lane, now, write=write
                    )
            return nothing

    def _draws(
        self,
        index: int,
        amounts: Sequence[int],
        positions: Sequence[Decimal],
        ready: Sequence[float],
        booked: int,
        s: ShardState,
        lane: Lane,
        now: float,
        slot: bool = False,
        write: ShardWrite | None = None,
    ) -> list[Draw]:
        """The Draws of a booking of the first ``booked`` units on shard ``index`` (``s``: the
        shard as the write left it): each a refused Draw with its ticket (``slot``: a place) at
        ``positions[i]``, ready at ``ready[i]``; those past it without one, told when their
        tokens would be there."""
        left = float(s.tokens(micro(now)))
        draws = []
        for i, (amount, position, at) in enumerate(zip(amounts, positions, ready, strict=True)):
            if i >= booked:  # past the horizon: back when its tokens would be there
                self.stats.refused_in_view += 1
                draws.append(Draw(False, at - now, left))
                continue
            self._waits.append(at - now)
            ticket = Ticket(
                governor=self.name,
                shard=index,
                amount=amount,
                lane=lane,
                ready_at=at,
                position=position,
                base_time=s.base_time,
                booked_at=now,
                # a refund's marks (a place draws no tokens: none)
                refunded=ZERO if slot else s.refunded,
                highs=0 if slot else s.highs,
                slot=slot,
                **({} if write is None else self._request_booking(s, write, i + 1, booked)),
            )
            draws.append(Draw(False, at - now, left, ticket=ticket))
        return draws

    def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        """Settle ``grant`` with the ``used`` tokens the model counted
        (docs/explanation/governor.md, "True-up"). What it did not use waits to go back with this
        client's next write to the shard (no request of its own); what it used beyond the grant is
        drawn at once, with one conditional write that always lands (and carries the pending refund,
        if it can)."""
        self._writable("true_up")
        if used < 0:
            raise InvalidInput("used", f"must be >= 0 tokens, got {used!r}")
        with self._lock:
            if used < grant.amount:
                unused = grant.amount - used
                # used 0: the call never went out (the worker releases the grant): its request
                # goes back too, if the bound allows (docs/explanation/governor.md, "Requests per
                # minute")
                released = used == 0 and grant.requests > 0 and grant.requests_mark is not None
                self._add_refund(
                    Refund(
                        grant.shard,
                        Decimal(unused),
                        grant.refunded,
                        grant.highs,
                        requests=grant.requests if released else 0,
                        requests_mark=grant.requests_mark if released else None,
                    )
                )
                return TrueUp(pending=unused)
            if used == grant.amount:
                return TrueUp()
            over = used - grant.amount
            back = self._debit(grant.shard, over, now)
            return TrueUp(refunded=back, debited=over)

    def _add_refund(self, refund: Refund) -> None:
        held = self._pending
        if held is not None and held.shard == refund.shard and held.highs == refund.highs:
            # one refund of both: bounded from the earlier grant's marks, so sound for both
            refund = replace(
                refund,
                amount=held.amount + refund.amount,
                refunded=min(held.refunded, refund.refunded),
            )
        elif held is not None:
            self.stats.refund_dropped += int(held.amount)  # one pending refund at a time
            held = replace(held, amount=ZERO) if held.shard == refund.shard else None
        if held is not None and held.requests > 0:
            # the requests of both, bounded by the lower (stricter) mark: sound for both
            marks = [m for m in (held.requests_mark, refund.requests_mark) if m is not None]
            refund = replace(
                refund, requests=held.requests + refund.requests, requests_mark=min(marks)
            )
        self._pending = refund

    def _refund_for(self, s: ShardState) -> Refund | None:
        """The pending refund, if it may go with a write to ``s``; dropped once a write has seen
        the bucket half full since its grant (it can never go back soundly then)."""
        held = self._pending
        if held is None or held.shard != s.index:
            return None
        if held.highs != s.highs:
            self.stats.refund_dropped += int(held.amount)
            # its requests have a bound of their own (plan_requests): they may still go back
            self._pending = replace(held, amount=ZERO) if held.requests > 0 else None
            return self._pending
        return held

    def _debit(self, index: int, over: int, now: float) -> int:
        """Draw ``over`` tokens, into debt if need be; returns the refund that went with it."""
        t = micro(now)
        for _ in range(DEBIT_TRIES):
            s = self._shard(index, now)
            plan = plan_write(
                s,
                t,
                add=over,
                ahead=None,
                refund=self._refund_for(s),
                margin_s=self.margin_s,
                grid_s=self.full_grid_s,
                drawn_floor=self._drawn_floor(s, t),
            )
            written, _ = self._write(index, plan, now)
            if written:
                self.stats.debited += over
                return int(plan.refund)
            self.stats.condition_failures += 1
        # every try collided (a storm of writes on this shard): land it without conditions. Exact
        # unless the bucket is over capacity at that instant, when the refill it was losing
        # absorbs part of the debit; counted as a half-full sighting, so no refund relies on it.
        self._call(
            "update_item",
            TableName=self.table_name,
            Key=self._key(index),
            UpdateExpression="SET drawn = drawn + :add ADD highs :one",
            ExpressionAttributeValues={":add": _num(Decimal(over)), ":one": _num(Decimal(1))},
        )
        self._cache.pop(index, None)
        self.stats.debited += over
        return 0

    def _write(
        self, index: int, plan: ShardWrite, now: float, queue: tuple[Lane, str] | None = None
    ) -> tuple[bool, ShardState]:
        """The plan's conditional UpdateItem (see :class:`~swarm.core.governor.ShardWrite`);
        ``queue``: a reserved lane's draw without a slot, for a tenant, which goes only if none
        of that tenant's units is queued ahead of it (the credit has reached its queue's end)."""
        if self._cache[index].legacy:
            self._upgrade(index, now)
        sets = ["drawn = drawn + :add", "lost = :lost"]
        conditions = ["lost <= :lost", "refunded <= :refunded_max"]
        values: dict[str, Decimal] = {
            ":add": plan.add,
            ":lost": plan.lost,
            ":refunded_max": plan.refunded_max,
        }
        if plan.refund > 0:
            sets.append("refunded = refunded + :refund")
            values[":refund"] = plan.refund
        if plan.drawn_max is not None:
            conditions.append("drawn <= :drawn_max")
            values[":drawn_max"] = plan.drawn_max
        if plan.drawn_min is not None:
            conditions.append("drawn >= :drawn_min")
            values[":drawn_min"] = plan.drawn_min
        if plan.base_time is not None:
            conditions.append("base_time = :bt")
            values[":bt"] = plan.base_time
        if plan.highs_is is not None:
            conditions.append("highs = :highs_is")
            values[":highs_is"] = Decimal(plan.highs_is)
        names: dict[str, str] = {}
        if queue is not None:
            mine = f"{queue_attribute(queue[0])}.#tenant"
            conditions.append(f"(attribute_not_exists({mine}) OR {mine} <= :credit)")
            values[":credit"] = plan.credit
            names["#tenant"] = queue[1]
        rw = plan.requests
        if rw is not None:  # the request bucket's part, in the same write
            sets += ["r_drawn = r_drawn + :r_add", "r_lost = :r_lost"]
            conditions += ["r_lost <= :r_lost", "r_refunded <= :r_refunded_max"]
            values.update(
                {":r_add": rw.add, ":r_lost": rw.lost, ":r_refunded_max": rw.refunded_max}
            )
            if rw.refund > 0:
                sets.append("r_refunded = r_refunded + :r_refund")
                values[":r_refund"] = rw.refund
            if rw.drawn_max is not None:
                conditions.append("r_drawn <= :r_drawn_max")
                values[":r_drawn_max"] = rw.drawn_max
        update = "SET " + ", ".join(sets)
        if plan.saw_high:
            update += " ADD highs :one"
            values[":one"] = Decimal(1)
        written, s = self._update_shard(index, update, " AND ".join(conditions), values, now, names)
        self._remember(s, now, plan.add if written else ZERO)
        back_r = ZERO if rw is None else rw.refund
        dropped_r = 0 if rw is None else rw.dropped
        if written and (plan.refund > 0 or back_r > 0 or dropped_r > 0):
            self.stats.refunded += int(plan.refund)
            self.stats.requests_refunded += int(back_r)
            held = self._pending
            if held is not None:
                left = held.amount - plan.refund
                left_r = max(0, held.requests - int(back_r) - dropped_r)
                self._pending = (
                    replace(held, amount=left, requests=left_r) if left > 0 or left_r > 0 else None
                )
        return written, s

    def _upgrade(self, index: int, now: float) -> None:
        """Add the attributes a shard stored by an earlier version lacks (once, idempotent):
        ``lost``, ``refunded``, ``highs``, the lanes' queues."""
        result = self._call(
            "update_item",
            TableName=self.table_name,
            Key=self._key(index),
            UpdateExpression=(
                "SET lost = if_not_exists(lost, :zero), "
                "refunded = if_not_exists(refunded, :zero), "
                "highs = if_not_exists(highs, :zero), "
                + ", ".join(
                    f"{queue_attribute(lane)} = if_not_exists({queue_attribute(lane)}, :empty)"
                    for lane in Lane
                )
            ),
            ExpressionAttributeValues={":zero": _num(ZERO), ":empty": {"M": {}}},
            ReturnValues="ALL_NEW",
        )
        self._remember(shard_from_item(result["Attributes"]), now)

    def _update_shard(
        self,
        index: int,
        update: str,
        condition: str,
        values: Mapping[str, Decimal],
        now: float,
        names: Mapping[str, str] | None = None,
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
                **({"ExpressionAttributeNames": dict(names)} if names else {}),
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except client_error_type() as e:
            if error_code(e) != CONDITIONAL_CHECK_FAILED:
                raise
            item = getattr(e, "response", {}).get("Item")
            return False, shard_from_item(item) if item else self._load(now)[index]
        return True, shard_from_item(result["Attributes"])

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
            if new.requests is not None and new.requests.cut_rate is not None:
                # the request bucket's credit banked and cut in the same write
                update += ", r_base_credit = :rbc, r_cut_rate = :rcut"
                values.update({":rbc": new.requests.base_credit, ":rcut": new.requests.cut_rate})
            if count:
                update = "ADD throttles :one " + update + ", last_throttle_at = :now"
                values.update({":one": Decimal(1), ":now": t})
            written, s = self._update_shard(s.index, update, "base_time = :old", values, now)
            if written:
                self._remember(s, now)
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
