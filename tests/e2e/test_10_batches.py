"""A full batch, budget exhaustion + resume, and a worker dying mid-unit: all through the API.

Every unit's attempts, fate and billed tokens are computed in advance from the simulated model's
seed (``expected_books``), so the books are checked exactly, retries and dead letters included,
and billed tokens differ from the projections (under, or capped at the reservation).

Timing bounds are the waits' timeouts, each well above what was measured here with the tier
running: the 40-unit batch closes in ~16 s (bound 180 s), each half of the budget scenario in
~5 s (120 s); the crash and the sweeper scenarios wait for a dead worker's message, which
comes back after the lanes' visibility timeout (the local lease, 144 s): ~150 s each (600 s).
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from infra.context import cdk_json_context
from swarm.core.burndown import asked_output, call_output_bound
from swarm.core.codec import parse_message
from swarm.core.pricing import Prices, Usage, cost_micro, unit_cost_bound, usd
from tests.e2e.conftest import (
    TERMINAL,
    Stack,
    assert_books,
    batch_id,
    expected_books,
    fresh_key,
    submit_retrying,
    unit_failing,
    units,
    wait_for,
)

#: the default model's prices (cdk.json models.catalog.haiku.prices): a budget in dollars is
#: priced by them
PRICES = Prices.parse(cdk_json_context()["models"]["catalog"]["haiku"]["prices"])
#: every scenario that checks books runs with a budget in tokens and one in dollars
CURRENCIES = pytest.mark.parametrize("currency", ["tokens", "usd"])


def budget(currency: str, tokens: int, dollars: str) -> dict[str, Any]:
    return {"budget": tokens} if currency == "tokens" else {"budget_usd": Decimal(dollars)}


def call_cost(call: dict[str, Any]) -> int:
    """What one call in the simulated model's log costs at the deployment's prices."""
    usage = Usage(
        call["input_tokens"],
        call["output_tokens"],
        call.get("cache_read_tokens", 0),
        call.get("cache_write_tokens", 0),
    )
    return cost_micro(usage, PRICES)


def billed_micro(seen: dict[str, Any]) -> int:
    """What the model's log of a batch's calls costs, each call rounded up once."""
    return sum(call_cost(c) for c in seen["log"] if not c["throttled"])


def projected_micro(unit: dict[str, Any]) -> int:
    tokens = int(unit["projected_tokens"])
    return unit_cost_bound(tokens, call_output_bound(tokens, asked_output(unit["input"])), PRICES)


def assert_money(final: dict[str, Any], results: dict[str, Any], expected: int) -> None:
    """The books in dollars: the results summary and the status agree, to the micro-dollar."""
    assert results["spent_micro"] == expected
    assert final["usd"]["spent"] == usd(expected)


@CURRENCIES
def test_a_batch_completes_with_exact_books_and_no_fleet_throttles(
    stack: Stack, currency: str
) -> None:
    # Given 40 small units, one that fails once and one that fails every attempt (found from the
    # model's seed), submitted under a known batch id
    model = stack.model()
    seed, rate = int(model["seed"]), float(model["failure_rate"])
    batch = [
        *units(38),
        {"unit_id": unit_failing(seed, rate, "retry", 1), "projected_tokens": 2_000, "input": "r"},
        {
            "unit_id": unit_failing(seed, rate, "dead", None),
            "projected_tokens": 2_000,
            "input": "d",
        },
    ]
    books = expected_books(model, batch)
    assert books.retries >= 3 and len(books.dead) >= 1
    client = stack.client("e2e-batch")

    # When it is submitted through the HTTP API
    key = fresh_key("books")
    doc = client.submit({"units": batch, **budget(currency, 6_000_000, "100")}, idempotency_key=key)
    assert doc["batch_id"] == batch_id("e2e-batch", key)
    final = wait_for(client, doc["batch_id"], timeout_s=180)

    # Then the run completed with exactly the outcomes the seed dictates
    assert final["state"] == "completed", final
    assert final["counts"]["completed"] == len(books.completed)
    assert final["counts"]["dead_lettered"] == len(books.dead)
    assert final["retries"] == books.retries
    results = stack.results(doc["batch_id"], "completed")
    assert_books(books, results)
    assert final["tokens"]["spent"] == books.spent
    # billed tokens are not the projections: some units used less than projected, some hit
    # their reservation's cap, and the books hold what was billed
    projected = sum(u["projected_tokens"] * books.attempts[u["unit_id"]] for u in batch)
    assert books.spent < projected
    seen = stack.model(doc["batch_id"])
    assert any(c["truncated"] for c in seen["log"]) and not all(c["truncated"] for c in seen["log"])
    # the model billed exactly what the ledger settled, every attempt once, and never throttled
    assert seen["tokens_billed"] == results["spent"]
    assert seen["calls"] == final["attempts"] == sum(books.attempts.values())
    assert seen["throttles"] == 0
    # and in dollars: every attempt's usage priced, exactly, whatever the budget's unit
    assert_money(final, results, billed_micro(seen))
    assert results["usd"] is (currency == "usd")


@CURRENCIES
def test_budget_exhaustion_then_resume_after_top_up(stack: Stack, currency: str) -> None:
    client = stack.client("e2e-budget")
    # Given 20 units of 10,000 tokens and a budget for about half of them (in dollars: each
    # may answer with all its tokens, $0.04 at $4.00 per million)
    batch = units(20, "b", lambda i: 10_000)
    assert {projected_micro(u) for u in batch} == {40_000}
    body = {"units": batch, **budget(currency, 105_000, "0.42")}
    doc = client.submit(body)

    # When it runs out of budget
    first = wait_for(client, doc["batch_id"], timeout_s=120)

    # Then it closes as exhausted, partial results intact and the remainder enumerated exactly
    assert first["state"] == "exhausted", first
    counts = first["counts"]
    assert counts["remainder"] > 0 and counts["completed"] > 0
    assert counts["completed"] + counts["dead_lettered"] + counts["remainder"] == 20
    assert len(first["remainder"]) == counts["remainder"]
    # real (billed) tokens, not projections, stayed within the budget
    if currency == "tokens":
        assert first["tokens"]["spent"] <= 105_000
    else:
        assert Decimal(first["usd"]["spent"]) <= Decimal("0.42")
        assert first["usd"]["budget"] == "0.420000"
    assert stack.model(doc["batch_id"])["tokens_billed"] == first["tokens"]["spent"]
    closed = stack.results(doc["batch_id"], "exhausted")
    done_then = {k: u for k, u in closed["units"].items() if u["state"] == "completed"}
    assert sorted(k for k, u in closed["units"].items() if u["state"] == "remainder") == sorted(
        first["remainder"]
    )

    assert_money(first, closed, billed_micro(stack.model(doc["batch_id"])))
    # When topped up and resumed
    if currency == "tokens":
        resumed = client.resume(doc["batch_id"], 400_000)
    else:
        resumed = client.resume(doc["batch_id"], None, Decimal("1.6"))
        assert resumed["usd"]["budget"] == "2.020000"
    assert resumed["requeued"] == counts["remainder"]
    final = wait_for(client, doc["batch_id"], timeout_s=120)

    # Then it completes, and no unit completed before the resume ran again
    assert final["state"] == "completed", final
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 20
    results = stack.results(doc["batch_id"], "completed")
    for unit_id, before in done_then.items():
        assert results["units"][unit_id]["attempts"] == before["attempts"], unit_id
        assert results["units"][unit_id]["tokens"] == before["tokens"], unit_id
    assert_books(expected_books(stack.model(), body["units"]), results)
    assert stack.model(doc["batch_id"])["tokens_billed"] == results["spent"]
    assert_money(final, results, billed_micro(stack.model(doc["batch_id"])))


@pytest.mark.lease_wait
@CURRENCIES
def test_a_worker_dying_mid_unit_is_redelivered_and_settled_once_per_attempt(
    stack: Stack, currency: str
) -> None:
    client = stack.client("e2e-crash")
    batch = units(4, "c")
    victim = batch[1]
    key = fresh_key(f"crash-{currency}")
    # Given the worker that calls the model for one unit of this batch dies before it can
    # settle (the model billed the call)
    armed = {
        "worker_crashes": 1,
        "batch_id": batch_id("e2e-crash", key),
        "unit_id": victim["unit_id"],
    }
    stack.local("POST", "/_local/faults", armed)

    # When the batch runs
    doc = client.submit({"units": batch, **budget(currency, 1_000_000, "10")}, idempotency_key=key)
    final = wait_for(client, doc["batch_id"], timeout_s=600)

    # Then the crash happened, the message came back after its visibility timeout, and the
    # books hold every attempt exactly once, the dead worker's included (settled at its
    # reservation: what it billed is unknown to the books, so the whole reservation counts)
    seen = stack.model(doc["batch_id"])
    assert seen["crashed_workers"] == 1
    assert final["state"] == "completed", final
    results = stack.results(doc["batch_id"], "completed")
    assert results["units"][victim["unit_id"]]["attempts"] >= 2
    assert results["spent"] == sum(u["tokens"] for u in results["units"].values())
    assert seen["calls"] == final["attempts"]
    lost = next(c for c in seen["log"] if c["unit_id"] == victim["unit_id"] and c["attempt"] == 0)
    # the lost attempt is settled at its reservation; the model billed what it used
    assert results["spent"] - seen["tokens_billed"] == victim["projected_tokens"] - lost["tokens"]
    # in dollars alike: the lost attempt at its projected cost, the others as the model billed
    lost_gap = projected_micro(victim) - call_cost(lost)
    assert_money(final, results, billed_micro(seen) + lost_gap)


def test_a_message_sqs_gives_up_on_ends_its_unit_as_dead_lettered_and_the_run_closes(
    stack: Stack,
) -> None:
    """On the low lane, which no other concurrent scenario uses: its workers are paused (its
    event source mapping disabled, as the drain controller does for every lane) so the batch's
    units wait in the queue."""
    client = stack.client("e2e-dlq")
    batch = units(8, "q", lambda i: 10_000)
    sqs, lam = stack.aws("sqs"), stack.aws("lambda")
    urls = sqs.list_queues()["QueueUrls"]
    lane = next(u for u in urls if "LanesLowLane" in u)
    dead_letters = next(u for u in urls if "LanesDeadLetters" in u)
    mapping = next(
        m["UUID"]
        for m in lam.list_event_source_mappings()["EventSourceMappings"]
        if "LanesLowLane" in m["EventSourceArn"] and "Worker" in m["FunctionArn"]
    )
    stack.pause_mapping(mapping)
    try:
        # Given the batch's units wait in their lane
        bid = submit_retrying(client, {"units": batch, "lane": "low", "budget": 1_000_000})[
            "batch_id"
        ]
        moved = None
        deadline = time.monotonic() + 60
        while moved is None and time.monotonic() < deadline:
            for m in sqs.receive_message(QueueUrl=lane, MaxNumberOfMessages=10).get("Messages", []):
                queued = parse_message(m["Body"])  # one unit, or a bundle of units due together
                if moved is None and queued[0].run_id == bid:
                    # When SQS gives up on one of them (after maxReceiveCount receives it moves
                    # the message to the lanes' dead-letter queue; here the test moves it)
                    sqs.send_message(QueueUrl=dead_letters, MessageBody=m["Body"])
                    sqs.delete_message(QueueUrl=lane, ReceiptHandle=m["ReceiptHandle"])
                    moved = [q.unit_id for q in queued]
                else:
                    sqs.change_message_visibility(
                        QueueUrl=lane, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                    )
        assert moved is not None, "no queued message of the batch in the lane"
        # Then the dead-letter handler ends its units (the dead-letter queue's mapping runs)
        dead = len(moved)
        wait_for(client, bid, lambda d: d["counts"]["dead_lettered"] == dead, timeout_s=60)
    finally:
        lam.update_event_source_mapping(UUID=mapping, Enabled=True)
    # And the rest of the batch runs, and the run closes with exact books
    final = wait_for(client, bid, timeout_s=180)
    assert final["state"] == "completed", final
    results = stack.results(bid, "completed")
    seen = stack.model(bid)
    for unit_id in moved:
        assert results["units"][unit_id]["state"] == "dead_lettered"
        assert results["units"][unit_id]["attempts"] == 0
        assert not [c for c in seen["log"] if c["unit_id"] == unit_id]
    completed = {k for k, u in results["units"].items() if u["state"] == "completed"}
    assert completed == {u["unit_id"] for u in batch} - set(moved)
    assert results["spent"] == seen["tokens_billed"]


def in_callback(sfn: Any, arn: str) -> bool:
    """The execution is RUNNING and its latest event is a callback task's submission: it waits
    for its task token (the finalize loop's Poll)."""
    if sfn.describe_execution(executionArn=arn)["status"] != "RUNNING":
        return False
    events = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    last = events[-1] if events else {}
    details = last.get("taskSubmittedEventDetails") or {}
    return last.get("type") == "TaskSubmitted" and str(details.get("resource", "")).endswith(
        ".waitForTaskToken"
    )


def stop_in_callback(sfn: Any, arn: str, timeout_s: float = 120) -> None:
    """Stop the execution while it waits in a callback task, and wait until it really is
    ABORTED. moto's interpreter honours a stop between states and inside a callback's wait; a
    stop that lands elsewhere (the map, a Lambda task) takes effect only when that step ends,
    so the execution may go on running: the stop is repeated at the next callback (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = sfn.describe_execution(executionArn=arn)["status"]
        if status == "ABORTED":
            return
        assert status == "RUNNING", f"{arn} ended {status} before it was stopped"
        assert time.monotonic() < deadline, f"{arn} never stopped in a callback: {status}"
        if in_callback(sfn, arn):
            sfn.stop_execution(executionArn=arn, cause="e2e: killed")
            stopped = time.monotonic() + 10
            while time.monotonic() < stopped:
                if sfn.describe_execution(executionArn=arn)["status"] != "RUNNING":
                    break
                time.sleep(0.2)
            continue
        time.sleep(0.1)


@pytest.mark.lease_wait
def test_a_run_whose_execution_died_is_restarted_by_the_sweeper_and_completes(
    stack: Stack,
) -> None:
    client = stack.client("e2e-sweep")
    batch = units(10, "w", lambda i: 10_000)
    victim = batch[3]["unit_id"]
    key = fresh_key("sweep")
    bid = batch_id("e2e-sweep", key)
    # Given a unit whose worker dies before it settles: its message comes back only after the
    # lanes' visibility timeout (the local lease, far longer than the sweeper's 30 s grace), so
    # the run is still open when the sweeper looks, whatever the machine's speed
    stack.local("POST", "/_local/faults", {"worker_crashes": 1, "batch_id": bid, "unit_id": victim})
    doc = client.submit({"units": batch, "budget": 2_000_000}, idempotency_key=key)
    assert doc["batch_id"] == bid
    sfn = stack.aws("stepfunctions")
    machine = stack.fanout_machine()

    def executions() -> dict[str, dict[str, Any]]:
        listed = sfn.list_executions(stateMachineArn=machine, maxResults=1000)["executions"]
        return {e["name"]: e for e in listed if e["name"].startswith(bid)}

    # When the batch's execution dies while it waits in its finalize loop's callback (the Poll
    # task holding its task token, where an execution spends its run), stopped as a timeout or
    # an operator would, and really is ABORTED
    stop_in_callback(sfn, executions()[bid]["executionArn"])
    assert client.status(bid)["state"] not in TERMINAL

    # Then the scheduled sweeper finds the open run without a live execution (after its grace,
    # 30 s here) and restarts it as <batch>-r1, and the run completes with exact books,
    # announced by the restarted execution
    final = wait_for(client, bid, timeout_s=600)
    assert final["state"] == "completed", final
    names = executions()
    assert names[bid]["status"] == "ABORTED"
    assert f"{bid}-r1" in names, sorted(names)
    print(f"sweeper repair of {bid}: executions {sorted(names)}")
    results = stack.results(bid, "completed")
    assert {k for k, u in results["units"].items() if u["state"] == "completed"} == {
        u["unit_id"] for u in batch
    }
    assert results["units"][victim]["attempts"] >= 2
    assert results["spent"] == sum(u["tokens"] for u in results["units"].values())
    assert stack.model(bid)["crashed_workers"] == 1


def test_the_bill_prices_each_function_at_its_templates_architecture(stack: Stack) -> None:
    """moto's CloudFormation ignores a function's Architectures: the local stack takes the
    template's (arm64), so the bill charges an Arm GB-second, not an x86 one."""
    # a batch of its own runs the worker (whatever ran before it, or did not)
    client = stack.client("e2e-bill")
    doc = submit_retrying(client, {"units": units(2, "p"), "budget": 100_000})
    assert wait_for(client, doc["batch_id"], timeout_s=120)["state"] == "completed"
    uses = stack.local("GET", "/_local/bill")["lambda"]
    # every function invoked since the bill's last reset
    assert "worker" in uses
    assert {name: use["architecture"] for name, use in uses.items()} == dict.fromkeys(uses, "arm64")
