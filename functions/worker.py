"""Worker: an SQS batch from one lane, its units at once, with partial batch responses.

Per invocation: the drain switch read once (``Worker.begin``), and an entry in the register of
running work made before its first claim and removed once its settlements are written
(``Worker.enter``, ``Worker.end``: what a drain waits for). Per unit: the worker loop in
:mod:`swarm.service.worker` (drain check, admission of a retry, governor draw with a bounded
wait, claim, model call, settlement), then its outcome on SQS: delete
(success), redeliver after a short backoff (a failed attempt: "retries by redelivery"), or a
delayed copy (backpressure, draining, a throttle: the unit did not run, so no attempt is spent).

A message carries one unit or a *bundle* of units due together (swarm.core.lanes.bundle: the
fan-out and this handler send them so). A bundle's units each have their own outcome, and the
message is deleted once each has one: a unit to retry or to requeue goes back as a copy of its
own (delayed as its outcome says), and a unit that raised goes back alone after its claim's
lease. A bundle whose invocations died (delivered a third time: ``SPLIT_RECEIVES``) is split:
each of its units goes back alone, so a unit that kills its sandbox cannot take the others to the
dead-letter queue with it. A message whose units all wait further than SQS delays a message (deep
in their tenant's queue) is hidden until the last is due (``hide_deep``), at its first receive.
The tokens of the units delivered for the first time on a lane without a reserve are booked
together before they run (``Worker.book_together``), so those that must wait go back together.

The batch's units run at the same time, one thread each (at most the mapping's batch size of
messages, 10, of at most MAX_BUNDLE_UNITS units): a worker spends nearly all its time waiting for
the model, and Lambda bills the invocation's duration, so a batch run one unit after another
billed the sum of its model calls and one run at once bills about the longest
(docs/explanation/scale.md, "The bill per unit"). Each unit runs in a copy of the invocation's
context, so its log lines carry its own ids (Powertools' thread-safe keys); the metrics are added on
the invocation's thread, from the units' reports.
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from aws_lambda_powertools import Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.contract import (
    MAX_BUNDLE_UNITS,
    METRIC_GOVERNOR_SATURATION,
    METRIC_GOVERNOR_WAIT_MS,
    METRIC_MODEL_THROTTLES,
    METRIC_TOKENS_SPENT,
    METRIC_UNITS_COMPLETED,
    METRIC_UNITS_DEAD_LETTERED,
    METRIC_UNITS_FAILED,
)
from swarm.core.codec import parse_message
from swarm.core.lanes import Bundle, Bundling, QueuedUnit
from swarm.core.ledger import Fate
from swarm.core.ports import LaneQueue
from swarm.core.records import Lane
from swarm.service.pages import Page
from swarm.service.worker import Requeue, RetryLater, Worker, WorkerInvocation, WorkReport
from swarm.wiring import Wiring

logger = service_logger()
tracer = Tracer()
metrics = Metrics()
#: an SQS event source mapping's largest batch (infra/config.py bounds worker.batch_size to it)
MAX_BATCH = 10
#: one thread per unit of a batch; kept by the sandbox, made on demand, idle between invocations
_pool = ThreadPoolExecutor(max_workers=MAX_BATCH * MAX_BUNDLE_UNITS, thread_name_prefix="unit")

_cache: dict[str, Any] = {}
#: a bundle received this many times is split, each unit sent alone: its invocation died
#: (twice, or once after the bundle was hidden: a hidden bundle comes back a second time)
SPLIT_RECEIVES = 3
#: a message is hidden at its first receive only; one received again goes back as a fresh copy
#: (which may be hidden in turn): each receive counts towards the lanes' maxReceiveCount, after
#: which SQS dead-letters the message, and a deep unit must never get there by waiting
HIDE_RECEIVES = 2
#: an invocation's last seconds (deployed clock) are kept for its settlements and requeues
END_MARGIN_S = 10.0


class AttemptFailed(Exception):
    """Raised for a failed attempt so the batch response lists the message for redelivery."""


def _services() -> tuple[Worker, LaneQueue, Bundling]:
    if "worker" not in _cache:
        runtime = Wiring.from_env()
        _cache["worker"] = runtime.worker()
        _cache["lanes"] = runtime.lanes()
        _cache["bundling"] = runtime.bundling()
        _cache["seconds"] = runtime.seconds
    return _cache["worker"], _cache["lanes"], _cache["bundling"]


@dataclass(frozen=True)
class Done:
    """A unit's work: its report, and when it ended (a copy's delay runs from it)."""

    report: WorkReport
    item: QueuedUnit
    ended: float


@dataclass(frozen=True)
class Copy:
    """A unit going back to its lane as a message of its own (or of a new bundle)."""

    message_id: str  # the message it came in: redelivered instead if the copy cannot be sent
    item: QueuedUnit
    delay_s: float  # on this function's clock, from ``since``
    since: float
    #: never bundled with others: a unit that raised, or one of a split bundle (one of them may
    #: kill its sandbox: it must reach the dead-letter queue alone)
    alone: bool = False


@tracer.capture_method
def unit_handler(
    item: QueuedUnit,
    record: SQSRecord,
    alone: bool,
    invocation: WorkerInvocation,
    deadline: float | None = None,
) -> Done:
    """One unit, on a thread of its own. ``alone``: the message carries only this unit, and a
    failed attempt raises for the message's redelivery; a bundle's unit is retried by a copy.
    ``invocation``: the drain switch as the handler read it, and its running-work entry."""
    # this unit's context is its own (a copy of the invocation's): its lines carry its ids
    logger.thread_safe_append_keys(batch_id=item.run_id, unit_id=item.unit_id, tenant=item.tenant)
    worker, lanes, _ = _services()
    # a copy delivered again may carry a ticket an earlier delivery spent (swarm.service.worker)
    report = worker.process(
        item, first_delivery=receives(record) == 1, invocation=invocation, deadline=deadline
    )
    outcome = report.outcome
    logger.info(
        "unit processed",
        outcome=type(outcome).__name__,
        reason=outcome.reason,
        attempt=report.attempt,
        tokens=report.tokens,
        delay_s=outcome.delay_s if isinstance(outcome, Requeue) else None,
    )
    if alone and isinstance(outcome, RetryLater):
        lanes.change_visibility(item.lane, record.receipt_handle, outcome.after_s)
        raise AttemptFailed(outcome.reason)
    return Done(report, item, time.monotonic())


def receives(record: SQSRecord) -> int:
    """How many times SQS has delivered this message, this delivery included."""
    return int((record.raw_event.get("attributes") or {}).get("ApproximateReceiveCount", 1))


def _in_page(
    page: Page,
    item: QueuedUnit,
    record: SQSRecord,
    alone: bool,
    invocation: WorkerInvocation,
    deadline: float,
) -> Done:
    with page.message():
        return unit_handler(item, record, alone, invocation, deadline)


def unspent(item: QueuedUnit) -> QueuedUnit:
    """The unit without a ticket its delivery may have spent (a place is never spent)."""
    ticket = item.ticket
    return item if ticket is None or ticket.slot else replace(item, ticket=None)


def copy_of(message_id: str, done: Done) -> Copy | None:
    """The copy a unit's outcome sends back, if any: a requeue (with the governor booking its
    outcome names, if any; never the one its delivery carried and spent) or a retry after its
    backoff (its ticket was spent by the grant)."""
    outcome = done.report.outcome
    if isinstance(outcome, Requeue):
        item = replace(done.item, ticket=outcome.ticket, tools_down_since=outcome.tools_down_since)
        return Copy(message_id, item, outcome.delay_s, done.ended)
    if isinstance(outcome, RetryLater):
        return Copy(message_id, replace(done.item, ticket=None), outcome.after_s, done.ended)
    return None


def send_copies(lanes: LaneQueue, bundling: Bundling, copies: list[Copy]) -> list[str]:
    """Send the copies, delayed by what is left of their delays, units due together in one
    message (``bundling``), all in one SendMessageBatch per lane; their originals are then
    deleted as successes. The message ids whose copies may not have been sent (SQS failed):
    redelivered instead."""
    if not copies:
        return []
    now = time.monotonic()
    # never shorter than asked: the time since the decision is cut down (the lanes round what
    # is left up to SQS's whole seconds)
    delays = [max(0.0, c.delay_s - (now - c.since)) for c in copies]
    together = [(c.item, d) for c, d in zip(copies, delays, strict=True) if not c.alone]
    bundles = bundling.of([i for i, _ in together], [d for _, d in together])
    bundles += [Bundle((c.item,), d) for c, d in zip(copies, delays, strict=True) if c.alone]
    try:
        lanes.send_bundles(bundles)
    except Exception:
        logger.exception("requeue failed: the units are redelivered", units=len(copies))
        return sorted({c.message_id for c in copies})
    return []


def add_metrics(report: WorkReport) -> None:
    if report.attempt is not None:  # the unit drew from the governor
        metrics.add_metric(METRIC_GOVERNOR_WAIT_MS, MetricUnit.Milliseconds, report.waited_s * 1e3)
        saturated = 100.0 if report.waited_s > 0.05 else 0.0  # had to wait for tokens
        metrics.add_metric(METRIC_GOVERNOR_SATURATION, MetricUnit.Percent, saturated)
    if report.tokens or report.lost_attempt_tokens:
        tokens = report.tokens + report.lost_attempt_tokens
        metrics.add_metric(METRIC_TOKENS_SPENT, MetricUnit.Count, tokens)
    if report.throttled:
        metrics.add_metric(METRIC_MODEL_THROTTLES, MetricUnit.Count, 1)
    if report.fate is Fate.COMPLETED:
        metrics.add_metric(METRIC_UNITS_COMPLETED, MetricUnit.Count, 1)
    elif report.fate is Fate.DEAD_LETTERED:
        metrics.add_metric(METRIC_UNITS_DEAD_LETTERED, MetricUnit.Count, 1)
    elif report.fate is Fate.RETRY:
        metrics.add_metric(METRIC_UNITS_FAILED, MetricUnit.Count, 1)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    records = [SQSRecord(raw) for raw in event.get("Records") or []]
    if len(records) > MAX_BATCH:
        raise ValueError(f"{len(records)} records in one batch: SQS delivers at most {MAX_BATCH}")
    worker, lanes, bundling = _services()  # a cold start wires once, before the units run
    failures: list[str] = []
    copies: list[Copy] = []
    runs: list[tuple[SQSRecord, tuple[QueuedUnit, ...]]] = []
    for record in records:
        try:
            units = parse_message(record.body)
        except Exception:  # redelivered until the dead-letter queue takes it
            logger.exception("unreadable message", message_id=record.message_id)
            failures.append(record.message_id)
            continue
        if len(units) > 1 and receives(record) >= SPLIT_RECEIVES:
            # its invocations died: each unit goes back alone, so one that kills its sandbox
            # reaches the dead-letter queue alone
            logger.warning("bundle delivered again: split", message_id=record.message_id)
            now = time.monotonic()
            copies += [Copy(record.message_id, unspent(u), 0.0, now, alone=True) for u in units]
            continue
        runs.append((record, units))
    # the drain switch is read once for the invocation (cached, SsmDrainSwitch: most batches
    # cost no SSM read), and its units act on that value; the first about to claim enters the
    # register of running work, which the invocation leaves once its settlements are written
    invocation = worker.begin([u for _, us in runs for u in us])
    # an agent unit starts no model turn that cannot end before the invocation does
    on_clock = _cache.get("seconds", float)  # deployed seconds on this runtime's clock
    left_s = on_clock(context.get_remaining_time_in_millis() / 1000.0 - END_MARGIN_S)
    deadline = time.time() + left_s  # the workers' clock (Wiring.worker)
    try:
        return _run(worker, lanes, bundling, invocation, runs, copies, failures, deadline)
    finally:
        worker.end(invocation)
        # an MCP server's session lives for one invocation (swarm.adapters.mcp_tools)
        end_sessions = getattr(getattr(worker, "tools", None), "end_invocation", None)
        if end_sessions is not None:
            end_sessions()


def _run(
    worker: Worker,
    lanes: LaneQueue,
    bundling: Bundling,
    invocation: WorkerInvocation,
    runs: list[tuple[SQSRecord, tuple[QueuedUnit, ...]]],
    copies: list[Copy],
    failures: list[str],
    deadline: float,
) -> dict[str, Any]:
    # the tokens of the units delivered for the first time are booked together, so those that
    # must wait are due back to back and go back together (Worker.book_together)
    first = [u for r, us in runs if receives(r) == 1 for u in us]
    booked = iter(worker.book_together(first, invocation))
    runs = [(r, tuple(next(booked) for _ in us) if receives(r) == 1 else us) for r, us in runs]
    # the outcomes the units keep are written together, once each has kept one or ended
    page = Page(sum(len(units) for _, units in runs))
    running: list[tuple[SQSRecord, QueuedUnit, bool, Future[Done]]] = []
    for record, units in runs:
        alone = len(units) == 1
        for unit in units:
            own = contextvars.copy_context()  # the unit's log keys are its own
            future = _pool.submit(
                own.run, _in_page, page, unit, record, alone, invocation, deadline
            )
            running.append((record, unit, alone, future))
    errors = [future.exception() for *_, future in running]  # waits for every unit
    for error in errors:
        if error is not None and not isinstance(error, Exception):
            raise error  # the sandbox itself is going down (a BaseException): the whole batch
    hidden = hide_deep(lanes, worker.config.longest_hide_s, running, errors)
    for (record, unit, alone, future), error in zip(running, errors, strict=True):
        if error is None:
            done = future.result()
            add_metrics(done.report)
            if record.message_id in hidden:
                continue  # the message itself comes back when its units' tokens are near
            copy = copy_of(record.message_id, done)
            if copy is not None:
                copies.append(copy)
        elif isinstance(error, AttemptFailed):  # a failed attempt: redelivered after its backoff
            failures.append(record.message_id)
        else:  # the others' outcomes stand
            logger.exception("unit failed", message_id=record.message_id, exc_info=error)
            if alone:  # redelivered after the visibility timeout
                failures.append(record.message_id)
            else:  # back alone once its claim's lease (the visibility timeout) has passed
                lease = worker.config.lease_s
                copy = Copy(record.message_id, unspent(unit), lease, time.monotonic(), alone=True)
                copies.append(copy)
    failures += list(hidden)
    failures += send_copies(lanes, bundling, copies)
    return {"batchItemFailures": [{"itemIdentifier": mid} for mid in dict.fromkeys(failures)]}


def hide_deep(
    lanes: LaneQueue,
    longest_s: float,
    running: list[tuple[SQSRecord, QueuedUnit, bool, Future[Done]]],
    errors: list[BaseException | None],
) -> set[str]:
    """The messages whose units all wait further than SQS delays a message (``Requeue.hide``:
    deep in their tenant's queue), or are done, hidden in their lane until their last is due (a
    visibility timeout, at most ``longest_s``): one receive later instead of a copy every 15
    minutes. Their ids (reported as failures: SQS keeps them);
    a message whose visibility could not be changed goes back as copies instead."""
    waits: dict[str, list[float]] = {}
    mixed: set[str] = set()
    records: dict[str, tuple[SQSRecord, Lane]] = {}
    for (record, unit, _, future), error in zip(running, errors, strict=True):
        mid = record.message_id
        records[mid] = (record, unit.lane)
        outcome = None if error is not None else future.result().report.outcome
        if isinstance(outcome, Requeue) and outcome.hide:
            waits.setdefault(mid, []).append(outcome.delay_s)
        elif outcome is None or isinstance(outcome, Requeue | RetryLater):
            mixed.add(mid)  # something of it goes back sooner (or raised): copies
    hidden: set[str] = set()
    for mid, delays in waits.items():
        record, lane = records[mid]
        if mid in mixed or receives(record) >= HIDE_RECEIVES:  # a copy starts its count afresh
            continue
        try:
            # until the last is due: a bundle's units are due within its window of each other
            # (the fan-out delayed it so), and one hidden until the first is due would send the
            # others back as copies, each a few seconds early
            lanes.change_visibility(lane, record.receipt_handle, min(max(delays), longest_s))
        except Exception:
            logger.exception("hiding a deep message failed: its units go back as copies")
            continue
        hidden.add(mid)
    return hidden
