"""The finalize loop's wait for its run's closure on moto (swarm.adapters.closures): a task
waiting for its token is woken by ``notify`` once, and a token nobody waits on any more (woken
already, or its wait timed out) answers False instead of raising; an execution stopped while it
waits is aborted."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.adapters.closures import CLOSER, StepFunctionsClosures
from swarm.adapters.dynamodb import create_table
from swarm.adapters.dynamodb_items import key
from swarm.local.clients import REGION
from swarm.local.patches import apply_all
from swarm.local.patches.stepfunctions import patch_sfn_stop_stays_aborted

TABLE = "ledger"


@pytest.fixture
def aws(aws_credentials: None) -> Iterator[dict[str, Any]]:
    apply_all()
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        clients = {
            s: boto3.client(s, region_name=REGION)
            for s in ("dynamodb", "sqs", "stepfunctions", "iam")
        }
        create_table(clients["dynamodb"], TABLE)
        yield clients


def waiting_execution(aws: dict[str, Any], name: str, timeout_s: int = 60) -> tuple[str, str]:
    """An execution whose one task waits for its token (sent to a queue, where the test reads
    it, as the finalizer's poll receives it); its ARN and the token."""
    url = aws["sqs"].create_queue(QueueName=f"tokens-{name}")["QueueUrl"]
    role = aws["iam"].create_role(RoleName=f"r-{name}", AssumeRolePolicyDocument="{}")["Role"]
    definition = {
        "StartAt": "Wait",
        "States": {
            "Wait": {
                "Type": "Task",
                "Resource": "arn:aws:states:::sqs:sendMessage.waitForTaskToken",
                "Parameters": {"QueueUrl": url, "MessageBody": {"token.$": "$$.Task.Token"}},
                "TimeoutSeconds": timeout_s,
                "End": True,
            }
        },
    }
    sfn = aws["stepfunctions"]
    machine = sfn.create_state_machine(
        name=f"m-{name}", definition=json.dumps(definition), roleArn=role["Arn"]
    )["stateMachineArn"]
    execution = sfn.start_execution(stateMachineArn=machine, name=name, input="{}")["executionArn"]
    deadline = time.monotonic() + 10
    while not (
        messages := aws["sqs"].receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages")
    ):
        assert time.monotonic() < deadline, "the task never sent its token"
    return execution, json.loads(messages[0]["Body"])["token"]


def status(
    aws: dict[str, Any], execution: str, until: str, timeout_s: float = 10
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        found: dict[str, Any] = aws["stepfunctions"].describe_execution(executionArn=execution)
        if found["status"] == until or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_the_waiting_task_is_woken_once(aws: dict[str, Any]) -> None:
    closures = StepFunctionsClosures(TABLE, aws["dynamodb"], aws["stepfunctions"])
    execution, token = waiting_execution(aws, "run-1")
    # Given the poll kept its token beside the run's books
    closures.wait("run-1", token, time.time())
    item = aws["dynamodb"].get_item(TableName=TABLE, Key=key("run-1", CLOSER))["Item"]
    assert item["token"]["S"] == token and int(item["expires_at"]["N"]) > time.time()
    # When the run's closer wakes it
    assert closures.notify("run-1") is True
    # Then the waiting task succeeds, and the loop goes on to write the closure
    found = status(aws, execution, "SUCCEEDED")
    assert found["status"] == "SUCCEEDED" and json.loads(found["output"]) == {"woken": True}
    # and a second wake (a duplicate settlement, a dead letter of the same run) finds nobody
    assert closures.notify("run-1") is False


def test_a_run_whose_loop_keeps_no_token_wakes_nobody(aws: dict[str, Any]) -> None:
    closures = StepFunctionsClosures(TABLE, aws["dynamodb"], aws["stepfunctions"])
    assert closures.notify("run-without-loop") is False


def test_a_token_whose_wait_timed_out_wakes_nobody(aws: dict[str, Any]) -> None:
    closures = StepFunctionsClosures(TABLE, aws["dynamodb"], aws["stepfunctions"])
    execution, token = waiting_execution(aws, "run-2", timeout_s=1)
    closures.wait("run-2", token, time.time())
    # the loop's wait timed out (it sweeps, then keeps a fresh token)
    assert status(aws, execution, "FAILED")["status"] == "FAILED"
    assert closures.notify("run-2") is False


def test_an_execution_stopped_while_it_waits_for_its_token_is_aborted(
    aws: dict[str, Any],
) -> None:
    """At once, as on AWS (moto ended it FAILED, when the task's wait timed out:
    swarm.local.patches.stepfunctions), so the sweeper reads a stopped execution's status as AWS
    reports it."""
    patch_sfn_stop_stays_aborted()
    execution, _ = waiting_execution(aws, "run-3", timeout_s=3600)
    aws["stepfunctions"].stop_execution(executionArn=execution, cause="killed")
    # within seconds, not at the wait's hour
    assert status(aws, execution, "ABORTED", timeout_s=30)["status"] == "ABORTED"
