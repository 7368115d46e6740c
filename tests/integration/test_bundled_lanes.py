"""Bundles on moto, through the real handlers with their roles: units due together travel as one
lane message and run in one worker invocation, one outcome page for them all; a bundle whose
invocations died is split, so a unit that kills its sandbox reaches the dead-letter queue alone
and the others of its bundle complete."""

from __future__ import annotations

from typing import Any

import pytest

import functions.worker as worker_handler
from swarm.core.codec import parse_message
from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane, RunState
from tests.integration.plane import ControlPlane, ledger, units


def test_units_due_together_run_in_one_invocation_with_one_outcome_page(
    plane: ControlPlane,
) -> None:
    # Given four units fanned out on the normal lane, due within the bundling window
    _, doc, _ = plane.api("POST", "/batches", {"units": units(4)})
    batch_id = doc["batch_id"]
    plane.run_state_machine()
    # Then they are one message
    [message] = plane.receive(Lane.NORMAL)
    bundle = parse_message(message["Body"])
    assert sorted(u.unit_id for u in bundle) == [f"u{i:04d}" for i in range(4)]
    # When one worker invocation gets it
    pages_before = _pages(plane, batch_id)
    assert plane.deliver(Lane.NORMAL, [message]) == {"batchItemFailures": []}
    # Then every unit completed at its first attempt, its outcome in one page written for all
    run = ledger(plane).run(batch_id)
    assert (run.completed, run.state) == (4, RunState.COMPLETED)
    assert len(_pages(plane, batch_id)) - len(pages_before) == 1
    keys = {u.outcome_key for u in ledger(plane).units(batch_id)}
    assert len(keys) == 1 and None not in keys
    assert plane.receive(Lane.NORMAL) == []  # and the message is gone


def _pages(plane: ControlPlane, batch_id: str) -> list[str]:
    """The run's outcome pages (swarm.core.results.page_key: one level under attempts/)."""
    prefix = f"results/{batch_id}/attempts/"
    listing = plane.client("s3").list_objects_v2(Bucket=plane.bucket, Prefix=prefix)
    keys = [o["Key"] for o in listing.get("Contents", [])]
    return [k for k in keys if "/" not in k.removeprefix(prefix)]


class SandboxDied(BaseException):
    """The worker's sandbox going down (out of memory, a timeout) while a unit runs."""


def test_a_unit_that_kills_its_sandbox_reaches_the_dead_letter_queue_alone(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a bundle of four units, one of which kills the worker's sandbox whenever it runs,
    # and every unit of the invocation with it
    _, doc, _ = plane.api("POST", "/batches", {"units": units(4)})
    batch_id = doc["batch_id"]
    plane.run_state_machine()
    with plane.running("worker"):
        worker, *_ = worker_handler._services()
    process = worker.process
    delivered: set[str] = set()  # the units of the message being delivered

    def poisoned(
        item: QueuedUnit,
        first_delivery: bool = True,
        invocation: Any = None,
        deadline: float | None = None,
    ) -> Any:
        if "u0002" in delivered:
            raise SandboxDied(item.unit_id)
        return process(item, first_delivery, invocation, deadline)

    monkeypatch.setattr(worker, "process", poisoned)
    # When the lane's mapping delivers one message at a time, a message whose sandbox died
    # coming back (nothing deleted), until SQS moves what keeps failing to the DLQ
    deliveries = bundles_seen = 0
    while messages := plane.receive(Lane.NORMAL, max_messages=1):
        deliveries += 1
        assert deliveries < 40, "the lane never drained"
        units_in = parse_message(messages[0]["Body"])
        bundles_seen += len(units_in) > 1
        delivered.clear()
        delivered.update(u.unit_id for u in units_in)
        try:
            plane.deliver(Lane.NORMAL, messages)
        except SandboxDied:  # a function error: the mapping deletes nothing
            plane.client("sqs").change_message_visibility(
                QueueUrl=plane.queue_urls[Lane.NORMAL],
                ReceiptHandle=messages[0]["ReceiptHandle"],
                VisibilityTimeout=0,
            )
    # Then the bundle came three times (its first two invocations died with it; the third
    # split it, each unit alone), and only the poison unit reached the dead-letter queue: the
    # others completed (unsplit, the bundle would have taken all four there)
    assert bundles_seen == 3
    dead = plane.receive(Lane.NORMAL, dlq=True)
    assert [[u.unit_id for u in parse_message(m["Body"])] for m in dead] == [["u0002"]]
    plane.deliver(Lane.NORMAL, dead, dlq=True)
    run = ledger(plane).run(batch_id)
    assert (run.completed, run.dead_lettered, run.state) == (3, 1, RunState.COMPLETED)
    attempts = ledger(plane).attempts(batch_id)
    assert sorted(a.unit_id for a in attempts) == ["u0000", "u0001", "u0003"]  # each once
    assert run.spent == sum(a.tokens for a in attempts)
