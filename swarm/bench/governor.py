"""`swarm bench governor`: many workers in several processes drawing from one DynamoDB governor.

The workers run against an embedded, patched moto server (see :mod:`swarm.local.motopatch`) and
draw unit-sized amounts with demand far above the governed rate, exactly as Lambda workers do:
``acquire()`` (draw, sleep the returned wait, draw again), then "call the model" (sleep).

What it measures is the *algorithm's* efficiency, not moto's speed: moto serves ~150-300
conditional writes/s, so the governed rate is chosen well below that (a unit-sized grant
rate of ``--grants-per-s``); real DynamoDB serves ~1,000 writes/s per item (see the governor's
docstring for the arithmetic). Reported:

* tokens granted, and tokens *over-granted*: the largest excess, over any time window, of the
  tokens granted in it above what a bucket can give (``capacity + rate x window``, and for
  windows that start at the bucket's creation ``initial + rate x window``), in whole tokens
  (grant times are the instants the tokens became the worker's). Must be 0.
* DynamoDB requests per grant and failed conditional writes per grant (every request of every
  worker, including each worker's first read of the shard items);
* utilization: tokens granted / (governed rate x duration);
* p50 / p99 of the time a granted draw waited (queueing for the rate, by Little's law about
  ``workers x amount / rate`` when every worker always wants tokens).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import threading
import time
from dataclasses import dataclass
from typing import Any

from swarm.core.errors import InvalidInput


@dataclass(frozen=True)
class BenchConfig:
    workers: int = 200
    seconds: float = 20.0
    shards: int = 1
    processes: int = 2
    amount: int = 10_000  # tokens per draw: one unit
    grants_per_s: float = 60.0  # the governed rate, in units per second (moto-sized)
    work_s: float = 0.2  # the model call after a grant (demand = workers / work_s units/s)
    horizon_s: float = 15.0  # how far ahead a worker may book (>= the queue at this demand)
    capacity_units: float = 2.0  # bucket capacity, in units per shard
    max_wait_s: float | None = None  # acquire's bound (default: the horizon, or 5 s without)

    def __post_init__(self) -> None:
        checks = [
            ("--workers", self.workers >= 1, "must be >= 1"),
            ("--seconds", 1 <= self.seconds <= 600, "must be in 1..600"),
            ("--shards", 1 <= self.shards <= 64, "must be in 1..64"),
            ("--processes", 1 <= self.processes <= 16, "must be in 1..16"),
            ("--grants-per-s", 0 < self.grants_per_s <= 500, "must be in (0, 500]"),
            ("--work-s", self.work_s >= 0, "must be >= 0"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise InvalidInput(name, why)
        if self.processes > self.workers:
            raise InvalidInput("--processes", "cannot exceed --workers")

    @property
    def rate(self) -> float:
        """The governed rate in tokens per second."""
        return self.grants_per_s * self.amount

    @property
    def capacity(self) -> float:
        return self.capacity_units * self.amount * self.shards


@dataclass(frozen=True)
class WorkerReport:
    grants: list[tuple[float, int]]  # (time granted, tokens)
    waits: list[float]
    requests: int
    condition_failures: int
    refused: int


def _client(endpoint: str, pool: int) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "dynamodb",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(
            max_pool_connections=pool,
            retries={"max_attempts": 3, "mode": "standard"},
            read_timeout=30,
        ),
    )


def governor_config(cfg: BenchConfig) -> Any:
    from swarm.core.governor import GovernorConfig

    quota_tpm = max(1, round(cfg.rate * 60))
    return GovernorConfig(quota_tpm=quota_tpm, share=1.0, capacity=cfg.capacity, initial_fill=0.0)


def _worker_process(
    endpoint: str,
    table: str,
    cfg: BenchConfig,
    threads: int,
    start_at: float,
    end_at: float,
    seed: int,
    out: Any,
) -> None:
    """One process of the fleet: ``threads`` workers, each with its own governor client."""
    import random

    from swarm.adapters.dynamodb_governor import DynamoDBGovernor
    from swarm.core.governor import acquire
    from swarm.core.model import Lane

    client = _client(endpoint, threads + 2)
    config = governor_config(cfg)
    reports: list[WorkerReport] = []
    lock = threading.Lock()
    max_wait = cfg.max_wait_s if cfg.max_wait_s is not None else (cfg.horizon_s or 5.0)

    def work(i: int) -> None:
        gov = DynamoDBGovernor(
            config,
            table,
            client=client,
            shards=cfg.shards,
            horizon_s=cfg.horizon_s,
            rng=random.Random(seed * 10_000 + i),
        )
        grants: list[tuple[float, int]] = []
        waits: list[float] = []
        refused = 0
        time.sleep(max(0.0, start_at - time.time()))
        while time.time() < end_at:
            got = acquire(gov, cfg.amount, Lane.NORMAL, time.time, time.sleep, max_wait)
            now = time.time()
            if got.granted:
                at = gov.last_grant_at if gov.last_grant_at is not None else now
                if at <= end_at:
                    grants.append((at, cfg.amount))
                    waits.append(got.waited_s)
                time.sleep(cfg.work_s)
            else:
                refused += 1
                gov.cancel(now)
        # tickets still booked at the end are left to mature unused (not refunded): the
        # benchmark's window is over, and refunds would add requests no grant needed
        with lock:
            reports.append(
                WorkerReport(
                    grants,
                    waits,
                    gov.stats.requests,
                    gov.stats.condition_failures,
                    refused,
                )
            )

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(reports)


def over_granted(
    grants: list[tuple[float, int]], start: float, initial: float, capacity: float, rate: float
) -> float:
    """The largest excess of granted tokens over what a token bucket allows, over all windows.

    For a window [s, e]: granted <= capacity + rate x (e - s); from the start:
    granted <= initial + rate x (e - start). O(n) with a running maximum.
    """
    # times relative to the start: rate x epoch seconds would lose the fractions of a token
    events = sorted((t - start, tokens) for t, tokens in grants)
    start = 0.0
    worst = 0.0
    best_start = -math.inf  # max over s of (rate x s - tokens granted before s)
    cumulative = 0.0
    for t, tokens in events:
        best_start = max(best_start, rate * t - cumulative)
        cumulative += tokens
        window = cumulative - rate * t + best_start - capacity
        from_start = cumulative - initial - rate * (t - start)
        worst = max(worst, window, from_start)
    return worst


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def run(cfg: BenchConfig, endpoint: str | None = None) -> dict[str, Any]:
    """Run the benchmark; starts (and stops) an embedded patched moto server unless given one."""
    from swarm.adapters import create_table
    from swarm.adapters.dynamodb_governor import DynamoDBGovernor
    from swarm.local import motopatch

    server = None
    if endpoint is None:
        server = motopatch.start_server()
        endpoint = server.endpoint
    try:
        table = f"bench-{int(time.time() * 1000)}"
        client = _client(endpoint, 4)
        create_table(client, table)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        per = [cfg.workers // cfg.processes] * cfg.processes
        for i in range(cfg.workers % cfg.processes):
            per[i] += 1
        spawn_margin = 3.0 + 0.5 * cfg.processes  # processes import boto3 before the start
        # a whole second: exactly representable, so the bucket's base time is exactly it
        start_at = float(math.ceil(time.time() + spawn_margin))
        end_at = start_at + cfg.seconds
        DynamoDBGovernor(governor_config(cfg), table, client=client, shards=cfg.shards).create(
            start_at
        )
        procs = [
            ctx.Process(
                target=_worker_process,
                args=(endpoint, table, cfg, n, start_at, end_at, i, out),
                daemon=True,
            )
            for i, n in enumerate(per)
        ]
        for p in procs:
            p.start()
        reports: list[WorkerReport] = []
        deadline = end_at + cfg.horizon_s + 60
        for _ in procs:
            reports.extend(out.get(timeout=max(1.0, deadline - time.time())))
        for p in procs:
            p.join(timeout=10)
    finally:
        if server is not None:
            server.stop()
    return summarize(cfg, reports, start_at, end_at)


def summarize(
    cfg: BenchConfig, reports: list[WorkerReport], start_at: float, end_at: float
) -> dict[str, Any]:
    grants = [g for r in reports for g in r.grants]
    waits = [w for r in reports for w in r.waits]
    granted = sum(tokens for _, tokens in grants)
    requests = sum(r.requests for r in reports)
    failures = sum(r.condition_failures for r in reports)
    n = max(1, len(grants))
    allowed = cfg.rate * (end_at - start_at)  # initial fill is 0
    return {
        "workers": cfg.workers,
        "processes": cfg.processes,
        "shards": cfg.shards,
        "seconds": cfg.seconds,
        "amount": cfg.amount,
        "governed_rate_tokens_per_s": cfg.rate,
        "capacity_tokens": cfg.capacity,
        "grants": len(grants),
        "tokens_granted": granted,
        "tokens_allowed": allowed,
        # whole tokens: grant times are floats of epoch seconds (~0.2 us resolution), so a
        # fraction of a token is measurement noise; a real over-grant is a whole draw
        "over_granted": math.floor(
            over_granted(grants, start_at, 0.0, cfg.capacity, cfg.rate) + 1e-9
        ),
        "requests": requests,
        "requests_per_grant": requests / n,
        "conditional_failures": failures,
        "conditional_failures_per_grant": failures / n,
        "refused_acquires": sum(r.refused for r in reports),
        "utilization": granted / allowed if allowed else 0.0,
        "wait_p50_s": _percentile(waits, 0.50),
        "wait_p99_s": _percentile(waits, 0.99),
        "expected_queue_wait_s": cfg.workers * cfg.amount / cfg.rate,
    }


def render(result: dict[str, Any]) -> str:
    r = result
    lines = [
        f"governor benchmark: {r['workers']} workers in {r['processes']} processes, "
        f"{r['shards']} shard(s), {r['seconds']:g} s, draws of {r['amount']:,} tokens",
        f"  governed rate       {r['governed_rate_tokens_per_s']:,.0f} tokens/s "
        f"(capacity {r['capacity_tokens']:,.0f})",
        f"  tokens granted      {r['tokens_granted']:,} in {r['grants']:,} grants "
        f"(allowed {r['tokens_allowed']:,.0f})",
        f"  tokens over-granted {r['over_granted']:,.0f}",
        f"  requests per grant  {r['requests_per_grant']:.3f} "
        f"({r['requests']:,} DynamoDB requests)",
        f"  failed conditional writes per grant {r['conditional_failures_per_grant']:.3f}",
        f"  utilization         {r['utilization']:.3f} (achieved / governed rate)",
        f"  wait p50 / p99      {r['wait_p50_s']:.2f} s / {r['wait_p99_s']:.2f} s "
        f"(queue at full demand ~{r['expected_queue_wait_s']:.1f} s)",
        "  note: the rate is sized for moto (~150-300 conditional writes/s); the figures",
        "  measure the algorithm's efficiency, not DynamoDB's or moto's speed.",
    ]
    return "\n".join(lines)
