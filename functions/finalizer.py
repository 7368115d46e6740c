"""Finalizer: the state machine's finalize loop (statemachines/fanout.asl.json).

``{"action": "poll", "batch_id", "execution_arn", "polls", "max_polls", "wait_seconds",
"task_token"}`` (the ``Poll`` task, which waits for its token): sweep expired leases (stopping
``MARGIN_S`` before the function's timeout, and once it has used ``POLL_SWEEP_SHARE`` of the
task's ``wait_seconds``: the next poll goes on), then keep the token for whoever
closes the run (:meth:`swarm.service.finalizer.Finalizer.poll`) and return: the task waits until
the closing worker hands the token back, or times out and polls again. A run closed already
raises :class:`RunClosed`, and an execution that has polled ``max_polls`` times raises
:class:`PollLimit` (it continues as a new execution before its history's limit): the
definition catches both by name.

``{"batch_id"}`` (``Close``): on closure write the results and the remainder manifest and
publish ``run.completed`` / ``run.exhausted``; returns ``closed`` and ``writing``. A closure's
results file too long for one invocation stops ``MARGIN_S`` before the function's timeout,
answering ``closed: false`` and ``writing: true``: the loop calls again, which goes on writing it.

Its other action, ``{"action": "open", "batch_id", "spec_key", "cursor"}`` (the state machine's
first step, ``OpenUnits``): write the next page of a run's unit records
(:class:`swarm.service.opener.Opener`), stopping ``MARGIN_S`` before the function's timeout;
returns ``{"cursor", "done", "units"}``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from aws_lambda_powertools import Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from functions import service_logger
from swarm.contract import METRIC_RUNS_COMPLETED, METRIC_RUNS_EXHAUSTED
from swarm.service.finalizer import Finalizer
from swarm.service.opener import Opener
from swarm.wiring import Wiring

logger = service_logger()
tracer = Tracer()
metrics = Metrics()
_cache: dict[str, Finalizer | Opener] = {}  # the wiring (one dict: the local stack resets it)

W = TypeVar("W", Finalizer, Opener)

#: the open step stops writing pages, and a closure its results file's parts, this long before
#: the function's timeout (one page of 25 takes milliseconds, a part of the results file seconds;
#: the margin covers the books' update, a throttled page's backoff, the file's saved progress)
MARGIN_S = 60.0

#: a poll's sweep stops once it has used this share of the poll task's timeout (``wait_seconds``,
#: fanout.finalizer_max_poll_seconds), which counts from the task's start, this invocation
#: included: a poll still running at its task's timeout loses its answer (a run it found closed
#: is written only by a later poll that ends in time), and the next poll sweeps beside it
POLL_SWEEP_SHARE = 0.5


def keep_going(context: LambdaContext, within_s: float | None = None) -> Callable[[], bool]:
    """True until ``MARGIN_S`` before the invocation's timeout, and for at most ``within_s``."""
    budget = context.get_remaining_time_in_millis() / 1000.0 - MARGIN_S
    if within_s is not None:
        budget = min(budget, within_s)
    deadline = time.monotonic() + budget
    return lambda: time.monotonic() < deadline


def _wired(name: str, kind: type[W], build: Callable[[Wiring], W]) -> W:
    """The service ``name``, built from the environment once per container."""
    if name not in _cache:
        _cache[name] = build(Wiring.from_env())
    found = _cache[name]
    assert isinstance(found, kind)
    return found


def finalizer() -> Finalizer:
    return _wired("finalizer", Finalizer, Wiring.finalizer)


def opener() -> Opener:
    return _wired("opener", Opener, Wiring.opener)


class RunClosed(Exception):
    """The run is closed: the loop writes its closure (the definition catches this name)."""


class PollLimit(Exception):
    """The execution polled as often as its history allows: it continues as a new execution
    (the definition catches this name)."""


def poll(
    event: dict[str, Any], batch_id: str, execution: str | None, context: LambdaContext
) -> dict[str, Any]:
    polls, limit = int(event.get("polls", 0)), int(event["max_polls"])
    if polls >= limit:
        raise PollLimit(f"{polls} polls of at most {limit}: continue as a new execution")
    token = str(event["task_token"])
    # (an execution started by an earlier definition passes no wait_seconds)
    wait_s = event.get("wait_seconds")
    sweeping = keep_going(context, None if wait_s is None else POLL_SWEEP_SHARE * float(wait_s))
    closed = finalizer().poll(batch_id, time.time(), token, execution, sweeping)
    logger.info("poll", closed=closed, polls=polls)
    if closed:
        raise RunClosed(f"run {batch_id} is closed")
    return {"run_id": batch_id, "waiting": True}


def open_units(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    result = opener().open(
        str(event["batch_id"]),
        str(event["spec_key"]),
        int(event.get("cursor", 0)),
        time.time(),
        keep_going=keep_going(context),
    )
    logger.info("open", **result)
    return result


@logger.inject_lambda_context(clear_state=True)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    batch_id = str(event["batch_id"])
    logger.append_keys(batch_id=batch_id)
    if event.get("action") == "open":
        return open_units(event, context)
    # an execution's first poll records it as the one finalizing the run (for the sweeper)
    execution = None
    if event.get("polls") == 0 and event.get("execution_arn"):
        execution = str(event["execution_arn"]).rsplit(":", 1)[-1]
    if event.get("action") == "poll":
        return poll(event, batch_id, execution, context)
    result = finalizer().finalize(
        batch_id, time.time(), execution=execution, keep_going=keep_going(context)
    )
    if result["closed"] and result.get("announced"):
        name = METRIC_RUNS_COMPLETED if result["state"] == "completed" else METRIC_RUNS_EXHAUSTED
        metrics.add_metric(name, MetricUnit.Count, 1)
    logger.info("finalize", **result)
    return result
