"""Capacity planning: from a quota, a governor share, a unit profile and a budget, the fleet to
deploy and what a batch will cost and take (``swarm plan``; docs/planner.md).

The fleet's size is arithmetic (:func:`swarm.core.scheduling.size_fleet`, the same the stack's
``worker.concurrency: "auto"`` runs at synth); the makespan and the spend are simulated, on the
given seed and on ``seeds`` seeds in all (failures, and the sizes of a generated workload, change
with the seed), because a run's end is set by which late attempts fail.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any

from swarm.core.errors import InvalidInput
from swarm.core.governor import check_amount
from swarm.core.records import Lane, RunState
from swarm.core.scheduling import (
    LANE_COUNT,
    MAPPING_CONCURRENCY,
    UNRESERVED_MINIMUM,
    FleetSizing,
    UnitProfile,
    expected_attempts,
    size_fleet,
)
from swarm.sim.agent import check_agent_units
from swarm.sim.engine import FleetConfig, SimResult, simulate
from swarm.sim.workload import Workload

#: What ``account_concurrency_limit`` defaults to in cdk.json: Lambda's default quota of
#: concurrent executions per region.
DEFAULT_ACCOUNT_LIMIT = 1000


@dataclass(frozen=True)
class Spread:
    """One figure over the simulated seeds."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.fmean(values), min(values), max(values))


@dataclass(frozen=True)
class Outcome:
    """A fleet size and what the simulations of the batch on it gave."""

    workers: int
    seeded: SimResult  # the run on the plan's own seed
    elapsed: Spread
    spent: Spread
    completed_runs: int  # seeds whose run completed (the others exhausted the budget)
    completed_units: Spread


@dataclass(frozen=True)
class Plan:
    workload: Workload
    fleet: FleetConfig  # the simulated fleet (``workers`` is the per-lane concurrency)
    seeds: int
    account_limit: int
    profile: UnitProfile
    sizing: FleetSizing
    outcome: Outcome  # with the recommended fleet
    fitting: Outcome | None  # with the largest fleet the account can reserve, if smaller
    usd_per_mtok: float | None

    @property
    def problem(self) -> str | None:
        return self.sizing.problem(self.account_limit)

    @property
    def expected_spend(self) -> float:
        """First attempts plus the retries the failure rate implies (budget aside)."""
        w = self.workload
        per_unit = expected_attempts(w.failure_rate, self.fleet.max_attempts)
        if not w.turns.agent:
            return w.first_attempt_tokens * per_unit
        # agent units fail turn by turn: a lost turn bills its draw and is called again
        # (approximately: the attempts a unit has left, and the cap, are not counted)
        return sum(
            turn.billed + (per_unit - 1) * turn.draw
            for index in range(w.units)
            for turn in w.turn_plan(index)
        )

    def cost(self, tokens: float) -> float | None:
        return None if self.usd_per_mtok is None else tokens * self.usd_per_mtok / 1e6

    def budget_covering(self) -> int:
        """The smallest budget under which every simulated seed completed its run on the
        recommended fleet: the most any seed would have spent (a lower budget exhausts some)."""
        return round(self.outcome.spent.high) if self.outcome.completed_runs == self.seeds else 0

    def cdk_context(self) -> dict[str, Any]:
        """The cdk.json context keys to set (merge; keys not shown keep their values)."""
        lanes = {lane.value: {"max_concurrency": self.sizing.per_lane} for lane in Lane}
        return {
            "quota_tpm": self.fleet.quota_tpm,
            "governor_share": self.fleet.share,
            "max_attempts": self.fleet.max_attempts,
            "lanes": lanes,
            "worker": {"reserved_concurrency": self.sizing.reserved},
        }

    def profile_doc(self) -> dict[str, float]:
        """The unit profile as cdk.json's ``worker.unit_profile`` holds it."""
        p = self.profile
        return {
            "mean_tokens": p.mean_tokens,
            "mean_seconds": p.mean_seconds,
            "small_tokens": p.small_tokens,
            "small_seconds": p.small_seconds,
        }

    def cdk_context_auto(self) -> dict[str, Any]:
        """The same fleet derived at synth (lanes.*.max_concurrency and
        worker.reserved_concurrency left out)."""
        return {
            "quota_tpm": self.fleet.quota_tpm,
            "governor_share": self.fleet.share,
            "max_attempts": self.fleet.max_attempts,
            "worker": {"concurrency": "auto", "unit_profile": self.profile_doc()},
        }


def plan(
    workload: Workload,
    fleet: FleetConfig,
    seeds: int = 20,
    account_limit: int = DEFAULT_ACCOUNT_LIMIT,
    usd_per_mtok: float | None = None,
) -> Plan:
    """Size the fleet for ``workload`` under ``fleet``'s quota, share, budget, attempts and
    policy (``fleet.workers`` is ignored), and simulate the batch on it."""
    if seeds < 1:
        raise InvalidInput("seeds", f"must be >= 1, got {seeds}")
    if account_limit < 1:
        raise InvalidInput("account_concurrency_limit", f"must be >= 1, got {account_limit}")
    if usd_per_mtok is not None and usd_per_mtok < 0:
        raise InvalidInput("usd_per_mtok", f"must be >= 0, got {usd_per_mtok}")
    config = fleet.governor
    if workload.turns.agent:
        check_agent_units(workload, fleet)  # each turn's draw, not the whole loop, must fit
    else:
        for index in range(workload.units):
            try:
                check_amount(config, workload.tokens(index), Lane.NORMAL)
            except InvalidInput as e:
                raise InvalidInput(f"units[{index}].projected_tokens", e.message) from None
    profile = workload.profile()
    sizing = size_fleet(config.rate, profile)
    outcome = _simulate(workload, replace(fleet, workers=sizing.per_lane), seeds)
    fitting = None
    low, high = MAPPING_CONCURRENCY
    most = min((account_limit - UNRESERVED_MINIMUM) // LANE_COUNT, high)
    if sizing.problem(account_limit) is not None and most >= low:
        fitting = _simulate(workload, replace(fleet, workers=most), seeds)
    return Plan(
        workload=workload,
        fleet=replace(fleet, workers=sizing.per_lane),
        seeds=seeds,
        account_limit=account_limit,
        profile=profile,
        sizing=sizing,
        outcome=outcome,
        fitting=fitting,
        usd_per_mtok=usd_per_mtok,
    )


def _simulate(workload: Workload, fleet: FleetConfig, seeds: int) -> Outcome:
    runs = [simulate(workload.with_seed(workload.seed + k), fleet) for k in range(seeds)]
    for r in runs:
        if r.horizon_reached:
            raise InvalidInput(
                "plan", f"a simulated run did not finish within {fleet.horizon_s:,} s"
            )
    return Outcome(
        workers=fleet.workers,
        seeded=runs[0],
        elapsed=Spread.of([float(r.elapsed) for r in runs]),
        spent=Spread.of([float(r.run.spent) for r in runs]),
        completed_runs=sum(1 for r in runs if r.run.state is RunState.COMPLETED),
        completed_units=Spread.of([float(r.run.completed) for r in runs]),
    )
