"""Wiring for the Lambda functions: services built from a function's validated settings
(:mod:`swarm.settings`). Each service is built from the settings mixin it needs; asking for one
the function was not configured for raises :class:`SettingsError` naming the variables it lacks.

Built once per cold start (the handlers cache them at module level on first use, never at import
time); boto3 clients are created lazily through one factory, so tests and the local runtime can
pass moto-backed clients instead.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from pydantic import BaseModel

from swarm.adapters.aws import (
    EventBridgeEvents,
    LambdaMappings,
    S3Blobs,
    SqsLanes,
    SsmDrainSwitch,
    StepFunctionsExecutions,
)
from swarm.adapters.routed_model import RoutedModelPlane
from swarm.adapters.s3_results import S3Results
from swarm.adapters.simulated_model import SimulatedModelPlane
from swarm.contract import BEDROCK_DEFAULT_READ_TIMEOUT_S, bedrock_call_bound_s
from swarm.core import codec
from swarm.core.backpressure import ShedPolicy
from swarm.core.governor import GovernorConfig
from swarm.core.lanes import Bundling
from swarm.core.ports import (
    MAX_SQS_DELAY_S,
    SQS_BATCH_BYTES,
    SQS_BATCH_MESSAGES,
    Closures,
    Governor,
    LaneQueue,
    Ledger,
    ModelPlane,
    RunWatch,
    TenantBindings,
    TicketBooker,
)
from swarm.core.pricing import Prices
from swarm.core.records import LANES
from swarm.core.routes import ModelRoute, ModelRoutes
from swarm.service.approvals import Gates
from swarm.service.batches import Batches, BatchesConfig
from swarm.service.drain import DrainController
from swarm.service.fanout import FanOut
from swarm.service.finalizer import Finalizer
from swarm.service.opener import Opener
from swarm.service.results import Results
from swarm.service.sweeper import SweepConfig, Sweeper
from swarm.service.uploads import Uploads
from swarm.service.worker import Worker, WorkerTimings
from swarm.settings import (
    ApiSettings,
    BucketSettings,
    BundleSettings,
    DrainSettings,
    DrainSwitchSettings,
    EventSettings,
    FanoutSettings,
    GovernorSettings,
    LeaseSettings,
    LedgerSettings,
    ModelsDoc,
    ModelSettings,
    PricesSettings,
    QueueSettings,
    Settings,
    SettingsError,
    SweeperSettings,
    ToolGrantsSettings,
    ToolRegistrySettings,
    WorkerSettings,
    variables,
)

if TYPE_CHECKING:
    from swarm.adapters.dynamodb_governor import DynamoDBGovernor
    from swarm.adapters.dynamodb_running import DynamoDBRunning
    from swarm.adapters.tool_journals import DynamoDBJournals
    from swarm.adapters.tool_notes import DynamoDBNotes
    from swarm.adapters.tool_objects import TenantObjects
    from swarm.adapters.tools import LambdaToolExecutor, RegistryTools, ToolGrants, ToolRegistry

#: an unclaimed reservation (admitted at fan-out, waiting in its lane) expires after SQS's
#: longest retention: a message cannot wait longer than that
QUEUE_LEASE_S = 14 * 86_400

ClientFactory = Callable[[str], Any]
M = TypeVar("M", bound=BaseModel)


class Host(Protocol):
    """Somewhere other than AWS Lambda that runs the handlers: the local stack's function host
    (:class:`swarm.local.functions.FunctionHost`). Installed with :func:`run_on`."""

    #: every timer of the handlers runs this many times faster
    time_scale: float

    def invocation(self) -> tuple[Mapping[str, str], ClientFactory] | None:
        """The running invocation's environment and clients (signed with its function's role),
        or None outside an invocation."""
        ...

    def model_plane(self) -> ModelPlane | None:
        """The shared simulated model plane the workers call, or None for their own."""
        ...


_HOST: list[Host] = []


def run_on(host: Host | None) -> None:
    """Make every :meth:`Wiring.from_env` consult ``host`` (None: AWS Lambda's process env)."""
    _HOST[:] = [] if host is None else [host]


def boto3_clients(configs: Mapping[str, Any] | None = None) -> ClientFactory:
    """One client per service, made on first use; ``configs``: a botocore ``Config`` for the
    services that need their own timeouts or retries (see :func:`client_configs`)."""
    import boto3

    cache: dict[str, Any] = {}

    def client(service: str) -> Any:
        if service not in cache:
            config = (configs or {}).get(service)
            cache[service] = boto3.client(service, config=config)
        return cache[service]

    return client


def client_configs(settings: Settings) -> dict[str, Any]:
    """Per-service client configuration. S3: Signature Version 4, which presigned URLs (results
    downloads, manifest uploads) must use (boto3 may still sign them with version 2, which S3
    no longer accepts in newer regions). Bedrock: the configured read timeout (boto3's 60 s is
    short for a long answer) and no SDK retries (swarm/adapters/bedrock.py says why)."""
    from botocore.config import Config

    from swarm.adapters.s3_results import S3_SIGV4

    configs: dict[str, Any] = {"s3": S3_SIGV4}
    if isinstance(settings, ModelSettings) and settings.model_adapter == "bedrock":
        from swarm.adapters.bedrock import DEFAULT_READ_TIMEOUT_S, client_config

        read_timeout = settings.bedrock_read_timeout_seconds or DEFAULT_READ_TIMEOUT_S
        configs["bedrock-runtime"] = client_config(read_timeout)
    if isinstance(settings, WorkerSettings):
        # a worker runs every unit of its batch at once, one thread each (functions/worker.py:
        # up to 10 messages of bundle_units units): a connection each, not botocore's 10 shared
        pool = Config(max_pool_connections=SQS_BATCH_MESSAGES * settings.bundle_units)
        for service in ("dynamodb", "s3", "sqs", "bedrock-runtime"):
            configs[service] = configs[service].merge(pool) if service in configs else pool
    return configs


def governor_name(config: GovernorConfig, model: str) -> str:
    """Model ``model``'s bucket; a changed quota, share or capacity starts a fresh bucket
    instead of fighting the old one (a request bucket's rpm included)."""
    name = f"{model}-q{config.quota_tpm}-s{config.share:g}-c{config.bucket_capacity:g}"
    return name if config.rpm is None else f"{name}-r{config.rpm}"


def simulated_quotas(models: ModelsDoc) -> dict[str, int]:
    """The simulated plane's quota of each model id but the default's (whose quota is
    ``SIM_MODEL_QUOTA_TPM``): the quota the registry gives it, as Bedrock would enforce it."""
    default = models.catalog[models.default].model_id
    return {e.model_id: e.tpm for e in models.catalog.values() if e.model_id != default}


#: the simulated model plane's longest turn (its latency is a fraction of this), deployed seconds
SIMULATED_TURN_S = 10.0
#: a turn's writes (its settlement, its answer, the governor's true-up), deployed seconds
TURN_MARGIN_S = 5.0


@dataclass
class Wiring:
    #: the function's own model (:class:`~swarm.settings.WorkerSettings`...)
    settings: Settings
    clients: ClientFactory
    #: every timer runs this many times faster: 1 on AWS; the local emulator's ``--time-scale``,
    #: which also multiplies the quota, so a local run is the deployed one on a faster clock
    time_scale: float = 1.0
    #: a model plane shared by every worker of the process (the local stack's simulated one,
    #: which stands for a real endpoint's quota); used instead of a simulated adapter
    shared_model: ModelPlane | None = None

    def seconds(self, value: float) -> float:
        """A duration of the deployed system on this runtime's clock."""
        return value / self.time_scale

    def settings_as(self, kind: type[M]) -> M:
        """This function's settings as ``kind`` (a function's model or a concern's mixin), or
        :class:`SettingsError` naming the variables this function was not given."""
        if isinstance(self.settings, kind):
            return self.settings
        function = self.settings.function
        missing = sorted(variables(kind) - variables(type(self.settings)))
        if not missing:  # e.g. the sweeper's settings asked for as the finalizer's
            raise SettingsError(f"the {function} function's settings are not {kind.__name__}")
        names = ", ".join(missing)
        raise SettingsError(f"the {function} function has no {names} in its environment")

    def governor_config(self, model: str | None = None) -> GovernorConfig:
        """Model ``model``'s governor (the default model's when None) on this runtime's clock."""
        config = self.settings_as(GovernorSettings).governor_config(model)
        return replace(
            config,
            throttle_cooldown_s=self.seconds(config.throttle_cooldown_s),
            recovery_per_s=config.recovery_per_s * self.time_scale,
        )

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, clients: ClientFactory | None = None
    ) -> Wiring:
        """The wiring of the function this process runs: every handler calls it on its cold
        start, with no arguments. Under a :class:`Host` the environment and clients are the
        running invocation's."""
        host = _HOST[0] if _HOST else None
        invocation = host.invocation() if host is not None and environ is None else None
        if invocation is not None:
            environ, clients = invocation[0], clients or invocation[1]
        settings = Settings.from_env(os.environ if environ is None else environ)
        wiring = cls(settings, clients or boto3_clients(client_configs(settings)))
        if host is not None:
            wiring.time_scale = host.time_scale
            wiring.shared_model = host.model_plane()
        return wiring

    def prices(self) -> dict[str, Prices]:
        """Each model's prices by its registry name: the ONE place they are read
        (MODEL_PRICES, from cdk.json models.catalog.<name>.prices). A model without any is
        not in it (its spend in tokens only)."""
        return self.settings_as(PricesSettings).prices_table()

    # -- ports
    def ledger(self) -> Ledger:
        from swarm.adapters.dynamodb_ledger import DynamoDBLedger
        from swarm.adapters.dynamodb_watch import DEFAULT_WATCH_GRACE_S

        table = self.settings_as(LedgerSettings).ledger_table
        return DynamoDBLedger(
            table,
            client=self.clients("dynamodb"),
            watch_grace_s=self.seconds(DEFAULT_WATCH_GRACE_S),
        )

    def run_watch(self) -> RunWatch:
        """The runs the sweeper watches: a sparse index on the ledger's books."""
        from swarm.adapters.dynamodb_watch import DynamoDBRunWatch

        table = self.settings_as(LedgerSettings).ledger_table
        return DynamoDBRunWatch(table, client=self.clients("dynamodb"))

    def running_work(self) -> DynamoDBRunning:
        """The register of running work: a few shard items on the ledger table (the workers
        write their entries; the drain view and the batch status read them)."""
        from swarm.adapters.dynamodb_running import DynamoDBRunning

        table = self.settings_as(LedgerSettings).ledger_table
        return DynamoDBRunning(table, self.clients("dynamodb"))

    def bindings(self) -> TenantBindings:
        """Each tenant's role, bound at first use (the API)."""
        from swarm.adapters.dynamodb_bindings import DynamoDBBindings

        table = self.settings_as(LedgerSettings).ledger_table
        return DynamoDBBindings(table, self.clients("dynamodb"))

    def governor(self, *, read_only: bool = False) -> Governor:
        """The default model's bucket."""
        return self.dynamodb_governor(read_only=read_only)

    def model_routes(self, *, read_only: bool = False) -> ModelRoutes:
        """Every model of the registry with its Bedrock id, its own bucket and its prices."""
        models = self.settings_as(GovernorSettings).models
        # the API and the workers price units; the fan-out books places only
        prices = self.prices() if isinstance(self.settings, PricesSettings) else {}
        return ModelRoutes(
            models.default,
            {
                name: ModelRoute(
                    name,
                    entry.model_id,
                    self.dynamodb_governor(name, read_only=read_only),
                    prices.get(name),
                )
                for name, entry in models.catalog.items()
            },
        )

    def dynamodb_governor(
        self, model: str | None = None, *, read_only: bool = False
    ) -> DynamoDBGovernor:
        """Model ``model``'s bucket (the default model's when None). ``read_only``: the API's
        view, which never writes the table (its role may only Query it): a bucket the workers
        have not created yet reads as its configured initial state instead of being created by
        the front door."""
        from swarm.adapters.dynamodb_governor import FULL_GRID_S, WRITE_MARGIN_S, DynamoDBGovernor

        name = model or self.settings_as(GovernorSettings).models.default
        config = self.governor_config(name)
        table = self.settings_as(GovernorSettings).governor_table
        # Workers book their tokens ahead (tickets), and the fan-out its units' places, as far
        # as one message's delay reaches: a unit comes to its lane with its ticket and is
        # granted, without a request, when it comes (docs/explanation/governor.md)
        books = isinstance(self.settings, WorkerSettings | FanoutSettings)
        horizon = self.seconds(MAX_SQS_DELAY_S if books else 0)
        # a place is an estimate, and a unit whose place is further than SQS delays a message
        # waits with its message hidden (up to SQS's 12 hours): places reach that far, so a
        # unit deep in its tenant's queue comes to its lane a few times, not every 15 minutes
        places = self.seconds(WorkerTimings.longest_hide_s if books else 0)
        return DynamoDBGovernor(
            config,
            table,
            client=self.clients("dynamodb"),
            name=governor_name(config, name),
            horizon_s=horizon,
            place_horizon_s=places,
            read_only=read_only,
            margin_s=self.seconds(WRITE_MARGIN_S),
            full_grid_s=self.seconds(FULL_GRID_S),
        )

    def lanes(self) -> LaneQueue:
        s = self.settings_as(QueueSettings)
        return SqsLanes(
            self.clients("sqs"),
            {lane: s.queue_url(lane) for lane in LANES},
            time_scale=self.time_scale,
        )

    def blobs(self) -> S3Blobs:
        bucket = self.settings_as(BucketSettings).bucket_name
        return S3Blobs(self.clients("s3"), bucket)

    def result_store(self) -> S3Results:
        bucket = self.settings_as(BucketSettings).bucket_name
        return S3Results(self.clients("s3"), bucket)

    def results(self) -> Results:
        """The results reader of the API (a page of outcomes, the download URL)."""
        s = self.settings_as(ApiSettings)
        return Results(self.ledger(), self.result_store(), s.results_url_seconds)

    def uploads(self) -> Uploads:
        """The API's manifest upload URLs (presigned with its own role)."""
        return Uploads(self.blobs(), self.settings_as(ApiSettings).upload_url_seconds)

    def drain_switch(self) -> SsmDrainSwitch:
        name = self.settings_as(DrainSwitchSettings).drain_parameter
        return SsmDrainSwitch(self.clients("ssm"), name, ttl_s=self.seconds(SsmDrainSwitch.ttl_s))

    def events(self) -> EventBridgeEvents:
        bus = self.settings_as(EventSettings).event_bus_name
        return EventBridgeEvents(self.clients("events"), bus)

    def model(self) -> ModelPlane:
        """The model plane of every registered model: a request names its model's id."""
        s = self.settings_as(ModelSettings)
        models = self.settings_as(GovernorSettings).models
        if s.model_adapter == "simulated" and self.shared_model is not None:
            return self.shared_model
        if s.model_adapter == "bedrock":
            from swarm.adapters.bedrock import BedrockModelPlane, count_client_config

            # CountTokens on a client of its own: its short timeouts, not Converse's long read
            counter = boto3_clients({"bedrock-runtime": count_client_config()})("bedrock-runtime")
            client = self.clients("bedrock-runtime")
            planes = {
                entry.model_id: BedrockModelPlane(client, entry.model_id, counter=counter)
                for entry in models.catalog.values()
            }
            return RoutedModelPlane(planes, planes[models.catalog[models.default].model_id])
        return SimulatedModelPlane(
            quota_tpm=s.sim_model_quota_tpm,
            failure_rate=s.sim_model_failure_rate,
            seed=s.sim_model_seed,
            quotas=simulated_quotas(models),
        )

    # -- services
    def batches(self) -> Batches:
        s = self.settings_as(ApiSettings)
        grants = self.tool_grants()
        policy = ShedPolicy(
            {lane: s.shed_depth(lane) for lane in LANES},
            throttle_window_s=self.seconds(ShedPolicy.throttle_window_s),
        )
        return Batches(
            self.ledger(),
            self.governor(read_only=True),  # shedding and the fleet view only read it
            self.lanes(),
            self.blobs(),
            StepFunctionsExecutions(self.clients("stepfunctions"), s.state_machine_arn),
            self.drain_switch(),
            BatchesConfig(
                policy,
                max_budget=s.max_budget_tokens,
                default_budget=s.default_budget_tokens,
                default_attempts=s.max_attempts,
                tenants=s.tenant_policy(),
                units_per_child=s.units_per_child,
                units_per_message=s.bundle_units,
                # the API's environment has the tools' names and grants, not their specs
                # (Lambda's 4 KB): a unit's first-turn check counts its request without them
                tools=grants.registry_view(),
                allowed_tools=grants.allowed,
            ),
            models=self.model_routes(read_only=True),
            running=self.running_work(),
        )

    def bundling(self) -> Bundling:
        """How the fan-out and the workers bundle units into lane messages (a message within
        SQS's size limit)."""
        s = self.settings_as(BundleSettings)
        return Bundling(
            self.seconds(s.bundle_window_seconds),
            s.bundle_units,
            max_bytes=SQS_BATCH_BYTES,
            size=codec.bundle_size,
            stretch=s.bundle_stretch,
            max_window_s=self.seconds(s.bundle_max_window_seconds),
        )

    def fanout(self) -> FanOut:
        return FanOut(
            self.ledger(),
            self.lanes(),
            queue_lease_s=self.seconds(QUEUE_LEASE_S),
            places=self.dynamodb_governor(),  # it books places: PlaceBooker
            output_burndown=self.governor_config().output_burndown,  # places in quota tokens
            models=self.model_routes(),  # a unit's place in its model's bucket
            hold_s=self.seconds(WorkerTimings.max_hold_s),
            bundling=self.bundling(),
        )

    def worker(self) -> Worker:
        s = self.settings_as(WorkerSettings)
        config = WorkerTimings(
            lease_s=self.seconds(s.lease_seconds),
            max_wait_s=self.seconds(s.governor_max_wait_seconds),
            retry_backoff_s=self.seconds(WorkerTimings.retry_backoff_s),
            requeue_delay_s=self.seconds(WorkerTimings.requeue_delay_s),
            max_hold_s=self.seconds(WorkerTimings.max_hold_s),
            longest_delay_s=self.seconds(MAX_SQS_DELAY_S),
            longest_hide_s=self.seconds(WorkerTimings.longest_hide_s),
            turn_s=self.seconds(self.turn_seconds()),
            approval_timeout_s=self.seconds(s.approval_timeout_seconds),
        )
        models = self.model_routes()
        governor = models.routes[models.default].governor
        return Worker(
            self.ledger(),
            governor,
            self.model(),
            self.result_store(),
            self.drain_switch(),
            config,
            time.time,
            time.sleep,
            closures=self.closures(),
            tickets=cast(TicketBooker, governor),  # it books a batch's tokens together
            running=self.running_work(),
            models=models,  # each unit draws from its model's bucket and calls its model
            tools=self.tool_runner(),
            # the local stack's fault injection (its shared model plane), never on AWS
            kill=getattr(self.shared_model, "kill", None),
            events=self.events(),  # a parked unit announces unit.awaiting_approval
        )

    def turn_seconds(self) -> float:
        """The longest an agent unit's model turn may take, deployed seconds: the model call's
        bound (Bedrock's timeouts; the simulated plane's ``SIMULATED_TURN_S``) and a margin for
        the turn's writes. A turn's tools run after it, each within its own timeout."""
        s = self.settings_as(ModelSettings)
        if s.model_adapter == "bedrock":
            read = s.bedrock_read_timeout_seconds or BEDROCK_DEFAULT_READ_TIMEOUT_S
            return bedrock_call_bound_s(read) + TURN_MARGIN_S
        return SIMULATED_TURN_S + TURN_MARGIN_S

    def finalizer(self) -> Finalizer:
        return Finalizer(
            self.ledger(),
            self.lanes(),
            self.blobs(),
            self.events(),
            Results(self.ledger(), self.result_store()),
            watch=self.run_watch(),
            closures=self.closures(),
            approvals=self.approvals(),  # undecided calls timed out, decided units resent
        )

    def approvals(self) -> Gates:
        """Human gates: the waiting calls and their decisions (the API's and the finalizer's)."""
        lease_s = self.settings_as(LeaseSettings).lease_seconds
        return Gates(self.ledger(), self.lanes(), self.blobs(), self.seconds(lease_s))

    def closures(self) -> Closures:
        """Where the finalize loop keeps its task token, and how a run's closer wakes it."""
        from swarm.adapters.closures import StepFunctionsClosures

        table = self.settings_as(LedgerSettings).ledger_table
        return StepFunctionsClosures(table, self.clients("dynamodb"), self.clients("stepfunctions"))

    def opener(self) -> Opener:
        """The open step's (an action of the finalizer function: statemachines/fanout.asl.json
        ``OpenUnits``)."""
        return Opener(self.ledger(), self.blobs())

    def sweeper(self) -> Sweeper:
        s = self.settings_as(SweeperSettings)
        return Sweeper(
            self.ledger(),
            self.run_watch(),
            StepFunctionsExecutions(self.clients("stepfunctions"), s.state_machine_arn),
            self.finalizer(),
            SweepConfig(
                interval_s=self.seconds(s.sweep_interval_seconds),
                max_backoff_s=self.seconds(SweepConfig.max_backoff_s),
            ),
        )

    def tool_registry(self) -> ToolRegistry:
        """The deployment's tools (cdk.json ``tools``, resolved at synth): the worker's."""
        from swarm.adapters.tools import ToolRegistry

        return ToolRegistry.from_json(self.settings_as(ToolRegistrySettings).tool_registry)

    def tool_runner(self) -> RegistryTools | None:
        """The worker's tools (None: the registry is empty)."""
        from swarm.adapters.mcp_tools import McpServers
        from swarm.adapters.tools import RegistryTools

        executor = self.tool_executor()
        registry = executor.registry
        if not registry.tools and not registry.mcp:
            return None
        mcp = None
        if registry.mcp:
            clients = self.clients

            def read(secret: str) -> str:
                answer = clients("secretsmanager").get_secret_value(SecretId=secret)
                return str(answer["SecretString"])

            # the worker's role reads exactly the configured secrets (infra/workers.py)
            mcp = McpServers(registry.mcp, read_secret=read)
        return RegistryTools(registry, executor, mcp)

    def tool_grants(self) -> ToolGrants:
        """The tools' names and which tenant may use which: the API's view."""
        from swarm.adapters.tools import grants_from_json

        return grants_from_json(self.settings_as(ToolGrantsSettings).tool_grants)

    def tool_executor(self) -> LambdaToolExecutor:
        """Runs a unit's tool calls on the tools' functions (the worker's own role may invoke
        exactly those). On AWS each tool timeout gets a Lambda client with that read timeout
        and no SDK retries; under a local host the invocation's role-signed client serves all."""
        from swarm.adapters.tools import LambdaToolExecutor, lambda_client_for

        registry = self.tool_registry()
        if _HOST:
            clients = self.clients
            return LambdaToolExecutor(registry, lambda _timeout: clients("lambda"))
        return LambdaToolExecutor(registry, lambda_client_for)

    def drain_controller(self) -> DrainController:
        s = self.settings_as(DrainSettings)
        mappings = LambdaMappings(
            self.clients("lambda"), {lane: s.worker_mapping_id(lane) for lane in LANES}
        )
        return DrainController(self.drain_switch(), mappings, self.lanes(), self.running_work())


# -- the tool functions (functions/tools/): not one of the seven, so no Settings model; each reads
# the one or two variables its source needs (swarm.contract.TOOL_FUNCTION_ENV)
def tool_runtime() -> tuple[Mapping[str, str], ClientFactory]:
    """The running tool function's environment and clients: under a :class:`Host` the
    invocation's (signed with the tool's own role), on Lambda the process's."""
    host = _HOST[0] if _HOST else None
    invocation = host.invocation() if host is not None else None
    if invocation is not None:
        return invocation
    return os.environ, boto3_clients()


def _tool_variable(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "")
    if not value:
        raise SettingsError(f"missing environment variable {name} for this tool function")
    return value


def notes_store() -> DynamoDBNotes:
    """The notes tools' store (:class:`swarm.adapters.tool_notes.DynamoDBNotes`)."""
    from swarm.adapters.tool_notes import DynamoDBNotes
    from swarm.contract import NOTES_TABLE_NAME

    environ, clients = tool_runtime()
    return DynamoDBNotes(_tool_variable(environ, NOTES_TABLE_NAME), clients("dynamodb"))


def tool_source_declarations(source: str) -> Mapping[str, Mapping[str, Any]]:
    """What a tool source declares, from the asset (swarm.adapters.tools.source_declarations)."""
    from swarm.adapters.tools import source_declarations

    return source_declarations(source)


def tool_journals() -> DynamoDBJournals:
    """The BFCL toolset's journals (:class:`swarm.adapters.tool_journals.DynamoDBJournals`)."""
    from swarm.adapters.tool_journals import DynamoDBJournals
    from swarm.contract import TOOL_JOURNALS_TABLE_NAME

    environ, clients = tool_runtime()
    return DynamoDBJournals(_tool_variable(environ, TOOL_JOURNALS_TABLE_NAME), clients("dynamodb"))


def tenant_objects() -> TenantObjects:
    """The object_read tool's reader (:class:`swarm.adapters.tool_objects.TenantObjects`)."""
    from swarm.adapters.tool_objects import TenantObjects
    from swarm.contract import BUCKET_NAME

    environ, clients = tool_runtime()
    return TenantObjects(clients("s3"), _tool_variable(environ, BUCKET_NAME))
