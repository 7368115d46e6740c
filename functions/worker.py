"""Worker: an SQS batch from one lane, its messages at once, with partial batch responses.

Per message: the worker loop in :mod:`swarm.service.worker` (drain check, admission of a retry,
governor draw with a bounded wait, claim, model call, settlement), then its outcome on SQS: delete
(success), redeliver after a short backoff (a failed attempt: "retries by redelivery"), or a
delayed copy (backpressure, draining, a throttle: the unit did not run, so no attempt is spent).

The batch's messages run at the same time, one thread each (at most the mapping's batch size,
10): a worker spends nearly all its time waiting for the model, and Lambda bills the invocation's
duration, so a batch run one message after another billed the sum of its model calls and one run
at once bills about the longest (docs/scale.md, "The bill per unit"). Each message runs in a copy
of the invocation's context, so its log lines carry its own ids (Powertools' thread-safe keys);
the metrics are added on the invocation's thread, from the messages' reports.
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from swarm.contract import (
    METRIC_GOVERNOR_SATURATION,
    METRIC_GOVERNOR_WAIT_MS,
    METRIC_MODEL_THROTTLES,
    METRIC_TOKENS_SPENT,
    METRIC_UNITS_COMPLETED,
    METRIC_UNITS_DEAD_LETTERED,
    METRIC_UNITS_FAILED,
)
from swarm.core.codec import parse_message_body
from swarm.core.lanes import QueuedUnit
from swarm.core.ledger import Fate
from swarm.core.ports import LaneQueue
from swarm.service.pages import Page
from swarm.service.worker import Requeue, RetryLater, Worker, WorkReport
from swarm.wiring import Wiring

logger = Logger()
tracer = Tracer()
metrics = Metrics()
#: an SQS event source mapping's largest batch (infra/config.py bounds worker.batch_size to it)
MAX_BATCH = 10
#: one thread per message of a batch; kept by the sandbox, idle between invocations
_pool = ThreadPoolExecutor(max_workers=MAX_BATCH, thread_name_prefix="unit")

_cache: dict[str, Any] = {}


class AttemptFailed(Exception):
    """Raised for a failed attempt so the batch response lists the message for redelivery."""


def _services() -> tuple[Worker, LaneQueue]:
    if "worker" not in _cache:
        runtime = Wiring.from_env()
        _cache["worker"] = runtime.worker()
        _cache["lanes"] = runtime.lanes()
    return _cache["worker"], _cache["lanes"]


@dataclass(frozen=True)
class Done:
    """A message's work: its report, and when it ended (a requeued copy's delay runs from it)."""

    report: WorkReport
    item: QueuedUnit
    ended: float


@tracer.capture_method
def record_handler(record: SQSRecord) -> Done:
    """One message, on a thread of its own; raises for a redelivery. A unit to requeue is sent
    by the handler with the batch's others (one SendMessageBatch)."""
    item = parse_message_body(record.body)
    # this message's context is its own (a copy of the invocation's): its lines carry its ids
    logger.thread_safe_append_keys(batch_id=item.run_id, unit_id=item.unit_id, tenant=item.tenant)
    worker, lanes = _services()
    # a copy delivered again may carry a ticket an earlier delivery spent (swarm.service.worker)
    first = (record.raw_event.get("attributes") or {}).get("ApproximateReceiveCount", "1") == "1"
    report = worker.process(item, first_delivery=first)
    outcome = report.outcome
    logger.info(
        "unit processed",
        outcome=type(outcome).__name__,
        reason=outcome.reason,
        attempt=report.attempt,
        tokens=report.tokens,
        delay_s=outcome.delay_s if isinstance(outcome, Requeue) else None,
    )
    if isinstance(outcome, RetryLater):
        lanes.change_visibility(item.lane, record.receipt_handle, outcome.after_s)
        raise AttemptFailed(outcome.reason)
    return Done(report, item, time.monotonic())


def _in_page(page: Page, record: SQSRecord) -> Done:
    with page.message():
        return record_handler(record)


def requeue(lanes: LaneQueue, done: list[tuple[str, Done]]) -> list[str]:
    """Send a fresh copy of each unit to requeue (with the governor booking its outcome names,
    if any; never the one its delivery carried and spent), delayed by what is left of its delay,
    all in one SendMessageBatch per lane; the originals are then deleted as successes. The
    message ids whose copies may not have been sent (SQS failed): redelivered instead."""
    copies = [(mid, d) for mid, d in done if isinstance(d.report.outcome, Requeue)]
    if not copies:
        return []
    now = time.monotonic()
    items, delays = [], []
    for _, d in copies:
        outcome = d.report.outcome
        assert isinstance(outcome, Requeue)
        items.append(replace(d.item, ticket=outcome.ticket))
        # never shorter than asked: the time since the decision is cut down (the lanes round
        # what is left up to SQS's whole seconds)
        delays.append(max(0.0, outcome.delay_s - (now - d.ended)))
    try:
        lanes.send_many(items, delays)
    except Exception:
        logger.exception("requeue failed: the units are redelivered", units=len(items))
        return [mid for mid, _ in copies]
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
    # the drain switch is read per message, cached (SsmDrainSwitch): a batch costs no SSM read
    records = [SQSRecord(raw) for raw in event.get("Records") or []]
    if len(records) > MAX_BATCH:
        raise ValueError(f"{len(records)} records in one batch: SQS delivers at most {MAX_BATCH}")
    _services()  # a cold start builds the wiring once, on this thread, before the messages run
    # the outcomes the messages keep are written together, once each has kept one or ended
    page = Page(len(records))
    running = [_pool.submit(contextvars.copy_context().run, _in_page, page, r) for r in records]
    errors = [future.exception() for future in running]  # waits for every message
    for error in errors:
        if error is not None and not isinstance(error, Exception):
            raise error  # the sandbox itself is going down (a BaseException): the whole batch
    failures: list[str] = []
    done: list[tuple[str, Done]] = []
    for record, future, error in zip(records, running, errors, strict=True):
        if error is None:
            done.append((record.message_id, future.result()))
            add_metrics(future.result().report)
        elif isinstance(error, AttemptFailed):  # a failed attempt: redelivered after its backoff
            failures.append(record.message_id)
        else:  # redelivered after the visibility timeout; the others' outcomes stand
            logger.exception("message failed", message_id=record.message_id, exc_info=error)
            failures.append(record.message_id)
    _, lanes = _services()
    failures += requeue(lanes, done)
    return {"batchItemFailures": [{"itemIdentifier": mid} for mid in failures]}
