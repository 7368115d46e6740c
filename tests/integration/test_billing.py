"""The local stack's meter (swarm/local/billing.py) on moto: a known sequence of calls, and what
each costs in AWS's billing units. Every expected figure below is worked out by hand from the
items' sizes and AWS's rules, not read back from the meter."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.local import billing
from swarm.local.clients import REGION

ROLE = "arn:aws:iam::123456789012:role/sfn"
KEY = "AKIDBILLINGTEST"  # the test's own requests are signed with it (moto's mock sets its own)


def client(service: str) -> Any:
    return boto3.client(
        service, region_name=REGION, aws_access_key_id=KEY, aws_secret_access_key="secret"
    )


@pytest.fixture
def meter(aws_credentials: None) -> Iterator[billing.Meter]:
    """moto in this process with the meter on (STANDARD parents, EXPRESS map children, as
    deployed), every request signed with :data:`KEY` counted as ``test``."""
    billing.install()
    meter = billing.METER
    meter.configure(time_scale=1.0, parent_type="STANDARD", child_type="EXPRESS")
    meter.name_caller(KEY, "test")
    meter.reset()
    meter.enabled = True
    config: Any = {
        "lambda": {"use_docker": False},
        "stepfunctions": {"execute_state_machine": True},
    }
    try:
        with mock_aws(config=config):
            yield meter
    finally:
        meter.enabled = False
        meter.reset()


def _lines(
    meter: billing.Meter, service: str, caller: str = "test"
) -> dict[str, tuple[int, float]]:
    return {
        line["operation"]: (line["requests"], line["quantity"])
        for line in meter.snapshot()["lines"]
        if line["service"] == service and line["caller"] == caller
    }


def _ledger(client: Any) -> None:
    """A table like the ledger: pk/sk, and a sparse index projecting ``e`` (OpenRuns-like)."""
    client.create_table(
        TableName="t",
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "w", "AttributeType": "S"},
            {"AttributeName": "at", "AttributeType": "N"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "open",
                "KeySchema": [
                    {"AttributeName": "w", "KeyType": "HASH"},
                    {"AttributeName": "at", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["e"]},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def _item(sk: str, payload_bytes: int, **extra: Any) -> dict[str, Any]:
    # pk (2 + 1) + sk (2 + len) + "blob" (4 + payload) bytes
    return {"pk": {"S": "r"}, "sk": {"S": sk}, "blob": {"S": "x" * payload_bytes}, **extra}


def test_dynamodb_requests_are_billed_by_item_size_consistency_and_transactions(
    meter: billing.Meter,
) -> None:
    ddb = client("dynamodb")
    _ledger(ddb)
    # 3 + 3 + 4 + 2,500 = 2,510 bytes: 3 write units
    ddb.put_item(TableName="t", Item=_item("a", 2_500))
    # the item grows to 3 + 3 + 4 + 4,200 = 4,210 bytes: the larger size, 5 units
    ddb.update_item(
        TableName="t",
        Key={"pk": {"S": "r"}, "sk": {"S": "a"}},
        UpdateExpression="SET #b = :b",
        ExpressionAttributeNames={"#b": "blob"},  # a reserved word
        ExpressionAttributeValues={":b": {"S": "y" * 4_200}},
    )
    # a failed condition is billed on the existing item: 5 units
    with pytest.raises(ddb.exceptions.ConditionalCheckFailedException):
        ddb.put_item(
            TableName="t", Item=_item("a", 10), ConditionExpression="attribute_not_exists(pk)"
        )
    # reads: 4,210 bytes = 2 read units, strongly consistent; 1 eventually consistent
    ddb.get_item(TableName="t", Key={"pk": {"S": "r"}, "sk": {"S": "a"}}, ConsistentRead=True)
    ddb.get_item(TableName="t", Key={"pk": {"S": "r"}, "sk": {"S": "a"}})
    # a missing item still costs the minimum: half a unit, eventually consistent
    ddb.get_item(TableName="t", Key={"pk": {"S": "r"}, "sk": {"S": "zz"}})
    # a transaction of two small puts: 2 x (1 unit x 2)
    ddb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": "t", "Item": _item("b", 100)}},
            {"Put": {"TableName": "t", "Item": _item("c", 100)}},
        ]
    )
    # a Query sums its items (4,210 + 110 + 110 bytes) before rounding: 2 units, consistent
    ddb.query(
        TableName="t",
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": {"S": "r"}},
        ConsistentRead=True,
    )
    # deleting an item costs its size: 4,210 bytes = 5 units
    ddb.delete_item(TableName="t", Key={"pk": {"S": "r"}, "sk": {"S": "a"}})

    lines = _lines(meter, "dynamodb")
    assert lines["PutItem"] == (1, 3)
    assert lines["UpdateItem"] == (1, 5)
    assert lines["PutItem (condition failed)"] == (1, 5)
    assert lines["GetItem"] == (3, 2 + 1 + 0.5)
    assert lines["TransactWriteItems"] == (1, 4)
    assert lines["Query"] == (1, 2)
    assert lines["DeleteItem"] == (1, 5)
    assert lines["CreateTable"] == (1, 0)  # the control plane: counted, not billed
    assert meter.snapshot()["dynamodb"] == {"conditions failed": 1}


def test_a_cancelled_transaction_and_a_sparse_index_are_billed(meter: billing.Meter) -> None:
    ddb = client("dynamodb")
    _ledger(ddb)
    books = {"pk": {"S": "r"}, "sk": {"S": "books"}}
    # an item entering the sparse index: 1 table unit + 1 index write
    ddb.put_item(TableName="t", Item={**books, "w": {"S": "1"}, "at": {"N": "5"}, "n": {"N": "0"}})
    # an attribute the index does not project: the table only
    ddb.update_item(
        TableName="t",
        Key=books,
        UpdateExpression="SET n = :n",
        ExpressionAttributeValues={":n": {"N": "1"}},
    )
    # a projected attribute: 1 index write
    ddb.update_item(
        TableName="t",
        Key=books,
        UpdateExpression="SET e = :e",
        ExpressionAttributeValues={":e": {"S": "exec"}},
    )
    # the index key changes: a delete and a put in the index
    ddb.update_item(
        TableName="t",
        Key=books,
        UpdateExpression="SET #at = :at",
        ExpressionAttributeNames={"#at": "at"},
        ExpressionAttributeValues={":at": {"N": "9"}},
    )
    # leaving the index: 1 index write (its entry deleted)
    ddb.update_item(TableName="t", Key=books, UpdateExpression="REMOVE w")
    # a cancelled transaction: each item as if its condition failed, twice (books: 1 unit;
    # the absent item: 1 unit)
    with pytest.raises(ddb.exceptions.TransactionCanceledException):
        ddb.transact_write_items(
            TransactItems=[
                {
                    "ConditionCheck": {
                        "TableName": "t",
                        "Key": books,
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {"Put": {"TableName": "t", "Item": _item("new", 10)}},
            ]
        )
    lines = _lines(meter, "dynamodb")
    assert lines["PutItem"] == (1, 1)
    assert lines["PutItem: index open"] == (0, 1)
    assert lines["UpdateItem"] == (4, 4)
    assert lines["UpdateItem: index open"] == (0, 1 + 2 + 1)
    assert lines["TransactWriteItems (cancelled)"] == (1, 4)
    assert meter.snapshot()["dynamodb"] == {"transactions cancelled": 1}


def test_sqs_s3_events_and_ssm_requests_are_billed_as_aws_bills_them(
    meter: billing.Meter,
) -> None:
    sqs = client("sqs")
    url = sqs.create_queue(QueueName="lane")["QueueUrl"]
    # 100,000 bytes of body: two 64 KB chunks
    sqs.send_message(QueueUrl=url, MessageBody="x" * 100_000)
    # a batch of two small messages: one chunk
    sqs.send_message_batch(
        QueueUrl=url,
        Entries=[{"Id": "1", "MessageBody": "a"}, {"Id": "2", "MessageBody": "b"}],
    )
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert len(received) == 3  # 100,002 bytes: two chunks
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(received)
        ],
    )
    sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)  # empty: one request

    s3 = client("s3")
    s3.create_bucket(Bucket="bill-bucket")
    s3.put_object(Bucket="bill-bucket", Key="k", Body=b"data")
    s3.copy_object(Bucket="bill-bucket", Key="k2", CopySource={"Bucket": "bill-bucket", "Key": "k"})
    s3.get_object(Bucket="bill-bucket", Key="k")["Body"].read()
    s3.head_object(Bucket="bill-bucket", Key="k")
    s3.list_objects_v2(Bucket="bill-bucket")
    s3.delete_object(Bucket="bill-bucket", Key="k2")

    events = client("events")
    events.put_events(
        Entries=[
            {"Source": "s", "DetailType": "d", "Detail": json.dumps({"x": "y" * 70_000})},
            {"Source": "s", "DetailType": "d", "Detail": "{}"},
        ]
    )
    ssm = client("ssm")
    ssm.put_parameter(Name="/drain", Value="off", Type="String")
    ssm.get_parameter(Name="/drain")

    assert _lines(meter, "sqs") == {
        "CreateQueue": (1, 1),
        "SendMessage": (2, 2),
        "SendMessageBatch": (1, 1),
        "ReceiveMessage": (2, 2),
        "DeleteMessageBatch": (1, 1),
        "ReceiveMessage (empty)": (1, 1),
    }
    s3_lines = {
        line["operation"]: line["price"]
        for line in meter.snapshot()["lines"]
        if line["service"] == "s3" and line["caller"] == "test"
    }
    assert s3_lines == {
        "PutBucket": billing.S3_PUT,
        "PutObject": billing.S3_PUT,
        "CopyObject": billing.S3_PUT,
        "GetObject": billing.S3_GET,
        "HeadObject": billing.S3_GET,
        "ListObjectsV2": billing.S3_PUT,
        "DeleteObject": billing.S3_DELETE,
    }
    # an entry over 64 KB is two events
    assert _lines(meter, "events") == {"PutEvents": (3, 3)}
    assert _lines(meter, "ssm") == {"PutParameter": (1, 1), "GetParameter": (1, 1)}


def test_an_event_source_mappings_empty_receive_is_billed_for_awss_idle_pollers(
    meter: billing.Meter,
) -> None:
    # Given the mappings' poller (one, locally) and the application, each receiving nothing
    sqs = client("sqs")
    url = sqs.create_queue(QueueName="lane")["QueueUrl"]
    esm = boto3.client(
        "sqs", region_name=REGION, aws_access_key_id="AKIDPOLLER", aws_secret_access_key="s"
    )
    meter.name_caller("AKIDPOLLER", billing.ESM_CALLER)
    esm.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    sqs.send_message(QueueUrl=url, MessageBody="a")
    esm.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    # Then the mapping's empty receive is billed as the five Lambda keeps polling an idle
    # queue; a receive with messages, and the application's own empty receive, as one
    assert _lines(meter, "sqs", billing.ESM_CALLER) == {
        f"ReceiveMessage (empty; x{billing.ESM_IDLE_POLLERS}: AWS's idle pollers)": (5, 5),
        "ReceiveMessage": (1, 1),
    }
    assert _lines(meter, "sqs")["ReceiveMessage (empty)"] == (1, 1)


def test_a_distributed_map_bills_its_parent_transitions_and_each_express_child(
    meter: billing.Meter,
) -> None:
    definition = {
        "StartAt": "Prepare",
        "States": {
            "Prepare": {"Type": "Pass", "Next": "Fan"},
            "Fan": {
                "Type": "Map",
                "ItemsPath": "$.items",
                "ItemProcessor": {
                    # moto runs the children as STANDARD; the meter bills them as deployed
                    "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                    "StartAt": "One",
                    "States": {
                        "One": {"Type": "Pass", "Next": "Two"},
                        "Two": {"Type": "Pass", "End": True},
                    },
                },
                "Next": "Done",
            },
            "Done": {"Type": "Succeed"},
        },
    }
    sfn = client("stepfunctions")
    machine = sfn.create_state_machine(name="m", definition=json.dumps(definition), roleArn=ROLE)[
        "stateMachineArn"
    ]
    arn = sfn.start_execution(stateMachineArn=machine, input=json.dumps({"items": [1, 2, 3]}))[
        "executionArn"
    ]
    deadline = time.monotonic() + 60
    while sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
        assert time.monotonic() < deadline, "the execution did not finish"
        time.sleep(0.05)
    while meter.snapshot()["executions_running"]:  # its thread ends just after
        assert time.monotonic() < deadline
        time.sleep(0.01)

    lines = _lines(meter, "stepfunctions", "state machine")
    for state in ("Prepare", "Fan", "Done"):  # the parent's three states
        assert lines[f"state transition: {state}"] == (1, 1)
    assert lines["map child started (Distributed Map)"] == (3, 3)
    assert lines["Express execution (map child)"] == (3, 3)
    # each child is at least 100 ms of 64 MB
    requests, gb_s = lines["Express execution (map child): duration"]
    assert requests == 0 and gb_s >= 3 * 0.1 * 64 / 1024
    assert not any("(map child)" in op and "transition" in op for op in lines)
    executions = meter.snapshot()["stepfunctions"]
    assert executions["parent"]["started"] == executions["parent"]["finished"] == 1
    assert executions["map child"]["started"] == 3
    assert executions["map child"]["transitions"] == 6  # counted, not billed (Express)
    # a Standard workflow bills its transitions, not the request that starts it
    assert _lines(meter, "stepfunctions")["StartExecution"] == (1, 0)


def test_requests_signed_by_an_excluded_key_are_not_counted(meter: billing.Meter) -> None:
    meter.exclude(KEY)
    try:
        client("sqs").create_queue(QueueName="q")
    finally:
        meter._excluded.discard(KEY)
    assert meter.snapshot()["lines"] == []
