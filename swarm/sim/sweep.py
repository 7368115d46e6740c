"""The worker-scaling sweep: makespan against fleet size for each scheduling policy, with the
makespan floor, N* and the fleet that keeps the quota busy (``swarm sim sweep``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from swarm.core.errors import InvalidInput
from swarm.core.scheduling import MAPPING_CONCURRENCY, Schedule, size_fleet
from swarm.sim.engine import FleetConfig, SimResult, crossover_workers, simulate
from swarm.sim.plan import model_limits
from swarm.sim.workload import Workload


@dataclass(frozen=True)
class Cell:
    """One policy at one fleet size, over the sweep's seeds."""

    workers: int
    policy: Schedule
    runs: tuple[SimResult, ...]

    @property
    def elapsed(self) -> float:
        return statistics.fmean(r.elapsed for r in self.runs)

    @property
    def floor(self) -> float | None:
        floors = [r.floor.seconds for r in self.runs if r.floor is not None]
        return statistics.fmean(floors) if len(floors) == len(self.runs) else None

    @property
    def ratio(self) -> float | None:
        ratios = [r.floor_ratio for r in self.runs]
        if any(x is None for x in ratios):
            return None
        return statistics.fmean(x for x in ratios if x is not None)

    @property
    def states(self) -> list[str]:
        return sorted({r.run.state.value for r in self.runs})

    def doc(self) -> dict[str, Any]:
        elapsed = [r.elapsed for r in self.runs]
        doc: dict[str, Any] = {
            "workers": self.workers,
            "policy": self.policy.value,
            "elapsed_s": elapsed[0] if len(elapsed) == 1 else round(self.elapsed, 1),
            "floor_s": None if self.floor is None else round(self.floor, 1),
            "floor_ratio": None if self.ratio is None else round(self.ratio, 4),
            "state": "/".join(self.states),
        }
        if len(elapsed) > 1:
            doc["elapsed_min_s"], doc["elapsed_max_s"] = min(elapsed), max(elapsed)
            doc["elapsed_by_seed"] = elapsed
        else:
            only = self.runs[0].floor
            doc["floor_s"] = None if only is None else only.seconds
        return doc


@dataclass(frozen=True)
class Sweep:
    workload: Workload
    fleet: FleetConfig  # the sweep's fleet (workers and schedule vary)
    seeds: tuple[int, ...]
    n_star: int
    busy: int  # workers per lane that keep the quota busy (swarm plan's recommendation)
    cells: tuple[Cell, ...]

    @property
    def policies(self) -> list[Schedule]:
        return list(dict.fromkeys(c.policy for c in self.cells))

    @property
    def workers(self) -> list[int]:
        return list(dict.fromkeys(c.workers for c in self.cells))

    def cell(self, workers: int, policy: Schedule) -> Cell:
        return next(c for c in self.cells if c.workers == workers and c.policy is policy)

    def floor(self, workers: int) -> float | None:
        """The lowest floor of the policies' runs at this fleet size (they are equal when
        every run completes: the same attempts, whatever the order)."""
        floors = [c.floor for c in self.cells if c.workers == workers and c.floor is not None]
        return min(floors) if floors else None

    @property
    def quota_floor(self) -> float | None:
        """The floor the quota alone sets (the same at every fleet size), over the seeds."""
        per_seed = []
        for k in range(len(self.seeds)):
            floors = [c.runs[k].floor for c in self.cells]
            quota = [f.quota_s for f in floors if f is not None]
            if quota:
                per_seed.append(min(quota))
        return statistics.fmean(per_seed) if per_seed else None

    def doc(self) -> dict[str, Any]:
        return {
            "n_star": self.n_star,
            "busy_workers": self.busy,
            "quota_floor_s": None if self.quota_floor is None else round(self.quota_floor, 1),
            "policies": [p.value for p in self.policies],
            "seeds": list(self.seeds),
            "rows": [c.doc() for c in self.cells],
        }


def sweep(
    workload: Workload,
    fleet: FleetConfig,
    workers: Sequence[int],
    policies: Sequence[Schedule],
    seeds: int = 1,
) -> Sweep:
    """Simulate every (fleet size, policy) on ``seeds`` consecutive seeds from the workload's."""
    if seeds < 1:
        raise InvalidInput("seeds", f"must be >= 1, got {seeds}")
    if not workers or not policies:
        raise InvalidInput("sweep", "needs at least one fleet size and one policy")
    loads = [workload.with_seed(workload.seed + k) for k in range(seeds)]
    cells = []
    for n in workers:
        for policy in policies:
            f = replace(fleet, workers=n, schedule=policy)
            cells.append(Cell(n, policy, tuple(simulate(w, f) for w in loads)))
    if fleet.models is not None:
        # several models run at once: their N* and busy fleets add up (swarm plan --models)
        limits = model_limits(workload, fleet)
        n_star = sum(m.n_star for m in limits)
        busy = max(sum(m.workers for m in limits), MAPPING_CONCURRENCY[0])
    else:
        n_star = crossover_workers(workload, fleet)
        busy = size_fleet(fleet.governor.rate, workload.profile()).per_lane
    return Sweep(
        workload=workload,
        fleet=fleet,
        seeds=tuple(w.seed for w in loads),
        n_star=n_star,
        busy=busy,
        cells=tuple(cells),
    )
