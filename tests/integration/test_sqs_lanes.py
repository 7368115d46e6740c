"""The SQS lanes adapter on moto: SendMessageBatch with a delay per entry (the worker sends a
batch's requeued units back together, each with what is left of its delay)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.adapters.aws import SqsLanes
from swarm.core.codec import parse_message_body
from swarm.core.errors import InvalidInput
from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane
from swarm.local.clients import REGION


@pytest.fixture
def sqs(aws_credentials: None) -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("sqs", region_name=REGION)


def unit(unit_id: str) -> QueuedUnit:
    return QueuedUnit("run-1", unit_id, "acme", Lane.NORMAL, 0, 10_000)


def test_send_many_delays_each_entry_by_its_own_delay(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="normal")["QueueUrl"]
    lanes = SqsLanes(sqs, {Lane.NORMAL: url})
    lanes.send_many([unit("now"), unit("later"), unit("also-now")], [0, 120, 0])
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert sorted(parse_message_body(m["Body"]).unit_id for m in received) == ["also-now", "now"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessagesDelayed"] == "1"


def test_send_many_refuses_delays_that_do_not_match_the_items(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="normal")["QueueUrl"]
    lanes = SqsLanes(sqs, {Lane.NORMAL: url})
    with pytest.raises(InvalidInput, match="2 delays for 1 items"):
        lanes.send_many([unit("one")], [1, 2])
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
