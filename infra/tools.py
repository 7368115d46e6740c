"""The tool registry's functions: one Lambda function per tool *source* (a module
``functions/tools/<source>.py``), each with a role of its own holding only what its tools need,
the notes tools' table and the BFCL toolset's journals table. The worker may invoke exactly the
registered functions (these and the ``function_arn`` ones) and nothing else
(:meth:`ToolFunctions.grant_invoke`).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import SwarmConfig
from infra.constants import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE
from infra.functions import ARCHITECTURE, RUNTIME, FunctionFactory, lambda_log_level, retention
from infra.storage import BatchStorage
from swarm import contract as env

#: the memory of a tool function: they parse a small input and make one or two requests
TOOL_MEMORY_MB = 256
#: where object_read reads: each tenant's folder of the batch bucket (swarm.adapters.tool_objects)
TENANT_OBJECTS_PREFIX = "manifests/uploads/"
#: the sources whose tools need the notes table
NOTES_SOURCE = "notes"
OBJECTS_SOURCE = "object_read"
#: the source whose units' backends live in the journals table (swarm.adapters.tool_journals)
JOURNALS_SOURCE = "bfcl"


def _construct_id(source: str) -> str:
    return "".join(part.capitalize() for part in source.split("_"))


class ToolFunction(Construct):
    """One tool source as a function: its own role, its own log group, the others' settings."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        source: str,
        tools: list[str],
        config: SwarmConfig,
        code: lambda_.Code,
        environment: dict[str, str],
        timeout_s: int,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
        self.source = source
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"swarm {config.stage} tool source {source} (least privilege)",
        )
        self.log_group = logs.LogGroup(
            self, "Logs", retention=retention(config), removal_policy=removal
        )
        self.function = lambda_.Function(
            self,
            "Function",
            description=f"Tool source {source}: {', '.join(tools)}"[:256],
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=f"{env.TOOL_HANDLER_PACKAGE}.{source}.handler",
            code=code,
            role=self.role,
            timeout=cdk.Duration.seconds(timeout_s),
            memory_size=TOOL_MEMORY_MB,
            environment=environment,
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_log_level(config.observability.log_level),
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            tracing=lambda_.Tracing.ACTIVE,
        )
        self.log_group.grant_write(self.role)


class ToolFunctions(Construct):
    """Every source of the registry as a :class:`ToolFunction`, and what they need."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SwarmConfig,
        factory: FunctionFactory,
        storage: BatchStorage,
        common: dict[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        resolved = config.resolved_tools()
        sources = config.tool_sources()
        self.notes_table: dynamodb.Table | None = None
        if NOTES_SOURCE in sources:
            self.notes_table = self._table(config, "NotesTable")
        self.journals_table: dynamodb.Table | None = None
        if JOURNALS_SOURCE in sources:
            self.journals_table = self._table(config, "JournalsTable")
        self.functions: dict[str, ToolFunction] = {}
        for source, tools in sources.items():
            environment = {**common, env.TOOL_SOURCE: source}
            for var in env.TOOL_FUNCTION_ENV.get(source, ()):
                if var == env.NOTES_TABLE_NAME and self.notes_table is not None:
                    environment[var] = self.notes_table.table_name
                elif var == env.TOOL_JOURNALS_TABLE_NAME and self.journals_table is not None:
                    environment[var] = self.journals_table.table_name
                elif var == env.BUCKET_NAME:
                    environment[var] = storage.bucket.bucket_name
            # the function outlives the longest of its tools' timeouts a little: the worker's
            # client gives up first, and the function's own timeout ends a stuck one
            timeout = max(resolved[name].timeout_seconds for name in tools) + 1
            self.functions[source] = ToolFunction(
                self,
                f"{_construct_id(source)}Source",
                source=source,
                tools=tools,
                config=config,
                code=factory.code,
                environment=environment,
                timeout_s=timeout,
            )
        notes = self.functions.get(NOTES_SOURCE)
        if notes is not None and self.notes_table is not None:
            # read a note, list the names, and the write's transaction (a Put of the note and
            # a conditional Put of its idempotency record: both PutItem to IAM)
            self.notes_table.grant(
                notes.role, "dynamodb:GetItem", "dynamodb:Query", "dynamodb:PutItem"
            )
        journals = self.functions.get(JOURNALS_SOURCE)
        if journals is not None and self.journals_table is not None:
            # read a unit's journal, append one call on the condition its position is free
            self.journals_table.grant(journals.role, "dynamodb:Query", "dynamodb:PutItem")
        objects = self.functions.get(OBJECTS_SOURCE)
        if objects is not None:
            storage.grant_objects(objects.role, TENANT_OBJECTS_PREFIX, "s3:GetObject")

    def _table(self, config: SwarmConfig, construct_id: str) -> dynamodb.Table:
        return dynamodb.Table(
            self,
            construct_id,
            partition_key=dynamodb.Attribute(
                name=PARTITION_KEY, type=dynamodb.AttributeType.STRING
            ),
            sort_key=dynamodb.Attribute(name=SORT_KEY, type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # the notes' idempotency records and the journals' calls expire
            time_to_live_attribute=TTL_ATTRIBUTE,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            deletion_protection=config.production,
            removal_policy=(
                cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
            ),
        )

    def arns(self) -> dict[str, str]:
        """Each source's function ARN (a token), by source."""
        return {source: f.function.function_arn for source, f in self.functions.items()}

    def registry_value(self) -> str:
        """:data:`swarm.contract.TOOL_REGISTRY` for the worker."""
        return self.config.tool_registry_value(self.arns())

    def invocable_arns(self) -> list[str]:
        """Every registered function: the sources' and the ``function_arn`` ones, once each."""
        arns = [f.function.function_arn for f in self.functions.values()]
        external = {
            t.function_arn
            for t in self.config.resolved_tools().values()
            if t.function_arn is not None
        }
        return arns + sorted(external)

    def secret_arns(self) -> list[str]:
        """The MCP servers' auth secrets as IAM resources: a complete ARN as given; a name as
        ``...:secret:<name>-??????`` (Secrets Manager adds a hyphen and six random characters to
        a secret's ARN, so a policy naming a secret by its name needs the suffix wildcard)."""
        stack = cdk.Stack.of(self)
        return [
            secret
            if secret.startswith("arn:")
            else stack.format_arn(
                service="secretsmanager",
                resource="secret",
                resource_name=f"{secret}-??????",
                arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
            )
            for secret in self.config.mcp_secrets()
        ]

    def grant_read_secrets(self, role: iam.IRole) -> None:
        """``secretsmanager:GetSecretValue`` on exactly the MCP servers' auth secrets (nothing
        when none has one)."""
        arns = self.secret_arns()
        if arns:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"], resources=arns)
            )

    def grant_invoke(self, role: iam.IRole) -> None:
        """``lambda:InvokeFunction`` on exactly the registered functions (no ``:*`` versions:
        the worker invokes the unqualified ARN, or the qualified one cdk.json gives)."""
        arns = self.invocable_arns()
        if arns:
            role.add_to_principal_policy(
                iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=arns)
            )
