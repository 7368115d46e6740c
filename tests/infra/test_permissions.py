"""Least privilege, exactly: every action each function's role is granted, on which resource,
and which code calls it. Adding or removing a grant fails here until this table says why.

How to read a row: ``resource label -> actions``. Resource labels are resolved from the
template's intrinsic expressions (see :func:`_label`); ``lane <x>`` rows hold for each lane
queue, ``worker mapping <x>`` for each worker event source mapping; ``dead letters`` is the
lanes' one DLQ. DynamoDB's transactions have no IAM action of their own: each ``Put`` / ``Update``
inside a ``TransactWriteItems`` is authorized as ``PutItem`` / ``UpdateItem`` on its table.
The only condition allowed is ``s3:prefix`` on ``s3:ListBucket`` (row ``bucket if s3:prefix
<patterns>``): without ListBucket, S3 answers a read of a missing key with 403, not 404.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.constants import LEASES_INDEX, OPEN_RUNS_INDEX, TENANT_RUNS_INDEX
from swarm.contract import API, DLQ, DRAIN, FANOUT, FINALIZER, SWEEPER, WORKER
from swarm.core.records import LANES
from swarm.settings import FunctionName
from tests.infra.conftest import Synthesized
from tests.infra.helpers import as_list, references, statements_of_role

Table = dict[str, frozenset[str]]

#: Every function: Lambda tracing=ACTIVE (the X-Ray SDK in Powertools' Tracer) and its own logs.
_COMMON: Table = {
    # PutTraceSegments/PutTelemetryRecords: Lambda's active tracing and Powertools' Tracer
    # (X-Ray has no resource-level permissions, hence "*")
    "*": frozenset({"xray:PutTraceSegments", "xray:PutTelemetryRecords"}),
    # the Lambda runtime writes the function's logs to its own group (no AWSLambdaBasicExecution)
    "own log group": frozenset({"logs:CreateLogStream", "logs:PutLogEvents"}),
}


def _each(prefix: str, actions: set[str]) -> Table:
    return {f"{prefix} {lane.value}": frozenset(actions) for lane in LANES}


#: function -> resource -> actions. A comment per action names the code that calls it.
EXPECTED: dict[FunctionName, Table] = {
    API: {
        **_COMMON,
        "ledger table": frozenset(
            {
                # every ledger read: DynamoDBLedger._get_many (run, spec, unit)
                "dynamodb:BatchGetItem",
                # DynamoDBLedger._query: units of a run (status remainder, top_up's remainder)
                "dynamodb:Query",
                # begin_open: TransactWriteItems Put of the spec and the (opening) books items;
                # no BatchWriteItem: the unit items are the open step's (the finalizer's)
                "dynamodb:PutItem",
                # top_up (resume) updates the books;
                # DynamoDBBindings.bind: a tenant's role binding (one conditional update);
                # DynamoDBLedger.hold_queue: the tenant's holds (submit, resume)
                "dynamodb:UpdateItem",
                # DynamoDBBindings.unbind: POST /tenants/{tenant}/rebind (operators)
                "dynamodb:DeleteItem",
            }
        ),
        # DynamoDBLedger.tenant_queue: a tenant's open runs (POST /batches, resume)
        "tenant runs index": frozenset({"dynamodb:Query"}),
        # Gates.waiting (GET /batches/{id}/approvals): a run's leased units, its parked ones
        "leases index": frozenset({"dynamodb:Query"}),
        # DynamoDBGovernor(read_only=True).snapshot: one Query (POST /batches, GET /fleet);
        # a missing bucket reads as its initial state, so no PutItem (the workers create it)
        "governor table": frozenset({"dynamodb:Query"}),
        # Batches.submit/resume: S3Blobs.put_json of manifests/<batch>/units|resume-<n>
        # (batch ids are b-<hex>: swarm.service.batches.batch_id_for)
        "manifests/b-*": frozenset({"s3:PutObject"}),
        # Uploads.grant: S3Blobs.upload_url presigns the tenant's PUT of
        # manifests/uploads/<tenant>/<id>.json, which S3 authorizes with this role's rights
        "manifests/uploads/*": frozenset({"s3:PutObject"}),
        # api.submit reads manifests/uploads/<tenant>/... (S3Blobs.get_json); resume reads the
        # batch's manifest
        "manifests/*": frozenset({"s3:GetObject"}),
        # Results.page: S3Results.outcomes reads the attempt records of the caller's batch;
        # its download URL is a GetObject signed with this role (S3Results.download_url)
        "results/*": frozenset({"s3:GetObject"}),
        # S3Blobs.get_json in api.submit (a missing upload: 400 naming it) and Batches.resume
        # (an expired manifest: 409) must see 404 for a missing key, which S3 only says to a
        # caller with ListBucket (infra/storage.py grant_list); so must a results page for an
        # attempt not recorded and a results file not written yet (S3Results.exists)
        "bucket if s3:prefix manifests/* | results/*": frozenset({"s3:ListBucket"}),
        # StepFunctionsExecutions.start (submit, idempotent resubmit, resume)
        "state machine": frozenset({"states:StartExecution"}),
        # SsmDrainSwitch.draining (submit, resume, fleet: cached) and .state (GET /drain)
        "drain parameter": frozenset({"ssm:GetParameter"}),
        # SqsLanes.depths: shedding and the fleet view; SqsLanes.send: a decision on a gated
        # tool call sends its unit back to its lane (Gates.decide)
        **_each("lane", {"sqs:GetQueueAttributes", "sqs:SendMessage"}),
    },
    FANOUT: {
        **_COMMON,
        "ledger table": frozenset(
            {
                # FanOut.admit_and_enqueue: ledger.unit and admit's reads (_get_many)
                "dynamodb:BatchGetItem",
                # admit: UpdateItem of the books, or TransactWriteItems of books + unit Updates
                "dynamodb:UpdateItem",
            }
        ),
        "governor table": frozenset(
            {
                # DynamoDBGovernor.book_places: a fresh view (one Query), one conditional
                # UpdateItem of the tenant's queue per chunk (and the shards' creation, if it
                # comes first: conditional UpdateItems)
                "dynamodb:Query",
                "dynamodb:UpdateItem",
            }
        ),
        # SqsLanes.send: the admitted unit goes onto its lane
        **_each("lane", {"sqs:SendMessage"}),
    },
    WORKER: {
        **_COMMON,
        "governor table": frozenset(
            {
                # DynamoDBGovernor._load: one Query of the shards
                "dynamodb:Query",
                # draw (conditional UpdateItem per grant), report_throttle (rate cut) and
                # DynamoDBGovernor.create (the shard items when absent: conditional updates)
                "dynamodb:UpdateItem",
            }
        ),
        "ledger table": frozenset(
            {
                # ledger.unit / admit / claim / settle reads (_get_many); the finalize loop's
                # task token when a settlement closes the run (StepFunctionsClosures.notify)
                "dynamodb:BatchGetItem",
                # admit, claim, unclaim, reclaim_unit (_release) and settle's books/unit Updates
                # (the settled attempt is kept in its unit's item); DynamoDBRunning.enter/leave
                # (an invocation's entry in the register of running work); an agent unit's
                # settle_turn and append_log (its log items: conditional updates)
                "dynamodb:UpdateItem",
                # Ledger.read_log: an agent unit's log, once per delivery
                "dynamodb:Query",
            }
        ),
        # SsmDrainSwitch.draining: once per invocation, cached for a few seconds per container
        "drain parameter": frozenset({"ssm:GetParameter"}),
        # StepFunctionsClosures.notify: the settlement that closes a run wakes its finalize loop
        "state machine": frozenset({"states:SendTaskSuccess"}),
        # S3Results.record: each attempt's outcome, a conditional PutObject (If-None-Match)
        "results/*/attempts/*": frozenset({"s3:PutObject"}),
        # LambdaToolExecutor.run: a unit's tool calls, on exactly the registered functions
        # (cdk.json tools: one function per source; tests/infra/test_tools.py)
        "tool function calculator": frozenset({"lambda:InvokeFunction"}),
        "tool function notes": frozenset({"lambda:InvokeFunction"}),
        "tool function object_read": frozenset({"lambda:InvokeFunction"}),
        "tool function bfcl": frozenset({"lambda:InvokeFunction"}),
        **_each(
            "lane",
            {
                # the event source mapping polls with the function's role (Lambda's SQS poller)
                "sqs:ReceiveMessage",
                "sqs:DeleteMessage",
                "sqs:GetQueueAttributes",
                # RetryLater: SqsLanes.change_visibility (functions/worker.py)
                "sqs:ChangeMessageVisibility",
                # Requeue (draining, governor wait bound, throttle, busy): a batch's copies in
                # one SqsLanes.send_many (SendMessageBatch is authorized as sqs:SendMessage)
                "sqs:SendMessage",
            },
        ),
        # a parked agent unit announces unit.awaiting_approval (EventBridgeEvents.publish)
        "event bus": frozenset({"events:PutEvents"}),
    },
    DLQ: {
        **_COMMON,
        "ledger table": frozenset(
            {
                # ledger.dead_letter reads the run and the unit (_get_many); the finalize
                # loop's task token when a dead letter closes the run (StepFunctionsClosures)
                "dynamodb:BatchGetItem",
                # dead_letter: books + unit Updates (TransactWriteItems), also when it settles
                # a claimed attempt first (_settle)
                "dynamodb:UpdateItem",
            }
        ),
        # StepFunctionsClosures.notify: a dead letter that closes a run wakes its finalize loop
        "state machine": frozenset({"states:SendTaskSuccess"}),
        # its event source mapping polls the lanes' dead-letter queue with the function's role
        "dead letters": frozenset(
            {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"}
        ),
    },
    FINALIZER: {
        **_COMMON,
        "ledger table": frozenset(
            {
                # ledger.run, and reclaim_unit's reads (_get_many)
                "dynamodb:BatchGetItem",
                # units: the run's unit items (_query), once, for the results at closure; the
                # lease sweep's scan of a run past its scan_at (DynamoDBLedger._scan)
                "dynamodb:Query",
                # reclaim_unit: books + unit Updates of a lost attempt or an expired lease;
                # DynamoDBRunWatch.record (first poll) and .release (closure announced);
                # StepFunctionsClosures.wait: the poll's task token (each poll)
                "dynamodb:UpdateItem",
                # its open action (Opener.open): open_units writes the unit items, 25 a request
                # (the books' progress and readiness are UpdateItem, above)
                "dynamodb:BatchWriteItem",
            }
        ),
        # reclaim_expired: DynamoDBLedger.expired_leases, the run's expired leases only
        "leases index": frozenset({"dynamodb:Query"}),
        # Finalizer.finalize: the manifest's inputs (requeue of lost retries, remainder);
        # Opener.open: the run's spec object (manifests/<run>/spec.json)
        "manifests/*": frozenset({"s3:GetObject"}),
        "results/*": frozenset(
            {
                # S3Blobs.exists: HeadObject of results/<batch>/<state>-<epoch>.json;
                # Results.write_file reads the attempt records (S3Results.outcomes)
                "s3:GetObject",
                # S3Blobs.put_json: the results and remainder objects; S3Results.write_file:
                # the results file (PutObject, or a multipart upload's parts)
                "s3:PutObject",
                # S3Results.write_file aborts a multipart upload that failed
                "s3:AbortMultipartUpload",
            }
        ),
        # Finalizer.finalize: S3Blobs.exists of the results object (absent until the closure
        # is written: without ListBucket S3 says 403 and every finalization fails) and
        # S3Blobs.get_json of the manifest (a missing one is NotFound, not a 403)
        "bucket if s3:prefix manifests/* | results/*": frozenset({"s3:ListBucket"}),
        # EventBridgeEvents.publish: run.completed / run.exhausted
        "event bus": frozenset({"events:PutEvents"}),
        # the lease sweeper requeues a lost unit's retry: SqsLanes.send
        **_each("lane", {"sqs:SendMessage"}),
    },
    SWEEPER: {
        **_COMMON,
        "ledger table": frozenset(
            {
                # Sweeper.repair: ledger.run; DynamoDBRunWatch.get (the watch entry, consistent);
                # Finalizer.finalize's reads (reclaim_unit: _get_many)
                "dynamodb:BatchGetItem",
                # Finalizer.finalize: units (_query of the unit items) for the results, and the
                # lease sweep's scan of a run past its scan_at (DynamoDBLedger._scan)
                "dynamodb:Query",
                # DynamoDBRunWatch.check (next look, restarts); Finalizer.finalize: reclaim
                # Updates and DynamoDBRunWatch.release
                "dynamodb:UpdateItem",
            }
        ),
        # DynamoDBRunWatch.due: Query of the sparse index of watched runs, nothing else
        "open runs index": frozenset({"dynamodb:Query"}),
        # Finalizer.finalize: reclaim_expired's Query of the run's expired leases
        "leases index": frozenset({"dynamodb:Query"}),
        # Finalizer.finalize (as the finalizer's row): manifest inputs, results, their checks
        "manifests/*": frozenset({"s3:GetObject"}),
        "results/*": frozenset({"s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"}),
        "bucket if s3:prefix manifests/* | results/*": frozenset({"s3:ListBucket"}),
        # Finalizer.finalize: EventBridgeEvents.publish of a closure no execution announced
        "event bus": frozenset({"events:PutEvents"}),
        # Finalizer.finalize: a lost unit's retry requeued (SqsLanes.send)
        **_each("lane", {"sqs:SendMessage"}),
        # StepFunctionsExecutions.start: the restart <batch>-r<n> (map, or finalize loop)
        "state machine": frozenset({"states:StartExecution"}),
        # StepFunctionsExecutions.status: DescribeExecution of the run's candidate executions
        "fanout executions": frozenset({"states:DescribeExecution"}),
    },
    DRAIN: {
        **_COMMON,
        # DrainController.apply: SsmDrainSwitch.state (an exact read, with LastModifiedDate)
        "drain parameter": frozenset({"ssm:GetParameter"}),
        # LambdaMappings.set_enabled (its response carries the state: no GetEventSourceMapping)
        **_each("worker mapping", {"lambda:UpdateEventSourceMapping"}),
        # DrainController._report: SqsLanes.depths (queued: visible, delayed, hidden)
        **_each("lane", {"sqs:GetQueueAttributes"}),
        # DynamoDBRunning.running: the register of running work's shards (consistent reads)
        "ledger table": frozenset({"dynamodb:BatchGetItem"}),
    },
}


def _own_log_group(stack: Any, name: str) -> Any:
    """The log group of function ``name``, or of tool source ``tool:<source>``."""
    if name.startswith("tool:"):
        return stack.tools.functions[name.removeprefix("tool:")].log_group
    return stack.functions[name].log_group


def _label(synth: Synthesized, name: str, resource: Any) -> str | None:
    """A readable name for a statement's resource (None: CloudFormation's AWS::NoValue)."""
    stack = synth.stack
    if resource == "*":
        return "*"
    if resource == {"Ref": "AWS::NoValue"}:  # Table.grant's index ARN when there is no index
        return None
    text = json.dumps(resource)
    if references(resource, synth.logical_id(stack.tables.ledger)) and text.endswith(
        json.dumps(f"/index/{OPEN_RUNS_INDEX}") + "]]}"
    ):
        return "open runs index"
    if references(resource, synth.logical_id(stack.tables.ledger)) and text.endswith(
        json.dumps(f"/index/{TENANT_RUNS_INDEX}") + "]]}"
    ):
        return "tenant runs index"
    if references(resource, synth.logical_id(stack.tables.ledger)) and text.endswith(
        json.dumps(f"/index/{LEASES_INDEX}") + "]]}"
    ):
        return "leases index"
    if f":execution:{stack.fanout.state_machine_name}:*" in text:
        return "fanout executions"
    if text.endswith(json.dumps(f":stateMachine:{stack.fanout.state_machine_name}") + "]]}"):
        return "state machine"  # its ARN built from its name (infra/functions.py)
    bucket = synth.logical_id(stack.storage.bucket)
    if references(resource, bucket):
        for prefix in (
            "manifests/*",
            "manifests/b-*",
            "manifests/uploads/*",
            "results/*",
            "results/*/attempts/*",
        ):
            if text.endswith(json.dumps("/" + prefix) + "]]}"):
                return prefix
        if resource == {"Fn::GetAtt": [bucket, "Arn"]}:
            return "bucket"
        return f"bucket {text}"
    known: list[tuple[Any, str]] = [
        (_own_log_group(stack, name), "own log group"),
        (stack.tables.governor, "governor table"),
        (stack.tables.ledger, "ledger table"),
        (stack.fanout.state_machine, "state machine"),
        (stack.drain.parameter, "drain parameter"),
        (stack.bus, "event bus"),
    ]
    known.append((stack.lanes.dead_letters, "dead letters"))
    for source, tool in stack.tools.functions.items():
        known.append((tool.function, f"tool function {source}"))
        known.append((tool.log_group, f"log group of tool {source}"))
    if stack.tools.notes_table is not None:
        known.append((stack.tools.notes_table, "notes table"))
    if stack.tools.journals_table is not None:
        known.append((stack.tools.journals_table, "journals table"))
    for lane in LANES:
        known += [
            (stack.lanes.queues[lane], f"lane {lane.value}"),
            (stack.workers.mappings[lane], f"worker mapping {lane.value}"),
        ]
    for other, function in stack.functions.items():
        known.append((function.log_group, f"log group of {other}"))
    for construct, label in known:
        if references(resource, synth.logical_id(construct)):
            return label
    return f"unknown {text}"


def _prefix_condition(statement: dict[str, Any]) -> str:
    """`` if s3:prefix a | b`` for the one condition allowed (ListBucket limited to prefixes)."""
    condition = statement.get("Condition")
    if condition is None:
        return ""
    assert as_list(statement["Action"]) == ["s3:ListBucket"], statement
    assert set(condition) == {"StringLike"}, statement
    assert set(condition["StringLike"]) == {"s3:prefix"}, statement
    return " if s3:prefix " + " | ".join(sorted(as_list(condition["StringLike"]["s3:prefix"])))


def granted(synth: Synthesized, name: str) -> Table:
    """resource label -> every action the function's role is allowed on it (``tool:<source>``:
    the tool source's function)."""
    table: dict[str, set[str]] = {}
    if name.startswith("tool:"):
        role = synth.stack.tools.functions[name.removeprefix("tool:")].role
    else:
        role = synth.stack.functions[name].role  # type: ignore[index]
    for statement in statements_of_role(synth, role):
        assert statement["Effect"] == "Allow", statement
        assert "NotAction" not in statement, statement
        suffix = _prefix_condition(statement)
        for resource in as_list(statement["Resource"]):
            label = _label(synth, name, resource)
            if label is not None:
                table.setdefault(label + suffix, set()).update(as_list(statement["Action"]))
    return {label: frozenset(actions) for label, actions in table.items()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_role_is_granted_exactly_what_its_code_calls(
    synth: Synthesized, name: FunctionName
) -> None:
    assert granted(synth, name) == EXPECTED[name]


def test_the_table_covers_every_function(synth: Synthesized) -> None:
    assert set(EXPECTED) == set(synth.stack.functions)


def test_bedrock_worker_may_only_converse_with_its_models(prod_synth: Synthesized) -> None:
    """BedrockModelPlane calls Converse (bedrock:InvokeModel) and CountTokens
    (bedrock:CountTokens) only: no streaming grant, on the registered models only."""
    table = dict(granted(prod_synth, WORKER))
    bedrock = {label: actions for label, actions in table.items() if label.startswith("unknown")}
    assert set(bedrock.values()) == {frozenset({"bedrock:InvokeModel", "bedrock:CountTokens"})}
    # the inference profile and its foundation model in any region; the on-demand model
    assert len(bedrock) == 3
    assert all("bedrock" in label for label in bedrock)
    rest = {label: actions for label, actions in table.items() if label not in bedrock}
    assert rest == EXPECTED[WORKER]
