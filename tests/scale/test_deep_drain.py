"""A drain under a queue far deeper than SQS delays a message, on the local stack.

A unit whose place in its tenant's queue is further than 900 s (on the deployed clock) waits
with its message hidden in its lane, for up to 12 hours: queued work, which the drain must not
wait for. The scenario: a tenant's batch deep enough that some of its messages are hidden; a
second tenant's batch whose model calls are held (armed for its id before it is submitted), so
units run by construction while the operator drains; `swarm drain on --wait` (its wait,
:func:`swarm.cli.ops.wait_for_drain`) holds while they run and returns once they settle, with
the deep batch still queued; a redeploy of the stack in place (``POST /_local/redeploy``); the
drain off; and every unit of both batches completes with exact books (nothing lost, nothing run
twice, no attempt spent by the drain).

Timing (stack at time scale 10): the deep batch is 120 units of 100k tokens, 12M tokens against
a bucket of 3M refilled at 47.5k tokens/s: ~190 s of queue on the local clock (~1,900 s
deployed), its last ~45 units placed past 90 s local (900 s deployed). Its messages are first
sent delayed 90 s and hidden at their first receive, so the drain starts ~95 s after the submit;
the whole scenario takes ~4-5 minutes, so it is a scale-tier scenario (`make test-scale`, on the
second stack beside the 10,000-unit batch); `make test` keeps the CLI's drain scenario
(tests/e2e/test_30_cli.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from swarm.cli.ops import wait_for_drain
from swarm.client import ApiError
from tests.e2e.conftest import (
    Stack,
    assert_books,
    batch_id,
    expected_books,
    fresh_key,
    units,
    wait_for,
)

pytestmark = [pytest.mark.slow]

DEEP_UNITS, DEEP_TOKENS = 120, 100_000
HIDDEN_AT_LEAST = 5  # messages hidden in the normal lane before the drain starts
COMPLETE_S = 600.0  # both batches complete after the drain off (measured: ~200 s)


def not_visible(stack: Stack, tenant: str) -> int:
    """The normal lane's messages not visible: received, or hidden until their turn."""
    return int(stack.client(tenant).fleet()["lanes"]["normal"]["in_flight"])


def test_a_drain_waits_for_running_units_only_however_deep_the_queue(stack: Stack) -> None:
    deep_tenant, held_tenant = "drain-deep", "drain-held"
    deep, held = stack.client(deep_tenant), stack.client(held_tenant)
    deep_units = units(DEEP_UNITS, "deep", lambda i: DEEP_TOKENS)
    held_units = units(3, "held", lambda i: 2_000)
    held_key = fresh_key("drain-held")
    held_id = batch_id(held_tenant, held_key)

    # Given a batch whose queue is far deeper than SQS delays a message
    budget = 3 * DEEP_UNITS * DEEP_TOKENS  # every retry covered
    body = {"units": deep_units, "budget": budget, "lane": "normal"}
    deep_id = submit_keyed(deep, body, fresh_key("drain-deep"))
    # ... some of whose messages now wait hidden in their lane (their first receive, once their
    # 900 s delay has passed, hid them until their places)
    deadline_s = 240.0
    waited = threading.Event()
    while not_visible(stack, deep_tenant) < HIDDEN_AT_LEAST:
        assert not waited.wait(1.0) and (deadline_s := deadline_s - 1.0) > 0, "nothing hidden"
    assert deep.status(deep_id)["state"] == "open"

    # And another tenant's units running, by construction: their model calls are held
    stack.local("POST", "/_local/faults", {"batch_id": held_id, "hold": True})
    result: dict[str, Any] = {}
    waiter: threading.Thread | None = None
    try:
        assert submit_keyed(held, {"units": held_units}, held_key) == held_id
        wait_for(held, held_id, lambda d: stack.model(held_id)["held_calls"] >= 1, timeout_s=120)

        # When the operator drains and waits (`swarm drain on --wait`)
        deep.set_drain(True)

        def wait() -> None:
            result["safe"], result["doc"] = wait_for_drain(deep, 240.0, 0.5)
            result["hidden"] = not_visible(stack, deep_tenant)
            result["deep"] = deep.status(deep_id)

        waiter = threading.Thread(target=wait, name="drain-wait", daemon=True)
        waiter.start()
        # Then, the switch settled, the wait holds while the held units run
        doc = wait_for_settled(deep)
        assert doc["running"] >= 1 and not doc["safe_to_deploy"], doc
        assert doc["queued"] >= HIDDEN_AT_LEAST, doc  # the hidden messages count as queued
        assert waiter.is_alive()
        status = held.status(held_id)["counts"]
        assert status["running"] >= 1 and status["completed"] == 0, status

        # When the held units are let go
        stack.local("POST", "/_local/faults", {"batch_id": held_id, "release": True})
        waiter.join(timeout=240.0)
        assert not waiter.is_alive(), "drain on --wait never returned"
        # Then it returned safe to deploy while the deep queue was still there: its messages
        # hidden, its units queued, none of them running
        assert result["safe"] is True and result["doc"]["running"] == 0, result
        assert result["doc"]["queued"] >= HIDDEN_AT_LEAST, result
        assert result["hidden"] >= HIDDEN_AT_LEAST, result
        counts = result["deep"]["counts"]
        assert result["deep"]["state"] == "open" and counts["queued"] > 0, result["deep"]

        # When the stack is redeployed in place, then the drain goes off
        stack.local("POST", "/_local/redeploy")
        deep.set_drain(False)
    finally:
        stack.local("POST", "/_local/faults", {"batch_id": held_id, "release": True})
        deep.set_drain(False)
        if waiter is not None:
            waiter.join(timeout=240.0)

    # Then every unit of both batches completes across it, with exact books
    model = stack.model()
    for client, bid, batch in ((held, held_id, held_units), (deep, deep_id, deep_units)):
        wait_for(client, bid, timeout_s=COMPLETE_S, interval_s=2.0)
        assert_books(expected_books(model, batch), stack.results(bid, "completed", 60))


def submit_keyed(client: Any, body: dict[str, Any], key: str, attempts: int = 30) -> str:
    """Submit with an Idempotency-Key, honouring 429/503 Retry-After (bounded: an earlier
    exclusive scenario's quota storm can leave the stack shedding for a minute); the batch id."""
    for _ in range(attempts):
        try:
            return str(client.submit(body, idempotency_key=key)["batch_id"])
        except ApiError as e:
            if e.status not in (429, 503):
                raise
            time.sleep(min(5, e.retry_after or 1))
    raise AssertionError("submission kept being refused")


def wait_for_settled(client: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    """The drain view once the switch is on and has reached every function's cache."""
    done = threading.Event()
    while True:
        doc: dict[str, Any] = client.drain_status()
        if doc["draining"] and doc["settled"]:
            return doc
        assert not done.wait(0.25) and (timeout_s := timeout_s - 0.25) > 0, doc
