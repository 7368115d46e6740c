"""`swarm results BATCH`: every unit's outcome (the model's answer, or its error), written locally.

Pages through ``GET /batches/{id}/results`` (the ledger's state joined with each unit's stored
attempt), so the partial results of an open or exhausted batch are as readable as a closed
one's; an answer too long for a page is fetched from its link, so what is written is whole.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from swarm.api.models import MAX_RESULTS_PAGE
from swarm.cli.ops import client_of, expecting_the_api, target_options
from swarm.client import Client
from swarm.core.errors import SwarmError
from swarm.core.records import UnitState


def units(
    client: Client, batch: str, state: str | None, transcripts: bool = False
) -> Iterator[dict[str, Any]]:
    """Every unit's result, page after page, its answer fetched whole when it was linked (and,
    with ``transcripts``, an agent unit's transcript read whole under ``transcript``)."""
    token: str | None = None
    while True:
        page = client.results(batch, state=state, limit=MAX_RESULTS_PAGE, next_token=token)
        for unit in page["units"]:
            if "output_url" in unit:
                record = json.loads(client.fetch(unit.pop("output_url")))
                unit["output"] = record["output"]
            if transcripts and "agent" in unit:
                unit["transcript"] = client.transcript(batch, unit["unit_id"])
            yield unit
        token = page.get("next_token")
        if token is None:
            return


class Progress:
    """``results BATCH: [######    ] 340/1,000 units`` on stderr, redrawn in place on a tty."""

    def __init__(self, batch: str, total: int, out: IO[str], width: int = 30) -> None:
        self.batch, self.total, self.out, self.width = batch, total, out, width
        self.done = 0
        self.tty = out.isatty()

    def step(self) -> None:
        self.done += 1
        if self.tty and (self.done % 50 == 0 or self.done == self.total):
            self.draw("\r")

    def draw(self, start: str = "") -> None:
        filled = self.width * self.done // self.total if self.total else self.width
        bar = "#" * filled + " " * (self.width - filled)
        self.out.write(f"{start}results {self.batch}: [{bar}] {self.done:,}/{self.total:,} units")
        self.out.flush()

    def end(self) -> None:
        if self.tty:
            self.draw("\r")
        else:
            self.draw()
        self.out.write("\n")


def _safe_name(unit_id: str) -> str:
    # unit ids are [A-Za-z0-9._:-] (the API's pattern): only '.' and '..' could escape DIR
    if unit_id in (".", ".."):
        raise SwarmError(f"unit id {unit_id!r} cannot be a file name: use --jsonl instead")
    return f"{unit_id}.json"


def write_jsonl(target: Path, found: Iterable[dict[str, Any]]) -> int:
    """``found`` as JSON lines in ``target``, written whole or not at all (a failure half-way
    leaves no half file behind); the number of lines."""
    target = target.resolve()
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    written = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for unit in found:
                f.write(json.dumps(unit, ensure_ascii=False) + "\n")
                written += 1
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return written


def cmd_results(args: argparse.Namespace) -> int:
    client = client_of(args)
    status = client.status(args.batch)  # 404 for a batch that is not the caller's
    total = status["units"] if args.state is None else _count(status, args.state)
    progress = Progress(args.batch, total, sys.stderr)
    counts: Counter[str] = Counter()

    def counted() -> Iterator[dict[str, Any]]:
        for unit in units(client, args.batch, args.state, args.transcripts):
            counts[unit["state"]] += 1
            progress.step()
            yield unit

    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        for unit in counted():
            (args.out / _safe_name(unit["unit_id"])).write_text(
                json.dumps(unit, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )
        where = f"{args.out}/<unit id>.json"
    elif args.jsonl is not None:
        write_jsonl(args.jsonl, counted())
        where = str(args.jsonl)
    else:
        for unit in counted():
            print(json.dumps(unit, ensure_ascii=False))
        where = "stdout"
    progress.end()
    summary = ", ".join(f"{n:,} {state}" for state, n in sorted(counts.items())) or "no units"
    print(f"batch {args.batch} ({status['state']}): {summary} -> {where}", file=sys.stderr)
    return 0


def _count(status: dict[str, Any], state: str) -> int:
    counts: dict[str, int] = status["counts"]
    return counts.get(state, 0)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "results",
        help="every unit's outcome: the model's answer, or its error",
        description=(
            "Write a batch's unit outcomes (state, tokens, attempts, the model's answer or the "
            "error), at any time: an open or exhausted batch's partial results too. Without "
            "--out or --jsonl, JSON lines go to stdout; the progress bar goes to stderr."
        ),
    )
    p.add_argument("batch", metavar="BATCH")
    p.add_argument(
        "--state",
        choices=[s.value for s in UnitState],
        help="only units in this state (e.g. completed)",
    )
    p.add_argument(
        "--transcripts",
        action="store_true",
        help="with each agent unit's result, its whole transcript (every turn and tool call) "
        "under 'transcript': one request per agent unit",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, metavar="DIR", help="one DIR/<unit id>.json per unit")
    where.add_argument("--jsonl", type=Path, metavar="FILE", help="one JSON line per unit")
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_results))
