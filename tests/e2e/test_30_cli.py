"""The operator CLI (`swarm submit | status | resume | fleet | drain`) against the local stack.

Every test runs the real `swarm` console script as a subprocess, in a temporary directory whose
`.swarm/local.json` is the session stack's target (that file is how the CLI finds a local stack),
and asserts on the exit status and on what the operator sees: stdout/stderr text, or the parsed
`--json` output. No invocation may print a traceback. Each test acts as its own tenant, so its
batches are invisible to the others.

Timing (measured on the 2-core machine, stack at time scale 10, one test at a time): a watched
batch (8 units of 1,000-3,000 tokens, or 3 generated ones of 8,000-16,000) closes in 2.3-5.2 s;
the budget-capped one exhausts in 2.5 s and completes 2.5 s after its resume; `drain on --wait`
with 30 small units just submitted returns in 4 s; every other command answers in under 1 s
(Python start included). The file takes ~85 s, ~30 s of it starting the stack. Every subprocess
is bounded by `WATCH_S` or `CMD_S` (50x those figures), so a `--watch` that never ends fails the
test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from swarm.client import Target
from tests.e2e.conftest import Stack, assert_books, expected_books
from tests.e2e.conftest import batch_id as known_batch_id

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).with_name("swarm")  # [project.scripts] swarm = "swarm.cli:main"
# no swarm/__main__.py, so `python -m swarm` is not an entry point; -c is the fallback
COMMAND = (
    [str(SCRIPT)]
    if SCRIPT.exists()
    else [sys.executable, "-c", "import sys; from swarm.cli import main; sys.exit(main())"]
)
CMD_S = 60.0  # one request-and-answer command (measured: < 1 s)
WATCH_S = 300.0  # a --watch of a small batch, or drain on --wait (measured: 2-5 s)
SETTLE_S = 60.0  # polling for a state the stack reaches by itself (measured: < 1 s)
BATCH_LINE = re.compile(r"^batch (b-[0-9a-f]{24}): ")
HEALTHY = re.compile(
    r"^run\.(completed|exhausted): completed (\d+)/(\d+) in [\d,]+s \| spent [\d,]+ of [\d,]+ "
    r"tokens \([\d.]+%\), \$\d+\.\d{6} \| retries \d+ \| dead-lettered \d+"
)


# ------------------------------------------------------------------ running the CLI


_TENANTS: set[str] = set()  # tenants whose role this process created with `swarm local tenant`


def swarm(cwd: Path, *args: str, timeout: float = CMD_S) -> subprocess.CompletedProcess[str]:
    """Run `swarm ARGS` in ``cwd``; it must end within ``timeout`` and print no traceback.
    A ``--tenant NAME`` gets its IAM role in the stack first (`swarm local tenant NAME`)."""
    if "--tenant" in args and (cwd / ".swarm" / "local.json").exists():
        tenant = args[args.index("--tenant") + 1]
        if tenant not in _TENANTS:
            _TENANTS.add(tenant)
            ok(swarm(cwd, "local", "tenant", tenant))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        PYTHONPATH=str(REPO),  # the working tree's swarm, whatever the cwd
        # the local emulator takes any credentials; never hand real ones to these commands
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    try:
        done = subprocess.run(
            [*COMMAND, *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`swarm {' '.join(args)}` still running after {timeout}s: {e.stdout!r}")
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def swarm_in_background(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """`swarm ARGS` started in ``cwd`` and left running (the caller waits for it, bounded)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        PYTHONPATH=str(REPO),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return subprocess.Popen(
        [*COMMAND, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def ok(done: subprocess.CompletedProcess[str]) -> list[str]:
    """A successful command's stdout lines."""
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout.strip().splitlines()


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)  # all of stdout: nothing else may be printed there


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """A refused command: exit status 2, nothing on stdout, one line on stderr."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swarm: error: "), done.stderr
    return lines[0]


def usage_error(done: subprocess.CompletedProcess[str], prog: str) -> str:
    """An argparse refusal: exit status 2, the usage of ``prog``, then one error line."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith(f"usage: {prog} "), done.stderr
    assert lines[-1].startswith(f"{prog}: error: "), done.stderr
    return lines[-1]


def submit(cwd: Path, *args: str, timeout: float = CMD_S) -> subprocess.CompletedProcess[str]:
    """`swarm submit ARGS`, retried (bounded) while the stack sheds load: an earlier e2e test
    (the quota storm) can leave it shedding for up to a minute."""
    deadline = time.monotonic() + 180
    while True:
        done = swarm(cwd, "submit", *args, timeout=timeout)
        if not (done.returncode == 2 and "429 shedding" in done.stderr):
            return done
        assert time.monotonic() < deadline, done.stderr
        time.sleep(5)


def batch_id(lines: list[str]) -> str:
    match = BATCH_LINE.match(lines[0])
    assert match, lines
    return match.group(1)


def eventually(probe: Callable[[], Any], what: str, timeout: float = SETTLE_S) -> Any:
    """Poll ``probe`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)


def write_units(path: Path, n: int, tokens: Callable[[int], int], prefix: str) -> Path:
    units = [
        {"unit_id": f"{prefix}-{i:03d}", "projected_tokens": tokens(i), "input": f"unit {i}"}
        for i in range(n)
    ]
    path.write_text(json.dumps(units))
    return path


# ------------------------------------------------------------------ submit and status


def test_submit_a_units_file_and_watch_it_then_status_shows_the_same_books(here: Path) -> None:
    tenant = "cli-file"
    units = write_units(here / "units.json", 8, lambda i: 1_000 + 250 * i, "f")  # 1,000-2,750

    # When a units file is submitted with --watch
    lines = ok(submit(here, str(units), "--tenant", tenant, "--watch", timeout=WATCH_S))

    # Then it says what it submitted, shows progress, and ends with the healthy line on close
    assert re.match(r"^batch b-\w+: 8 units on the normal lane, budget [\d,]+ tokens$", lines[0])
    bid = batch_id(lines)
    assert any(line.startswith("[") and " 8/8 done | " in line for line in lines[1:-1]), lines
    healthy = HEALTHY.match(lines[-1])
    assert healthy and healthy.group(1) == "completed" and healthy.group(3) == "8", lines

    # And `status` shows the same final books as a bar and the healthy line
    status = ok(swarm(here, "status", bid, "--tenant", tenant))
    assert len(status) == 2
    assert status[0].startswith("[" + "#" * 30 + "] 8/8 done | 0 running | 0 queued | 0 waiting | ")
    assert status[1] == lines[-1]

    # And `status --json` is the API's document, the same numbers
    doc = as_json(swarm(here, "status", bid, "--tenant", tenant, "--json"))
    assert doc["batch_id"] == bid and doc["tenant"] == tenant and doc["state"] == "completed"
    assert doc["counts"]["completed"] + doc["counts"]["dead_lettered"] == 8
    assert doc["counts"]["completed"] == int(healthy.group(2))
    assert 0 < doc["tokens"]["spent"] <= doc["tokens"]["budget"]
    assert doc["healthy_line"] == lines[-1]

    # And `status --watch` of a closed batch ends at once; with --json, stdout is only the JSON
    watched = ok(swarm(here, "status", bid, "--tenant", tenant, "--watch", timeout=WATCH_S))
    assert watched[-1] == lines[-1] and " 8/8 done | " in watched[0]
    watched_doc = as_json(
        swarm(here, "status", bid, "--tenant", tenant, "--watch", "--json", timeout=WATCH_S)
    )
    assert watched_doc["state"] == "completed" and watched_doc["batch_id"] == bid

    # And `results` writes every unit's outcome: as JSON lines, one file per unit, or stdout
    jsonl = here / "out" / "results.jsonl"
    (here / "out").mkdir()
    done = swarm(here, "results", bid, "--tenant", tenant, "--jsonl", str(jsonl))
    assert ok(done) == [] and done.stderr.strip().endswith(f"-> {jsonl}"), done.stderr
    lines_out = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert sorted(u["unit_id"] for u in lines_out) == [f"f-{i:03d}" for i in range(8)]
    completed = [u for u in lines_out if u["state"] == "completed"]
    assert len(completed) == doc["counts"]["completed"] and all(u["output"] for u in completed)
    ok(swarm(here, "results", bid, "--tenant", tenant, "--out", str(here / "units")))
    for unit in lines_out:
        assert json.loads((here / "units" / f"{unit['unit_id']}.json").read_text()) == unit
    only = ok(swarm(here, "results", bid, "--tenant", tenant, "--state", "completed"))
    assert [json.loads(line) for line in only] == completed
    # another tenant: the batch is not theirs, a one-line error
    line = error_line(swarm(here, "results", bid, "--tenant", "cli-other"))
    assert f"no batch '{bid}'" in line, line


def test_submit_generated_units_on_a_lane_with_a_budget_and_an_idempotency_key(
    here: Path,
) -> None:
    tenant = "cli-generate"
    options = ["--generate", "3", "--lane", "high", "--budget", "250000", "--tenant", tenant]

    # When generated units are submitted with a lane, a budget and a key, as JSON
    doc = as_json(submit(here, *options, "--idempotency-key", "cli-key-1", "--json"))

    # Then the JSON is the new batch as asked
    assert doc["batch_id"].startswith("b-") and doc["tenant"] == tenant
    assert doc["units"] == 3 and doc["lane"] == "high"
    # (opening: its execution's open step writes the unit records after the submit answers)
    assert doc["tokens"]["budget"] == 250_000
    assert doc["state"] in ("opening", "open", "completed")
    bid = doc["batch_id"]

    # When the same submit is replayed with the same key: the same batch, in text and in JSON
    again = ok(submit(here, *options, "--idempotency-key", "cli-key-1"))
    assert again == [f"batch {bid}: 3 units on the high lane, budget 250,000 tokens"]

    # And `status --watch` follows it to its close (it was just submitted) and shows completion
    watched = ok(swarm(here, "status", bid, "--tenant", tenant, "--watch", timeout=WATCH_S))
    assert watched[-2].startswith("[" + "#" * 30 + "] 3/3 done | 0 running | 0 queued | 0 waiting")
    assert HEALTHY.match(watched[-1]) and watched[-1].startswith("run.completed: completed ")

    # And a replay with --json --watch ends with the batch closed: stdout is only the final JSON
    # (the progress goes to stderr)
    replay = submit(
        here, *options, "--idempotency-key", "cli-key-1", "--json", "--watch", timeout=WATCH_S
    )
    final = as_json(replay)
    assert final["batch_id"] == bid and final["state"] == "completed"
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 3
    assert replay.stderr.startswith(f"batch {bid}: 3 units on the high lane")
    assert " 3/3 done | " in replay.stderr.strip().splitlines()[-1]

    # But the same key for different work is a conflict, said in one line
    changed = ["--generate", "3", "--lane", "high", "--budget", "260000", "--tenant", tenant]
    line = error_line(submit(here, *changed, "--idempotency-key", "cli-key-1"))
    assert line.startswith("swarm: error: 409 conflict: ") and "Idempotency-Key" in line, line

    # And a fresh key makes a fresh batch
    other = as_json(submit(here, *options, "--idempotency-key", "cli-key-2", "--json"))
    assert other["batch_id"] != bid


def test_generated_agent_units_run_their_loops_and_results_carry_their_transcripts(
    here: Path,
) -> None:
    tenant = "cli-agents"
    # When agent units are generated and watched to their end
    options = ["--generate", "4", "--agent", "--turns", "3", "--tenant", tenant]
    lines = ok(submit(here, *options, "--watch", timeout=WATCH_S))
    bid = batch_id(lines)
    assert HEALTHY.match(lines[-1]) and lines[-1].startswith("run.completed: completed 4/4 ")
    # Then the status counts their turns and tool calls
    status = ok(swarm(here, "status", bid, "--tenant", tenant))
    assert status[-1].startswith("agent units: 12 model turns, "), status
    # And the results carry each loop's figures, and with --transcripts its whole transcript
    out = here / "agents.jsonl"
    ok(swarm(here, "results", bid, "--tenant", tenant, "--transcripts", "--jsonl", str(out)))
    found = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(found) == 4
    for unit in found:
        assert unit["state"] == "completed" and unit["agent"]["turns"] == 3
        assert unit["agent"]["stop"] == "completed" and unit["output"].startswith("Done after 3")
        turns = unit["transcript"]["turns"]
        assert [t["turn"] for t in turns] == [1, 2, 3]
        assert sum(t["billed"] for t in turns) == unit["tokens"]
        assert all(c["status"] in ("success", "error") for t in turns for c in t["tool_calls"])
    # But a tool the registry does not have is a 400 naming the unit's field
    line = error_line(
        submit(here, "--generate", "1", "--agent", "--tools", "shell", "--tenant", tenant)
    )
    assert "units[0].input.tools[0]" in line and "'shell' is not a tool" in line, line


def test_bfcl_entries_submitted_and_watched_are_judged_against_their_ground_truth(
    here: Path,
) -> None:
    tenant = "cli-bfcl"
    # When BFCL's first three entries are submitted and watched to their end
    options = ["--bfcl", "multi_turn_base", "--limit", "3", "--tenant", tenant]
    lines = ok(submit(here, *options, "--watch", timeout=WATCH_S))
    bid = batch_id(lines)
    # Then the budget admitted every unit's cap, and BFCL's verdict follows the healthy line
    assert "budget 1,200,000 tokens" in lines[0], lines[0]
    assert lines[-2].startswith("run.completed: completed 3/3 "), lines
    assert lines[-1].startswith("3/3 final states equal to their ground truth"), lines
    # and `swarm judge` gives it again, every unit's verdict in JSON
    verdicts = as_json(swarm(here, "judge", bid, "--json", "--tenant", tenant))
    assert verdicts["valid"] == verdicts["units"] == 3
    assert {v["unit_id"] for v in verdicts["verdicts"]} == {
        f"multi-turn-base-{i}" for i in range(3)
    }
    # But a batch that is not BFCL's is judged a failure, unit by unit, exit 1
    other = batch_id(
        ok(submit(here, "--generate", "1", "--tenant", tenant, "--watch", timeout=WATCH_S))
    )
    done = swarm(here, "judge", other, "--tenant", tenant)
    assert done.returncode == 1, done
    assert "not a BFCL multi_turn_base entry's unit" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("0/1 final states"), done.stdout


def test_status_and_resume_of_a_batch_that_does_not_exist_are_one_line_errors(
    here: Path,
) -> None:
    tenant = "cli-unknown"
    missing = "b-000000000000000000000000"

    # Then each is refused with exit status 2 and a one-line message, no traceback
    for args in (
        ["status", missing],
        ["status", missing, "--watch"],
        ["status", missing, "--json"],
    ):
        line = error_line(swarm(here, *args, "--tenant", tenant))
        assert line.startswith("swarm: error: 404 not_found: ") and repr(missing) in line, line
    line = error_line(swarm(here, "resume", missing, "--top-up", "1000", "--tenant", tenant))
    assert "404 not_found" in line and missing in line

    # Ids that are not URL-safe are still one batch id, not a broken URL or another route
    for weird in ("a b", "../../fleet", "x?y=1", "%"):
        line = error_line(swarm(here, "status", weird, "--tenant", tenant))
        assert "404 not_found" in line, (weird, line)

    # And another tenant's batch does not exist for this tenant
    lines = ok(submit(here, "--generate", "1", "--tenant", "cli-unknown-owner"))
    line = error_line(swarm(here, "status", batch_id(lines), "--tenant", tenant))
    assert "404 not_found" in line and batch_id(lines) in line


# ------------------------------------------------------------------ resume


def test_resume_tops_up_an_exhausted_batch_and_refuses_a_completed_one(here: Path) -> None:
    tenant = "cli-resume"
    # Given 10 units of 2,000 tokens and a budget that admits 4 of them
    units = write_units(here / "units.json", 10, lambda i: 2_000, "r")

    # When it is submitted and watched, it closes as exhausted (the watch ends there)
    watch = ["--tenant", tenant, "--watch"]
    lines = ok(submit(here, str(units), "--budget", "9000", *watch, timeout=WATCH_S))
    bid = batch_id(lines)
    healthy = HEALTHY.match(lines[-1])
    assert healthy and healthy.group(1) == "exhausted", lines
    assert re.search(r" \| remainder [1-9]\d*$", lines[-1]), lines[-1]

    # And `status` enumerates the remainder, like the JSON
    doc = as_json(swarm(here, "status", bid, "--tenant", tenant, "--json"))
    assert doc["state"] == "exhausted" and doc["tokens"]["spent"] <= 9_000
    remainder = doc["remainder"]
    assert len(remainder) == doc["counts"]["remainder"] > 0
    status = ok(swarm(here, "status", bid, "--tenant", tenant))
    assert status[1] == lines[-1]
    assert status[2] == f"remainder ({len(remainder)}): {', '.join(remainder)}"

    # When it is resumed with a top-up and watched
    resumed = ok(swarm(here, "resume", bid, "--top-up", "50000", *watch, timeout=WATCH_S))

    # Then exactly the remainder was requeued and the batch completes
    assert resumed[0] == (
        f"batch {bid}: topped up by 50,000 tokens, {len(remainder)} remainder units requeued"
    )
    assert any(" 10/10 done | " in line for line in resumed), resumed
    assert resumed[-1].startswith("run.completed: completed ") and HEALTHY.match(resumed[-1])
    final = as_json(swarm(here, "status", bid, "--tenant", tenant, "--json"))
    assert final["tokens"]["budget"] == 59_000
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 10

    # But a completed batch has nothing to resume: one line, exit status 2
    line = error_line(swarm(here, "resume", bid, "--top-up", "1000", "--tenant", tenant))
    assert line.startswith("swarm: error: 409 conflict: ") and bid in line, line
    assert "completed" in line, line


# ------------------------------------------------------------------ fleet


def test_fleet_shows_the_governor_the_lanes_and_the_drain_switch(here: Path) -> None:
    doc = as_json(swarm(here, "fleet", "--json", "--tenant", "cli-fleet"))
    assert set(doc) >= {"governor", "lanes", "in_flight", "queued", "draining"}
    assert set(doc["lanes"]) == {"high", "normal", "low"}
    for depth in doc["lanes"].values():
        assert {k: type(v) for k, v in depth.items()} == {
            "visible": int,
            "in_flight": int,
            "delayed": int,
        }
    governor = doc["governor"]
    assert 0 <= governor["available_tokens"] <= governor["capacity_tokens"]
    assert governor["governed_rate_tps"] > 0
    assert governor["output_burndown"] == 1.0  # the shipped model's: output counted once

    # each model's bucket (the shipped registry's two, by name)
    assert set(doc["models"]) == {"haiku", "sonnet"} and doc["models"]["haiku"]["default"]
    assert doc["models"]["sonnet"]["governor"]["output_burndown"] == 5.0  # Claude Sonnet 4
    lines = ok(swarm(here, "fleet", "--tenant", "cli-fleet"))
    for line, label in zip(lines[:2], ["model haiku \\(default\\)", "model sonnet"], strict=True):
        assert re.match(
            rf"^{label}: [\d,]+ of [\d,]+ tokens available, rate [\d,]+/[\d,]+ tokens/s, "
            r"\d+ throttles, output burndown x[\d.]+$",
            line,
        ), line
    # Sonnet's request bucket (the shipped rpm) under its line; Haiku has none
    assert doc["models"]["haiku"]["governor"]["requests"] is None
    assert re.match(
        r"^  requests: [\d,]+ of [\d,]+ available, rate [\d.,]+/[\d.,]+ requests/s$", lines[2]
    ), lines[2]
    assert [line.split()[0] for line in lines[3:6]] == ["high", "normal", "low"]
    for line in lines[3:6]:
        assert re.match(r"^  \w+ +visible +\d+  not visible +\d+  delayed +\d+$", line), line
    assert re.match(r"^draining: (on|off) \| not visible \d+ \| queued \d+$", lines[6]), lines[6]
    assert len(lines) == 7


def test_an_operator_rebinds_a_tenant_and_the_tenants_next_call_binds_it_again(
    here: Path,
) -> None:
    tenant = "cli-rebind"
    # the tenant's first call binds its role (a 404 here: it has no such batch)
    assert "no batch" in error_line(swarm(here, "status", "b-none", "--tenant", tenant))
    assert ok(swarm(here, "rebind", tenant)) == [
        f"tenant {tenant}: its binding forgotten; its role binds at its next call"
    ]
    assert ok(swarm(here, "rebind", tenant)) == [
        f"tenant {tenant}: it had no binding; its role binds at its next call"
    ]


# ------------------------------------------------------------------ drain


@pytest.mark.exclusive  # the drain switch stops the whole stack's intake and workers
def test_drain_on_waits_for_running_work_refuses_intake_and_drain_off_resumes(
    stack: Stack, here: Path
) -> None:
    tenant = "cli-drain"
    client = stack.client(tenant)
    # 40 units of 100k tokens: 4M tokens, more than the governor's bucket holds (one minute of
    # the quota, 3M tokens here), so the units past it wait for their places in their lane:
    # queued, by construction. And the batch's model calls are held (armed before it is
    # submitted, for its id), so the units that start stay running until the test lets go
    units = write_units(here / "units.json", 40, lambda i: 100_000, "d")
    other = write_units(here / "late.json", 5, lambda i: 1_000, "late")
    key = "cli-drain-1"
    bid = known_batch_id(tenant, key)
    stack.local("POST", "/_local/faults", {"batch_id": bid, "hold": True})
    waiting: subprocess.Popen[str] | None = None
    try:
        lines = ok(submit(here, str(units), "--idempotency-key", key, "--tenant", tenant))
        assert batch_id(lines) == bid
        eventually(lambda: stack.model(bid)["held_calls"] >= 1, "a unit is running (held)")

        # When the operator drains and waits while units run
        wait = ["--wait", "--interval", "0.5", "--timeout", "240", "--tenant", tenant]
        waiting = swarm_in_background(here, "drain", "on", *wait)
        # Then the wait holds while they run: the switch settles, and the drain view counts
        # the held units as running (never the lanes' messages), so it is not safe yet
        doc = eventually(
            lambda: (d := client.drain_status())["draining"] and d["settled"] and d,
            "the switch is on and settled",
        )
        assert doc["running"] >= 1 and not doc["safe_to_deploy"], doc
        counts = client.status(bid)["counts"]
        assert counts["running"] >= 1 and counts["completed"] == 0, counts
        assert waiting.poll() is None, "drain on --wait returned while units were running"
        # When the running units are let go
        stack.local("POST", "/_local/faults", {"batch_id": bid, "release": True})
        out, err = waiting.communicate(timeout=WATCH_S)
        assert waiting.returncode == 0 and "Traceback" not in err, (out, err)
        drained = out.strip().splitlines()

        # Then it named the switch, and returned once nothing ran: safe to deploy
        assert drained[0] == f"drain on: {stack.target.drain_parameter}"
        assert re.fullmatch(
            r"running: 0; \d+ queued messages stay queued \(they run after `swarm drain off`\)\. "
            r"Safe to deploy\.",
            drained[-1],
        ), drained[-1]
        assert all(re.match(r"^waiting: \d+ running, \d+ queued$", x) for x in drained[1:-1])
        # and queued units stay queued: none completes for 3 s (30 s on the deployed clock, ten
        # times the requeue delay of a unit a worker handed back while draining)
        held = client.status(bid)["counts"]
        assert held["completed"] + held["dead_lettered"] < 40, held
        assert held["running"] == 0 and held["queued"] + held["pending"] > 0, held
        time.sleep(3)
        assert client.status(bid)["counts"]["completed"] == held["completed"]

        # And `drain status` says so, as text and as JSON
        status_re = re.compile(r"^drain on: 0 running, \d+ queued; safe to deploy$")
        assert status_re.match(ok(swarm(here, "drain", "status", "--tenant", tenant))[0])
        doc = as_json(swarm(here, "drain", "status", "--json", "--tenant", tenant))
        assert doc["draining"] is True and doc["running"] == 0 and doc["safe_to_deploy"], doc
        eventually(
            lambda: ok(swarm(here, "fleet", "--tenant", tenant))[-1].startswith("draining: on"),
            "fleet shows draining: on",
        )

        # And a submission is refused: exit status 2, draining, with the retry hint
        line = error_line(submit(here, str(other), "--tenant", tenant))
        assert re.fullmatch(r"swarm: error: 503 draining: .*draining.* \(retry after \d+s\)", line)

        # When the operator deploys meanwhile (the local stack: synthesize this checkout and
        # update the stack in place; the switch is already on, so the wait returns at once)
        deploy = ["deploy", "--local", "--interval", "0.5", "--timeout", "240", "--tenant", tenant]
        lines = ok(swarm(here, *deploy, timeout=WATCH_S))
        # Then the stack was updated in place and the deploy switched the drain off again
        assert any("local stack redeployed" in x and "in place" in x for x in lines), lines
        assert lines[-1].endswith("drain off, work resumes."), lines
        # and `drain off` on a switch already off says the same
        assert ok(swarm(here, "drain", "off", "--tenant", tenant)) == [
            f"drain off: {stack.target.drain_parameter}"
        ]
        eventually(
            lambda: ok(swarm(here, "drain", "status", "--tenant", tenant))[0].startswith(
                "drain off: "
            ),
            "drain status says off",
        )
    finally:
        stack.local("POST", "/_local/faults", {"batch_id": bid, "release": True})
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
        client.set_drain(False)
        eventually(lambda: not client.drain_status()["draining"], "the drain is off")

    # Then the held batch finishes across the redeploy: nothing lost, nothing settled twice
    watched = ok(swarm(here, "status", bid, "--tenant", tenant, "--watch", timeout=WATCH_S))
    assert " 40/40 done | " in watched[-2] and watched[-1].startswith("run.completed: ")
    # with exact books: every unit's attempts and tokens as the seeded model decides them
    batch = json.loads(units.read_text())
    assert_books(expected_books(stack.model(), batch), stack.results(bid, "completed"))
    batch = json.loads(units.read_text())
    assert_books(expected_books(stack.model(), batch), stack.results(bid, "completed"))
    # and intake is open again
    late = ok(submit(here, str(other), "--tenant", tenant, "--watch", timeout=WATCH_S))
    assert " 5/5 done | " in late[-2] and late[-1].startswith("run.completed: ")


# ------------------------------------------------------------------ error paths


def test_unusable_units_files_are_one_line_errors(here: Path) -> None:
    tenant = "cli-bad-files"
    (here / "text.json").write_text("units: not JSON {\n")
    (here / "binary.json").write_bytes(b"\xff\xfe\x00\x81 not text")
    (here / "scalar.json").write_text('"a string"')
    bad = [
        {"unit_id": "ok-1", "projected_tokens": 1_000, "input": "x"},
        {"unit_id": "ok-2", "projected_tokens": 2_000, "input": "x"},
        {"unit_id": "neg-3", "projected_tokens": -5, "input": "x"},
    ]
    (here / "negative.json").write_text(json.dumps(bad))

    def refused(name: str) -> str:
        return error_line(submit(here, name, "--tenant", tenant))

    assert refused("nope.json") == (
        "swarm: error: FILE: cannot read nope.json: No such file or directory"
    )
    assert refused("text.json").startswith("swarm: error: FILE: text.json is not JSON (")
    assert refused("binary.json").startswith("swarm: error: FILE: binary.json is not JSON")
    assert "give a JSON array of units or a batch object" in refused("scalar.json")
    # the API's 400, naming the field, reaches the user
    line = refused("negative.json")
    assert line.startswith("swarm: error: 400 invalid_request: units[2].projected_tokens: "), line
    assert "greater than or equal to 1" in line, line
    # none of a file, --generate and --bfcl, or two of them
    assert "give one of: a FILE of units, --generate N, --bfcl CATEGORY" in error_line(
        swarm(here, "submit", "--tenant", tenant)
    )
    assert "give one of: a FILE of units, --generate N, --bfcl CATEGORY" in error_line(
        swarm(here, "submit", "negative.json", "--generate", "2", "--tenant", tenant)
    )
    # --agent makes generated units agent units: alone it says so
    assert "--agent: makes --generate's units agent units" in error_line(
        swarm(here, "submit", "negative.json", "--agent", "--tenant", tenant)
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["submit", "--generate", "0"], "argument --generate: 0 is out of range"),
        (["submit", "--generate", "many"], "argument --generate: 'many' is not a whole number"),
        (["submit", "--generate", "2", "--lane", "urgent"], "argument --lane: invalid choice"),
        (["submit", "--generate", "2", "--budget", "-5"], "argument --budget: -5 is out of range"),
        (["submit", "--generate", "2", "--agent", "--turns", "0"], "argument --turns: '0'"),
        (["submit", "--bfcl", "multi_turn_zero"], "argument --bfcl: invalid choice"),
        (["status"], "the following arguments are required: BATCH"),
        (["resume", "b-1"], "one of the arguments --top-up --top-up-usd is required"),
        (["resume", "b-1", "--top-up", "5", "--top-up-usd", "1"], "not allowed with argument"),
        (["resume", "b-1", "--top-up-usd", "0.1234567"], "more than 6 decimal places"),
        (["resume", "b-1", "--top-up", "0"], "argument --top-up: 0 is out of range"),
        (["resume", "b-1", "--top-up", "lots"], "argument --top-up: 'lots' is not a whole number"),
        (["drain", "sideways"], "argument action: invalid choice: 'sideways'"),
        (["drain", "status", "--interval", "-1"], "argument --interval: -1 is out of range"),
        (["drain", "status", "--interval", "nan"], "argument --interval: nan is out of range"),
        (["drain", "status", "--timeout", "0"], "argument --timeout: 0 is out of range"),
    ],
)
def test_bad_option_values_are_usage_errors(tmp_path: Path, args: list[str], says: str) -> None:
    # refused by argparse before any target is looked up (there is none in tmp_path)
    line = usage_error(swarm(tmp_path, *args, "--tenant", "cli-bad-options"), f"swarm {args[0]}")
    assert says in line, line


def test_an_unknown_option_is_a_usage_error(tmp_path: Path) -> None:
    # argparse reports leftovers with the top-level usage
    line = usage_error(swarm(tmp_path, "fleet", "--verbose"), "swarm")
    assert line == "swarm: error: unrecognized arguments: --verbose"


def test_without_a_local_stack_every_command_says_to_run_swarm_local_up(tmp_path: Path) -> None:
    # a directory with no .swarm/local.json (the stack's target is elsewhere)
    for args in (
        ["submit", "--generate", "1"],
        ["status", "b-1"],
        ["results", "b-1"],
        ["resume", "b-1", "--top-up", "10"],
        ["fleet"],
        ["drain", "status"],
        ["drain", "on"],
    ):
        line = error_line(swarm(tmp_path, *args))
        assert "no control plane to talk to: run `swarm local up`" in line, (args, line)


@pytest.fixture
def unreachable(tmp_path: Path) -> Iterator[Path]:
    """A directory whose `.swarm/local.json` names a stack that is gone: one port refuses
    connections (bound, never listening), the other accepts and hangs up without answering."""
    refusing = socket.socket()
    refusing.bind(("127.0.0.1", 0))

    class HangUp(BaseHTTPRequestHandler):
        def handle(self) -> None:  # read nothing, answer nothing
            self.connection.close()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    hanging = ThreadingHTTPServer(("127.0.0.1", 0), HangUp)
    threading.Thread(target=hanging.serve_forever, daemon=True).start()
    target = Target(
        api_url=f"http://127.0.0.1:{refusing.getsockname()[1]}",
        region="us-east-1",
        drain_parameter="/swarm/local/drain",
        aws_endpoint=f"http://127.0.0.1:{hanging.server_address[1]}",
        local_credentials={"aws_access_key_id": "gone", "aws_secret_access_key": "gone"},
    )
    target.save(tmp_path / ".swarm" / "local.json")
    try:
        yield tmp_path
    finally:
        hanging.shutdown()
        hanging.server_close()
        refusing.close()


def test_a_stack_that_is_gone_is_a_one_line_error(unreachable: Path) -> None:
    target = Target.load(unreachable / ".swarm" / "local.json")
    # locally the CLI first assumes the tenant's role in the emulator, which hangs up here
    emulator = f"cannot reach the local stack at {target.aws_endpoint}: "
    for args in (["fleet"], ["status", "b-1"], ["drain", "status"]):
        line = error_line(swarm(unreachable, *args))
        assert line.startswith(f"swarm: error: {emulator}"), line
    line = error_line(swarm(unreachable, "drain", "on"))
    assert line.startswith(
        f"swarm: error: cannot set the drain switch /swarm/local/drain: {emulator}"
    )

    # and an API that hangs up mid-request, or answers with something that is not JSON
    class NotJson(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>not the swarm API</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    html = ThreadingHTTPServer(("127.0.0.1", 0), NotJson)
    threading.Thread(target=html.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{html.server_address[1]}"
        line = error_line(swarm(unreachable, "fleet", "--api-url", url))
        assert line == f"swarm: error: {url}/fleet did not answer with JSON: is it the swarm API?"
    finally:
        html.shutdown()
        html.server_close()
    hang_up = target.aws_endpoint
    assert hang_up is not None
    line = error_line(swarm(unreachable, "fleet", "--api-url", hang_up))
    assert line.startswith(f"swarm: error: no answer from {hang_up}/fleet: "), line
