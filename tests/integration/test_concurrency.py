"""Concurrency proofs on an embedded, patched moto server: many workers in several processes.

Each test runs real workers (threads in >= 2 spawned processes, each with its own boto3
client) against one moto server over HTTP, as a Lambda fleet uses DynamoDB, then checks the
invariants from the books alone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time
from typing import Any

import pytest

from swarm.adapters.dynamodb_governor import DynamoDBGovernor
from swarm.adapters.dynamodb_ledger import DynamoDBLedger
from swarm.bench import governor as bench
from swarm.core.errors import Conflict
from swarm.core.governor import GovernorConfig
from swarm.core.ledger import Fate
from swarm.core.model import Lane, RunSpec, RunState, UnitSpec, UnitState
from swarm.local import motopatch
from tests.integration.conftest import server_client

pytestmark = pytest.mark.slow

RUN = "race-run"
UNITS = 240
TOKENS = 100
BUDGET = 150 * TOKENS  # room for 150 attempts: the run must exhaust


# ------------------------------------------------------------------ governor


@pytest.mark.parametrize(
    ("shards", "horizon_s", "min_utilization"),
    # without tickets every waiter wakes at once and collides (many failed conditional writes,
    # moto saturates): safe, but slow. That is the contention the ticket design removes.
    [(1, 10.0, 0.5), (2, 0.0, 0.2)],
    ids=["one-item-tickets", "two-shards-deny-and-retry"],
)
def test_64_workers_in_2_processes_never_exceed_capacity_plus_refill(
    moto_server: motopatch.EmbeddedServer, shards: int, horizon_s: float, min_utilization: float
) -> None:
    # Given 64 workers in 2 processes wanting far more than the governed rate
    cfg = bench.BenchConfig(
        workers=64,
        processes=2,
        seconds=4.0,
        shards=shards,
        grants_per_s=40.0,
        work_s=0.05,
        horizon_s=horizon_s,
        max_wait_s=3.0,
    )
    # When they draw for 4 seconds
    result = bench.run(cfg, endpoint=moto_server.endpoint)
    # Then no window ever got more than capacity + refill, and the rate was used
    assert result["over_granted"] <= 1e-6, result
    assert result["tokens_granted"] <= result["tokens_allowed"] + cfg.capacity
    assert result["utilization"] >= min_utilization, result


# ------------------------------------------------------------------ ledger


def _ledger_worker(endpoint: str, table: str, threads: int, seed: int, out: Any) -> None:
    """Workers that take deliveries of every unit (each unit is delivered to two workers in
    different processes) and sometimes 'die' between settle and delete (redelivery settles
    again)."""
    client = server_client(endpoint, threads + 2)
    ledger = DynamoDBLedger(table, client=client)
    results: list[tuple[int, int]] = []  # (first settlements, duplicates) per thread
    lock = threading.Lock()

    def work(i: int) -> None:
        rng = random.Random(seed * 1_000 + i)
        firsts = dups = 0
        deliveries = [f"u{n}" for n in range(UNITS) if n % threads == i]
        rng.shuffle(deliveries)
        while deliveries:
            uid = deliveries.pop()
            try:
                unit = ledger.unit(RUN, uid)
                attempt = unit.reservation.attempt if unit.reservation else unit.attempts
                if not ledger.admit(RUN, uid, attempt, time.time()).admitted:
                    continue
                if not ledger.claim(RUN, uid, attempt, time.time(), 60.0).claimed:
                    continue  # the other delivery holds it
                ok = rng.random() < 0.7
                first = ledger.settle(RUN, uid, attempt, TOKENS, ok, time.time())
                assert not first.duplicate
                firsts += 1
                if rng.random() < 0.3:  # died before deleting the message: redelivered
                    again = ledger.settle(RUN, uid, attempt, TOKENS * 7, True, time.time())
                    assert again.duplicate and again.fate is first.fate
                    dups += 1
                if first.fate is Fate.RETRY:
                    deliveries.append(uid)  # the queue redelivers after the visibility timeout
            except Conflict:
                continue  # the other delivery moved the unit on meanwhile
        with lock:
            results.append((firsts, dups))

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(results)


def _open_race_run(endpoint: str, table: str) -> DynamoDBLedger:
    ledger = DynamoDBLedger(table, client=server_client(endpoint))
    spec = RunSpec(
        run_id=RUN,
        tenant="t",
        lane=Lane.NORMAL,
        budget=BUDGET,
        units=tuple(UnitSpec(f"u{n}", TOKENS) for n in range(UNITS)),
        max_attempts=2,
    )
    ledger.open_run(spec, now=time.time())
    return ledger


def test_64_workers_in_2_processes_never_admit_beyond_budget_and_settle_once(
    moto_server: motopatch.EmbeddedServer, server_table: str
) -> None:
    # Given a run whose budget covers 150 of its 240+ attempts
    ledger = _open_race_run(moto_server.endpoint, server_table)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    # When 2 processes x 32 workers each receive every unit (so each unit twice)
    procs = [
        ctx.Process(target=_ledger_worker, args=(moto_server.endpoint, server_table, 32, s, out))
        for s in range(2)
    ]
    for p in procs:
        p.start()
    per_thread = [r for _ in procs for r in out.get(timeout=150)]
    for p in procs:
        p.join(timeout=30)
    # Then the books are exact
    run = ledger.run(RUN)
    units = ledger.units(RUN)
    attempts = ledger.attempts(RUN)
    firsts = sum(f for f, _ in per_thread)
    assert run.attempts == len(attempts) == firsts  # every settlement counted exactly once
    assert sum(d for _, d in per_thread) > 0  # and duplicates did happen
    assert run.spent == sum(a.tokens for a in attempts) == sum(u.spent for u in units)
    assert run.spent == TOKENS * len(attempts)  # no duplicate's tokens leaked in
    assert run.spent + run.reserved <= run.budget  # never admitted beyond the budget
    assert run.reserved == TOKENS * sum(1 for u in units if u.state is UnitState.IN_FLIGHT)
    # and the run ran out of budget: it drained and closed with the remainder enumerated
    assert run.state is RunState.EXHAUSTED
    states = [u.state for u in units]
    assert states.count(UnitState.REMAINDER) == run.remainder > 0
    assert states.count(UnitState.COMPLETED) + states.count(UnitState.DEAD_LETTERED) + (
        run.remainder
    ) == len(units)


def _settle_then_die(endpoint: str, table: str, uid: str, attempt: int) -> None:
    ledger = DynamoDBLedger(table, client=server_client(endpoint))
    ledger.settle(RUN, uid, attempt, 90, True, time.time())
    os._exit(9)  # killed before deleting its SQS message


def _claim_then_die(endpoint: str, table: str, uid: str, attempt: int) -> None:
    ledger = DynamoDBLedger(table, client=server_client(endpoint))
    ledger.claim(RUN, uid, attempt, time.time(), 1.0)
    os._exit(9)  # killed mid-unit, holding the claim


def test_workers_killed_between_settle_and_delete_leave_the_books_exact(
    moto_server: motopatch.EmbeddedServer, server_table: str
) -> None:
    ledger = _open_race_run(moto_server.endpoint, server_table)
    ctx = mp.get_context("spawn")
    for uid in ("u1", "u2"):
        ledger.admit(RUN, uid, 0, time.time())
    ledger.claim(RUN, "u1", 0, time.time(), 60.0)
    # Given one worker killed after settling u1, and one killed while holding u2's claim
    killed = [
        ctx.Process(target=_settle_then_die, args=(moto_server.endpoint, server_table, "u1", 0)),
        ctx.Process(target=_claim_then_die, args=(moto_server.endpoint, server_table, "u2", 0)),
    ]
    for p in killed:
        p.start()
    for p in killed:
        p.join(timeout=60)
        assert p.exitcode == 9
    # When the messages are redelivered and the lease sweeper runs
    redelivered = ledger.settle(RUN, "u1", 0, 90, True, time.time())
    lost = ledger.reclaim_expired(RUN, time.time() + 2.0)
    late = ledger.settle(RUN, "u2", 0, 55, True, time.time())  # the dead worker's twin
    # Then each attempt counted once: u1 with its real tokens, u2 with its projected ones
    assert redelivered.duplicate and redelivered.fate is Fate.COMPLETED
    assert [s.unit.unit_id for s in lost] == ["u2"] and lost[0].attempt.tokens == TOKENS
    assert late.duplicate
    run = ledger.run(RUN)
    assert (run.spent, run.reserved, run.attempts, run.in_flight) == (90 + TOKENS, 0, 2, 0)


# ------------------------------------------------------------------ the patch matters


def _race_draws(patched: bool, dynamodb: Any, threads: int = 8) -> int:
    """Threads draw the whole of a full bucket at once; returns how many were granted.

    moto's update is slowed between its condition check and its write (50 ms), so unpatched
    threads deterministically check the same old item; the patch's lock makes them take turns.
    """
    from moto.dynamodb.parsing import executors

    config = GovernorConfig(quota_tpm=60, share=1.0, capacity=1_000.0, initial_fill=1.0)
    name = f"race-{patched}"
    DynamoDBGovernor(config, "swarm-test", client=dynamodb, name=name).create(0.0)
    barrier = threading.Barrier(threads)
    granted = []
    original = executors.UpdateExpressionExecutor.execute

    def slow_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return original(self, *args, **kwargs)

    def draw() -> None:
        gov = DynamoDBGovernor(config, "swarm-test", client=dynamodb, name=name)
        gov.snapshot(0.0)  # load the shard before the race
        barrier.wait()
        if gov.draw(1_000, Lane.HIGH, now=0.0).granted:
            granted.append(1)

    executors.UpdateExpressionExecutor.execute = slow_execute  # type: ignore[method-assign]
    try:
        pool = [threading.Thread(target=draw) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        executors.UpdateExpressionExecutor.execute = original  # type: ignore[method-assign]
    return len(granted)


def test_the_patch_is_what_makes_moto_atomic(dynamodb: Any) -> None:
    # Given a bucket holding exactly one draw and 8 threads racing for it
    # When moto runs unpatched, Then it grants the same tokens several times
    with motopatch.dynamodb_unpatched():
        assert _race_draws(False, dynamodb) > 1
    # When patched, Then exactly one draw is granted, as real DynamoDB would
    assert motopatch.dynamodb_patched()
    assert _race_draws(True, dynamodb) == 1
