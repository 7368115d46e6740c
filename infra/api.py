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

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import SwarmConfig
from infra.constants import MANIFEST_PREFIX
from infra.drain import grant_get_parameter
from infra.functions import FunctionFactory, FunctionSpec, SwarmFunction, retention
from infra.queues import LaneQueues
from infra.storage import BatchStorage
from swarm.contract import API
from swarm.core.records import LANES

_ID_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"  # swarm.core.records.check_id

#: POST /batches: shape only; the handler checks the rest and names the field in a 400.
SUBMIT_SCHEMA = apigw.JsonSchema(
    schema=apigw.JsonSchemaVersion.DRAFT4,
    title="BatchSubmission",
    type=apigw.JsonSchemaType.OBJECT,
    properties={
        "lane": apigw.JsonSchema(
            type=apigw.JsonSchemaType.STRING, enum=[lane.value for lane in LANES]
        ),
        "budget": apigw.JsonSchema(type=apigw.JsonSchemaType.INTEGER, minimum=0),
        "max_attempts": apigw.JsonSchema(type=apigw.JsonSchemaType.INTEGER, minimum=1, maximum=100),
        "units": apigw.JsonSchema(
            type=apigw.JsonSchemaType.ARRAY,
            min_items=1,
            items=apigw.JsonSchema(
                type=apigw.JsonSchemaType.OBJECT,
                required=["unit_id", "projected_tokens"],
                properties={
                    "unit_id": apigw.JsonSchema(
                        type=apigw.JsonSchemaType.STRING, pattern=_ID_PATTERN
                    ),
                    "projected_tokens": apigw.JsonSchema(
                        type=apigw.JsonSchemaType.INTEGER, minimum=1
                    ),
                },
            ),
        ),
        "manifest": apigw.JsonSchema(
            type=apigw.JsonSchemaType.OBJECT,
            required=["key"],
            properties={"key": apigw.JsonSchema(type=apigw.JsonSchemaType.STRING, min_length=1)},
        ),
    },
)

#: POST /batches/{batch_id}/resume
RESUME_SCHEMA = apigw.JsonSchema(
    schema=apigw.JsonSchemaVersion.DRAFT4,
    title="BatchResume",
    type=apigw.JsonSchemaType.OBJECT,
    properties={"top_up": apigw.JsonSchema(type=apigw.JsonSchemaType.INTEGER, minimum=0)},
)

_ERROR_TEMPLATE = {
    "application/json": json.dumps(
        {"error": "$context.error.responseType", "message": "$context.error.messageString"}
    )
}
_VALIDATION_TEMPLATE = {
    "application/json": json.dumps(
        {"error": "invalid_request", "message": "$context.error.validationErrorString"}
    )
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
                timeout=cdk.Duration.seconds(29),  # API Gateway's integration limit
                memory_mb=512,
            ),
        )
        # Exactly the calls its code makes (tests/infra/test_permissions.py lists who calls what).
        role = self.handler.role
        ledger.grant(
            role,
            "dynamodb:BatchGetItem",  # every read (run, spec, unit)
            "dynamodb:Query",  # a run's units (status remainder, resume)
            "dynamodb:PutItem",  # open_run: spec and books (TransactWriteItems Puts)
            "dynamodb:BatchWriteItem",  # open_run: the unit items
            "dynamodb:UpdateItem",  # open_run marks the books ready; resume tops up
        )
        # Read only: shedding and the fleet view take a snapshot. Rather than granting the API
        # PutItem to create a missing bucket (a fresh stack, or a new quota/share/capacity), its
        # governor client is read-only and reads a missing bucket as its configured initial
        # state (swarm/wiring.py, swarm/adapters/dynamodb_governor.py): the workers create it.
        governor.grant(role, "dynamodb:Query")
        # manifests/<batch>/units.json and resume-<n>.json; reads manifests/uploads/<tenant>/...
        storage.grant_objects(role, MANIFEST_PREFIX, "s3:PutObject", "s3:GetObject")
        # so S3 answers a missing upload (submit) or an expired manifest (resume) with 404
        storage.grant_list(role, MANIFEST_PREFIX)
        # submit and resume start executions named after the batch (idempotent); the API never
        # describes, redrives or stops one (resume starts <batch>-resume-<n>)
        state_machine.grant_start_execution(role)
        grant_get_parameter(drain_parameter, role)
        for queue in lanes.queues.values():
            queue.grant(role, "sqs:GetQueueAttributes")  # lane depth: shedding, fleet view

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
            # Off: the account already has one (README, "Deploying to an AWS account").
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
                access_log_format=apigw.AccessLogFormat.json_with_standard_fields(
                    caller=True,
                    http_method=True,
                    ip=True,
                    protocol=True,
                    request_time=True,
                    resource_path=True,
                    response_length=True,
                    status=True,
                    user=True,
                ),
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
        submit_model = self.api.add_model("BatchSubmission", schema=SUBMIT_SCHEMA)
        resume_model = self.api.add_model("BatchResume", schema=RESUME_SCHEMA)
        integration = apigw.LambdaIntegration(
            self.handler.function, scope_permission_to_method=False
        )

        def method(
            resource: apigw.IResource,
            verb: str,
            *,
            model: apigw.IModel | None = None,
            params: dict[str, bool] | None = None,
        ) -> None:
            resource.add_method(
                verb,
                integration,
                authorization_type=apigw.AuthorizationType.IAM,
                request_validator=validator,
                request_models={"application/json": model} if model else None,
                request_parameters=params,
            )

        batches = self.api.root.add_resource("batches")
        method(
            batches,
            "POST",
            model=submit_model,
            params={"method.request.header.Idempotency-Key": False},
        )
        batch = batches.add_resource("{batch_id}")
        method(batch, "GET", params={"method.request.path.batch_id": True})
        resume = batch.add_resource("resume")
        method(
            resume,
            "POST",
            model=resume_model,
            params={"method.request.path.batch_id": True},
        )
        method(self.api.root.add_resource("fleet"), "GET")
        method(self.api.root.add_resource("drain"), "GET")

    def _gateway_responses(self) -> None:
        """Errors API Gateway raises itself also answer ``{"error", "message"}`` JSON."""
        for name, response_type in (
            ("BadBody", apigw.ResponseType.BAD_REQUEST_BODY),
            ("BadParameters", apigw.ResponseType.BAD_REQUEST_PARAMETERS),
        ):
            self.api.add_gateway_response(
                name, type=response_type, status_code="400", templates=_VALIDATION_TEMPLATE
            )
        self.api.add_gateway_response(
            "Throttled",
            type=apigw.ResponseType.THROTTLED,
            status_code="429",
            response_headers={"Retry-After": "'1'"},
            templates=_ERROR_TEMPLATE,
        )
        for name, response_type in (
            ("Default4xx", apigw.ResponseType.DEFAULT_4_XX),
            ("Default5xx", apigw.ResponseType.DEFAULT_5_XX),
        ):
            self.api.add_gateway_response(name, type=response_type, templates=_ERROR_TEMPLATE)
