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
    low = stack.client("e2e-low")
    high = stack.client("e2e-high")
    flood = low.submit({"units": units(150, "l"), "lane": "low", "budget": 6_000_000})
    urgent = high.submit({"units": units(20, "h"), "lane": "high", "budget": 1_000_000})
    done = wait_for(high, urgent["batch_id"], timeout_s=180)
    flood_then = low.status(flood["batch_id"])
    assert done["state"] == "completed"
    assert flood_then["state"] == "open", flood_then  # the flood is still running
    final = wait_for(low, flood["batch_id"], timeout_s=300)
    assert final["state"] == "completed"
    assert done["elapsed_s"] < final["elapsed_s"]


def test_a_small_tenant_is_not_starved_by_a_big_tenant(stack: Stack) -> None:
    """Fairness inside a lane. On AWS, SQS fair queues (MessageGroupId = tenant) do this; the
    local poller emulates per-tenant fair receive (swarm/local/emulator.py).

    Scale: 400 units for the big tenant, not the issue's 2,000. On this emulator (2 cores, one
    moto server) the Distributed Map fans out ~5 units/s and a 2,000-unit flood slows the whole
    fleet to a crawl (measured: 9 units completed in 114 s), so the 2,000-unit run cannot finish
    in a test's time here; the mechanism does not depend on the count.
    """
    big = stack.client("e2e-big")
    small = stack.client("e2e-small")
    flood = big.submit({"units": units(400, "g"), "budget": 40_000_000})
    # the big tenant's units are admitted and queued ahead of the small one's
    wait_for(big, flood["batch_id"], lambda d: d["counts"]["in_flight"] >= 300, timeout_s=180)
    started = time.monotonic()
    few = small.submit({"units": units(10, "f"), "budget": 1_000_000})
    done = wait_for(small, few["batch_id"], timeout_s=240)
    took = time.monotonic() - started
    big_then = big.status(flood["batch_id"])
    assert done["state"] == "completed"
    # The bound (measured here: ~22 s, the big tenant at ~50/400): the 10 units finish within
    # 90 s while the big tenant has not finished half its work. In a FIFO lane they would wait
    # behind the ~300 units queued ahead of them.
    print(
        f"fairness: 10-unit tenant done in {took:.1f}s; big tenant then at "
        f"{big_then['counts']['completed']}/400"
    )
    assert took < 90, took
    assert big_then["counts"]["completed"] < 200, big_then["counts"]
    assert wait_for(big, flood["batch_id"], timeout_s=600)["state"] == "completed"
