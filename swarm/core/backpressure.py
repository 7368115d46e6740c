"""Backpressure at the front door: when to shed a new submission, and for how long.

The chain (seed 002): the governor sees throttling -> admission slows -> the lanes grow -> the API
sheds with 429 and a Retry-After. A submission to lane L is shed when the work queued *ahead of
it* (L and every higher lane) is past L's depth limit, or, for every lane but the highest, when the
governor has reported model throttles within the recent window. Higher lanes have higher limits,
so they shed last. Retry-After is how long the governed rate (as slowed by throttles) needs to
drain the work ahead: ``depth x average unit tokens / effective rate``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from swarm.core.governor import GovernorSnapshot
from swarm.core.records import LANES, Lane

MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 3_600


@dataclass(frozen=True)
class ShedPolicy:
    depth_limits: Mapping[Lane, int]  # units queued at or above the lane before it sheds
    throttle_window_s: float = 60.0  # throttles this recent shed every lane but the highest

    def limit(self, lane: Lane) -> int:
        return self.depth_limits.get(lane, 0) or 2**62


@dataclass(frozen=True)
class Shed:
    reason: str  # lane_depth | throttling
    retry_after_s: int
    depth_ahead: int


def depth_ahead(depths: Mapping[Lane, int], lane: Lane) -> int:
    """Units a new unit on ``lane`` waits behind: its own lane and every higher one."""
    return sum(depths.get(other, 0) for other in LANES if other.rank <= lane.rank)


def retry_after(depth: int, avg_unit_tokens: float, snapshot: GovernorSnapshot) -> int:
    seconds = depth * avg_unit_tokens / max(snapshot.effective_rate, 1e-9)
    return int(min(MAX_RETRY_AFTER_S, max(MIN_RETRY_AFTER_S, math.ceil(seconds))))


def shed_decision(
    policy: ShedPolicy,
    lane: Lane,
    depths: Mapping[Lane, int],
    snapshot: GovernorSnapshot,
    avg_unit_tokens: float,
    now: float,
) -> Shed | None:
    """None admits the submission; a :class:`Shed` refuses it with a Retry-After."""
    ahead = depth_ahead(depths, lane)
    if ahead >= policy.limit(lane):
        return Shed("lane_depth", retry_after(ahead, avg_unit_tokens, snapshot), ahead)
    if lane is not LANES[0] and snapshot.throttled_recently(now, policy.throttle_window_s):
        wait = retry_after(ahead, avg_unit_tokens, snapshot)
        if snapshot.last_throttle_at is not None:  # at least until the window has passed
            wait = max(wait, math.ceil(snapshot.last_throttle_at + policy.throttle_window_s - now))
        return Shed("throttling", min(wait, MAX_RETRY_AFTER_S), ahead)
    return None
