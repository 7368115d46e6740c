"""Each function's validated configuration: one model per function, each with exactly the
variables :data:`swarm.contract.FUNCTION_ENV` lists for it (required unless in
:data:`~swarm.contract.OPTIONAL_VARS`), so a function's settings cannot lack what it needs.

The models are composed of small mixins, one per concern (:class:`LedgerSettings`,
:class:`GovernorSettings`, :class:`QueueSettings`...); :class:`swarm.wiring.Wiring` asks for the
mixin each of its services needs. :meth:`Settings.from_env` checks the environment once, at cold
start, and returns the model of the function ``SWARM_FUNCTION`` names: a missing or malformed
variable fails the cold start with an error naming the variable, never a ``KeyError`` deep inside
a request.

No boto3 here: plain configuration, importable by the CLI and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, Json, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from swarm.contract import (
    APPROVAL_DECIDERS,
    APPROVAL_TIMEOUT_SECONDS,
    APPROVAL_TOOL_DECIDERS,
    BEDROCK_READ_TIMEOUT_SECONDS,
    BUCKET_NAME,
    BUNDLE_MAX_WINDOW_SECONDS,
    BUNDLE_STRETCH,
    BUNDLE_UNITS,
    BUNDLE_WINDOW_SECONDS,
    DEFAULT_BUDGET_TOKENS,
    DRAIN_PARAMETER_NAME,
    EVENT_BUS_NAME,
    FUNCTION_ENV,
    FUNCTIONS,
    GOVERNOR_CAPACITY,
    GOVERNOR_MAX_WAIT_SECONDS,
    GOVERNOR_TABLE_NAME,
    LANE_RESERVE_HIGH,
    LANE_RESERVE_LOW,
    LANE_RESERVE_NORMAL,
    LEASE_SECONDS,
    LEDGER_TABLE_NAME,
    MAX_ATTEMPTS,
    MAX_BUDGET_TOKENS,
    MAX_BUNDLE_UNITS,
    MAX_UNITS_PER_CHILD,
    MODEL_ADAPTER,
    MODEL_PRICES,
    MODELS,
    OPERATOR_PRINCIPAL_PREFIX,
    OPTIONAL_VARS,
    POWERTOOLS_LOG_LEVEL,
    POWERTOOLS_METRICS_NAMESPACE,
    POWERTOOLS_SERVICE_NAME,
    QUEUE_URL_HIGH,
    QUEUE_URL_LOW,
    QUEUE_URL_NORMAL,
    RESULTS_URL_SECONDS,
    SHED_DEPTH_HIGH,
    SHED_DEPTH_LOW,
    SHED_DEPTH_NORMAL,
    SIM_MODEL_FAILURE_RATE,
    SIM_MODEL_QUOTA_TPM,
    SIM_MODEL_SEED,
    STAGE,
    STATE_MACHINE_ARN,
    SWARM_FUNCTION,
    SWEEP_INTERVAL_SECONDS,
    TENANT_LIMITS,
    TENANT_PRINCIPAL_PREFIX,
    TOOL_GRANTS,
    TOOL_REGISTRY,
    UNITS_PER_CHILD,
    UPLOAD_URL_SECONDS,
    WORKER_MAPPING_ID_HIGH,
    WORKER_MAPPING_ID_LOW,
    WORKER_MAPPING_ID_NORMAL,
    FunctionName,
)
from swarm.core.errors import InvalidInput
from swarm.core.governor import GovernorConfig
from swarm.core.pricing import Prices, prices_table_from_env
from swarm.core.records import LANES, Lane
from swarm.core.tenancy import TenantLimits, TenantPolicy


class SettingsError(ValueError):
    """The environment does not satisfy the contract; the message names the variable."""


class _Model(BaseModel):
    """Every settings model: immutable, read by the variables' names, and nothing else."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=False)


# --- the concerns ---------------------------------------------------------------------------
class LedgerSettings(_Model):
    ledger_table: str = Field(alias=LEDGER_TABLE_NAME, min_length=3)


class CatalogModelDoc(BaseModel):
    """One model of :data:`~swarm.contract.MODELS` (resolved at synth from cdk.json ``models``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str = Field(min_length=1)
    tpm: int = Field(ge=1)
    rpm: int | None = Field(default=None, ge=1)
    share: float = Field(gt=0, le=1)
    burndown: float = Field(ge=1, allow_inf_nan=False)


class ModelsDoc(BaseModel):
    """:data:`~swarm.contract.MODELS`: the models units may name, and the one they default to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    default: str
    catalog: dict[str, CatalogModelDoc] = Field(min_length=1)

    @model_validator(mode="after")
    def _default_registered(self) -> Self:
        if self.default not in self.catalog:
            raise PydanticCustomError(
                "models_default", f"default {self.default!r} is not in the catalog"
            )
        return self


class GovernorSettings(_Model):
    """The fleet's token buckets, one per model: their table and the parameters both their
    writers (the workers, the fan-out) and their reader (the API) must agree on."""

    governor_table: str = Field(alias=GOVERNOR_TABLE_NAME, min_length=3)
    models: Json[ModelsDoc] = Field(alias=MODELS)
    governor_capacity: int | None = Field(default=None, alias=GOVERNOR_CAPACITY, ge=1)
    reserve_high: float = Field(alias=LANE_RESERVE_HIGH, ge=0, lt=1)
    reserve_normal: float = Field(alias=LANE_RESERVE_NORMAL, ge=0, lt=1)
    reserve_low: float = Field(alias=LANE_RESERVE_LOW, ge=0, lt=1)

    def governor_config(self, model: str | None = None) -> GovernorConfig:
        """Model ``model``'s governor (the default model's when None), as the core models it."""
        entry = self.models.catalog[model or self.models.default]
        reserves = {lane: float(getattr(self, f"reserve_{lane.value}")) for lane in LANES}
        capacity = None if self.governor_capacity is None else float(self.governor_capacity)
        return GovernorConfig(
            quota_tpm=entry.tpm,
            share=entry.share,
            capacity=capacity,
            reserves=reserves,
            output_burndown=entry.burndown,
            rpm=entry.rpm,
        )


class QueueSettings(_Model):
    queue_url_high: str = Field(alias=QUEUE_URL_HIGH)
    queue_url_normal: str = Field(alias=QUEUE_URL_NORMAL)
    queue_url_low: str = Field(alias=QUEUE_URL_LOW)

    def queue_url(self, lane: Lane) -> str:
        """The lane's work queue."""
        url: str = getattr(self, f"queue_url_{lane.value}")
        return url


class BucketSettings(_Model):
    bucket_name: str = Field(alias=BUCKET_NAME, min_length=3)


class StateMachineSettings(_Model):
    state_machine_arn: str = Field(alias=STATE_MACHINE_ARN, pattern=r"^arn:[a-z-]+:states:")


class EventSettings(_Model):
    event_bus_name: str = Field(alias=EVENT_BUS_NAME, min_length=1)


class DrainSwitchSettings(_Model):
    drain_parameter: str = Field(alias=DRAIN_PARAMETER_NAME, min_length=1)


class AttemptSettings(_Model):
    max_attempts: int = Field(alias=MAX_ATTEMPTS, ge=1, le=100)


class LeaseSettings(_Model):
    lease_seconds: int = Field(alias=LEASE_SECONDS, ge=1)


class BundleUnitsSettings(_Model):
    """The most units one lane message carries (swarm.core.lanes.bundle)."""

    bundle_units: int = Field(alias=BUNDLE_UNITS, ge=1, le=MAX_BUNDLE_UNITS)


class BundleSettings(BundleUnitsSettings):
    """How the lanes' messages carry units: those due within the window, at most bundle_units;
    the window of a bundle due later is stretched, up to its most."""

    bundle_window_seconds: float = Field(alias=BUNDLE_WINDOW_SECONDS, ge=0)
    bundle_stretch: float = Field(alias=BUNDLE_STRETCH, ge=0, le=1)
    bundle_max_window_seconds: float = Field(alias=BUNDLE_MAX_WINDOW_SECONDS, ge=0)

    @model_validator(mode="after")
    def _longest_window(self) -> Self:
        if self.bundle_max_window_seconds < self.bundle_window_seconds:
            raise PydanticCustomError(
                "bundle_window",
                f"{BUNDLE_MAX_WINDOW_SECONDS} ({self.bundle_max_window_seconds:g}) is below "
                f"{BUNDLE_WINDOW_SECONDS} ({self.bundle_window_seconds:g})",
            )
        return self


class ModelSettings(_Model):
    """The model plane the workers call: Bedrock, or the simulated one."""

    model_adapter: Literal["simulated", "bedrock"] = Field(alias=MODEL_ADAPTER)
    bedrock_read_timeout_seconds: float | None = Field(
        default=None, alias=BEDROCK_READ_TIMEOUT_SECONDS, gt=0, le=900
    )
    sim_model_quota_tpm: int = Field(alias=SIM_MODEL_QUOTA_TPM, ge=1)
    sim_model_failure_rate: float = Field(alias=SIM_MODEL_FAILURE_RATE, ge=0, le=1)
    sim_model_seed: int = Field(alias=SIM_MODEL_SEED)


class TenantLimitsDoc(BaseModel):
    """One tenant's limits as :data:`~swarm.contract.TENANT_LIMITS` carries them (resolved at
    synth from cdk.json ``tenants``: every key present)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lanes: tuple[Lane, ...] = Field(min_length=1)
    max_queued_units: int | None = Field(ge=1)
    guaranteed_units: int = Field(ge=0)
    max_budget_per_batch: int | None = Field(ge=1)
    #: the cap of a budget in dollars, in micro-dollars (absent: none of the tenant's own)
    max_budget_micro_per_batch: int | None = Field(default=None, ge=1)
    models: tuple[str, ...] | None = None  # absent: every model of the registry

    def limits(self) -> TenantLimits:
        return TenantLimits(
            lanes=frozenset(self.lanes),
            max_queued_units=self.max_queued_units,
            guaranteed_units=self.guaranteed_units,
            max_budget_per_batch=self.max_budget_per_batch,
            max_budget_micro_per_batch=self.max_budget_micro_per_batch,
            models=None if self.models is None else frozenset(self.models),
        )


class TenantsDoc(BaseModel):
    """:data:`~swarm.contract.TENANT_LIMITS`: the defaults and the tenants named apart."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    defaults: TenantLimitsDoc
    overrides: dict[str, TenantLimitsDoc] = Field(default_factory=dict)

    def policy(self) -> TenantPolicy:
        return TenantPolicy(
            self.defaults.limits(), {name: doc.limits() for name, doc in self.overrides.items()}
        )


# --- the functions --------------------------------------------------------------------------
class ToolRegistrySettings(_Model):
    """The deployment's tools, for the worker (swarm.adapters.tools.ToolRegistry parses it)."""

    tool_registry: str | None = Field(default=None, alias=TOOL_REGISTRY)


class ToolGrantsSettings(_Model):
    """The tools' names and grants, for the API (swarm.adapters.tools.grants_from_json)."""

    tool_grants: str | None = Field(default=None, alias=TOOL_GRANTS)


class PricesSettings(_Model):
    """The models' prices (cdk.json ``models.catalog.<name>.prices``, validated at synth): a
    model name to its prices, read by :meth:`prices_table` (swarm.wiring reads it in one
    place)."""

    model_prices: str | None = Field(default=None, alias=MODEL_PRICES)

    @model_validator(mode="after")
    def _prices_parse(self) -> Self:
        try:
            self.prices_table()
        except (ValueError, KeyError, TypeError, InvalidInput) as e:
            raise PydanticCustomError(
                "model_prices", f"{MODEL_PRICES} is not a price table: {e}"
            ) from None
        return self

    def prices_table(self) -> dict[str, Prices]:
        return prices_table_from_env(self.model_prices)


class Settings(_Model):
    """What every function receives; the base of the seven functions' models.

    Build one with :meth:`from_env`.
    """

    function: FunctionName = Field(alias=SWARM_FUNCTION)
    stage: str = Field(alias=STAGE, pattern=r"^[a-z][a-z0-9-]{0,15}$")
    service_name: str = Field(alias=POWERTOOLS_SERVICE_NAME, min_length=1)
    metrics_namespace: str = Field(alias=POWERTOOLS_METRICS_NAMESPACE, min_length=1)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(alias=POWERTOOLS_LOG_LEVEL)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """The settings of the function ``SWARM_FUNCTION`` names, from the variables its
        contract lists (an empty optional one is unset); raise :class:`SettingsError` naming
        what is missing or malformed. Called on a function's model (``WorkerSettings.from_env``),
        ``SWARM_FUNCTION`` must name that function."""
        function = environ.get(SWARM_FUNCTION, "")
        if function not in FUNCTIONS:
            raise SettingsError(
                f"environment variable {SWARM_FUNCTION}={function!r} is not a function name; "
                f"use one of {', '.join(FUNCTIONS)}"
            )
        expected = FUNCTION_ENV[function]
        missing = [name for name in expected if name not in OPTIONAL_VARS and not environ.get(name)]
        if missing:
            raise SettingsError(
                f"missing environment variable(s) for the {function} function: "
                + ", ".join(missing)
            )
        values = {name: environ[name] for name in expected if environ.get(name)}
        try:
            settings = FUNCTION_SETTINGS[function].model_validate(values)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in item['loc'])}={item.get('input')!r}: "
                f"{item['msg']}"
                if item["loc"]
                else item["msg"]
                for item in error.errors()
            )
            raise SettingsError(f"bad environment variable(s): {problems}") from None
        if not isinstance(settings, cls):
            raise SettingsError(
                f"environment variable {SWARM_FUNCTION}={function!r} does not name the function "
                f"of {cls.__name__}"
            )
        return settings


class ApiSettings(
    Settings,
    LedgerSettings,
    GovernorSettings,
    QueueSettings,
    BucketSettings,
    StateMachineSettings,
    DrainSwitchSettings,
    AttemptSettings,
    BundleUnitsSettings,
    ToolGrantsSettings,
    PricesSettings,
    LeaseSettings,
):
    """The front door: it submits, sheds on the lanes' depths and reads the governor."""

    shed_depth_high: int = Field(alias=SHED_DEPTH_HIGH, ge=1)
    shed_depth_normal: int = Field(alias=SHED_DEPTH_NORMAL, ge=1)
    shed_depth_low: int = Field(alias=SHED_DEPTH_LOW, ge=1)
    default_budget_tokens: int = Field(alias=DEFAULT_BUDGET_TOKENS, ge=0)
    max_budget_tokens: int = Field(alias=MAX_BUDGET_TOKENS, ge=1)
    tenant_limits: Json[TenantsDoc] | None = Field(default=None, alias=TENANT_LIMITS)
    tenant_principal_prefix: str = Field(alias=TENANT_PRINCIPAL_PREFIX)
    operator_principal_prefix: str = Field(alias=OPERATOR_PRINCIPAL_PREFIX, min_length=1)
    results_url_seconds: int = Field(alias=RESULTS_URL_SECONDS, ge=1, le=3600)
    upload_url_seconds: int = Field(alias=UPLOAD_URL_SECONDS, ge=1, le=3600)
    units_per_child: int = Field(alias=UNITS_PER_CHILD, ge=1, le=MAX_UNITS_PER_CHILD)
    #: the operator role names that decide gated tool calls (empty: the batch's tenant)
    approval_deciders: str | None = Field(default=None, alias=APPROVAL_DECIDERS)
    #: the tools that name their own deciders: ``tool,tool=role,role;...`` (empty: none)
    approval_tool_deciders: str | None = Field(default=None, alias=APPROVAL_TOOL_DECIDERS)

    def deciders(self) -> frozenset[str]:
        """The deployment's decider role names (approvals.deciders; empty: the tenant)."""
        return frozenset(n for n in (self.approval_deciders or "").split(",") if n)

    def tool_deciders(self, tool: str) -> frozenset[str]:
        """The role names ``tool``'s own entry names (its approval.deciders; empty: none)."""
        for group in (self.approval_tool_deciders or "").split(";"):
            tools, _, roles = group.partition("=")  # a tool's name has no "="
            if tool in tools.split(","):
                return frozenset(n for n in roles.split(",") if n)
        return frozenset()

    def deciders_of(self, tool: str) -> frozenset[str]:
        """Who decides a gated call of ``tool``: its own deciders, else the deployment's;
        empty: the batch's tenant."""
        return self.tool_deciders(tool) or self.deciders()

    def shed_depth(self, lane: Lane) -> int:
        """The lane's depth past which new submissions are shed."""
        depth: int = getattr(self, f"shed_depth_{lane.value}")
        return depth

    def tenant_policy(self) -> TenantPolicy:
        """Every tenant's limits (unset: every lane, no caps of their own)."""
        return TenantPolicy() if self.tenant_limits is None else self.tenant_limits.policy()


class FanoutSettings(
    Settings,
    LedgerSettings,
    GovernorSettings,
    QueueSettings,
    AttemptSettings,
    LeaseSettings,
    BundleSettings,
):
    """The fan-out: it admits a run's units, books their places in the governor's queues, and
    sends them to their lanes."""


class WorkerSettings(
    Settings,
    LedgerSettings,
    GovernorSettings,
    QueueSettings,
    BucketSettings,
    DrainSwitchSettings,
    EventSettings,
    AttemptSettings,
    LeaseSettings,
    BundleSettings,
    ModelSettings,
    PricesSettings,
    ToolRegistrySettings,
):
    """The worker: it draws from the governor, for up to its bounded wait, and calls the model."""

    governor_max_wait_seconds: float = Field(alias=GOVERNOR_MAX_WAIT_SECONDS, ge=0)
    approval_timeout_seconds: int = Field(default=24 * 3600, alias=APPROVAL_TIMEOUT_SECONDS, ge=1)


class DlqSettings(Settings, LedgerSettings, EventSettings, AttemptSettings):
    """The dead-letter handler: it books the units the lanes gave up on."""


class FinalizerSettings(
    Settings, LedgerSettings, QueueSettings, BucketSettings, EventSettings, LeaseSettings
):
    """The finalizer: it closes runs, writes their results and announces them."""


class DrainSettings(Settings, LedgerSettings, QueueSettings, DrainSwitchSettings):
    """The drain controller: it flips the switch and the workers' event source mappings."""

    mapping_id_high: str = Field(alias=WORKER_MAPPING_ID_HIGH)
    mapping_id_normal: str = Field(alias=WORKER_MAPPING_ID_NORMAL)
    mapping_id_low: str = Field(alias=WORKER_MAPPING_ID_LOW)

    def worker_mapping_id(self, lane: Lane) -> str:
        """UUID of the worker's event source mapping on the lane."""
        mapping: str = getattr(self, f"mapping_id_{lane.value}")
        return mapping


class SweeperSettings(
    Settings,
    LedgerSettings,
    QueueSettings,
    BucketSettings,
    EventSettings,
    StateMachineSettings,
    LeaseSettings,
):
    """The finalizer's, plus the state machine it restarts and its schedule's rate."""

    sweep_interval_seconds: int = Field(alias=SWEEP_INTERVAL_SECONDS, ge=60)


#: The model of each function: its fields' aliases are exactly ``FUNCTION_ENV[function]``.
FUNCTION_SETTINGS: Mapping[FunctionName, type[Settings]] = {
    "api": ApiSettings,
    "fanout": FanoutSettings,
    "worker": WorkerSettings,
    "dlq": DlqSettings,
    "finalizer": FinalizerSettings,
    "drain": DrainSettings,
    "sweeper": SweeperSettings,
}


def variables(model: type[BaseModel]) -> frozenset[str]:
    """The environment variables a settings model (a function's, or a mixin) reads."""
    return frozenset(field.alias or name for name, field in model.model_fields.items())
