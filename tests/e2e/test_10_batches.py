"""A full batch, budget exhaustion + resume, and a worker dying mid-unit: all through the API."""

from __future__ import annotations

from tests.e2e.conftest import Stack, units, wait_for


def test_a_200_unit_batch_completes_with_exact_books_and_no_fleet_throttles(stack: Stack) -> None:
    # Given the model plane's counters before the batch
    client = stack.client("e2e-batch")
    before = stack.model()

    # When 200 seed-like units are submitted through the HTTP API
    doc = client.submit({"units": units(200), "budget": 6_000_000})
    final = wait_for(client, doc["batch_id"], timeout_s=300)

    # Then every unit completed, and the ledger's spend is every attempt's tokens
    assert final["state"] == "completed", final
    assert final["counts"]["completed"] == 200
    results = stack.results(doc["batch_id"], "completed")
    assert len(results["units"]) == 200
    assert results["spent"] == sum(u["tokens"] for u in results["units"].values())
    assert final["tokens"]["spent"] == results["spent"]
    assert final["attempts"] == sum(u["attempts"] for u in results["units"].values())
    # the model billed exactly what the ledger settled: every attempt once
    after = stack.model()
    assert after["tokens_billed"] - before["tokens_billed"] == results["spent"]
    assert after["calls"] - before["calls"] == final["attempts"]
    # and the governor kept the fleet under the model's quota: no throttles caused by us
    assert after["throttles"] == before["throttles"]


def test_budget_exhaustion_then_resume_after_top_up(stack: Stack) -> None:
    client = stack.client("e2e-budget")
    # Given 20 units of 10,000 tokens and a budget for about half of them
    body = {"units": units(20, "b", lambda i: 10_000), "budget": 105_000}
    doc = client.submit(body)

    # When it runs out of budget
    first = wait_for(client, doc["batch_id"], timeout_s=180)

    # Then it closes as exhausted, partial results intact and the remainder enumerated exactly
    assert first["state"] == "exhausted", first
    counts = first["counts"]
    assert counts["remainder"] > 0 and counts["completed"] > 0
    assert counts["completed"] + counts["dead_lettered"] + counts["remainder"] == 20
    assert len(first["remainder"]) == counts["remainder"]
    assert first["tokens"]["spent"] <= 105_000
    closed = stack.results(doc["batch_id"], "exhausted")
    done_then = {k: u for k, u in closed["units"].items() if u["state"] == "completed"}
    assert sorted(k for k, u in closed["units"].items() if u["state"] == "remainder") == sorted(
        first["remainder"]
    )

    # When topped up and resumed
    resumed = client.resume(doc["batch_id"], 400_000)
    assert resumed["requeued"] == counts["remainder"]
    final = wait_for(client, doc["batch_id"], timeout_s=180)

    # Then it completes, and no unit completed before the resume ran again
    assert final["state"] == "completed", final
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 20
    results = stack.results(doc["batch_id"], "completed")
    for unit_id, before in done_then.items():
        assert results["units"][unit_id]["attempts"] == before["attempts"], unit_id
        assert results["units"][unit_id]["tokens"] == before["tokens"], unit_id
    assert results["spent"] == sum(u["tokens"] for u in results["units"].values())


def test_a_worker_dying_mid_unit_is_redelivered_and_settled_once_per_attempt(
    stack: Stack,
) -> None:
    client = stack.client("e2e-crash")
    before = stack.model()
    # Given the next worker to call the model dies before it can settle (tokens billed)
    stack.local("POST", "/_local/faults", {"worker_crashes": 1})

    # When a small batch runs
    doc = client.submit({"units": units(4, "c"), "budget": 1_000_000})
    final = wait_for(client, doc["batch_id"], timeout_s=240)

    # Then the crash happened, the message came back after its visibility timeout (60 s here),
    # and the books hold every attempt exactly once, the dead worker's included
    after = stack.model()
    assert after["crashed_workers"] - before["crashed_workers"] == 1
    assert final["state"] == "completed", final
    results = stack.results(doc["batch_id"], "completed")
    assert max(u["attempts"] for u in results["units"].values()) >= 2
    assert results["spent"] == sum(u["tokens"] for u in results["units"].values())
    assert after["tokens_billed"] - before["tokens_billed"] == results["spent"]
    assert after["calls"] - before["calls"] == final["attempts"]
