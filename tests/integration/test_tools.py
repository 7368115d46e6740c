"""The shipped tools on the tier's plane (the template deployed into moto, IAM enforced, each
handler run with its own function's environment and role), and the worker's executor.

- notes_write has exactly one effect per idempotency key, even with eight callers at once;
- a tenant never reads or writes another tenant's notes or objects;
- object_read reads the tenant's own folder, bounded, text only;
- each tool's role is refused what it does not need (the ledger, the bucket's other prefixes);
- LambdaToolExecutor maps every failure of a tool to an error result the model can act on.
"""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError, ReadTimeoutError

from swarm.adapters.tool_journals import DynamoDBJournals
from swarm.adapters.tool_objects import MAX_OBJECT_BYTES
from swarm.adapters.tools import LambdaToolExecutor, RegisteredTool, ToolGrants, ToolRegistry
from swarm.contract import NOTES_TABLE_NAME, TOOL_JOURNALS_TABLE_NAME
from swarm.core.agent import Tool, ToolCall, ToolOutcome
from tests.integration.plane import ControlPlane


def _event(
    tool: str, value: dict[str, Any], tenant: str = "acme", key: str = "b/u/t1"
) -> dict[str, Any]:
    return {
        "tool": tool,
        "input": value,
        "idempotency_key": key,
        "tenant": tenant,
        "batch": "b",
        "unit": "u",
    }


def _note_items(plane: ControlPlane) -> list[dict[str, Any]]:
    table = plane.env("notes")[NOTES_TABLE_NAME]
    return plane.client("dynamodb").scan(TableName=table, ConsistentRead=True)["Items"]


def test_notes_write_has_one_effect_per_key_with_eight_callers_at_once(plane: ControlPlane) -> None:
    start = threading.Barrier(8)
    answers: list[dict[str, Any]] = [{}] * 8

    def call(i: int) -> None:
        start.wait()
        # the same call (same key) with different values: only one may take effect
        answers[i] = plane.invoke(
            "notes", _event("notes_write", {"name": "plan", "value": "x" * (i + 1)})
        )

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a["status"] == "success" for a in answers), answers
    assert len({json.dumps(a, sort_keys=True) for a in answers}) == 1  # the first outcome, 8 times
    note = plane.invoke("notes", _event("notes_read", {"name": "plan"}))["content"]
    assert note["found"] and len(note["value"]) == answers[0]["content"]["chars"]
    # one note and one key record: the losers wrote nothing
    assert sorted(i["sk"]["S"] for i in _note_items(plane)) == ["k#b/u/t1", "n#plan"]

    # the same key again, later (a redelivered unit): the first outcome, no second effect
    again = plane.invoke("notes", _event("notes_write", {"name": "plan", "value": "changed"}))
    assert again == answers[0]
    assert plane.invoke("notes", _event("notes_read", {"name": "plan"}))["content"] == note
    # a new key is a new call
    plane.invoke("notes", _event("notes_write", {"name": "plan", "value": "new"}, key="b/u/t2"))
    assert (
        plane.invoke("notes", _event("notes_read", {"name": "plan"}))["content"]["value"] == "new"
    )


def test_a_tenant_never_reads_or_writes_another_tenants_notes(plane: ControlPlane) -> None:
    plane.invoke("notes", _event("notes_write", {"name": "secret", "value": "acme's"}))
    assert plane.invoke("notes", _event("notes_read", {"name": "secret"}, tenant="globex")) == {
        "status": "success",
        "content": {"name": "secret", "found": False},
    }
    listed = plane.invoke("notes", _event("notes_read", {}, tenant="globex"))["content"]
    assert listed == {"names": [], "more": False}
    # globex's call with the very same idempotency key is its own call, on its own note
    answer = plane.invoke(
        "notes", _event("notes_write", {"name": "secret", "value": "globex's"}, tenant="globex")
    )
    assert answer["content"]["chars"] == len("globex's")
    assert (
        plane.invoke("notes", _event("notes_read", {"name": "secret"}))["content"]["value"]
        == "acme's"
    )
    assert plane.invoke("notes", _event("notes_read", {}))["content"]["names"] == ["secret"]
    # the model cannot name a tenant: a name is a sort key under the caller's own partition
    sneaky = plane.invoke("notes", _event("notes_read", {"name": "../globex/secret"}))
    assert sneaky["content"]["found"] is False


@pytest.mark.parametrize(
    ("tool", "value", "says"),
    [
        ("notes_write", {"name": "a b", "value": "v"}, "name must be"),
        ("notes_write", {"name": "ok"}, "value must be a text"),
        ("notes_write", {"name": "ok", "value": "v" * 16_001}, "at most 16,000"),
        ("notes_read", {"name": 7}, "name must be"),
        ("calculator", {"expression": "2 ** 99999"}, "expression: exponent"),
        ("calculator", {}, "expression: expression must be a non-empty text"),
        ("object_read", {"key": "../globex/x"}, "must not hold"),
        ("object_read", {"key": "/etc/passwd"}, "not starting with '/'"),
    ],
)
def test_a_bad_input_is_an_error_result_telling_the_model_what_to_send(
    plane: ControlPlane, tool: str, value: dict[str, Any], says: str
) -> None:
    source = {"notes_write": "notes", "notes_read": "notes"}.get(tool, tool)
    answer = plane.invoke(source, _event(tool, value))
    assert answer["status"] == "error"
    assert says in answer["content"]


def test_object_read_reads_only_the_tenants_own_folder(plane: ControlPlane) -> None:
    s3 = plane.client("s3")
    s3.put_object(
        Bucket=plane.bucket, Key="manifests/uploads/acme/notes.txt", Body=b"hello \xc3\xa9"
    )
    s3.put_object(
        Bucket=plane.bucket,
        Key="manifests/uploads/acme/big.txt",
        Body=b"a" * (MAX_OBJECT_BYTES + 10),
    )
    s3.put_object(Bucket=plane.bucket, Key="manifests/uploads/acme/blob.bin", Body=b"\xff\xfe\x00")
    read = plane.invoke("object_read", _event("object_read", {"key": "notes.txt"}))
    assert read == {
        "status": "success",
        "content": {"key": "notes.txt", "bytes": 8, "truncated": False, "text": "hello é"},
    }
    big = plane.invoke("object_read", _event("object_read", {"key": "big.txt"}))["content"]
    assert big["truncated"] and big["bytes"] == MAX_OBJECT_BYTES + 10
    assert len(big["text"]) == MAX_OBJECT_BYTES
    blob = plane.invoke("object_read", _event("object_read", {"key": "blob.bin"}))
    assert blob["status"] == "error" and "not UTF-8 text" in blob["content"]
    other = plane.invoke(
        "object_read", _event("object_read", {"key": "notes.txt"}, tenant="globex")
    )
    assert other == {"status": "error", "content": "no object 'notes.txt' in your folder"}


def test_each_tool_role_is_refused_what_it_does_not_need(plane: ControlPlane) -> None:
    notes = plane.functions["notes"].clients
    with pytest.raises(ClientError) as denied:
        notes("dynamodb").get_item(
            TableName=plane.ledger_table, Key={"pk": {"S": "x"}, "sk": {"S": "y"}}
        )
    assert denied.value.response["Error"]["Code"] == "AccessDeniedException"
    objects = plane.functions["object_read"].clients
    plane.client("s3").put_object(Bucket=plane.bucket, Key="results/b-1/x.json", Body=b"{}")
    with pytest.raises(ClientError) as refused:
        objects("s3").get_object(Bucket=plane.bucket, Key="results/b-1/x.json")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError):
        objects("dynamodb").scan(TableName=plane.env("notes")[NOTES_TABLE_NAME])
    calculator = plane.functions["calculator"].clients
    with pytest.raises(ClientError):
        calculator("s3").get_object(Bucket=plane.bucket, Key="manifests/uploads/acme/x")


# --- the worker's executor ---------------------------------------------------------------------
def _registry(timeout_s: float = 5) -> ToolRegistry:
    tool = RegisteredTool(
        "calculator",
        "arn:aws:lambda:us-east-1:123456789012:function:calc",
        timeout_s,
        "read",
        Tool("calculator", "d", {"type": "object"}),
    )
    return ToolRegistry(
        {"calculator": tool}, ToolGrants(frozenset({"calculator"}), ("calculator",))
    )


CALL = ToolCall(1, "tooluse_1", "calculator", {"expression": "6 * 7"}, "b/u/tooluse_1")


class Answering:
    """A Lambda client whose Invoke answers ``payload`` (with ``function_error``), or raises."""

    def __init__(
        self,
        payload: Any = None,
        function_error: str | None = None,
        raises: Exception | None = None,
    ) -> None:
        self.payload, self.function_error, self.raises = payload, function_error, raises
        self.calls: list[dict[str, Any]] = []

    def invoke(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        if self.raises is not None:
            raise self.raises
        body = (
            self.payload if isinstance(self.payload, bytes) else json.dumps(self.payload).encode()
        )
        answer: dict[str, Any] = {"StatusCode": 200, "Payload": io.BytesIO(body)}
        if self.function_error:
            answer["FunctionError"] = self.function_error
        return answer


def _run(client: Any, registry: ToolRegistry | None = None, tenant: str = "acme") -> ToolOutcome:
    executor = LambdaToolExecutor(registry or _registry(), lambda _timeout: client)
    return executor(CALL, tenant, "b", "u")


def test_the_executor_runs_a_call_on_the_tools_function_through_the_plane(
    plane: ControlPlane,
) -> None:
    class ThroughThePlane:
        def invoke(self, **kwargs: Any) -> dict[str, Any]:
            event = json.loads(kwargs["Payload"])
            body = json.dumps(plane.invoke("calculator", event)).encode()
            return {"StatusCode": 200, "Payload": io.BytesIO(body)}

    assert _run(ThroughThePlane()) == ToolOutcome("success", {"expression": "6 * 7", "value": 42})


def test_the_executor_sends_the_protocols_event_with_the_idempotency_key() -> None:
    client = Answering({"status": "success", "content": 42})
    assert _run(client) == ToolOutcome("success", 42)
    [call] = client.calls
    assert call["InvocationType"] == "RequestResponse"
    assert call["FunctionName"] == "arn:aws:lambda:us-east-1:123456789012:function:calc"
    assert json.loads(call["Payload"]) == {
        "tool": "calculator",
        "input": {"expression": "6 * 7"},
        "idempotency_key": "b/u/tooluse_1",
        "tenant": "acme",
        "batch": "b",
        "unit": "u",
    }


def _client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "no"}}, "Invoke")


@pytest.mark.parametrize(
    ("client", "says"),
    [
        (Answering({"status": "error", "content": "expression: bad"}), "expression: bad"),
        (Answering(raises=_client_error("TooManyRequestsException")), "busy (throttled)"),
        (Answering(raises=_client_error("ResourceNotFoundException")), "not available"),
        (Answering(raises=_client_error("AccessDeniedException")), "not available"),
        (Answering(raises=ReadTimeoutError(endpoint_url="x")), "did not answer within 5 s"),
        (
            Answering(
                {"errorType": "Boom", "errorMessage": "store down"}, function_error="Unhandled"
            ),
            "failed: store down",
        ),
        (
            Answering(
                {"errorMessage": "Task timed out after 6.00 seconds"}, function_error="Unhandled"
            ),
            "timed out",
        ),
        (Answering(b"not json"), "not JSON"),
        (Answering({"result": 1}), "without status and content"),
        (Answering([1, 2]), "without status and content"),
        (Answering({"status": "maybe", "content": 1}), "without status and content"),
    ],
)
def test_every_failure_of_a_tool_is_an_error_result_never_an_exception(
    client: Answering, says: str
) -> None:
    outcome = _run(client)
    assert outcome.status == "error"
    assert says in outcome.value


def test_a_tool_not_registered_or_not_granted_is_an_error_without_invoking() -> None:
    client = Answering({"status": "success", "content": 1})
    registry = _registry()
    denied = ToolRegistry(registry.tools, ToolGrants(frozenset({"calculator"}), ()))
    assert _run(client, denied) == ToolOutcome(
        "error", "the tool 'calculator' is not available to this unit"
    )
    executor = LambdaToolExecutor(registry, lambda _timeout: client)
    unknown = ToolCall(1, "t2", "rm", {}, "b/u/t2")
    assert executor(unknown, "acme", "b", "u").status == "error"
    assert client.calls == []


def _journal(plane: ControlPlane, batch: str, unit: str) -> list[dict[str, Any]]:
    table = plane.env("bfcl")[TOOL_JOURNALS_TABLE_NAME]
    return DynamoDBJournals(table, plane.client("dynamodb")).read(f"{batch}/{unit}")


def test_a_bfcl_call_runs_once_per_key_on_its_units_own_backends(plane: ControlPlane) -> None:
    # Given BFCL's first entry's unit (its file system starts with a document/ folder), and
    # eight callers sending the same call (same key) at once
    unit, batch = "multi-turn-base-0", "b-bfcl"

    def event(tool: str, value: dict[str, Any], key: str) -> dict[str, Any]:
        return {**_event(tool, value, key=f"{batch}/{unit}/{key}"), "batch": batch, "unit": unit}

    start = threading.Barrier(8)
    answers: list[dict[str, Any]] = [{}] * 8

    def call(i: int) -> None:
        start.wait()
        answers[i] = plane.invoke("bfcl", event("mkdir", {"dir_name": "temp"}, "c0-0"))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then it ran once: one outcome eight times, one journal entry
    assert len({json.dumps(a, sort_keys=True) for a in answers}) == 1, answers
    assert answers[0]["status"] == "success"
    assert [e["key"] for e in _journal(plane, batch, unit)] == [f"{batch}/{unit}/c0-0"]
    # and the next call sees its effect (a second mkdir of the same folder: BFCL's own answer)
    again = plane.invoke("bfcl", event("mkdir", {"dir_name": "temp"}, "c0-1"))
    assert "File exists" in again["content"]["error"], again
    assert len(_journal(plane, batch, unit)) == 2
    # and another batch's unit of the same entry has backends of its own
    other = {**event("mkdir", {"dir_name": "temp"}, "c0-0"), "batch": "b-other"}
    other["idempotency_key"] = f"b-other/{unit}/c0-0"
    assert plane.invoke("bfcl", other)["status"] == "success"
    # But a unit that is no BFCL entry's, or a tool BFCL does not serve, is an error result
    stranger = {**event("mkdir", {"dir_name": "x"}, "c9"), "idempotency_key": "b/u-1/c9"}
    assert "is not a BFCL multi_turn_base entry" in plane.invoke("bfcl", stranger)["content"]
    assert "is not served here" in plane.invoke("bfcl", event("shell", {}, "c8"))["content"]
