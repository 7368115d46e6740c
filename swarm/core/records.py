"""Runs, units, lanes and the records the ledger keeps about them.

A *run* is one submitted batch: an id, the tenant that submitted it, a priority lane, a token
budget, a retry limit and its units. A *unit* is one piece of agent work with a projected token
cost (what admission reserves); the tokens actually spent are only known when an attempt ends.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum

from swarm.core.errors import InvalidInput
from swarm.core.pricing import Prices

#: A run or unit id (and a batch id in the API): the one pattern, used by the API's
#: models, its OpenAPI document and API Gateway's request models too.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_ID = re.compile(ID_PATTERN)


#: A tenant: the caller's IAM role name without the deployment's tenant prefix, so every
#: character an IAM role name may hold (letters, digits and ``+=,.@_-``), at most 64 of them.
TENANT_PATTERN = r"^[A-Za-z0-9+=,.@_-]{1,64}$"
_TENANT = re.compile(TENANT_PATTERN)


def check_tenant(value: str) -> str:
    """Tenants travel in SQS messages (``MessageGroupId``), S3 keys and the ledger's books."""
    if not isinstance(value, str) or not _TENANT.match(value):
        raise InvalidInput(
            "tenant",
            f"{value!r} is not a valid tenant: an IAM role name's characters (letters, digits "
            "and +=,.@_-), 1-64 of them",
        )
    return value


def check_id(field_name: str, value: str) -> str:
    """Ids travel in SQS messages, DynamoDB keys and Step Functions execution names."""
    if not isinstance(value, str) or not _ID.match(value):
        raise InvalidInput(
            field_name,
            f"{value!r} is not a valid id: use 1-128 letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit",
        )
    return value


class Lane(StrEnum):
    """Priority lanes, highest first. Keep the number small enough to reason about."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """0 for the highest lane; lower ranks are served first."""
        return _LANE_ORDER.index(self)

    @classmethod
    def parse(cls, value: str, field_name: str = "lane") -> Lane:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(lane.value for lane in cls)
            raise InvalidInput(
                field_name, f"{value!r} is not a lane; use one of {allowed}"
            ) from None


_LANE_ORDER = (Lane.HIGH, Lane.NORMAL, Lane.LOW)
LANES: tuple[Lane, ...] = _LANE_ORDER


@dataclass(frozen=True)
class UnitSpec:
    """One unit of work as submitted: its id and projected token cost, and that cost in
    micro-dollars at the deployment's prices when it was submitted (0: no prices)."""

    unit_id: str
    projected_tokens: int
    projected_micro: int = 0

    def __post_init__(self) -> None:
        check_id("unit_id", self.unit_id)
        if not isinstance(self.projected_tokens, int) or self.projected_tokens < 1:
            raise InvalidInput(
                f"units[{self.unit_id}].projected_tokens",
                f"must be a positive whole number of tokens, got {self.projected_tokens!r}",
            )
        if not isinstance(self.projected_micro, int) or self.projected_micro < 0:
            raise InvalidInput(
                f"units[{self.unit_id}].projected_micro",
                f"must be whole micro-dollars >= 0, got {self.projected_micro!r}",
            )


def units_digest(units: tuple[UnitSpec, ...]) -> str:
    """What identifies a batch's unit list (ids and projections, in submission order) without
    holding it: compared by an idempotent replay of the submit."""
    h = hashlib.sha256()
    for u in units:
        # not its projected cost: that follows the prices of the day (a replay after a deploy
        # that changed them is the same batch)
        h.update(f"{u.unit_id}\0{u.projected_tokens}\n".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class RunSpec:
    """A batch as submitted. Immutable: resume changes the books, never the spec.

    ``units`` is the unit list where it is held (the submit, the open step, the in-memory
    ledger); the DynamoDB ledger keeps only the run-level fields, so a spec read from it has
    ``units == ()`` and its totals and digest. Equality compares the run-level fields and the
    digest, never the list itself: the same batch either way.
    """

    run_id: str
    tenant: str
    lane: Lane
    budget: int
    units: tuple[UnitSpec, ...] = field(compare=False)
    max_attempts: int = 3
    units_total: int = -1  # len(units), or as stored when the list is not held
    projected_total: int = -1  # the units' projected tokens in all
    digest: str = ""  # units_digest(units)
    #: the budget is in micro-dollars (``budget_usd``), not tokens: ``budget``, the books'
    #: ``budget`` and ``reserved`` and every reservation are then micro-dollars
    #: (docs/explanation/ledger.md, "Money")
    usd: bool = False
    #: the prices the units' ``projected_micro`` were projected at (the submit's): an attempt
    #: settled as lost is billed its projection at these prices. None: the deployment had none
    prices: Prices | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_id("run_id", self.run_id)
        check_tenant(self.tenant)
        if not isinstance(self.budget, int) or self.budget < 0:
            raise InvalidInput(
                "budget", f"must be a whole number of tokens >= 0, got {self.budget!r}"
            )
        if self.usd and self.prices is None:
            raise InvalidInput(
                "budget_usd", "a budget in dollars needs the deployment's prices (model.prices)"
            )
        if not isinstance(self.max_attempts, int) or not 1 <= self.max_attempts <= 100:
            raise InvalidInput("max_attempts", f"must be 1..100, got {self.max_attempts!r}")
        if not self.units:
            if self.units_total < 1 or self.projected_total < 1 or not self.digest:
                raise InvalidInput("units", "a run needs at least one unit")
            return
        seen: set[str] = set()
        for unit in self.units:
            if unit.unit_id in seen:
                raise InvalidInput("units", f"unit id {unit.unit_id!r} appears more than once")
            seen.add(unit.unit_id)
        object.__setattr__(self, "units_total", len(self.units))
        object.__setattr__(self, "projected_total", sum(u.projected_tokens for u in self.units))
        object.__setattr__(self, "digest", units_digest(self.units))

    @property
    def summary(self) -> RunSpec:
        """The run-level fields only (what the DynamoDB ledger keeps)."""
        return replace(self, units=())


class RunState(StrEnum):
    """``opening``: the submit recorded the run and its execution is writing the unit records
    (nothing is admitted yet; only the batch's status is shown); ``open`` admits units;
    ``exhausting`` admits only retries of units that were in flight when the budget ran out;
    ``exhausted`` and ``completed`` are closed (a top-up reopens exhausted)."""

    OPENING = "opening"
    OPEN = "open"
    EXHAUSTING = "exhausting"
    EXHAUSTED = "exhausted"
    COMPLETED = "completed"

    @property
    def closed(self) -> bool:
        return self in (RunState.EXHAUSTED, RunState.COMPLETED)

    @property
    def event(self) -> str:
        """The event name a closed run is announced with (``run.completed`` / ``run.exhausted``)."""
        return f"run.{self.value}"


class UnitState(StrEnum):
    PENDING = "pending"  # waiting for (re-)admission: never admitted, or a retry
    IN_FLIGHT = "in_flight"  # an attempt holds a reservation
    COMPLETED = "completed"
    DEAD_LETTERED = "dead_lettered"
    REMAINDER = "remainder"  # not run because the budget ran out; a top-up brings it back
    #: an agent loop parked on a tool call that waits for a person's decision: its reservation
    #: is kept, no message and no worker hold it (docs/agents.md, "Human gates")
    AWAITING_APPROVAL = "awaiting_approval"

    @property
    def terminal(self) -> bool:
        return self in (UnitState.COMPLETED, UnitState.DEAD_LETTERED, UnitState.REMAINDER)


@dataclass(frozen=True)
class Reservation:
    """Tokens held for one admitted attempt until it settles or its lease expires."""

    attempt: int
    projected: int
    lease_expires: float
    claimed: bool = False  # a worker started the attempt (lease = its visibility timeout)
    #: when the lease sweep looks at it, if not when its lease expires: a claim keeps the lease
    #: of the admission (or unclaim) it took the reservation from here, so it never moves the
    #: reservation in the lease index. A dead worker's attempt is found by its message's next
    #: delivery, after the visibility timeout the claim's lease equals (``Claim.reason``
    #: "stale"); the sweep is the backstop for a message that is gone. None: ``lease_expires``;
    #: ``math.inf``: not in the lease index at all (a fan-out's admission: ``by_scan``), the
    #: sweep finds it by reading the run's units once its horizon passed (``RunRecord.scan_at``)
    sweep_at: float | None = None
    #: an agent loop's reservation (``Ledger.claim(..., loop=True)``): its attempt spans many
    #: model turns, each settled on its own (``Ledger.settle_turn``); a stale claim of it is
    #: taken over, never settled as lost
    loop: bool = False
    #: the tokens of the turns settled against this reservation
    used: int = 0
    #: their cost in micro-dollars
    used_micro: int = 0
    #: ``projected`` is micro-dollars (its run's budget is in dollars: ``RunSpec.usd``)
    usd: bool = False

    @property
    def held(self) -> int:
        """What the reservation holds in the run's ``reserved``: its projection less the turns
        settled against it (in the run's budget's unit), never below 0 (a turn beyond it was an
        overrun, billed as spent)."""
        return max(0, self.projected - (self.used_micro if self.usd else self.used))

    @property
    def swept_from(self) -> float:
        """When the lease sweep looks at this reservation (the lease index's key)."""
        return self.lease_expires if self.sweep_at is None else self.sweep_at


@dataclass(frozen=True)
class UnitRecord:
    run_id: str
    unit_id: str
    projected_tokens: int
    state: UnitState = UnitState.PENDING
    attempts: int = 0  # attempts settled so far; the next attempt's number is this value
    spent: int = 0  # tokens settled over every attempt of this unit
    reservation: Reservation | None = None
    # the run's exhaustion epoch in which an attempt of this unit failed during the drain: the
    # unit is owed a drain retry while that exhaustion lasts (0 = never)
    drain_epoch: int = 0
    #: the results store's object holding the outcome of the unit's last settled attempt (a page
    #: of a worker invocation's outcomes, or the attempt's own record), as its settlement wrote
    #: it; None: the attempt's own key (settled before pages, or settled as lost)
    outcome_key: str | None = None
    #: the unit's model turns settled so far, across attempts (an agent loop's: turn n settles
    #: only when this is n - 1, ``Ledger.settle_turn``)
    turns: int = 0
    #: where the unit's event log is kept (``Ledger.read_log``): set by its first settled turn
    log_key: str | None = None
    #: the unit's projected cost per attempt in micro-dollars (``UnitSpec.projected_micro``)
    projected_micro: int = 0
    #: micro-dollars settled over every attempt of this unit
    spent_micro: int = 0

    def projected_in(self, usd: bool) -> int:
        """What an attempt reserves in a run's budget's unit: micro-dollars or tokens."""
        return self.projected_micro if usd else self.projected_tokens

    def with_(self, **changes: object) -> UnitRecord:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def next_attempt(self) -> int:
        """The attempt an admission of the unit is for: its reservation's (admitted already),
        else the next after those it settled."""
        return self.reservation.attempt if self.reservation else self.attempts


@dataclass(frozen=True)
class RunRecord:
    """The run's books. ``spent + reserved <= budget`` holds after every admission."""

    spec: RunSpec
    state: RunState = RunState.OPEN
    spent: int = 0
    reserved: int = 0
    attempts: int = 0
    retries: int = 0
    completed: int = 0
    dead_lettered: int = 0
    remainder: int = 0
    in_flight: int = 0
    #: agent loops parked until a person decides on a tool call (UnitState.AWAITING_APPROVAL):
    #: outstanding, but neither pending nor in flight (a drain does not wait for them)
    awaiting: int = 0
    exhaustions: int = 0  # how many times the budget ran out (the current drain's epoch)
    turns: int = 0  # agent units' model turns settled (Ledger.settle_turn)
    tool_calls: int = 0  # the tool calls those turns made
    spent_micro: int = 0  # micro-dollars settled (every attempt's and turn's priced usage)
    budget: int = field(default=-1)  # the spec's budget plus every top-up
    opened_at: float = 0.0
    closed_at: float | None = None
    #: while ``opening``: how many unit records the open step has written so far
    units_written: int | None = None
    #: when the lease sweep reads every unit of the run: the latest lease of a reservation the
    #: lease index does not hold (``Reservation.sweep_at`` is ``math.inf``: the fan-out's
    #: admissions), or None when there is none to look for
    scan_at: float | None = None

    def __post_init__(self) -> None:
        if self.budget < 0:
            object.__setattr__(self, "budget", self.spec.budget)

    @property
    def run_id(self) -> str:
        return self.spec.run_id

    @property
    def units_total(self) -> int:
        return self.spec.units_total

    @property
    def outstanding(self) -> int:
        """Units pending or in flight: the run closes exactly when this reaches 0."""
        return self.units_total - self.completed - self.dead_lettered - self.remainder

    @property
    def pending(self) -> int:
        return self.outstanding - self.in_flight - self.awaiting

    @property
    def charged(self) -> int:
        """What was settled, in the budget's unit: micro-dollars (``spec.usd``) or tokens."""
        return self.spent_micro if self.spec.usd else self.spent

    @property
    def available(self) -> int:
        return self.budget - self.charged - self.reserved

    def with_(self, **changes: object) -> RunRecord:
        return replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class AttemptRecord:
    """One settled attempt: the unit of exactly-once settlement."""

    run_id: str
    unit_id: str
    attempt: int
    tokens: int
    succeeded: bool
    settled_at: float
    reclaimed: bool = False  # settled by lease expiry (the worker died holding it)
    cost_micro: int = 0  # its usage priced, in micro-dollars (0: no prices)
    prices: Prices | None = None  # the prices it was settled at
