"""checkov (``--framework cloudformation``) acknowledgments: each on one resource, for one check,
with the reason it does not apply to this design. checkov reads them from the resource's
``Metadata: checkov: skip: [{id, comment}]``; ``tests/infra/test_checkov.py`` runs checkov on the
synthesized templates and fails on any finding left."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aws_cdk as cdk
from constructs import IConstruct

from swarm import contract as env

if TYPE_CHECKING:
    from infra.control_plane import SwarmControlPlane

_VPC = (
    "No private resource to reach: every call (DynamoDB, SQS, S3, SSM, Step Functions, "
    "EventBridge, Bedrock) goes to a public AWS endpoint over TLS with SigV4 and the function's "
    "own least-privilege role; a VPC would add NAT or interface endpoints and cold-start cost "
    "for no control gained"
)
_ENV_KEY = (
    "Lambda encrypts environment variables at rest with the AWS managed key; the variables hold "
    "resource names and settings only (swarm/contract.py FUNCTION_ENV), never a secret"
)
_LOG_KEY = (
    "CloudWatch Logs encrypts every log group at rest (service-managed keys); the handlers log "
    "ids, counts, states and errors, not a unit's input or answer (the DLQ handler logs the "
    "message id, not the body), so a customer managed key would add a key policy and cost"
)
_TABLE_KEY = (
    "Encrypted at rest with the AWS managed key (aws/dynamodb); who reads the items is decided "
    "by the per-function IAM grants on the table and on each index by name, which a customer "
    "managed key's policy would only have to repeat"
)
_SQS_KEY = (
    "Encrypted at rest with SQS-managed SSE (SqsManagedSseEnabled), which this check does not "
    "recognise (it looks for KmsMasterKeyId only); TLS is enforced by the queue policy"
)
_DLQ_SQS = (
    "Fed by an SQS event source mapping (a synchronous poll): a failed message returns to its "
    "queue and, after the lanes' maxReceiveCount, goes to the lanes' redrive dead-letter queue; "
    "a function DLQ only catches asynchronous invocations, which this function never gets"
)
_DLQ_SYNC = {
    env.API: "Invoked synchronously by API Gateway: a failure is the caller's 5xx answer "
    "(alarmed as Api5xx); a function DLQ only catches asynchronous invocations",
    env.FANOUT: "Invoked synchronously by the fan-out state machine's Distributed Map, whose "
    "Retry/Catch handle a failure; a function DLQ only catches asynchronous invocations",
    env.FINALIZER: "Invoked synchronously by the fan-out state machine (Retry/Catch, the "
    "FanOutFailed alarm) and by the sweeper's repair; a function DLQ only catches "
    "asynchronous invocations",
    env.DRAIN: "Invoked by its EventBridge rule on a change of the drain switch (8 retries, an "
    "hour's age): it reconciles the mappings with the switch as it is now, so a lost event is "
    "made good by the next change; workers also read the switch themselves",
    env.SWEEPER: "Invoked by its schedule: a sweep that is lost is replaced by the next one a "
    "period later (it repairs whatever is still broken then); nothing to replay from a DLQ",
}
_CONCURRENCY = {
    env.API: "Bounded by the API stage's throttling (api.throttle_rate_limit and burst); a "
    "reservation would take from the account's unreserved pool, which a fresh account (10) "
    "cannot give",
    env.FANOUT: "Bounded by the Distributed Map's MaxConcurrency (fanout.max_concurrency); a "
    "reservation would take from the account's unreserved pool, which a fresh account cannot "
    "give",
    env.WORKER: "Bounded per lane by the event source mappings' MaximumConcurrency; reserved "
    "only when worker.reserved_concurrency is set, which must fit account_concurrency_limit "
    "(checked at synth): a fresh account has none to reserve",
    env.DLQ: "Bounded by its event source mapping's MaximumConcurrency (2); a reservation "
    "would take from the account's unreserved pool, which a fresh account cannot give",
    env.FINALIZER: "One finalize loop per run's execution, bounded by the runs in flight; a "
    "reservation would take from the account's unreserved pool, which a fresh account cannot "
    "give",
    env.DRAIN: "Runs once per change of the drain switch; a reservation would take from the "
    "account's unreserved pool, which a fresh account cannot give",
    env.SWEEPER: "Runs once per schedule period; a reservation would take from the account's "
    "unreserved pool, which a fresh account cannot give",
}


def skip(construct: IConstruct, check_id: str, comment: str) -> None:
    """Add a checkov skip on ``construct``'s CloudFormation resource (kept with any others)."""
    cfn = construct if isinstance(construct, cdk.CfnResource) else construct.node.default_child
    assert isinstance(cfn, cdk.CfnResource), construct.node.path
    current: Any = cfn.get_metadata("checkov") or {}
    skips = [*current.get("skip", []), {"id": check_id, "comment": comment}]
    cfn.add_metadata("checkov", {"skip": skips})


def acknowledge_checks(plane: SwarmControlPlane) -> None:
    for name, built in plane.functions.items():
        function = built.function
        skip(function, "CKV_AWS_117", _VPC)
        skip(function, "CKV_AWS_173", _ENV_KEY)
        skip(built.log_group, "CKV_AWS_158", _LOG_KEY)
        skip(
            function,
            "CKV_AWS_116",
            _DLQ_SQS if name in (env.WORKER, env.DLQ) else _DLQ_SYNC[name],
        )
        if not (name == env.WORKER and plane.config.reserved_concurrency is not None):
            skip(function, "CKV_AWS_115", _CONCURRENCY[name])
    skip(
        plane.front_door.access_logs,
        "CKV_AWS_158",
        "CloudWatch Logs encrypts every log group at rest (service-managed keys); an access log "
        "line names the caller, method, path and status (infra/api.py ACCESS_LOG_FIELDS), "
        "never a body, so a customer managed key would add a key policy and cost",
    )
    skip(
        plane.fanout.log_group,
        "CKV_AWS_158",
        "CloudWatch Logs encrypts every log group at rest (service-managed keys); the state "
        "machine logs without execution data (include_execution_data=False: units are "
        "tenants' data), so a customer managed key would add a key policy and cost",
    )
    tables = [plane.tables.governor, plane.tables.ledger]
    tables += [t for t in (plane.tools.notes_table, plane.tools.journals_table) if t is not None]
    for table in tables:
        skip(table, "CKV_AWS_119", _TABLE_KEY)
    for tool in plane.tools.functions.values():
        skip(tool.function, "CKV_AWS_117", _VPC)
        skip(tool.function, "CKV_AWS_173", _ENV_KEY)
        skip(tool.log_group, "CKV_AWS_158", _LOG_KEY)
        skip(
            tool.function,
            "CKV_AWS_116",
            "Invoked synchronously by the worker (RequestResponse): a failure is the tool "
            "call's error result, which the model reads; a function DLQ only catches "
            "asynchronous invocations",
        )
        skip(
            tool.function,
            "CKV_AWS_115",
            "Bounded by the workers that call it (each runs its unit's calls); a reservation "
            "would take from the account's unreserved pool, which a fresh account cannot give",
        )
    for queue in [*plane.lanes.queues.values(), plane.lanes.dead_letters]:
        skip(queue, "CKV_AWS_27", _SQS_KEY)
    skip(
        plane.storage.access_logs,
        "CKV_AWS_18",
        "This is the server access log bucket: logging it into itself would log every "
        "delivery of its own logs; the batches bucket logs into it",
    )
    skip(
        plane.storage.access_logs,
        "CKV_AWS_21",
        "Server access logs are written once by S3's log delivery and expire after 90 days: "
        "there is no object to restore from an earlier version",
    )
    skip(
        plane.front_door.api.deployment_stage,
        "CKV_AWS_120",
        "Every answer is per caller (the tenant comes from the SigV4 identity) and changes "
        "from one call to the next (a run's progress): a cache would serve stale or another "
        "caller's data",
    )
