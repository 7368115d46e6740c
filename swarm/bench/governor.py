"""`swarm bench governor`: many workers in several processes drawing from one DynamoDB governor.

The workers run against an embedded, patched moto server (see
:mod:`swarm.local.patches.dynamodb`) and
draw unit-sized amounts with demand far above the governed rate, exactly as Lambda workers do:
``acquire()`` (draw, sleep the returned wait, draw again), then "call the model" (sleep).

What it measures is the *algorithm's* efficiency, not moto's speed: moto serves ~150-300
conditional writes/s, so the governed rate is chosen well below that (a unit-sized grant
rate of ``--grants-per-s``); real DynamoDB serves ~1,000 writes/s per item (see docs/governor.md
for the arithmetic). Reported:

* tokens granted, and tokens *over-granted*, judged from outside the governor: every worker
  notes on its own clock (``time.time()``) when it called ``acquire()`` and when it returned
  granted (the instant it would call the model), and the tokens. For every window [t1, t2], the
  grants asked for and seen inside it may not exceed what the bucket could hold at t1 (at most
  its capacity) plus ``rate x (t2 - t1)`` (:func:`over_granted`). ``over_granted`` is the
  largest excess, in tokens; a correct governor stays within ``over_grant_tolerance`` (the
  clock's resolution, :func:`over_grant_tolerance`). The governor's own account of when the
  tokens were the worker's (a ticket's ready time) is not trusted: a governor that answers
  "granted" before the tokens exist would pass a check built on it. Also reported,
  ``burst_over_bucket_as_seen``: the same bound on the sighting times alone, i.e. how far the
  model calls, as made, burst above a bucket of this capacity when workers see matured grants
  late and together (scheduling, slow answers); it is not an over-grant and is not asserted.
* DynamoDB requests per grant and failed conditional writes per grant (every request of every
  worker, including each worker's first read of the shard items);
* utilization: tokens granted / (governed rate x duration), and ``demand_utilization``: tokens
  granted / what the bucket could have given to the demand the workers showed
  (:func:`could_have_granted`; a worker process that starts late does not count against it);
* p50 / p99 of the time a granted draw waited (queueing for the rate, by Little's law about
  ``workers x amount / rate`` when every worker always wants tokens).
"""

from __future__ import annotations

import bisect
import math
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from swarm.core.errors import InvalidInput

if TYPE_CHECKING:
    from swarm.adapters.dynamodb_governor import DynamoDBGovernor

# Builds one worker's governor: called as DynamoDBGovernor(config, table, client=, shards=,
# horizon_s=, rng=). A module-level class or function (the worker processes are spawned, so it
# is pickled by reference). Tests pass deliberately broken governors to prove the checks bite.
GovernorFactory = Callable[..., "DynamoDBGovernor"]

# The clock resolution the over-grant check allows for (see over_grant_tolerance).
CLOCK_RESOLUTION_S = 1e-6


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
    # (asked, seen, tokens), on the worker's own clock: when it called acquire(), when acquire()
    # returned granted (the instant it calls the model), and the tokens: what over-grant is
    # judged by
    grants: list[tuple[float, float, int]]
    waits: list[float]
    requests: int
    condition_failures: int
    refused: int
    # per grant, the governor's own account of when the tokens were the worker's (its
    # ``last_grant_at``, a ticket's ready time): never judged, kept to show what a check that
    # trusts the governor would conclude
    claimed: list[float]
    refusals: list[tuple[float, float]]  # (asked, gave up) of each acquire() that was refused


@dataclass(frozen=True)
class BenchRun:
    """What the workers reported, and the benchmark's window (epoch seconds)."""

    reports: list[WorkerReport]
    start_at: float
    end_at: float


def _client(endpoint: str, pool: int) -> Any:
    from swarm.local.clients import local_client

    return local_client("dynamodb", endpoint, pool=pool, read_timeout=30)


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
    factory: GovernorFactory | None = None,
) -> None:
    """One process of the fleet: ``threads`` workers, each with its own governor client."""
    import random

    from swarm.adapters.dynamodb_governor import DynamoDBGovernor
    from swarm.core.governor import acquire
    from swarm.core.records import Lane

    make = factory or DynamoDBGovernor
    client = _client(endpoint, threads + 2)
    config = governor_config(cfg)
    reports: list[WorkerReport] = []
    lock = threading.Lock()
    max_wait = cfg.max_wait_s if cfg.max_wait_s is not None else (cfg.horizon_s or 5.0)

    def work(i: int) -> None:
        gov = make(
            config,
            table,
            client=client,
            shards=cfg.shards,
            horizon_s=cfg.horizon_s,
            rng=random.Random(seed * 10_000 + i),
        )
        grants: list[tuple[float, float, int]] = []
        claimed: list[float] = []
        refusals: list[tuple[float, float]] = []
        waits: list[float] = []
        refused = 0
        # read the shard items before the start (the request the first draw would make): the
        # start is then not a herd of cold clients whose first bookings return late
        gov.snapshot(time.time())
        time.sleep(max(0.0, start_at - time.time()))
        while time.time() < end_at:
            asked = time.time()
            got = acquire(gov, cfg.amount, Lane.NORMAL, time.time, time.sleep, max_wait)
            # the worker's own clock, right after the grant: the instant it calls the model
            seen = time.time()
            if got.granted:
                grants.append((asked, seen, cfg.amount))
                said = gov.last_grant_at
                claimed.append(seen if said is None else said)
                waits.append(got.waited_s)
                time.sleep(cfg.work_s)
            else:
                refused += 1
                refusals.append((asked, seen))
                gov.cancel(seen)
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
                    claimed,
                    refusals,
                )
            )

    pool = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(reports)


def over_grant_tolerance(rate: float) -> float:
    """The slack, in tokens, the over-grant check allows a correct governor: 1 us of refill.

    Why no more: the workers and the governor are processes on one machine reading one clock
    (``time.time()``, CLOCK_REALTIME, shared by every process), so there is no skew between the
    ``now`` a governor decides with and the instant a worker notes its grant, and a correct grant
    is noted *after* the draw that made it returned, never before its tokens existed. What is left
    is resolution: ``time.time()`` is a double of epoch seconds, spaced 2**-22 s (0.24 us) today,
    and the governor keeps times in whole microseconds, rounding ``now`` down and ready times up
    (both towards under-granting). 1 us of refill is four float spacings; the checker's own
    float arithmetic (token sums ~1e6-1e8, relative error ~1e-16) is far below it.
    """
    return rate * CLOCK_RESOLUTION_S


def over_granted(
    grants: Sequence[tuple[float, float, int]],
    start: float,
    initial: float,
    capacity: float,
    rate: float,
    credit: Callable[[float], float] | None = None,
) -> float:
    """The largest excess of granted tokens over what a token bucket allows, over all windows.

    ``grants`` are (asked, seen, tokens), both times on the worker's clock, outside the governor:
    ``asked`` when the worker called ``acquire()``, ``seen`` right after it returned granted. A
    grant's tokens were drawn from the bucket at some instant in [asked, seen]: not before the
    worker asked, and not after it saw the answer (a ticket matures after it was booked, an
    immediate grant is decided during the call). The instant itself is the governor's business
    and is not trusted. So for every window [t1, t2], the grants asked at or after t1 and seen at
    or before t2 were drawn inside it, from what the bucket held at t1 plus its refill::

        granted in [t1, t2] <= min(capacity, initial + C(t1) - granted seen before t1)
                               + C(t2) - C(t1)

    where C(t) is the credit from ``start`` to t: ``rate x (t - start)``, or
    ``credit(t - start)`` when the rate varies (AIMD; non-decreasing, 0 at 0). Grants seen
    before t1 were drawn before t1 (hence the subtraction; from ``start`` this is the plain
    "never more than initial + credit"). A governor that answers "granted" before the tokens exist
    breaks it; a correct one cannot, however late its answers are seen, because lateness only
    moves ``seen`` later. (Judging windows of ``seen`` times alone would not be sound: workers
    that see matured grants late, e.g. a booking whose response arrived after its ticket matured,
    then see them together, and a burst of late sightings looks like an over-grant. Pass
    ``asked = seen`` to get that stricter, lateness-sensitive figure.)

    The worst window starts at an ``asked`` time (or ``start``) and ends at a ``seen`` time. For
    each start, from the latest back, the grants asked since are added to a segment tree over the
    ``seen`` times (a suffix add), which answers the best end as a suffix maximum: O(n log n).
    Returns max(0, the worst excess), in tokens.
    """

    def c(x: float) -> float:
        x = max(0.0, x)  # nothing is credited before the bucket exists
        return rate * x if credit is None else credit(x)

    if not grants:
        return 0.0
    # times relative to the start (rate x epoch seconds would lose the fractions of a token);
    # nothing is drawn before the bucket exists: earlier times count as the start
    rel = [(max(0.0, a - start), max(0.0, s - start), tokens) for a, s, tokens in grants]
    by_seen = sorted(rel, key=lambda g: g[1])
    ends = [seen for _, seen, _ in by_seen]
    seen_before = [0.0]  # seen_before[k]: tokens of the k grants seen first
    for _, _, tokens in by_seen:
        seen_before.append(seen_before[-1] + tokens)
    n = len(ends)
    tree = _MaxTree([-c(end) for end in ends])  # per end t2: tokens in the window - C(t2)
    by_asked = sorted(rel, key=lambda g: g[0], reverse=True)
    worst = 0.0
    k = 0
    for t1 in sorted({asked for asked, _, _ in rel} | {0.0}, reverse=True):
        while k < n and by_asked[k][0] >= t1:
            _, seen, tokens = by_asked[k]
            tree.add(bisect.bisect_left(ends, seen), n, tokens)  # every end at or after it
            k += 1
        first = bisect.bisect_left(ends, t1)  # windows end at or after they start
        best_end = max(tree.max(first, n), -c(t1))  # (or are empty, ending at t1)
        held = min(capacity, initial + c(t1) - seen_before[first])
        worst = max(worst, best_end + c(t1) - held)
    return worst


class _MaxTree:
    """Range add and range maximum over a fixed array (a lazy segment tree)."""

    def __init__(self, values: list[float]) -> None:
        self.n = len(values)
        size = 1
        while size < self.n:
            size *= 2
        self.size = size
        self.top = [-math.inf] * (2 * size)
        self.lazy = [0.0] * (2 * size)
        self.top[size : size + self.n] = values
        for i in range(size - 1, 0, -1):
            self.top[i] = max(self.top[2 * i], self.top[2 * i + 1])

    def add(self, lo: int, hi: int, value: float, node: int = 1, a: int = 0, b: int = -1) -> None:
        """Add ``value`` to positions [lo, hi)."""
        b = self.size if b < 0 else b
        if hi <= a or b <= lo:
            return
        if lo <= a and b <= hi:
            self.top[node] += value
            self.lazy[node] += value
            return
        mid = (a + b) // 2
        self.add(lo, hi, value, 2 * node, a, mid)
        self.add(lo, hi, value, 2 * node + 1, mid, b)
        self.top[node] = self.lazy[node] + max(self.top[2 * node], self.top[2 * node + 1])

    def max(self, lo: int, hi: int, node: int = 1, a: int = 0, b: int = -1) -> float:
        """The maximum over positions [lo, hi) (-inf when empty)."""
        b = self.size if b < 0 else b
        if hi <= a or b <= lo:
            return -math.inf
        if lo <= a and b <= hi:
            return self.top[node]
        mid = (a + b) // 2
        below = max(self.max(lo, hi, 2 * node, a, mid), self.max(lo, hi, 2 * node + 1, mid, b))
        return self.lazy[node] + below


def could_have_granted(
    demand: Sequence[tuple[float, float]],
    start: float,
    end: float,
    initial: float,
    capacity: float,
    rate: float,
) -> float:
    """The tokens a bucket could have given in [start, end] to the demand the workers showed.

    ``demand`` is the (asked, returned) span of every ``acquire()`` call, on the workers' clocks.
    While any worker waits in one, demand exceeds supply: the bucket could give all it held when
    the wait began and every token credited until it ends. While none waits it only fills, up to
    its capacity. (Fluid: it ignores that a grant is a whole draw, so it is an upper bound.)
    """
    spans = sorted((max(a, start), min(b, end)) for a, b in demand if a < end and b > start)
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    held, t, total = initial, start, 0.0
    for a, b in merged:
        held = min(capacity, held + rate * (a - t))
        total += held + rate * (b - a)
        held, t = 0.0, b
    return total


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def run(
    cfg: BenchConfig, endpoint: str | None = None, factory: GovernorFactory | None = None
) -> dict[str, Any]:
    """Run the benchmark; starts (and stops) an embedded patched moto server unless given one."""
    bench = run_workers(cfg, endpoint, factory)
    return summarize(cfg, bench.reports, bench.start_at, bench.end_at)


def run_workers(
    cfg: BenchConfig, endpoint: str | None = None, factory: GovernorFactory | None = None
) -> BenchRun:
    """Run the workers and return what they reported (``run`` summarizes it)."""
    from swarm.adapters.dynamodb import create_table
    from swarm.adapters.dynamodb_governor import DynamoDBGovernor
    from swarm.local import server as moto_server

    server = None
    if endpoint is None:
        server = moto_server.start_server()
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
                args=(endpoint, table, cfg, n, start_at, end_at, i, out, factory),
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
    return BenchRun(reports, start_at, end_at)


def summarize(
    cfg: BenchConfig, reports: list[WorkerReport], start_at: float, end_at: float
) -> dict[str, Any]:
    # every grant the workers saw is judged for over-grant, even one seen just after the end
    seen = [g for r in reports for g in r.grants]
    grants = [g for g in seen if g[1] <= end_at]
    waits = [w for r in reports for w in r.waits]
    granted = sum(tokens for _, _, tokens in grants)
    requests = sum(r.requests for r in reports)
    failures = sum(r.condition_failures for r in reports)
    n = max(1, len(seen))
    allowed = cfg.rate * (end_at - start_at)  # initial fill is 0
    demand = [(a, b) for r in reports for a, b, _ in r.grants] + [
        span for r in reports for span in r.refusals
    ]
    could = could_have_granted(demand, start_at, end_at, 0.0, cfg.capacity, cfg.rate)
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
        # tokens; judged from when the workers asked and saw their grants (see over_granted)
        "over_granted": over_granted(seen, start_at, 0.0, cfg.capacity, cfg.rate),
        "over_grant_tolerance": over_grant_tolerance(cfg.rate),
        # the same bound on the seen times alone: how far the model calls, as made, burst above
        # a bucket of this capacity (late sightings bunch; not an over-grant, see over_granted)
        "burst_over_bucket_as_seen": over_granted(
            [(s, s, tokens) for _, s, tokens in seen], start_at, 0.0, cfg.capacity, cfg.rate
        ),
        "requests": requests,
        "requests_per_grant": requests / n,
        "conditional_failures": failures,
        "conditional_failures_per_grant": failures / n,
        "refused_acquires": sum(r.refused for r in reports),
        "utilization": granted / allowed if allowed else 0.0,
        # granted / what the bucket could have given to the demand seen (see could_have_granted):
        # not lowered by workers that started late, only by the governor leaving tokens unused
        "demand_utilization": granted / could if could else 0.0,
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
        f"  tokens over-granted {r['over_granted']:,.3f} as the workers saw the grants "
        f"(clock tolerance {r['over_grant_tolerance']:,.3f})",
        f"  model calls' burst above the bucket {r['burst_over_bucket_as_seen']:,.0f} tokens "
        "(late sightings bunching)",
        f"  requests per grant  {r['requests_per_grant']:.3f} "
        f"({r['requests']:,} DynamoDB requests)",
        f"  failed conditional writes per grant {r['conditional_failures_per_grant']:.3f}",
        f"  utilization         {r['utilization']:.3f} (achieved / governed rate; "
        f"{r['demand_utilization']:.3f} of what the demand could have drawn)",
        f"  wait p50 / p99      {r['wait_p50_s']:.2f} s / {r['wait_p99_s']:.2f} s "
        f"(queue at full demand ~{r['expected_queue_wait_s']:.1f} s)",
        "  note: the rate is sized for moto (~150-300 conditional writes/s); the figures",
        "  measure the algorithm's efficiency, not DynamoDB's or moto's speed.",
    ]
    return "\n".join(lines)
