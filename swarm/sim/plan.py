"""Capacity planning: from a quota, a governor share, a unit profile and a budget, the fleet to
deploy and what a batch will cost and take (``swarm plan``; docs/explanation/planner.md).

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
    busy_workers,
    crossover_workers,
    expected_attempts,
    size_fleet,
    small_unit_tokens,
)
from swarm.sim.agent import check_agent_units
from swarm.sim.engine import FleetConfig, SimResult, simulate
from swarm.sim.models import Models
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
    return _outcome(runs, fleet.workers, fleet.horizon_s)


def _outcome(runs: list[SimResult], workers: int, horizon_s: int) -> Outcome:
    for r in runs:
        if r.horizon_reached:
            raise InvalidInput("plan", f"a simulated run did not finish within {horizon_s:,} s")
    return Outcome(
        workers=workers,
        seeded=runs[0],
        elapsed=Spread.of([float(r.elapsed) for r in runs]),
        spent=Spread.of([float(r.run.spent) for r in runs]),
        completed_runs=sum(1 for r in runs if r.run.state is RunState.COMPLETED),
        completed_units=Spread.of([float(r.run.completed) for r in runs]),
    )


# ---------------------------------------------------------------------- several models


@dataclass(frozen=True)
class ModelLimit:
    """What limits one model's units (several models): its governed rates, its mean unit, and
    N* (the workers beyond which its units gain nothing: Little's law on the rate that binds,
    TPM or RPM)."""

    name: str
    units: int
    mean_tokens: float  # billed, per unit
    mean_quota_tokens: float  # drawn, per unit (output at the model's burndown)
    mean_seconds: float
    tpm_rate: float  # governed quota tokens per second
    rpm_rate: float | None  # governed requests per second (None: no rpm)
    n_star: int
    busy: int  # workers that keep the binding rate busy while its small units run

    @property
    def units_per_s_tpm(self) -> float:
        return self.tpm_rate / self.mean_quota_tokens

    @property
    def quota(self) -> str:
        """The quota that binds the model's units: RPM when its requests run out first."""
        if self.rpm_rate is not None and self.rpm_rate < self.units_per_s_tpm:
            return "RPM"
        return "TPM"

    @property
    def workers(self) -> int:
        """The workers the model's units can keep busy (never below N*)."""
        return max(self.busy, self.n_star)

    def doc(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "units": self.units,
            "mean_tokens": round(self.mean_tokens, 3),
            "mean_quota_tokens": round(self.mean_quota_tokens, 3),
            "mean_seconds": round(self.mean_seconds, 3),
            "tpm_tokens_per_s": round(self.tpm_rate, 3),
            "rpm_requests_per_s": None if self.rpm_rate is None else round(self.rpm_rate, 3),
            "units_per_s_by_tpm": round(self.units_per_s_tpm, 4),
            "units_per_s_by_rpm": None if self.rpm_rate is None else round(self.rpm_rate, 4),
            "quota_binding": self.quota,
            "n_star": self.n_star,
            "workers_busy": self.workers,
        }


def model_limits(workload: Workload, fleet: FleetConfig) -> tuple[ModelLimit, ...]:
    """Each model of ``fleet.models`` with units in the mix, in the mix's order."""
    models = fleet.models
    if models is None:
        raise InvalidInput("models", "model limits need fleet.models")
    assigned = models.assign(workload.units, workload.seed)
    out = []
    for spec in models.used:
        sizes = [workload.tokens(i) for i, name in enumerate(assigned) if name == spec.name]
        if not sizes:
            continue
        share = spec.share(fleet.share)
        tpm_rate = spec.tpm / 60 * share
        rpm_rate = None if spec.rpm is None else spec.rpm / 60 * share
        draws = [models.draw(spec.name, t) for t in sizes]
        seconds = [workload.service_s(t) for t in sizes]
        mean_draw, mean_s = sum(draws) / len(draws), sum(seconds) / len(seconds)
        if rpm_rate is not None and rpm_rate < tpm_rate / mean_draw:
            n_star = crossover_workers(rpm_rate, 1, mean_s)  # one request per unit
            # the request rate keeps rate x s workers busy: the mean unit's s, at most
            busy = n_star
        else:
            n_star = crossover_workers(tpm_rate, mean_draw, mean_s)
            small = small_unit_tokens(draws)
            small_s = max(s for d, s in zip(draws, seconds, strict=True) if d == small)
            busy = busy_workers(tpm_rate, small, small_s)
        out.append(
            ModelLimit(
                name=spec.name,
                units=len(sizes),
                mean_tokens=sum(sizes) / len(sizes),
                mean_quota_tokens=mean_draw,
                mean_seconds=mean_s,
                tpm_rate=tpm_rate,
                rpm_rate=rpm_rate,
                n_star=n_star,
                busy=busy,
            )
        )
    return tuple(out)


def binding_limits(limits: tuple[ModelLimit, ...], workers: int) -> dict[str, str]:
    """Which limit binds each model on ``workers`` shared workers: its quota (TPM or RPM) when
    the workers it gets cover its N*, else ``workers``. The fleet's workers go round the models
    (as the simulator's dispatch does), so a model that needs fewer than an even share keeps its
    quota busy and leaves the rest to the others (water-filling)."""
    out: dict[str, str] = {}
    left = float(workers)
    pending = sorted(limits, key=lambda m: m.n_star)
    while pending:
        even = left / len(pending)
        if pending[0].n_star > even:
            out.update({m.name: "workers" for m in pending})
            break
        first = pending.pop(0)
        out[first.name] = first.quota
        left -= first.n_star
    return out


@dataclass(frozen=True)
class ModelsPlan:
    """``swarm plan --models``: the fleet for several models' quotas, and what the batch takes
    and costs on it."""

    workload: Workload
    fleet: FleetConfig  # the simulated fleet (``workers`` is the per-lane concurrency)
    seeds: int
    account_limit: int
    limits: tuple[ModelLimit, ...]
    sizing: FleetSizing  # n_star: the sum of the models' N*
    outcome: Outcome
    fitting: Outcome | None
    costs: Spread | None  # micro-dollars over the seeds (None: a model of the mix has no prices)

    @property
    def models(self) -> Models:
        assert self.fleet.models is not None
        return self.fleet.models

    @property
    def problem(self) -> str | None:
        return self.sizing.problem(self.account_limit)

    def binding(self, outcome: Outcome) -> dict[str, str]:
        return binding_limits(self.limits, outcome.workers)

    @property
    def expected_spend(self) -> float:
        w = self.workload
        return w.first_attempt_tokens * expected_attempts(w.failure_rate, self.fleet.max_attempts)

    def cost_micro_usd(self) -> int | None:
        """The plan's seed's simulated run, priced (exact micro-dollars)."""
        costs = [m.cost_micro_usd for m in self.outcome.seeded.models]
        if any(c is None for c in costs):
            return None
        return sum(c for c in costs if c is not None)

    def unpriced(self) -> list[str]:
        return [spec.name for spec in self.models.used if spec.prices is None]

    def budget_covering(self) -> int:
        return round(self.outcome.spent.high) if self.outcome.completed_runs == self.seeds else 0

    def cdk_context(self) -> dict[str, Any]:
        """The fleet's cdk.json keys (the models' quotas stay in ``models``)."""
        lanes = {lane.value: {"max_concurrency": self.sizing.per_lane} for lane in Lane}
        return {
            "max_attempts": self.fleet.max_attempts,
            "lanes": lanes,
            "worker": {"reserved_concurrency": self.sizing.reserved},
        }


def plan_models(
    workload: Workload,
    fleet: FleetConfig,
    seeds: int = 20,
    account_limit: int = DEFAULT_ACCOUNT_LIMIT,
) -> ModelsPlan:
    """Size the fleet for ``fleet.models`` (the sum of what each model's units keep busy) and
    simulate the batch on it; ``fleet.workers`` is ignored."""
    if fleet.models is None:
        raise InvalidInput("models", "plan_models needs fleet.models")
    if workload.turns.agent:
        raise InvalidInput(
            "turns", "agent units are not planned on several models yet: leave out --turns"
        )
    if seeds < 1:
        raise InvalidInput("seeds", f"must be >= 1, got {seeds}")
    if account_limit < 1:
        raise InvalidInput("account_concurrency_limit", f"must be >= 1, got {account_limit}")
    limits = model_limits(workload, fleet)
    sizing = FleetSizing(
        n_star=sum(m.n_star for m in limits),
        per_lane=max(sum(m.workers for m in limits), MAPPING_CONCURRENCY[0]),
    )
    runs = [
        simulate(workload.with_seed(workload.seed + k), replace(fleet, workers=sizing.per_lane))
        for k in range(seeds)
    ]
    outcome = _outcome(runs, sizing.per_lane, fleet.horizon_s)
    fitting = None
    low, high = MAPPING_CONCURRENCY
    most = min((account_limit - UNRESERVED_MINIMUM) // LANE_COUNT, high)
    if sizing.problem(account_limit) is not None and most >= low:
        fitting = _simulate(workload, replace(fleet, workers=most), seeds)
    priced = [[m.cost_micro_usd for m in r.models] for r in runs]
    costs = None
    if all(c is not None for run in priced for c in run):
        costs = Spread.of([float(sum(c for c in run if c is not None)) for run in priced])
    return ModelsPlan(
        workload=workload,
        fleet=replace(fleet, workers=sizing.per_lane),
        seeds=seeds,
        account_limit=account_limit,
        limits=limits,
        sizing=sizing,
        outcome=outcome,
        fitting=fitting,
        costs=costs,
    )
