"""Backpressure and priorities on the local stack, through the HTTP API (drain: test_30_cli.py).

The quota storm changes the whole stack, priorities is judged against the flood's share of the
quota, and fairness against the big tenant's units in flight, so they are ``exclusive``: they run
one at a time, on a stack the tenant-scoped scenarios do not use. Units here are larger (10k-20k
tokens: 0.5-1 s of model latency each at time scale 10) so that a batch lasts long enough to be
caught in flight.
"""

from __future__ import annotations

import math
import time

import pytest

from swarm.client import ApiError
from tests.e2e.conftest import (
    Stack,
    submit_retrying,
    units,
    wait_for,
)

#: Bounds, each at least 3x what was measured here (2 cores, the e2e tier running):
THROTTLED_WITHIN_S = 10  # the first throttle the governor records after a storm starts: 0.8 s


@pytest.mark.exclusive
def test_a_quota_storm_slows_the_governor_grows_the_lanes_and_sheds_then_recovers(
    stack: Stack,
) -> None:
    client = stack.client("e2e-storm")
    throttles_before = client.fleet()["governor"]["throttles"]
    # (a full bucket, 3M tokens, grants them all at the fleet's pace; the storm still catches
    # units in the model call, and those go back to their lane: passed 3 of 3 so, 2026-12-05)
    doc = client.submit({"units": units(120, "s", lambda i: 10_000), "budget": 6_000_000})
    wait_for(client, doc["batch_id"], lambda d: d["counts"]["completed"] >= 3, timeout_s=60)
    # Given a bystander eats the model quota for 5 s (50 s on the deployed clock)
    stack.local("POST", "/_local/model/storm", {"quota_tpm": 30_000, "seconds": 5})
    started = time.monotonic()
    while (fleet := client.fleet())["governor"]["throttles"] == throttles_before:
        assert time.monotonic() < started + THROTTLED_WITHIN_S, fleet
        time.sleep(0.2)
    print(f"storm: the governor saw a throttle {time.monotonic() - started:.1f}s in")
    # Then the governor slows down and units wait in their lane (a throttled unit goes back
    # with its invocation's other requeued units, once every message of its batch has ended)
    assert fleet["governor"]["effective_rate_tps"] < fleet["governor"]["governed_rate_tps"]
    while (lanes := client.fleet()["lanes"]["normal"])["visible"] + lanes["delayed"] == 0:
        assert time.monotonic() < started + THROTTLED_WITHIN_S, lanes
        time.sleep(0.2)
    # and new submissions are shed with 429 + Retry-After
    with pytest.raises(ApiError) as shed:
        client.submit({"units": units(5, "s2")})
    assert shed.value.status == 429 and shed.value.retry_after and shed.value.retry_after >= 1
    # When the storm clears, everything completes with exact books (throttled calls bill nothing)
    final = wait_for(client, doc["batch_id"], timeout_s=120)
    assert final["state"] == "completed", final
    seen = stack.model(doc["batch_id"])
    assert seen["throttles"] > 0
    assert seen["tokens_billed"] == stack.results(doc["batch_id"], "completed")["spent"]
    # and a later submission is accepted
    late = submit_retrying(client, {"units": units(5, "s3")})
    assert wait_for(client, late["batch_id"], timeout_s=60)["state"] == "completed"


@pytest.mark.exclusive  # timing against the flood: other tenants' quota would blur the margin
def test_a_high_lane_batch_behind_a_low_lane_flood_finishes_first(stack: Stack) -> None:
    """Priorities: one tenant, the low-lane flood submitted first, fanned out and running before
    the high-lane batch arrives. One tenant, so per-tenant fairness plays no part: if the lanes
    did not separate them, the high batch would queue behind the whole flood and finish last.

    The flood's 160 units of 20k tokens (3.2M) need 67 s of the governed quota (47,500 tokens/s
    at time scale 10) from an empty bucket, and from a full one (3M tokens, the low lane leaving
    20% of them: 2.4M) at least 17 s for the 0.8M beyond it; the high lane has no governor
    reserve. (The low lane's MaximumConcurrency of 4 no longer holds a flood back: a message
    carries a bundle of up to 5 units, 5 messages an invocation, so 100 units run at once; with
    120 units, granted from a full bucket, the flood was 118/120 done when the high batch came.)
    Measured alone before bundles: the high batch (10 units) done in 4.4 s, with at least 19 s of
    the flood's quota still ahead of it (4x); with the other scenarios running beside it, 14-15 s
    with ~6 s ahead, so it runs alone.
    """
    client = stack.client("e2e-prio")
    # (an earlier exclusive scenario's storm may still have the API shedding the lower lanes)
    flood = submit_retrying(
        client, {"units": units(160, "l", lambda i: 20_000), "lane": "low", "budget": 6_000_000}
    )
    # fanned out (every unit admitted once: a unit still pending waits for a retry) and running
    wait_for(
        client,
        flood["batch_id"],
        lambda d: d["counts"]["pending"] <= d["retries"] and d["counts"]["completed"] >= 1,
        timeout_s=60,
    )
    urgent = submit_retrying(client, {"units": units(10, "h"), "lane": "high", "budget": 6_000_000})
    low_at_submit = client.status(flood["batch_id"])["counts"]["completed"]
    done = wait_for(client, urgent["batch_id"], timeout_s=60)
    flood_then = client.status(flood["batch_id"])
    print(
        f"priorities: high batch (10) done in {done['elapsed_s']:.1f}s; the low flood went "
        f"{low_at_submit} -> {flood_then['counts']['completed']}/160 meanwhile"
    )
    assert done["state"] == "completed"
    assert flood_then["state"] == "open", flood_then  # the flood, ahead of it, is not done
    final = wait_for(client, flood["batch_id"], timeout_s=120)
    assert final["state"] == "completed"
    assert final["counts"]["completed"] + final["counts"]["dead_lettered"] == 160


# Alone on its stack (scripts/test-suite runs it on the lease stack once that stack's scenarios
# have ended). On the first stack, beside the tenant-scoped scenarios, it once failed (2026-12-07:
# 65 of the 94 big units counted ahead were served before the small tenant's 3, which waited
# 6.4 s): six worker invocations held batches of big units, two started 5 and 13 s before the
# small tenant's units were queued. Units a worker had already received counted as ahead; they
# no longer do (the pollers' receipts below).
@pytest.mark.exclusive
def test_a_small_tenant_is_served_before_a_big_tenants_backlog(stack: Stack) -> None:
    """Fairness inside a lane at small scale (tests/scale has 2,000 units against 10): SQS fair
    queues (MessageGroupId = tenant) serve the tenant with fewer messages in flight first (locally
    the fair receive patch emulates them), and the governor queues each tenant's refused units
    apart, at its share of the refill (docs/explanation/governor.md, "Lanes with a reserve queue,
    tenant by tenant"). In a FIFO lane the small batch would wait behind the big tenant's whole
    backlog: 180 units of 10k tokens beyond what the governor's bucket holds when it is submitted,
    ~37 s of its refill on the local clock. (Sized from the bucket: when this scenario ran first,
    the bucket was full, 3M tokens, and 115 of 120 units were served, at the fleet's pace, before
    the small tenant's units were queued. With units of 2k tokens the backlog was ~5 s, drained
    within a few of SQS's one-second delays, which the local clock does not scale: a small unit
    that lost one toss for a second's tokens saw ~23 big ones drawn meanwhile. With 120 units
    beyond the bucket, only 49 and 52 were still ahead twice when the stack was busy, its
    admission slow: the refill served the rest before the small tenant's units were queued.)

    Judged by order, not time, on the model's clock (when it received each unit's call, not when
    a status poll saw the unit done, nor when it was settled: under load a poll answered late, and
    units served before the small tenant came settled in one burst after it, counted as
    overtaking): how many of the big tenant's units are served between the moment the small
    tenant's units are all queued and the last of them is served. Only the big units still in
    the queue then count: one a worker had already received (its message in an invocation's
    batch, the delivery that served it) is past the queue's fairness, whatever its worker does
    next. In FIFO, every big unit still queued then; with fairness, a few; the bound is half of
    those ahead.
    """
    big = stack.client("e2e-fair-big")
    small = stack.client("e2e-fair-small")
    # Given the big tenant's units all admitted and queued ahead, 180 of them beyond what the
    # governor's bucket holds now (the rest are drawn at the fleet's pace, not held back)
    in_bucket = big.fleet()["governor"]["available_tokens"]
    n = 180 + math.ceil(in_bucket / 10_000)
    backlog = big.submit({"units": units(n, "g", lambda i: 10_000), "budget": 8_000_000})
    wait_for(big, backlog["batch_id"], lambda d: d["counts"]["pending"] == 0, timeout_s=120)
    # When a small tenant submits to the same lane and its units are queued behind them
    few = small.submit({"units": units(3, "f", lambda i: 10_000), "budget": 1_000_000})
    wait_for(small, few["batch_id"], lambda d: d["counts"]["pending"] == 0, interval_s=0.1)
    queued_at = time.time()  # the stack's clock: the same host's
    done = wait_for(small, few["batch_id"], timeout_s=60, interval_s=0.1)
    small_served_at = max(stack.served(few["batch_id"]).values())
    big_served = stack.served(backlog["batch_id"])
    receipts = stack.receipts(backlog["batch_id"])
    # a big unit's delivery that served it: its last receipt before its model call (a unit the
    # governor sent back to the lane was received again); still queued if that came later
    queued = {
        unit: at
        for unit, at in big_served.items()
        if max((r for r in receipts.get(unit, ()) if r <= at), default=at) > queued_at
    }
    held = sum(1 for at in big_served.values() if at > queued_at) - len(queued)
    ahead = len(queued) + n - len(big_served)
    overtaken = sum(1 for at in queued.values() if at <= small_served_at)
    print(
        f"fairness: the 3-unit tenant done in {done['elapsed_s']:.1f}s; {overtaken} of the big "
        f"tenant's {ahead} units still queued ahead of it were served meanwhile ({n} units, "
        f"{in_bucket:,} tokens in the bucket at their submission; {held} more already received "
        "by workers then, served after it was queued)"
    )
    # Then it is served before the backlog ahead of it
    assert done["state"] == "completed"
    assert ahead >= 60, f"the premise: a backlog ahead of the small tenant, not {ahead} units"
    assert overtaken < 0.5 * ahead, (queued_at, small_served_at, sorted(queued.values()))
    final = wait_for(big, backlog["batch_id"], timeout_s=240)
    assert final["state"] == "completed"
