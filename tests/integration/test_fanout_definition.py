"""The real state machine definition on moto's Step Functions interpreter, with the real
handlers behind its ``lambda:invoke`` tasks: the finalize loop continues as a new execution
before its poll limit (here 2 polls), and the continuation skips the map; a map that cannot read
its manifest ends the execution as ``FanOutFailed`` for the sweeper.
"""

from __future__ import annotations

import io
import json
import re
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from infra.config import load_config
from infra.constants import FANOUT_ASL
from infra.context import cdk_json_context
from infra.fanout import definition_substitutions
from infra.local_definition import LOCAL_REWRITES
from swarm.adapters.dynamodb_watch import DynamoDBRunWatch
from swarm.local import patches
from swarm.local.patches import stepfunctions as sfn_patch
from tests.integration.plane import REGION, TABLE, ControlPlane, build

POLLS_PER_EXECUTION = 2
PLACEHOLDER = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
TIMEOUT_S = 90.0


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("placeholder.py", "")  # the handlers run from this repository
    return buffer.getvalue()


def _definition(fanout_arn: str, finalizer_arn: str) -> str:
    """The ASL file as the local stack deploys it, with a 1 s poll and a 2-poll limit."""
    context = cdk_json_context()
    fanout = {
        **context["fanout"],
        "finalizer_poll_seconds": 1,
        "finalizer_polls_per_execution": POLLS_PER_EXECUTION,
    }
    config = load_config({**context, "fanout": fanout})
    values = definition_substitutions(
        config=config,
        bucket_name="swarm-batches",
        fanout_arn=fanout_arn,
        finalizer_arn=finalizer_arn,
    )
    for name, rewrite in LOCAL_REWRITES.items():
        values[name] = rewrite(values[name])
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], FANOUT_ASL.read_text())


class Functions:
    """moto's Lambda Invoke, as the interpreter calls it, runs the real handler (one at a time:
    the handlers read their function name from the process environment)."""

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
    from moto.awslambda_simple.models import LambdaSimpleBackend

    patches.apply_all()
    sfn_patch.patch_sfn_start_execution()
    config = {"lambda": {"use_docker": False}, "stepfunctions": {"execute_state_machine": True}}
    with mock_aws(config=config):  # type: ignore[arg-type]
        for plane in build(monkeypatch):
            plane.observe_events()
            functions = Functions(plane)

            def invoke(backend: Any, *args: Any, _functions: Functions = functions) -> bytes:
                return _functions.invoke(backend, *args)

            monkeypatch.setattr(LambdaSimpleBackend, "invoke", invoke)
            role = boto3.client("iam", region_name=REGION).get_role(RoleName="sfn")["Role"]["Arn"]
            lam = boto3.client("lambda", region_name=REGION)
            arns = {}
            for module in ("fanout", "finalizer"):
                arns[module] = lam.create_function(
                    FunctionName=f"swarm-{module}",
                    Runtime="python3.11",
                    Role=role,
                    Handler=f"functions.{module}.handler",
                    Code={"ZipFile": _zip()},
                )["FunctionArn"]
            boto3.client("stepfunctions", region_name=REGION).update_state_machine(
                stateMachineArn=plane.state_machine_arn,
                definition=_definition(arns["fanout"], arns["finalizer"]),
            )
            yield plane, functions
            _stop_all(plane)


def _sfn() -> Any:
    return boto3.client("stepfunctions", region_name=REGION)


def _executions(plane: ControlPlane) -> dict[str, dict[str, Any]]:
    listing = _sfn().list_executions(stateMachineArn=plane.state_machine_arn)["executions"]
    return {e["name"]: e for e in listing}


def _stop_all(plane: ControlPlane) -> None:
    for found in _executions(plane).values():
        if found["status"] == "RUNNING":
            _sfn().stop_execution(executionArn=found["executionArn"])


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
    found: dict[str, Any] = _sfn().describe_execution(executionArn=arn)
    return found


def _entered(plane: ControlPlane, name: str) -> list[str]:
    arn = _describe(plane, name)["executionArn"]
    events = _sfn().get_execution_history(executionArn=arn, maxResults=1000)["events"]
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
    assert entered[:3] == ["Continuation?", "StartLoop", "FanOut"]
    assert entered.count("Finalize") == POLLS_PER_EXECUTION + 1
    assert entered[-2:] == ["ContinueAsNew", "Continued"]
    # and the continuation went straight into the finalize loop: no map, nothing admitted again
    _wait("the continuation's first poll", lambda: "Finalize" in _entered(plane, f"{batch}-c1"))
    assert _entered(plane, f"{batch}-c1")[:2] == ["Continuation?", "Finalize"]
    assert "FanOut" not in _entered(plane, f"{batch}-c1")
    with functions.lock:
        fanned = [event["unit"]["unit_id"] for name, event in functions.calls if name == "fanout"]
    assert sorted(fanned) == ["u0", "u1", "u2"]
    # and the first poll of each execution recorded it as the one finalizing the run
    watch = DynamoDBRunWatch(TABLE, client=boto3.client("dynamodb", region_name=REGION))

    def recorded() -> str | None:
        entry = watch.get(batch)
        return entry.execution if entry is not None else None

    _wait("the continuation to be recorded", lambda: recorded() not in (None, batch))
    assert re.fullmatch(rf"{batch}-c\d+", str(recorded()))

    # When the workers run the units
    with functions.lock:
        plane.work()
    # Then a continuation's finalizer closes the run; every execution succeeded, in one chain
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
    _sfn().start_execution(
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
    assert entered[-1] == "FanOutFailed" and "Finalize" not in entered
    assert functions.calls == []
