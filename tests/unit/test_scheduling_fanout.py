"""The real system fans a batch out in the scheduling policy's order (largest first), within lane
priority and per-tenant fairness, and the simulator's lanes do the same."""

from __future__ import annotations

import pytest

from swarm.core.errors import InvalidInput
from swarm.core.lanes import Policy, QueuedUnit
from swarm.core.memory import InMemoryLanes
from swarm.core.records import Lane
from swarm.core.scheduling import fanout_order
from swarm.service.batches import SubmitRequest, UnitInput, manifest_key, manifest_units
from tests.unit.test_service_flow import Plane

SIZES = {"u-a": 9_000, "u-b": 15_000, "u-c": 12_000, "u-d": 15_000, "u-e": 8_000}


def _request(sizes: dict[str, int], lane: Lane = Lane.NORMAL) -> SubmitRequest:
    units = [UnitInput(unit_id, tokens, f"prompt {unit_id}") for unit_id, tokens in sizes.items()]
    return SubmitRequest(lane=lane, budget=10**8, max_attempts=3, units=units)


def test_a_batch_is_fanned_out_largest_first() -> None:
    # Given a batch submitted in no particular order of size
    plane = Plane()
    run = plane.batches.submit("acme", _request(SIZES), None, plane.clock.now()).run
    # Then its manifest (the Distributed Map's items, read in order) is largest first, equal
    # sizes in submission order
    manifest = manifest_units(plane.blobs.get_json(manifest_key(run.run_id)))
    assert [item["unit_id"] for item in manifest] == ["u-b", "u-d", "u-c", "u-a", "u-e"]
    # and the fan-out step enqueues the units in that order, each with its own input
    plane.fan_out()
    assert [(q.unit_id, q.tokens) for q in plane.queue.sent] == [
        ("u-b", 15_000),
        ("u-d", 15_000),
        ("u-c", 12_000),
        ("u-a", 9_000),
        ("u-e", 8_000),
    ]
    assert all(q.input == f"prompt {q.unit_id}" for q in plane.queue.sent)
    # the run's units keep the submission's order (it is the batch as submitted)
    assert [u.unit_id for u in plane.ledger.units(run.run_id)] == list(SIZES)


def test_the_order_stays_inside_lane_priority() -> None:
    # Given a low-lane batch of large units, then a high-lane batch of small ones
    plane = Plane()
    plane.batches.submit("acme", _request({"big-1": 15_000, "big-2": 16_000}, Lane.LOW), None, 1.0)
    plane.batches.submit("acme", _request({"s-1": 8_000, "s-2": 9_000}, Lane.HIGH), None, 1.0)
    plane.fan_out()
    # Then workers take the high lane first, each lane largest first
    taken = [plane.queue.receive() for _ in range(4)]
    assert [q.unit_id for q in taken if q is not None] == ["s-2", "s-1", "big-2", "big-1"]


def test_the_order_stays_inside_tenant_fairness() -> None:
    # Given two tenants' units on one fair lane, each fanned out largest first
    lanes = InMemoryLanes(Policy.FAIR)
    for tenant, sizes in (("ten", [1, 5, 3, 4]), ("two", [2, 9])):
        for size in fanout_order(sizes, lambda tokens: tokens):
            lanes.push(QueuedUnit("r", f"{tenant}-{size}", tenant, Lane.NORMAL, 0, size))
    # Then the tenants alternate, and each tenant's own units come largest first
    served = [lanes.pop().unit_id for _ in range(6)]
    assert served == ["ten-5", "two-9", "ten-4", "two-2", "ten-3", "ten-1"]
    # and a retry goes to the head of its tenant's queue, not ahead of the other tenant's turn
    lanes.push(QueuedUnit("r", "two-9", "two", Lane.NORMAL, 1, 9), first=True)
    lanes.push(QueuedUnit("r", "ten-7", "ten", Lane.NORMAL, 0, 7))
    lanes.push(QueuedUnit("r", "ten-5", "ten", Lane.NORMAL, 1, 5), first=True)
    assert [lanes.pop().unit_id for _ in range(3)] == ["two-9", "ten-5", "ten-7"]


def test_a_bad_unit_is_named_by_its_place_in_the_submission() -> None:
    # the manifest is reordered, the error still names the unit as the client sent it
    plane = Plane()
    sizes = {"small": 8_000, "huge-input": 9_000, "big": 15_000}
    request = _request(sizes)
    inputs = {"huge-input": "x" * 300_000}  # past a Distributed Map child's 256 KiB
    units = [
        UnitInput(u.unit_id, u.projected_tokens, inputs.get(u.unit_id, "x")) for u in request.units
    ]
    oversized = SubmitRequest(request.lane, request.budget, request.max_attempts, units)
    with pytest.raises(InvalidInput) as refused:
        plane.batches.submit("acme", oversized, None, 1.0)
    assert refused.value.field == "units[1].input"


def test_a_retried_submit_is_the_same_batch_whatever_order_its_manifest_was_written_in() -> None:
    plane = Plane()
    first = plane.batches.submit("acme", _request(SIZES), "key-1", 1.0)
    again = plane.batches.submit("acme", _request(SIZES), "key-1", 2.0)
    assert first.created and not again.created and again.run.run_id == first.run.run_id
    # a batch fanned out before the order was largest first (its manifest in submission order)
    key = manifest_key(first.run.run_id)
    stored = manifest_units(plane.blobs.get_json(key))
    in_submission_order = sorted(stored, key=lambda item: list(SIZES).index(item["unit_id"]))
    run_id = first.run.run_id
    plane.blobs.put_json(key, [{"run_id": run_id, "units": in_submission_order}])
    assert not plane.batches.submit("acme", _request(SIZES), "key-1", 3.0).created
    # and one written before chunks: an item per unit, with the tenant, lane and projection
    old = [
        {**u, "run_id": run_id, "tenant": "acme", "lane": "normal", "tokens": SIZES[u["unit_id"]]}
        for u in in_submission_order
    ]
    plane.blobs.put_json(key, old)
    assert not plane.batches.submit("acme", _request(SIZES), "key-1", 4.0).created
