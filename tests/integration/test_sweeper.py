"""The sweeper on moto: the ledger's sparse index of watched runs (DynamoDBRunWatch), and the
real handler repairing runs whose execution died (Step Functions on moto keeps an execution
RUNNING until it is stopped: a stopped one is ABORTED, as an operator's StopExecution leaves it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

import functions.sweeper as sweeper_handler
from swarm.adapters.dynamodb_ledger import DynamoDBLedger
from swarm.adapters.dynamodb_watch import DynamoDBRunWatch
from swarm.contract import OPEN_TENANT, TENANT_RUNS_INDEX
from swarm.core.records import RunState
from swarm.service.batches import manifest_key
from tests.integration.conftest import TABLE as CONTRACT_TABLE
from tests.integration.plane import ControlPlane
from tests.ledger_contract import spec

# ---------------------------------------------------------------------- the index


def test_a_run_is_watched_from_ready_until_its_closure_is_released(dynamodb: Any) -> None:
    # Given a run opened at t=1000
    ledger = DynamoDBLedger(CONTRACT_TABLE, client=dynamodb, watch_grace_s=300)
    watch = DynamoDBRunWatch(CONTRACT_TABLE, client=dynamodb)
    ledger.open_run(spec(units=1), now=1_000.0)
    # Then the sweeper sees it only after the grace, through the index
    assert watch.due(1_200.0, 10) == []
    (due,) = watch.due(1_300.0, 10)
    assert (due.run_id, due.sweep_at, due.execution, due.repairs) == ("run-1", 1_300.0, None, 0)
    # When its execution's finalize loop starts, and the sweeper checks and restarts it
    assert watch.record("run-1", "run-1")
    assert watch.check("run-1", 2_000.0, repairs=1)
    (due,) = watch.due(2_000.0, 10)
    assert (due.execution, due.repairs) == ("run-1", 1)
    entry = watch.get("run-1")
    assert entry is not None and entry.sweep_at == 2_000.0
    assert watch.check("run-1", 2_500.0, repairs=2, forget_execution=True)
    entry = watch.get("run-1")
    assert entry is not None and entry.execution is None and entry.repairs == 2
    # When the run closes, a release for another closure changes nothing
    ledger.admit("run-1", "u0", 0, now=1.0)
    ledger.settle("run-1", "u0", 0, 10, True, now=2.0)
    assert not watch.release("run-1", RunState.EXHAUSTED, 0)
    assert watch.get("run-1") is not None
    # Then the release of its closure takes it out of the index, for good
    assert watch.release("run-1", RunState.COMPLETED, 0)
    assert watch.get("run-1") is None and watch.due(10**9, 10) == []
    assert not watch.record("run-1", "late-poll") and not watch.check("run-1", 1.0)
    assert not watch.release("run-1", RunState.COMPLETED, 0)
    # and a repeated open of the same run does not watch it again
    ledger.open_run(spec(units=1), now=5_000.0)
    assert watch.get("run-1") is None


def tenant_runs(client: Any, tenant: str) -> list[str]:
    """The run ids the TenantRuns index holds for ``tenant``."""
    page = client.query(
        TableName=CONTRACT_TABLE,
        IndexName=TENANT_RUNS_INDEX,
        KeyConditionExpression="#t = :t",
        ExpressionAttributeNames={"#t": OPEN_TENANT},
        ExpressionAttributeValues={":t": {"S": tenant}},
    )
    return sorted(item["pk"]["S"].removeprefix("run#") for item in page["Items"])


def test_a_tenants_index_holds_its_runs_exactly_while_they_are_watched(dynamodb: Any) -> None:
    # Given tenant-a's run, opened
    ledger = DynamoDBLedger(CONTRACT_TABLE, client=dynamodb, watch_grace_s=60)
    watch = DynamoDBRunWatch(CONTRACT_TABLE, client=dynamodb)
    ledger.open_run(spec(units=1), now=0.0)
    # Then the tenant's index holds it
    assert tenant_runs(dynamodb, "tenant-a") == ["run-1"]
    # When it completes and its closure is released
    ledger.admit("run-1", "u0", 0, now=1.0)
    ledger.settle("run-1", "u0", 0, 10, True, now=2.0)
    assert tenant_runs(dynamodb, "tenant-a") == ["run-1"]  # closed, not announced yet
    assert watch.release("run-1", RunState.COMPLETED, 0)
    # Then it leaves the tenant's index with the watch
    assert tenant_runs(dynamodb, "tenant-a") == []
    # and an exhausted run released, then reopened by a top-up, is back in it
    epoch = _exhausted(ledger, "run-x")
    assert watch.release("run-x", RunState.EXHAUSTED, epoch)
    assert tenant_runs(dynamodb, "tenant-a") == []
    ledger.top_up("run-x", 1_000, now=10.0)
    assert tenant_runs(dynamodb, "tenant-a") == ["run-x"]
    assert ledger.queued_units("tenant-a") == 1  # its remainder, queued again


def _exhausted(ledger: DynamoDBLedger, run_id: str) -> int:
    """Open ``run_id`` (2 units of 100, budget 150) and run it to exhaustion; its epoch."""
    ledger.open_run(spec(run_id=run_id, units=2, budget=150), now=0.0)
    ledger.admit(run_id, "u0", 0, now=1.0)
    assert not ledger.admit(run_id, "u1", 0, now=1.0).admitted  # the budget runs out
    ledger.settle(run_id, "u0", 0, 100, True, now=2.0)
    run = ledger.run(run_id)
    assert run.state is RunState.EXHAUSTED
    return run.exhaustions


def test_a_top_up_reopening_an_announced_run_watches_it_again(dynamodb: Any) -> None:
    ledger = DynamoDBLedger(CONTRACT_TABLE, client=dynamodb, watch_grace_s=60)
    watch = DynamoDBRunWatch(CONTRACT_TABLE, client=dynamodb)
    # Given an exhausted run whose closure was announced (the finalizer released it)
    epoch = _exhausted(ledger, "run-a")
    assert watch.release("run-a", RunState.EXHAUSTED, epoch)
    assert watch.get("run-a") is None
    # When the tenant tops it up, Then it is watched again (due after the grace)
    ledger.top_up("run-a", 1_000, now=10.0)
    entry = watch.get("run-a")
    assert entry is not None and entry.sweep_at == 70.0 and entry.repairs == 0


def test_a_release_racing_a_top_up_keeps_the_reopened_run_watched(dynamodb: Any) -> None:
    ledger = DynamoDBLedger(CONTRACT_TABLE, client=dynamodb, watch_grace_s=60)
    watch = DynamoDBRunWatch(CONTRACT_TABLE, client=dynamodb)
    # Given an exhausted run the tenant tops up before its finalizer releases the closure
    epoch = _exhausted(ledger, "run-b")
    ledger.top_up("run-b", 1_000, now=10.0)
    # When the finalizer's release of that closure lands, Then it changes nothing
    assert not watch.release("run-b", RunState.EXHAUSTED, epoch)
    assert watch.get("run-b") is not None
    # and once the reopened run completes, its own closure's release takes it out
    ledger.admit("run-b", "u1", 0, now=11.0)
    ledger.settle("run-b", "u1", 0, 100, True, now=12.0)
    assert watch.release("run-b", RunState.COMPLETED, epoch)
    assert watch.get("run-b") is None


def test_due_runs_come_most_overdue_first_a_page_at_a_time(dynamodb: Any) -> None:
    ledger = DynamoDBLedger(CONTRACT_TABLE, client=dynamodb, watch_grace_s=0)
    watch = DynamoDBRunWatch(CONTRACT_TABLE, client=dynamodb)
    for i in range(7):
        ledger.open_run(spec(run_id=f"run-{i}", units=1), now=float(100 - i))
    assert [w.run_id for w in watch.due(200.0, 3)] == ["run-6", "run-5", "run-4"]
    assert len(watch.due(200.0, 100)) == 7
    assert [w.run_id for w in watch.due(95.0, 100)] == ["run-6", "run-5"]


# ---------------------------------------------------------------------- the handler


@dataclass
class Later:
    """The sweeper handler's ``time`` module, ``ahead`` seconds in the future (runs are due)."""

    ahead: float

    def time(self) -> float:
        return time.time() + self.ahead

    def monotonic(self) -> float:
        return time.monotonic()


def sweep(plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, ahead: float) -> dict[str, Any]:
    monkeypatch.setattr(sweeper_handler, "time", Later(ahead))
    result: dict[str, Any] = plane.invoke("sweeper", {"detail-type": "Scheduled Event"})
    return result


def submit(plane: ControlPlane, units: int = 3) -> str:
    body = {
        "units": [
            {"unit_id": f"u{i}", "projected_tokens": 1_000, "input": f"task {i}"}
            for i in range(units)
        ]
    }
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 201, doc
    batch_id: str = doc["batch_id"]
    return batch_id


def execution(plane: ControlPlane, name: str) -> dict[str, Any]:
    arn = plane.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
    found: dict[str, Any] = plane.client("stepfunctions").describe_execution(executionArn=arn)
    return found


def first_poll(plane: ControlPlane, batch_id: str) -> None:
    """The finalize loop's first poll, as the state machine's Finalize task sends it."""
    arn = execution(plane, batch_id)["executionArn"]
    plane.invoke("finalizer", {"batch_id": batch_id, "execution_arn": arn, "polls": 0})


def stop(plane: ControlPlane, name: str) -> None:
    arn = execution(plane, name)["executionArn"]
    plane.client("stepfunctions").stop_execution(executionArn=arn)


def watched(plane: ControlPlane, batch_id: str) -> Any:
    return DynamoDBRunWatch(plane.ledger_table, client=plane.client("dynamodb")).get(batch_id)


def test_a_run_whose_execution_is_running_is_left_alone(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = submit(plane)
    plane.run_state_machine()
    first_poll(plane, batch_id)
    # When the sweeper runs, its execution RUNNING
    report = sweep(plane, monkeypatch, ahead=3_600)
    # Then it is left alone: no execution started, looked at again next tick
    assert report["examined"] == 1 and report["running"] == 1 and report["restarted"] == []
    sfn = plane.client("stepfunctions")
    listing = sfn.list_executions(stateMachineArn=plane.state_machine_arn)["executions"]
    assert [e["name"] for e in listing] == [batch_id]
    entry = watched(plane, batch_id)
    assert entry.execution == batch_id and entry.sweep_at > time.time() + 3_600


def test_a_finished_run_whose_execution_was_stopped_is_announced(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose units all completed, and whose execution was stopped before its
    # finalize loop saw the closure
    batch_id = submit(plane)
    plane.run_state_machine()
    first_poll(plane, batch_id)
    plane.work()
    stop(plane, batch_id)
    # When the sweeper runs
    report = sweep(plane, monkeypatch, ahead=3_600)
    # Then it announces the closure (results written, run.completed published) and forgets it
    assert report["announced"] == 1 and report["restarted"] == []
    events = [e for e in plane.events() if e["detail"]["run_id"] == batch_id]
    assert [e["detail-type"] for e in events] == ["run.completed"]
    key = events[0]["detail"]["results_key"]
    body = plane.client("s3").get_object(Bucket=plane.bucket, Key=key)
    assert json.loads(body["Body"].read())["state"] == "completed"
    assert watched(plane, batch_id) is None
    assert sweep(plane, monkeypatch, ahead=7_200)["examined"] == 0


def test_a_run_whose_map_died_is_fanned_out_again(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose execution was stopped after its open step, before its map admitted
    # anything
    batch_id = submit(plane)
    assert plane.open_step(json.loads(execution(plane, batch_id)["input"])) == 1
    stop(plane, batch_id)
    plane.processed_executions.add(execution(plane, batch_id)["executionArn"])
    # When the sweeper runs
    report = sweep(plane, monkeypatch, ahead=3_600)
    # Then a new execution runs the map over the batch's manifest
    restart = f"{batch_id}-r1"
    assert report["restarted"] == [
        {"batch_id": batch_id, "verdict": "fan_out", "execution": restart}
    ]
    started = execution(plane, restart)
    assert started["status"] == "RUNNING"
    assert json.loads(started["input"]) == {
        "batch_id": batch_id,
        "manifest_key": manifest_key(batch_id),
    }
    entry = watched(plane, batch_id)
    assert entry.repairs == 1 and entry.execution is None
    # and while the restart is alive, the next sweep leaves the run alone
    assert sweep(plane, monkeypatch, ahead=2 * 3_600)["running"] == 1
    # and that map admits every unit once, and the batch completes and leaves the index
    assert plane.run_state_machine() == [batch_id]
    plane.work()
    assert plane.finalize(batch_id)["state"] == "completed"
    assert sweep(plane, monkeypatch, ahead=3 * 3_600)["examined"] == 0


def test_a_run_whose_open_never_finished_is_restarted_from_the_open_step(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch whose execution died before its open step wrote a unit (the run is opening:
    # its status is shown, nothing can be admitted)
    batch_id = submit(plane)
    stop(plane, batch_id)
    plane.processed_executions.add(execution(plane, batch_id)["executionArn"])
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}")
    assert status == 200 and doc["state"] == "opening" and doc["units_written"] == 0
    # When the sweeper runs
    report = sweep(plane, monkeypatch, ahead=3_600)
    # Then it restarts the execution from the open step
    restart = f"{batch_id}-r1"
    assert report["restarted"] == [{"batch_id": batch_id, "verdict": "open", "execution": restart}]
    started = execution(plane, restart)
    assert json.loads(started["input"])["open"] == {
        "spec_key": f"manifests/{batch_id}/spec.json",
        "cursor": 0,
        "done": False,
    }
    # and while the restart is alive, the next sweep leaves the run alone
    assert sweep(plane, monkeypatch, ahead=2 * 3_600)["running"] == 1
    # and the restart opens the run, fans it out, and the batch completes
    assert plane.run_state_machine() == [batch_id]
    assert plane.api("GET", f"/batches/{batch_id}")[1]["state"] == "open"
    plane.work()
    assert plane.finalize(batch_id)["state"] == "completed"


def test_a_run_whose_finalize_loop_died_gets_it_back_without_the_map(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch fanned out, polled, and then stopped with its units still queued
    batch_id = submit(plane)
    plane.run_state_machine()
    first_poll(plane, batch_id)
    stop(plane, batch_id)
    # When the sweeper runs
    report = sweep(plane, monkeypatch, ahead=3_600)
    # Then a new execution enters the finalize loop directly
    restart = f"{batch_id}-r1"
    assert report["restarted"] == [
        {"batch_id": batch_id, "verdict": "finalize_loop", "execution": restart}
    ]
    assert json.loads(execution(plane, restart)["input"]) == {
        "batch_id": batch_id,
        "manifest_key": manifest_key(batch_id),
        "loop": {"root": restart, "generation": 0, "polls": 0},
    }
    # and the next sweep finds it alive
    assert sweep(plane, monkeypatch, ahead=2 * 3_600)["running"] == 1
