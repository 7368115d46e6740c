"""Sweeper (an EventBridge schedule): repair runs whose execution died. For each watched run
that is due: leave it when an execution of it is running; otherwise sweep its leases and announce
it when it is closed, or restart its execution (the open step when its open never finished, the
map, or the finalize loop only)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.contract import (
    METRIC_RUNS_COMPLETED,
    METRIC_RUNS_EXHAUSTED,
    METRIC_RUNS_REPAIRED,
    METRIC_SWEEP_ERRORS,
)
from swarm.service.sweeper import Sweeper, Verdict
from swarm.wiring import Wiring

logger = service_logger()
tracer = Tracer()
metrics = Metrics()
_cache: dict[str, Sweeper] = {}

#: stop taking new runs this long before the function's timeout (one run's repair fits in it)
MARGIN_S = 30.0


def sweeper() -> Sweeper:
    if "sweeper" not in _cache:
        _cache["sweeper"] = Wiring.from_env().sweeper()
    return _cache["sweeper"]


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000.0 - MARGIN_S
    report = sweeper().sweep(time.time(), out_of_time=lambda: time.monotonic() > deadline)
    for swept in report.swept:
        if swept.verdict in (Verdict.OPEN, Verdict.FAN_OUT, Verdict.FINALIZE_LOOP):
            logger.warning(
                "restarted a run whose execution died",
                batch_id=swept.run_id,
                verdict=swept.verdict.value,
                execution=swept.execution,
            )
        elif swept.verdict is Verdict.ANNOUNCED:
            logger.warning("closed a run whose execution died", batch_id=swept.run_id)
            if swept.announced:
                completed = swept.state == "completed"
                name = METRIC_RUNS_COMPLETED if completed else METRIC_RUNS_EXHAUSTED
                metrics.add_metric(name, MetricUnit.Count, 1)
        elif swept.verdict is Verdict.ERROR:
            logger.error("could not sweep a run", batch_id=swept.run_id, error=swept.error)
    repaired = sum(report.count(v) for v in (Verdict.OPEN, Verdict.FAN_OUT, Verdict.FINALIZE_LOOP))
    metrics.add_metric(METRIC_RUNS_REPAIRED, MetricUnit.Count, repaired)
    metrics.add_metric(METRIC_SWEEP_ERRORS, MetricUnit.Count, report.count(Verdict.ERROR))
    summary = report.as_dict()
    logger.info("sweep", **summary)
    return summary
