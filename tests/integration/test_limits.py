"""AWS service limits on the local emulator (swarm/local/patches/limits.py): each limit crossed
through boto3 against moto answers AWS's error, and a request just under it succeeds. Limits moto
already enforced are pinned here too (so an upgrade that drops one shows), marked "moto's own".
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from swarm.local import patches
from swarm.local.patches import limits
from tests.integration.conftest import REGION, TABLE

ROLE = "arn:aws:iam::123456789012:role/limits"


@pytest.fixture(autouse=True)
def enforced() -> None:
    patches.apply_all()
    limits.apply_all()


def _error(raised: pytest.ExceptionInfo[ClientError]) -> tuple[str, int, str]:
    response = raised.value.response
    return (
        response["Error"]["Code"],
        response["ResponseMetadata"]["HTTPStatusCode"],
        response["Error"]["Message"],
    )


# ================================================================== DynamoDB

LIMIT = limits.DYNAMODB_MAX_ITEM_BYTES


def _key(pk: str, sk: str = "x") -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _item(pk: str, size: int, sk: str = "x") -> dict[str, Any]:
    """An item of exactly ``size`` bytes as DynamoDB counts them."""
    item = {**_key(pk, sk), "blob": {"S": ""}}
    item["blob"]["S"] = "a" * (size - limits.item_size(item))
    assert limits.item_size(item) == size
    return item


def _items(dynamodb: Any) -> dict[str, int]:
    pages = dynamodb.get_paginator("scan").paginate(TableName=TABLE)  # 1 MB a page
    return {i["pk"]["S"]: limits.item_size(i) for page in pages for i in page["Items"]}


@pytest.mark.parametrize(
    ("literal", "size"),
    [  # sizes measured against DynamoDB (the 400 KB gate, bisected to the byte)
        ("0", 1),
        ("1", 2),
        ("12", 2),
        ("123", 3),
        ("12345678901234567890123456789012345678", 20),
        ("0042", 2),
        ("100", 2),
        ("1010", 3),
        ("0.0000001", 2),
        ("1E125", 2),
        ("1.5", 3),
        ("1.200", 3),
        ("3.14159", 5),
        ("123456", 4),
        ("100.5", 4),
        ("0.15", 2),
        ("-42", 3),
        ("-0", 1),
    ],
)
def test_a_number_is_sized_as_dynamodb_measures_it(literal: str, size: int) -> None:
    assert limits.number_size(literal) == size


def test_an_item_is_sized_with_names_values_and_document_overhead() -> None:
    item = {
        "pk": {"S": "abc"},
        "n": {"N": "123"},
        "b": {"B": "AAEC"},  # 3 raw bytes
        "flag": {"BOOL": True},
        "l": {"L": [{"S": "x"}, {"NULL": True}]},
        "m": {"M": {"k": {"S": "vv"}}},
        "ss": {"SS": ["a", "bc"]},
        "é": {"S": "é"},  # UTF-8: 2 + 2
    }
    # pk 2+3, n 1+3, b 1+3, flag 4+1, l 1+(3+2+2), m 1+(3+1+1+2), ss 2+3, é 2+2
    assert limits.item_size(item) == 5 + 4 + 4 + 5 + 8 + 8 + 5 + 4


def test_put_item_takes_an_item_of_400_kb_and_refuses_one_byte_more(dynamodb: Any) -> None:
    dynamodb.put_item(TableName=TABLE, Item=_item("at", LIMIT))
    with pytest.raises(ClientError) as refused:
        dynamodb.put_item(TableName=TABLE, Item=_item("over", LIMIT + 1))
    assert _error(refused) == ("ValidationException", 400, limits.ITEM_TOO_LARGE)
    assert _items(dynamodb) == {"at": LIMIT}


@pytest.mark.parametrize("operation", ["get_item", "delete_item", "update_item"])
def test_a_key_past_the_key_size_limits_is_refused_by_every_keyed_request(
    dynamodb: Any, operation: str
) -> None:
    extra = {"UpdateExpression": "SET n = :n", "ExpressionAttributeValues": {":n": {"N": "1"}}}
    kwargs = extra if operation == "update_item" else {}
    call = getattr(dynamodb, operation)
    for pk, sk, says in (("p" * 2_049, "s", "hashkey"), ("p", "s" * 1_025, "rangekey")):
        key = {"pk": {"S": pk}, "sk": {"S": sk}}
        with pytest.raises(ClientError, match=f"Size of {says} has exceeded") as refused:
            call(TableName=TABLE, Key=key, **kwargs)
        assert refused.value.response["Error"]["Code"] == "ValidationException"
    call(TableName=TABLE, Key={"pk": {"S": "p" * 2_048}, "sk": {"S": "s" * 1_024}}, **kwargs)


def test_batch_and_transacted_reads_refuse_an_oversized_key_too(dynamodb: Any) -> None:
    key = {"pk": {"S": "p" * 2_049}, "sk": {"S": "s"}}
    with pytest.raises(ClientError, match="Size of hashkey has exceeded"):
        dynamodb.batch_get_item(RequestItems={TABLE: {"Keys": [key]}})
    with pytest.raises(ClientError, match="Size of hashkey has exceeded"):
        dynamodb.transact_get_items(TransactItems=[{"Get": {"TableName": TABLE, "Key": key}}])


def test_moto_refused_items_aws_accepts_and_no_longer_does(dynamodb: Any) -> None:
    # numbers as text and binaries as base64 made moto count this item over its 405,000 bytes
    item = {
        **_key("nums"),
        "blob": {"B": b"\x00" * 300_000},
        **{f"n{i:04d}": {"N": "1234567890123456789"} for i in range(5_000)},
    }
    assert limits.item_size(item) <= LIMIT
    dynamodb.put_item(TableName=TABLE, Item=item)


def test_update_item_refuses_a_result_over_400_kb_and_leaves_the_item(dynamodb: Any) -> None:
    dynamodb.put_item(TableName=TABLE, Item=_item("u", LIMIT - 100))
    grow: dict[str, Any] = {
        "TableName": TABLE,
        "Key": _key("u"),
        "UpdateExpression": "SET extra = :v, n = :n",
        "ExpressionAttributeValues": {":v": {"S": ""}, ":n": {"N": "1"}},
    }
    # "extra" (5) + value, "n" (1) + 2: exactly at the limit, then one byte more
    grow["ExpressionAttributeValues"][":v"]["S"] = "b" * (100 - 5 - 3)
    dynamodb.update_item(**grow)
    assert _items(dynamodb) == {"u": LIMIT}
    grow["ExpressionAttributeValues"][":v"]["S"] += "b"
    with pytest.raises(ClientError) as refused:
        dynamodb.update_item(**grow)
    assert _error(refused) == ("ValidationException", 400, limits.ITEM_TO_UPDATE_TOO_LARGE)
    assert _items(dynamodb) == {"u": LIMIT}  # unchanged


def test_an_update_that_would_create_an_oversized_item_creates_nothing(dynamodb: Any) -> None:
    with pytest.raises(ClientError) as refused:
        dynamodb.update_item(
            TableName=TABLE,
            Key=_key("new"),
            UpdateExpression="SET payload = :v",
            ExpressionAttributeValues={":v": {"S": "c" * LIMIT}},
        )
    assert _error(refused)[2] == limits.ITEM_TO_UPDATE_TOO_LARGE
    assert _items(dynamodb) == {}


def test_batch_write_item_refuses_an_oversized_item_before_writing_any(dynamodb: Any) -> None:
    puts = [{"PutRequest": {"Item": _item(f"b{i}", 1_000)}} for i in range(3)]
    puts.append({"PutRequest": {"Item": _item("big", LIMIT + 1)}})
    with pytest.raises(ClientError) as refused:
        dynamodb.batch_write_item(RequestItems={TABLE: puts})
    assert _error(refused) == ("ValidationException", 400, limits.ITEM_TOO_LARGE)
    assert _items(dynamodb) == {}
    puts[-1] = {"PutRequest": {"Item": _item("big", LIMIT)}}
    dynamodb.batch_write_item(RequestItems={TABLE: puts})
    assert len(_items(dynamodb)) == 4


def test_batch_write_item_takes_25_requests_and_refuses_26(dynamodb: Any) -> None:
    puts = [{"PutRequest": {"Item": _item(f"w{i:02d}", 100)}} for i in range(26)]
    with pytest.raises(ClientError) as refused:
        dynamodb.batch_write_item(RequestItems={TABLE: puts})
    code, status, message = _error(refused)
    assert (code, status) == ("ValidationException", 400)
    assert "less than or equal to 25" in message
    assert _items(dynamodb) == {}
    dynamodb.batch_write_item(RequestItems={TABLE: puts[:25]})
    assert len(_items(dynamodb)) == 25


def test_batch_get_item_takes_100_keys_and_refuses_101(dynamodb: Any) -> None:  # moto's own
    keys = [_key(f"g{i:03d}") for i in range(101)]
    with pytest.raises(ClientError) as refused:
        dynamodb.batch_get_item(RequestItems={TABLE: {"Keys": keys}})
    code, _, message = _error(refused)
    assert code == "ValidationException"
    assert "less than or equal to 100" in message
    dynamodb.batch_get_item(RequestItems={TABLE: {"Keys": keys[:100]}})


def _put(item: dict[str, Any]) -> dict[str, Any]:
    return {"Put": {"TableName": TABLE, "Item": item}}


def test_a_transacted_oversized_put_cancels_the_transaction(dynamodb: Any) -> None:
    with pytest.raises(ClientError) as cancelled:
        dynamodb.transact_write_items(
            TransactItems=[_put(_item("t1", 100)), _put(_item("t2", LIMIT + 1))]
        )
    code, status, _ = _error(cancelled)
    assert (code, status) == ("TransactionCanceledException", 400)
    reasons = cancelled.value.response["CancellationReasons"]
    assert reasons == [
        {"Code": "None"},
        {"Code": "ValidationError", "Message": limits.ITEM_TOO_LARGE},
    ]
    assert _items(dynamodb) == {}
    dynamodb.transact_write_items(TransactItems=[_put(_item("t1", 100)), _put(_item("t2", LIMIT))])
    assert _items(dynamodb) == {"t1": 100, "t2": LIMIT}


def test_a_transacted_update_over_400_kb_cancels_the_transaction(dynamodb: Any) -> None:
    dynamodb.put_item(TableName=TABLE, Item=_item("tu", LIMIT - 10))
    update = {
        "Update": {
            "TableName": TABLE,
            "Key": _key("tu"),
            "UpdateExpression": "SET more = :v",
            "ExpressionAttributeValues": {":v": {"S": "d" * 10}},
        }
    }
    with pytest.raises(ClientError) as cancelled:
        dynamodb.transact_write_items(TransactItems=[_put(_item("other", 100)), update])
    reasons = cancelled.value.response["CancellationReasons"]
    assert reasons[1] == {"Code": "ValidationError", "Message": limits.ITEM_TO_UPDATE_TOO_LARGE}
    assert _items(dynamodb) == {"tu": LIMIT - 10}  # "other" rolled back, "tu" unchanged


def test_a_transaction_takes_4_mb_of_items_and_refuses_more(dynamodb: Any) -> None:
    full = [_put(_item(f"a{i}", LIMIT)) for i in range(10)]  # 4,096,000 bytes
    rest = limits.DYNAMODB_MAX_TRANSACTION_BYTES - 10 * LIMIT
    with pytest.raises(ClientError) as refused:
        dynamodb.transact_write_items(TransactItems=[*full, _put(_item("last", rest + 1))])
    code, status, message = _error(refused)
    assert (code, status) == ("ValidationException", 400)
    assert "4MB" in message
    assert _items(dynamodb) == {}
    dynamodb.transact_write_items(TransactItems=[*full, _put(_item("last", rest))])
    assert len(_items(dynamodb)) == 11


def test_a_transaction_takes_100_items_and_refuses_101(dynamodb: Any) -> None:  # moto's own
    puts = [_put(_item(f"c{i:03d}", 50)) for i in range(101)]
    with pytest.raises(ClientError) as refused:
        dynamodb.transact_write_items(TransactItems=puts)
    assert _error(refused)[0] == "ValidationException"
    dynamodb.transact_write_items(TransactItems=puts[:100])


@pytest.mark.parametrize(
    ("number", "message"),
    [
        ("1" * 39, limits.NUMBER_TOO_PRECISE),
        ("1E+126", limits.NUMBER_OVERFLOW),  # moto let this one through (float rounding)
        ("-1E+126", limits.NUMBER_OVERFLOW),
        ("1E-131", limits.NUMBER_UNDERFLOW),
        ("0.1E-130", limits.NUMBER_UNDERFLOW),
    ],
)
def test_numbers_out_of_range_or_precision_are_refused_everywhere(
    dynamodb: Any, number: str, message: str
) -> None:
    calls: dict[str, Callable[[], Any]] = {
        "put": lambda: dynamodb.put_item(TableName=TABLE, Item={**_key("n"), "v": {"N": number}}),
        "update value": lambda: dynamodb.update_item(
            TableName=TABLE,
            Key=_key("n"),
            UpdateExpression="SET v = :v",
            ExpressionAttributeValues={":v": {"N": number}},
        ),
        "condition value": lambda: dynamodb.delete_item(
            TableName=TABLE,
            Key=_key("n"),
            ConditionExpression="v < :v",
            ExpressionAttributeValues={":v": {"N": number}},
        ),
        "number set in a list": lambda: dynamodb.put_item(
            TableName=TABLE, Item={**_key("n"), "v": {"L": [{"NS": ["1", number]}]}}
        ),
    }
    for name, call in calls.items():
        with pytest.raises(ClientError) as refused:
            call()
        assert _error(refused) == ("ValidationException", 400, message), name
    assert _items(dynamodb) == {}


@pytest.mark.parametrize(
    "number",
    [
        "1" * 38,
        "1" * 38 + "0" * 80,  # trailing zeros are not significant
        "9.9999999999999999999999999999999999999E+125",
        "-9.9999999999999999999999999999999999999E+125",
        "1E-130",
        "0.01E-128",
        "0E+500",
    ],
)
def test_numbers_just_inside_the_limits_are_stored(dynamodb: Any, number: str) -> None:
    dynamodb.put_item(TableName=TABLE, Item={**_key("n"), "v": {"N": number}})
    dynamodb.update_item(
        TableName=TABLE,
        Key=_key("n"),
        UpdateExpression="SET w = :v",
        ExpressionAttributeValues={":v": {"N": number}},
    )


# ================================================================== Step Functions

SFN_LIMIT = limits.SFN_MAX_PAYLOAD_BYTES


@pytest.fixture
def aws(aws_credentials: None) -> Iterator[None]:
    config: Any = {
        "lambda": {"use_docker": False},
        "stepfunctions": {"execute_state_machine": True},
    }
    with mock_aws(config=config):
        yield


def _machine(definition: dict[str, Any], name: str = "limits") -> str:
    arn: str = boto3.client("stepfunctions", region_name=REGION).create_state_machine(
        name=name, definition=json.dumps(definition), roleArn=ROLE
    )["stateMachineArn"]
    return arn


def _run(machine: str, doc: Any, name: str) -> dict[str, Any]:
    sfn = boto3.client("stepfunctions", region_name=REGION)
    text = json.dumps(doc, separators=(",", ":"))
    execution = sfn.start_execution(stateMachineArn=machine, name=name, input=text)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        described: dict[str, Any] = sfn.describe_execution(executionArn=execution["executionArn"])
        if described["status"] != "RUNNING":
            return described
        time.sleep(0.05)
    raise AssertionError(f"{name} still running")


def _doc_of(size: int, **extra: Any) -> dict[str, Any]:
    """A JSON document of exactly ``size`` bytes as moto serialises it (compact)."""
    doc = {**extra, "s": ""}
    doc["s"] = "x" * (size - len(json.dumps(doc, separators=(",", ":"))))
    return doc


def test_a_state_output_of_256_kib_passes_and_one_byte_more_fails(aws: None) -> None:
    machine = _machine({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
    at = _run(machine, _doc_of(SFN_LIMIT), "at")  # moto refused exactly 262,144 bytes
    assert at["status"] == "SUCCEEDED", at
    doubled = _machine(
        {
            "StartAt": "Twice",
            "States": {
                "Twice": {
                    "Type": "Pass",
                    "Parameters": {"a.$": "$.s", "b.$": "$.s"},
                    "End": True,
                }
            },
        },
        name="doubled",
    )
    over = _run(doubled, _doc_of(SFN_LIMIT // 2 + 100), "over")
    assert (over["status"], over.get("error")) == ("FAILED", "States.DataLimitExceeded")


def test_start_execution_refuses_an_input_over_256_kib(aws: None) -> None:
    machine = _machine({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}})
    sfn = boto3.client("stepfunctions", region_name=REGION)
    with pytest.raises(ClientError) as refused:
        text = json.dumps(_doc_of(SFN_LIMIT + 1), separators=(",", ":"))
        sfn.start_execution(stateMachineArn=machine, input=text)
    code, status, message = _error(refused)
    assert (code, status) == ("ValidationException", 400)
    assert str(SFN_LIMIT) in message


def test_a_task_scheduled_with_parameters_over_256_kib_fails(aws: None) -> None:
    def machine(name: str, twice: bool) -> str:
        payload = {"a.$": "$.s", "b.$": "$.s"} if twice else {"a.$": "$.s"}
        return _machine(
            {
                "StartAt": "Call",
                "States": {
                    "Call": {
                        "Type": "Task",
                        "Resource": "arn:aws:states:::lambda:invoke",
                        "Parameters": {"FunctionName": "nowhere", "Payload": payload},
                        "End": True,
                    }
                },
            },
            name=name,
        )

    over = _run(machine("twice", True), _doc_of(SFN_LIMIT // 2 + 100), "over")
    assert (over["status"], over.get("error")) == ("FAILED", "States.DataLimitExceeded")
    under = _run(machine("once", False), _doc_of(SFN_LIMIT // 2 + 100), "under")
    assert under.get("error") != "States.DataLimitExceeded"  # it got to the (absent) function


def test_a_distributed_map_child_whose_input_is_over_256_kib_fails(aws: None) -> None:
    def machine(name: str, selector: dict[str, str]) -> str:
        return _machine(
            {
                "StartAt": "Map",
                "States": {
                    "Map": {
                        "Type": "Map",
                        "ItemsPath": "$.items",
                        "ItemSelector": selector,
                        "ItemProcessor": {
                            "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                            "StartAt": "Echo",
                            "States": {
                                "Echo": {"Type": "Pass", "Result": "ok", "End": True},
                            },
                        },
                        "End": True,
                    }
                },
            },
            name=name,
        )

    def failed_items(machine: str, name: str) -> int:
        # moto ignores the map's failure threshold (the execution succeeds whatever its children
        # do; AWS would fail it with States.ExceedToleratedFailureThreshold): count the children
        done = _run(machine, {"items": ["y" * (SFN_LIMIT // 2)]}, name)
        assert done["status"] == "SUCCEEDED", done
        sfn = boto3.client("stepfunctions", region_name=REGION)
        run = sfn.list_map_runs(executionArn=done["executionArn"])["mapRuns"][0]["mapRunArn"]
        counts: dict[str, int] = sfn.describe_map_run(mapRunArn=run)["itemCounts"]
        assert counts["total"] == 1
        return counts["failed"]

    twice = machine("twice", {"a.$": "$$.Map.Item.Value", "b.$": "$$.Map.Item.Value"})
    assert failed_items(twice, "over") == 1
    assert failed_items(machine("once", {"a.$": "$$.Map.Item.Value"}), "under") == 0


LOOP = {
    "StartAt": "Init",
    "States": {
        "Init": {"Type": "Pass", "Next": "Inc"},
        "Inc": {
            "Type": "Pass",
            "Parameters": {"n.$": "States.MathAdd($.n, 1)", "stop.$": "$.stop"},
            "Next": "Check",
        },
        "Check": {
            "Type": "Choice",
            "Choices": [{"Variable": "$.n", "NumericLessThanPath": "$.stop", "Next": "Inc"}],
            "Default": "Done",
        },
        "Done": {"Type": "Succeed"},
    },
}


def _loop_events(iterations: int) -> int:
    """ExecutionStarted, Init's 2, 4 per iteration, Done's 2, ExecutionSucceeded."""
    return 1 + 2 + 4 * iterations + 2 + 1


def _last_events(execution_arn: str) -> list[dict[str, Any]]:
    """The history's last two events, last first (moto ignores reverseOrder and paging)."""
    sfn = boto3.client("stepfunctions", region_name=REGION)
    events: list[dict[str, Any]] = sfn.get_execution_history(executionArn=execution_arn)["events"]
    return events[::-1][:2]


def _assert_history_limit(limit: int, iterations: int) -> None:
    assert _loop_events(iterations) == limit - 2  # an even history just under the limit
    machine = _machine(LOOP)
    under = _run(machine, {"n": 0, "stop": iterations}, "under")
    assert under["status"] == "SUCCEEDED"
    assert _last_events(under["executionArn"])[0]["id"] == limit - 2
    over = _run(machine, {"n": 0, "stop": iterations + 1}, "over")
    assert (over["status"], over["error"], over["cause"]) == (
        "FAILED",
        "States.Runtime",
        f"The execution reached the maximum number of history events ({limit}).",
    )
    last, before = _last_events(over["executionArn"])
    assert (last["id"], last["type"]) == (limit, "ExecutionFailed")
    assert last["executionFailedEventDetails"]["error"] == "States.Runtime"
    assert before["id"] == limit - 1


def test_an_execution_fails_at_its_history_limit(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the rule at AWS's 25,000 is the same (below, slow); a small limit runs in a second
    monkeypatch.setattr(limits, "SFN_MAX_HISTORY_EVENTS", 104)
    _assert_history_limit(104, iterations=24)


@pytest.mark.scale  # make test-scale: the same rule runs at a small limit in make test
def test_an_execution_fails_at_25000_history_events(aws: None) -> None:
    # ~35 s on moto: only the failing run (the events' shape, and a run just under the limit,
    # are checked at the small limit above; a 25,000-event history takes moto ~20 s to list)
    over = _run(_machine(LOOP), {"n": 0, "stop": 10**6}, "endless")
    assert (over["status"], over["error"], over["cause"]) == (
        "FAILED",
        "States.Runtime",
        "The execution reached the maximum number of history events (25000).",
    )


def test_a_distributed_maps_children_do_not_count_in_the_parents_history(
    aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SFN_MAX_HISTORY_EVENTS", 60)
    machine = _machine(
        {
            "StartAt": "Map",
            "States": {
                "Map": {
                    "Type": "Map",
                    "ItemsPath": "$.items",
                    "ItemProcessor": {
                        "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"},
                        "StartAt": "A",
                        "States": {
                            "A": {"Type": "Pass", "Next": "B"},
                            "B": {"Type": "Pass", "End": True},
                        },
                    },
                    "End": True,
                }
            },
        }
    )
    done = _run(machine, {"items": list(range(40))}, "map")  # 40 children x 6 events
    assert done["status"] == "SUCCEEDED", done


# ================================================================== Lambda


@pytest.fixture
def function(aws: None) -> str:
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role = boto3.client("iam", region_name=REGION).create_role(
        RoleName="limits", AssumeRolePolicyDocument=json.dumps(trust)
    )["Role"]["Arn"]
    client = boto3.client("lambda", region_name=REGION)
    client.create_function(
        FunctionName="limits",
        Runtime="python3.11",
        Role=role,
        Handler="index.handler",
        Code={"ZipFile": b"not run: moto's Docker-less backend echoes"},
    )
    return "limits"


def _invoke(function: str, payload: bytes, **kwargs: Any) -> dict[str, Any]:
    response: dict[str, Any] = boto3.client("lambda", region_name=REGION).invoke(
        FunctionName=function, Payload=payload, **kwargs
    )
    return response


def _json_of(size: int) -> bytes:
    return json.dumps("p" * (size - 2)).encode()


def test_invoke_takes_a_6_mb_request_and_refuses_one_byte_more(function: str) -> None:
    assert _invoke(function, _json_of(limits.LAMBDA_MAX_SYNC_REQUEST_BYTES))["StatusCode"] == 200
    with pytest.raises(ClientError) as refused:
        _invoke(function, _json_of(limits.LAMBDA_MAX_SYNC_REQUEST_BYTES + 1))
    assert _error(refused) == (
        "RequestEntityTooLargeException",
        413,
        "Request must be smaller than 6291456 bytes for the InvokeFunction operation",
    )


def test_an_asynchronous_invoke_takes_1_mb(function: str) -> None:
    size = limits.LAMBDA_MAX_ASYNC_REQUEST_BYTES
    sent = _invoke(function, _json_of(size), InvocationType="Event")
    assert sent["StatusCode"] == 202
    with pytest.raises(ClientError) as refused:
        _invoke(function, _json_of(size + 1), InvocationType="Event")
    assert _error(refused)[:2] == ("RequestEntityTooLargeException", 413)


def test_a_response_over_6_mb_is_the_function_error_response_size_too_large(
    function: str,
) -> None:
    from moto.awslambda_simple.models import lambda_simple_backends

    results = lambda_simple_backends["123456789012"][REGION].lambda_simple_results_queue
    size = limits.LAMBDA_MAX_SYNC_RESPONSE_BYTES
    results.extend(["r" * size, "r" * (size + 1)])
    at = _invoke(function, b"{}")
    assert "FunctionError" not in at
    assert len(at["Payload"].read()) == size  # moto failed anything over ~6,000,000 bytes
    over = _invoke(function, b"{}")
    assert over["FunctionError"] == "Unhandled"
    assert json.loads(over["Payload"].read()) == {
        "errorMessage": "Response payload size exceeded maximum allowed payload size "
        "(6291556 bytes).",
        "errorType": "Function.ResponseSizeTooLarge",
    }


# ================================================================== SQS


@pytest.fixture
def sqs(aws: None) -> Any:
    return boto3.client("sqs", region_name=REGION)


def test_a_message_is_its_body_and_attributes_up_to_the_queues_maximum(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="small", Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    attributes = {"tenant": {"DataType": "String", "StringValue": "acme"}}  # 6 + 6 + 4
    sqs.send_message(QueueUrl=url, MessageBody="m" * (1024 - 16), MessageAttributes=attributes)
    for body, extra in (("m" * (1024 - 15), attributes), ("é" * 513, {})):  # UTF-8: 1,026
        with pytest.raises(ClientError) as refused:
            sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=extra)
        assert _error(refused) == (
            "InvalidParameterValue",
            400,
            "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
        )


def test_a_queue_takes_1_mib_messages_by_default(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="default")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m" * limits.SQS_MAX_BATCH_BYTES)
    with pytest.raises(ClientError) as refused:
        sqs.send_message(QueueUrl=url, MessageBody="m" * limits.SQS_MAX_BATCH_BYTES + "é")
    assert _error(refused)[0] == "InvalidParameterValue"


def test_a_batch_takes_1_mib_in_all(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="batch")["QueueUrl"]
    half = limits.SQS_MAX_BATCH_BYTES // 2
    entries: list[dict[str, Any]] = [
        {"Id": "a", "MessageBody": "m" * half},
        {"Id": "b", "MessageBody": "m" * half},
    ]
    assert len(sqs.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]) == 2
    entries[1]["MessageAttributes"] = {"k": {"DataType": "String", "StringValue": "v"}}
    with pytest.raises(ClientError) as refused:
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    code, status, message = _error(refused)
    # SQS's JSON protocol is query-compatible: botocore reads the query error code, as from AWS
    assert (code, status) == ("AWS.SimpleQueueService.BatchRequestTooLong", 400)
    assert "1048576" in message


def test_delay_seconds_is_0_to_900(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="delays")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m", DelaySeconds=900)
    sqs.send_message(QueueUrl=url, MessageBody="m", DelaySeconds=0)
    for delay in (901, -1):  # above 900: moto's own
        with pytest.raises(ClientError) as refused:
            sqs.send_message(QueueUrl=url, MessageBody="m", DelaySeconds=delay)
        assert _error(refused) == (
            "InvalidParameterValue",
            400,
            f"Value {delay} for parameter DelaySeconds is invalid. Reason: DelaySeconds must "
            "be >= 0 and <= 900.",
        )


# ================================================================== EventBridge


def _entry(size: int) -> dict[str, Any]:
    entry = {"Source": "swarm.limits", "DetailType": "t", "Detail": ""}
    entry["Detail"] = json.dumps({"d": "e" * (size - limits.entry_size(entry) - 9)})
    assert limits.entry_size(entry) == size
    return entry


def test_put_events_takes_1_mib_of_entries_and_refuses_more(aws: None) -> None:
    events = boto3.client("events", region_name=REGION)
    half = limits.EVENTS_MAX_REQUEST_BYTES // 2
    assert events.put_events(Entries=[_entry(half), _entry(half)])["FailedEntryCount"] == 0
    with pytest.raises(ClientError) as refused:
        events.put_events(Entries=[_entry(half), _entry(half + 1)])
    assert _error(refused) == ("ValidationException", 400, limits.EVENTS_TOO_LARGE)


def test_put_events_takes_10_entries(aws: None) -> None:  # moto's own
    events = boto3.client("events", region_name=REGION)
    assert events.put_events(Entries=[_entry(100)] * 10)["FailedEntryCount"] == 0
    with pytest.raises(ClientError) as refused:
        events.put_events(Entries=[_entry(100)] * 11)
    assert _error(refused)[0] == "ValidationException"
