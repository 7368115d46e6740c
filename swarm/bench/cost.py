"""`swarm bench cost`: one batch through the local stack on the happy path, and what it would cost
on AWS per unit.

It starts a local stack as ``swarm local demo`` does (:func:`swarm.cli.local.up`), with a
failure rate of 0 (every unit completes at its first attempt) and the deployed timings of
cdk.json on the local clock (:func:`deployed_timings`: the finalizer's poll, the sweeper's
schedule, the worker's timeout and governor wait; the local stack's defaults are shorter, for
tests, and would bill time-driven work several times over), resets the stack's meter
(``POST /_local/bill/reset``), submits one batch of ``--units`` seed-like units (8k-16k tokens)
through the API, waits until its executions have ended and its pollers are idle (watching the
emulator's own control surface, which is not billed: no status polls through the API), reads
the meter (``GET /_local/bill``, :mod:`swarm.local.billing`) and stops the stack.

Printed: billed requests per unit and US dollars per million units by service, operation and
caller, at the list prices of :mod:`swarm.bench.prices` (the model's own price excluded: its
tokens are the budget's business), the Lambda GB-seconds per unit from the measured durations
(with each cold start's INIT, timed apart: :func:`measure_init_s`, a fresh interpreter
importing the handler from the functions' asset alone), the asset's size
(:func:`measure_asset`), and the Lambda-seconds per
unit the workers spent waiting for tokens. Everything the batch made
AWS do between submit and its last poll counts, including what is driven by time rather than by
units (the finalizer's poll loop, the sweeper's schedule, the event source mappings' empty long
polls): docs/explanation/scale.md says which is which.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from swarm.bench import prices
from swarm.client import Client
from swarm.core.errors import InvalidInput, SwarmError
from swarm.core.records import Lane
from swarm.local import billing
from swarm.local.deploy import ROOT, LocalOptions

#: issue 15's targets for the happy path
TARGET_REQUESTS_PER_UNIT = 8.0
TARGET_USD_PER_MILLION_UNITS = 10.0
#: issue 33's target for agent units: billed requests per model turn, the tools' own apart
TARGET_REQUESTS_PER_TURN = 5.0


def tool_callers() -> frozenset[str]:
    """The bill's callers that are the deployment's tool functions (a function's label in the
    bill is its handler module's name: the tool sources under functions/tools/): what a turn's
    tool calls cost, listed apart."""
    return frozenset(
        path.stem for path in (ROOT / "functions" / "tools").glob("*.py") if path.stem != "__init__"
    )


#: the API refuses a budget above cdk.json's budget.max_tokens
MAX_BUDGET = 1_000_000_000
MILLION = 1_000_000
NOT_COUNTED = (
    "the model's tokens",
    "storage (S3 objects, DynamoDB items, point-in-time recovery)",
    "CloudWatch Logs ingestion, metrics and alarms; X-Ray",
    "KMS requests of AWS-managed keys; data transfer",
)
MB = 1024 * 1024
#: a function's code and layers, unzipped (an asset uploaded through S3: no 50 MB zip limit)
LAMBDA_UNZIPPED_LIMIT_MB = 250
#: a cold start's INIT, measured in a fresh interpreter this many times (the median is billed)
INIT_SAMPLES = 3
INIT_OPERATION = "duration: INIT (cold starts)"


#: the finalize loop's states entered once per poll (a wait for the closure that timed out),
#: however many units the run has
POLL_STATES = frozenset(f"state transition: {name}" for name in ("Poll", "CountPoll"))


def time_driven(line: dict[str, Any]) -> bool:
    """A line that grows with the run's length rather than its units: the event source
    mappings' idle long polls, the finalize loop's polls (its transitions, the finalizer's
    invocations and time, which include the closure's results file) and the sweeper."""
    if line["caller"] == billing.ESM_CALLER:
        return str(line["operation"]).startswith("ReceiveMessage (empty")
    if line["service"] == "stepfunctions":
        return str(line["operation"]) in POLL_STATES
    if line["service"] == "lambda" and line["caller"] in ("finalizer", "sweeper"):
        return True
    return bool(line["caller"] == "sweeper")


@dataclass(frozen=True)
class CostConfig:
    units: int = 300
    time_scale: float = LocalOptions.time_scale
    seed: int = 61
    min_tokens: int = 8_000
    max_tokens: int = 16_000
    state_dir: Path = field(default_factory=lambda: Path(".swarm") / "bench-cost")
    timeout_s: float = 900.0
    #: the batch's lane: the API's default, which keeps a reserve for the high lane and so
    #: queues its units for tokens instead of booking them (docs/explanation/governor.md); ``high``
    #: books
    lane: Lane = Lane.NORMAL
    #: agent units (``swarm submit --generate N --agent``) of ``turns`` model turns each,
    #: calling the shipped tools: the bill is also given per model turn
    agent: bool = False
    turns: int = 8

    def check(self) -> None:
        if self.units < 1:
            raise InvalidInput("--units", "must be at least 1")
        if self.time_scale <= 0:
            raise InvalidInput("--time-scale", "must be > 0")
        if not 1 <= self.turns <= 100:
            raise InvalidInput("--turns", "must be 1 to 100 model turns")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise InvalidInput("--min-tokens", "must be at least 1 and at most --max-tokens")


def run(cfg: CostConfig, progress: TextIO | None = None) -> dict[str, Any]:
    """Run the batch on a fresh local stack; the bill per unit (:func:`summarize`)."""
    from swarm.cli.local import down, up
    from swarm.cli.ops import AGENT_TOOLS, generated_agent_units, generated_units

    cfg.check()
    out = progress or sys.stderr
    if cfg.agent:
        turns = (cfg.turns, cfg.turns)
        units = generated_agent_units(cfg.units, cfg.seed, turns, AGENT_TOOLS)
    else:
        units = generated_units(cfg.units, cfg.seed, cfg.min_tokens, cfg.max_tokens)
    budget = min(MAX_BUDGET, 2 * sum(u["projected_tokens"] for u in units))
    timings = deployed_timings(cfg.time_scale)
    options = LocalOptions(time_scale=cfg.time_scale, failure_rate=0.0, **timings)
    print(f"starting the local stack in {cfg.state_dir} ...", file=out, flush=True)
    target = up(options, cfg.state_dir, quiet=True)
    try:
        client = Client(target)
        client.request("POST", "/_local/bill/reset")
        doc = client.submit(
            {"units": units, "budget": budget, "lane": cfg.lane.value},
            idempotency_key=f"bench-cost-{cfg.seed}-{cfg.units}-{int(time.time())}",
        )
        batch = str(doc["batch_id"])
        print(f"batch {batch}: {cfg.units} units submitted", file=out, flush=True)
        bill = _wait_until_done(client, batch, cfg, out)
        final = client.status(batch)  # after the meter was read: not in the bill
    finally:
        down(cfg.state_dir, quiet=True)
    if final.get("state") != "completed" or final["counts"]["completed"] != cfg.units:
        raise SwarmError(
            f"batch {batch} ended {final.get('state')} with {final['counts']['completed']}/"
            f"{cfg.units} units completed: not the happy path, so its bill is not reported"
        )
    template = cfg.state_dir / "cdk.out" / f"Swarm-{options.stage}.template.json"
    print("building the functions' asset to weigh it and time its imports ...", file=out)
    figures = measure_asset(template, cfg.state_dir / "asset")
    bill = bill_init(bill, lambda module: float(figures["import_s"][module]))
    result = summarize(bill, cfg.units, batch=batch, status=final)
    if cfg.agent:
        result["agent"] = per_turn(result, int((final.get("agent") or {}).get("turns", 0)))
    result["asset"] = figures
    result["local_timings"] = timings
    result["lane"] = cfg.lane.value
    return result


def deployed_timings(time_scale: float) -> dict[str, Any]:
    """cdk.json's worker timeout, governor wait, finalizer poll bounds and sweeper schedule, as
    :class:`LocalOptions` takes them: in deployed seconds (the wiring scales them), except the
    finalizer's poll bounds, a Wait state's whole seconds on the local clock (30 s at x10: 3 s)."""
    if str(ROOT) not in sys.path:  # infra/ next to swarm/, as the local stack imports it
        sys.path.insert(0, str(ROOT))
    from infra.context import cdk_json_context

    context = cdk_json_context()
    worker, fanout = context["worker"], context["fanout"]

    def local_wait(deployed_s: float) -> int:
        return max(1, round(float(deployed_s) / time_scale))

    return {
        "worker_timeout_s": int(worker["timeout_seconds"]),
        "governor_max_wait_s": float(worker["governor_max_wait_seconds"]),
        "finalizer_poll_s": local_wait(fanout["finalizer_poll_seconds"]),
        "finalizer_max_poll_s": local_wait(fanout["finalizer_max_poll_seconds"]),
        "sweeper_rate_minutes": int(fanout["sweeper_rate_minutes"]),
    }


def _wait_until_done(client: Client, batch: str, cfg: CostConfig, out: TextIO) -> Any:
    """The meter once the batch's executions (the map, the finalize loop and its
    continuations) have all ended and no poller has an invocation in flight."""
    deadline = time.monotonic() + cfg.timeout_s
    last = 0.0
    while True:
        bill = client.request("GET", "/_local/bill")[1]
        parent = bill["stepfunctions"].get(billing.PARENT, {})
        if parent.get("started", 0) >= 1 and bill["executions_running"] == 0:
            status = client.request("GET", "/_local/status")[1]
            if not any(p["in_flight"] for p in status["pollers"]):
                return client.request("GET", "/_local/bill")[1]
        if time.monotonic() > deadline:
            raise SwarmError(f"batch {batch} did not finish within {cfg.timeout_s:g}s")
        if time.monotonic() - last > 5:
            model = client.request("GET", f"/_local/model?batch={batch}")[1]
            print(f"  {model['calls']} model calls, {bill['window_s']:.0f}s", file=out, flush=True)
            last = time.monotonic()
        time.sleep(0.5)


def measure_init_s(module: str, asset_dir: Path | None = None) -> float:
    """A cold start's INIT of the handler ``module`` (``functions.worker``), as this machine
    does it: a fresh interpreter that imports the module and exits, the median of
    :data:`INIT_SAMPLES` runs. With ``asset_dir`` (a functions' asset built with this machine's
    wheels, :func:`measure_asset`) the interpreter is isolated and has only the standard library
    and the asset on ``sys.path``, as on Lambda; without, this checkout's environment. The local
    function host cannot time it itself: its process has every library imported already. On
    Lambda the runtime starts first, and a function below 1,769 MB has a fraction of a vCPU: a
    real INIT is likely longer (docs/explanation/scale.md)."""
    if asset_dir is None:
        command = [sys.executable, "-c", f"import {module}"]
    else:
        code = f"import sys; sys.path.insert(0, {str(asset_dir)!r}); import {module}"
        command = [sys.executable, "-I", "-S", "-c", code]
    samples = []
    for _ in range(INIT_SAMPLES):
        started = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _functions_runtime(template: Path) -> tuple[str, str]:
    """(runtime, architecture) of the synthesized template's functions (one asset for all)."""
    resources = json.loads(template.read_text())["Resources"].values()
    for resource in resources:
        if resource["Type"] == "AWS::Lambda::Function":
            props = resource["Properties"]
            return str(props["Runtime"]), str(props.get("Architectures", ["x86_64"])[0])
    raise SwarmError(f"{template} has no Lambda function")


def measure_asset(template: Path, workdir: Path) -> dict[str, Any]:
    """The functions' asset (:mod:`infra.asset`): built as ``cdk deploy`` builds it, for the
    runtime and architecture of the synthesized ``template``, and weighed; built again with this
    machine's wheels, to time each handler's cold-start imports from it alone."""
    if str(ROOT) not in sys.path:  # infra/ next to swarm/, as the local stack imports it
        sys.path.insert(0, str(ROOT))
    from infra import asset

    runtime, architecture = _functions_runtime(template)
    shutil.rmtree(workdir, ignore_errors=True)
    deployed, here = workdir / "lambda", workdir / "host"
    asset.build(deployed, runtime.removeprefix("python"), asset.lambda_platform(architecture))
    asset.build(here, *asset.host_target())
    sources = asset.asset_files()
    return {
        "runtime": runtime,
        "architecture": architecture,
        "zipped_bytes": asset.zipped_size(deployed),
        "unzipped_bytes": asset.tree_size(deployed),
        "source_files": len(sources),
        "source_bytes": sum(path.stat().st_size for path in sources),
        "import_s": {module: measure_init_s(module, here) for module in asset.handler_modules()},
    }


def bill_init(bill: dict[str, Any], init_s: Callable[[str], float]) -> dict[str, Any]:
    """The meter's snapshot with each function's cold starts billed: ``init_s(module)`` (on
    the deployed clock: an INIT waits for nothing scaled) per cold start, at the function's
    memory and architecture, as AWS bills INIT for functions on managed runtimes."""
    lines = list(bill["lines"])
    functions = {name: dict(use) for name, use in bill["lambda"].items()}
    for name, use in functions.items():
        if not use.get("cold_starts"):
            continue
        seconds = init_s(use["module"])
        billed = billing.lambda_billed_seconds(seconds)
        gb = use["cold_starts"] * billing.gb_seconds(billed, use["memory_mb"])
        price = billing.LAMBDA_GB_S.get(use["architecture"], billing.LAMBDA_GB_S["x86_64"])
        lines.append(
            {
                "service": "lambda",
                "operation": INIT_OPERATION,
                "caller": name,
                "price": price,
                "requests": 0,
                "quantity": gb,
            }
        )
        use.update(init_s=seconds, gb_s=use["gb_s"] + gb)
    return {**bill, "lines": lines, "lambda": functions}


def summarize(
    bill: dict[str, Any],
    units: int,
    *,
    batch: str | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The meter's snapshot, per unit and priced: lines by (service, operation, caller), sums
    by service and by caller, the Lambda figures, and the targets."""
    lines = []
    for line in bill["lines"]:
        price = prices.price_of(line["price"])
        usd = line["quantity"] * price.usd_per_unit
        lines.append(
            {
                **line,
                "billed": price.usd > 0,
                "requests_per_unit": line["requests"] / units,
                "quantity_per_unit": line["quantity"] / units,
                "unit": price.unit,
                "usd_per_million_units": usd / units * MILLION,
            }
        )
    lines.sort(key=lambda d: (-d["usd_per_million_units"], -d["requests_per_unit"]))
    billed = [d for d in lines if d["billed"]]
    by_service = _sums(billed, "service")
    by_caller = _sums(billed, "caller")
    functions = bill["lambda"]
    gb_s = sum(f["gb_s"] for f in functions.values())
    worker = functions.get("worker", {})
    time_scale = float(bill["time_scale"])
    lambda_gb = {
        part: sum(
            d["usd_per_million_units"]
            for d in billed
            if d["service"] == "lambda" and d["operation"] == operation
        )
        for part, operation in (
            ("model_call", "duration: the model call"),
            ("sleeping_for_tokens", "duration: sleeping for tokens"),
            ("init", INIT_OPERATION),
        )
    }
    total_usd = sum(d["usd_per_million_units"] for d in billed)
    by_time = [d for d in billed if time_driven(d)]
    hours = bill["window_s"] * time_scale / 3600
    result: dict[str, Any] = {
        "units": units,
        "batch_id": batch,
        "state": (status or {}).get("state"),
        "attempts": (status or {}).get("attempts"),
        "retries": (status or {}).get("retries"),
        "time_scale": time_scale,
        "window_s": bill["window_s"],
        "window_deployed_s": bill["window_s"] * time_scale,
        "prices_as_of": prices.AS_OF,
        "region": prices.REGION,
        "execution_types": bill["execution_types"],
        "requests_per_unit": sum(d["requests_per_unit"] for d in billed),
        "usd_per_million_units": total_usd,
        "usd_per_million_units_without_the_model_call": total_usd - lambda_gb["model_call"],
        # the same bill split by what drives it: the units, or the run's length (at this
        # batch's pace; a fleet with a larger quota finishes units faster and pays less of it)
        "time_driven": {
            "requests_per_unit": sum(d["requests_per_unit"] for d in by_time),
            "usd_per_million_units": sum(d["usd_per_million_units"] for d in by_time),
            "requests_per_hour": sum(d["requests"] for d in by_time) / hours if hours else 0.0,
            "usd_per_hour": (
                sum(d["usd_per_million_units"] for d in by_time) * units / MILLION / hours
                if hours
                else 0.0
            ),
            "units_per_hour": units / hours if hours else 0.0,
        },
        "targets": {
            "requests_per_unit": TARGET_REQUESTS_PER_UNIT,
            "usd_per_million_units": TARGET_USD_PER_MILLION_UNITS,
        },
        "lambda": {
            "gb_seconds_per_unit": gb_s / units,
            "usd_per_million_units": by_service.get("lambda", {}).get("usd_per_million_units", 0),
            "model_call_usd_per_million_units": lambda_gb["model_call"],
            "sleeping_for_tokens_usd_per_million_units": lambda_gb["sleeping_for_tokens"],
            "init_usd_per_million_units": lambda_gb["init"],
            "waited_for_tokens_s_per_unit": worker.get("waited_deployed_s", 0.0) / units,
            "slept_for_tokens_s_per_unit": worker.get("slept_s", 0.0) * time_scale / units,
            "model_call_s_per_unit": worker.get("model_s", 0.0) * time_scale / units,
            "functions": {
                name: {
                    **use,
                    "invocations_per_unit": use["invocations"] / units,
                    "gb_seconds_per_unit": use["gb_s"] / units,
                    "billed_ms_per_invocation": 1000 * use["billed_s"] / max(1, use["invocations"]),
                }
                for name, use in functions.items()
            },
        },
        "by_service": by_service,
        "by_caller": by_caller,
        "lines": lines,
        "stepfunctions": bill["stepfunctions"],
        "dynamodb": bill["dynamodb"],
        "not_counted": list(NOT_COUNTED),
    }
    return result


def per_turn(result: dict[str, Any], turns: int) -> dict[str, Any]:
    """An agent batch's bill per model turn: billed requests and dollars per million turns of
    everything but the tool functions' own (their invocations, durations and requests), and
    theirs apart, by line."""
    units = int(result["units"])
    billed = [d for d in result["lines"] if d["billed"]]
    callers = tool_callers()
    tools = [d for d in billed if d["caller"] in callers]
    rest = [d for d in billed if d not in tools]
    per = units / turns if turns else 0.0  # a unit's figures times this: a turn's

    def requests(lines: list[dict[str, Any]]) -> float:
        return float(sum(d["requests_per_unit"] for d in lines)) * per

    def usd(lines: list[dict[str, Any]]) -> float:
        return float(sum(d["usd_per_million_units"] for d in lines)) * per

    return {
        "turns": turns,
        "turns_per_unit": turns / units if units else 0.0,
        "requests_per_turn": requests(rest),
        "usd_per_million_turns": usd(rest),
        "tools": {
            "requests_per_turn": requests(tools),
            "usd_per_million_turns": usd(tools),
            "lines": [
                {
                    "service": d["service"],
                    "operation": d["operation"],
                    "caller": d["caller"],
                    "requests_per_turn": d["requests_per_unit"] * per,
                    "usd_per_million_turns": d["usd_per_million_units"] * per,
                }
                for d in tools
            ],
        },
        "waited_for_tokens_s_per_turn": result["lambda"]["waited_for_tokens_s_per_unit"] * per,
        "slept_for_tokens_s_per_turn": result["lambda"]["slept_for_tokens_s_per_unit"] * per,
        "target_requests_per_turn": TARGET_REQUESTS_PER_TURN,
    }


def _agent_lines(figures: dict[str, Any] | None) -> list[str]:
    if not figures:
        return []
    out = [
        "",
        f"agent units: {figures['turns']:,} model turns ({figures['turns_per_unit']:.1f} a "
        "unit); the tool functions' own requests apart",
        f"  per model turn: {figures['requests_per_turn']:.2f} billed requests "
        f"(target <= {figures['target_requests_per_turn']:g}), "
        f"${figures['usd_per_million_turns']:.2f} per million turns",
        f"  waiting for tokens: {figures['waited_for_tokens_s_per_turn']:.3f} Lambda-s per turn "
        f"({figures['slept_for_tokens_s_per_turn']:.3f} s of it asleep within the bounded hold)",
        f"  the tools' own, per turn: {figures['tools']['requests_per_turn']:.2f} requests, "
        f"${figures['tools']['usd_per_million_turns']:.2f} per million turns",
    ]
    for d in figures["tools"]["lines"]:
        out.append(
            f"    {d['service']:<10} {d['operation'][:40]:<40} {d['caller'][:24]:<24} "
            f"{d['requests_per_turn']:>7.3f} {d['usd_per_million_turns']:>8.2f}"
        )
    return out


def _timings_line(timings: dict[str, Any] | None, scale: float) -> list[str]:
    if not timings:
        return []
    return [
        f"deployed timings: finalizer poll every {timings['finalizer_poll_s'] * scale:g}-"
        f"{timings['finalizer_max_poll_s'] * scale:g} s, sweeper "
        f"every {timings['sweeper_rate_minutes']} min, governor wait up to "
        f"{timings['governor_max_wait_s']:g} s, worker timeout {timings['worker_timeout_s']} s"
    ]


def _sums(lines: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    sums: dict[str, dict[str, float]] = defaultdict(
        lambda: {"requests_per_unit": 0.0, "usd_per_million_units": 0.0}
    )
    for d in lines:
        sums[d[key]]["requests_per_unit"] += d["requests_per_unit"]
        sums[d[key]]["usd_per_million_units"] += d["usd_per_million_units"]
    return dict(sorted(sums.items(), key=lambda kv: -kv[1]["usd_per_million_units"]))


def render(result: dict[str, Any], top: int = 30) -> str:
    """The figures as text: the bill's lines (the ``top`` costliest), sums by service and by
    caller, Lambda, and the targets."""
    units = result["units"]
    scale = result["time_scale"]
    out = [
        f"swarm bench cost: {units:,} units, one batch on the happy path (failure rate 0) on "
        f"the {result.get('lane', 'normal')} lane, local stack at x{scale:g}",
        f"batch {result['batch_id']}: {result['state']}, {result['attempts']} attempts, "
        f"{result['retries']} retries; {result['window_s']:.0f} s on the local clock "
        f"(~{result['window_deployed_s']:.0f} s deployed)",
        f"AWS list prices, {result['region']}, as of {result['prices_as_of']} "
        "(swarm/bench/prices.py); the model's own price excluded",
        *_timings_line(result.get("local_timings"), scale),
        "",
        f"{'service':<14} {'operation':<46} {'caller':<21} {'req/unit':>9} {'$/M units':>10}",
    ]
    billed = [d for d in result["lines"] if d["billed"]]
    for d in billed[:top]:
        out.append(
            f"{d['service']:<14} {d['operation'][:46]:<46} {d['caller'][:21]:<21} "
            f"{d['requests_per_unit']:>9.3f} {d['usd_per_million_units']:>10.2f}"
        )
    rest = billed[top:]
    if rest:
        out.append(
            f"{'':<14} {f'({len(rest)} more lines)':<46} {'':<21} "
            f"{sum(d['requests_per_unit'] for d in rest):>9.3f} "
            f"{sum(d['usd_per_million_units'] for d in rest):>10.2f}"
        )
    free = [d for d in result["lines"] if not d["billed"]]
    if free:
        out.append(
            f"not charged: {sum(d['requests_per_unit'] for d in free):.3f} requests per unit "
            "(SSM at standard throughput, S3 DELETE, Step Functions' API, control plane)"
        )
    for title, sums in (("by service", result["by_service"]), ("by caller", result["by_caller"])):
        out += ["", f"{title:<36} {'req/unit':>9} {'$/M units':>10}"]
        for name, s in sums.items():
            out.append(
                f"{name:<36} {s['requests_per_unit']:>9.3f} {s['usd_per_million_units']:>10.2f}"
            )
    lam = result["lambda"]
    out += [
        "",
        f"{'Lambda function':<16} {'memory':>7} {'invocations/unit':>17} "
        f"{'billed ms/invocation: mean':>27} {'p10':>7} {'p50':>7} {'p90':>7} {'GB-s/unit':>10} "
        f"{'cold starts':>11} {'INIT ms':>8}",
    ]
    for name, use in sorted(lam["functions"].items(), key=lambda kv: -kv[1]["gb_s"]):
        out.append(
            f"{name:<16} {use['memory_mb']:>4} MB {use['invocations_per_unit']:>17.3f} "
            f"{use['billed_ms_per_invocation']:>27,.0f} {use.get('billed_ms_p10', 0):>7,.0f} "
            f"{use.get('billed_ms_p50', 0):>7,.0f} {use.get('billed_ms_p90', 0):>7,.0f} "
            f"{use['gb_seconds_per_unit']:>10.4f} {use.get('cold_starts', 0):>11} "
            f"{1000 * use.get('init_s', 0.0):>8,.0f}"
        )
    targets = result["targets"]
    timed = result["time_driven"]
    out += [
        "",
        f"billed requests per unit: {result['requests_per_unit']:.2f} "
        f"(target <= {targets['requests_per_unit']:g}); of them driven by the run's length "
        f"(idle long polls, the finalize loop, the sweeper) {timed['requests_per_unit']:.2f}: "
        f"{timed['requests_per_hour']:,.0f} requests and ${timed['usd_per_hour']:.4f} per "
        f"deployed hour at this batch's {timed['units_per_hour']:,.0f} units per hour",
        f"US dollars per million units: {result['usd_per_million_units']:.2f} "
        f"(target <= {targets['usd_per_million_units']:g}); without the Lambda time in the "
        f"model call: {result['usd_per_million_units_without_the_model_call']:.2f}; driven by "
        f"the run's length: {timed['usd_per_million_units']:.2f}",
        f"Lambda: {lam['gb_seconds_per_unit']:.3f} GB-s per unit from measured durations "
        f"(${lam['usd_per_million_units']:.2f} per M units, requests included); the model "
        f"call's and the token waits' time converted back from x{scale:g}; each cold start's "
        f"INIT (${lam['init_usd_per_million_units']:.2f} per M units) as a fresh interpreter "
        "importing the handler from the asset alone takes on this machine",
        f"  worker, per unit: {lam['model_call_s_per_unit']:.3f} s in the model call "
        f"(${lam['model_call_usd_per_million_units']:.2f} per M units)",
        f"Lambda-seconds waited for tokens per unit: {lam['waited_for_tokens_s_per_unit']:.3f} "
        f"(of which sleeping {lam['slept_for_tokens_s_per_unit']:.3f} s: "
        f"${lam['sleeping_for_tokens_usd_per_million_units']:.2f} per M units)",
        *_agent_lines(result.get("agent")),
        *_asset_lines(result.get("asset")),
        "not counted: " + "; ".join(result["not_counted"]),
    ]
    return "\n".join(out)


def _asset_lines(figures: dict[str, Any] | None) -> list[str]:
    if not figures:
        return []
    imports = ", ".join(
        f"{module.rpartition('.')[2]} {1000 * seconds:,.0f} ms"
        for module, seconds in sorted(figures["import_s"].items())
    )
    return [
        f"function asset ({figures['runtime']} {figures['architecture']}, one for every "
        f"function, as cdk deploy bundles it): {figures['zipped_bytes'] / MB:.1f} MB zipped, "
        f"{figures['unzipped_bytes'] / MB:.1f} MB unzipped (Lambda's limit: "
        f"{LAMBDA_UNZIPPED_LIMIT_MB} MB); of it the handlers and the library modules they "
        f"import: {figures['source_files']} files, {figures['source_bytes'] / 1024:,.0f} KiB "
        "(no local stack, simulator, CLI or bench code)",
        f"cold start imports (a fresh interpreter with only the asset and the standard library, "
        f"median of {INIT_SAMPLES}; the INIT billed above): {imports}",
    ]
