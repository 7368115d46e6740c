"""Which (IAM action, resource ARN) pairs the local stack authorizes for a request, as AWS does."""

from __future__ import annotations

from swarm.local.patches.iam import authorization_requests, role_of

R, A = "us-east-1", "123456789012"
TABLE = f"arn:aws:dynamodb:{R}:{A}:table"


def test_a_transaction_is_authorized_item_by_item_on_each_table() -> None:
    body = {
        "TransactItems": [
            {"Put": {"TableName": "ledger", "Item": {}}},
            {"Update": {"TableName": "ledger", "Key": {}}},
            {"ConditionCheck": {"TableName": "governor", "Key": {}}},
            {"Delete": {"TableName": "governor", "Key": {}}},
        ]
    }
    assert authorization_requests("dynamodb", "TransactWriteItems", body, "/", R, A) == [
        ("dynamodb:PutItem", f"{TABLE}/ledger"),
        ("dynamodb:UpdateItem", f"{TABLE}/ledger"),
        ("dynamodb:ConditionCheckItem", f"{TABLE}/governor"),
        ("dynamodb:DeleteItem", f"{TABLE}/governor"),
    ]


def test_batch_reads_name_every_table_and_a_query_its_index() -> None:
    body = {"RequestItems": {"a": {}, "b": {}}}
    assert authorization_requests("dynamodb", "BatchGetItem", body, "/", R, A) == [
        ("dynamodb:BatchGetItem", f"{TABLE}/a"),
        ("dynamodb:BatchGetItem", f"{TABLE}/b"),
    ]
    query = {"TableName": "t", "IndexName": "open"}
    assert authorization_requests("dynamodb", "Query", query, "/", R, A) == [
        ("dynamodb:Query", f"{TABLE}/t/index/open")
    ]


def test_sqs_batches_are_authorized_as_their_single_message_action() -> None:
    body = {"QueueUrl": f"http://localhost:5000/{A}/lane-high", "Entries": []}
    expected = f"arn:aws:sqs:{R}:{A}:lane-high"
    assert authorization_requests("sqs", "SendMessageBatch", body, "/", R, A) == [
        ("sqs:SendMessage", expected)
    ]
    assert authorization_requests("sqs", "DeleteMessageBatch", body, "/", R, A) == [
        ("sqs:DeleteMessage", expected)
    ]


def test_parameters_buses_machines_and_functions_by_their_arns() -> None:
    ssm = authorization_requests("ssm", "GetParameter", {"Name": "/swarm/dev/drain"}, "/", R, A)
    assert ssm == [("ssm:GetParameter", f"arn:aws:ssm:{R}:{A}:parameter/swarm/dev/drain")]
    entries = {"Entries": [{"EventBusName": "bus"}, {"EventBusName": "bus"}, {}]}
    assert authorization_requests("events", "PutEvents", entries, "/", R, A) == [
        ("events:PutEvents", f"arn:aws:events:{R}:{A}:event-bus/bus"),
        ("events:PutEvents", f"arn:aws:events:{R}:{A}:event-bus/default"),
    ]
    machine = f"arn:aws:states:{R}:{A}:stateMachine:fanout"
    body = {"stateMachineArn": machine, "input": "{}"}
    assert authorization_requests("states", "StartExecution", body, "/", R, A) == [
        ("states:StartExecution", machine)
    ]
    path = f"/2015-03-31/functions/arn%3Aaws%3Alambda%3A{R}%3A{A}%3Afunction%3Aw%3Alive/invocations"
    assert authorization_requests("lambda", "Invoke", {}, path, R, A) == [
        ("lambda:InvokeFunction", f"arn:aws:lambda:{R}:{A}:function:w")
    ]
    mapping = "/2015-03-31/event-source-mappings/1234-abcd"
    assert authorization_requests("lambda", "UpdateEventSourceMapping", {}, mapping, R, A) == [
        (
            "lambda:UpdateEventSourceMapping",
            f"arn:aws:lambda:{R}:{A}:event-source-mapping:1234-abcd",
        )
    ]


def test_requests_without_a_resource_are_judged_against_star() -> None:
    assert authorization_requests("sqs", "ListQueues", {}, "/", R, A) == [("sqs:ListQueues", "*")]


def test_the_role_of_a_session() -> None:
    assert role_of(f"arn:aws:sts::{A}:assumed-role/swarm-tenant-acme/cli") == "swarm-tenant-acme"
    assert role_of(f"arn:aws:iam::{A}:user/admin") == f"arn:aws:iam::{A}:user/admin"
