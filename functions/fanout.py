"""Fan-out step (the Distributed Map's item processor): admit a chunk's units, then enqueue the
admitted ones (SendMessageBatch).

Event: ``{"batch_id": ..., "index": n, "chunk": {"run_id": ..., "units": [...]}}`` (the ASL's
ItemSelector; swarm.service.batches.map_child_input). A refused admission is not an error: the
unit joins the remainder and the run starts exhausting. The tenant, lane and budget are the
ledger's (the run's spec), never the item's; an item of another batch is refused.
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.service.fanout import FanOut
from swarm.wiring import Wiring

logger = service_logger()
tracer = Tracer()
_cache: dict[str, FanOut] = {}


def fanout() -> FanOut:
    if "fanout" not in _cache:
        _cache["fanout"] = Wiring.from_env().fanout()
    return _cache["fanout"]


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    chunk = event["chunk"]
    logger.append_keys(batch_id=event.get("batch_id"), chunk=event.get("index"))
    result = fanout().admit_and_enqueue_chunk(chunk, time.time(), batch_id=event["batch_id"])
    logger.info("fan-out", units=len(result["units"]), counts=result["counts"])
    return result
