"""`swarm bench governor`: a fleet of workers drawing from one DynamoDB governor, as issue 15
describes the scenario.

The workers (threads in several spawned processes, each with its own governor client, as Lambda
containers are) run against an embedded, patched moto server (:mod:`swarm.local.patches.dynamodb`)
and behave as the worker does (:mod:`swarm.service.worker`): each holds one unit at a time (a
draw uniform in ``--min-tokens``..``--max-tokens``) and calls ``acquire()`` for it, holding on for
at most ``--hold-s``; a granted unit "calls the model" for ``--work-s`` (0: zero model time) and
the worker takes the next unit at once; a refused unit goes back to its lane with the worker's
own requeue delay (whole seconds, as SQS takes them) and the ticket the governor booked for it,
and is tried again when the delay is over. With ``--used-min``/``--used-max`` the model counts a
fraction of each grant and the worker trues the governor up after the call. After the run the
fleet is idle for ``--idle-s``, then draws again for ``--after-idle-s``.

Reported (the run's window only; each client's first read of the shard items, made before the
start as a warm container's would be, is counted apart):

* DynamoDB requests and failed conditional writes per ``acquire()`` call (one unit's try for
  tokens, granted or refused after its bounded hold) and per grant;
* utilization: tokens the model used / what the bucket could have given to the demand the
  workers showed (:func:`could_have_granted`);
* tokens *over-granted*, judged from outside the governor over every window (:func:`over_granted`),
  across the run, the idle time and the draws after it, by the tokens the model really used;
  ``burst_over_bucket_as_seen`` applies the same bound to the instants the model was called;
* how many tries a unit needed after its first requeue, and how often a refused unit went back
  without a booking; the time workers held on for tokens per granted unit (Lambda-seconds).
"""

from __future__ import annotations

import bisect
import math
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swarm.core.errors import InvalidInput
from swarm.core.ports import MAX_SQS_DELAY_S

if TYPE_CHECKING:
    from swarm.adapters.dynamodb_governor import DynamoDBGovernor
    from swarm.core.governor import GovernorConfig

# Builds one worker's governor: called as DynamoDBGovernor(config, table, client=, shards=,
# horizon_s=, rng=). A module-level class or function (the worker processes are spawned, so it
# is pickled by reference). Tests pass deliberately broken governors to prove the checks bite.
GovernorFactory = Callable[..., "DynamoDBGovernor"]

# The clock resolution the over-grant check allows for (see over_grant_tolerance).
CLOCK_RESOLUTION_S = 1e-6

#: the worker's defaults (swarm.service.worker.WorkerTimings, swarm.wiring): how long it holds
#: on for tokens, and how far ahead its governor books
HOLD_S = 1.0
HORIZON_S = float(MAX_SQS_DELAY_S)

#: how long a spawned worker process may take to import and build its client
SPAWN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class BenchConfig:
    """The scenario (defaults: issue 15's): every parameter is settable from the CLI."""

    workers: int = 20
    processes: int = 4
    seconds: float = 25.0
    quota_tpm: int = 300_000
    share: float = 0.95
    capacity: float = 300_000.0  # tokens
    initial_fill: float = 1.0  # fraction of the capacity the bucket starts with
    min_tokens: int = 8_000  # a unit's draw, uniform in [min_tokens, max_tokens]
    max_tokens: int = 16_000
    work_s: float = 0.0  # the model call after a grant
    hold_s: float = HOLD_S  # acquire()'s bound: how long a worker holds on for tokens
    horizon_s: float = HORIZON_S  # how far past the refill the governor books
    shards: int = 1
    idle_s: float = 10.0  # after the run, nobody draws for this long...
    after_idle_s: float = 5.0  # ...then every worker draws again for this long
    used_min: float = 1.0  # the model counts a fraction of the grant, uniform in [min, max]
    used_max: float = 1.0
    #: the units' lane's reserve, a fraction of the capacity (0: the issue's scenario, a lane
    #: that books); above 0 the lane queues its tenant's units for tokens instead (one tenant
    #: here: docs/explanation/governor.md, "Lanes with a reserve queue, tenant by tenant")
    reserve: float = 0.0
    seed: int = 1
    #: requests per minute (None: no request bucket): the governor counts one request per
    #: grant beside its tokens, and the figures add the request bucket's
    #: (docs/explanation/governor.md, "Requests per minute"); with small draws, requests bind long
    #: before tokens
    rpm: int | None = None
    #: quota tokens per output token (None: the draws are plain tokens, as before): a unit is
    #: output-heavy, a quarter input and three quarters its output bound, and draws
    #: ``input + burndown x bound`` quota tokens; the model answers a fraction (--used-min..max)
    #: of the bound, and the true-up counts ``input + burndown x output``, as Bedrock does
    output_burndown: float | None = None

    def __post_init__(self) -> None:
        checks = [
            ("--workers", 1 <= self.workers <= 2_000, "must be in 1..2000"),
            ("--processes", 1 <= self.processes <= 16, "must be in 1..16"),
            ("--seconds", 1 <= self.seconds <= 3_600, "must be in 1..3600"),
            ("--quota-tpm", self.quota_tpm >= 1, "must be >= 1"),
            ("--share", 0 < self.share <= 1, "must be in (0, 1]"),
            ("--capacity", self.capacity > 0, "must be > 0 tokens"),
            ("--initial-fill", 0 <= self.initial_fill <= 1, "must be in [0, 1]"),
            ("--min-tokens", self.min_tokens >= 1, "must be >= 1"),
            ("--max-tokens", self.max_tokens >= self.min_tokens, "must be >= --min-tokens"),
            (
                "--max-tokens",
                self.max_tokens <= self.capacity / self.shards,
                "must fit in one shard's capacity (--capacity / --shards): such a draw could "
                "never be granted",
            ),
            ("--work-s", self.work_s >= 0, "must be >= 0"),
            ("--hold-s", self.hold_s >= 0, "must be >= 0"),
            ("--horizon-s", self.horizon_s >= 0, "must be >= 0"),
            ("--shards", 1 <= self.shards <= 64, "must be in 1..64"),
            ("--idle-s", self.idle_s >= 0, "must be >= 0"),
            ("--after-idle-s", self.after_idle_s >= 0, "must be >= 0"),
            ("--used-min", 0 <= self.used_min <= self.used_max, "must be in [0, --used-max]"),
            ("--used-max", self.used_max <= 10, "must be <= 10"),
            ("--reserve", 0 <= self.reserve < 1, "must be in [0, 1)"),
            ("--rpm", self.rpm is None or self.rpm >= 1, "must be >= 1"),
            (
                "--output-burndown",
                self.output_burndown is None or 1 <= self.output_burndown <= 100,
                "must be in [1, 100]",
            ),
            (
                "--max-tokens",
                self.largest_draw <= self.capacity / self.shards,
                "with --output-burndown, its quota draw must fit in one shard's capacity",
            ),
            (
                "--reserve",
                self.max_tokens + self.reserve * self.capacity / self.shards
                <= self.capacity / self.shards,
                "leaves no room for the largest draw above it in one shard",
            ),
        ]
        for name, ok, why in checks:
            if not ok:
                raise InvalidInput(name, why)
        if self.processes > self.workers:
            raise InvalidInput("--processes", "cannot exceed --workers")

    @property
    def rate(self) -> float:
        """The governed rate in tokens per second."""
        return self.quota_tpm / 60 * self.share

    @property
    def initial(self) -> float:
        return self.initial_fill * self.capacity

    @property
    def request_rate(self) -> float | None:
        """The governed rate in requests per second (None: no request bucket)."""
        return None if self.rpm is None else self.rpm / 60 * self.share

    @property
    def request_capacity(self) -> float | None:
        return None if self.rpm is None else self.rpm * self.share

    def split(self, tokens: int) -> tuple[int, int]:
        """An output-heavy unit of ``tokens``: (input, output bound), a quarter and the rest."""
        inp = tokens // 4
        return inp, tokens - inp

    def quota_draw(self, tokens: int) -> int:
        """What a unit of ``tokens`` draws: itself, or with --output-burndown its input plus
        the burndown times its output bound (quota tokens, as Bedrock reserves them)."""
        if self.output_burndown is None:
            return tokens
        inp, bound = self.split(tokens)
        return inp + math.ceil(self.output_burndown * bound)

    @property
    def largest_draw(self) -> int:
        return self.quota_draw(self.max_tokens)

    def governor_config(self) -> GovernorConfig:
        from swarm.core.governor import GovernorConfig
        from swarm.core.records import Lane

        return GovernorConfig(
            quota_tpm=self.quota_tpm,
            share=self.share,
            capacity=self.capacity,
            initial_fill=self.initial_fill,
            reserves={Lane.NORMAL: self.reserve} if self.reserve else {},
            rpm=self.rpm,
            output_burndown=self.output_burndown or 1.0,
        )


@dataclass(frozen=True)
class Call:
    """One acquire() call, on the worker's clock."""

    asked: float
    returned: float
    granted: bool
    requests: int  # DynamoDB requests it made
    failures: int  # of which failed conditional writes
    held_s: float  # how long the worker was in it (waited_s: its DynamoDB requests included)
    slept_s: float  # of which it slept, waiting for tokens (Lambda-seconds spent waiting)
    after_requeue: bool  # the unit had been requeued before this call
    booked: bool  # refused with a ticket (tokens booked for the unit)
    retry_after_s: float  # refused: when the governor said its tokens would be there
    delay_s: int  # refused: the worker's requeue delay (whole seconds)


@dataclass(frozen=True)
class UnitGrant:
    """A granted unit: (first ask, sighting, tokens used) is what over-grant is judged by."""

    first_asked: float
    seen: float
    amount: int  # tokens drawn for it
    used: int  # tokens the model counted
    tries_after_requeue: int  # acquire() calls after its first requeue (0: never requeued)


@dataclass
class WorkerReport:
    calls: list[Call] = field(default_factory=list)
    grants: list[UnitGrant] = field(default_factory=list)
    # (first ask, end) of the unit still wanting tokens when a phase ended
    waiting: list[tuple[float, float]] = field(default_factory=list)
    warm_up_requests: int = 0  # the client's first read, before the start
    requests_in_run: int = 0  # requests during the run (true-ups included)
    failures_in_run: int = 0
    requests_after_idle: int = 0
    expired: int = 0
    refunded: int = 0
    refund_dropped: int = 0
    debited: int = 0
    # the governor's own account of when each grant's tokens were the worker's: never judged,
    # kept to show what a check that trusts the governor would conclude
    claimed: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class BenchRun:
    """What the workers reported, and the benchmark's phases (epoch seconds)."""

    reports: list[WorkerReport]
    start_at: float
    end_at: float
    resume_at: float
    final_at: float


@dataclass
class _Unit:
    amount: int  # what it draws (quota tokens)
    tokens: int = 0  # its tokens as billed (input + output bound)
    first_asked: float | None = None
    ticket: Any = None
    retry_at: float = 0.0
    requeues: int = 0
    tries_after_requeue: int = 0


def _client(endpoint: str, pool: int) -> Any:
    from swarm.local.clients import local_client

    return local_client("dynamodb", endpoint, pool=pool, read_timeout=30)


def _worker_process(
    endpoint: str,
    table: str,
    cfg: BenchConfig,
    threads: int,
    seed: int,
    ready: Any,
    phases: Any,
    out: Any,
    factory: GovernorFactory | None = None,
) -> None:
    """One process of the fleet: ``threads`` workers, each with its own governor client.

    It says ``ready`` once its imports are done and its client exists, then takes the run's
    phases (epoch seconds) from ``phases``: the start is set only when every process is ready,
    so a slow spawn on a loaded machine delays the run instead of eating into it."""
    import random

    from swarm.adapters.dynamodb_governor import DynamoDBGovernor
    from swarm.core.governor import acquire
    from swarm.core.ports import requeue_delay, sqs_seconds
    from swarm.core.records import Lane

    make = factory or DynamoDBGovernor
    client = _client(endpoint, threads + 2)
    config = cfg.governor_config()
    ready.put(seed)
    start_at, end_at, resume_at, final_at = phases.get()
    reports: list[WorkerReport] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        rng = random.Random(seed * 10_000 + i)
        gov = make(
            config,
            table,
            client=client,
            shards=cfg.shards,
            horizon_s=cfg.horizon_s,
            rng=random.Random(seed * 10_000 + i),
        )
        report = WorkerReport()
        # a warm container: the client has read the shard items before the start
        gov.snapshot(time.time())
        report.warm_up_requests = gov.stats.requests

        def new_unit() -> _Unit:
            tokens = rng.randint(cfg.min_tokens, cfg.max_tokens)
            return _Unit(cfg.quota_draw(tokens), tokens=tokens)

        slept = [0.0]  # seconds this worker slept in acquire(), waiting for tokens

        def sleep(seconds: float) -> None:
            slept[0] += seconds
            time.sleep(seconds)

        unit = new_unit()
        for phase, (begin, end) in enumerate(((start_at, end_at), (resume_at, final_at))):
            time.sleep(max(0.0, begin - time.time()))
            requests0, failures0 = gov.stats.requests, gov.stats.condition_failures
            while time.time() < end:
                now = time.time()
                if unit.retry_at > now:  # back in its lane until its requeue delay is over
                    time.sleep(min(unit.retry_at, end) - now)
                    continue
                asked = time.time()
                if unit.first_asked is None:
                    unit.first_asked = asked
                r0, f0 = gov.stats.requests, gov.stats.condition_failures
                asleep = slept[0]
                got = acquire(
                    gov, unit.amount, Lane.NORMAL, time.time, sleep, cfg.hold_s, unit.ticket
                )
                seen = time.time()  # the worker's own clock: when it would call the model
                if unit.requeues:
                    unit.tries_after_requeue += 1
                # SQS delays the unit by whole seconds
                delay = 0 if got.granted else sqs_seconds(requeue_delay(got.retry_after_s))
                report.calls.append(
                    Call(
                        asked,
                        seen,
                        got.granted,
                        gov.stats.requests - r0,
                        gov.stats.condition_failures - f0,
                        got.waited_s,
                        slept[0] - asleep,
                        unit.requeues > 0,
                        got.ticket is not None,
                        got.retry_after_s,
                        delay,
                    )
                )
                if not got.granted:
                    unit.ticket = got.ticket
                    unit.requeues += 1
                    unit.retry_at = seen + delay
                    continue
                fraction = rng.uniform(cfg.used_min, cfg.used_max)
                if cfg.output_burndown is None:
                    used = round(unit.amount * fraction)
                else:  # input, and the answer's output counted at the burndown (quota tokens)
                    inp, bound = cfg.split(unit.tokens)
                    used = inp + math.ceil(cfg.output_burndown * round(bound * fraction))
                report.grants.append(
                    UnitGrant(unit.first_asked, seen, unit.amount, used, unit.tries_after_requeue)
                )
                report.claimed.append(seen if gov.last_grant_at is None else gov.last_grant_at)
                if cfg.work_s:
                    time.sleep(cfg.work_s)
                if used != unit.amount and got.grant is not None:
                    gov.true_up(got.grant, used, time.time())
                unit = new_unit()
            if unit.first_asked is not None:
                report.waiting.append((unit.first_asked, end))
            if phase == 0:
                report.requests_in_run = gov.stats.requests - requests0
                report.failures_in_run = gov.stats.condition_failures - failures0
            else:
                report.requests_after_idle = gov.stats.requests - requests0
        report.expired = gov.stats.expired
        report.refunded = gov.stats.refunded
        report.refund_dropped = gov.stats.refund_dropped
        report.debited = gov.stats.debited
        with lock:
            reports.append(report)

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
    ``asked`` when the unit first asked for them (its first ``acquire()`` call: a ticket is booked
    no earlier), ``seen`` right after ``acquire()`` returned granted. A grant's tokens were drawn
    from the bucket at some instant in [asked, seen]: not before the unit asked, and not after
    it saw the answer (a ticket matures after it was booked, an immediate grant is decided
    during the call). The instant itself is the governor's business
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
    return summarize(cfg, bench)


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
        ready, phases_q, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
        per = [cfg.workers // cfg.processes] * cfg.processes
        for i in range(cfg.workers % cfg.processes):
            per[i] += 1
        procs = [
            ctx.Process(
                target=_worker_process,
                args=(endpoint, table, cfg, n, i, ready, phases_q, out, factory),
                daemon=True,
            )
            for i, n in enumerate(per)
        ]
        for p in procs:
            p.start()
        for _ in procs:  # every process has imported boto3 and built its client
            try:
                ready.get(timeout=SPAWN_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError(
                    f"a benchmark process did not start within {SPAWN_TIMEOUT_S:g} s"
                ) from None
        # then each worker's client reads the shard items (a warm container) before the start;
        # a whole second: exactly representable, so the bucket's base time is exactly it
        start_at = float(math.ceil(time.time() + 1.0 + 0.02 * cfg.workers))
        end_at = start_at + cfg.seconds
        resume_at = end_at + cfg.idle_s
        final_at = resume_at + cfg.after_idle_s
        config = cfg.governor_config()
        DynamoDBGovernor(config, table, client=client, shards=cfg.shards).create(start_at)
        for _ in procs:
            phases_q.put((start_at, end_at, resume_at, final_at))
        reports: list[WorkerReport] = []
        deadline = final_at + cfg.hold_s + cfg.work_s + 120
        for _ in procs:
            reports.extend(out.get(timeout=max(1.0, deadline - time.time())))
        for p in procs:
            p.join(timeout=10)
    finally:
        if server is not None:
            server.stop()
    return BenchRun(reports, start_at, end_at, resume_at, final_at)


def summarize(cfg: BenchConfig, bench: BenchRun) -> dict[str, Any]:
    """The figures of a run (see the module's docstring)."""
    reports, start_at, end_at = bench.reports, bench.start_at, bench.end_at
    grants = [g for r in reports for g in r.grants]
    in_run = [g for g in grants if g.seen <= end_at]
    calls = [c for r in reports for c in r.calls if c.asked < end_at]
    refused = [c for c in calls if not c.granted]
    requests = sum(r.requests_in_run for r in reports)
    failures = sum(r.failures_in_run for r in reports)
    used = sum(g.used for g in in_run)
    # demand: from a unit's first ask until its grant was seen (or the run ended)
    demand = [(g.first_asked, g.seen) for g in grants] + [w for r in reports for w in r.waiting]
    could = could_have_granted(demand, start_at, end_at, cfg.initial, cfg.capacity, cfg.rate)
    judged = [(g.first_asked, g.seen, g.used) for g in grants]
    tries = [g.tries_after_requeue for g in in_run if g.tries_after_requeue]
    n_calls, n_grants = max(1, len(calls)), max(1, len(in_run))
    return {
        "workers": cfg.workers,
        "processes": cfg.processes,
        "shards": cfg.shards,
        "seconds": cfg.seconds,
        "quota_tpm": cfg.quota_tpm,
        "share": cfg.share,
        "governed_rate_tokens_per_s": cfg.rate,
        "capacity_tokens": cfg.capacity,
        "initial_fill": cfg.initial_fill,
        "min_tokens": cfg.min_tokens,
        "max_tokens": cfg.max_tokens,
        "work_s": cfg.work_s,
        "hold_s": cfg.hold_s,
        "horizon_s": cfg.horizon_s,
        "idle_s": cfg.idle_s,
        "after_idle_s": cfg.after_idle_s,
        "used_min": cfg.used_min,
        "used_max": cfg.used_max,
        "reserve": cfg.reserve,
        "output_burndown": cfg.output_burndown,
        "acquire_calls": len(calls),
        "grants": len(in_run),
        "grants_after_idle": sum(1 for g in grants if g.seen > bench.resume_at),
        "tokens_granted": sum(g.amount for g in in_run),
        "tokens_used": used,
        "requests": requests,
        "conditional_failures": failures,
        "warm_up_requests": sum(r.warm_up_requests for r in reports),
        "requests_per_call": requests / n_calls,
        "conditional_failures_per_call": failures / n_calls,
        "requests_per_grant": requests / n_grants,
        "conditional_failures_per_grant": failures / n_grants,
        "utilization": used / could if could else 0.0,
        "could_have_granted": could,
        # tokens; judged by when the units first asked and when their grants were seen, by what
        # the model used, over the run, the idle time and the draws after it (over_granted)
        "over_granted": over_granted(judged, start_at, cfg.initial, cfg.capacity, cfg.rate),
        "over_grant_tolerance": over_grant_tolerance(cfg.rate),
        "burst_over_bucket_as_seen": over_granted(
            [(s, s, u) for _, s, u in judged], start_at, cfg.initial, cfg.capacity, cfg.rate
        ),
        "requeues": len(refused),
        "requeues_with_ticket": sum(1 for c in refused if c.booked),
        "requeued_units_granted": len(tries),
        "granted_at_try_after_requeue": {
            "1": sum(1 for t in tries if t == 1),
            "2": sum(1 for t in tries if t == 2),
            "3+": sum(1 for t in tries if t >= 3),
        },
        "max_tries_after_requeue": max(tries, default=0),
        # a requeue's delay against when the governor said the tokens would be there
        "requeue_delay_early_s": max(
            (c.retry_after_s - c.delay_s for c in refused if c.retry_after_s <= MAX_SQS_DELAY_S),
            default=0.0,
        ),
        "tickets_expired": sum(r.expired for r in reports),
        # Lambda-seconds: sleeping for tokens, and all the time in acquire() (requests included)
        "slept_s_per_grant": sum(c.slept_s for c in calls) / n_grants,
        "in_acquire_s_per_grant": sum(c.held_s for c in calls) / n_grants,
        "tokens_refunded": sum(r.refunded for r in reports),
        "tokens_refund_dropped": sum(r.refund_dropped for r in reports),
        "tokens_debited": sum(r.debited for r in reports),
        "unit_wait_p50_s": _percentile([g.seen - g.first_asked for g in in_run], 0.50),
        "unit_wait_p99_s": _percentile([g.seen - g.first_asked for g in in_run], 0.99),
        **_request_figures(cfg, bench, grants, demand, used / could if could else 0.0),
    }


#: the sliding window Bedrock's per-minute quotas are stated over
MINUTE_S = 60.0


def _request_figures(
    cfg: BenchConfig,
    bench: BenchRun,
    grants: Sequence[UnitGrant],
    demand: Sequence[tuple[float, float]],
    token_utilization: float,
) -> dict[str, Any]:
    """With --rpm, the request bucket's figures: each grant is one request (one model call),
    judged from outside as the tokens are (:func:`over_granted`, every window), and the most
    requests seen in any sliding minute against what the bucket allows in one (its capacity
    plus a minute of refill); utilization of the binding limit, the busier of the two."""
    rate, cap = cfg.request_rate, cfg.request_capacity
    if rate is None or cap is None:
        return {}
    initial = cfg.initial_fill * cap
    judged = [(g.first_asked, g.seen, 1) for g in grants]
    in_run = [g for g in grants if g.seen <= bench.end_at]
    could = could_have_granted(demand, bench.start_at, bench.end_at, initial, cap, rate)
    utilization = len(in_run) / could if could else 0.0
    seen = sorted(g.seen for g in grants)
    busiest = max(
        (bisect.bisect_right(seen, t + MINUTE_S) - i for i, t in enumerate(seen)), default=0
    )
    binding = "rpm" if utilization >= token_utilization else "tpm"
    return {
        "rpm": cfg.rpm,
        "governed_rate_requests_per_s": rate,
        "capacity_requests": cap,
        "requests_granted": len(in_run),
        "requests_could_have_granted": could,
        "requests_utilization": utilization,
        "requests_over_granted": over_granted(judged, bench.start_at, initial, cap, rate),
        "requests_over_grant_tolerance": over_grant_tolerance(rate),
        "requests_busiest_minute": busiest,
        "requests_allowed_per_minute": cap + rate * MINUTE_S,
        "binding_limit": binding,
        "binding_utilization": max(utilization, token_utilization),
    }


def render(result: dict[str, Any]) -> str:
    r = result
    tries = r["granted_at_try_after_requeue"]
    lines = [
        f"governor benchmark: {r['workers']} workers in {r['processes']} processes, "
        f"{r['shards']} shard(s), {r['seconds']:g} s (then {r['idle_s']:g} s idle and "
        f"{r['after_idle_s']:g} s of draws)",
        f"  bucket              {r['quota_tpm']:,} TPM x {r['share']:g} = "
        f"{r['governed_rate_tokens_per_s']:,.0f} tokens/s, capacity "
        f"{r['capacity_tokens']:,.0f} starting {r['initial_fill']:.0%} full",
        f"  units               draws of {r['min_tokens']:,}-{r['max_tokens']:,} tokens, model "
        f"time {r['work_s']:g} s, hold {r['hold_s']:g} s, booking horizon {r['horizon_s']:g} s"
        + (
            f"; their lane keeps a reserve of {r['reserve']:g} of the capacity (it queues for "
            "tokens, one tenant: the reserve is in what the bucket could give)"
            if r.get("reserve")
            else ""
        ),
        f"  acquire calls       {r['acquire_calls']:,} for {r['grants']:,} grants "
        f"({r['requeues']:,} requeued, {r['requeues_with_ticket']:,} of them with a ticket)",
        f"  requests            {r['requests_per_call']:.3f} per call, "
        f"{r['requests_per_grant']:.3f} per grant ({r['requests']:,}; plus "
        f"{r['warm_up_requests']:,} warm-up reads, one per worker, before the start)",
        f"  failed cond. writes {r['conditional_failures_per_call']:.3f} per call, "
        f"{r['conditional_failures_per_grant']:.3f} per grant",
        f"  utilization         {r['utilization']:.3f} of what the bucket could give "
        f"({r['tokens_used']:,} of {r['could_have_granted']:,.0f} tokens)",
        f"  over-granted        {r['over_granted']:,.3f} tokens over every window, idle and "
        f"after included (clock tolerance {r['over_grant_tolerance']:,.3f}); model calls' burst "
        f"above the bucket as seen {r['burst_over_bucket_as_seen']:,.0f}",
        f"  after a requeue     granted at try 1: {tries['1']:,}, 2: {tries['2']:,}, 3+: "
        f"{tries['3+']:,} (max {r['max_tries_after_requeue']}); tickets expired "
        f"{r['tickets_expired']:,}; a delay ended before the tokens were due by at most "
        f"{max(0.0, r['requeue_delay_early_s']):.3f} s",
        f"  held on for tokens  {r['slept_s_per_grant']:.3f} s asleep per grant "
        f"({r['in_acquire_s_per_grant']:.3f} s in acquire(), requests included)",
        f"  unit waits          {r['unit_wait_p50_s']:.1f} s p50, {r['unit_wait_p99_s']:.1f} s "
        "p99 from its first ask to its grant",
    ]
    if r.get("output_burndown") is not None:
        lines.append(
            f"  output burndown     x{r['output_burndown']:g}: a unit is a quarter input, three "
            "quarters its output bound, and draws input + burndown x bound; its true-up counts "
            "input + burndown x output (quota tokens, which every figure above is in)"
        )
    if r.get("rpm") is not None:
        lines += [
            f"  request bucket      {r['rpm']:,} RPM x {r['share']:g} = "
            f"{r['governed_rate_requests_per_s']:,.2f} requests/s, capacity "
            f"{r['capacity_requests']:,.0f}",
            f"  requests            {r['requests_granted']:,} granted of "
            f"{r['requests_could_have_granted']:,.0f} the bucket could give: utilization "
            f"{r['requests_utilization']:.3f}",
            f"  requests over-gr.   {r['requests_over_granted']:,.3f} over every window, idle "
            f"and after included (tolerance {r['requests_over_grant_tolerance']:.6f}); the "
            f"busiest sliding 60 s: {r['requests_busiest_minute']:,} granted of "
            f"{r['requests_allowed_per_minute']:,.0f} allowed",
            f"  binding limit       {r['binding_limit'].upper()}, utilization "
            f"{r['binding_utilization']:.3f}",
        ]
    if r["used_min"] != 1 or r["used_max"] != 1:
        lines.append(
            f"  true-ups            model used {r['used_min']:g}-{r['used_max']:g} of each grant: "
            f"{r['tokens_refunded']:,} tokens refunded, {r['tokens_refund_dropped']:,} not "
            f"refunded, {r['tokens_debited']:,} debited"
        )
    lines.append(
        "  note: on an embedded moto server; the figures are the algorithm's requests, not "
        "DynamoDB's speed."
    )
    return "\n".join(lines)
