"""The control plane's resources on in-process moto, and its real handlers driven by events.

``ControlPlane`` creates what the stack would (one table for the governor and the ledger, the
lanes and their DLQs, the bucket, the drain parameter, the event bus, a state machine to start
executions on), sets every function's environment from the contract in ``swarm.settings``, and
plays the parts of API Gateway, the state machine and the SQS event source mappings.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from swarm.adapters import create_table
from swarm.adapters.aws import EventBridgeEvents
from swarm.contract import (
    BUCKET_NAME,
    DEFAULT_BUDGET_TOKENS,
    DRAIN_PARAMETER_NAME,
    EVENT_BUS_NAME,
    GOVERNOR_CAPACITY,
    GOVERNOR_MAX_WAIT_SECONDS,
    GOVERNOR_SHARE,
    GOVERNOR_TABLE_NAME,
    LEASE_SECONDS,
    LEDGER_TABLE_NAME,
    MAX_ATTEMPTS,
    MAX_BUDGET_TOKENS,
    MODEL_ADAPTER,
    POWERTOOLS_METRICS_NAMESPACE,
    POWERTOOLS_SERVICE_NAME,
    QUOTA_TPM,
    SIM_MODEL_FAILURE_RATE,
    SIM_MODEL_QUOTA_TPM,
    SIM_MODEL_SEED,
    STAGE,
    STATE_MACHINE_ARN,
    SWARM_FUNCTION,
    SWEEP_INTERVAL_SECONDS,
    TENANT_PRINCIPAL_PREFIX,
    dlq_url_var,
    lane_reserve_var,
    queue_url_var,
    shed_depth_var,
    worker_mapping_var,
)
from swarm.core.records import LANES, Lane
from swarm.local.events import LambdaContext, proxy_event, sqs_event

REGION = "us-east-1"
ACCOUNT = "123456789012"
TABLE = "swarm-local"
PREFIX = "swarm-tenant-"


def tenant_arn(tenant: str) -> str:
    return f"arn:aws:sts::{ACCOUNT}:assumed-role/{PREFIX}{tenant}/session"


@dataclass
class ControlPlane:
    env: dict[str, str]
    queue_urls: dict[Lane, str]
    dlq_urls: dict[Lane, str]
    state_machine_arn: str
    processed_executions: set[str] = field(default_factory=set)
    events_url: str | None = None
    announced: list[dict[str, Any]] = field(default_factory=list)

    # ------------------------------------------------------------------ plumbing
    @staticmethod
    def client(service: str) -> Any:
        return boto3.client(service, region_name=REGION)

    def invoke(self, function: str, event: Mapping[str, Any]) -> Any:
        module = importlib.import_module(f"functions.{function}")
        os.environ[SWARM_FUNCTION] = function
        return module.handler(dict(event), LambdaContext(function))

    # ------------------------------------------------------------------ API Gateway
    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        tenant: str | None = "acme",
        headers: Mapping[str, str] | None = None,
        raw: str | None = None,
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        text = raw if raw is not None else (None if body is None else json.dumps(body))
        event = proxy_event(
            method,
            path,
            body=text,
            headers={"Content-Type": "application/json", **(headers or {})},
            user_arn=tenant_arn(tenant) if tenant else None,
        )
        response = self.invoke("api", event)
        headers = dict(response.get("headers") or {})
        for name, values in (response.get("multiValueHeaders") or {}).items():
            headers.setdefault(name, values[0])
        return response["statusCode"], json.loads(response["body"]), headers

    # ------------------------------------------------------------------ the state machine
    def fan_out_events(self) -> list[dict[str, Any]]:
        """The Distributed Map's item events of every execution not processed yet (marked
        processed now): what the map would pass to the fan-out step, one per manifest item."""
        sfn, s3 = self.client("stepfunctions"), self.client("s3")
        events = []
        for execution in sfn.list_executions(stateMachineArn=self.state_machine_arn)["executions"]:
            arn = execution["executionArn"]
            if arn in self.processed_executions:
                continue
            self.processed_executions.add(arn)
            payload = json.loads(sfn.describe_execution(executionArn=arn)["input"])
            body = s3.get_object(Bucket=self.env[BUCKET_NAME], Key=payload["manifest_key"])
            for index, item in enumerate(json.loads(body["Body"].read())):
                events.append({"batch_id": payload["batch_id"], "index": index, "unit": item})
        return events

    def run_state_machine(self) -> list[str]:
        """Each new execution: every manifest item through the fan-out step (what the
        Distributed Map does); the finalizer then runs in :meth:`finalize`."""
        started: list[str] = []
        for event in self.fan_out_events():
            self.invoke("fanout", event)
            if event["batch_id"] not in started:
                started.append(event["batch_id"])
        return started

    def finalize(self, batch_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.invoke("finalizer", {"batch_id": batch_id})
        return result

    # ------------------------------------------------------------------ the ESM pollers
    def receive(self, lane: Lane, max_messages: int = 10, dlq: bool = False) -> list[Any]:
        url = (self.dlq_urls if dlq else self.queue_urls)[lane]
        return list(
            self.client("sqs")
            .receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=max_messages,
                AttributeNames=["All"],
                VisibilityTimeout=int(self.env[LEASE_SECONDS]),
            )
            .get("Messages", [])
        )

    def deliver(
        self, lane: Lane, messages: list[Any], dlq: bool = False, fast_retry: bool = True
    ) -> dict[str, Any]:
        """One batch to the worker (or the DLQ handler); deletes what succeeded, as the ESM does.

        ``fast_retry`` makes a failed message visible again at once instead of after the worker's
        retry backoff (moto keeps real time).
        """
        url = (self.dlq_urls if dlq else self.queue_urls)[lane]
        sqs = self.client("sqs")
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        response: dict[str, Any] = self.invoke(
            "dlq" if dlq else "worker", sqs_event(arn, messages, REGION)
        )
        failed = {f["itemIdentifier"] for f in response["batchItemFailures"]}
        for m in messages:
            if m["MessageId"] not in failed:
                sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
            elif fast_retry:
                sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                )
        return response

    def work(self, max_batches: int = 500) -> int:
        """Poll every lane (highest first) until nothing is visible; returns batches delivered."""
        for n in range(max_batches):
            for lane in LANES:
                messages = self.receive(lane)
                if messages:
                    self.deliver(lane, messages)
                    break
            else:
                return n
        raise AssertionError("the lanes never drained")

    # ------------------------------------------------------------------ EventBridge
    def observe_events(self) -> None:
        """A rule on the bus with an SQS target: every event the functions publish lands there."""
        sqs, events = self.client("sqs"), self.client("events")
        url = sqs.create_queue(QueueName="swarm-test-events")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        bus = self.env[EVENT_BUS_NAME]
        events.put_rule(
            Name="observe-all",
            EventBusName=bus,
            EventPattern=json.dumps({"source": [EventBridgeEvents.source]}),
        )
        events.put_targets(Rule="observe-all", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
        self.events_url = url

    def events(self) -> list[dict[str, Any]]:
        """Every event published on the bus since :meth:`observe_events`, oldest first."""
        assert self.events_url is not None, "call observe_events() first"
        sqs = self.client("sqs")
        while True:
            messages = sqs.receive_message(
                QueueUrl=self.events_url, MaxNumberOfMessages=10, VisibilityTimeout=0
            ).get("Messages", [])
            if not messages:
                return list(self.announced)
            for m in messages:
                self.announced.append(json.loads(m["Body"]))
                sqs.delete_message(QueueUrl=self.events_url, ReceiptHandle=m["ReceiptHandle"])

    def set_drain(self, on: bool) -> None:
        self.client("ssm").put_parameter(
            Name=self.env[DRAIN_PARAMETER_NAME],
            Value="on" if on else "off",
            Type="String",
            Overwrite=True,
        )


@dataclass
class SqsClock:
    """moto's SQS clock, frozen: a message leaves its delay or its visibility timeout only when
    the test advances the clock, never because wall time passed."""

    now_ms: float

    def millis(self) -> float:
        return self.now_ms

    def seconds(self) -> float:
        return self.now_ms / 1000.0

    def advance(self, seconds: float) -> None:
        self.now_ms += seconds * 1000.0


def freeze_sqs_clock(monkeypatch: pytest.MonkeyPatch) -> SqsClock:
    """Replace the clock of moto's SQS backend (and the visibility and delay checks, which the
    local emulator's patch may have rebound to ``time.time``) with a :class:`SqsClock`."""
    from moto.sqs import models

    clock = SqsClock(time.time() * 1000.0)
    monkeypatch.setattr(models, "unix_time_millis", clock.millis)
    monkeypatch.setattr(models, "unix_time", clock.seconds)
    monkeypatch.setattr(models.Message, "visible", property(lambda m: clock.now_ms > m.visible_at))
    monkeypatch.setattr(
        models.Message, "delayed", property(lambda m: clock.now_ms < m.delayed_until)
    )
    return clock


def reset_handler_caches() -> None:
    for name in ("api", "worker", "fanout", "finalizer", "dlq", "drain", "sweeper"):
        module = importlib.import_module(f"functions.{name}")
        module._cache.clear()


def build(monkeypatch: pytest.MonkeyPatch, **overrides: str) -> Iterator[ControlPlane]:
    """Create the resources inside an active ``mock_aws`` and set the functions' environment."""
    sqs = boto3.client("sqs", region_name=REGION)
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    create_table(dynamodb, TABLE)
    queue_urls, dlq_urls = {}, {}
    for lane in LANES:
        dlq = sqs.create_queue(QueueName=f"swarm-{lane.value}-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        queue_urls[lane] = sqs.create_queue(
            QueueName=f"swarm-{lane.value}",
            Attributes={
                "VisibilityTimeout": "60",
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}),
            },
        )["QueueUrl"]
        dlq_urls[lane] = dlq
    boto3.client("s3", region_name=REGION).create_bucket(Bucket="swarm-batches")
    ssm = boto3.client("ssm", region_name=REGION)
    ssm.put_parameter(Name="/swarm/test/drain", Value="off", Type="String")
    boto3.client("events", region_name=REGION).create_event_bus(Name="swarm-test")
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(
        RoleName="sfn",
        AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []}),
    )["Role"]["Arn"]
    machine = boto3.client("stepfunctions", region_name=REGION).create_state_machine(
        name="fanout",
        definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}),
        roleArn=role,
    )["stateMachineArn"]
    env = {
        STAGE: "test",
        POWERTOOLS_SERVICE_NAME: "swarm",
        POWERTOOLS_METRICS_NAMESPACE: "Swarm",
        "POWERTOOLS_TRACE_DISABLED": "1",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        GOVERNOR_TABLE_NAME: TABLE,
        LEDGER_TABLE_NAME: TABLE,
        BUCKET_NAME: "swarm-batches",
        STATE_MACHINE_ARN: machine,
        EVENT_BUS_NAME: "swarm-test",
        DRAIN_PARAMETER_NAME: "/swarm/test/drain",
        QUOTA_TPM: "6000000",
        GOVERNOR_SHARE: "0.95",
        GOVERNOR_CAPACITY: "300000",  # 3 s of quota: a lane's reserve refills in a blink
        GOVERNOR_MAX_WAIT_SECONDS: "10",
        MAX_ATTEMPTS: "3",
        LEASE_SECONDS: "60",
        DEFAULT_BUDGET_TOKENS: "1000000",
        MAX_BUDGET_TOKENS: "100000000",
        TENANT_PRINCIPAL_PREFIX: PREFIX,
        SWEEP_INTERVAL_SECONDS: "900",
        MODEL_ADAPTER: "simulated",
        SIM_MODEL_QUOTA_TPM: "6500000",
        SIM_MODEL_FAILURE_RATE: "0",
        SIM_MODEL_SEED: "7",
    }
    for lane in LANES:
        env[queue_url_var(lane)] = queue_urls[lane]
        env[dlq_url_var(lane)] = dlq_urls[lane]
        env[lane_reserve_var(lane)] = {"high": "0", "normal": "0.05", "low": "0.1"}[lane.value]
        env[shed_depth_var(lane)] = {"high": "5000", "normal": "2000", "low": "500"}[lane.value]
        env[worker_mapping_var(lane)] = f"esm-{lane.value}"
    env.update(overrides)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(SWARM_FUNCTION, "api")
    reset_handler_caches()
    yield ControlPlane(env, queue_urls, dlq_urls, machine)
    reset_handler_caches()
