"""Operator commands: submit, status (with a live progress bar), resume, fleet, drain.

They work the same against the local stack (``swarm local up``) and a deployed one
(``--stack Swarm-prod``): only the :class:`~swarm.client.Target` differs.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TextIO

from swarm.api.models import (
    MAX_BODY_BYTES,
    MAX_INLINE_UNITS,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_UNITS,
)
from swarm.cli.argtypes import positive_int
from swarm.client import Client, NoAnswer, Unreachable, target_from_args
from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.pricing import parse_usd
from swarm.sim.models import Mix, parse_mix

TERMINAL = ("completed", "exhausted")
REQUEST_TIMEOUT_S = 30.0  # one request's wait for its answer
SUBMIT_RETRIES = 3  # a submit that got no answer is sent again (same Idempotency-Key) this often
RETRY_BACKOFF_S = 1.0  # the wait before the first retry; it doubles each time
WATCH_TOLERATED_ERRORS = 3  # status checks in a row a watch survives (timeouts, resets)


def expecting_the_api(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """A command reads the API's answers by their fields: an answer without them (``--api-url``
    pointing at another JSON service) is one line saying so, not a traceback."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (KeyError, TypeError) as e:
            raise SwarmError(
                f"the answer is not the swarm API's (no {e}): check --api-url / --stack"
            ) from None

    return run


def client_of(args: argparse.Namespace) -> Client:
    target = target_from_args(args.api_url, args.stack, args.region, args.tenant)
    return Client(target, timeout_s=REQUEST_TIMEOUT_S)


def target_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where (default: the local stack from `swarm local up`)")
    g.add_argument("--stack", help="a deployed stack's name, e.g. Swarm-prod (reads its outputs)")
    g.add_argument("--api-url", help="the API's base URL")
    g.add_argument("--region", help="AWS region of the deployed stack")
    g.add_argument(
        "--tenant", help="local stack only: sign as this tenant's IAM role (default: demo)"
    )


# ------------------------------------------------------------------ progress


def progress_line(doc: dict[str, Any], width: int = 30) -> str:
    """``[#####.....] 120/400 done | 20 running | 15 queued | 245 waiting | 1.2M of 6.0M tokens
    (20%)``

    *running*: held by a worker claiming or running its attempt now; *queued*: admitted by the
    ledger (tokens reserved) and waiting on its lane (visible, delayed or hidden until its turn);
    *waiting*: not admitted yet (the fan-out has not reached it, or a retry between attempts).
    A batch being opened (state ``opening``: its execution writes the unit records first) shows
    ``opening: 20,000/100,000 units written`` instead.
    """
    total = max(1, int(doc["units"]))
    if doc.get("state") == "opening":
        written = int(doc.get("units_written") or 0)
        return f"opening: {written:,}/{total:,} units written | nothing admitted yet"
    counts, tokens = doc["counts"], doc["tokens"]
    done = counts["completed"] + counts["dead_lettered"]
    filled = int(width * done / total)
    bar = "#" * filled + "." * (width - filled)
    money = doc.get("usd") or {}
    spent, budget = tokens["spent"], tokens.get("budget")
    if budget is None and "budget" in money:  # a budget in dollars (exact decimal texts)
        share = f" ({Decimal(money['spent']) / Decimal(money['budget']):.0%})"
        spend = f"${money['spent']} of ${money['budget']}{share}, {_tokens(spent)} tokens"
    else:
        share = f" ({spent / budget:.0%})" if budget else ""
        spend = f"{_tokens(spent)} of {_tokens(budget or 0)} tokens{share}"
        if "spent" in money:
            spend += f", ${money['spent']}"
    line = (
        f"[{bar}] {done:>{len(str(total))}}/{total} done | {counts['running']} running | "
        f"{counts['queued']} queued | {counts['pending']} waiting | {spend}"
    )
    if counts["remainder"]:
        line += f" | remainder {counts['remainder']}"
    return line


def _tokens(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 10_000:
        return f"{n / 1e3:.0f}k"
    return f"{n:,}"


def watch(
    client: Client,
    batch_id: str,
    interval_s: float = 1.0,
    timeout_s: float = 3600,
    out: TextIO | None = None,
) -> Any:
    """Print progress (on ``out``, default stdout) until the batch closes; returns its final
    status. Up to ``WATCH_TOLERATED_ERRORS`` checks in a row that get no answer are reported
    and tried again."""
    out = out or sys.stdout
    tty = out.isatty()
    deadline = time.monotonic() + timeout_s
    last = ""
    failures = 0
    while True:
        try:
            doc = client.status(batch_id)
        except (NoAnswer, Unreachable) as e:
            failures += 1
            if failures > WATCH_TOLERATED_ERRORS:
                raise SwarmError(
                    f"{e} (the batch runs on: follow it with `swarm status {batch_id} --watch`)"
                ) from None
            detail = e.detail if isinstance(e, NoAnswer) else str(e)
            if tty:
                print(file=out)
            print(f"status check failed ({detail}); trying again", flush=True, file=out)
            last = ""
            time.sleep(interval_s)
            continue
        failures = 0
        line = progress_line(doc)
        if tty:
            print("\r" + line.ljust(len(last)), end="", flush=True, file=out)
        elif line != last:
            print(line, flush=True, file=out)
        last = line
        if doc["state"] in TERMINAL:
            if tty:
                print(file=out)
            return doc
        if time.monotonic() > deadline:
            if tty:
                print(file=out)
            raise InvalidInput(
                "--watch", f"batch {batch_id} still {doc['state']} after {timeout_s}s"
            )
        time.sleep(interval_s)


def _interval(text: str) -> float:
    """Seconds between checks: a finite number in [0.1, 3600] (time.sleep rejects < 0, nan)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.1 <= value <= 3600:  # also false for nan
        raise argparse.ArgumentTypeError(f"{text} is out of range: must be in 0.1..3600 seconds")
    return value


# ------------------------------------------------------------------ commands


def generated_units(n: int, seed: int, min_tokens: int, max_tokens: int) -> list[dict[str, Any]]:
    """Units shaped like Lab 6.1's (8,000-16,000 tokens each)."""
    rng = random.Random(seed)
    return [
        {
            "unit_id": f"unit-{i:05d}",
            "projected_tokens": rng.randint(min_tokens, max_tokens),
            "input": f"work unit {i}",
        }
        for i in range(n)
    ]


#: the tools a generated agent unit uses by default: the deployment's shipped ones
AGENT_TOOLS = ("calculator", "notes_write", "notes_read")
#: a generated agent unit's output bound per turn (maxTokens)
AGENT_OUTPUT_BOUND = 512


def generated_agent_units(
    n: int, seed: int, turns: tuple[int, int], tools: Sequence[str]
) -> list[dict[str, Any]]:
    """Agent units: each a loop of ``turns`` model turns (a range: drawn per unit) calling
    ``tools``, its cap sized for its turns with a growing input. On the simulated model plane
    the system text's ``turns=N`` is the number of turns the scripted model makes
    (swarm.adapters.simulated_agent); a real model reads it as an instruction."""
    rng = random.Random(seed)
    units = []
    for i in range(n):
        t = rng.randint(*turns)
        # each turn's draw: the tools' specs and the conversation so far (growing by an answer
        # and a tool result a turn, ~300 tokens), plus its output bound; half again as margin
        draws = sum(400 + 300 * k + AGENT_OUTPUT_BOUND for k in range(t))
        units.append(
            {
                "unit_id": f"agent-{i:05d}",
                "projected_tokens": draws * 3 // 2,
                "input": {
                    "system": f"Work step by step with your tools, then report. turns={t}",
                    "messages": [
                        {"role": "user", "content": [{"text": f"Work unit {i}: investigate."}]}
                    ],
                    "inferenceConfig": {"maxTokens": AGENT_OUTPUT_BOUND},
                    "tools": list(tools),
                    "limits": {"max_turns": min(100, t + 5)},
                },
            }
        )
    return units


def bfcl_units(category: str, limit: int | None) -> list[dict[str, Any]]:
    """BFCL's multi-turn entries as agent units (swarm.workloads.bfcl): their tools are the
    deployment's BFCL toolset."""
    try:
        from swarm.workloads import bfcl
    except ImportError:
        raise InvalidInput(
            "--bfcl", "needs the bfcl-eval package: run `make setup` (it installs it)"
        ) from None
    return [
        {
            "unit_id": bfcl.unit_id(entry),
            "projected_tokens": bfcl.PROJECTED_TOKENS,
            "input": bfcl.unit_input(entry),
        }
        for entry in bfcl.entries(category, limit)
    ]


def turn_range(text: str) -> tuple[int, int]:
    """``N`` or ``A-B`` model turns, 1 to 100."""
    low, _, high = text.partition("-")
    try:
        a, b = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or A-B (turns)") from None
    if not 1 <= a <= b <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: turns are 1 to 100, A at most B")
    return a, b


def read_units_file(path: Path) -> Any:
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise InvalidInput("FILE", f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InvalidInput("FILE", f"{path} is not JSON (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise InvalidInput("FILE", f"{path} is not JSON ({e.msg} at line {e.lineno})") from None
    if isinstance(doc, list):
        return {"units": doc}
    if isinstance(doc, dict):
        return doc
    raise InvalidInput("FILE", f"{path}: give a JSON array of units or a batch object")


def upload_units(client: Client, body: dict[str, Any], log: TextIO) -> dict[str, Any]:
    """``body`` with its units uploaded as a manifest (``POST /uploads``, then a PUT of the
    URL) and named by its key instead."""
    if not isinstance(body.get("units"), list):
        raise InvalidInput(
            "--upload", "the FILE names a manifest already: --upload sends units (an array)"
        )
    units = body.pop("units")
    data = json.dumps(units, separators=(",", ":"), ensure_ascii=False).encode()
    if len(data) > MAX_MANIFEST_BYTES:
        raise InvalidInput(
            "--upload",
            f"the units are {len(data):,} bytes as JSON; a manifest holds at most "
            f"{MAX_MANIFEST_BYTES:,} ({MAX_MANIFEST_BYTES // (1024 * 1024)} MiB): split them "
            "into several batches",
        )
    key = client.upload(data)
    print(f"uploaded {len(units):,} units ({len(data):,} bytes) to {key}", file=log, flush=True)
    return {**body, "manifest": {"key": key}}


def with_models(units: list[dict[str, Any]], mix: Mix, seed: int) -> list[dict[str, Any]]:
    """``units`` each naming a model of ``mix`` (``input.model``, drawn on ``seed``): a prompt
    text becomes a request of one user message, as the model plane reads it anyway."""
    named = []
    for unit, model in zip(units, mix.assign(len(units), seed), strict=True):
        given = unit["input"]
        request = (
            dict(given)
            if isinstance(given, dict)
            else {"messages": [{"role": "user", "content": [{"text": given}]}]}
        )
        named.append({**unit, "input": {**request, "model": model}})
    return named


def usd_amount(text: str) -> Decimal:
    """A CLI dollar amount: > 0, at most 6 decimal places (whole micro-dollars), kept exact."""
    try:
        parse_usd(text, "DOLLARS", positive=True)
    except InvalidInput as e:
        raise argparse.ArgumentTypeError(e.message) from None
    return Decimal(text)


def cmd_submit(args: argparse.Namespace) -> int:
    given = [args.file is not None, args.generate is not None, args.bfcl is not None]
    if sum(given) != 1:
        raise InvalidInput("submit", "give one of: a FILE of units, --generate N, --bfcl CATEGORY")
    if args.agent and args.generate is None:
        raise InvalidInput("--agent", "makes --generate's units agent units: give --generate N")
    if args.limit is not None and args.bfcl is None:
        raise InvalidInput("--limit", "limits --bfcl's entries: give --bfcl CATEGORY")
    if args.file is not None:
        body = read_units_file(args.file)
    elif args.bfcl is not None:
        body = {"units": bfcl_units(args.bfcl, args.limit)}
        if args.budget is None:  # every unit's cap admitted: a benchmark, not a budget test
            body["budget"] = sum(int(unit["projected_tokens"]) for unit in body["units"])
    elif args.agent:
        tools = args.tools.split(",") if args.tools else list(AGENT_TOOLS)
        body = {"units": generated_agent_units(args.generate, args.seed, args.turns, tools)}
    else:
        body = {"units": generated_units(args.generate, args.seed, 8_000, 16_000)}
    if args.mix is not None:
        if args.file is not None:
            raise InvalidInput(
                "--mix",
                "names the models of generated units: a FILE's units name theirs in input.model",
            )
        body["units"] = with_models(body["units"], parse_mix(args.mix, None), args.seed)
    if args.lane:
        body["lane"] = args.lane
    if args.budget is not None and args.budget_usd is not None:
        raise InvalidInput("--budget-usd", "give --budget (tokens) or --budget-usd, not both")
    if args.budget is not None:
        body["budget"] = args.budget
    if args.budget_usd is not None:
        body.pop("budget", None)
        body["budget_usd"] = args.budget_usd
    client = client_of(args)
    log = sys.stderr if args.json else sys.stdout  # --json: stdout is only the JSON
    if args.upload:
        body = upload_units(client, body, log)

    def retrying(error: NoAnswer, retry: int, wait: float) -> None:
        print(
            f"{error.detail}; sending the submit again with the same Idempotency-Key in "
            f"{wait:g}s (retry {retry} of {SUBMIT_RETRIES})",
            file=log,
            flush=True,
        )

    # a key of this invocation's own, unless given: its retries are the same batch
    key = args.idempotency_key or f"cli-{uuid.uuid4()}"
    doc = client.submit(
        body, key, retries=SUBMIT_RETRIES, backoff_s=RETRY_BACKOFF_S, on_retry=retrying
    )
    if args.json and not args.watch:
        print(json.dumps(doc, indent=2))
        return 0
    budget = doc["tokens"].get("budget")
    print(
        f"batch {doc['batch_id']}: {doc['units']} units on the {doc['lane']} lane, "
        + (
            f"budget {budget:,} tokens" if budget is not None else f"budget ${doc['usd']['budget']}"
        ),
        file=log,
    )
    if args.watch:
        final = watch(client, doc["batch_id"], out=log)
        print(json.dumps(final, indent=2) if args.json else final["healthy_line"])
        if args.bfcl is not None and not args.json:  # BFCL's verdict on the closed batch
            from swarm.cli.judge import judge_batch

            return judge_batch(client, doc["batch_id"], args.bfcl, as_json=False)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    client = client_of(args)
    if args.watch:  # with --json, progress goes to stderr: stdout is the final JSON
        doc = watch(client, args.batch, out=sys.stderr if args.json else sys.stdout)
    else:
        doc = client.status(args.batch)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    if not args.watch:
        print(progress_line(doc))
    print(doc["healthy_line"])
    if doc.get("agent"):
        agents = doc["agent"]
        print(f"agent units: {agents['turns']:,} model turns, {agents['tool_calls']:,} tool calls")
    if doc["counts"].get("awaiting_approval"):
        print(
            f"awaiting approval: {doc['counts']['awaiting_approval']} unit(s) "
            f"(swarm approvals {doc['batch_id']})"
        )
    if doc.get("remainder"):
        print(
            f"remainder ({doc['counts']['remainder']}): {', '.join(doc['remainder'][:10])}"
            + (" ..." if doc["counts"]["remainder"] > 10 else "")
        )
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    client = client_of(args)
    doc = client.resume(args.batch, args.top_up, args.top_up_usd)
    amount = f"${args.top_up_usd}" if args.top_up is None else f"{args.top_up:,} tokens"
    print(f"batch {args.batch}: topped up by {amount}, {doc['requeued']} remainder units requeued")
    if args.watch:
        print(watch(client, args.batch)["healthy_line"])
    return 0


def approvals_lines(doc: dict[str, Any]) -> list[str]:
    """The waiting calls, one a line: unit, toolUseId, tool, who decides it (the operator
    roles, or the tenant), how long it waited, its input."""
    waiting = doc["waiting"]
    if not waiting:
        return [f"batch {doc['batch_id']}: no tool call waits for a decision"]
    lines = [f"batch {doc['batch_id']}: {len(waiting)} tool call(s) wait for a decision"]
    for w in waiting:
        given = json.dumps(w["input"], ensure_ascii=False)
        given = given if len(given) <= 120 else given[:117] + "..."
        deciders = w.get("deciders", "tenant")
        by = deciders if isinstance(deciders, str) else ",".join(deciders)
        lines.append(
            f"  {w['unit_id']}  {w['toolUseId']}  {w['tool']}  decided by {by}  "
            f"waited {w['waited_s']:,.0f} s  {given}"
        )
    lines.append(
        f"decide with: swarm approve {doc['batch_id']} UNIT TOOLUSE [--reason R] | "
        f"swarm reject {doc['batch_id']} UNIT TOOLUSE --reason R"
    )
    return lines


def cmd_approvals(args: argparse.Namespace) -> int:
    client = client_of(args)
    seen: str | None = None
    while True:
        doc = client.approvals(args.batch, operator=args.operator)
        if args.json and not args.watch:
            print(json.dumps(doc, indent=2))
            return 0
        text = "\n".join(approvals_lines(doc))
        if text != seen:  # --watch prints the list again when it changes
            print(text, flush=True)
            seen = text
        if not args.watch:
            return 0
        if client.status(args.batch)["state"] in TERMINAL and not doc["waiting"]:
            return 0
        time.sleep(args.interval)


def _cmd_decide(args: argparse.Namespace, decision: str) -> int:
    doc = client_of(args).decide(
        args.batch, args.unit, args.tool_use, decision, args.reason or "", operator=args.operator
    )
    again = "" if doc["recorded"] else " (recorded before: unchanged)"
    why = f": {doc['reason']}" if doc["reason"] else ""
    print(
        f"{doc['unit_id']} {doc['toolUseId']} ({doc['tool']}): {doc['decision']}d by "
        f"{doc['decided_by']} after {doc['waited_s']:,.0f} s{why}{again}; the unit is "
        f"{doc['unit_state']}"
    )
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    return _cmd_decide(args, "approve")


def cmd_reject(args: argparse.Namespace) -> int:
    return _cmd_decide(args, "reject")


def cmd_rebind(args: argparse.Namespace) -> int:
    doc = client_of(args).rebind(args.tenant)
    state = "its binding forgotten" if doc["was_bound"] else "it had no binding"
    print(f"tenant {doc['tenant']}: {state}; its role binds at its next call")
    return 0


def cmd_fleet(args: argparse.Namespace) -> int:
    doc = client_of(args).fleet()
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    # each model's bucket (a server before the registry shows its one governor)
    models = doc.get("models") or {"": {"governor": doc["governor"], "default": True}}
    for name, model in models.items():
        g = model["governor"]
        label = f"model {name}{' (default)' if model.get('default') and name else ''}"
        print(
            f"{label if name else 'governor'}: {g['available_tokens']:,} of "
            f"{g['capacity_tokens']:,} tokens available, rate {g['effective_rate_tps']:,.0f}/"
            f"{g['governed_rate_tps']:,.0f} tokens/s, {g['throttles']} throttles, output "
            f"burndown x{g.get('output_burndown', 1):g}"
        )
        r = g.get("requests")
        if r:
            print(
                f"  requests: {r['available']:,} of {r['capacity']:,} available, rate "
                f"{r['effective_rate_rps']:,.2f}/{r['rate_rps']:,.2f} requests/s"
            )
    for lane, d in doc["lanes"].items():
        print(
            f"  {lane:<7} visible {d['visible']:>6}  not visible {d['in_flight']:>5}  "
            f"delayed {d['delayed']:>5}"
        )
    print(
        f"draining: {'on' if doc['draining'] else 'off'} | not visible {doc['in_flight']} | "
        f"queued {doc['queued']}"
    )
    return 0


class DrainStatus(Protocol):
    def drain_status(self) -> Any: ...


def wait_for_drain(
    client: DrainStatus,
    timeout_s: float,
    interval_s: float,
    out: TextIO | None = None,
    *,
    tolerate_errors: int = 0,
    prefix: str = "",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[bool, Any]:
    """Check ``GET /drain`` every ``interval_s`` until it says safe to deploy; print
    ``waiting: N running, M queued`` after each check that is not (only running work holds a
    deploy up: queued units stay queued, however deep). Returns (safe, the last
    status): safe is False once ``timeout_s`` has passed. Up to ``tolerate_errors`` failed
    checks in a row are reported and retried (a long wait should survive one lost request)."""
    out = out or sys.stdout
    deadline = clock() + timeout_s
    failures = 0
    doc: Any = None
    while True:
        try:
            doc = client.drain_status()
        except SwarmError as e:
            failures += 1
            if failures > tolerate_errors or clock() > deadline:
                raise
            print(f"{prefix}check failed ({e}); trying again", flush=True, file=out)
            sleep(interval_s)
            continue
        failures = 0
        if doc["safe_to_deploy"]:
            return True, doc
        if clock() > deadline:
            return False, doc
        print(
            f"{prefix}waiting: {doc['running']} running, {doc['queued']} queued",
            flush=True,
            file=out,
        )
        sleep(interval_s)


def cmd_drain(args: argparse.Namespace) -> int:
    client = client_of(args)
    if args.action in ("on", "off"):
        client.set_drain(args.action == "on")
        print(f"drain {args.action}: {client.target.drain_parameter}")
    if args.action == "on" and args.wait:
        drained, doc = wait_for_drain(client, args.timeout, args.interval)
        if drained:
            print(
                f"running: 0; {doc['queued']} queued messages stay queued (they run after "
                "`swarm drain off`). Safe to deploy."
            )
            return 0
        print(f"still {doc['running']} running after {args.timeout}s", file=sys.stderr)
        return 1
    if args.action == "status":
        doc = client.drain_status()
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            state = "on" if doc["draining"] else "off"
            safe = "safe to deploy" if doc["safe_to_deploy"] else "not safe to deploy yet"
            print(f"drain {state}: {doc['running']} running, {doc['queued']} queued; {safe}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="submit a batch (a FILE of units, or --generate N)")
    p.add_argument(
        "file",
        nargs="?",
        type=Path,
        metavar="FILE",
        help="JSON: an array of units, or {units|manifest, lane, budget, ...}",
    )
    p.add_argument("--generate", type=positive_int, metavar="N", help="N Lab-6.1-like units")
    p.add_argument("--seed", type=int, default=0, help="seed for --generate (0)")
    p.add_argument(
        "--agent",
        action="store_true",
        help="with --generate: agent units, each a loop of model turns calling tools",
    )
    p.add_argument(
        "--turns",
        type=turn_range,
        default=(4, 12),
        metavar="N|A-B",
        help="with --agent: the model turns of each unit, or a range drawn per unit (4-12)",
    )
    p.add_argument(
        "--tools",
        metavar="A,B",
        help=f"with --agent: the tools the units use ({','.join(AGENT_TOOLS)})",
    )
    p.add_argument(
        "--bfcl",
        choices=["multi_turn_base"],
        metavar="CATEGORY",
        help="BFCL's multi-turn entries of CATEGORY (multi_turn_base) as agent units: their "
        "tools are the BFCL toolset's functions (cdk.json tools.bfcl, granted to the tenant; "
        "shipped). The budget defaults to every unit's cap. With --watch, BFCL's verdict on "
        "each unit's final state follows (`swarm judge`); docs/agents.md, 'BFCL'",
    )
    p.add_argument("--limit", type=positive_int, metavar="N", help="with --bfcl: the first N")
    p.add_argument(
        "--mix",
        metavar="NAME=F,...",
        help="with --generate or --bfcl: the models of the deployment's registry the units name "
        "(input.model), e.g. haiku=0.7,sonnet=0.3: each unit's drawn on --seed, the fractions "
        "adding up to 1 (`swarm fleet` lists the models; without --mix: the default model)",
    )
    p.add_argument("--lane", choices=["high", "normal", "low"], help="priority lane")
    p.add_argument("--budget", type=positive_int, help="token budget")
    p.add_argument(
        "--budget-usd",
        type=usd_amount,
        metavar="DOLLARS",
        help="a budget in US dollars instead (at most 6 decimal places; needs model.prices)",
    )
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="a submit repeated with this key and body is the same batch (default: a new key "
        "per invocation; a submit that gets no answer is retried with it)",
    )
    p.add_argument(
        "--upload",
        action="store_true",
        help="upload the units as a manifest first (POST /uploads, then a PUT of its URL) and "
        f"submit its key: past {MAX_INLINE_UNITS:,} units or a body of "
        f"{MAX_BODY_BYTES / 2**20:.2f} MiB JSON-escaped, up to {MAX_MANIFEST_UNITS:,} units "
        f"and {MAX_MANIFEST_BYTES // 2**20} MiB",
    )
    p.add_argument("--watch", action="store_true", help="show progress until the batch closes")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the API's JSON (with --watch: the final status; progress goes to stderr)",
    )
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_submit))

    p = sub.add_parser("status", help="a batch's state, counts and spend")
    p.add_argument("batch", metavar="BATCH")
    p.add_argument("--watch", action="store_true", help="live progress bar until it closes")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the API's JSON (with --watch: progress on stderr)",
    )
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_status))

    p = sub.add_parser("resume", help="top up an exhausted batch and run its remainder")
    p.add_argument("batch", metavar="BATCH")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument(
        "--top-up", type=positive_int, metavar="TOKENS", help="for a budget in tokens"
    )
    amount.add_argument(
        "--top-up-usd",
        type=usd_amount,
        metavar="DOLLARS",
        help="for a budget in dollars (at most 6 decimal places)",
    )
    p.add_argument("--watch", action="store_true")
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_resume))

    p = sub.add_parser(
        "approvals",
        help="the batch's tool calls that wait for a person's decision (human gates)",
        description=(
            "Lists each waiting call of an agent batch: its unit, toolUseId, tool, who decides "
            "it (operator roles, or the tenant), how long it has waited and its input. A call "
            'waits when its tool is registered with approval: "required" (or {"deciders": '
            "[...]}) or the unit lists it in input.limits.approve_tools. Shows every waiting "
            "call: it follows the listing's pages (next_token) to the last, the unit that "
            "waits longest first."
        ),
    )
    p.add_argument("batch", metavar="BATCH")
    p.add_argument(
        "--watch",
        action="store_true",
        help="list again as it changes, until the batch is closed and nothing waits",
    )
    p.add_argument("--interval", type=float, default=2.0, help="--watch: seconds between reads")
    p.add_argument(
        "--json", action="store_true", help="print the API's JSON (every page's calls in one)"
    )
    p.add_argument("--operator", action="store_true", help="call as an operator role")
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_approvals))

    for name, handler, text in (
        ("approve", cmd_approve, "approve a waiting tool call: the tool runs, once"),
        ("reject", cmd_reject, "reject a waiting tool call: the model reads the reason"),
    ):
        p = sub.add_parser(
            name,
            help=text,
            description=(
                f"{text[0].upper()}{text[1:]}. The same decision again answers the one "
                "recorded; a different one is refused (409). The batch's tenant decides, or "
                "only the operator roles the tool's cdk.json approval.deciders names, else "
                "approvals.deciders (--operator); swarm approvals shows whose turn it is."
            ),
        )
        p.add_argument("batch", metavar="BATCH")
        p.add_argument("unit", metavar="UNIT")
        p.add_argument("tool_use", metavar="TOOLUSE", help="the call's toolUseId")
        p.add_argument(
            "--reason",
            required=name == "reject",
            help="why (kept in the transcript"
            + ("; the model reads it)" if name == "reject" else ")"),
        )
        p.add_argument("--operator", action="store_true", help="decide as an operator role")
        target_options(p)
        p.set_defaults(handler=expecting_the_api(handler))

    p = sub.add_parser(
        "rebind",
        help="operators: re-bind a tenant whose IAM role was deleted and created again",
        description=(
            "A tenant is bound to the unique id of the role that first called as it; a role "
            "created again under the same name is refused until this forgets the binding (its "
            "next call binds it). Needs an operator role."
        ),
    )
    p.add_argument("tenant", metavar="TENANT")
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_rebind))

    p = sub.add_parser("fleet", help="operators: governor, lanes, drain state")
    p.add_argument("--json", action="store_true")
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_fleet))

    p = sub.add_parser("drain", help="the drain switch: on [--wait], off, status")
    p.add_argument("action", choices=["on", "off", "status"])
    p.add_argument(
        "--wait",
        action="store_true",
        help="with on: block until nothing is running (queued units stay queued)",
    )
    p.add_argument("--timeout", type=positive_int, default=1800, help="seconds to wait (1800)")
    p.add_argument("--interval", type=_interval, default=2.0, help="seconds between checks (2)")
    p.add_argument("--json", action="store_true")
    target_options(p)
    p.set_defaults(handler=expecting_the_api(cmd_drain))
