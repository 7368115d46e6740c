"""Drain, backpressure, priorities and fairness on the local stack, through the HTTP API."""

from __future__ import annotations

import time

import pytest

from swarm.client import ApiError
from tests.e2e.conftest import Stack, submit_retrying, units, wait_for


def test_drain_stops_intake_lets_in_flight_settle_and_loses_nothing(stack: Stack) -> None:
    client = stack.client("e2e-drain")
    before = stack.model()
    doc = client.submit({"units": units(120, "d"), "budget": 6_000_000})
    wait_for(client, doc["batch_id"], lambda d: d["counts"]["completed"] >= 10, timeout_s=120)

    # When the operator turns the drain on (SSM; the rule fires the drain controller)
    client.set_drain(True)
    try:
        # Then submissions are refused with 503 + Retry-After
        with pytest.raises(ApiError) as refused:
            client.submit({"units": units(1, "late")})
        assert refused.value.status == 503 and refused.value.retry_after

        # and `drain on --wait` returns once nothing is in flight
        deadline = time.monotonic() + 90
        while not (status := client.drain_status())["safe_to_deploy"]:
            assert time.monotonic() < deadline, status
            time.sleep(0.5)
        held = client.status(doc["batch_id"])
        assert held["state"] == "open"
        assert held["counts"]["in_flight"] + held["counts"]["pending"] > 0  # still queued
        time.sleep(3)  # queued units stay queued: no worker takes one
        assert client.status(doc["batch_id"])["counts"]["completed"] == held["counts"]["completed"]
    finally:
        client.set_drain(False)

    # When the drain is off again, everything completes; nothing lost, nothing settled twice
    final = wait_for(client, doc["batch_id"], timeout_s=240)
    assert final["state"] == "completed", final
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 120
    results = stack.results(doc["batch_id"], "completed")
    assert results["spent"] == sum(u["tokens"] for u in results["units"].values())
    after = stack.model()
    assert after["tokens_billed"] - before["tokens_billed"] == results["spent"]


def test_a_quota_storm_slows_the_governor_grows_the_lanes_and_sheds_then_recovers(
    stack: Stack,
) -> None:
    client = stack.client("e2e-storm")
    doc = client.submit({"units": units(80, "s"), "budget": 6_000_000})
    wait_for(client, doc["batch_id"], lambda d: d["counts"]["completed"] >= 5, timeout_s=120)
    # Given a bystander eats the model quota for 20 s
    stack.local("POST", "/_local/model/storm", {"quota_tpm": 30_000, "seconds": 20})
    deadline = time.monotonic() + 60
    while (fleet := client.fleet())["governor"]["throttles"] == 0:
        assert time.monotonic() < deadline, fleet
        time.sleep(0.5)
    # Then the governor slows down and units wait in their lane
    assert fleet["governor"]["effective_rate_tps"] < fleet["governor"]["governed_rate_tps"]
    lanes = fleet["lanes"]["normal"]
    assert lanes["visible"] + lanes["delayed"] > 0
    # and new submissions are shed with 429 + Retry-After
    with pytest.raises(ApiError) as shed:
        client.submit({"units": units(5, "s2")})
    assert shed.value.status == 429 and shed.value.retry_after and shed.value.retry_after >= 1
    # When the storm clears, everything completes (and a later submission is accepted)
    final = wait_for(client, doc["batch_id"], timeout_s=300)
    assert final["state"] == "completed", final
    late = submit_retrying(client, {"units": units(5, "s3")})
    assert wait_for(client, late["batch_id"], timeout_s=120)["state"] == "completed"


def test_a_high_lane_batch_behind_a_low_lane_flood_finishes_first(stack: Stack) -> None:
    """Priorities: one tenant, the same number of units, the low-lane flood submitted first,
    fanned out and running before the high-lane batch arrives. One tenant, so per-tenant
    fairness plays no part: if the lanes did not separate them, the high batch would queue
    behind the whole flood and finish last.

    Two mechanisms, and which one decides depends on the bucket. With tokens to spare, the high
    lane's larger MaximumConcurrency (10 against 4): measured after the tier's earlier tests
    (bucket full), the high batch done in ~38 s while the flood went from 1 to 90/150. Under a
    saturated quota, the low lane's governor reserve (it may not draw the bucket below 20%, the
    high lane may): measured on a fresh stack (a bucket starts empty), the high batch done in
    ~43 s while the flood went from 2 to 21/150.
    """
    client = stack.client("e2e-prio")
    flood = client.submit({"units": units(150, "l"), "lane": "low", "budget": 6_000_000})
    wait_for(
        client,
        flood["batch_id"],
        lambda d: d["counts"]["pending"] == 0 and d["counts"]["completed"] >= 1,
        timeout_s=120,
    )
    urgent = client.submit({"units": units(150, "h"), "lane": "high", "budget": 6_000_000})
    low_at_submit = client.status(flood["batch_id"])["counts"]["completed"]
    done = wait_for(client, urgent["batch_id"], timeout_s=300)
    flood_then = client.status(flood["batch_id"])
    print(
        f"priorities: high batch (150) done in {done['elapsed_s']:.1f}s; the low flood went "
        f"{low_at_submit} -> {flood_then['counts']['completed']}/150 meanwhile"
    )
    assert done["state"] == "completed"
    assert flood_then["state"] == "open", flood_then  # the flood, ahead of it, is not done
    final = wait_for(client, flood["batch_id"], timeout_s=300)
    assert final["state"] == "completed"
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 150


def test_a_small_tenant_is_not_starved_by_a_big_tenant(stack: Stack) -> None:
    """Fairness inside a lane, at the issue's scale: 2,000 units of one tenant ahead of 10 units
    of another. On AWS, SQS fair queues (MessageGroupId = tenant) do this; locally the fair
    receive patch emulates them (swarm/local/emulator.py).

    Measured here (2 cores): the big batch fans out in ~130 s and, quota-bound, completes in
    ~600 s; the small batch, submitted with ~300 big units queued ahead, completes in ~90 s while
    the big tenant is at ~50/2,000. In a FIFO lane it would wait behind ~1,700 units (~400 s at
    the governed rate). The bounds below leave room for a slower machine.
    """
    big = stack.client("e2e-big")
    small = stack.client("e2e-small")
    flood = big.submit({"units": units(2_000, "g"), "budget": 100_000_000})
    # the big tenant's units are admitted and queued ahead of the small one's
    wait_for(big, flood["batch_id"], lambda d: d["counts"]["in_flight"] >= 300, timeout_s=180)
    started = time.monotonic()
    few = small.submit({"units": units(10, "f"), "budget": 1_000_000})
    done = wait_for(small, few["batch_id"], timeout_s=400, interval_s=2)
    took = time.monotonic() - started
    big_then = big.status(flood["batch_id"])
    assert done["state"] == "completed"
    assert done["counts"]["completed"] + done["counts"]["dead_lettered"] == 10
    assert took < 240, took
    assert big_then["counts"]["completed"] < 200, big_then["counts"]  # under a tenth done
    final = wait_for(big, flood["batch_id"], timeout_s=1_500, interval_s=5)
    print(
        f"fairness: 10-unit tenant done in {took:.1f}s with the big tenant at "
        f"{big_then['counts']['completed']}/2000; the big batch took {final['elapsed_s']:.0f}s"
    )
    assert final["state"] == "completed", final
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 2_000
    assert final["elapsed_s"] > 3 * took  # the small tenant finished long before the big one
