"""Worker: an SQS batch from one lane, with partial batch responses.

Per message: the worker loop in :mod:`swarm.service.worker` (drain check, admission of a retry,
governor draw with a bounded wait, claim, model call, settlement), then its outcome on SQS: delete
(success), redeliver after a short backoff (a failed attempt: "retries by redelivery"), or a
delayed copy (backpressure, draining, a throttle: the unit did not run, so no attempt is spent).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
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
from swarm.core.ledger import Fate
from swarm.core.ports import LaneQueue
from swarm.service.worker import Ack, Requeue, RetryLater, Worker
from swarm.wiring import Wiring

logger = Logger()
RECORD_KEYS = ("batch_id", "unit_id", "tenant")
tracer = Tracer()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)

_cache: dict[str, Any] = {}


class AttemptFailed(Exception):
    """Raised for a failed attempt so the batch response lists the message for redelivery."""


def _services() -> tuple[Worker, LaneQueue]:
    if "worker" not in _cache:
        runtime = Wiring.from_env()
        _cache["worker"] = runtime.worker()
        _cache["lanes"] = runtime.lanes()
    return _cache["worker"], _cache["lanes"]


@tracer.capture_method
def record_handler(record: SQSRecord) -> None:
    logger.remove_keys(RECORD_KEYS)  # a record's lines carry its own ids, not the last one's
    item = parse_message_body(record.body)
    logger.append_keys(batch_id=item.run_id, unit_id=item.unit_id, tenant=item.tenant)
    worker, lanes = _services()
    report = worker.process(item)
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
    outcome = report.outcome
    logger.info(
        "unit processed",
        outcome=type(outcome).__name__,
        reason=outcome.reason,
        attempt=report.attempt,
        tokens=report.tokens,
    )
    match outcome:
        case Ack():
            return
        case Requeue(delay_s=delay, ticket=ticket):
            # a fresh copy (with the governor booking the outcome names, if any; never the one
            # this delivery carried and spent); this delivery is deleted as a success
            lanes.send(replace(item, ticket=ticket), delay)
        case RetryLater(after_s=after):
            lanes.change_visibility(item.lane, record.receipt_handle, after)
            raise AttemptFailed(outcome.reason)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # the drain switch is read per message, cached (SsmDrainSwitch): a batch costs no SSM read
    return dict(process_partial_response(event, record_handler, processor, context))
