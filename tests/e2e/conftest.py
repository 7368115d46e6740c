"""A local stack for the tier; every test talks to it over HTTP.

`make test` starts three stacks in the background (``swarm local up --state-dir
.swarm/test-stack``, ``-exclusive`` and ``-lease``) while lint, types and the other tiers run,
then runs this tier against them with ``SWARM_E2E_STATE_DIR`` set: the tests attach to that
stack (and xdist workers share it). Without the variable (``pytest tests/e2e/test_x.py``) the
session starts a stack of its own and stops it.

The stack runs on the time scale of ``make run`` (quota x10; the model's latency and every timer,
visibility timeouts and leases included, / 10). Scenarios are scoped to their own tenant and
batch: the simulated model counts calls, tokens and throttles per batch, faults are armed for one
batch, and every unit's outcome is a function of ``(model seed, unit id, attempt)`` that the
tests compute in advance (:func:`expected_books`). Scenarios that change the whole stack (the
drain switch, a quota storm) are marked ``exclusive``: they run one at a time on a stack of
their own, beside the others; those that wait out a killed claim's lease (``lease_wait``) run
all at once on a third (scripts/test-suite).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from swarm.adapters.simulated_model import attempt_fails, billed_tokens
from swarm.cli.local import down, running_pid, up
from swarm.cli.ops import WATCH_TOLERATED_ERRORS
from swarm.client import LOCAL_TARGET_FILE, ApiError, Client, NoAnswer, Target
from swarm.local.clients import credentials_of, local_client
from swarm.local.deploy import LocalOptions
from swarm.service.batches import batch_id_for

TERMINAL = ("completed", "exhausted")
STATE_DIR_VAR = "SWARM_E2E_STATE_DIR"
#: the stack's options when a session starts its own (make test passes the same on the CLI)
OPTIONS = LocalOptions(time_scale=10.0, model_seed=7)


_TENANTS: set[str] = {"demo"}  # the tenant roles this process has made sure of


#: how long a scenario's request waits for the stack's answer: the stack is one process shared by
#: the concurrent scenarios, whose stalls (its log names them: swarm/local/watchdog.py) are not
#: the API's latency; a failure still fails, this much later
CLIENT_TIMEOUT_S = 120

#: how long a closure's results object may take: the run's closer wakes the finalize loop's poll
#: at once, and if nobody could (the poll's task was not waiting yet), the loop's next poll comes
#: within its longest wait (LocalOptions.finalizer_max_poll_s, 30 s); then its Close writes it
RESULTS_WAIT_S = 2 * OPTIONS.finalizer_max_poll_s


@dataclass
class Stack:
    target: Target
    state_dir: Path

    def client(self, tenant: str) -> Client:
        """A client signed as ``tenant``'s IAM role (created in the stack on first use)."""
        if tenant not in _TENANTS:
            self.local("POST", "/_local/tenants", {"tenant": tenant})
            _TENANTS.add(tenant)
        return Client(
            Target(**{**asdict(self.target), "tenant": tenant}), timeout_s=CLIENT_TIMEOUT_S
        )

    def aws(self, service: str) -> Any:
        """A client of the emulator as its own admin (the tests' view of the books)."""
        return local_client(
            service,
            self.target.aws_endpoint,
            credentials=credentials_of(self.target.local_credentials),
            region=self.target.region,
        )

    def local(self, method: str, path: str, body: Any = None) -> Any:
        """The emulator's own control surface (``/_local/...``), signed as the demo tenant."""
        return Client(self.target, timeout_s=CLIENT_TIMEOUT_S).request(method, path, body)[1]

    def pause_mapping(self, uuid: str, timeout_s: float = 30) -> None:
        """Disable an event source mapping and wait until its poller takes nothing more: it has
        seen the change, and a long poll it had in flight (which still delivers what it gets,
        as Lambda's pollers do) has returned."""
        self.aws("lambda").update_event_source_mapping(UUID=uuid, Enabled=False)
        deadline = time.monotonic() + timeout_s
        while True:
            [poller] = [
                p for p in self.local("GET", "/_local/status")["pollers"] if p["uuid"] == uuid
            ]
            if not poller["enabled"] and not poller["receiving"]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the poller of mapping {uuid} kept receiving: {poller}")
            time.sleep(0.1)

    def served(self, batch_id: str) -> dict[str, float]:
        """When the simulated model received each unit's last call (the host's clock, as
        ``time.time()``): the order in which the fleet served the batch's units, before their
        settlements (which a busy emulator may hold back and let go together)."""
        last: dict[str, float] = {}
        for call in self.model(batch_id)["log"]:
            unit_id, at = call["unit_id"], float(call["received_at"])
            last[unit_id] = max(at, last.get(unit_id, at))
        return last

    def receipts(self, batch_id: str) -> dict[str, list[float]]:
        """When the lanes' pollers received each unit's messages (the host's clock, as
        ``time.time()``; a unit sent back to its lane is received again): a unit received is in
        a worker's hands, past the queue's ordering."""
        doc = self.local("GET", f"/_local/receipts?batch={batch_id}")
        return {unit: [float(t) for t in times] for unit, times in doc["received"].items()}

    def lease_s(self) -> float:
        """The claims' lease on the local clock: the worker's ``LEASE_SECONDS`` (the lanes'
        visibility timeout, on the deployed clock) over the stack's time scale."""
        lam = self.aws("lambda")
        functions = [
            f for p in lam.get_paginator("list_functions").paginate() for f in p["Functions"]
        ]
        [worker] = [f for f in functions if "WorkerFunction" in f["FunctionName"]]
        deployed = float(worker["Environment"]["Variables"]["LEASE_SECONDS"])
        return deployed / float(self.local("GET", "/_local/status")["time_scale"])

    def model(self, batch_id: str | None = None) -> dict[str, Any]:
        """The simulated model's counters: the whole plane's, or one batch's with its call log."""
        path = "/_local/model" + (f"?batch={batch_id}" if batch_id else "")
        doc: dict[str, Any] = self.local("GET", path)
        return doc

    def results(
        self, batch_id: str, state: str, timeout_s: float = RESULTS_WAIT_S
    ) -> dict[str, Any]:
        """The finalizer's results object for the run's latest closure as ``state`` (written
        after the closure, reading every outcome: a big batch needs a longer ``timeout_s``).
        None after ``timeout_s``: fails, naming the run's executions and where each one is."""
        s3 = self.aws("s3")
        bucket = next(b["Name"] for b in s3.list_buckets()["Buckets"] if "batches" in b["Name"])
        prefix = f"results/{batch_id}/{state}-"
        # the finalize loop's Close writes it once the run's closer wakes its poll, or at the
        # loop's next poll (RESULTS_WAIT_S)
        deadline = time.monotonic() + timeout_s
        while True:
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
            summaries = [o["Key"] for o in listed if o["Key"].endswith(".json")]  # not .jsonl
            if summaries:
                key = max(summaries, key=lambda k: int(k[len(prefix) : -5]))
                doc: dict[str, Any] = json.loads(
                    s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                )
                return doc
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {prefix}*.json in the bucket after {timeout_s:g} s; the run's "
                    f"executions: {self.executions(batch_id)}"
                )
            time.sleep(0.5)

    def fanout_machine(self) -> str:
        """The fan-out state machine's ARN (every run's executions are its)."""
        machines = self.aws("stepfunctions").list_state_machines()["stateMachines"]
        return str(next(m["stateMachineArn"] for m in machines if "fanout" in m["name"]))

    def executions(self, batch_id: str) -> dict[str, str]:
        """The run's executions of the fan-out state machine (its continuations and restarts
        included): each one's status and its last few events, for a failure's message."""
        sfn = self.aws("stepfunctions")
        machine = self.fanout_machine()
        found: dict[str, str] = {}
        for e in sfn.list_executions(stateMachineArn=machine, maxResults=1000)["executions"]:
            if not e["name"].startswith(batch_id):
                continue
            events = sfn.get_execution_history(
                executionArn=e["executionArn"], maxResults=6, reverseOrder=True
            )["events"]
            last = ", ".join(
                f"{v['type']} {v.get('stateEnteredEventDetails', {}).get('name', '')}".strip()
                for v in reversed(events)
            )
            found[e["name"]] = f"{e['status']} (last: {last})"
        return found


def units(n: int, prefix: str = "u", tokens: Callable[[int], int] | None = None) -> list[Any]:
    """``n`` units; small by default (1,000-2,999 projected tokens, deterministic)."""
    size = tokens or (lambda i: 1_000 + (i * 787) % 2_000)
    return [
        {"unit_id": f"{prefix}-{i:05d}", "projected_tokens": size(i), "input": f"unit {i}"}
        for i in range(n)
    ]


def unit_failing(
    seed: int, rate: float, prefix: str, first_success: int | None, max_attempts: int = 3
) -> str:
    """The first unit id ``<prefix>-<n>`` whose attempts fail until ``first_success`` (None:
    every attempt fails, so the unit is dead-lettered) under the model's seed and rate."""
    last = max_attempts if first_success is None else first_success + 1
    for n in range(1_000_000):
        unit_id = f"{prefix}-{n}"
        fails = [attempt_fails(seed, unit_id, a, rate) for a in range(last)]
        wanted = [True] * max_attempts if first_success is None else [True] * first_success
        if fails[: len(wanted)] == wanted and (first_success is None or not fails[-1]):
            return unit_id
    raise AssertionError("no such unit id in a million")  # pragma: no cover


@dataclass(frozen=True)
class Books:
    """What a batch's books must hold, computed from the model's seed before it runs."""

    attempts: dict[str, int]  # unit -> attempts it takes
    completed: frozenset[str]
    dead: frozenset[str]
    tokens: dict[str, int]  # unit -> tokens billed over all its attempts

    @property
    def spent(self) -> int:
        return sum(self.tokens.values())

    @property
    def retries(self) -> int:
        return sum(self.attempts.values()) - len(self.attempts)


def expected_books(model: dict[str, Any], batch: list[Any], max_attempts: int = 3) -> Books:
    """Every unit's attempts, fate and billed tokens, from the simulated model's seed and rate
    (each attempt's tokens are capped by the unit's reservation, its projected tokens)."""
    seed, rate = int(model["seed"]), float(model["failure_rate"])
    attempts: dict[str, int] = {}
    tokens: dict[str, int] = {}
    completed, dead = set(), set()
    for u in batch:
        uid, projected = u["unit_id"], u["projected_tokens"]
        n = 0
        while True:
            tokens[uid] = tokens.get(uid, 0) + billed_tokens(seed, uid, n, projected, projected)
            n += 1
            if not attempt_fails(seed, uid, n - 1, rate):
                completed.add(uid)
                break
            if n == max_attempts:
                dead.add(uid)
                break
        attempts[uid] = n
    return Books(attempts, frozenset(completed), frozenset(dead), tokens)


def assert_books(books: Books, results: dict[str, Any]) -> None:
    """The finalizer's per-unit results are exactly the expected books (on a mismatch, the
    units that differ, each with its result: not a diff of every unit of a big batch)."""
    got = results["units"]
    for field, want in (("attempts", books.attempts), ("tokens", books.tokens)):
        have = {k: u[field] for k, u in got.items()}
        wrong = {k: (have.get(k), want.get(k)) for k in have.keys() | want.keys()}
        wrong = {k: v for k, v in wrong.items() if v[0] != v[1]}
        assert not wrong, f"{len(wrong)} units' {field} (got, expected): " + "; ".join(
            f"{k} {v} {got.get(k)}" for k, v in sorted(wrong.items())[:10]
        )
    assert {k for k, u in got.items() if u["state"] == "completed"} == books.completed
    assert {k for k, u in got.items() if u["state"] == "dead_lettered"} == books.dead
    assert results["spent"] == books.spent


def fresh_key(name: str) -> str:
    """An Idempotency-Key no earlier run of the scenario used: a scenario run again on the same
    stack (``SWARM_E2E_STATE_DIR``) gets a batch of its own, not the first run's."""
    return f"{name}-{uuid.uuid4().hex[:12]}"


def fresh_batch(stack: Stack, tenant_prefix: str, name: str) -> tuple[str, Client, str, str]:
    """A tenant of the scenario's own (``<tenant_prefix>-<random>``), its client, a fresh
    Idempotency-Key and the batch id a submission with it will get."""
    tenant = f"{tenant_prefix}-{fresh_key('t')[-8:]}"
    key = fresh_key(name)
    return tenant, stack.client(tenant), key, batch_id(tenant, key)


def batch_id(tenant: str, key: str) -> str:
    """The id a submission with this Idempotency-Key gets: known before submitting, so a
    fault can be armed for the batch first."""
    return batch_id_for(tenant, key)


#: What every wait allows beyond its scenario's own timeout: one lease (``Stack.lease_s``, set by
#: the ``stack`` fixture). Whatever a scenario does, one of its units may come back a lease late:
#: an SQS batch may carry another scenario's message whose worker is made to crash (the crash and
#: kill scenarios of test_10 and test_45), and a crashed invocation returns every message it held
#: after the visibility timeout, as on AWS. (Measured: the fairness scenario's last two units,
#: bundled beside the crash scenario's victim, came back 140 s later, past its 120 s wait.)
REDELIVERY = {"s": 0.0}


def wait_for(
    client: Client,
    batch_id: str,
    until: Callable[[dict[str, Any]], bool] = lambda d: d["state"] in TERMINAL,
    timeout_s: float = 300,
    interval_s: float = 0.5,
) -> dict[str, Any]:
    """Poll the batch's status until ``until`` holds; fail after ``timeout_s`` plus one lease
    (``REDELIVERY``). As ``swarm status --watch`` does, up to ``WATCH_TOLERATED_ERRORS`` checks in
    a row that get no answer are tried again (the local stack is one process: a stall of it
    delays an answer past the client's timeout; its log names the stall, ``slow request``)."""
    deadline = time.monotonic() + timeout_s + REDELIVERY["s"]
    unanswered = 0
    while True:
        try:
            doc: dict[str, Any] = client.status(batch_id)
        except NoAnswer:
            unanswered += 1
            if unanswered > WATCH_TOLERATED_ERRORS or time.monotonic() > deadline:
                raise
            continue
        unanswered = 0
        if until(doc):
            return doc
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} never reached the condition: {doc}")
        time.sleep(interval_s)


def submit_retrying(client: Client, body: dict[str, Any], attempts: int = 30) -> Any:
    """Submit, honouring 429/503 Retry-After (bounded)."""
    for _ in range(attempts):
        try:
            return client.submit(body)
        except ApiError as e:
            if e.status not in (429, 503):
                raise
            time.sleep(min(5, e.retry_after or 1))
    raise AssertionError("submission kept being refused")


def _attach(state_dir: Path) -> Target:
    """The stack `make test` started in the background (its ``swarm local up`` has returned)."""
    target_file = state_dir / LOCAL_TARGET_FILE.name
    if running_pid(state_dir) is None or not target_file.exists():
        log = state_dir / "local.log"
        tail = log.read_text()[-3000:] if log.exists() else "(no log)"
        raise AssertionError(f"{STATE_DIR_VAR}={state_dir}: no local stack is up there:\n{tail}")
    return Target.load(target_file)


@pytest.fixture
def here(stack: Stack, tmp_path: Path) -> Path:
    """A working directory where `swarm` finds the session's local stack (its
    ``.swarm/local.json``): the CLI scenarios run in it."""
    stack.target.save(tmp_path / ".swarm" / "local.json")
    return tmp_path


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # the drain switch is an SSM call: the local emulator takes any credentials
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    shared = os.environ.get(STATE_DIR_VAR)
    if shared:
        attached = Stack(_attach(Path(shared)), Path(shared))
        REDELIVERY["s"] = attached.lease_s()
        yield attached
        return
    state_dir: Path = tmp_path_factory.mktemp("swarm-local")
    target = up(OPTIONS, state_dir, quiet=True)
    try:
        started = Stack(target, state_dir)
        REDELIVERY["s"] = started.lease_s()
        yield started
    finally:
        down(state_dir, quiet=True)
