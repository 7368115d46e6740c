"""`swarm bench ...` subcommands."""

from __future__ import annotations

import argparse
import json

from swarm.cli.argtypes import float_in, int_in, share
from swarm.core.records import LANES, Lane

#: with --rpm, a unit's draw unless --min-tokens/--max-tokens say otherwise: small calls, so
#: requests bind long before tokens
RPM_DRAW = 50


def cmd_governor(args: argparse.Namespace) -> int:
    from swarm.bench import governor

    d = governor.BenchConfig()
    small = args.rpm is not None
    if args.min_tokens is None:
        args.min_tokens = RPM_DRAW if small else d.min_tokens
    if args.max_tokens is None:
        args.max_tokens = max(args.min_tokens, RPM_DRAW if small else d.max_tokens)

    cfg = governor.BenchConfig(
        workers=args.workers,
        processes=args.processes,
        seconds=args.seconds,
        quota_tpm=args.quota_tpm,
        share=args.share,
        capacity=args.capacity,
        initial_fill=args.initial_fill,
        min_tokens=args.min_tokens,
        max_tokens=args.max_tokens,
        work_s=args.work_s,
        hold_s=args.hold_s,
        horizon_s=args.horizon_s,
        shards=args.shards,
        idle_s=args.idle_s,
        after_idle_s=args.after_idle_s,
        used_min=args.used_min,
        used_max=args.used_max,
        reserve=args.reserve,
        seed=args.seed,
        rpm=args.rpm,
        output_burndown=args.output_burndown,
    )
    result = governor.run(cfg)
    print(json.dumps(result, indent=2) if args.json else governor.render(result))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the bench subcommands."""
    from swarm.bench.governor import BenchConfig

    d = BenchConfig()
    bench = subparsers.add_parser("bench", help="benchmarks (see `swarm bench --help`)")
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "governor",
        help="a fleet of workers drawing from the DynamoDB governor (embedded moto)",
        description=(
            "Runs N workers (threads across processes, each with its own governor client) "
            "against the DynamoDB token governor on an embedded, patched moto server, as the "
            "worker does: one unit at a time, a draw uniform in --min-tokens..--max-tokens, "
            "holding on for at most --hold-s, a refused unit back in its lane for the worker's "
            "requeue delay with its ticket, zero model time unless --work-s. Then idle for "
            "--idle-s and draws again for --after-idle-s. Prints DynamoDB requests and failed "
            "conditional writes per acquire call and per grant, utilization, tokens "
            "over-granted over every window, and the tries a requeued unit needed. The "
            "defaults are issue 15's scenario. --rpm adds the request bucket (and small "
            "draws), --output-burndown output-heavy draws in quota tokens."
        ),
    )
    p.add_argument(
        "--workers", type=int_in(1, 2_000), default=d.workers, help=f"workers ({d.workers})"
    )
    p.add_argument(
        "--processes",
        type=int_in(1, 16),
        default=d.processes,
        help=f"worker processes ({d.processes})",
    )
    p.add_argument(
        "--seconds",
        type=float_in(1, 3_600),
        default=d.seconds,
        help=f"how long the fleet draws ({d.seconds:g})",
    )
    p.add_argument(
        "--quota-tpm",
        type=int_in(1, 10**12),
        default=d.quota_tpm,
        help=f"the model quota, tokens per minute ({d.quota_tpm:,})",
    )
    p.add_argument(
        "--share", type=share, default=d.share, help=f"the governed share of it ({d.share:g})"
    )
    p.add_argument(
        "--capacity",
        type=float_in(1, 1e15),
        default=d.capacity,
        help=f"bucket capacity in tokens ({d.capacity:,.0f})",
    )
    p.add_argument(
        "--initial-fill",
        type=float_in(0, 1),
        default=d.initial_fill,
        help=f"fraction of the capacity the bucket starts with ({d.initial_fill:g})",
    )
    p.add_argument(
        "--min-tokens",
        type=int_in(1, 10**12),
        default=None,
        help=f"smallest draw ({d.min_tokens:,}; with --rpm {RPM_DRAW})",
    )
    p.add_argument(
        "--max-tokens",
        type=int_in(1, 10**12),
        default=None,
        help=f"largest draw ({d.max_tokens:,}; with --rpm {RPM_DRAW})",
    )
    p.add_argument(
        "--rpm",
        type=int_in(1, 10**8),
        default=None,
        help="the model's requests per minute: the governor counts one request per call "
        "beside its tokens, and the figures add the request bucket's (over-granted over every "
        f"window, the busiest minute, utilization of the binding limit); draws default to "
        f"{RPM_DRAW} tokens, so requests bind long before tokens (default: no request bucket)",
    )
    p.add_argument(
        "--output-burndown",
        type=float_in(1, 100),
        default=None,
        help="quota tokens per output token (Claude 4: 5): units are output-heavy (a quarter "
        "input), draw input + burndown x output bound and are trued up to input + burndown x "
        "output; the token figures are then quota tokens (default: draws of plain tokens)",
    )
    p.add_argument(
        "--work-s",
        type=float_in(0, 600),
        default=d.work_s,
        help=f"model time per grant in seconds ({d.work_s:g})",
    )
    p.add_argument(
        "--hold-s",
        type=float_in(0, 600),
        default=d.hold_s,
        help=f"how long a worker holds on for tokens before requeueing ({d.hold_s:g})",
    )
    p.add_argument(
        "--horizon-s",
        type=float_in(0, 86_400),
        default=d.horizon_s,
        help=f"how far past the refill the governor books tickets ({d.horizon_s:g})",
    )
    p.add_argument(
        "--shards", type=int_in(1, 64), default=d.shards, help=f"shard items ({d.shards})"
    )
    p.add_argument(
        "--idle-s",
        type=float_in(0, 3_600),
        default=d.idle_s,
        help=f"idle time after the run ({d.idle_s:g})",
    )
    p.add_argument(
        "--after-idle-s",
        type=float_in(0, 3_600),
        default=d.after_idle_s,
        help=f"draws after the idle time, in seconds ({d.after_idle_s:g})",
    )
    p.add_argument(
        "--used-min",
        type=float_in(0, 10),
        default=d.used_min,
        help=f"smallest fraction of a grant the model counts; < 1 exercises refunds "
        f"({d.used_min:g})",
    )
    p.add_argument(
        "--used-max",
        type=float_in(0, 10),
        default=d.used_max,
        help=f"largest fraction; > 1 exercises debits ({d.used_max:g})",
    )
    p.add_argument(
        "--reserve",
        type=float_in(0, 0.99),
        default=d.reserve,
        help="the units' lane's reserve, a fraction of the capacity: above 0 the lane queues "
        "its units for tokens instead of booking them, as the shipped normal lane does "
        f"({d.reserve:g})",
    )
    p.add_argument("--seed", type=int_in(0, 2**31), default=d.seed, help=f"seed ({d.seed})")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=cmd_governor)
    register_cost(sub)


def cmd_cost(args: argparse.Namespace) -> int:
    from swarm.bench import cost

    cfg = cost.CostConfig(
        units=args.units,
        time_scale=args.time_scale,
        seed=args.seed,
        state_dir=args.state_dir,
        timeout_s=args.timeout,
        lane=Lane(args.lane),
        agent=args.agent,
        turns=args.turns,
    )
    result = cost.run(cfg)
    print(json.dumps(result, indent=2) if args.json else cost.render(result))
    return 0


def register_cost(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `swarm bench cost`."""
    from pathlib import Path

    from swarm.bench.cost import CostConfig

    d = CostConfig()
    p = sub.add_parser(
        "cost",
        help="the AWS bill per unit: one batch through the local stack, every request metered",
        description=(
            "Starts a local stack (as `swarm local demo` does, in --state-dir), runs one batch "
            "of --units seed-like units (8k-16k tokens) on the happy path (failure rate 0, "
            "cdk.json's deployed timings on the local clock), and "
            "prints the billed requests per unit and US dollars per million units by service, "
            "operation and caller at AWS list prices (us-east-1, swarm/bench/prices.py; the "
            "model excluded), Lambda GB-seconds from measured durations (each cold start's "
            "INIT timed as a fresh interpreter importing the handler from the functions' asset "
            "alone), the Lambda-seconds per unit spent waiting for tokens, and the asset's size "
            "(built as cdk deploy builds it). Stops the stack. See docs/explanation/scale.md."
        ),
    )
    p.add_argument("--units", type=int_in(1, 100_000), default=d.units, help=f"units ({d.units})")
    p.add_argument(
        "--time-scale",
        type=float_in(0.1, 1_000),
        default=d.time_scale,
        help=f"the local stack's clock (x{d.time_scale:g}, as `swarm local up`)",
    )
    p.add_argument("--seed", type=int_in(0, 2**31), default=d.seed, help=f"units' seed ({d.seed})")
    p.add_argument(
        "--lane",
        choices=[lane.value for lane in LANES],
        default=d.lane.value,
        help=(
            f"the batch's lane ({d.lane.value}: the API's default; it keeps a reserve for the "
            "high lane, so the governor queues its units for tokens instead of booking them)"
        ),
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=d.state_dir,
        help=f"the local stack's state directory ({d.state_dir})",
    )
    p.add_argument(
        "--timeout",
        type=float_in(1, 86_400),
        default=d.timeout_s,
        help=f"seconds to wait for the batch ({d.timeout_s:g})",
    )
    p.add_argument(
        "--agent",
        action="store_true",
        help="agent units (each a loop of --turns model turns calling the shipped tools): the "
        "bill also per model turn, the tool functions' own requests listed apart",
    )
    p.add_argument(
        "--turns",
        type=int_in(1, 100),
        default=d.turns,
        help=f"with --agent: model turns per unit ({d.turns})",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=cmd_cost)
