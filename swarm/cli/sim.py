"""`swarm sim ...`: the deterministic fleet simulator (Lab 6.1, sweeps, kill and resume)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from swarm.cli.argtypes import (
    float_in,
    non_negative_int,
    positive_int,
    rate,
    share,
    worker_list,
)
from swarm.core.errors import InvalidInput
from swarm.core.lanes import Policy
from swarm.core.report import healthy_line
from swarm.core.scheduling import DEFAULT_SCHEDULE, Floor, Schedule, ServiceModel
from swarm.sim import lab61, state
from swarm.sim.engine import FleetConfig, ModelFigures, SimResult, Simulation, simulate
from swarm.sim.models import DEFAULT_OUTPUT_SHARE, Models, dollars, load_catalog, parse_mix
from swarm.sim.plan import ModelLimit, binding_limits, model_limits
from swarm.sim.plot import plot_sweep
from swarm.sim.sweep import Sweep, sweep
from swarm.sim.workload import TurnModel, Workload

POLICIES = ", ".join(s.value for s in Schedule)


def policy(text: str) -> Schedule:
    """A scheduling policy; the lanes' fifo and fair moved to --fairness."""
    try:
        return Schedule(text)
    except ValueError:
        if text in {p.value for p in Policy}:
            raise argparse.ArgumentTypeError(
                f"{text!r} is a lane's fairness, not a scheduling policy: use --fairness {text} "
                f"(--policy is one of {POLICIES})"
            ) from None
        message = f"{text!r} is not a policy: use one of {POLICIES}"
        raise argparse.ArgumentTypeError(message) from None


def policy_list(text: str) -> list[Schedule]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"give policies like book,largest-first ({POLICIES})")
    return list(dict.fromkeys(policy(p) for p in parts))


def workload_options(p: argparse.ArgumentParser, *, sizes: bool = True) -> None:
    """The workload's options (defaults: Lab 6.1); ``sizes=False`` leaves out the generated
    sizes (a caller that takes a manifest adds them itself)."""
    g = p.add_argument_group("workload (defaults: Lab 6.1)")
    if sizes:
        g.add_argument("--units", type=positive_int, default=400, help="units in the run (400)")
        g.add_argument("--min-tokens", type=positive_int, default=8_000, help="smallest (8,000)")
        g.add_argument("--max-tokens", type=positive_int, default=16_000, help="largest (16,000)")
    g.add_argument("--failure-rate", type=rate, default=0.04, help="chance an attempt fails (0.04)")
    g.add_argument("--seed", type=int, default=0, help="workload seed: sizes and failures (0)")
    g.add_argument(
        "--base-seconds",
        type=non_negative_int,
        default=180,
        help="a unit's service time: this many seconds (180) ...",
    )
    g.add_argument(
        "--tokens-per-second",
        type=positive_int,
        default=100,
        help="... plus one second per this many tokens (100)",
    )


def turn_range(text: str) -> tuple[int, int]:
    """``N`` or ``A-B``: model turns per unit, 1..100."""
    parts = text.split("-")
    if len(parts) > 2 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of turns: give N or a range like 4-12"
        )
    low, high = int(parts[0]), int(parts[-1])
    if not 1 <= low <= high <= 100:
        raise argparse.ArgumentTypeError(
            f"{text} is out of range: turns must be 1..100, a range low-high with low <= high"
        )
    return low, high


def turn_options(p: argparse.ArgumentParser) -> None:
    """Agent units: a unit as a loop of model turns (docs/explanation/planner.md, "Agent units")."""
    d = TurnModel()
    g = p.add_argument_group(
        'agent units (--turns above 1; docs/explanation/planner.md, "Agent units")'
    )
    g.add_argument(
        "--turns",
        type=turn_range,
        default=(1, 1),
        metavar="N|A-B",
        help="model turns per unit, or a range drawn per unit from the seed (1: one call, as "
        "in Lab 6.1)",
    )
    g.add_argument(
        "--tool-seconds",
        type=non_negative_int,
        default=d.tool_seconds,
        help=f"each turn's tool calls hold the worker this long, all but the last turn "
        f"({d.tool_seconds})",
    )
    g.add_argument(
        "--tool-tokens",
        type=non_negative_int,
        default=d.tool_tokens,
        help=f"tokens a turn's tool results add to the conversation ({d.tool_tokens})",
    )
    g.add_argument(
        "--output-tokens",
        type=positive_int,
        default=d.output_tokens,
        help=f"tokens the model writes per turn, billed and added to the conversation "
        f"({d.output_tokens})",
    )
    g.add_argument(
        "--output-bound",
        type=positive_int,
        default=d.output_bound,
        help=f"a turn's maxTokens: drawn with its input, the unused part trued up "
        f"({d.output_bound})",
    )
    g.add_argument(
        "--prompt-tokens",
        type=positive_int,
        help="every unit's first input; units whose caps cannot pay for their loop stop "
        "limit_tokens (default: the largest prompt that fits the loop in its cap)",
    )
    g.add_argument(
        "--cap-headroom",
        type=float_in(0, 0.99),
        default=d.headroom,
        help=f"share of a unit's cap the default prompt leaves for lost turns ({d.headroom})",
    )
    g.add_argument(
        "--hold-seconds",
        type=non_negative_int,
        default=d.hold_seconds,
        help="the bounded hold: a worker waits this long for a turn's tokens, then the unit "
        f"goes back to its lane ({d.hold_seconds}, worker.governor_max_wait_seconds)",
    )


def turns_of(args: argparse.Namespace) -> TurnModel:
    low, high = args.turns
    return TurnModel(
        turns_min=low,
        turns_max=high,
        output_bound=args.output_bound,
        output_tokens=args.output_tokens,
        tool_tokens=args.tool_tokens,
        tool_seconds=args.tool_seconds,
        hold_seconds=args.hold_seconds,
        prompt_tokens=args.prompt_tokens,
        headroom=args.cap_headroom,
    )


def fleet_options(p: argparse.ArgumentParser, *, workers: bool = True, many: bool = False) -> None:
    """The fleet's options (defaults: Lab 6.1, and the better scheduling policy); ``many``:
    ``--policy`` takes a comma-separated list."""
    f = p.add_argument_group("fleet (defaults: Lab 6.1)")
    if workers:
        f.add_argument("--workers", type=positive_int, default=100, help="worker slots (100)")
    f.add_argument(
        "--quota-tpm",
        type=positive_int,
        help="model quota (300,000; with --models each model's tpm instead)",
    )
    f.add_argument("--share", type=share, default=0.95, help="governor share of quota (0.95)")
    f.add_argument(
        "--budget", type=non_negative_int, default=6_000_000, help="token budget (6,000,000)"
    )
    f.add_argument("--max-attempts", type=positive_int, default=3, help="then dead-letter (3)")
    if many:
        f.add_argument(
            "--policy",
            type=policy_list,
            default=list(Schedule),
            help=f"scheduling policies to compare, comma-separated (all: {POLICIES})",
        )
    else:
        f.add_argument(
            "--policy",
            type=policy,
            default=DEFAULT_SCHEDULE,
            help=f"scheduling policy: {POLICIES} ({DEFAULT_SCHEDULE.value}); book is Lab 6.1's",
        )
    f.add_argument(
        "--fairness",
        choices=[p.value for p in Policy],
        default="fifo",
        help="order of tenants inside a lane: fifo (Lab 6.1) or fair (round-robin)",
    )


def workload_of(args: argparse.Namespace) -> Workload:
    service = ServiceModel(args.base_seconds, args.tokens_per_second)
    return Workload(
        args.units,
        args.min_tokens,
        args.max_tokens,
        args.failure_rate,
        args.seed,
        service,
        turns=turns_of(args),
    )


def model_options(p: argparse.ArgumentParser) -> None:
    """Several models (docs/explanation/planner.md, "Several models")."""
    g = p.add_argument_group('several models (docs/explanation/planner.md, "Several models")')
    g.add_argument(
        "--models",
        type=Path,
        metavar="FILE",
        help="the model catalog: a cdk.json (context.models) or a JSON file with a models "
        "object (default and catalog: each model's tpm, rpm, output_burndown, governor_share "
        "and prices); each model gets its own governor buckets",
    )
    g.add_argument(
        "--mix",
        metavar="NAME=FRACTION,...",
        help="the units' split across the catalog's models, fractions adding up to 1, e.g. "
        "haiku=0.8,sonnet=0.2 (default: a manifest's units on the models their input.model "
        "names, other units on the catalog's default model)",
    )
    g.add_argument(
        "--output-share",
        type=float_in(0, 1),
        metavar="F",
        help="the share of a unit's tokens that is output: counted at its model's burndown "
        f"against its TPM and priced at its output price ({DEFAULT_OUTPUT_SHARE:g})",
    )


def models_of(args: argparse.Namespace) -> Models | None:
    """The models of ``--models``/``--mix``/``--output-share`` (None: one model, as before)."""
    path: Path | None = getattr(args, "models", None)
    if path is None:
        for name in ("mix", "output_share"):
            if getattr(args, name, None) is not None:
                flag = "--" + name.replace("_", "-")
                raise InvalidInput(flag, "needs --models FILE (the model catalog)")
        return None
    if getattr(args, "quota_tpm", None) is not None:
        raise InvalidInput(
            "--quota-tpm", "with --models each model's quota is its tpm: leave out --quota-tpm"
        )
    if getattr(args, "turns", (1, 1))[1] > 1:
        raise InvalidInput(
            "--turns", "agent units are not simulated on several models yet: leave out --turns"
        )
    catalog = load_catalog(path)
    output_share = DEFAULT_OUTPUT_SHARE if args.output_share is None else args.output_share
    if args.mix is None:
        return Models.default(catalog, output_share)
    return Models(catalog, parse_mix(args.mix, catalog), output_share)


def fleet_of(
    args: argparse.Namespace, workers: int | None = None, schedule: Schedule | None = None
) -> FleetConfig:
    models = models_of(args)
    return FleetConfig(
        workers=args.workers if workers is None else workers,
        quota_tpm=300_000 if args.quota_tpm is None else args.quota_tpm,
        models=models,
        share=args.share,
        budget=args.budget,
        max_attempts=args.max_attempts,
        policy=Policy(args.fairness),
        schedule=schedule or args.policy,
    )


def floor_doc(floor: Floor | None) -> dict[str, Any] | None:
    if floor is None:
        return None
    return {
        "seconds": floor.seconds,
        "bound_by": floor.bound_by,
        "quota_s": floor.quota_s,
        "workers_s": floor.workers_s,
        "chain_s": floor.chain_s,
    }


def floor_line(result: SimResult, schedule: Schedule) -> str | None:
    floor, ratio = result.floor, result.floor_ratio
    if floor is None or ratio is None:
        return None
    return (
        f"policy {schedule.value}: {ratio:.2f}x the floor of {floor.seconds:,}s, set by the "
        f"{floor.bound_by} (quota {floor.quota_s:,}s, workers {floor.workers_s:,}s, "
        f"retry chain {floor.chain_s:,}s)"
    )


#: a run on several models: its fleet and its workload (for the models' limits)
ModelsFleet = tuple[FleetConfig, Workload]


def result_doc(
    result: SimResult, schedule: Schedule, models: ModelsFleet | None = None
) -> dict[str, Any]:
    run = result.run
    ratio = result.floor_ratio
    return {
        "state": run.state.value,
        "elapsed_s": result.elapsed,
        "policy": schedule.value,
        "floor": floor_doc(result.floor),
        "floor_ratio": None if ratio is None else round(ratio, 4),
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
        "agent": None if result.agent is None else result.agent.doc(),
        "models": None if models is None else models_doc(result, models),
        "cost_micro_usd": None if models is None else total_cost(result),
    }


def total_cost(result: SimResult) -> int | None:
    """The run's cost over every model, in micro-dollars (None: a model has no prices)."""
    costs = [m.cost_micro_usd for m in result.models]
    return None if any(c is None for c in costs) else sum(c or 0 for c in costs)


def models_doc(result: SimResult, models: ModelsFleet) -> list[dict[str, Any]]:
    """Each model's figures, its binding limit on the run's workers and its N*."""
    fleet, workload = models
    limits = {m.name: m for m in model_limits(workload, fleet)}
    binding = binding_limits(tuple(limits.values()), fleet.workers)
    out = []
    for m in result.models:
        limit = limits.get(m.name)
        share = m.last_end_s / result.elapsed if result.elapsed else None
        out.append(
            {
                **m.doc(),
                "binding": binding.get(m.name),
                "n_star": None if limit is None else limit.n_star,
                "makespan_share": None if share is None else round(share, 4),
                "limits": None if limit is None else limit.doc(),
            }
        )
    return out


def model_line(m: ModelFigures, limit: ModelLimit | None, binding: str | None, elapsed: int) -> str:
    """One model's line: its units and requests, tokens, binding limit, N*, end and cost."""
    if limit is None or binding is None:
        return f"model {m.name}: no units"
    share = f" ({m.last_end_s / elapsed:.0%} of the makespan)" if elapsed else ""
    cost = "no prices" if m.cost_micro_usd is None else dollars(m.cost_micro_usd)
    rpm = "" if m.rpm_floor_s is None else f", {m.rpm_floor_s:,}s of requests at its RPM"
    return (
        f"model {m.name}: {m.units:,} units, {m.attempts:,} requests, {m.billed_tokens:,} "
        f"tokens ({m.input_tokens:,} in, {m.output_tokens:,} out; {m.quota_tokens:,} quota "
        f"tokens, {m.tpm_floor_s:,}s at its TPM{rpm}) | binding: {binding} | "
        f"N* = {limit.n_star} | last attempt ended at {m.last_end_s:,}s{share} | {cost}"
    )


def _print_result(
    result: SimResult,
    schedule: Schedule,
    as_json: bool,
    state_path: Path | None,
    models: ModelsFleet | None = None,
) -> None:
    if as_json:
        print(json.dumps(result_doc(result, schedule, models), indent=2))
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
        if result.agent is not None:
            print(result.agent.line())
        line = floor_line(result, schedule)
        if line is not None:
            print(line)
        if result.horizon_reached:
            print(f"stopped at the {result.elapsed:,}s horizon before the run closed")
        if result.remainder:
            shown = ", ".join(result.remainder[:5])
            more = f" and {len(result.remainder) - 5} more" if len(result.remainder) > 5 else ""
            print(f"remainder ({len(result.remainder)} units): {shown}{more}")
        if models is not None:
            _print_models(result, models)
    if state_path is not None:
        hint = "resume with" if result.killed or result.remainder else "state saved; inspect with"
        print(f"{hint}: swarm sim resume --state {state_path}", file=sys.stderr)


def _print_models(result: SimResult, models: ModelsFleet) -> None:
    fleet, workload = models
    limits = {m.name: m for m in model_limits(workload, fleet)}
    binding = binding_limits(tuple(limits.values()), fleet.workers)
    for m in result.models:
        print(model_line(m, limits.get(m.name), binding.get(m.name), result.elapsed))
    cost = total_cost(result)
    if cost is None:
        missing = ", ".join(m.name for m in result.models if m.cost_micro_usd is None)
        print(f"cost: unknown (no prices for {missing} in the catalog)")
    else:
        print(f"cost: {dollars(cost)} ({cost:,} micro-dollars) for every attempt made")


def cmd_lab61(args: argparse.Namespace) -> int:
    print(lab61.report())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    if args.kill_at is not None and args.state is None:
        raise InvalidInput("--kill-at", "needs --state FILE to save the killed fleet's state")
    workload = workload_of(args)
    fleet = fleet_of(args)
    if fleet.models is not None:
        if args.state is not None or args.kill_at is not None:
            flag = "--state" if args.state is not None else "--kill-at"
            raise InvalidInput(
                flag, "kill and resume are not simulated on several models yet: leave out --models"
            )
        result = simulate(workload, fleet)
        _print_result(result, args.policy, args.json, None, (fleet, workload))
        return 0
    if workload.turns.agent:
        if args.state is not None:
            raise InvalidInput(
                "--state", "kill and resume are not simulated for agent units: leave out --turns"
            )
        result = simulate(workload, fleet_of(args))
        _print_result(result, args.policy, args.json, None)
        return 0
    sim = Simulation.fresh(workload, fleet_of(args))
    result = sim.run_until(args.kill_at)
    if args.state is not None:
        state.save(sim, args.state)
    _print_result(result, sim.fleet.schedule, args.json, args.state)
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
    show = args.state if result.killed or result.remainder else None
    _print_result(result, sim.fleet.schedule, args.json, show)
    return 0


def _cell_text(s: Sweep, workers: int, schedule: Schedule) -> str:
    cell = s.cell(workers, schedule)
    ratio = "" if cell.ratio is None else f" ({cell.ratio:.2f}x)"
    return f"{cell.elapsed:,.0f}s{ratio}"


def cmd_sweep(args: argparse.Namespace) -> int:
    fleet = fleet_of(args, workers=1, schedule=args.policy[0])
    result = sweep(workload_of(args), fleet, args.workers, args.policy, args.seeds)
    if args.plot is not None:
        plot_sweep(result, args.plot)
    if args.json:
        doc = result.doc()
        if args.plot is not None:
            doc["plot"] = str(args.plot)
        print(json.dumps(doc, indent=2))
        return 0
    if len(result.seeds) > 1:
        print(f"mean over seeds {result.seeds[0]}..{result.seeds[-1]} (elapsed and x the floor)")
    width = max(16, *(len(p.value) + 2 for p in result.policies))
    print(
        f"{'workers':>8}"
        + "".join(f"{p.value:>{width}}" for p in result.policies)
        + f"{'floor':>10}  note"
    )
    for n in result.workers:
        cells = "".join(f"{_cell_text(result, n, p):>{width}}" for p in result.policies)
        floor = result.floor(n)
        floor_text = "-" if floor is None else f"{floor:,.0f}s"
        print(f"{n:>8}{cells}{floor_text:>10}  {lab61.sweep_note(n, result.n_star)}")
    n_star = result.n_star
    print(f"Little's law crossover: N* = {n_star} workers; beyond it, the quota is the fleet")
    quota = result.quota_floor
    if quota is not None:
        print(
            f"quota floor {quota:,.0f}s; {result.busy} workers keep the quota busy even while "
            "the small units run (swarm plan's recommendation per lane)"
        )
    if args.plot is not None:
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser("sim", help="the deterministic fleet simulator (capacity planner)")
    simsub = sim.add_subparsers(dest="sim_command", required=True, metavar="COMMAND")

    p = simsub.add_parser("lab61", help="Lab 6.1: baseline, worker sweep, budget-capped run")
    p.set_defaults(handler=cmd_lab61)

    p = simsub.add_parser(
        "run", help="one simulated run; prints the healthy line and the ratio to the floor"
    )
    workload_options(p)
    turn_options(p)
    fleet_options(p)
    model_options(p)
    p.add_argument(
        "--kill-at", type=positive_int, help="kill the fleet at T seconds (needs --state)"
    )
    p.add_argument("--state", type=Path, help="save the final (or killed) state to FILE")
    p.add_argument("--json", action="store_true", help="print a machine-readable result")
    p.set_defaults(handler=cmd_run)

    p = simsub.add_parser(
        "sweep", help="makespan against workers for each policy, with the floor and N*"
    )
    workload_options(p)
    turn_options(p)
    fleet_options(p, workers=False, many=True)
    model_options(p)
    p.add_argument(
        "--workers",
        type=worker_list,
        default=[25, 50, 100, 150, 200, 400],
        help="counts (25,50,100,150,200,400)",
    )
    p.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        help="average over this many workload seeds from --seed (1: the seeded run only)",
    )
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the sweep (matplotlib)")
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
