"""`swarm sim ...`: the deterministic fleet simulator (Lab 6.1, sweeps, kill and resume)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from swarm.cli.argtypes import non_negative_int, positive_int, rate, share, worker_list
from swarm.core.errors import InvalidInput
from swarm.core.lanes import Policy
from swarm.core.report import healthy_line
from swarm.sim import lab61, state
from swarm.sim.engine import FleetConfig, SimResult, Simulation, crossover_workers
from swarm.sim.workload import Workload


def _workload_fleet_options(p: argparse.ArgumentParser, *, workers: bool = True) -> None:
    g = p.add_argument_group("workload (defaults: Lab 6.1)")
    g.add_argument("--units", type=positive_int, default=400, help="units in the run (400)")
    g.add_argument("--min-tokens", type=positive_int, default=8_000, help="smallest unit (8,000)")
    g.add_argument("--max-tokens", type=positive_int, default=16_000, help="largest unit (16,000)")
    g.add_argument("--failure-rate", type=rate, default=0.04, help="chance an attempt fails (0.04)")
    g.add_argument("--seed", type=int, default=0, help="workload seed (0)")
    f = p.add_argument_group("fleet (defaults: Lab 6.1)")
    if workers:
        f.add_argument("--workers", type=positive_int, default=100, help="worker slots (100)")
    f.add_argument("--quota-tpm", type=positive_int, default=300_000, help="model quota (300,000)")
    f.add_argument("--share", type=share, default=0.95, help="governor share of quota (0.95)")
    f.add_argument(
        "--budget", type=non_negative_int, default=6_000_000, help="token budget (6,000,000)"
    )
    f.add_argument("--max-attempts", type=positive_int, default=3, help="then dead-letter (3)")
    f.add_argument(
        "--policy",
        choices=[p.value for p in Policy],
        default="fifo",
        help="order inside a lane: fifo (Lab 6.1) or fair (tenants round-robin)",
    )


def _workload(args: argparse.Namespace) -> Workload:
    return Workload(args.units, args.min_tokens, args.max_tokens, args.failure_rate, args.seed)


def _fleet(args: argparse.Namespace, workers: int | None = None) -> FleetConfig:
    return FleetConfig(
        workers=workers if workers is not None else args.workers,
        quota_tpm=args.quota_tpm,
        share=args.share,
        budget=args.budget,
        max_attempts=args.max_attempts,
        policy=Policy(args.policy),
    )


def result_doc(result: SimResult) -> dict[str, Any]:
    run = result.run
    return {
        "state": run.state.value,
        "elapsed_s": result.elapsed,
        "units": run.units_total,
        "completed": run.completed,
        "dead_lettered": run.dead_lettered,
        "remainder": run.remainder,
        "remainder_units": list(result.remainder),
        "in_flight": result.in_flight,
        "spent": run.spent,
        "reserved": run.reserved,
        "budget": run.budget,
        "retries": run.retries,
        "attempts": run.attempts,
        "lost_attempts": result.lost_attempts,
        "killed": result.killed,
        "horizon_reached": result.horizon_reached,
        "healthy_line": healthy_line(run, result.elapsed),
    }


def _print_result(result: SimResult, as_json: bool, state_path: Path | None) -> None:
    if as_json:
        print(json.dumps(result_doc(result), indent=2))
        return
    run = result.run
    if result.killed:
        print(
            f"killed at {result.elapsed:,}s: {run.completed}/{run.units_total} complete, "
            f"{result.in_flight} attempts in flight, spent {run.spent:,} "
            f"(+{run.reserved:,} reserved) of {run.budget:,} tokens"
        )
    else:
        print(healthy_line(run, result.elapsed))
        if result.horizon_reached:
            print(f"stopped at the {result.elapsed:,}s horizon before the run closed")
        if result.remainder:
            shown = ", ".join(result.remainder[:5])
            more = f" and {len(result.remainder) - 5} more" if len(result.remainder) > 5 else ""
            print(f"remainder ({len(result.remainder)} units): {shown}{more}")
    if state_path is not None:
        hint = "resume with" if result.killed or result.remainder else "state saved; inspect with"
        print(f"{hint}: swarm sim resume --state {state_path}", file=sys.stderr)


def cmd_lab61(args: argparse.Namespace) -> int:
    print(lab61.report())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.kill_at is not None and args.state is None:
        raise InvalidInput("--kill-at", "needs --state FILE to save the killed fleet's state")
    sim = Simulation.fresh(_workload(args), _fleet(args))
    result = sim.run_until(args.kill_at)
    if args.state is not None:
        state.save(sim, args.state)
    _print_result(result, args.json, args.state)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    sim = state.load(args.state, workers=args.workers)
    if sim.in_flight:
        lost = sim.recover_after_kill()
        if not args.json:
            print(f"{lost} attempts were in flight at the kill: settled as failed, tokens counted")
    if args.top_up:
        requeued = sim.top_up(args.top_up)
        if not args.json:
            print(f"topped up by {args.top_up:,} tokens: {requeued} remainder units requeued")
    # a closed run (completed, or exhausted without a top-up) has nothing left to run
    result = sim.result() if sim.run.state.closed else sim.run_until(args.kill_at)
    state.save(sim, args.state)
    _print_result(result, args.json, args.state if result.killed or result.remainder else None)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    workload = _workload(args)
    base = _fleet(args, workers=1)
    n_star = crossover_workers(workload, base)
    rows = []
    for n in args.workers:
        r = Simulation.fresh(workload, replace(base, workers=n)).run_until()
        rows.append({"workers": n, "elapsed_s": r.elapsed, "state": r.run.state.value})
    if args.json:
        print(json.dumps({"n_star": n_star, "rows": rows}, indent=2))
        return 0
    print(f"{'workers':>8}{'elapsed':>10} note")
    for row in rows:
        print(
            f"{row['workers']:>8}{row['elapsed_s']:>9,}s {lab61.sweep_note(row['workers'], n_star)}"
        )
    print(f"Little's law crossover: N* = {n_star} workers; beyond it, the quota is the fleet")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("sim", help="the deterministic fleet simulator (capacity planner)")
    simsub = sim.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")

    p = simsub.add_parser("lab61", help="Lab 6.1: baseline, worker sweep, budget-capped run")
    p.set_defaults(handler=cmd_lab61)

    p = simsub.add_parser("run", help="one simulated run; prints the healthy line")
    _workload_fleet_options(p)
    p.add_argument(
        "--kill-at", type=positive_int, help="kill the fleet at T seconds (needs --state)"
    )
    p.add_argument("--state", type=Path, help="save the final (or killed) state to FILE")
    p.add_argument("--json", action="store_true", help="print a machine-readable result")
    p.set_defaults(handler=cmd_run)

    p = simsub.add_parser("sweep", help="the worker-scaling table with N* from Little's law")
    _workload_fleet_options(p, workers=False)
    p.add_argument(
        "--workers", type=worker_list, default=[25, 50, 100, 200], help="counts (25,50,100,200)"
    )
    p.add_argument("--json", action="store_true", help="print a machine-readable table")
    p.set_defaults(handler=cmd_sweep)

    p = simsub.add_parser(
        "resume", help="finish a killed or exhausted run from its state file (Lab 6.2)"
    )
    p.add_argument("--state", type=Path, required=True, help="state file from `sim run --state`")
    p.add_argument("--top-up", type=positive_int, help="add tokens to the budget first")
    p.add_argument("--workers", type=positive_int, help="resume with a different fleet size")
    p.add_argument("--kill-at", type=positive_int, help="kill again at T seconds")
    p.add_argument("--json", action="store_true", help="print a machine-readable result")
    p.set_defaults(handler=cmd_resume)
