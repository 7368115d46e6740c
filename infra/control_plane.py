"""The control plane as one construct: :class:`SwarmControlPlane` builds every capability (lanes,
tables, storage, drain switch, workers, fan-out, API, observability), wired through the env
contract, into whatever stack it is placed in (``infra.stack.SwarmStack`` is one such stack; a
user's own CDK app is another: examples/existing_app)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_ssm as ssm
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.api import FrontDoor
from infra.checkov import acknowledge_checks
from infra.config import SwarmConfig, check_config
from infra.drain import DrainControl
from infra.fanout import FanOutMachine
from infra.functions import Environment, FunctionFactory, fanout_state_machine_name
from infra.nag import acknowledge_findings
from infra.observability import Observability
from infra.queues import LaneQueues
from infra.storage import BatchStorage
from infra.tables import Tables
from infra.tools import ToolFunctions
from infra.workers import DLQ_TIMEOUT, Workers
from swarm import contract as env
from swarm.core.records import LANES, Lane

#: The construct id that adds nothing to its resources' logical ids (CDK drops a path component
#: named ``Default`` from them): SwarmStack builds its control plane with it, so its resources
#: keep the logical ids they had when they were the stack's own children.
TRANSPARENT_ID = "Default"


class SwarmControlPlane(Construct):
    """The whole control plane, in any stack: ``SwarmControlPlane(stack, "Swarm", config=...)``.

    ``config`` is a validated :class:`~infra.config.SwarmConfig` (``SwarmConfig.from_context``
    reads it from the CDK context as cdk.json gives it; ``SwarmConfig.from_mapping`` from a
    dict). Its resources are exposed as typed attributes for the app's own grants and alarms:
    :attr:`api`, :attr:`governor_table`, :attr:`ledger_table`, :attr:`lane_queues`,
    :attr:`dead_letter_queue`, :attr:`state_machine`, :attr:`bucket`, :attr:`event_bus`,
    :attr:`drain_parameter`, :attr:`alarm_topic`, :attr:`dashboard`, :attr:`lambda_functions`.

    Physical names that must be known before deploy are derived from the stack and the stage: the
    fan-out state machine is ``<stack name>-fanout`` (``<stack name>-<id>-fanout`` for an id
    other than ``Default``), the drain switch the SSM parameter ``/swarm/<stage>/drain``: one
    control plane per stage in an account and region. cdk-nag and checkov acknowledgments are
    applied to the control plane's own resources only (infra/nag.py, infra/checkov.py).
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: SwarmConfig) -> None:
        if not isinstance(config, SwarmConfig):
            raise TypeError(
                f"SwarmControlPlane: config must be an infra.config.SwarmConfig, got "
                f"{type(config).__name__} (build one with SwarmConfig.from_context(app) or "
                "SwarmConfig.from_mapping({...}))"
            )
        check_config(config)
        super().__init__(scope, construct_id)
        self.config = config
        service = f"{env.SERVICE}-{config.stage}"
        environment = Environment()
        environment.update(_static_environment(config, service))

        self.lanes = LaneQueues(self, "Lanes", config=config, dlq_timeout=DLQ_TIMEOUT)
        self.tables = Tables(self, "Tables", config=config)
        self.storage = BatchStorage(self, "Storage", config=config)
        self.bus = events.EventBus(self, "Events", description=f"swarm {config.stage} run events")
        self.drain = DrainControl(self, "Drain", config=config)
        environment.set(
            **{
                env.GOVERNOR_TABLE_NAME: self.tables.governor.table_name,
                env.LEDGER_TABLE_NAME: self.tables.ledger.table_name,
                env.BUCKET_NAME: self.storage.bucket.bucket_name,
                env.EVENT_BUS_NAME: self.bus.event_bus_name,
                env.DRAIN_PARAMETER_NAME: self.drain.parameter.parameter_name,
            },
            **{env.queue_url_var(lane): self.lanes.queues[lane].queue_url for lane in LANES},
        )
        state_machine_name = fanout_state_machine_name(
            cdk.Stack.of(self), "" if construct_id == TRANSPARENT_ID else construct_id
        )
        factory = FunctionFactory(self, config, environment, state_machine_name=state_machine_name)
        # the tool registry's functions (one per source, a role each) before the worker, whose
        # environment holds their ARNs (TOOL_REGISTRY) and whose role may invoke exactly them
        self.tools = ToolFunctions(
            self,
            "Tools",
            config=config,
            factory=factory,
            storage=self.storage,
            common={
                var: environment.values[var]
                for var in (
                    env.STAGE,
                    env.POWERTOOLS_SERVICE_NAME,
                    env.POWERTOOLS_METRICS_NAMESPACE,
                    env.POWERTOOLS_LOG_LEVEL,
                )
            },
        )
        if config.tools:
            environment.set(**{env.TOOL_REGISTRY: self.tools.registry_value()})
            environment.worst[env.TOOL_REGISTRY] = config.tool_registry_bytes()

        self.workers = Workers(
            self,
            "Workers",
            config=config,
            factory=factory,
            lanes=self.lanes,
            governor=self.tables.governor,
            ledger=self.tables.ledger,
            drain_parameter=self.drain.parameter,
            storage=self.storage,
        )
        environment.update(self.workers.mapping_ids())
        self.tools.grant_invoke(self.workers.worker.role)
        self.tools.grant_read_secrets(self.workers.worker.role)
        # a parked agent unit announces unit.awaiting_approval (docs/agents.md, "Human gates")
        self.bus.grant_put_events_to(self.workers.worker.role)
        self.drain_controller = self.drain.add_controller(
            factory=factory,
            mappings=list(self.workers.mappings.values()),
            lanes=self.lanes,
            ledger=self.tables.ledger,
        )
        self.fanout = FanOutMachine(
            self,
            "FanOut",
            config=config,
            factory=factory,
            lanes=self.lanes,
            governor=self.tables.governor,
            ledger=self.tables.ledger,
            storage=self.storage,
            bus=self.bus,
        )
        environment.set(**{env.STATE_MACHINE_ARN: self.fanout.state_machine.state_machine_arn})
        self.sweeper = self.fanout.add_sweeper(factory=factory, environment=environment)
        self.front_door = FrontDoor(
            self,
            "FrontDoor",
            config=config,
            factory=factory,
            lanes=self.lanes,
            governor=self.tables.governor,
            ledger=self.tables.ledger,
            storage=self.storage,
            state_machine=self.fanout.state_machine,
            drain_parameter=self.drain.parameter,
        )
        self.functions = {
            env.API: self.front_door.handler,
            env.FANOUT: self.fanout.admit,
            env.WORKER: self.workers.worker,
            env.DLQ: self.workers.dead_letters,
            env.FINALIZER: self.fanout.finalizer,
            env.DRAIN: self.drain_controller,
            env.SWEEPER: self.sweeper,
        }
        self.observability = Observability(
            self,
            "Observability",
            config=config,
            service=service,
            lanes=self.lanes,
            api=self.front_door.api,
            state_machine=self.fanout.state_machine,
            functions={name: f.function for name, f in self.functions.items()},
        )
        self._expose()
        acknowledge_findings(self)
        acknowledge_checks(self)

    def _expose(self) -> None:
        """The typed attributes a user's app grants and alarms on."""
        self.api: apigw.RestApi = self.front_door.api
        self.governor_table: dynamodb.Table = self.tables.governor
        self.ledger_table: dynamodb.Table = self.tables.ledger
        self.lane_queues: dict[Lane, sqs.Queue] = dict(self.lanes.queues)
        self.dead_letter_queue: sqs.Queue = self.lanes.dead_letters
        self.state_machine: sfn.StateMachine = self.fanout.state_machine
        self.bucket: s3.Bucket = self.storage.bucket
        self.access_logs_bucket: s3.Bucket = self.storage.access_logs
        self.event_bus: events.EventBus = self.bus
        self.drain_parameter: ssm.StringParameter = self.drain.parameter
        self.alarm_topic: sns.Topic = self.observability.topic
        self.dashboard: cloudwatch.Dashboard = self.observability.dashboard
        self.lambda_functions: dict[str, lambda_.Function] = {
            name: built.function for name, built in self.functions.items()
        }
        self.lambda_functions.update(
            {f"tool-{source}": tool.function for source, tool in self.tools.functions.items()}
        )

    def outputs(self) -> dict[str, str]:
        """What the CLI reads from a deployed stack (swarm.contract OUTPUT_*): output name ->
        value. SwarmStack emits them as its outputs; a user's stack may do the same."""
        outputs = {
            env.OUTPUT_API_URL: self.front_door.api.url,
            env.OUTPUT_STATE_MACHINE_ARN: self.fanout.state_machine.state_machine_arn,
            env.OUTPUT_BUCKET_NAME: self.storage.bucket.bucket_name,
            env.OUTPUT_DRAIN_PARAMETER: self.drain.parameter.parameter_name,
            env.OUTPUT_GOVERNOR_TABLE: self.tables.governor.table_name,
            env.OUTPUT_LEDGER_TABLE: self.tables.ledger.table_name,
            env.OUTPUT_EVENT_BUS: self.bus.event_bus_name,
            env.OUTPUT_DASHBOARD: self.observability.dashboard.dashboard_name,
        }
        if self.tools.journals_table is not None:
            outputs[env.OUTPUT_TOOL_JOURNALS_TABLE] = self.tools.journals_table.table_name
        outputs[env.OUTPUT_STAGE] = self.config.stage
        return outputs


def _static_environment(config: SwarmConfig, service: str) -> dict[str, str]:
    """Variables known from the configuration alone."""
    values = {
        env.STAGE: config.stage,
        env.POWERTOOLS_SERVICE_NAME: service,
        env.POWERTOOLS_METRICS_NAMESPACE: env.METRICS_NAMESPACE,
        env.POWERTOOLS_LOG_LEVEL: config.observability.log_level,
        env.MODELS: config.models_value(),
        env.GOVERNOR_MAX_WAIT_SECONDS: str(config.worker.governor_max_wait_seconds),
        env.MAX_ATTEMPTS: str(config.max_attempts),
        env.LEASE_SECONDS: str(config.visibility_timeout_seconds),
        env.BUNDLE_WINDOW_SECONDS: str(config.worker.bundle_window_seconds),
        env.BUNDLE_UNITS: str(config.worker.bundle_units),
        env.BUNDLE_STRETCH: str(config.worker.bundle_stretch),
        env.BUNDLE_MAX_WINDOW_SECONDS: str(config.worker.longest_bundle_window_seconds),
        env.DEFAULT_BUDGET_TOKENS: str(config.budget.default_tokens),
        env.MAX_BUDGET_TOKENS: str(config.budget.max_tokens),
        env.TENANT_PRINCIPAL_PREFIX: config.api.tenant_principal_prefix,
        env.TENANT_LIMITS: config.tenants.env_value(),
        env.OPERATOR_PRINCIPAL_PREFIX: config.api.operator_principal_prefix,
        env.APPROVAL_TIMEOUT_SECONDS: str(config.approvals.timeout_hours * 3600),
        env.APPROVAL_DECIDERS: ",".join(config.approvals.decider_names()),
        env.APPROVAL_TOOL_DECIDERS: config.tool_deciders_value(),
        env.RESULTS_URL_SECONDS: str(config.results.download_url_seconds),
        env.UPLOAD_URL_SECONDS: str(config.uploads.url_seconds),
        env.UNITS_PER_CHILD: str(config.fanout.units_per_child),
        env.MODEL_ADAPTER: config.model.adapter,
        env.MODEL_PRICES: config.prices_env(),
        env.BEDROCK_READ_TIMEOUT_SECONDS: str(config.model.bedrock.read_timeout_seconds),
        env.SIM_MODEL_QUOTA_TPM: str(config.model.simulated.quota_tpm),
        env.SIM_MODEL_FAILURE_RATE: str(config.model.simulated.failure_rate),
        env.SIM_MODEL_SEED: str(config.model.simulated.seed),
    }
    if config.tools:
        values[env.TOOL_GRANTS] = config.tool_grants_value()
    if config.governor_capacity_tokens is not None:
        values[env.GOVERNOR_CAPACITY] = str(config.governor_capacity_tokens)
    for lane in LANES:
        values[env.lane_reserve_var(lane)] = str(config.lane_reserves.of(lane))
        values[env.shed_depth_var(lane)] = str(config.lanes.of(lane).shed_depth)
    return values
