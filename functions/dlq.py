"""Dead-letter handler: messages SQS gave up on (maxReceiveCount) end their units (one, or a
bundle's: swarm.core.lanes.bundle) as dead-lettered, settling a claimed attempt first, so the run
can still close and its books stay exact."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.contract import METRIC_UNITS_DEAD_LETTERED
from swarm.core.codec import parse_message
from swarm.core.errors import InvalidInput, NotFound
from swarm.core.ports import Closures, Ledger
from swarm.service.finalizer import dead_letter
from swarm.wiring import Wiring

logger = service_logger()
RECORD_KEYS = ("batch_id", "unit_id", "tenant")
tracer = Tracer()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.SQS)
_cache: dict[str, Any] = {}


def ledger() -> Ledger:
    if "ledger" not in _cache:
        runtime = Wiring.from_env()
        _cache["ledger"] = runtime.ledger()
        _cache["closures"] = runtime.closures()  # a dead letter may close its run
    ledger: Ledger = _cache["ledger"]
    return ledger


def closures() -> Closures:
    ledger()
    found: Closures = _cache["closures"]
    return found


@tracer.capture_method
def record_handler(record: SQSRecord) -> None:
    logger.remove_keys(RECORD_KEYS)  # a record's lines carry its own ids, not the last one's
    try:
        units = parse_message(record.body)  # one unit, or a bundle's
    except InvalidInput as e:  # nothing to settle: keep the evidence in the logs and drop it
        # never the body: it may carry a tenant's prompt; the message id finds it in the DLQ's
        # own retention if someone must look
        logger.error(
            "malformed dead letter dropped",
            error=str(e),
            message_id=record.message_id,
            body_bytes=len(record.body.encode()),
        )
        return
    for item in units:
        logger.append_keys(batch_id=item.run_id, unit_id=item.unit_id, tenant=item.tenant)
        try:
            state = dead_letter(ledger(), item, time.time(), closures())
        except NotFound:
            logger.error("dead letter for an unknown run or unit dropped")
            continue
        metrics.add_metric(METRIC_UNITS_DEAD_LETTERED, MetricUnit.Count, 1)
        logger.warning("unit dead-lettered by the queue", state=state.value)


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return dict(process_partial_response(event, record_handler, processor, context))
