"""The `swarm` command line. One module per command group:

- :mod:`swarm.cli.sim`: the simulator (``swarm sim lab61|run|sweep|resume``);
- :mod:`swarm.cli.plan`: capacity planning (``swarm plan``);
- :mod:`swarm.cli.ops`: a deployed stack's operators and tenants (``swarm submit``, ``status``,
  ``drain``...);
- :mod:`swarm.cli.deploy`: ``swarm deploy`` (drain, cdk deploy, undrain);
- :mod:`swarm.cli.local`: the local stack (``swarm local up|down|demo|tenant``);
- :mod:`swarm.cli.bench`: benchmarks (``swarm bench governor``, ``swarm bench cost``);
- :mod:`swarm.cli.smoke`: ``swarm smoke`` (a stack of its own, end to end, then destroyed);
- :mod:`swarm.cli.helpdocs`: each command's example and documentation page, ending its help.

Every error a user can cause ends with a one-line message and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from swarm.cli import bench, deploy, helpdocs, judge, local, ops, plan, results, sim, smoke
from swarm.client import aws_failure
from swarm.core.errors import SwarmError

Handler = Callable[[argparse.Namespace], int]


# ------------------------------------------------------------------ main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swarm",
        description="Control plane for fleets of LLM agent work units: simulator and tools.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sim.register(sub)
    plan.register(sub)
    ops.register(sub)
    results.register(sub)
    judge.register(sub)
    deploy.register(sub)
    local.register(sub)
    bench.register(sub)
    smoke.register(sub)
    helpdocs.annotate(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.parse_args([*(argv if argv is not None else sys.argv[1:]), "--help"])
        return 2
    try:
        return handler(args)
    except SwarmError as e:
        parser.exit(2, f"swarm: error: {e}\n")
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # boto3's own errors (no credentials, no region...) are expected too
        message = aws_failure(e)
        if message is None:
            raise
        parser.exit(2, f"swarm: error: {message}\n")


if __name__ == "__main__":
    sys.exit(main())
