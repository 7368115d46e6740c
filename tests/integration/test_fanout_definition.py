"""The real state machine definition on moto's Step Functions interpreter, with the real
handlers behind its ``lambda:invoke`` tasks: the finalize loop continues as a new execution
before its poll limit (here 2 polls), and the continuation skips the map; the worker whose
settlement closes a run wakes the poll waiting for it; a map that cannot read its manifest ends
the execution as ``FanOutFailed`` for the sweeper.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from swarm.adapters.dynamodb_watch import DynamoDBRunWatch
from swarm.local.patches import emulator
from swarm.local.patches import stepfunctions as sfn_patch
from tests.integration.plane import OPTIONS, ControlPlane, assume, control_plane

#: the tier's template continues the finalize loop as a new execution after this many polls
POLLS_PER_EXECUTION = OPTIONS.finalizer_polls_per_execution
TIMEOUT_S = 90.0


class Functions:
    """moto's Lambda Invoke, as the interpreter calls it, runs the deployed function's handler
    through the plane (one at a time: the handler modules and their state are this process's
    own, not a sandbox per invocation as on the local stack), and records each call."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.lock = threading.RLock()
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def invoke(
        self,
        backend: Any,
        function_name: str,
        qualifier: str | None,
        body: Any,
        headers: Any,
        response_headers: Any,
    ) -> bytes:
        fn = backend.get_function(function_name, qualifier)
        module = fn.handler.split(".")[1]  # functions.<module>.handler
        text = body.decode() if isinstance(body, bytes) else (body or "")
        event = json.loads(text) if text.strip() else {}
        with self.lock:
            self.calls.append((module, event))
            try:
                result = self.plane.invoke(module, event)
            except Exception as error:
                response_headers["x-amz-function-error"] = "Unhandled"
                return json.dumps(
                    {"errorType": type(error).__name__, "errorMessage": str(error)}
                ).encode()
        return json.dumps(result).encode()


@pytest.fixture
def interpreter(
    aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ControlPlane, Functions]]:
    """The tier's template deployed with moto running state machines: the state machine as the
    local stack deploys it, its tasks calling the deployed functions with its own role."""
    from moto.awslambda_simple.models import LambdaSimpleBackend

    sfn_patch.patch_sfn_start_execution()
    emulator.patch_sfn_client_cache()  # the interpreter's clients sign as INTERPRETER_CREDENTIALS
    config = {"lambda": {"use_docker": False}, "stepfunctions": {"execute_state_machine": True}}
    with control_plane(monkeypatch, moto_config=config) as plane:
        plane.observe_events()
        functions = Functions(plane)

        def invoke(backend: Any, *args: Any, _functions: Functions = functions) -> bytes:
            return _functions.invoke(backend, *args)

        monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
        machine = _sfn(plane).describe_state_machine(stateMachineArn=plane.state_machine_arn)
        credentials = assume(machine["roleArn"], "states")
        monkeypatch.setattr(emulator, "INTERPRETER_CREDENTIALS", credentials.boto())
        yield plane, functions
        _stop_all(plane)


def _sfn(plane: ControlPlane) -> Any:
    return plane.client("stepfunctions")


def _executions(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    listing = _sfn(plane).list_executions(stateMachineArn=plane.state_machine_arn)["executions"]
    return {e["name"]: e for e in listing}


def _stop_all(plane: ControlPlane) -> None:
    for found in _executions(plane).values():
        if found["status"] == "RUNNING":
            _sfn(plane).stop_execution(executionArn=found["executionArn"])


def _wait(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _describe(plane: ControlPlane, name: str) -> dict[str, Any]:
    arn = plane.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
    found: dict[str, Any] = _sfn(plane).describe_execution(executionArn=arn)
    return found


def _entered(plane: ControlPlane, name: str) -> list[str]:
    arn = _describe(plane, name)["executionArn"]
    events = _sfn(plane).get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return [
        e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e
    ]


def test_the_finalize_loop_continues_as_new_and_the_continuation_skips_the_map(
    interpreter: tuple[ControlPlane, Functions],
) -> None:
    plane, functions = interpreter
    # Given a batch submitted through the API (its execution named after it)
    body = {
        "units": [
            {"unit_id": f"u{i}", "projected_tokens": 1_000, "input": f"task {i}"} for i in range(3)
        ]
    }
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 201, doc
    batch = doc["batch_id"]
    # When its finalize loop reaches the poll limit with the units still queued
    _wait("the first continuation", lambda: f"{batch}-c1" in _executions(plane))
    _wait("the first execution to end", lambda: _describe(plane, batch)["status"] != "RUNNING")
    # Then the execution succeeded after starting a continuation of the same state machine
    first = _describe(plane, batch)
    assert first["status"] == "SUCCEEDED"
    continuation = _describe(plane, f"{batch}-c1")
    assert json.loads(continuation["input"]) == {
        "batch_id": batch,
        "manifest_key": f"manifests/{batch}/units.json",
        "loop": {"root": batch, "generation": 1, "polls": 0},
        "AWS_STEP_FUNCTIONS_STARTED_BY_EXECUTION_ID": first["executionArn"],
    }
    assert continuation["stateMachineArn"] == plane.state_machine_arn
    # The first execution ran the map, polled POLLS_PER_EXECUTION + 1 times and continued
    entered = _entered(plane, batch)
    assert entered[:5] == ["Continuation?", "OpenUnits", "Opened?", "StartLoop", "FanOut"]
    # and its open step (one page: the whole batch) took a handful of history events: a
    # 100,000-unit open, a few pages, stays far under the 25,000 of an execution
    arn = first["executionArn"]
    history = _sfn(plane).get_execution_history(executionArn=arn, maxResults=1000)["events"]
    names = [e.get("stateEnteredEventDetails", {}).get("name") for e in history]
    assert names.index("StartLoop") - names.index("OpenUnits") <= 8
    # (each poll a wait for the closure that nobody ended: it timed out and swept again)
    assert entered.count("Poll") == POLLS_PER_EXECUTION + 1
    assert entered[-2:] == ["ContinueAsNew", "Continued"]
    # and the continuation went straight into the finalize loop: no map, nothing admitted again
    _wait("the continuation's first poll", lambda: "Poll" in _entered(plane, f"{batch}-c1"))
    assert _entered(plane, f"{batch}-c1")[:2] == ["Continuation?", "Poll"]
    assert "FanOut" not in _entered(plane, f"{batch}-c1")
    with functions.lock:
        fanned = [
            unit["unit_id"]
            for name, event in functions.calls
            if name == "fanout"
            for unit in event["chunk"]["units"]
        ]
    assert sorted(fanned) == ["u0", "u1", "u2"]
    # and every poll carried its task token and the loop's limit, from the template
    with functions.lock:
        polls = [event for name, event in functions.calls if event.get("action") == "poll"]
    assert polls and {e["max_polls"] for e in polls} == {POLLS_PER_EXECUTION}
    tokens = [e["task_token"] for e in polls]
    assert all(tokens) and len(set(tokens)) == len(tokens)  # a fresh one each poll
    # and the first poll of each execution recorded it as the one finalizing the run
    watch = DynamoDBRunWatch(plane.ledger_table, client=plane.client("dynamodb"))

    def recorded() -> str | None:
        entry = watch.get(batch)
        return entry.execution if entry is not None else None

    _wait("the continuation to be recorded", lambda: recorded() not in (None, batch))
    assert re.fullmatch(rf"{batch}-c\d+", str(recorded()))

    # When the workers run the units (the last settlement hands the waiting poll its token
    # back, or the next poll finds the run closed)
    with functions.lock:
        plane.work()
    # Then a continuation writes the closure; every execution succeeded, in one chain
    _wait(
        "the chain to end",
        lambda: all(e["status"] != "RUNNING" for e in _executions(plane).values()),
    )
    executions = _executions(plane)
    assert {e["status"] for e in executions.values()} == {"SUCCEEDED"}
    chain = [batch] + [f"{batch}-c{n}" for n in range(1, len(executions))]
    assert sorted(executions) == sorted(chain)
    announced = [e for e in plane.events() if e["detail"]["run_id"] == batch]
    assert [e["detail-type"] for e in announced] == ["run.completed"]
    assert watch.get(batch) is None  # announced: the sweeper forgets it


def test_a_map_that_cannot_read_its_manifest_ends_the_execution_for_the_sweeper(
    interpreter: tuple[ControlPlane, Functions],
) -> None:
    plane, functions = interpreter
    # When an execution's manifest is missing (the ItemReader fails)
    _sfn(plane).start_execution(
        stateMachineArn=plane.state_machine_arn,
        name="b-missing",
        input=json.dumps({"batch_id": "b-missing", "manifest_key": "manifests/b-missing/x.json"}),
    )
    _wait("the execution to end", lambda: _describe(plane, "b-missing")["status"] != "RUNNING")
    # Then it failed as FanOutFailed, with the map's error as the cause, and no finalize loop
    found = _describe(plane, "b-missing")
    assert found["status"] == "FAILED"
    assert found["error"] == "FanOutFailed"
    assert "Error" in json.loads(found["cause"])
    entered = _entered(plane, "b-missing")
    assert entered[-1] == "FanOutFailed" and "Poll" not in entered
    assert functions.calls == []
