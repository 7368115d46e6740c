"""Least privilege, proven both ways on the strict local stack, after every other e2e scenario.

The local stack enforces IAM (swarm.local.patches.iam): each function runs with its own role's STS
credentials, the state machine's tasks with its role, and every request is judged against the
caller's policies with its real resource ARN. It records every decision (``GET /_local/iam``).
This file runs last (``exclusive``, so after the concurrent phase; ``99``, so after the other
exclusive ones) and checks, over the stack's whole life:

* what each role called was granted: no AccessDenied for any role of the stack;
* what each role is granted was called: every (action, resource) of its policies was used by
  some request, or is listed in :data:`NOT_CALLED_HERE` with the reason the e2e tier cannot call
  it. The three lanes count as one resource: the code that calls
  one calls each, with the unit's lane.
"""

from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

import pytest

from swarm.local.patches.iam import role_of
from tests.e2e.conftest import Stack

pytestmark = pytest.mark.exclusive

STACK_ROLE_PREFIX = "Swarm-local-"

_LIST_BUCKET = (
    "no code lists the bucket: S3 consults it to answer 404 instead of 403 for a missing key, "
    "which the emulator does not model (docs/local.md)"
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
        "after the 54 s visibility timeout is not terminal at the 30 s grace), so the tier "
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
}


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
    refused = [d for d in report["denied"] if f"assumed-role/{STACK_ROLE_PREFIX}" in d["principal"]]
    assert refused == []


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
