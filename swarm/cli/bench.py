"""`swarm bench ...` subcommands."""

from __future__ import annotations

import argparse
import json

from swarm.cli.argtypes import float_in, int_in
from swarm.core.errors import InvalidInput


def cmd_governor(args: argparse.Namespace) -> int:
    from swarm.bench import governor

    cfg = governor.BenchConfig(
        workers=args.workers,
        seconds=args.seconds,
        shards=args.shards,
        processes=args.processes,
        grants_per_s=args.grants_per_s,
        work_s=args.work_s,
    )
    if cfg.processes > cfg.workers:
        raise InvalidInput("--processes", "cannot exceed --workers")
    result = governor.run(cfg)
    print(json.dumps(result, indent=2) if args.json else governor.render(result))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the bench subcommands."""
    bench = subparsers.add_parser("bench", help="benchmarks (see `swarm bench --help`)")
    sub = bench.add_subparsers(dest="bench_command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "governor",
        help="N workers in several processes drawing from the DynamoDB governor (embedded moto)",
        description=(
            "Runs N concurrent workers (threads across processes) drawing unit-sized amounts "
            "from the DynamoDB token governor on an embedded, patched moto server, with demand "
            "above the governed rate. The rate is sized for moto's throughput: the figures "
            "measure the algorithm's efficiency, not DynamoDB's speed."
        ),
    )
    p.add_argument("--workers", type=int_in(1, 2_000), default=200, help="workers (200)")
    p.add_argument("--seconds", type=float_in(1, 600), default=20.0, help="duration (20)")
    p.add_argument("--shards", type=int_in(1, 64), default=1, help="governor shard items (1)")
    p.add_argument("--processes", type=int_in(2, 16), default=2, help="worker processes (2)")
    p.add_argument(
        "--grants-per-s",
        type=float_in(1, 500),
        default=60.0,
        help="governed rate in unit-sized grants per second (60; moto serves ~150-300 writes/s)",
    )
    p.add_argument(
        "--work-s", type=float_in(0, 60), default=0.2, help="model call per grant (0.2 s)"
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(handler=cmd_governor)
