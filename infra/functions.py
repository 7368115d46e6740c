"""How every function is built: own role, own log group, JSON logs, tracing, the env contract."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.bundling import function_code
from infra.config import ConfigError, SwarmConfig
from swarm.contract import FUNCTION_ENV, OPTIONAL_VARS, SWARM_FUNCTION, FunctionName

#: The newest Python runtime aws-cdk-lib 2.275.0 offers (cdk-nag's L1 rule checks it).
RUNTIME = lambda_.Runtime.PYTHON_3_14
#: Graviton: Lambda bills an Arm GB-second 20% below an x86 one, and a worker's invocation is
#: mostly a wait for the model (docs/explanation/scale.md); every dependency ships aarch64 wheels
ARCHITECTURE = lambda_.Architecture.ARM_64


def lambda_log_level(log_level: str) -> lambda_.ApplicationLogLevel:
    """The level Lambda filters a function's application logs at: never above INFO.

    Lambda's log-level filtering (JSON log format) gives a line without a ``level`` field the
    level INFO, and Powertools' metric lines (EMF, which every alarm reads) carry none: a
    WARN or ERROR filter would drop every metric. So Lambda filters at INFO (DEBUG when
    ``observability.log_level`` is DEBUG, so debug lines pass), and the configured level is
    applied by the handlers' Logger (``POWERTOOLS_LOG_LEVEL``, functions.service_logger), which
    drops INFO log lines at WARNING or ERROR without touching the metrics.
    """
    if log_level == "DEBUG":
        return lambda_.ApplicationLogLevel.DEBUG
    return lambda_.ApplicationLogLevel.INFO


_RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
    1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    2192: logs.RetentionDays.SIX_YEARS,
    2557: logs.RetentionDays.SEVEN_YEARS,
    2922: logs.RetentionDays.EIGHT_YEARS,
    3288: logs.RetentionDays.NINE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}


def retention(config: SwarmConfig) -> logs.RetentionDays:
    """The configured retention (config.py already checked it is one CloudWatch accepts)."""
    return _RETENTION[config.observability.log_retention_days]


class ContractError(RuntimeError):
    """The stack cannot give a function a variable its contract (swarm/settings.py) lists."""


#: Lambda's limit on a function's environment: every variable's name and value, 4 KB in all
#: (CloudFormation's update fails past it, after the stack's other resources changed)
MAX_ENVIRONMENT_BYTES = 4096
#: what a variable the stack fills from a resource counts at synth, where it is a token: a
#: queue's URL, a table's or bucket's name, an ARN (the longest the stack's names reach, with
#: the stack's own name in them, is about 110; the infra tests check the synthesized sizes)
LONGEST_REFERENCE = 140
#: the cdk.json keys that fill each large variable: what to shrink when a function's
#: environment does not fit
_FILLED_BY = {
    "MODELS": "models.catalog",
    "TOOL_REGISTRY": "tools",
    "TOOL_GRANTS": "tools and tenants.*.tools",
    "TENANT_LIMITS": "tenants.overrides",
    "APPROVAL_TOOL_DECIDERS": "tools.*.approval.deciders",
}


@dataclass
class Environment:
    """Values of the contract's variables, filled in as the stack creates the resources.
    ``worst``: the most a token-valued variable may take (its value built from resources at
    synth), by name; any other token counts :data:`LONGEST_REFERENCE`."""

    values: dict[str, str] = field(default_factory=dict)
    worst: dict[str, int] = field(default_factory=dict)

    def set(self, **values: str) -> None:
        self.values.update(values)

    def update(self, values: Mapping[str, str]) -> None:
        self.values.update(values)

    def for_function(self, name: FunctionName) -> dict[str, str]:
        """Exactly the variables ``FUNCTION_ENV[name]`` lists: no more (least knowledge)."""
        env: dict[str, str] = {SWARM_FUNCTION: name}
        for var in FUNCTION_ENV[name]:
            if var in env:
                continue
            if var in self.values:
                env[var] = self.values[var]
            elif var in OPTIONAL_VARS:
                env[var] = ""
            else:
                raise ContractError(f"the {name} function needs {var}, which is not built yet")
        self._fits(name, env)
        return env

    def _fits(self, function: str, env: Mapping[str, str]) -> None:
        """ConfigError unless ``env`` fits Lambda's 4 KB, its tokens at their longest: a deploy
        would fail there, after the stack's other resources had changed."""
        sizes = {
            var: self.worst.get(var, LONGEST_REFERENCE)
            if cdk.Token.is_unresolved(value)
            else len(value.encode())
            for var, value in env.items()
        }
        total = sum(len(var) + size for var, size in sizes.items())
        if total <= MAX_ENVIRONMENT_BYTES:
            return
        largest = sorted(
            ((size, var) for var, size in sizes.items() if var in _FILLED_BY), reverse=True
        )
        parts = ", ".join(f"{var} {size:,} bytes (from {_FILLED_BY[var]})" for size, var in largest)
        raise ConfigError(
            f"the {function} function's environment would take up to {total:,} bytes, more than "
            f"Lambda's {MAX_ENVIRONMENT_BYTES:,}: {parts}; register fewer models or tools, "
            "shorten the tools' descriptions and schemas, give fewer tenant overrides, or name "
            "fewer roles in the tools' approval.deciders"
        )


@dataclass(frozen=True)
class FunctionSpec:
    name: FunctionName
    description: str
    timeout: cdk.Duration
    memory_mb: int = 256
    reserved_concurrency: int | None = None


class SwarmFunction(Construct):
    """One handler module of ``functions/`` as a Lambda function with its own role and logs."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        spec: FunctionSpec,
        config: SwarmConfig,
        environment: Environment,
        code: lambda_.Code,
    ) -> None:
        super().__init__(scope, construct_id)
        removal = cdk.RemovalPolicy.RETAIN if config.production else cdk.RemovalPolicy.DESTROY
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"swarm {config.stage} {spec.name} function (least privilege)",
        )
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            retention=retention(config),
            removal_policy=removal,
        )
        self.function = lambda_.Function(
            self,
            "Function",
            description=spec.description,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            handler=f"functions.{spec.name}.handler",
            code=code,
            role=self.role,
            timeout=spec.timeout,
            memory_size=spec.memory_mb,
            reserved_concurrent_executions=spec.reserved_concurrency,
            environment=environment.for_function(spec.name),
            log_group=self.log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=lambda_log_level(config.observability.log_level),
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            tracing=lambda_.Tracing.ACTIVE,
        )
        # Logs only to its own group: no AWSLambdaBasicExecutionRole (logs:* on every group).
        self.log_group.grant_write(self.role)


#: Step Functions' longest state machine name.
STATE_MACHINE_NAME_MAX = 80


def fanout_state_machine_name(stack: cdk.Stack, qualifier: str = "") -> str:
    """The fan-out state machine's name, derived from the stack's (unique per account and
    region) and, for a control plane not built with the id ``Default``, its construct id (two in
    one stack stay apart): policies name its ARN without depending on the state machine itself,
    which depends on the functions it invokes (infra/fanout.py)."""
    name = f"{stack.stack_name}-{qualifier}-fanout" if qualifier else f"{stack.stack_name}-fanout"
    if cdk.Token.is_unresolved(name) or len(name) > STATE_MACHINE_NAME_MAX:
        raise ConfigError(
            f"the fan-out state machine's name {name!r} (<stack name>[-<construct id>]-fanout) "
            f"must be a known string of at most {STATE_MACHINE_NAME_MAX} characters: give the "
            "stack a shorter stack_name or the SwarmControlPlane a shorter id"
        )
    return name


def grant_task_response(role: iam.IRole, stack: cdk.Stack, state_machine_name: str) -> None:
    """``SendTaskSuccess`` on the fan-out state machine: a function whose write may close a run
    wakes the finalize loop waiting for that closure (swarm.adapters.closures)."""
    arn = stack.format_arn(
        service="states",
        resource="stateMachine",
        resource_name=state_machine_name,
        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
    )
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=["states:SendTaskSuccess"], resources=[arn])
    )


class FunctionFactory:
    """Builds the functions of one stack from one shared code asset."""

    def __init__(
        self,
        scope: Construct,
        config: SwarmConfig,
        environment: Environment,
        *,
        state_machine_name: str,
    ) -> None:
        self.scope = scope
        self.config = config
        self.environment = environment
        #: the fan-out state machine's name (fanout_state_machine_name), known before it exists
        self.state_machine_name = state_machine_name
        self.code = function_code(RUNTIME, ARCHITECTURE)

    def build(self, construct_id: str, spec: FunctionSpec) -> SwarmFunction:
        return SwarmFunction(
            self.scope,
            construct_id,
            spec=spec,
            config=self.config,
            environment=self.environment,
            code=self.code,
        )
