"""Least privilege, proven both ways on the strict local stack, whatever ran on it before.

The local stack enforces IAM (swarm.local.patches.iam): each function runs with its own role's STS
credentials, the state machine's tasks with its role, and every request is judged against the
caller's policies with its real resource ARN. It records every decision (``GET /_local/iam``).
It checks, over the stack's whole life:

* what each role called was granted: no AccessDenied for any role of the stack;
* what each role is granted was called: every (action, resource) of its policies was used by
  some request, or is listed in :data:`NOT_CALLED_HERE` with the reason the e2e tier cannot call
  it. The three lanes count as one resource: the code that calls
  one calls each, with the unit's lane.

Its verdict does not depend on what ran before it: the module's fixture (:func:`exercised`)
first makes every call this file expects, whether the other scenarios ran (``make test`` runs
this file last of the ``exclusive`` scenarios, on a stack the concurrent ones do not use) or
not (the file alone, or the tier in reverse order on a fresh stack). It is ``exclusive``
because the fixture pauses the low lane's workers for a moment.
"""

from __future__ import annotations

import fnmatch
import json
import re
import time
from typing import Any

import pytest

from swarm.adapters.dynamodb_watch import DEFAULT_WATCH_GRACE_S
from swarm.cli.ops import bfcl_units
from swarm.core.codec import parse_message
from swarm.local.patches.iam import role_of
from tests.e2e.conftest import Stack, submit_retrying, unit_failing, units, wait_for

pytestmark = pytest.mark.exclusive

STACK_ROLE_PREFIX = "Swarm-local-"

_LIST_BUCKET = (
    "no code lists the bucket: S3 consults it to answer 404 instead of 403 for a missing key, "
    "which the emulator does not model (docs/explanation/local.md)"
)
_FUNCTIONS = (
    "Worker",
    "DeadLetters",
    "DrainController",
    "Admit",
    "Finalizer",
    "Handler",
    "Sweeper",
)

#: (role's logical id prefix, action) -> why the e2e tier never makes that call.
NOT_CALLED_HERE: dict[tuple[str, str], str] = {
    **{
        (role, action): "Lambda's active tracing; the local stack runs without an X-Ray daemon"
        for role in _FUNCTIONS
        for action in ("xray:PutTraceSegments", "xray:PutTelemetryRecords")
    },
    **{
        (role, action): "the Lambda runtime writes the function's logs, not the function's code"
        for role in _FUNCTIONS
        for action in ("logs:CreateLogStream", "logs:PutLogEvents")
    },
    ("Handler", "s3:ListBucket"): _LIST_BUCKET,
    **{
        (role, "s3:AbortMultipartUpload"): "S3Results.write_file aborts a results file's "
        "multipart upload that failed; e2e batches' files are one PutObject (the multipart path "
        "and its abort: tests/integration/test_s3_results.py, on moto)"
        for role in ("Finalizer", "Sweeper")
    },
    ("Finalizer", "s3:ListBucket"): _LIST_BUCKET,
    ("DeadLetters", "states:SendTaskSuccess"): "a dead letter wakes the finalize loop only when "
    "it ends its run's last unit; the e2e dead letters end units of runs whose last unit a worker "
    "ends (the dead letter's wake: tests/unit/test_service_flow.py; SendTaskSuccess on a waiting "
    "task: tests/integration/test_closures.py)",
    ("Sweeper", "s3:ListBucket"): _LIST_BUCKET,
    ("FanOut", "logs:*"): "Step Functions' execution logging; moto writes no execution logs",
    **{
        ("FanOut", action): "the ResultWriter's multipart upload of a large result (AWS's "
        "documented ResultWriter policy); moto writes the result with one PutObject"
        for action in ("s3:GetObject", "s3:ListMultipartUploadParts", "s3:AbortMultipartUpload")
    },
    **{
        ("FanOut", action): "a Distributed Map starts, describes, stops and redrives its child "
        "executions with the state machine's role (AWS's documented policy); moto runs the "
        "children inside the interpreter"
        for action in (
            "states:StartExecution",
            "states:DescribeExecution",
            "states:StopExecution",
            "states:RedriveExecution",
        )
    },
    **{
        ("Sweeper", action): "the sweeper repairs a run whose execution died by restarting it "
        "(units still in flight or unadmitted when it looks: StartExecution) or by closing it "
        "itself (every unit terminal: the ledger's Query, the results' PutObject, the closure's "
        "PutEvents); in the e2e scenario either may happen (a unit whose message is redelivered "
        "after the lanes' visibility timeout is not terminal at the 30 s grace), so the tier "
        "cannot require one path (both: tests/integration/test_sweeper.py, on moto)"
        for action in (
            "states:StartExecution",
            "dynamodb:Query",
            "s3:PutObject",
            "events:PutEvents",
        )
    },
    **{
        ("Sweeper", action): "the lease sweep of Finalizer.finalize, run by the sweeper: settle a "
        "lost attempt and requeue its retry from the manifest; no lease had run out when it looked"
        for action in ("dynamodb:PutItem", "sqs:SendMessage", "s3:GetObject")
    },
    **{
        (
            "Finalizer",
            action,
        ): "the finalizer's lease sweep settles a lost attempt and requeues its "
        "retry; in the crash scenario it races SQS's redelivery of the same message (the lease "
        "equals the visibility timeout) and either may win, so the tier cannot require it "
        "(reclaim_expired: tests/ledger_contract.py on DynamoDB, test_concurrency.py)"
        for action in ("dynamodb:PutItem", "sqs:SendMessage")
    },
    ("DeadLetters", "dynamodb:PutItem"): "settles the claimed attempt of a unit SQS gave up on "
    "(_settle's Put); the e2e scenario's dead letter was still queued, not claimed",
    ("FanOut", "xray:*"): "Step Functions' tracing; the local stack runs without X-Ray",
    # the tool sources' functions (ToolsCalculatorSource, ToolsNotesSource, ...)
    ("Tools", "xray:*"): "Lambda's active tracing; the local stack runs without an X-Ray daemon",
    ("Tools", "logs:*"): "the Lambda runtime writes the function's logs, not the function's code",
}


TENANT = "e2e-grants"


def _one_unit_retried_alone(stack: Stack) -> None:
    """A manifest uploaded through the API (the API's upload URL: PutObject under
    ``manifests/uploads/``), submitted by key, of one unit that fails its first attempt: the
    unit is alone in its message, so the worker hides the message for the retry's backoff
    (ChangeMessageVisibility) and SQS redelivers it; then its results are read through the API
    and downloaded (the results' GetObject)."""
    client = stack.client(TENANT)
    model = stack.model()
    unit_id = unit_failing(int(model["seed"]), float(model["failure_rate"]), "grant-retry", 1)
    manifest = [{"unit_id": unit_id, "projected_tokens": 1_000, "input": "retried alone"}]
    key = client.upload(json.dumps(manifest).encode())
    bid = submit_retrying(client, {"manifest": {"key": key}, "budget": 100_000})["batch_id"]
    final = wait_for(client, bid, timeout_s=180)
    assert final["state"] == "completed" and final["retries"] == 1, final
    # its results through the API: a page, and the closed batch's results file from its
    # short-lived link (signed by the API function's role; written within a poll of closing)
    deadline = time.monotonic() + 30
    page = client.results(bid, state=None, limit=10, next_token=None)
    while "download" not in page and time.monotonic() < deadline:
        time.sleep(0.5)
        page = client.results(bid, state=None, limit=10, next_token=None)
    assert [u["unit_id"] for u in page["units"]] == [unit_id], page
    lines = client.fetch(page["download"]["url"]).splitlines()
    assert [json.loads(line)["unit_id"] for line in lines] == [unit_id]


def _an_agent_unit(stack: Stack) -> None:
    """An agent unit's loop (BFCL's first entry): the worker reads the unit's log (its Query of
    the ledger), calls its tools on the BFCL toolset's function, whose role reads and appends
    the unit's journal, and its transcript is read through the API."""
    client = stack.client(TENANT)
    unit = bfcl_units("multi_turn_base", 1)[0]
    body = {"units": [unit], "budget": unit["projected_tokens"]}
    bid = submit_retrying(client, body)["batch_id"]
    final = wait_for(client, bid, timeout_s=180)
    assert final["state"] == "completed" and final["agent"]["tool_calls"] > 0, final
    assert client.transcript(bid, unit["unit_id"])["stop"]["reason"] == "completed"


def _a_gated_call_decided(stack: Stack) -> None:
    """An agent unit whose notes write needs approval (human gates): the worker parks it and
    announces it (PutEvents on the bus), the API lists it and its tenant's approval sends it
    back to its lane (the API's SendMessage), and it completes."""
    client = stack.client(TENANT)
    unit = {
        "unit_id": "grant-gated",
        "projected_tokens": 12_000,
        "input": {
            "system": "Keep a note. turns=2",
            "messages": [{"role": "user", "content": [{"text": "A gated note."}]}],
            "inferenceConfig": {"maxTokens": 256},
            "tools": ["notes_write"],
            "limits": {"approve_tools": ["notes_write"]},
        },
    }
    bid = submit_retrying(client, {"units": [unit], "budget": 100_000})["batch_id"]
    wait_for(client, bid, lambda d: d["counts"]["awaiting_approval"] == 1, timeout_s=180)
    (waiting,) = client.approvals(bid)["waiting"]
    client.decide(bid, "grant-gated", waiting["toolUseId"], "approve", "least privilege")
    assert wait_for(client, bid, timeout_s=180)["state"] == "completed"


def _a_bundle_with_a_retry(stack: Stack) -> None:
    """Units due together travel as one message (a bundle): one that fails its first attempt
    goes back as a copy of its own (the worker's SendMessage to its lane)."""
    client = stack.client(TENANT)
    model = stack.model()
    retried = unit_failing(int(model["seed"]), float(model["failure_rate"]), "grant-copy", 1)
    batch = [
        *units(4, "grant-bundle"),
        {"unit_id": retried, "projected_tokens": 1_000, "input": "r"},
    ]
    bid = submit_retrying(client, {"units": batch, "budget": 100_000})["batch_id"]
    final = wait_for(client, bid, timeout_s=180)
    assert final["state"] == "completed" and final["retries"] >= 1, final


def _exhausted_then_resumed(stack: Stack) -> None:
    """A batch that runs out of budget (its closure writes the remainder) and is topped up."""
    client = stack.client(TENANT)
    body = {"units": units(4, "grant-budget", lambda i: 10_000), "budget": 25_000}
    bid = submit_retrying(client, body)["batch_id"]
    assert wait_for(client, bid, timeout_s=180)["state"] == "exhausted"
    client.resume(bid, 100_000)
    assert wait_for(client, bid, timeout_s=180)["state"] == "completed"


def _one_message_dead_lettered(stack: Stack) -> None:
    """A unit's message SQS gives up on (moved to the dead-letter queue here, while the low
    lane's workers are paused): the dead-letter handler ends it, and the run closes. Held in
    the lane until the sweeper has looked at its run, open past the sweeper's grace."""
    client = stack.client(TENANT)
    sqs, lam = stack.aws("sqs"), stack.aws("lambda")
    urls = sqs.list_queues()["QueueUrls"]
    lane = next(u for u in urls if "LanesLowLane" in u)
    dead_letters = next(u for u in urls if "LanesDeadLetters" in u)
    mapping = next(
        m["UUID"]
        for m in lam.list_event_source_mappings()["EventSourceMappings"]
        if "LanesLowLane" in m["EventSourceArn"] and "Worker" in m["FunctionArn"]
    )
    stack.pause_mapping(mapping)
    try:
        body = {"units": units(1, "grant-dlq"), "lane": "low", "budget": 100_000}
        bid = submit_retrying(client, body)["batch_id"]
        _swept_while_open(stack, opened_before=time.monotonic())
        moved = False
        deadline = time.monotonic() + 60
        while not moved and time.monotonic() < deadline:
            for m in sqs.receive_message(QueueUrl=lane, MaxNumberOfMessages=10).get("Messages", []):
                if not moved and parse_message(m["Body"])[0].run_id == bid:
                    sqs.send_message(QueueUrl=dead_letters, MessageBody=m["Body"])
                    sqs.delete_message(QueueUrl=lane, ReceiptHandle=m["ReceiptHandle"])
                    moved = True
                else:  # another scenario's: back at once
                    sqs.change_message_visibility(
                        QueueUrl=lane, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
                    )
        assert moved, "no queued message of the batch in the low lane"
        final = wait_for(client, bid, timeout_s=120)
        assert final["counts"]["dead_lettered"] == 1, final
    finally:
        lam.update_event_source_mapping(UUID=mapping, Enabled=True)


def _swept_while_open(stack: Stack, opened_before: float) -> None:
    """Wait until the scheduled sweeper has looked at the open run (its execution alive: the
    sweeper reads the run and its watch, describes the execution, and snoozes the watch): past
    the grace a new run gets, two more ticks of every schedule."""
    status = stack.local("GET", "/_local/status")
    grace_s = DEFAULT_WATCH_GRACE_S / float(status["time_scale"])
    time.sleep(max(0.0, opened_before + grace_s - time.monotonic()))
    before = [s["fired"] for s in stack.local("GET", "/_local/status")["schedules"]]
    assert before, "the local stack plays no schedule rule (the sweeper's)"
    deadline = time.monotonic() + 120
    while True:
        fired = [s["fired"] for s in stack.local("GET", "/_local/status")["schedules"]]
        if all(now >= then + 2 for now, then in zip(fired, before, strict=True)):
            return
        assert time.monotonic() < deadline, f"the sweeper's schedule stalled: {before} {fired}"
        time.sleep(0.5)


def _drain_switch_written(stack: Stack) -> None:
    """The drain parameter written (``off``, as it is: the work goes on): its change runs the
    drain controller, which sets every worker mapping to follow it and reads the lanes."""
    client = stack.client(TENANT)
    before = sum(r["fired"] for r in stack.local("GET", "/_local/status")["drain_rule"])
    client.set_drain(False)
    deadline = time.monotonic() + 60
    while sum(r["fired"] for r in stack.local("GET", "/_local/status")["drain_rule"]) <= before:
        assert time.monotonic() < deadline, "the drain rule never ran the drain controller"
        time.sleep(0.25)
    assert client.drain_status()["draining"] is False


def _operator_rebinds(stack: Stack) -> None:
    """An operator forgets the tenant's binding (the ledger's binding item deleted)."""
    # (the tenant's calls above bound its role)
    assert stack.client(TENANT).rebind(TENANT)["was_bound"] is True


def _tools_called(stack: Stack) -> None:
    """Each shipped tool called as the worker calls it (its Invoke signed with the worker's
    role, on the function ARN the worker's registry names: ``POST /_local/tools``), each tool's
    handler running with its own role: a note written, read and listed, the tenant's upload
    read, a sum computed, a BFCL unit's directory changed (its journal read and appended)."""
    client = stack.client(TENANT)
    key = client.upload(b'[{"unit_id": "u", "projected_tokens": 10, "input": "x"}]')
    calls = [
        {"name": "calculator", "input": {"expression": "6 * 7"}, "toolUseId": "t1"},
        {"name": "notes_write", "input": {"name": "plan", "value": "ship"}, "toolUseId": "t2"},
        {"name": "notes_read", "input": {"name": "plan"}, "toolUseId": "t3"},
        {"name": "notes_read", "input": {}, "toolUseId": "t4"},
        {"name": "object_read", "input": {"key": key}, "toolUseId": "t5"},
        # the local MCP server's write tool: the worker reads its auth header from its secret
        {"name": "tally_write", "input": {"entry": "e2e"}, "toolUseId": "t6"},
    ]
    body = {"tenant": TENANT, "batch": "b-grants", "unit": "u-tools", "calls": calls}
    outcomes = stack.local("POST", "/_local/tools", body)["outcomes"]
    assert [o["status"] for o in outcomes] == ["success"] * 6, outcomes
    assert outcomes[0]["content"]["value"] == 42
    assert outcomes[2]["content"] == {"name": "plan", "found": True, "value": "ship"}
    assert "plan" in outcomes[3]["content"]["names"]
    assert '"unit_id"' in outcomes[4]["content"]["text"]
    # another tenant sees none of it
    other = {**body, "tenant": "e2e-other", "calls": [calls[2], calls[4]]}
    refused = stack.local("POST", "/_local/tools", other)["outcomes"]
    assert refused[0] == {"status": "success", "content": {"name": "plan", "found": False}}
    assert refused[1]["status"] == "error", refused
    # a BFCL unit's backends (BFCL's first entry starts in a file system with document/)
    bfcl = {
        "tenant": TENANT,
        "batch": "b-grants",
        "unit": "multi-turn-base-0",
        "calls": [{"name": "cd", "input": {"folder": "document"}, "toolUseId": "c0-0"}],
    }
    moved = stack.local("POST", "/_local/tools", bfcl)["outcomes"]
    assert moved == [{"status": "success", "content": {"current_working_directory": "document"}}], (
        moved
    )


@pytest.fixture(scope="module", autouse=True)
def exercised(stack: Stack) -> None:
    """Every call the checks below expect, made here: the verdict holds whatever ran before."""
    _tools_called(stack)
    _an_agent_unit(stack)
    _a_gated_call_decided(stack)
    _one_unit_retried_alone(stack)
    _a_bundle_with_a_retry(stack)
    _exhausted_then_resumed(stack)
    _one_message_dead_lettered(stack)
    _drain_switch_written(stack)
    _operator_rebinds(stack)


def _logical(role_name: str) -> str:
    """``Swarm-local-WorkerRoleAAEB1603-X`` -> ``Worker``."""
    return role_name.removeprefix(STACK_ROLE_PREFIX).split("Role", 1)[0]


def _grants(stack: Stack) -> dict[str, list[tuple[str, str]]]:
    """Every stack role's (action, resource pattern) pairs, from the deployed policies."""
    roles_api = stack.aws("iam")
    out: dict[str, list[tuple[str, str]]] = {}
    for role in roles_api.list_roles()["Roles"]:
        name = role["RoleName"]
        if not name.startswith(STACK_ROLE_PREFIX):
            continue
        pairs: list[tuple[str, str]] = []
        for policy in roles_api.list_role_policies(RoleName=name)["PolicyNames"]:
            doc = roles_api.get_role_policy(RoleName=name, PolicyName=policy)["PolicyDocument"]
            doc = json.loads(doc) if isinstance(doc, str) else doc
            for st in (
                doc["Statement"] if isinstance(doc["Statement"], list) else [doc["Statement"]]
            ):
                if st.get("Effect") != "Allow":
                    continue
                actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
                resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
                pairs += [(a, r) for a in actions for r in resources]
        out[name] = pairs
    return out


#: lanes differ only in name: a call on one lane's queue is the same code path on every lane
_LANE = re.compile(r"Lanes(?:High|Normal|Low)(Lane)[0-9A-F]{8}-[0-9A-Z]+")


def _same_for_every_lane(resource: str) -> str:
    """``...:Swarm-local-LanesHighLane29381EE0-4PKA2SEA240G`` -> ``...:Swarm-local-Lanes<lane>Lane``
    (the logical id's hash and the physical suffix differ from lane to lane)."""
    return _LANE.sub(r"Lanes<lane>\1", resource)


def _excused(role: str, action: str) -> bool:
    logical = _logical(role)
    return any(
        logical.startswith(prefix) and fnmatch.fnmatchcase(action, pattern)
        for prefix, pattern in NOT_CALLED_HERE
    )


def test_no_role_of_the_stack_was_refused_anything(stack: Stack) -> None:
    report: dict[str, Any] = stack.local("GET", "/_local/iam")
    refused = [
        d
        for d in report["denied"]
        if f"assumed-role/{STACK_ROLE_PREFIX}" in d["principal"] and "/probe-" not in d["principal"]
    ]
    assert refused == []


def test_the_tools_roles_are_refused_what_they_do_not_need(stack: Stack) -> None:
    """Calls least privilege must refuse, each made with the role under a ``probe-`` session:
    the worker invoking a function that is not a registered tool, the notes tool reading the
    ledger, the object reader reading results, the calculator reading a tenant's object, the
    BFCL toolset writing a note."""
    probes = stack.local("POST", "/_local/tools/probe")["probes"]
    assert {p["role"] for p in probes} == {"worker", "notes", "object_read", "calculator", "bfcl"}
    assert all(p["code"] in ("AccessDeniedException", "AccessDenied") for p in probes), probes


def test_every_grant_of_every_role_was_used(stack: Stack) -> None:
    report: dict[str, Any] = stack.local("GET", "/_local/iam")
    used: dict[str, set[tuple[str, str]]] = {}
    for principal, pairs in report["used"].items():
        if ":assumed-role/" in principal:
            used.setdefault(role_of(principal), set()).update((a, r) for a, r in pairs)
    grants = _grants(stack)
    assert grants, "no stack roles found"
    unused = {
        role: sorted(
            (action, pattern)
            for action, pattern in pairs
            if not _excused(role, action)
            and not any(
                fnmatch.fnmatchcase(a, action)
                and fnmatch.fnmatchcase(_same_for_every_lane(r), _same_for_every_lane(pattern))
                for a, r in used.get(role, ())
            )
        )
        for role, pairs in grants.items()
    }
    lines = [
        f"{_logical(role)}: {action} on {pattern}"
        for role, pairs in sorted(unused.items())
        for action, pattern in pairs
    ]
    assert not lines, "granted but never called:\n" + "\n".join(lines)
