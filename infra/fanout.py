"""Fan-out: the state machine (Distributed Map over the S3 manifest), its item step, finalizer."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import SwarmConfig
from infra.constants import FANOUT, FANOUT_ASL, FINALIZER, MANIFEST_PREFIX, RESULTS_PREFIX
from infra.functions import FunctionFactory, FunctionSpec, SwarmFunction, retention
from infra.queues import LaneQueues
from infra.storage import BatchStorage

#: Child executions in AWS are EXPRESS (cheap, at-least-once is fine: admission is idempotent).
#: moto cannot run EXPRESS children: the local runtime rewrites this substitution to STANDARD.
MAP_EXECUTION_TYPE = "EXPRESS"


def definition_substitutions(
    *,
    config: SwarmConfig,
    bucket_name: str,
    fanout_arn: str,
    finalizer_arn: str,
) -> dict[str, str]:
    """Every ``${...}`` in statemachines/fanout.asl.json (tests substitute plain strings)."""
    return {
        "BucketName": bucket_name,
        "FanoutFunctionArn": fanout_arn,
        "FinalizerFunctionArn": finalizer_arn,
        "MapExecutionType": MAP_EXECUTION_TYPE,
        "MaxConcurrency": str(config.fanout.max_concurrency),
        "ToleratedFailurePercentage": str(config.fanout.tolerated_failure_percentage),
        "FinalizerPollSeconds": str(config.fanout.finalizer_poll_seconds),
        "ResultsPrefix": RESULTS_PREFIX,
    }


class FanOut(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SwarmConfig,
        factory: FunctionFactory,
        lanes: LaneQueues,
        ledger: dynamodb.ITable,
        storage: BatchStorage,
        bus: events.IEventBus,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY

        self.admit: SwarmFunction = factory.build(
            "Admit",
            FunctionSpec(
                name=FANOUT,
                description="Distributed Map item: ledger admission, then enqueue on the lane",
                timeout=cdk.Duration.seconds(30),
            ),
        )
        ledger.grant(
            self.admit.role,
            "dynamodb:BatchGetItem",  # ledger.unit and admit's reads
            "dynamodb:UpdateItem",  # admit: books (and unit) updates
        )
        for queue in lanes.queues.values():  # SSE-SQS: no KMS key to grant
            queue.grant(self.admit.role, "sqs:SendMessage")  # the admitted unit, on its lane

        self.finalizer: SwarmFunction = factory.build(
            "Finalizer",
            FunctionSpec(
                name=FINALIZER,
                description="Closes a run as run.completed or run.exhausted",
                timeout=cdk.Duration.seconds(300),
                memory_mb=512,
            ),
        )
        ledger.grant(
            self.finalizer.role,
            "dynamodb:BatchGetItem",  # the run, and each reclaimed unit
            "dynamodb:Query",  # the run's units (lease sweep, results)
            "dynamodb:UpdateItem",  # reclaim: books + unit updates
            "dynamodb:PutItem",  # reclaim settles a lost attempt: its attempt item
        )
        # Writes results and the remainder manifest (read from the batch's manifest); checks
        # whether its results object exists (HeadObject, authorized as s3:GetObject).
        storage.grant_objects(self.finalizer.role, RESULTS_PREFIX, "s3:GetObject", "s3:PutObject")
        storage.grant_objects(self.finalizer.role, MANIFEST_PREFIX, "s3:GetObject")
        bus.grant_put_events_to(self.finalizer.role)
        # Its lease sweeper requeues the retry of a unit whose worker died with its message.
        for queue in lanes.queues.values():
            queue.grant(self.finalizer.role, "sqs:SendMessage")

        # The name is derived from the stack's (unique per account and region): the role's
        # policy must name the state machine's own ARN (child executions), and a generated
        # name would make the policy depend on the state machine that depends on the role.
        name = f"{stack.stack_name}-fanout"
        self.state_machine_name = name
        state_machine_arn = stack.format_arn(
            service="states",
            resource="stateMachine",
            resource_name=name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        # Child executions of the Distributed Map: execution:<name>/<map run label>:<id>.
        child_executions_arn = stack.format_arn(
            service="states",
            resource="execution",
            resource_name=f"{name}/*",
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.role = role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("states.amazonaws.com"),
            description=f"swarm {config.stage} fan-out state machine",
        )
        role.add_to_principal_policy(  # the ASL names the unqualified functions
            iam.PolicyStatement(
                actions=["lambda:InvokeFunction"],
                resources=[self.admit.function.function_arn, self.finalizer.function.function_arn],
            )
        )
        storage.grant_objects(role, MANIFEST_PREFIX, "s3:GetObject")  # ItemReader
        storage.grant_objects(  # ResultWriter
            role,
            RESULTS_PREFIX,
            "s3:PutObject",
            "s3:GetObject",
            "s3:ListMultipartUploadParts",
            "s3:AbortMultipartUpload",
        )
        role.add_to_principal_policy(  # the Distributed Map's child executions
            iam.PolicyStatement(actions=["states:StartExecution"], resources=[state_machine_arn])
        )
        role.add_to_principal_policy(
            iam.PolicyStatement(
                # What Step Functions documents for a Distributed Map's role: it describes and
                # stops its child executions; RedriveExecution lets a redrive of a failed parent
                # (by an operator, e.g. from the console) redrive its Map Run.
                actions=[
                    "states:DescribeExecution",
                    "states:StopExecution",
                    "states:RedriveExecution",
                ],
                resources=[child_executions_arn],
            )
        )

        self.log_group = logs.LogGroup(
            self,
            "Logs",
            # CloudWatch Logs resource policies stay small under this prefix.
            log_group_name=f"/aws/vendedlogs/states/{name}",
            retention=retention(config),
            removal_policy=removal,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_file(str(FANOUT_ASL)),
            definition_substitutions=definition_substitutions(
                config=config,
                bucket_name=storage.bucket.bucket_name,
                fanout_arn=self.admit.function.function_arn,
                finalizer_arn=self.finalizer.function.function_arn,
            ),
            role=role,
            tracing_enabled=True,
            logs=sfn.LogOptions(
                destination=self.log_group,
                level=sfn.LogLevel.ALL,
                include_execution_data=False,  # units are tenants' data
            ),
        )
