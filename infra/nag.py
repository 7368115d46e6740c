"""cdk-nag (AwsSolutions) acknowledgments: each scoped to one construct and one finding, with the
reason. ``tests/infra`` checks that the findings acknowledged here are the only ones, and that
``Resource: "*"`` is granted only for the actions named below."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aws_cdk as cdk
from constructs import IConstruct

from infra.constants import MANIFEST_PREFIX, RESULTS_PREFIX
from infra.storage import ATTEMPT_RECORDS
from infra.tools import OBJECTS_SOURCE, TENANT_OBJECTS_PREFIX
from infra.workers import CROSS_REGION_PREFIXES
from swarm.api.models import BATCH_ID_PREFIX, UPLOADS_PREFIX

if TYPE_CHECKING:
    from infra.control_plane import SwarmControlPlane

#: Actions that have no resource-level permissions, so IAM requires ``Resource: "*"``.
STAR_ONLY_ACTIONS = frozenset(
    {
        # X-Ray tracing (Lambda tracing=ACTIVE, Step Functions tracing)
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "xray:GetSamplingRules",
        "xray:GetSamplingTargets",
        # Step Functions log delivery to CloudWatch Logs
        "logs:CreateLogDelivery",
        "logs:GetLogDelivery",
        "logs:UpdateLogDelivery",
        "logs:DeleteLogDelivery",
        "logs:ListLogDeliveries",
        "logs:PutResourcePolicy",
        "logs:DescribeResourcePolicies",
        "logs:DescribeLogGroups",
    }
)

_XRAY = (
    "Resource::* only for X-Ray (xray:PutTraceSegments/PutTelemetryRecords, Lambda active "
    "tracing), which has no resource-level permissions; every other statement names its resource"
)


def _ack(scope: IConstruct, finding: str, reason: str) -> None:
    cdk.Validations.of(scope).acknowledge(
        cdk.Acknowledgment(id=f"AwsSolutions::AwsSolutions-{finding}", reason=reason)
    )


def _ref(construct: IConstruct) -> str:
    """How cdk-nag prints a resource's ARN in a finding id: ``<LogicalId.Arn>`` (the logical id
    in the stack the construct is in, whichever stack that is)."""
    child = construct.node.default_child
    assert isinstance(child, cdk.CfnElement)
    return f"<{cdk.Stack.of(construct).get_logical_id(child)}.Arn>"


def acknowledge_findings(plane: SwarmControlPlane) -> None:
    bucket = _ref(plane.storage.bucket)
    manifests = f"IAM5[Resource::{bucket}/{MANIFEST_PREFIX}*]"
    results = f"IAM5[Resource::{bucket}/{RESULTS_PREFIX}*]"
    name = plane.fanout.state_machine_name
    executions = "arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:"

    for function in plane.functions.values():
        _ack(function.role, "IAM5[Resource::*]", _XRAY)
    for tool in plane.tools.functions.values():
        _ack(tool.role, "IAM5[Resource::*]", _XRAY)
    objects = plane.tools.functions.get(OBJECTS_SOURCE)
    if objects is not None:
        _ack(
            objects.role,
            f"IAM5[Resource::{bucket}/{TENANT_OBJECTS_PREFIX}*]",
            "object_read reads a tenant's own files under manifests/uploads/<tenant>/: the "
            "tenant is chosen per call by the worker (GetObject only)",
        )

    fanout_role = plane.fanout.role
    _ack(
        fanout_role,
        "IAM5[Resource::*]",
        "X-Ray tracing and CloudWatch Logs log delivery (logs:*LogDelivery, "
        "logs:*ResourcePolicy, logs:DescribeLogGroups) have no resource-level permissions",
    )
    _ack(
        fanout_role,
        manifests,
        "ItemReader reads the manifest the API wrote for this execution "
        "(manifests/<batch id>/units.json or resume-<n>.json): keys are chosen per batch",
    )
    _ack(
        fanout_role,
        results,
        "ResultWriter writes results/<map run id>/...: the keys are chosen by Step Functions",
    )
    _ack(
        fanout_role,
        f"IAM5[Resource::{executions}{name}/*]",
        "Distributed Map child executions are named <state machine>/<map run>:<id> at run time",
    )

    for entry in plane.config.registry.catalog.values():
        prefix, _, base_id = entry.model_id.partition(".")
        if plane.config.model.adapter == "bedrock" and base_id and prefix in CROSS_REGION_PREFIXES:
            _ack(
                plane.workers.worker.role,
                f"IAM5[Resource::arn:<AWS::Partition>:bedrock:*::foundation-model/{base_id}]",
                "A cross-region inference profile routes each call to the same foundation model "
                "in any region of its geography; the grant names that one model",
            )

    _ack(
        plane.front_door.handler.role,
        manifests,
        "The API reads its batches' manifests (manifests/<batch id>/units.json, resume-<n>.json) "
        "back to resume, and the tenant's upload under manifests/uploads/<tenant>/ (GetObject)",
    )
    _ack(
        plane.front_door.handler.role,
        f"IAM5[Resource::{bucket}/{MANIFEST_PREFIX}{BATCH_ID_PREFIX}*]",
        "The API writes manifests/<batch id>/units.json and resume-<n>.json: keys per batch "
        "(PutObject only)",
    )
    _ack(
        plane.front_door.handler.role,
        f"IAM5[Resource::{bucket}/{UPLOADS_PREFIX}*]",
        "POST /uploads presigns a PUT of manifests/uploads/<tenant>/<new id>.json for the "
        "caller, a key generated per request, so tenants need no rights on the bucket "
        "(PutObject only)",
    )
    _ack(
        plane.front_door.handler.role,
        results,
        "A results page reads the outcome objects under results/<batch id>/attempts/ of the "
        "caller's own batch (checked in the ledger first) and signs a download of its results file",
    )
    _ack(
        plane.workers.worker.role,
        f"IAM5[Resource::{bucket}/{ATTEMPT_RECORDS}*]",
        "A worker writes each attempt's outcome once, under results/<batch id>/attempts/: keys "
        "per batch (a page of an invocation's outcomes, or one attempt's) (PutObject only)",
    )
    _ack(
        plane.fanout.finalizer.role,
        results,
        "The finalizer writes results/<batch id>/<state>-<epoch>.json, its .jsonl results file "
        "and remainder-<epoch>.json, checks (HeadObject) whether the first exists and reads the "
        "attempt records: keys per batch and closure",
    )
    _ack(
        plane.fanout.finalizer.role,
        manifests,
        "The finalizer reads a batch's manifest (manifests/<batch id>/units.json) for the input "
        "of a lost unit it requeues and for the remainder manifest it writes",
    )
    sweeper_role = plane.sweeper.role
    _ack(
        sweeper_role,
        results,
        "The sweeper finalizes a run whose execution died (the finalizer's code): it writes "
        "results/<batch id>/<state>-<epoch>.json, its .jsonl results file and "
        "remainder-<epoch>.json, checks whether the first exists and reads the attempt records: "
        "keys per batch and closure",
    )
    _ack(
        sweeper_role,
        manifests,
        "The sweeper finalizes a run whose execution died (the finalizer's code): it reads the "
        "batch's manifest (manifests/<batch id>/units.json) for a lost unit's input and the "
        "remainder manifest",
    )
    _ack(
        sweeper_role,
        f"IAM5[Resource::{executions}{name}:*]",
        "The sweeper describes the executions of the fan-out state machine that may be running "
        "a run (<batch>, <batch>-resume-<n>, <batch>-r<n>, their continuations <root>-c<n>): "
        "names chosen per batch at run time; DescribeExecution only",
    )
    if plane.config.api.create_cloudwatch_role:
        cloudwatch_role = plane.front_door.api.node.find_child("CloudWatchRole")
        _ack(
            cloudwatch_role,
            "IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
            "AmazonAPIGatewayPushToCloudWatchLogs]",
            "The account-level role API Gateway logs through (api.create_cloudwatch_role): "
            "AWS's managed policy for it, since API Gateway creates the execution log groups "
            "(API-Gateway-Execution-Logs_<api id>/<stage>) itself",
        )

    _ack(
        plane.front_door.api,
        "COG4",
        "IAM (SigV4) authorization on every method instead of Cognito: tenants are IAM "
        "principals, the tenant comes from the verified caller identity, no secrets stored",
    )
    _ack(
        plane.front_door.api.deployment_stage,
        "APIG3",
        "No WAF web ACL by default: every request must be SigV4-signed (unsigned traffic is "
        "rejected before integration) and the stage is throttled; attach an ACL per account",
    )
