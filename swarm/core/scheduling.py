"""The scheduling policy: the order a batch's units are fanned out and admitted in, and the
arithmetic that sizes a fleet for a quota (N*, the workers that keep the quota busy, the makespan
floor). Pure, standard library only: the simulator, the fan-out, ``swarm plan`` and the stack's
``worker.concurrency: "auto"`` all use it. The reasoning and the measurements:
docs/explanation/planner.md.

Three policies, each applied inside one tenant's queue of one lane (lanes keep their strict
priority, tenants their round-robin, whatever the policy):

- ``book``: Lab 6.1's loop. Units in submission order, a failed attempt's retry at the back of
  the queue, and a head that does not fit the governor's bucket blocks the units behind it.
- ``largest-first`` (the default): units with the most projected tokens first (ties keep their
  submission order), a retry at the head of its queue, and the head still waits for its tokens.
  Under a binding quota the makespan is when the last token is granted plus the service time of
  what runs last: largest-first leaves the shortest units, and the shortest retries, for the end.
  With the workers binding it is the classic longest-processing-time-first rule.
- ``largest-fit``: the same order, but no head-of-line blocking: the largest queued unit that
  fits the bucket now is admitted. It lets small units overtake while the bucket refills, which
  spends the short units early and leaves large ones for the end; kept to compare against.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from swarm.core.errors import InvalidInput

T = TypeVar("T")


class Schedule(StrEnum):
    BOOK = "book"
    LARGEST_FIRST = "largest-first"
    LARGEST_FIT = "largest-fit"

    @classmethod
    def parse(cls, value: str) -> Schedule:
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            raise InvalidInput(
                "policy", f"{value!r} is not a policy; use one of {allowed}"
            ) from None

    @property
    def retries_first(self) -> bool:
        """A failed attempt's retry goes to the head of its queue (else to the back)."""
        return self is not Schedule.BOOK

    @property
    def head_of_line(self) -> bool:
        """The head of the queue waits for its tokens and the units behind it wait too."""
        return self is not Schedule.LARGEST_FIT


#: The policy of the simulator's fleet, ``swarm plan`` and the stack's fan-out.
DEFAULT_SCHEDULE = Schedule.LARGEST_FIRST


def fanout_order(
    items: Iterable[T], tokens: Callable[[T], int], schedule: Schedule = DEFAULT_SCHEDULE
) -> list[T]:
    """The order a batch's units enter their lane: ``items`` as submitted for the book, else
    the most projected tokens first (a stable sort: equal units keep their submission order)."""
    ordered = list(items)
    if schedule is Schedule.BOOK:
        return ordered
    return sorted(ordered, key=lambda item: -tokens(item))


# ---------------------------------------------------------------------- the fleet's arithmetic


@dataclass(frozen=True)
class ServiceModel:
    """A unit's wall clock on a worker: ``base_s`` plus one second per ``tokens_per_s`` tokens
    (Lab 6.1: 180 s + tokens // 100, about five minutes for its units)."""

    base_s: int = 180
    tokens_per_s: int = 100

    def __post_init__(self) -> None:
        if not isinstance(self.base_s, int) or self.base_s < 0:
            raise InvalidInput("base_seconds", f"must be a whole number >= 0, got {self.base_s!r}")
        if not isinstance(self.tokens_per_s, int) or self.tokens_per_s < 1:
            raise InvalidInput(
                "tokens_per_second", f"must be a whole number >= 1, got {self.tokens_per_s!r}"
            )

    def seconds(self, tokens: int) -> int:
        return self.base_s + tokens // self.tokens_per_s


def crossover_workers(rate: float, mean_tokens: float, mean_service_s: float) -> int:
    """N*, Little's law: the workers the governed rate (tokens/s) keeps busy on average, the
    book's ``units_per_min * avg_secs / 60`` (the same expression, so the same rounding)."""
    if rate <= 0 or mean_tokens <= 0 or mean_service_s < 0:
        raise InvalidInput("profile", "needs a rate and unit sizes > 0 and service times >= 0")
    units_per_min = rate * 60 / mean_tokens
    return math.ceil(units_per_min * mean_service_s / 60)


def busy_workers(rate: float, small_tokens: int, small_service_s: float) -> int:
    """The workers that keep the quota busy even while only small units run.

    A unit of ``t`` tokens holds a worker ``s`` seconds, so the rate keeps ``rate * s / t``
    workers busy on such units. ``s / t`` is largest for the smallest units (a service time is a
    fixed part plus a part per token), and largest-first runs them last, together: a fleet of
    this size is never the bottleneck, and every worker beyond it only waits for the governor.
    """
    if rate <= 0 or small_tokens < 1 or small_service_s < 0:
        raise InvalidInput("profile", "needs a rate and unit sizes > 0 and service times >= 0")
    return max(1, math.ceil(rate * small_service_s / small_tokens))


def small_unit_tokens(sizes: Sequence[int], share: float = 0.05) -> int:
    """The size below which the smallest units hold ``share`` of a workload's tokens: the
    "small unit" :func:`busy_workers` sizes for, so that a handful of outliers does not."""
    if not sizes:
        raise InvalidInput("units", "a workload needs at least one unit")
    ordered = sorted(sizes)
    target = share * sum(ordered)
    seen = 0
    for size in ordered:
        seen += size
        if seen >= target:
            return size
    return ordered[-1]


#: Lambda keeps this much of an account's concurrency unreserved, whatever functions reserve.
UNRESERVED_MINIMUM = 100
#: An SQS event source mapping's ``MaximumConcurrency`` range.
MAPPING_CONCURRENCY = (2, 1000)
#: The lanes a fleet is sized for (high, normal, low): each may carry a batch on its own.
LANE_COUNT = 3


@dataclass(frozen=True)
class FleetSizing:
    """What the quota and the unit profile call for: each lane's event source mapping may run
    ``per_lane`` workers (any lane alone can keep the quota busy: lane priority is the
    governor's reserves, not a smaller fleet), and the worker function reserves them all."""

    n_star: int
    per_lane: int

    @property
    def reserved(self) -> int:
        return self.per_lane * LANE_COUNT

    def problem(self, account_limit: int) -> str | None:
        """Why this fleet cannot be deployed in an account with ``account_limit`` concurrent
        executions (Lambda's "Concurrent executions" quota), or None."""
        high = MAPPING_CONCURRENCY[1]
        if self.per_lane > high:
            return (
                f"each lane needs {self.per_lane} concurrent workers, more than an event source "
                f"mapping's MaximumConcurrency of {high}"
            )
        reservable = account_limit - UNRESERVED_MINIMUM
        if self.reserved > reservable:
            return (
                f"the {LANE_COUNT} lanes need {self.reserved} reserved concurrent executions "
                f"({LANE_COUNT} x {self.per_lane}); an account limit of {account_limit} can "
                f"reserve at most {max(0, reservable)} (Lambda keeps {UNRESERVED_MINIMUM} "
                "unreserved)"
            )
        return None


@dataclass(frozen=True)
class UnitProfile:
    """What sizing a fleet needs to know about its units: the mean unit (tokens, seconds on a
    worker) for N*, and a small unit (see :func:`small_unit_tokens`) for the workers that keep
    the quota busy. ``swarm plan`` measures it from a manifest or a size range; the stack's
    ``worker.unit_profile`` holds the same four numbers."""

    mean_tokens: float
    mean_seconds: float
    small_tokens: int
    small_seconds: float

    def __post_init__(self) -> None:
        for name in ("mean_tokens", "small_tokens"):
            if not getattr(self, name) > 0:
                raise InvalidInput(name, f"must be > 0, got {getattr(self, name)!r}")
        for name in ("mean_seconds", "small_seconds"):
            if not getattr(self, name) >= 0:
                raise InvalidInput(name, f"must be >= 0, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, sizes: Sequence[int], service: ServiceModel) -> UnitProfile:
        """The profile of units of these sizes under this service model."""
        if not sizes:
            raise InvalidInput("units", "a workload needs at least one unit")
        small = small_unit_tokens(sizes)
        return cls(
            mean_tokens=sum(sizes) / len(sizes),
            mean_seconds=sum(service.seconds(t) for t in sizes) / len(sizes),
            small_tokens=small,
            small_seconds=service.seconds(small),
        )


def size_fleet(rate: float, profile: UnitProfile) -> FleetSizing:
    """N* and the per-lane concurrency (:func:`busy_workers`, never below N* nor an event
    source mapping's minimum of 2)."""
    n_star = crossover_workers(rate, profile.mean_tokens, profile.mean_seconds)
    busy = busy_workers(rate, profile.small_tokens, profile.small_seconds)
    return FleetSizing(n_star=n_star, per_lane=max(busy, n_star, MAPPING_CONCURRENCY[0]))


# ---------------------------------------------------------------------- the floor


@dataclass(frozen=True)
class Floor:
    """A lower bound on a run's makespan, whatever the schedule, and what sets it.

    ``quota_s``: every token must be granted (``tokens / rate`` seconds from an empty bucket,
    in whole seconds) and the last unit granted must still run (at least the shortest service
    time). ``workers_s``: the workers must do every attempt's service time between them.
    ``chain_s``: a unit's attempts run one after the other, the first not before its tokens.
    """

    quota_s: int
    workers_s: int
    chain_s: int

    @property
    def seconds(self) -> int:
        return max(self.quota_s, self.workers_s, self.chain_s)

    @property
    def bound_by(self) -> str:
        if self.seconds == self.quota_s:
            return "quota"
        return "workers" if self.seconds == self.workers_s else "retries"


@dataclass(frozen=True)
class Attempt:
    """One attempt of a unit, as the floor counts it: its tokens and its service time."""

    unit_id: str
    tokens: int
    service_s: int


def makespan_floor(
    attempts: Sequence[Attempt], rate: float, workers: int, initial_tokens: float = 0.0
) -> Floor:
    """The :class:`Floor` of a run that made ``attempts`` with ``workers`` at ``rate``."""
    if not attempts:
        return Floor(0, 0, 0)
    if rate <= 0 or workers < 1:
        raise InvalidInput("fleet", "the floor needs a rate > 0 and at least one worker")
    tokens = sum(a.tokens for a in attempts)
    grant_s = math.ceil(max(0.0, tokens - initial_tokens) / rate)
    quota_s = grant_s + min(a.service_s for a in attempts)
    workers_s = math.ceil(sum(a.service_s for a in attempts) / workers)
    chains: dict[str, tuple[int, int]] = {}
    for a in attempts:
        first, total = chains.get(a.unit_id, (a.tokens, 0))
        chains[a.unit_id] = (first, total + a.service_s)
    chain_s = max(
        math.ceil(max(0.0, first - initial_tokens) / rate) + total
        for first, total in chains.values()
    )
    return Floor(quota_s=quota_s, workers_s=workers_s, chain_s=chain_s)


def expected_attempts(failure_rate: float, max_attempts: int) -> float:
    """Attempts per unit on average when each fails independently with ``failure_rate``."""
    return sum(failure_rate**k for k in range(max_attempts))
