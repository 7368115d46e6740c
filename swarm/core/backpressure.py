"""Backpressure at the front door: when to shed a new submission, and for how long.

The chain (seed 002): the governor sees throttling -> admission slows -> the lanes grow -> the API
sheds with 429 and a Retry-After. A submission to lane L is shed when the work queued *ahead of
it* (L and every higher lane) is past L's depth limit, or, for every lane but the highest, when the
governor has reported model throttles within the recent window. Higher lanes have higher limits,
so they shed last. Retry-After is how long the governed rate (as slowed by throttles) needs to
drain the work ahead: ``depth x average unit tokens / effective rate``. With several models
(cdk.json ``models``), each has its own bucket: a submission answers to the buckets of the models
its units name (:func:`binding_snapshot`), so a flood of throttles on one model sheds the work
bound for it, not the work of another.

Per tenant (:mod:`swarm.core.tenancy`): a submission that would take its tenant past its own
``max_queued_units`` is shed first (``tenant_queue``, whatever the lanes hold; Retry-After is the
time the tenant's queue, at the rate it is measured to drain, needs for the excess: the governed
rate's estimate is only the fallback, as units often spend far fewer tokens than projected), and
the lanes' depth limits are a ceiling that
refuses only a tenant past its ``guaranteed_units``: a tenant with little queued is never shed
because another tenant filled the lanes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from swarm.core.governor import GovernorSnapshot
from swarm.core.records import LANES, Lane
from swarm.core.tenancy import TenantQueue

MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 3_600
#: a run's drain is measured over at least this long: a run opened a moment ago tells little
MIN_DRAIN_WINDOW_S = 10.0
#: fewer units drained than this: no measured rate (the governed rate's estimate stands)
MIN_DRAINED_UNITS = 10


@dataclass(frozen=True)
class ShedPolicy:
    depth_limits: Mapping[Lane, int]  # units queued at or above the lane before it sheds
    throttle_window_s: float = 60.0  # throttles this recent shed every lane but the highest

    def limit(self, lane: Lane) -> int:
        return self.depth_limits.get(lane, 0) or 2**62


@dataclass(frozen=True)
class Shed:
    reason: str  # tenant_queue | tenant_busy | lane_depth | throttling
    retry_after_s: int
    depth_ahead: int
    tenant_queued: int | None = None  # the tenant's queued units (tenant_queue)
    tenant_max: int | None = None  # and its max_queued_units
    drain_units_s: float | None = None  # its queue's measured drain (tenant_queue), if known


def depth_ahead(depths: Mapping[Lane, int], lane: Lane) -> int:
    """Units a new unit on ``lane`` waits behind: its own lane and every higher one."""
    return sum(depths.get(other, 0) for other in LANES if other.rank <= lane.rank)


def binding_snapshot(
    snapshots: Sequence[GovernorSnapshot], now: float, window_s: float
) -> GovernorSnapshot:
    """Of the buckets of a submission's models (one each, in any order), the one its
    backpressure answers to: the one throttled last, if any was within ``window_s`` (its units
    would wait on that model's throttles), else the one draining slowest (the Retry-After of
    the work ahead, estimated at the slowest of its models' rates: never too short)."""
    if not snapshots:
        raise ValueError("a submission uses at least one model")
    throttled = [s for s in snapshots if s.throttled_recently(now, window_s)]
    if throttled:
        return max(throttled, key=lambda s: s.last_throttle_at or 0.0)
    return min(snapshots, key=lambda s: s.effective_rate)


def retry_after(depth: int, avg_unit_tokens: float, snapshot: GovernorSnapshot) -> int:
    seconds = depth * avg_unit_tokens / max(snapshot.effective_rate, 1e-9)
    return int(min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, math.ceil(seconds))))


def drain_rate(progress: Sequence[tuple[float, int]], now: float) -> float | None:
    """Units a second a tenant's queue drains at, measured from its open runs' progress
    ((opened_at, units completed or dead-lettered) each, :class:`swarm.core.ports.TenantQueued`):
    each run's units over the time since it opened (at least ``MIN_DRAIN_WINDOW_S``), summed over
    the runs, which drain side by side. None when fewer than ``MIN_DRAINED_UNITS`` have drained:
    too little to measure (a first batch, or one still waiting for its first units)."""
    if sum(drained for _, drained in progress) < MIN_DRAINED_UNITS:
        return None
    return sum(
        drained / max(now - opened_at, MIN_DRAIN_WINDOW_S)
        for opened_at, drained in progress
        if drained > 0
    )


def drain_retry_after(units: int, units_per_s: float) -> int:
    """Seconds for ``units`` to drain at ``units_per_s``, within [MIN, MAX]_RETRY_AFTER_S."""
    seconds = units / max(units_per_s, 1e-9)
    return int(min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, math.ceil(seconds))))


def tenant_shed(
    tenant: TenantQueue, avg_unit_tokens: float, snapshot: GovernorSnapshot, ahead: int = 0
) -> Shed | None:
    """The tenant's own cap alone (also a resume's, whose remainder is queued again): a Shed
    when the submission would take it past ``max_queued_units``, with the time its queue needs to
    drain the excess as its Retry-After: at the rate it is measured to drain
    (``tenant.drain_units_s``), else (too little drained to tell) at the governed rate, as if
    every unit spent its projected tokens."""
    if tenant.over_cap <= 0:
        return None
    rate = tenant.drain_units_s
    wait = (
        drain_retry_after(tenant.over_cap, rate)
        if rate is not None and rate > 0
        else retry_after(tenant.over_cap, avg_unit_tokens, snapshot)
    )
    return Shed(
        "tenant_queue",
        wait,
        ahead,
        tenant_queued=tenant.queued,
        tenant_max=tenant.limits.max_queued_units,
        drain_units_s=rate,
    )


def shed_decision(
    policy: ShedPolicy,
    lane: Lane,
    depths: Mapping[Lane, int],
    snapshot: GovernorSnapshot,
    avg_unit_tokens: float,
    now: float,
    tenant: TenantQueue | None = None,
) -> Shed | None:
    """None admits the submission; a :class:`Shed` refuses it with a Retry-After.

    ``tenant`` (the submitting tenant's limits and queued units) makes the decision per tenant:
    its own cap first, and the lanes' depth only past its guaranteed share. Without it, the
    lanes' depth refuses everyone alike."""
    ahead = depth_ahead(depths, lane)
    if tenant is not None:
        over = tenant_shed(tenant, avg_unit_tokens, snapshot, ahead)
        if over is not None:
            return over
    exempt = tenant is not None and tenant.within_share
    if ahead >= policy.limit(lane) and not exempt:
        return Shed("lane_depth", retry_after(ahead, avg_unit_tokens, snapshot), ahead)
    if lane is not LANES[0] and snapshot.throttled_recently(now, policy.throttle_window_s):
        wait = retry_after(ahead, avg_unit_tokens, snapshot)
        if snapshot.last_throttle_at is not None:  # at least until the window has passed
            wait = max(wait, math.ceil(snapshot.last_throttle_at + policy.throttle_window_s - now))
        return Shed("throttling", min(wait, MAX_RETRY_AFTER_S), ahead)
    return None
