"""The control plane stack: one construct per capability, wired through the env contract."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_events as events
from constructs import Construct

from infra.api import FrontDoor
from infra.config import SwarmConfig
from infra.drain import DrainControl
from infra.fanout import FanOutMachine
from infra.functions import Environment, FunctionFactory
from infra.observability import Observability
from infra.queues import LaneQueues
from infra.storage import BatchStorage
from infra.tables import Tables
from infra.tools import ToolFunctions
from infra.workers import DLQ_TIMEOUT, Workers
from swarm import contract as env
from swarm.core.records import LANES


class SwarmStack(cdk.Stack):
    def __init__(
        self, scope: Construct, construct_id: str, *, config: SwarmConfig, **kwargs: Any
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
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
        factory = FunctionFactory(self, config, environment)
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
        self._outputs()

    def _outputs(self) -> None:
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
        for name, value in outputs.items():
            cdk.CfnOutput(self, name, value=value)
        cdk.CfnOutput(self, env.OUTPUT_STAGE, value=self.config.stage)


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
