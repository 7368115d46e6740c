"""The work's product through the API: every completed unit has exactly one output, the model's.

One batch goes through failures and retries (from the model's seed), a worker dying after the
model answered (its answer is lost with it), a duplicate delivery, exhaustion and a resume; its
outputs are then compared with the simulated model's own log of what it answered to each attempt.

Timing bounds are the waits' timeouts, well above what was measured here with the tier running
(each half of the batch closes in under 15 s).
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from swarm.client import ApiError, Client
from swarm.core.codec import message_body
from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane
from swarm.local.events import sqs_event
from tests.e2e.conftest import (
    Stack,
    batch_id,
    expected_books,
    fresh_key,
    unit_failing,
    units,
    wait_for,
)


def pages(client: Client, batch: str, state: str | None = None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    token = None
    while True:
        page = client.results(batch, state=state, limit=7, next_token=token)
        found += page["units"]
        token = page.get("next_token")
        if token is None:
            return found


def deliver_again(stack: Stack, unit: QueuedUnit) -> dict[str, Any]:
    """SQS delivers a unit's message once more: the worker function gets it, as its event source
    mapping would hand it over, and answers before this returns."""
    lam = stack.aws("lambda")
    worker = next(
        f["FunctionName"]
        for f in lam.list_functions()["Functions"]
        if "WorkerFunction" in f["FunctionName"]
    )
    sqs = stack.aws("sqs")
    url = next(u for u in sqs.list_queues()["QueueUrls"] if "LanesHighLane" in u)
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    message = {"MessageId": "duplicate-1", "ReceiptHandle": "duplicate", "Body": message_body(unit)}
    event = sqs_event(arn["QueueArn"], [message], stack.target.region)
    answer = lam.invoke(FunctionName=worker, Payload=json.dumps(event).encode())
    doc: dict[str, Any] = json.loads(answer["Payload"].read())
    return doc


@pytest.mark.lease_wait
def test_every_completed_unit_keeps_exactly_the_output_the_model_gave_its_successful_attempt(
    stack: Stack,
) -> None:
    model = stack.model()
    seed, rate = int(model["seed"]), float(model["failure_rate"])
    tenant, key = "e2e-results", fresh_key("outputs")
    bid = batch_id(tenant, key)
    retried = unit_failing(seed, rate, "retry", 1)
    batch = [
        *units(14, "o", lambda i: 10_000),
        {"unit_id": retried, "projected_tokens": 10_000, "input": "fails once, then answers"},
    ]
    books = expected_books(model, batch)
    assert not books.dead and books.attempts[retried] == 2  # the seed's outcomes, known ahead
    victim = batch[3]["unit_id"]
    # Given a worker will die after the model answered one unit (the answer dies with it)
    stack.local("POST", "/_local/faults", {"worker_crashes": 1, "batch_id": bid, "unit_id": victim})
    client = stack.client(tenant)

    # When the batch runs out of budget half-way
    client.submit({"units": batch, "budget": 80_000, "lane": "high"}, idempotency_key=key)
    # (the dead worker's claim holds the closure until its lease, 144 s locally, runs out)
    first = wait_for(client, bid, timeout_s=300)
    assert first["state"] == "exhausted", first
    # Then its partial results are readable: completed units have their outputs
    partial = {u["unit_id"]: u for u in pages(client, bid)}
    done_then = {k: u["output"] for k, u in partial.items() if u["state"] == "completed"}
    assert done_then and {u["state"] for u in partial.values()} <= {"completed", "remainder"}
    assert [u["unit_id"] for u in pages(client, bid, "remainder")] == sorted(first["remainder"])

    # When it is resumed, and then a completed unit's message is delivered once more
    client.resume(bid, 1_000_000)
    final = wait_for(client, bid, timeout_s=180)
    assert final["state"] == "completed", final
    again = next(iter(done_then))
    duplicate = QueuedUnit(bid, again, tenant, Lane.HIGH, 0, 10_000, "a duplicate")
    assert deliver_again(stack, duplicate) == {"batchItemFailures": []}  # acknowledged

    # Then every completed unit has exactly one output: what the model answered to the attempt
    # that completed it, which resuming and the duplicate did not change
    seen = stack.model(bid)
    assert seen["crashed_workers"] == 1
    answered = {(c["unit_id"], c["attempt"]): c for c in seen["log"] if not c["throttled"]}
    results = pages(client, bid)
    assert sorted(u["unit_id"] for u in results) == sorted(u["unit_id"] for u in batch)
    for unit in results:
        assert unit["state"] == "completed", unit
        call = answered[(unit["unit_id"], unit["attempt"])]
        assert call["succeeded"] and unit["output"] == call["output"] != ""
        billed = [c for (uid, _), c in answered.items() if uid == unit["unit_id"]]
        if unit["unit_id"] == victim:  # the lost attempt is settled at its reservation
            (lost,) = [c for c in billed if c["attempt"] < unit["attempt"] and c["succeeded"]]
            assert unit["tokens"] == sum(c["tokens"] for c in billed) - lost["tokens"] + 10_000
        else:
            assert unit["tokens"] == sum(c["tokens"] for c in billed)
    by_id = {u["unit_id"]: u for u in results}
    assert {k: by_id[k]["output"] for k in done_then} == done_then
    assert by_id[retried]["attempt"] == 1  # its first attempt failed
    assert by_id[victim]["attempt"] >= 1  # the dying worker's attempt was settled as lost

    # And the closed batch's results file, downloaded from its short-lived link, says the same
    # (the finalizer writes it within a poll of the closure: 1 s locally)
    deadline = time.monotonic() + 30
    page = client.results(bid, state=None, limit=1, next_token=None)
    while "download" not in page and time.monotonic() < deadline:
        time.sleep(0.5)
        page = client.results(bid, state=None, limit=1, next_token=None)
    download = page["download"]
    with urllib.request.urlopen(download["url"], timeout=30) as answer:
        lines = [json.loads(line) for line in answer.read().splitlines()]
    assert lines == results

    # And another tenant cannot read them (the same 404 as for a batch that does not exist)
    with pytest.raises(ApiError) as refused:
        stack.client("e2e-other").results(bid, state=None, limit=10, next_token=None)
    assert refused.value.status == 404
