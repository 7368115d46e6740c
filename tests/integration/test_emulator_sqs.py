"""The local stack's SQS send patch (swarm/local/patches/emulator.py): a send no longer computes
the queue's message counts, and sends as moto's did.

moto read ``ContentBasedDeduplication`` from every attribute of the queue, its three message
counts included (a pass over every message each), so fanning out a 10,000-unit batch was
quadratic in its size. The counts are what such a pass costs; these tests count the passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from moto.sqs.models import Queue

from swarm.local.clients import REGION
from swarm.local.patches import emulator


@pytest.fixture
def sqs(aws_credentials: None) -> Iterator[Any]:
    emulator.patch_sqs_send_attributes()
    with mock_aws():
        yield boto3.client("sqs", region_name=REGION)


@pytest.fixture
def counts_computed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every computation of a queue's delayed-message count (one of the three passes)."""
    seen: list[str] = []
    count = Queue.approximate_number_of_messages_delayed.fget  # type: ignore[attr-defined]

    def spy(queue: Any) -> Any:
        seen.append(queue.name)
        return count(queue)

    monkeypatch.setattr(Queue, "approximate_number_of_messages_delayed", property(spy))
    return seen


def test_a_send_to_a_standard_queue_computes_no_message_count(
    sqs: Any, counts_computed: list[str]
) -> None:
    url = sqs.create_queue(QueueName="lane")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="one")
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(10)]
    )
    assert counts_computed == []
    # the queue's attributes are still all there when asked for
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "11"
    assert counts_computed  # the spy sees a computation: the test above could fail


def test_a_fifo_queue_with_content_based_deduplication_still_drops_a_duplicate(sqs: Any) -> None:
    url = sqs.create_queue(
        QueueName="lane.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    for _ in range(2):
        sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="g")
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "2"
