"""The front door: an API Gateway REST API for the batch API, authenticated with IAM (SigV4).

Why IAM rather than per-tenant API keys or a Lambda authorizer: API keys identify, they do not
authenticate (AWS says not to use them for authorization), and an authorizer means storing and
rotating tenant secrets ourselves. With IAM every request is SigV4-signed, API Gateway verifies it
before our code runs, no secret lives in this stack, and the tenant is the caller's identity: the
handler takes it from ``requestContext.identity.userArn`` (the role
``<tenant_principal_prefix><tenant>`` or its assumed-role sessions), never from the body. Tenants
get ``execute-api:Invoke`` on this API through their own roles; the CLI signs with the caller's
ordinary AWS credentials.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import SwarmConfig
from infra.constants import LEASES_INDEX, MANIFEST_PREFIX, RESULTS_PREFIX, TENANT_RUNS_INDEX
from infra.drain import grant_get_parameter
from infra.functions import FunctionFactory, FunctionSpec, SwarmFunction, retention
from infra.queues import LaneQueues
from infra.storage import BatchStorage
from swarm.api.gateway import GATEWAY_RESPONSES
from swarm.api.models import BATCH_ID_PREFIX, UPLOADS_PREFIX
from swarm.api.openapi import DRAFT4, IDEMPOTENCY_KEY, ROUTES, gateway_schema
from swarm.contract import API


def _cdk_schema(schema: Mapping[str, Any]) -> apigw.JsonSchema:
    """A JSON schema dict (:func:`swarm.api.openapi.gateway_schema`) as CDK's ``JsonSchema``,
    which renders it back keyword for keyword."""
    kwargs: dict[str, Any] = {}
    for key, value in schema.items():
        name = "not_" if key == "not" else re.sub(r"(?<!^)(?=[A-Z])", "_", key.lstrip("$")).lower()
        if key == "$schema":
            if value != DRAFT4:
                raise ValueError(f"API Gateway models are JSON Schema draft 4, not {value}")
            value = apigw.JsonSchemaVersion.DRAFT4
        elif key == "type":
            value = (
                apigw.JsonSchemaType[value.upper()]
                if isinstance(value, str)
                else [apigw.JsonSchemaType[v.upper()] for v in value]
            )
        elif key == "properties":
            value = {prop: _cdk_schema(sub) for prop, sub in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            value = _cdk_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            value = [_cdk_schema(sub) for sub in value]
        kwargs[name] = value
    return apigw.JsonSchema(**kwargs)


#: the access log's fields (one JSON object per request)
ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "ip": "$context.identity.sourceIp",
    "caller": "$context.identity.caller",
    "user": "$context.identity.user",
    "userArn": "$context.identity.userArn",
    "accountId": "$context.identity.accountId",
    "requestTime": "$context.requestTime",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "status": "$context.status",
    "protocol": "$context.protocol",
    "responseLength": "$context.responseLength",
    "integrationLatency": "$context.integrationLatency",
    "errorType": "$context.error.responseType",
}


class FrontDoor(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SwarmConfig,
        factory: FunctionFactory,
        lanes: LaneQueues,
        governor: dynamodb.ITable,
        ledger: dynamodb.ITable,
        storage: BatchStorage,
        state_machine: sfn.IStateMachine,
        drain_parameter: ssm.IStringParameter,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
        self.handler: SwarmFunction = factory.build(
            "Handler",
            FunctionSpec(
                name=API,
                description="The batch API: submit, status, resume, fleet, drain status",
                # with INIT within API Gateway's 29 s integration timeout (infra/config.py checks)
                timeout=cdk.Duration.seconds(config.api.timeout_seconds),
                # one full vCPU (Lambda gives CPU in proportion to memory): validating a
                # 100,000-unit manifest took 7.5 s on one core here, and must fit the 19 s; the
                # API is called once per batch, so its memory is not what a unit costs
                memory_mb=1769,
            ),
        )
        # Exactly the calls its code makes (tests/infra/test_permissions.py lists who calls what).
        role = self.handler.role
        ledger.grant(
            role,
            "dynamodb:BatchGetItem",  # every read (run, spec, unit)
            "dynamodb:Query",  # a run's units (status remainder, resume, results pages)
            # begin_open: the spec and the opening books (TransactWriteItems Puts); the unit
            # items are the open step's (the finalizer's role), not the API's
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",  # resume tops up; bindings
            "dynamodb:DeleteItem",  # an operator's re-bind of a tenant (its binding item)
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["dynamodb:Query"],
                resources=[
                    # DynamoDBLedger.queued_units: the tenant's open runs
                    f"{ledger.table_arn}/index/{TENANT_RUNS_INDEX}",
                    # GET /batches/{id}/approvals: a run's leased units (its parked ones)
                    f"{ledger.table_arn}/index/{LEASES_INDEX}",
                ],
            )
        )
        # Read only: shedding and the fleet view take a snapshot. Rather than granting the API
        # PutItem to create a missing bucket (a fresh stack, or a new quota/share/capacity), its
        # governor client is read-only and reads a missing bucket as its configured initial
        # state (swarm/wiring.py, swarm/adapters/dynamodb_governor.py): the workers create it.
        governor.grant(role, "dynamodb:Query")
        # writes its batches' manifests/<batch>/units.json and resume-<n>.json; reads them back
        # (resume) and the tenant's upload under manifests/uploads/<tenant>/ (submit)
        storage.grant_objects(role, f"{MANIFEST_PREFIX}{BATCH_ID_PREFIX}", "s3:PutObject")
        storage.grant_objects(role, MANIFEST_PREFIX, "s3:GetObject")
        # POST /uploads presigns a PUT of manifests/uploads/<tenant>/<new id>.json: the URL
        # carries this role's rights, so tenants need none on the bucket (exactly PutObject)
        storage.grant_objects(role, UPLOADS_PREFIX, "s3:PutObject")
        # a results page reads attempt records; a download URL it signs reads a results file
        # (a presigned GET carries the signer's rights: exactly s3:GetObject on results/*)
        storage.grant_objects(role, RESULTS_PREFIX, "s3:GetObject")
        # so S3 answers a missing upload (submit), an expired manifest (resume), an attempt not
        # recorded or a results file not written yet with 404
        storage.grant_list(role, MANIFEST_PREFIX, RESULTS_PREFIX)
        # submit and resume start executions named after the batch (idempotent); the API never
        # describes, redrives or stops one (resume starts <batch>-resume-<n>)
        state_machine.grant_start_execution(role)
        grant_get_parameter(drain_parameter, role)
        for queue in lanes.queues.values():
            queue.grant(role, "sqs:GetQueueAttributes")  # lane depth: shedding, fleet view
            # a decision on a gated tool call sends its unit back to its lane (human gates)
            queue.grant(role, "sqs:SendMessage")

        self.access_logs = logs.LogGroup(
            self,
            "AccessLogs",
            retention=retention(config),
            removal_policy=removal,
        )
        self.api = apigw.RestApi(
            self,
            "Api",
            description=f"swarm {config.stage} batch API (IAM auth)",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # Access and execution logging (below) need the region's account-level CloudWatch
            # role for API Gateway: a fresh account has none, and then the stage fails to create.
            # On by default, so the defaults deploy anywhere; the role and the account setting
            # are retained with the stack deleted (other APIs of the region may log through it).
            # Off: the account already has one (docs/tutorials/first-deployment.md).
            cloud_watch_role=config.api.create_cloudwatch_role,
            cloud_watch_role_removal_policy=cdk.RemovalPolicy.RETAIN,
            default_method_options=apigw.MethodOptions(
                authorization_type=apigw.AuthorizationType.IAM
            ),
            deploy_options=apigw.StageOptions(
                stage_name=config.stage,
                throttling_rate_limit=config.api.throttle_rate_limit,
                throttling_burst_limit=config.api.throttle_burst_limit,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                # who called: with IAM auth the caller is a role session, and its ARN
                # (userArn: the tenant's role) is what an audit needs; never a body
                access_log_format=apigw.AccessLogFormat.custom(json.dumps(ACCESS_LOG_FIELDS)),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                metrics_enabled=True,
                tracing_enabled=True,
            ),
        )
        self._gateway_responses()

        validator = self.api.add_request_validator(
            "Validator", validate_request_body=True, validate_request_parameters=True
        )
        integration = apigw.LambdaIntegration(
            self.handler.function, scope_permission_to_method=False
        )
        # Every route of swarm.api.openapi.ROUTES, each body checked against the JSON schema of
        # the model the handler validates it with, so the two cannot disagree on what is valid
        # (the gateway leaves to the handler only the limits it answers with 413)
        models: dict[str, apigw.IModel] = {}
        for route in ROUTES:
            params = {f"method.request.path.{name}": True for name in route.path_params}
            if route.idempotency_key:
                params[f"method.request.header.{IDEMPOTENCY_KEY}"] = False
            for name in route.query.model_fields if route.query is not None else ():
                params[f"method.request.querystring.{name}"] = False
            request_models = None
            if route.request is not None:
                name = route.request.__name__
                if name not in models:
                    schema = _cdk_schema(gateway_schema(route.request))
                    models[name] = self.api.add_model(name, schema=schema)
                request_models = {"application/json": models[name]}
            self.api.root.resource_for_path(route.path).add_method(
                route.method,
                integration,
                authorization_type=apigw.AuthorizationType.IAM,
                request_validator=validator,
                request_models=request_models,
                request_parameters=params or None,
            )

    def _gateway_responses(self) -> None:
        """Errors API Gateway raises itself also answer ``{"error", "message"}`` JSON
        (:data:`swarm.api.gateway.GATEWAY_RESPONSES`; the local API serves them from this
        template)."""
        for response in GATEWAY_RESPONSES:
            self.api.add_gateway_response(
                response.name,
                type=apigw.ResponseType.of(response.response_type),
                status_code=None if response.status is None else str(response.status),
                response_headers={k: f"'{v}'" for k, v in response.headers.items()} or None,
                templates=dict(response.templates),
            )
