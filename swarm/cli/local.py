"""``swarm local up | down | status | demo``: the whole stack on the local emulator.

``up`` starts the stack as a background process (``python -m swarm.local.stack serve``) and
returns once it is ready, so the operator CLI (``swarm submit``, ``swarm status --watch``...) can be
used from the same shell; ``up --foreground`` runs it in this process until Ctrl-C instead (logs
on the terminal, nothing to clean up). ``down`` stops the background process (SIGTERM, then
SIGKILL after a bound) and removes ``.swarm/local.json``. ``demo`` is ``make run``: up, a seed-like
batch through the HTTP API with live progress, the healthy line and the spend, down.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from swarm.client import LOCAL_TARGET_FILE, Client, Target, one_line
from swarm.core.errors import InvalidInput, SwarmError
from swarm.local.deploy import LocalOptions, worker_timeout_bounds

STATE_DIR = LOCAL_TARGET_FILE.parent
READY_TIMEOUT_S = 300
STOP_TIMEOUT_S = 30


def _runtime_file(state_dir: Path) -> Path:
    from swarm.local.stack import runtime_file

    return runtime_file(state_dir)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_ours(pid: int) -> bool:
    """The pid still runs the local stack (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return _alive(pid)
    return b"swarm.local.stack" in cmdline


def running_pid(state_dir: Path) -> int | None:
    path = _runtime_file(state_dir)
    try:
        pid = int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if _alive(pid) and _is_ours(pid) else None


def up(options: LocalOptions, state_dir: Path, port: int = 0, quiet: bool = False) -> Target:
    """Start the stack in the background; return its Target once ``local.json`` is written."""
    pid = running_pid(state_dir)
    if pid is not None:
        raise InvalidInput(
            "local up", f"the local stack is already up or starting (pid {pid}): `swarm local down`"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    target_file = state_dir / LOCAL_TARGET_FILE.name
    for stale in (target_file, _runtime_file(state_dir)):
        stale.unlink(missing_ok=True)
    log_path = state_dir / "local.log"
    command = [
        sys.executable,
        "-u",
        "-m",
        "swarm.local.stack",
        "serve",
        "--state-dir",
        str(state_dir),
        "--time-scale",
        str(options.time_scale),
        "--port",
        str(port),
    ]
    if options.failure_rate is not None:
        command += ["--failure-rate", str(options.failure_rate)]
    if options.model_seed is not None:
        command += ["--model-seed", str(options.model_seed)]
    from swarm.local.stack import TIMING_OPTIONS

    for flag, name in TIMING_OPTIONS.items():  # timings other than the local defaults
        if getattr(options, name) != getattr(LocalOptions, name):
            command += [flag, str(getattr(options, name))]
    if not quiet:
        print(f"starting the local stack (log: {log_path}) ...", flush=True)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in this shell does not kill it: `down` does
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not target_file.exists():
        if process.poll() is not None:
            if process.returncode == 0:  # SIGTERM or SIGINT while it started
                raise SwarmError("the local stack was stopped before it was ready")
            tail = log_path.read_text()[-3000:]
            raise SwarmError(f"the local stack exited with {process.returncode}:\n{tail}")
        if time.monotonic() > deadline:
            _stop_pid(process.pid)
            raise SwarmError(f"the local stack was not ready after {READY_TIMEOUT_S}s")
        time.sleep(0.25)
    target = Target.load(target_file)
    if not quiet:
        info = json.loads(_runtime_file(state_dir).read_text())
        print(
            f"local stack up in {info['timings']['total_s']:.1f}s (pid {info['pid']}, "
            f"time scale x{options.time_scale:g})\n"
            f"  API:         {target.api_url}   (IAM: signed as the tenant role, --tenant demo)\n"
            f"  AWS (moto):  {target.aws_endpoint}\n"
            f"  CLI target:  {target_file} (read by `swarm submit/status/fleet/drain`)\n"
            "  try:         swarm submit --generate 200 --watch\n"
            "  stop:        swarm local down"
        )
    return target


def _stop_pid(pid: int) -> bool:
    """SIGTERM, wait, then SIGKILL; True if it stopped on SIGTERM."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return False


def down(state_dir: Path, quiet: bool = False) -> bool:
    """Stop the background stack; remove local.json. False when nothing was running."""
    pid = running_pid(state_dir)
    stopped = False
    if pid is not None:
        clean = _stop_pid(pid)
        stopped = True
        if not quiet:
            print(f"local stack stopped (pid {pid}{'' if clean else ', killed'})")
    elif not quiet:
        print("no local stack running")
    for path in (state_dir / LOCAL_TARGET_FILE.name, _runtime_file(state_dir)):
        path.unlink(missing_ok=True)
    return stopped


# ------------------------------------------------------------------ demo (make run)


def demo(options: LocalOptions, state_dir: Path, units: int, seed: int, timeout_s: float) -> int:
    from swarm.cli.ops import generated_units, watch

    started = time.monotonic()
    target = up(options, state_dir)
    try:
        client = Client(target)
        body: dict[str, Any] = {"units": generated_units(units, seed, 8_000, 16_000)}
        doc = client.submit(body, idempotency_key=f"demo-{seed}-{units}-{int(time.time())}")
        print(
            f"batch {doc['batch_id']}: {doc['units']} units (8k-16k tokens each) on the "
            f"{doc['lane']} lane, budget {doc['tokens']['budget']:,} tokens"
        )
        final = watch(client, doc["batch_id"], interval_s=1.0, timeout_s=timeout_s)
        tokens = final["tokens"]
        print(final["healthy_line"])
        print(
            f"spend: {tokens['spent']:,} of {tokens['budget']:,} tokens "
            f"({tokens['spent'] / max(1, tokens['budget']):.1%}); attempts {final['attempts']}, "
            f"retries {final['retries']}, dead letters {final['counts']['dead_lettered']}"
        )
        show_results(client, doc["batch_id"], state_dir / "results", timeout_s=60.0)
        agents = agent_demo(client, seed, timeout_s)
        model = client.request("GET", "/_local/model")[1]
        print(
            f"simulated model plane: {model['calls']} calls, {model['throttles']} throttles; "
            f"wall time {time.monotonic() - started:.0f}s (stack start included)"
        )
        return 0 if final["state"] == "completed" and agents == "completed" else 1
    finally:
        down(state_dir)


#: the demo's agent batch: units, and the model turns each makes (a range drawn per unit)
DEMO_AGENTS, DEMO_TURNS = 20, (4, 8)


def agent_demo(client: Client, seed: int, timeout_s: float) -> str:
    """A batch of agent units (loops of model turns calling the shipped tools), watched to its
    end; its transcripts summed up, and one unit's shown turn by turn. The batch's state."""
    from swarm.cli.ops import AGENT_TOOLS, generated_agent_units, watch

    units = generated_agent_units(DEMO_AGENTS, seed, DEMO_TURNS, AGENT_TOOLS)
    doc = client.submit({"units": units}, idempotency_key=f"demo-agents-{seed}-{int(time.time())}")
    print(
        f"agent batch {doc['batch_id']}: {doc['units']} agent units, "
        f"{DEMO_TURNS[0]}-{DEMO_TURNS[1]} model turns each, tools "
        f"{', '.join(AGENT_TOOLS)}"
    )
    final = watch(client, doc["batch_id"], interval_s=1.0, timeout_s=timeout_s)
    print(final["healthy_line"])
    from swarm.cli.results import units as results_of

    found = list(results_of(client, doc["batch_id"], None))
    figures = [u["agent"] for u in found if "agent" in u]
    stops = Counter(f["stop"] for f in figures)
    print(
        f"transcripts: {sum(f['turns'] for f in figures)} model turns, "
        f"{sum(f['tool_calls'] for f in figures)} tool calls "
        f"({sum(f['tool_errors'] for f in figures)} errors), stopped: "
        + ", ".join(f"{n} {stop}" for stop, n in sorted(stops.items()))
    )
    if found:
        sample = client.transcript(doc["batch_id"], found[0]["unit_id"])
        print(
            f"  {found[0]['unit_id']}, turn by turn (`swarm results {doc['batch_id']} "
            "--transcripts`):"
        )
        for turn in sample["turns"]:
            calls = (
                ", ".join(f"{c['name']} -> {c['status']}" for c in turn["tool_calls"]) or "answers"
            )
            print(f"    turn {turn['turn']}: {turn['billed']:,} tokens; {calls}")
    return str(final["state"])


def show_results(client: Client, batch: str, directory: Path, timeout_s: float) -> None:
    """Where the batch's outputs are, and a sample of them: every unit's result written to
    DIRECTORY/<batch>.jsonl, and the results file the finalizer wrote (once it has)."""
    from swarm.cli.results import units, write_jsonl

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{batch}.jsonl"
    written = write_jsonl(path, units(client, batch, None))
    deadline = time.monotonic() + timeout_s
    page = client.results(batch, state="completed", limit=3, next_token=None)
    while "download" not in page and time.monotonic() < deadline:
        time.sleep(1.0)
        page = client.results(batch, state="completed", limit=3, next_token=None)
    where = page["download"]["location"] if "download" in page else "not written yet"
    print(f"results: {written} units in {path} (`swarm results {batch}`); results file: {where}")
    for unit in page["units"]:
        print(f"  {unit['unit_id']}: {one_line(unit['output'], 100)}")


# ------------------------------------------------------------------ argparse


def _options(args: argparse.Namespace) -> LocalOptions:
    if args.time_scale <= 0:
        raise InvalidInput("--time-scale", "must be > 0")
    worker_timeout_s = getattr(args, "worker_timeout_s", None)
    if worker_timeout_s is None:
        worker_timeout_s = LocalOptions.worker_timeout_s
    else:
        low, high = worker_timeout_bounds()
        if not low <= worker_timeout_s <= high:
            raise InvalidInput(
                "--worker-timeout-s", f"must be {low} to {high} (Lambda's limit), in seconds"
            )
    return LocalOptions(
        time_scale=args.time_scale,
        failure_rate=args.failure_rate,
        model_seed=args.model_seed,
        worker_timeout_s=worker_timeout_s,
    )


def cmd_up(args: argparse.Namespace) -> int:
    if args.foreground:
        from swarm.local.stack import serve

        return serve(_options(args), args.state_dir, args.port)
    up(_options(args), args.state_dir, args.port)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    down(args.state_dir)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    pid = running_pid(args.state_dir)
    if pid is None:
        print("no local stack running")
        return 1
    target = Target.load(args.state_dir / LOCAL_TARGET_FILE.name)
    doc = Client(target).request("GET", "/_local/status")[1]
    print(
        json.dumps(doc, indent=2) if args.json else f"local stack up (pid {pid}): {target.api_url}"
    )
    return 0


def cmd_tenant(args: argparse.Namespace) -> int:
    target = Target.load(args.state_dir / LOCAL_TARGET_FILE.name)
    doc = Client(target).request("POST", "/_local/tenants", {"tenant": args.name})[1]
    print(f"tenant {doc['tenant']}: role {doc['role_arn']} (use --tenant {doc['tenant']})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return demo(_options(args), args.state_dir, args.units, args.seed, args.timeout)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    local = sub.add_parser("local", help="the whole stack on the local emulator (moto)")
    verbs = local.add_subparsers(dest="local_command", required=True)

    def common(p: argparse.ArgumentParser, scale: bool = True) -> None:
        p.add_argument("--state-dir", type=Path, default=STATE_DIR, help="(.swarm)")
        if scale:
            p.add_argument(
                "--time-scale",
                type=float,
                default=LocalOptions.time_scale,
                help="quota x N, model latency / N (default 10: a 300-unit batch in ~1.5 min)",
            )
            p.add_argument("--failure-rate", type=float, help="simulated failure rate (0.04)")
            p.add_argument(
                "--model-seed",
                type=int,
                help="simulated model's seed: failures and usage follow (seed, unit, attempt)",
            )

    p = verbs.add_parser("up", help="start the local stack (background; --foreground to block)")
    common(p)
    p.add_argument("--foreground", action="store_true", help="run here until Ctrl-C")
    p.add_argument("--port", type=int, default=0, help="API port on 127.0.0.1 (default: free)")
    p.add_argument(
        "--worker-timeout-s",
        type=int,
        help=f"the worker's timeout, deployed seconds ({LocalOptions.worker_timeout_s}); the "
        "lanes' visibility timeout and the claims' lease are 6x it over the time scale: raise "
        "it when a big batch's worker messages come near the lease (swarm local status --json: "
        "longest_invocation_s)",
    )
    p.set_defaults(handler=cmd_up)

    p = verbs.add_parser("down", help="stop the local stack and remove .swarm/local.json")
    common(p, scale=False)
    p.set_defaults(handler=cmd_down)

    p = verbs.add_parser("status", help="is the local stack up; --json: pollers and timings")
    common(p, scale=False)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_status)

    p = verbs.add_parser(
        "tenant", help="create a tenant's IAM role in the local stack (then use --tenant NAME)"
    )
    common(p, scale=False)
    p.add_argument("name", help="the tenant (its role is <tenant prefix><name>)")
    p.set_defaults(handler=cmd_tenant)

    p = verbs.add_parser("demo", help="up, a seed-like batch through the API with progress, down")
    common(p)
    p.add_argument("--units", type=int, default=300, help="units in the batch (300)")
    p.add_argument("--seed", type=int, default=61, help="seed for the units (61)")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for the batch")
    p.set_defaults(handler=cmd_demo)


def main(argv: list[str] | None = None) -> int:
    """``python -m swarm.cli.local up|down|status|demo`` (the same as ``swarm local ...``)."""
    parser = argparse.ArgumentParser(prog="swarm")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["local", *(sys.argv[1:] if argv is None else argv)])
    try:
        code: int = args.handler(args)
    except SwarmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
