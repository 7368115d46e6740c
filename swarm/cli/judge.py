"""``swarm judge BATCH``: BFCL's verdict on a batch submitted with ``swarm submit --bfcl``.

Each unit's final backend state is rebuilt from its tool journal (the BFCL toolset's journals
table: every call its backends ran, once each, in order) and compared with the state its ground
truth produces when BFCL executes it directly, with BFCL's own ``state_checker``. A tool run
twice or lost changes that state: it is the at-most-once oracle (docs/agents.md, "BFCL")."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

from swarm.cli.ops import client_of, expecting_the_api, target_options
from swarm.cli.results import units
from swarm.client import Client
from swarm.core.errors import InvalidInput


def judged(client: Client, batch: str, category: str) -> Iterator[dict[str, Any]]:
    """Each unit of the batch with its verdict: ``{"unit_id", "state", "valid", "error"}``."""
    try:
        from swarm.workloads import bfcl
    except ImportError:
        raise InvalidInput(
            "judge", "needs the bfcl-eval package: run `make setup` (it installs it)"
        ) from None
    entries = bfcl.entries_by_unit(category)
    for unit in units(client, batch, None, False):
        unit_id = unit["unit_id"]
        entry = entries.get(unit_id)
        verdict: dict[str, Any] = {"unit_id": unit_id, "state": unit["state"]}
        if entry is None:
            verdict.update(valid=False, error=f"not a BFCL {category} entry's unit")
        elif unit["state"] != "completed":
            verdict.update(valid=False, error=f"the unit is {unit['state']}, not completed")
        else:
            result = bfcl.judge_journal(entry, client.tool_journal(batch, unit_id))
            verdict.update(valid=bool(result.get("valid")), error=result.get("error_message"))
        yield verdict


def judge_batch(client: Client, batch: str, category: str, as_json: bool) -> int:
    """Print the verdicts (a line per unit that fails, then the count); 0 when every unit of
    the batch completed with its ground truth's final state."""
    verdicts = list(judged(client, batch, category))
    valid = sum(1 for v in verdicts if v["valid"])
    if as_json:
        print(json.dumps({"batch_id": batch, "units": len(verdicts), "valid": valid,
                          "verdicts": verdicts}, indent=2))  # fmt: skip
    else:
        for verdict in verdicts:
            if not verdict["valid"]:
                print(f"{verdict['unit_id']}: {verdict['error']}")
        print(
            f"{valid}/{len(verdicts)} final states equal to their ground truth "
            f"(BFCL {category}, BFCL's state_checker on each unit's tool journal)"
        )
    return 0 if verdicts and valid == len(verdicts) else 1


def cmd_judge(args: argparse.Namespace) -> int:
    return judge_batch(client_of(args), args.batch, args.category, args.json)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "judge",
        help="BFCL's verdict on a `submit --bfcl` batch: each unit's final state",
        description="Judge a batch submitted with `swarm submit --bfcl CATEGORY`: rebuild each "
        "unit's backends from its tool journal (the BFCL toolset's journals table, read with "
        "the operator's credentials) and compare them with the state its ground truth produces, "
        "with BFCL's own state_checker. Exit 0 when every unit completed with its ground "
        "truth's final state, 1 otherwise. Example: swarm judge b-0123... (docs/agents.md)",
    )
    p.add_argument("batch", metavar="BATCH")
    p.add_argument(
        "--category",
        default="multi_turn_base",
        help="the BFCL category submitted (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print every unit's verdict as JSON")
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_judge))
