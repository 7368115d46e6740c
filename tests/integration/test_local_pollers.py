"""The local stack's pollers follow the emulator's writes, not a clock (swarm.local.changes).

An event source mapping's poller reads its mapping again when a mapping is written (the drain
controller's ``Enabled`` flip is seen at once), and the drain parameter's rule reads the parameter
when a parameter is written; while nothing is written neither makes a request for it (an idle
local stack polled both over HTTP every half second: most of its 22% of a core)."""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from swarm.local.changes import CHANGES, PARAMETERS
from swarm.local.clients import REGION
from swarm.local.patches.emulator import patch_change_signals, patch_sqs_no_builtin_esm
from swarm.local.poller import MappingPoller, ParameterRule

PARAMETER = "/swarm/test/drain"


class Counted:
    """A client whose calls are counted by operation name."""

    def __init__(self, client: Any, calls: Counter[str]) -> None:
        self._client, self._calls = client, calls

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls[name] += 1
            return attribute(*args, **kwargs)

        return call


class Invocations:
    """Lambda's Invoke, recorded (the rule's target)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def invoke(self, FunctionName: str, Payload: bytes) -> dict[str, Any]:
        self.events.append(json.loads(Payload))
        return {"Payload": io.BytesIO(b"null")}


@pytest.fixture
def aws(aws_credentials: None) -> Iterator[Callable[[str], Any]]:
    patch_change_signals()
    patch_sqs_no_builtin_esm()
    with mock_aws():
        made: dict[str, Any] = {}

        def clients(service: str) -> Any:
            if service not in made:
                made[service] = boto3.client(service, region_name=REGION)
            return made[service]

        yield clients


def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.02)


@contextmanager
def running_in(target: Callable[[], None], stop: threading.Event) -> Iterator[None]:
    """``target`` on a thread of its own until the block ends (then ``stop`` is set)."""
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def test_writes_bump_the_versions_the_pollers_wait_for(aws: Callable[[str], Any]) -> None:
    before = CHANGES.version(PARAMETERS)
    aws("ssm").put_parameter(Name=PARAMETER, Value="off", Type="String")
    assert CHANGES.version(PARAMETERS) == before + 1
    # a wait returns at the write, not at its timeout
    waiter: list[int] = []
    thread = threading.Thread(
        target=lambda: waiter.append(CHANGES.wait(PARAMETERS, before + 1, 30))
    )
    thread.start()
    aws("ssm").put_parameter(Name=PARAMETER, Value="on", Type="String", Overwrite=True)
    thread.join(timeout=5)
    assert waiter == [before + 2]


def test_the_parameter_rule_fires_on_each_new_version_and_reads_nothing_meanwhile(
    aws: Callable[[str], Any],
) -> None:
    ssm_calls: Counter[str] = Counter()
    target = Invocations()
    services = {"ssm": Counted(aws("ssm"), ssm_calls), "lambda-invoke": target}
    aws("ssm").put_parameter(Name=PARAMETER, Value="off", Type="String")
    stop = threading.Event()
    rule = ParameterRule(services.__getitem__, PARAMETER, "arn:target", REGION, "1", stop)
    with running_in(rule.run, stop):
        eventually(lambda: ssm_calls["get_parameter"] == 1)  # its first read
        # Given nothing written for a while, the rule reads nothing
        time.sleep(1.5)
        assert ssm_calls["get_parameter"] == 1 and target.events == []
        # When the drain switch flips, the rule fires once with the change
        aws("ssm").put_parameter(Name=PARAMETER, Value="on", Type="String", Overwrite=True)
        eventually(lambda: len(target.events) == 1, timeout_s=2)
        assert target.events[0]["detail-type"] == "Parameter Store Change"
        assert target.events[0]["detail"]["operation"] == "Update"
        # and another parameter's write is read, but fires nothing
        aws("ssm").put_parameter(Name="/other", Value="x", Type="String")
        eventually(lambda: ssm_calls["get_parameter"] == 3)
        time.sleep(0.5)
        assert len(target.events) == 1


def test_a_parameter_read_that_fails_is_made_again_and_the_flip_still_fires(
    aws: Callable[[str], Any],
) -> None:
    aws("ssm").put_parameter(Name=PARAMETER, Value="off", Type="String")
    reads = {"failing": 1, "answered": 0}

    class Throttled:
        def get_parameter(self, **kwargs: Any) -> Any:
            if reads["failing"]:
                reads["failing"] -= 1
                error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
                raise ClientError(error, "GetParameter")
            reads["answered"] += 1
            return aws("ssm").get_parameter(**kwargs)

    target = Invocations()
    services = {"ssm": Throttled(), "lambda-invoke": target}
    stop = threading.Event()
    rule = ParameterRule(services.__getitem__, PARAMETER, "arn:target", REGION, "1", stop)
    with running_in(rule.run, stop):
        # Given its first read throttled, the rule reads again (it knows the version then)
        eventually(lambda: reads["answered"] == 1)
        # and the read after the flip throttled too
        reads["failing"] = 1
        aws("ssm").put_parameter(Name=PARAMETER, Value="on", Type="String", Overwrite=True)
        # Then the rule reads again and fires, once: the flip is not lost
        eventually(lambda: len(target.events) == 1, timeout_s=5)
        assert reads == {"failing": 0, "answered": 2}
        assert target.events[0]["detail"]["operation"] == "Update"


def test_a_mapping_poller_sees_its_mapping_disabled_at_once_and_rereads_it_only_then(
    aws: Callable[[str], Any],
) -> None:
    role = aws("iam").create_role(RoleName="worker", AssumeRolePolicyDocument="{}")["Role"]
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as archive:
        archive.writestr("index.py", "def handler(event, context):\n    return None\n")
    function = aws("lambda").create_function(
        FunctionName="worker",
        Runtime="python3.12",
        Role=role["Arn"],
        Handler="index.handler",
        Code={"ZipFile": code.getvalue()},
    )["FunctionArn"]
    queue = aws("sqs").create_queue(QueueName="lane")["QueueUrl"]
    arn = aws("sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    uuid = aws("lambda").create_event_source_mapping(
        EventSourceArn=arn, FunctionName=function, BatchSize=1
    )["UUID"]
    lambda_calls: Counter[str] = Counter()
    services = {"lambda": Counted(aws("lambda"), lambda_calls), "sqs": aws("sqs")}
    stop = threading.Event()
    # a long poll of 1 s (time scale 20), so the loop turns often while nothing is queued
    poller = MappingPoller(services.__getitem__, uuid, REGION, stop, time_scale=20.0)
    with running_in(poller.run, stop):
        eventually(lambda: poller.enabled)
        # Given nothing written, the poller reads its mapping only at its start
        time.sleep(2.5)
        assert lambda_calls["get_event_source_mapping"] == 1
        # When the drain controller disables the mapping, the poller sees it once its long poll
        # (1 s here) returns, and takes nothing more
        aws("lambda").update_event_source_mapping(UUID=uuid, Enabled=False)
        eventually(lambda: not poller.enabled and not poller.receiving, timeout_s=3)
        assert lambda_calls["get_event_source_mapping"] == 2
        # and enabled again, it is seen at once (a disabled poller waits for the write)
        aws("lambda").update_event_source_mapping(UUID=uuid, Enabled=True)
        eventually(lambda: poller.enabled, timeout_s=1)
