"""Drain controller: on a change of the drain parameter (EventBridge), enable or disable the
workers' event source mappings, and report what is still in flight (safe to deploy at 0)."""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools import Tracer
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.service.drain import DrainController
from swarm.wiring import Wiring

logger = service_logger()
tracer = Tracer()
_cache: dict[str, DrainController] = {}


def controller() -> DrainController:
    if "controller" not in _cache:
        _cache["controller"] = Wiring.from_env().drain_controller()
    return _cache["controller"]


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = controller().apply(time.time())
    logger.info("drain applied", **report)
    return report
