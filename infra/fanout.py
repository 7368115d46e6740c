"""Fan-out: the state machine (Distributed Map over the S3 manifest), its item step, finalizer."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import FINALIZER_TIMEOUT_S, SwarmConfig, fanout_definition_numbers
from infra.constants import (
    FANOUT_ASL,
    LEASES_INDEX,
    MANIFEST_PREFIX,
    OPEN_RUNS_INDEX,
    RESULTS_PREFIX,
)
from infra.functions import (
    Environment,
    FunctionFactory,
    FunctionSpec,
    SwarmFunction,
    retention,
)
from infra.queues import LaneQueues
from infra.storage import BatchStorage
from swarm.contract import FANOUT, FINALIZER, SWEEP_INTERVAL_SECONDS, SWEEPER

#: Child executions in AWS are EXPRESS (cheap, at-least-once is fine: admission is idempotent).
#: moto cannot run EXPRESS children: the local runtime rewrites this substitution to STANDARD.
MAP_EXECUTION_TYPE = "EXPRESS"


#: The fan-out function admits a chunk of up to fanout.units_per_child units (a ledger read and
#: transaction each) and sends them. Measured on moto (in-process, one invocation): a chunk of
#: 100 units in 2.9 s, ~29 ms per unit; on AWS a DynamoDB request takes a few ms. Its timeout
#: (fanout.timeout_seconds, default 30 s: 10 times the measured chunk of 100, twice a chunk of
#: MAX_UNITS_PER_CHILD at that rate) times the child's attempts, plus INIT and the retry pauses,
#: must end within an Express child's 5 minutes: synth derives that from the ASL
#: (infra/config.py express_child_problem).
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
        **fanout_definition_numbers(config),
        "ResultsPrefix": RESULTS_PREFIX,
    }


class FanOutMachine(Construct):
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
        bus: events.IEventBus,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
        self._config, self._lanes, self._ledger = config, lanes, ledger
        self._storage, self._bus = storage, bus

        self.admit: SwarmFunction = factory.build(
            "Admit",
            FunctionSpec(
                name=FANOUT,
                description="Distributed Map item: a chunk's ledger admissions, then its sends",
                timeout=cdk.Duration.seconds(config.fanout.timeout_seconds),
            ),
        )
        ledger.grant(
            self.admit.role,
            "dynamodb:BatchGetItem",  # ledger.unit and admit's reads
            "dynamodb:UpdateItem",  # admit: books (and unit) updates
        )
        # the admitted units' places in their tenant's queue (DynamoDBGovernor.book_places):
        # one Query for a fresh view, one conditional update per chunk (the shards, if it comes
        # first, are created by conditional updates too: no PutItem)
        governor.grant(self.admit.role, "dynamodb:Query", "dynamodb:UpdateItem")
        for queue in lanes.queues.values():  # SSE-SQS: no KMS key to grant
            # the admitted units, on their lane (SendMessageBatch is authorized as SendMessage)
            queue.grant(self.admit.role, "sqs:SendMessage")

        self.finalizer: SwarmFunction = factory.build(
            "Finalizer",
            FunctionSpec(
                name=FINALIZER,
                description="Closes a run as run.completed or run.exhausted",
                timeout=cdk.Duration.seconds(FINALIZER_TIMEOUT_S),
                memory_mb=512,
            ),
        )
        self._grant_finalizing(self.finalizer.role)
        # its open action (the state machine's OpenUnits, swarm.service.opener): the unit items,
        # 25 per request, and the books' progress and readiness (UpdateItem, granted above);
        # it reads the run's spec object under manifests/ (granted above). The sweeper, which
        # shares the finalizing grants, never opens a run: not granted to it.
        ledger.grant(self.finalizer.role, "dynamodb:BatchWriteItem")

        # The name is derived from the stack's (unique per account and region): the role's
        # policy must name the state machine's own ARN (child executions, continue-as-new), and
        # a generated name would make the policy depend on the state machine that depends on
        # the role.
        name = factory.state_machine_name
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
        role.add_to_principal_policy(
            # the Distributed Map's child executions, and the finalize loop's continue-as-new
            # (a new execution of this state machine before the history limit)
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

    def _grant_finalizing(self, role: iam.IRole) -> None:
        """What ``Finalizer.finalize`` calls: the finalizer's, and the sweeper's, which runs it
        for a run whose execution died."""
        self._ledger.grant(
            role,
            "dynamodb:BatchGetItem",  # the run, and each reclaimed unit
            # the run's units (the results, once, at closure; the lease sweep's scan of a run
            # past its scan horizon: docs/explanation/ledger.md)
            "dynamodb:Query",
            # reclaim: books + unit updates; the run's watch entry (record, release)
            "dynamodb:UpdateItem",
        )
        role.add_to_principal_policy(  # DynamoDBLedger.expired_leases: one run's expired leases
            iam.PolicyStatement(
                actions=["dynamodb:Query"],
                resources=[f"{self._ledger.table_arn}/index/{LEASES_INDEX}"],
            )
        )
        # Writes results and the remainder manifest (read from the batch's manifest); checks
        # whether its results object exists (HeadObject, authorized as s3:GetObject).
        # The results file is a multipart upload past 8 MiB (PutObject authorizes its parts;
        # a failed one is aborted).
        self._storage.grant_objects(
            role, RESULTS_PREFIX, "s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"
        )
        self._storage.grant_objects(role, MANIFEST_PREFIX, "s3:GetObject")
        # so the results check (HeadObject) sees 404 for a key not written yet, not 403
        self._storage.grant_list(role, RESULTS_PREFIX, MANIFEST_PREFIX)
        self._bus.grant_put_events_to(role)
        # Its lease sweeper requeues the retry of a unit whose worker died with its message.
        for queue in self._lanes.queues.values():
            queue.grant(role, "sqs:SendMessage")

    def add_sweeper(self, *, factory: FunctionFactory, environment: Environment) -> SwarmFunction:
        """The sweeper and its schedule: built once the state machine's ARN is in the functions'
        environment (it restarts executions of it).

        Every ``fanout.sweeper_rate_minutes`` it looks at the runs that are due in the ledger's
        ``OpenRuns`` index and repairs those whose execution died (swarm/service/sweeper.py).
        """
        rate = self._config.fanout.sweeper_rate_minutes
        environment.set(**{SWEEP_INTERVAL_SECONDS: str(rate * 60)})
        sweeper = factory.build(
            "Sweeper",
            FunctionSpec(
                name=SWEEPER,
                description="Repairs runs whose fan-out execution died (scheduled)",
                timeout=cdk.Duration.seconds(min(300, rate * 60)),  # ends before the next tick
                memory_mb=512,
            ),
        )
        role = sweeper.role
        # Finalizer.finalize for a run with no live execution: leases, closure, announcement
        self._grant_finalizing(role)
        role.add_to_principal_policy(  # DynamoDBRunWatch.due: the due runs, most overdue first
            iam.PolicyStatement(
                actions=["dynamodb:Query"],
                resources=[f"{self._ledger.table_arn}/index/{OPEN_RUNS_INDEX}"],
            )
        )
        role.add_to_principal_policy(  # StepFunctionsExecutions.start: a restart <batch>-r<n>
            iam.PolicyStatement(
                actions=["states:StartExecution"],
                resources=[self.state_machine.state_machine_arn],
            )
        )
        role.add_to_principal_policy(  # StepFunctionsExecutions.status: is an execution live?
            iam.PolicyStatement(
                actions=["states:DescribeExecution"],
                resources=[
                    cdk.Stack.of(self).format_arn(
                        service="states",
                        resource="execution",
                        resource_name=f"{self.state_machine_name}:*",
                        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                    )
                ],
            )
        )
        self.sweep_rule = events.Rule(
            self,
            "Sweep",
            description="Repair runs whose fan-out execution died",
            schedule=events.Schedule.rate(cdk.Duration.minutes(rate)),
            targets=[
                targets.LambdaFunction(
                    sweeper.function,
                    retry_attempts=2,
                    # a sweep older than one period is replaced by the next one
                    max_event_age=cdk.Duration.minutes(rate),
                )
            ],
        )
        self.sweeper = sweeper
        return sweeper
