"""Lab 6.1 with the book's parameters and schedule, printed in the book's words."""

from __future__ import annotations

from dataclasses import replace

from swarm.core.scheduling import Schedule
from swarm.sim.engine import FleetConfig, crossover_workers, simulate
from swarm.sim.workload import Workload

SWEEP = (25, 50, 100, 200)


def sweep_note(workers: int, n_star: int) -> str:
    if workers < n_star:
        return "worker-bound"
    return f"quota-bound ({workers - n_star} workers surplus)"


def report(workload: Workload | None = None, fleet: FleetConfig | None = None) -> str:
    w = workload or Workload()
    f = fleet or FleetConfig(schedule=Schedule.BOOK)
    lines = [
        f"{w.units} units, {w.first_attempt_tokens:,} tokens of first-attempt work | "
        f"quota {f.quota_tpm:,} TPM | governor at {round(f.share * 100)}%",
    ]
    r = simulate(w, f)
    run = r.run
    lines += [
        "",
        f"--- baseline: {f.workers} workers, budget {f.budget / 1e6:.1f}M tokens ---",
        f"completed {run.completed}/{run.units_total} in {r.elapsed:,}s | "
        f"spent {run.spent:,} tokens | retries {run.retries} | "
        f"dead-lettered {run.dead_lettered}",
        "",
        "--- the worker-scaling sweep (same quota, same work) ---",
        f"{'workers':>8}{'elapsed':>10} note",
    ]
    n_star = crossover_workers(w, f)
    for n in SWEEP:
        elapsed = simulate(w, replace(f, workers=n)).elapsed
        lines.append(f"{n:>8}{elapsed:>9,}s {sweep_note(n, n_star)}")
    lines.append(
        f"Little's law crossover: N* = {n_star} workers; beyond it, the quota is the fleet"
    )
    capped = replace(f, budget=2_500_000)
    r = simulate(w, capped)
    lines += [
        "",
        f"--- budget-capped run: same fleet, budget {capped.budget / 1e6:.1f}M tokens ---",
        f"{r.run.state.event} at {r.elapsed:,}s: {r.run.completed}/{r.run.units_total} "
        f"units complete, {r.run.spent:,} tokens spent",
        "partial results are usable and the run is resumable (Lab 6.2) once the budget is "
        "topped up",
    ]
    return "\n".join(lines)
