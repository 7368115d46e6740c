"""`swarm bench ...` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the bench subcommands (filled by the governor benchmark)."""
    subparsers.add_parser("bench", help="benchmarks (see `swarm bench --help`)")
