"""Edges of the control plane, through the real handlers on in-process moto.

Tenancy of batch ids and idempotency keys, a repeated finalizer, a retried fan-out item, queued
reservations whose lease expired, and top-ups racing the workers and the finalizer.

Races are interleaved deterministically: a *hook* runs a chosen step (an API call, a sweep, a
fan-out) at a chosen point inside a handler that is running (before the governor draw, while the
model is called, between a settlement's decision and its write, between the finalizer's reads),
on the same thread. Time is never waited for: the handlers' clocks are faked where a lease must
expire, and moto's SQS clock is frozen and advanced where a message's delay must pass.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

import pytest

import functions.api as api_handler
import functions.fanout as fanout_handler
import functions.finalizer as finalizer_handler
import functions.worker as worker_handler
from swarm.adapters import dynamodb_ledger
from swarm.core.codec import parse_message_body
from swarm.core.ports import ModelRequest, ModelResult
from swarm.core.records import AttemptRecord, Lane, RunRecord, RunState, UnitRecord, UnitState
from swarm.service.batches import manifest_units
from swarm.service.worker import Worker
from swarm.wiring import QUEUE_LEASE_S
from tests.integration.plane import ControlPlane, control_plane, freeze_sqs_clock, ledger, units

# ---------------------------------------------------------------------- helpers


@pytest.fixture
def plane(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    """The tier's plane with each unit a lane message of its own (``worker.bundle_units`` 1):
    these races are interleaved at one unit's steps, message by message. Bundles are tested in
    tests/integration/test_bundled_lanes.py."""
    with control_plane(monkeypatch, BUNDLE_UNITS="1") as deployed:
        deployed.observe_events()
        yield deployed


def objects(plane: ControlPlane, prefix: str = "") -> list[str]:
    listing = plane.client("s3").list_objects_v2(Bucket=plane.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def read_json(plane: ControlPlane, key: str) -> Any:
    body = plane.client("s3").get_object(Bucket=plane.bucket, Key=key)["Body"]
    return json.loads(body.read())


def executions(plane: ControlPlane) -> list[str]:
    sfn = plane.client("stepfunctions")
    listing = sfn.list_executions(stateMachineArn=plane.state_machine_arn)["executions"]
    return sorted(e["name"] for e in listing)


def submit(plane: ControlPlane, body: dict[str, Any], tenant: str = "acme") -> str:
    status, doc, _ = plane.api("POST", "/batches", body, tenant=tenant)
    assert status == 201, doc
    batch_id: str = doc["batch_id"]
    return batch_id


def resume(plane: ControlPlane, batch_id: str, top_up: int, tenant: str = "acme") -> dict[str, Any]:
    status, doc, _ = plane.api(
        "POST", f"/batches/{batch_id}/resume", {"top_up": top_up}, tenant=tenant
    )
    assert status == 200, doc
    return doc


def fan_out_events(plane: ControlPlane) -> list[dict[str, Any]]:
    """The map's item events cut into chunks of one unit (each a valid map item), so a test can
    invoke the fan-out step itself for each unit: twice, or with a step in between; in unit
    order (the manifest is in the fan-out's, largest first)."""
    events = [
        {**event, "chunk": {**event["chunk"], "units": [unit]}}
        for event in plane.fan_out_events()
        for unit in event["chunk"]["units"]
    ]
    return sorted(events, key=lambda event: event["chunk"]["units"][0]["unit_id"])


def receive_all(plane: ControlPlane, lane: Lane = Lane.NORMAL) -> list[Any]:
    """Every visible message of the lane, now in flight, in unit order."""
    messages: list[Any] = []
    while batch := plane.receive(lane):
        messages.extend(batch)
    return sorted(messages, key=lambda m: parse_message_body(m["Body"]).unit_id)


def unit_of(message: Any) -> str:
    return parse_message_body(message["Body"]).unit_id


def run_before(
    monkeypatch: pytest.MonkeyPatch,
    target: object,
    method: str,
    step: Callable[[], object],
    when: Callable[..., bool] | None = None,
) -> list[bool]:
    """Run ``step`` once, the first time ``target.method`` is called (with arguments ``when``
    accepts), before the call proceeds. The returned list is non-empty once it has fired."""
    original = getattr(target, method)
    fired: list[bool] = []

    def hooked(*args: Any, **kwargs: Any) -> Any:
        if not fired and (when is None or when(*args, **kwargs)):
            fired.append(True)
            step()
        return original(*args, **kwargs)

    monkeypatch.setattr(target, method, hooked)
    return fired


def service(plane: ControlPlane, function: str) -> Any:
    """The service a handler has cached (built now, as ``function``, if it was not yet), to
    hook into."""
    with plane.running(function):
        if function == "worker":
            worker, *_ = worker_handler._services()
            return worker
        if function == "api":
            return api_handler.batches()
        if function == "finalizer":
            return finalizer_handler.finalizer()
        if function == "fanout":
            return fanout_handler.fanout()
    raise AssertionError(function)


@dataclass
class Clock:
    """Stands in for the ``time`` module of one handler: ``time.time()`` reads ``now``; its
    ``monotonic()`` (an invocation's deadline) is the real one."""

    now: float

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()


def fake_time(monkeypatch: pytest.MonkeyPatch, module: ModuleType, now: float) -> Clock:
    clock = Clock(now)
    monkeypatch.setattr(module, "time", clock)
    return clock


@dataclass
class ModelLog:
    """Every call the worker's model plane answered, with a way to fail a chosen attempt and to
    run a step while a chosen attempt is on the model (claimed, not settled)."""

    calls: list[tuple[str, str, int, int, bool]] = field(default_factory=list)
    fail: set[tuple[str, int]] = field(default_factory=set)
    during: dict[tuple[str, int], Callable[[], None]] = field(default_factory=dict)

    def of(self, run_id: str) -> list[tuple[str, int, int, bool]]:
        return [(u, a, t, ok) for r, u, a, t, ok in self.calls if r == run_id]


def watch_model(plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> ModelLog:
    worker: Worker = service(plane, "worker")
    real = worker.model.invoke
    log = ModelLog()

    def invoke(request: ModelRequest) -> ModelResult:
        key = (request.unit_id, request.attempt)
        step = log.during.pop(key, None)
        if step is not None:
            step()
        result = real(request)
        if key in log.fail:
            result = replace(result, succeeded=False)
        log.calls.append(
            (request.run_id, request.unit_id, request.attempt, result.tokens, result.succeeded)
        )
        return result

    monkeypatch.setattr(worker.model, "invoke", invoke)
    return log


def assert_books_exact(
    plane: ControlPlane, batch_id: str, model: ModelLog | None = None
) -> RunRecord:
    """spent = every attempt's tokens; every attempt settled once, in order; nothing ran after a
    unit's successful attempt; every unit counted in exactly one outcome; and (given the model's
    log) each attempt was run on the model once, billed what the ledger settled."""
    books = ledger(plane)
    run, attempts, unit_records = (
        books.run(batch_id),
        books.attempts(batch_id),
        books.units(batch_id),
    )
    assert run.reserved == 0 and run.in_flight == 0, run
    assert run.spent == sum(a.tokens for a in attempts)
    assert run.attempts == len(attempts)
    by_unit: defaultdict[str, list[AttemptRecord]] = defaultdict(list)
    for a in attempts:
        by_unit[a.unit_id].append(a)
    for unit in unit_records:
        mine = sorted(by_unit[unit.unit_id], key=lambda a: a.attempt)
        assert [a.attempt for a in mine] == list(range(unit.attempts)), unit
        assert not any(a.succeeded for a in mine[:-1]), f"{unit.unit_id} ran after it completed"
        assert unit.spent == sum(a.tokens for a in mine)
        assert (unit.state is UnitState.COMPLETED) == bool(mine and mine[-1].succeeded)
    states = Counter(u.state for u in unit_records)
    assert states[UnitState.COMPLETED] == run.completed
    assert states[UnitState.DEAD_LETTERED] == run.dead_lettered
    assert states[UnitState.REMAINDER] == run.remainder
    assert sum(states.values()) == run.units_total == len(unit_records)
    if model is not None:
        ran = model.of(batch_id)
        assert len(ran) == len({(u, a) for u, a, _, _ in ran}), f"an attempt ran twice: {ran}"
        assert {(u, a): (t, ok) for u, a, t, ok in ran} == {
            (a.unit_id, a.attempt): (a.tokens, a.succeeded) for a in attempts if not a.reclaimed
        }
    return run


def announced(plane: ControlPlane, batch_id: str) -> list[dict[str, Any]]:
    return [e for e in plane.events() if e["detail"]["run_id"] == batch_id]


def assert_results_match(plane: ControlPlane, event: dict[str, Any]) -> dict[str, Any]:
    """The results object an event names agrees with the event, and the remainder manifest
    lists exactly the results' remainder."""
    detail = event["detail"]
    results = read_json(plane, detail["results_key"])
    assert event["detail-type"] == f"run.{results['state']}" == f"run.{detail['state']}"
    for name in ("spent", "budget", "healthy_line"):
        assert results[name] == detail[name], name
    states = Counter(u["state"] for u in results["units"].values())
    assert states["completed"] == detail["completed"]
    assert states["dead_lettered"] == detail["dead_lettered"]
    assert sorted(results["remainder"]) == sorted(
        u for u, doc in results["units"].items() if doc["state"] == "remainder"
    )
    assert len(results["remainder"]) == detail["remainder"]
    assert sum(u["tokens"] for u in results["units"].values()) == detail["spent"]
    if results["state"] == "exhausted":
        epoch = detail["results_key"].rsplit("-", 1)[1].removesuffix(".json")
        manifest = read_json(plane, f"results/{detail['run_id']}/remainder-{epoch}.json")
        assert sorted(i["unit_id"] for i in manifest) == sorted(results["remainder"])
    return dict(results)


def top_up_for(plane: ControlPlane, batch_id: str, available: int) -> int:
    """The top-up that leaves exactly ``available`` tokens to admit with."""
    run = ledger(plane).run(batch_id)
    amount = available - run.available
    assert amount > 0, run
    return amount


# With these 6 units (10,000 + 13 i tokens each) a budget of 25,000 admits u0000 and u0001 at
# fan-out; u0002 is refused (the run starts exhausting) and u0002..u0005 are the remainder.
# six units of one size: the fan-out's largest-first order is their submission order
SIX = [{**unit, "projected_tokens": 10_000} for unit in units(6)]
TIGHT = 25_000
ONE_MORE = 15_000  # available tokens after a top-up that admit one more unit, not two


# ---------------------------------------------------------------------- 1. resume across tenants


def test_another_tenants_resume_is_refused_as_not_found_and_changes_nothing(
    plane: ControlPlane,
) -> None:
    # Given acme's batch, closed as exhausted with a remainder
    batch_id = submit(plane, {"units": SIX, "budget": TIGHT})
    plane.run_to_close(batch_id)
    _, status_doc, _ = plane.api("GET", f"/batches/{batch_id}")
    assert status_doc["state"] == "exhausted" and len(status_doc["remainder"]) == 4
    books, unit_records = ledger(plane).run(batch_id), ledger(plane).units(batch_id)
    keys, started, events = objects(plane), executions(plane), plane.events()
    missing = "b-" + "0" * 24

    def as_missing(doc: dict[str, Any], missing_doc: dict[str, Any]) -> bool:
        return doc == {**missing_doc, "message": missing_doc["message"].replace(missing, batch_id)}

    # When globex resumes it with a top-up
    status, doc, _ = plane.api(
        "POST", f"/batches/{batch_id}/resume", {"top_up": 1_000_000}, tenant="globex"
    )
    # Then it gets exactly what a batch that does not exist gets: ids do not reveal existence
    missing_status, missing_doc, _ = plane.api(
        "POST", f"/batches/{missing}/resume", {"top_up": 1_000_000}, tenant="globex"
    )
    assert (status, missing_status) == (404, 404)
    assert doc["error"] == "not_found" and as_missing(doc, missing_doc), (doc, missing_doc)
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}", tenant="globex")
    _, missing_doc, _ = plane.api("GET", f"/batches/{missing}", tenant="globex")
    assert status == 404 and as_missing(doc, missing_doc), (doc, missing_doc)
    # also while draining (the existence check comes first, so 404, never 503)
    plane.set_drain(True)
    status, doc, _ = plane.api(
        "POST", f"/batches/{batch_id}/resume", {"top_up": 1}, tenant="globex"
    )
    assert status == 404
    plane.set_drain(False)
    # and nothing of acme's changed: books, units, objects, executions, events
    assert ledger(plane).run(batch_id) == books and ledger(plane).units(batch_id) == unit_records
    assert objects(plane) == keys and executions(plane) == started and plane.events() == events
    # while acme's own resume requeues its whole remainder and completes the batch
    assert resume(plane, batch_id, 1_000_000)["requeued"] == 4
    plane.run_to_close(batch_id)
    assert assert_books_exact(plane, batch_id).completed == 6
    # once completed, globex still learns nothing: 404, where acme gets 409
    status, doc, _ = plane.api(
        "POST", f"/batches/{batch_id}/resume", {"top_up": 1}, tenant="globex"
    )
    assert status == 404 and as_missing(doc, missing_doc)
    status, doc, _ = plane.api("POST", f"/batches/{batch_id}/resume", {"top_up": 1})
    assert status == 409 and doc["error"] == "conflict"


# ---------------------------------------------------------------------- 2. idempotency keys


def test_one_idempotency_key_used_by_two_tenants_makes_two_batches(plane: ControlPlane) -> None:
    key = {"Idempotency-Key": "nightly-2026-11-29"}
    body = {"units": units(3)}
    # Given acme and globex submitting the same body under the same Idempotency-Key
    acme_status, acme, _ = plane.api("POST", "/batches", body, headers=key)
    globex_status, globex, _ = plane.api("POST", "/batches", body, headers=key, tenant="globex")
    # Then each gets its own new batch (no conflict: keys are per tenant)
    assert (acme_status, globex_status) == (201, 201), (acme, globex)
    assert acme["batch_id"] != globex["batch_id"]
    assert (acme["tenant"], globex["tenant"]) == ("acme", "globex")
    # When each replays its submit
    for tenant, first in (("acme", acme), ("globex", globex)):
        status, again, headers = plane.api("POST", "/batches", body, headers=key, tenant=tenant)
        # Then it gets its own batch back, not a new one and not the other tenant's
        assert status == 200 and again["batch_id"] == first["batch_id"]
        assert headers["Location"] == f"/batches/{first['batch_id']}"
    # and a replay with other content is still a conflict, per tenant
    status, _, _ = plane.api("POST", "/batches", {"units": units(4)}, headers=key, tenant="globex")
    assert status == 409
    # Each tenant sees only its own batch
    for tenant, mine, theirs in (("acme", acme, globex), ("globex", globex, acme)):
        status, doc, _ = plane.api("GET", f"/batches/{mine['batch_id']}", tenant=tenant)
        assert status == 200 and doc["tenant"] == tenant
        status, doc, _ = plane.api("GET", f"/batches/{theirs['batch_id']}", tenant=tenant)
        assert status == 404 and doc["error"] == "not_found"
    # and the two batches run separately: one execution each, each its own books
    assert executions(plane) == sorted([acme["batch_id"], globex["batch_id"]])
    assert sorted(plane.run_state_machine()) == sorted([acme["batch_id"], globex["batch_id"]])
    plane.work()
    for tenant, doc in (("acme", acme), ("globex", globex)):
        assert plane.finalize(doc["batch_id"])["closed"]
        run = assert_books_exact(plane, doc["batch_id"])
        assert run.spec.tenant == tenant and run.completed == 3


# ---------------------------------------------------------------------- 3. a repeated finalizer


def test_a_repeated_finalizer_announces_each_closure_once_with_consistent_results(
    plane: ControlPlane,
) -> None:
    s3 = plane.client("s3")
    s3.put_bucket_versioning(Bucket=plane.bucket, VersioningConfiguration={"Status": "Enabled"})

    def versions(key: str) -> int:
        listing = s3.list_object_versions(Bucket=plane.bucket, Prefix=key)
        return len([v for v in listing.get("Versions", []) if v["Key"] == key])

    # Given a batch whose budget runs out twice before it completes
    batch_id = submit(plane, {"units": SIX, "budget": TIGHT})
    plane.run_state_machine()
    plane.work()
    closures = []
    for top_up in (None, ONE_MORE, 1_000_000):
        if top_up is not None:
            amount = top_up_for(plane, batch_id, top_up) if top_up == ONE_MORE else top_up
            resume(plane, batch_id, amount)
            plane.run_state_machine()
            plane.work()
        # When the finalizer runs three times on the closed run (Step Functions retries, or
        # the executions of the batch and of its resume both polling it)
        first = plane.finalize(batch_id)
        again = [plane.finalize(batch_id) for _ in range(2)]
        # Then only the first call announces; all name the same results, written once
        assert [r["announced"] for r in (first, *again)] == [True, False, False]
        assert {r["results_key"] for r in again} == {first["results_key"]}
        assert all(r["closed"] and r["state"] == first["state"] for r in again)
        assert versions(first["results_key"]) == 1
        closures.append((first["state"], first["results_key"], ledger(plane).run(batch_id)))
    assert [(state, key) for state, key, _ in closures] == [
        ("exhausted", f"results/{batch_id}/exhausted-1.json"),
        ("exhausted", f"results/{batch_id}/exhausted-2.json"),
        ("completed", f"results/{batch_id}/completed-2.json"),
    ]
    # and EventBridge carried exactly one event per closure, each agreeing with its results
    # and with the books at that closure
    events = announced(plane, batch_id)
    assert [e["detail-type"] for e in events] == ["run.exhausted", "run.exhausted", "run.completed"]
    for event, (_, key, run) in zip(events, closures, strict=True):
        results = assert_results_match(plane, event)
        assert event["detail"]["results_key"] == key
        assert (results["spent"], event["detail"]["remainder"]) == (run.spent, run.remainder)
    assert len(read_json(plane, f"results/{batch_id}/remainder-1.json")) == 4
    assert len(read_json(plane, f"results/{batch_id}/remainder-2.json")) == 3
    assert all(versions(key) == 1 for key in objects(plane, f"results/{batch_id}/"))
    assert assert_books_exact(plane, batch_id).completed == 6


# ---------------------------------------------------------------------- 4. a retried fan-out item


@pytest.mark.parametrize(
    "retry_lands",
    ["before_delivery", "while_the_unit_runs", "after_completion", "after_a_failure"],
)
def test_a_retried_fan_out_item_is_admitted_and_run_once(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, retry_lands: str
) -> None:
    clock = freeze_sqs_clock(monkeypatch)
    model = watch_model(plane, monkeypatch)
    model.fail = {("u0001", 0)} if retry_lands == "after_a_failure" else set()
    # Given a batch of 3 units, fanned out once
    batch_id = submit(plane, {"units": units(3)})
    items = fan_out_events(plane)
    first = [plane.invoke("fanout", item)["units"][0] for item in items]  # chunks of one
    assert [(r["outcome"], r["attempt"]) for r in first] == [("enqueued", 0)] * 3
    # When the Distributed Map runs every item again (a retry after the function had run):
    # before any copy ran, while u0001's attempt is on the model, after all completed, or after
    # u0001's first attempt failed
    again: list[dict[str, Any]] = []
    books: list[tuple[RunRecord, RunRecord]] = []
    u0001: list[tuple[UnitRecord, UnitRecord]] = []

    def retry() -> None:
        run, unit = ledger(plane).run(batch_id), ledger(plane).unit(batch_id, "u0001")
        again.extend(plane.invoke("fanout", item)["units"][0] for item in items)
        books.append((run, ledger(plane).run(batch_id)))
        u0001.append((unit, ledger(plane).unit(batch_id, "u0001")))

    if retry_lands == "while_the_unit_runs":
        model.during[("u0001", 0)] = retry
    if retry_lands == "while_the_unit_runs":
        # the first copies run one batch each, in unit order: u0000 completed, u0002 still in
        # its lane when the retry lands (a batch's messages run at once, so in one batch their
        # progress at that moment would be a race)
        for message in receive_all(plane):
            assert (
                plane.deliver(Lane.NORMAL, [message], fast_retry=False)["batchItemFailures"] == []
            )
    elif retry_lands != "before_delivery":  # the first copies run, as one batch
        response = plane.deliver(Lane.NORMAL, receive_all(plane), fast_retry=False)
        assert len(response["batchItemFailures"]) == len(model.fail)
    if retry_lands != "while_the_unit_runs":
        retry()
    [(before, after)] = books
    # Then the retry reserves nothing more, and leaves a live claim alone
    if retry_lands == "before_delivery":
        assert after == before and after.in_flight == 3
        assert after.reserved == sum(u["projected_tokens"] for u in units(3))
        assert [(r["outcome"], r["attempt"]) for r in again] == [("enqueued", 0)] * 3
    elif retry_lands == "while_the_unit_runs":
        assert after == before and (after.completed, after.in_flight) == (1, 2)
        assert [r["outcome"] for r in again] == ["completed", "enqueued", "enqueued"]
        [(held, kept)] = u0001
        assert held.reservation is not None and held.reservation.claimed and kept == held
    elif retry_lands == "after_completion":
        assert after == before and after.state is RunState.COMPLETED
        assert [r["outcome"] for r in again] == ["completed"] * 3
    else:  # u0001 owes a retry: the repeated item admits its attempt 1, once
        assert [r["outcome"] for r in again] == ["completed", "enqueued", "completed"]
        assert again[1]["attempt"] == 1
        assert (after.in_flight, after.reserved) == (1, units(3)[1]["projected_tokens"])
        assert after.spent == before.spent
    # and every copy left on the lane (the retried items', and a failed attempt's redelivery
    # once its backoff has passed) is delivered: none runs an attempt a second time
    worker: Worker = service(plane, "worker")
    clock.advance(math.ceil(worker.config.retry_backoff_s) + 1)
    for message in receive_all(plane):
        plane.deliver(Lane.NORMAL, [message], fast_retry=False)
    assert receive_all(plane) == []
    assert plane.finalize(batch_id)["closed"]
    run = assert_books_exact(plane, batch_id, model)
    assert run.completed == 3
    ran = sorted((u, a) for u, a, _, _ in model.of(batch_id))
    if retry_lands == "after_a_failure":
        assert ran == [("u0000", 0), ("u0001", 0), ("u0001", 1), ("u0002", 0)]
    else:
        assert ran == [("u0000", 0), ("u0001", 0), ("u0002", 0)]


# ---------------------------------------------------------------------- 5. expired queued leases


def queued_lease(plane: ControlPlane, batch_id: str, unit_id: str) -> float:
    reservation = ledger(plane).unit(batch_id, unit_id).reservation
    assert reservation is not None and not reservation.claimed
    return reservation.lease_expires


def test_an_expired_queued_reservation_is_released_and_the_worker_readmits_the_unit(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = watch_model(plane, monkeypatch)
    # Given 2 units admitted at fan-out, waiting in their lane with the queue lease
    batch_id = submit(plane, {"units": units(2)})
    plane.run_state_machine()
    reserved = sum(u["projected_tokens"] for u in units(2))
    assert ledger(plane).run(batch_id).reserved == reserved
    expires = max(queued_lease(plane, batch_id, u["unit_id"]) for u in units(2))
    assert expires - ledger(plane).run(batch_id).opened_at >= QUEUE_LEASE_S
    sweep = fake_time(monkeypatch, finalizer_handler, expires - 1)
    # When the finalizer sweeps a second before the leases end, nothing is released
    assert plane.finalize(batch_id)["closed"] is False
    run = ledger(plane).run(batch_id)
    assert (run.reserved, run.in_flight) == (reserved, 2)
    # When it sweeps as they end
    sweep.now = expires
    assert plane.finalize(batch_id)["closed"] is False
    # Then the reservations are given back, no attempt is charged, the run stays open
    run = ledger(plane).run(batch_id)
    assert (run.reserved, run.in_flight, run.spent, run.state) == (0, 0, 0, RunState.OPEN)
    assert {u.state for u in ledger(plane).units(batch_id)} == {UnitState.PENDING}
    assert ledger(plane).attempts(batch_id) == []
    # and the units' own messages are still the only ones queued (the sweep sends none)
    messages = receive_all(plane)
    assert [unit_of(m) for m in messages] == ["u0000", "u0001"]
    # When a worker finally takes them, it admits each unit again and runs it once
    for message in messages:
        plane.deliver(Lane.NORMAL, [message])
    run = assert_books_exact(plane, batch_id, model)
    assert (run.completed, run.state) == (2, RunState.COMPLETED)
    attempts = ledger(plane).attempts(batch_id)
    assert sorted((a.unit_id, a.attempt, a.reclaimed) for a in attempts) == [
        ("u0000", 0, False),
        ("u0001", 0, False),
    ]


def test_an_expired_queued_reservation_during_exhaustion_joins_the_remainder(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = watch_model(plane, monkeypatch)
    # Given a run exhausting at fan-out: u0000 and u0001 admitted, u0002..u0005 the remainder
    batch_id = submit(plane, {"units": SIX, "budget": TIGHT})
    plane.run_state_machine()
    messages = {unit_of(m): m for m in receive_all(plane)}
    assert sorted(messages) == ["u0000", "u0001"]
    # and u0001 done by a worker, while u0000 still waits in its lane
    plane.deliver(Lane.NORMAL, [messages["u0001"]])
    assert ledger(plane).run(batch_id).state is RunState.EXHAUSTING
    # When u0000's queue lease expires and the finalizer sweeps
    fake_time(monkeypatch, finalizer_handler, queued_lease(plane, batch_id, "u0000"))
    result = plane.finalize(batch_id)
    # Then u0000 joins the remainder (it was never started), which closes the run as exhausted
    assert (result["closed"], result["state"]) == (True, "exhausted")
    _, doc, _ = plane.api("GET", f"/batches/{batch_id}")
    assert doc["remainder"] == ["u0000", "u0002", "u0003", "u0004", "u0005"]
    [event] = announced(plane, batch_id)
    assert assert_results_match(plane, event)["remainder"] == doc["remainder"]
    # and when its message reaches a worker, nothing runs and the message is dropped
    plane.deliver(Lane.NORMAL, [messages["u0000"]])
    assert receive_all(plane) == [] and ledger(plane).attempts(batch_id)[0].unit_id == "u0001"
    assert len(model.of(batch_id)) == 1
    # When the tenant tops up, the whole remainder runs, each unit once, with exact books
    assert resume(plane, batch_id, 1_000_000)["requeued"] == 5
    monkeypatch.setattr(finalizer_handler, "time", time)
    assert plane.run_to_close(batch_id)["state"] == "completed"
    run = assert_books_exact(plane, batch_id, model)
    assert run.completed == 6 and len(ledger(plane).attempts(batch_id)) == 6


@pytest.mark.parametrize("sweep_lands", ["before_the_claim", "while_the_model_runs"])
def test_a_worker_taking_an_expired_queued_reservation_as_the_sweep_runs(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, sweep_lands: str
) -> None:
    freeze_sqs_clock(monkeypatch)
    model = watch_model(plane, monkeypatch)
    # Given a unit admitted at fan-out whose queue lease has expired when a worker takes it
    batch_id = submit(plane, {"units": units(1)})
    plane.run_state_machine()
    late = queued_lease(plane, batch_id, "u0000") + 1
    worker: Worker = service(plane, "worker")
    worker.governor.snapshot(time.time())  # the fleet's bucket exists: a worker created it
    monkeypatch.setattr(worker, "now", Clock(late).time)
    fake_time(monkeypatch, finalizer_handler, late)
    swept: list[RunRecord] = []

    def sweep() -> None:
        plane.finalize(batch_id)
        swept.append(ledger(plane).run(batch_id))

    # When the finalizer's sweep runs after the worker drew its tokens, before it claims the
    # attempt, or after the claim (while the model runs)
    if sweep_lands == "before_the_claim":
        fired = run_before(monkeypatch, worker.ledger, "claim_queued", sweep)
    else:
        fired = [True]
        model.during[("u0000", 0)] = sweep
    [message] = receive_all(plane)
    response = plane.deliver(Lane.NORMAL, [message])
    assert fired and swept and response["batchItemFailures"] == []
    if sweep_lands == "before_the_claim":
        # Then the sweep released the reservation, so the worker's claim finds the unit pending:
        # it reads the unit, admits the attempt again and runs it, in the same delivery
        assert (swept[0].reserved, swept[0].in_flight) == (0, 0)
        assert len(model.of(batch_id)) == 1
    else:
        # Then the claim's fresh lease protects the attempt from the sweep
        assert (swept[0].reserved, swept[0].in_flight) == (units(1)[0]["projected_tokens"], 1)
    run = assert_books_exact(plane, batch_id, model)
    assert run.completed == 1
    assert [(a.attempt, a.succeeded, a.reclaimed) for a in ledger(plane).attempts(batch_id)] == [
        (0, True, False)
    ]
    assert receive_all(plane) == []


# ---------------------------------------------------------------------- 6. top-ups racing


@pytest.mark.parametrize(
    "top_up_lands",
    [
        "during_the_fan_out",  # after the first refusal, before the other items are fanned out
        "while_the_last_attempt_runs",  # u0001 on the model, the run exhausting
        "between_the_closing_settlement_read_and_write",  # it decided: closes as exhausted
        "after_the_close_before_the_finalizer",
        "between_the_finalizers_reads",  # it read the closed run, not yet the units
    ],
)
def test_a_top_up_racing_the_workers_and_the_finalizer_keeps_the_books_exact(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, top_up_lands: str
) -> None:
    model = watch_model(plane, monkeypatch)
    # Given a run of 6 units whose budget admits u0000 and u0001 only
    batch_id = submit(plane, {"units": SIX, "budget": TIGHT})
    resumed: list[dict[str, Any]] = []
    remainder_before: list[list[str]] = []

    def top_up() -> None:
        _, doc, _ = plane.api("GET", f"/batches/{batch_id}")
        remainder_before.append(doc["remainder"])
        resumed.append(resume(plane, batch_id, 1_000_000))

    fired: list[bool] = [True]
    if top_up_lands == "while_the_last_attempt_runs":
        model.during[("u0001", 0)] = top_up
    elif top_up_lands == "between_the_closing_settlement_read_and_write":
        fired = []
        original = dynamodb_ledger.decide_settlement

        def decide(*args: Any, **kwargs: Any) -> Any:
            decided = original(*args, **kwargs)
            new_run = decided[0]
            if not fired and new_run.state is RunState.EXHAUSTED:
                fired.append(True)
                top_up()
            return decided

        monkeypatch.setattr(dynamodb_ledger, "decide_settlement", decide)
    elif top_up_lands == "between_the_finalizers_reads":
        fin = service(plane, "finalizer")
        fired = run_before(monkeypatch, fin.ledger, "units", top_up)
    # When the original execution fans the batch out (the top-up may land in between)
    for item in fan_out_events(plane):
        (outcome,) = plane.invoke("fanout", item)["units"]  # a chunk of one
        refused = outcome["outcome"] == "remainder"
        if top_up_lands == "during_the_fan_out" and refused and not resumed:
            top_up()
    # and the workers run u0000 then u0001, the last in flight
    for message in receive_all(plane):
        plane.deliver(Lane.NORMAL, [message])
    if top_up_lands == "after_the_close_before_the_finalizer":
        assert ledger(plane).run(batch_id).state is RunState.EXHAUSTED
        top_up()
    # and the original execution's finalizer polls
    first = plane.finalize(batch_id)
    # Then the top-up happened, and it reopened the run with every unit not yet run
    assert fired and len(resumed) == 1
    assert resumed[0]["state"] == "open"
    assert resumed[0]["requeued"] == len(remainder_before[0])
    # and the run finishes: every unit completed once, nothing ran after it completed
    final = first if first["state"] == "completed" else plane.run_to_close(batch_id)
    assert final["state"] == "completed"
    run = assert_books_exact(plane, batch_id, model)
    assert run.completed == 6 and run.budget == TIGHT + 1_000_000
    assert sorted(u for u, _, _, _ in model.of(batch_id)) == [u["unit_id"] for u in SIX]
    # and the closures were announced once each, consistently with their results
    events = announced(plane, batch_id)
    kinds = Counter(e["detail-type"] for e in events)
    assert kinds["run.completed"] == 1 and kinds["run.exhausted"] <= 1
    for event in events:
        results = assert_results_match(plane, event)
        if event["detail-type"] == "run.exhausted":  # what the tenant saw and resumed
            assert sorted(results["remainder"]) == sorted(remainder_before[0])
    if top_up_lands == "between_the_finalizers_reads":
        assert first["state"] == "exhausted" and kinds["run.exhausted"] == 1


def test_a_second_resume_after_the_run_exhausted_again_requeues_the_new_remainder(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = watch_model(plane, monkeypatch)
    # Given a run exhausted with u0002..u0005 in its remainder
    batch_id = submit(plane, {"units": SIX, "budget": TIGHT})
    assert plane.run_to_close(batch_id)["state"] == "exhausted"
    # and a first resume whose top-up covers one more unit only
    assert resume(plane, batch_id, top_up_for(plane, batch_id, ONE_MORE))["requeued"] == 4
    # When a second resume (a client retrying, a second operator) reads the run while it is
    # open, and the first resume's fan-out exhausts it again before the second top-up lands
    batches = service(plane, "api")
    fired = run_before(monkeypatch, batches.ledger, "top_up", plane.run_state_machine)
    second = resume(plane, batch_id, 1_000_000)
    # Then the second resume requeues the new remainder (u0003..u0005) under its own name
    assert fired
    assert ledger(plane).run(batch_id).exhaustions == 2
    assert second["requeued"] == 3 and second["state"] == "open"
    assert executions(plane) == sorted([batch_id, f"{batch_id}-resume-1", f"{batch_id}-resume-2"])
    resumes = {
        key: sorted(i["unit_id"] for i in manifest_units(read_json(plane, key)))
        for key in objects(plane, f"manifests/{batch_id}/resume-")
    }
    assert resumes == {
        f"manifests/{batch_id}/resume-1.json": ["u0002", "u0003", "u0004", "u0005"],
        f"manifests/{batch_id}/resume-2.json": ["u0003", "u0004", "u0005"],
    }
    # and the run completes: nothing stuck open, every unit run once
    assert plane.run_to_close(batch_id)["state"] == "completed"
    run = assert_books_exact(plane, batch_id, model)
    assert run.completed == 6
    assert sorted(u for u, _, _, _ in model.of(batch_id)) == [u["unit_id"] for u in SIX]
