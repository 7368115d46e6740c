"""The environment contract between the infrastructure (``infra/``) and the Lambda functions.

The stack sets, on each function, exactly the variables :data:`FUNCTION_ENV` lists for it (a test
in ``tests/infra`` checks the synthesized template against this table), and each handler validates
them once at cold start with :meth:`Settings.from_env`. A missing or malformed variable fails the
cold start with an error naming the variable, never a ``KeyError`` deep inside a request.

No boto3 here: this module is plain configuration, importable by the core, the CLI and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarm.core.governor import GovernorConfig
from swarm.core.records import LANES, Lane

# --- which function this is -------------------------------------------------------------------
SWARM_FUNCTION: Final = "SWARM_FUNCTION"  # one of FUNCTIONS (api, fanout, ..., sweeper)
STAGE: Final = "STAGE"

# --- Powertools (read by Powertools itself; listed so infra and functions agree) --------------
POWERTOOLS_SERVICE_NAME: Final = "POWERTOOLS_SERVICE_NAME"
POWERTOOLS_METRICS_NAMESPACE: Final = "POWERTOOLS_METRICS_NAMESPACE"
POWERTOOLS_LOG_LEVEL: Final = "POWERTOOLS_LOG_LEVEL"

# --- resources ----------------------------------------------------------------------------------
GOVERNOR_TABLE_NAME: Final = "GOVERNOR_TABLE_NAME"
LEDGER_TABLE_NAME: Final = "LEDGER_TABLE_NAME"
BUCKET_NAME: Final = "BUCKET_NAME"
STATE_MACHINE_ARN: Final = "STATE_MACHINE_ARN"
EVENT_BUS_NAME: Final = "EVENT_BUS_NAME"
DRAIN_PARAMETER_NAME: Final = "DRAIN_PARAMETER_NAME"

#: The drain parameter's two values (the parameter's AllowedPattern admits only these).
DRAIN_ON: Final = "on"  # draining: refuse submissions (503), workers take nothing new
DRAIN_OFF: Final = "off"  # accepting work


# Per-lane variables: one literal per lane (pydantic aliases must be literals for mypy).
QUEUE_URL_HIGH: Final = "QUEUE_URL_HIGH"
QUEUE_URL_NORMAL: Final = "QUEUE_URL_NORMAL"
QUEUE_URL_LOW: Final = "QUEUE_URL_LOW"
DLQ_URL_HIGH: Final = "DLQ_URL_HIGH"
DLQ_URL_NORMAL: Final = "DLQ_URL_NORMAL"
DLQ_URL_LOW: Final = "DLQ_URL_LOW"
WORKER_MAPPING_ID_HIGH: Final = "WORKER_MAPPING_ID_HIGH"
WORKER_MAPPING_ID_NORMAL: Final = "WORKER_MAPPING_ID_NORMAL"
WORKER_MAPPING_ID_LOW: Final = "WORKER_MAPPING_ID_LOW"
LANE_RESERVE_HIGH: Final = "LANE_RESERVE_HIGH"
LANE_RESERVE_NORMAL: Final = "LANE_RESERVE_NORMAL"
LANE_RESERVE_LOW: Final = "LANE_RESERVE_LOW"
SHED_DEPTH_HIGH: Final = "SHED_DEPTH_HIGH"
SHED_DEPTH_NORMAL: Final = "SHED_DEPTH_NORMAL"
SHED_DEPTH_LOW: Final = "SHED_DEPTH_LOW"


def queue_url_var(lane: Lane) -> str:
    """``QUEUE_URL_<LANE>``: the lane's work queue."""
    return f"QUEUE_URL_{lane.value.upper()}"


def dlq_url_var(lane: Lane) -> str:
    """``DLQ_URL_<LANE>``: the lane's dead-letter queue."""
    return f"DLQ_URL_{lane.value.upper()}"


def worker_mapping_var(lane: Lane) -> str:
    """``WORKER_MAPPING_ID_<LANE>``: UUID of the worker's event source mapping on the lane."""
    return f"WORKER_MAPPING_ID_{lane.value.upper()}"


def lane_reserve_var(lane: Lane) -> str:
    """``LANE_RESERVE_<LANE>``: fraction of the bucket a draw from the lane must leave."""
    return f"LANE_RESERVE_{lane.value.upper()}"


def shed_depth_var(lane: Lane) -> str:
    """``SHED_DEPTH_<LANE>``: lane depth past which the API sheds new submissions (429)."""
    return f"SHED_DEPTH_{lane.value.upper()}"


QUEUE_URL_VARS: Final = tuple(queue_url_var(lane) for lane in LANES)
DLQ_URL_VARS: Final = tuple(dlq_url_var(lane) for lane in LANES)
WORKER_MAPPING_VARS: Final = tuple(worker_mapping_var(lane) for lane in LANES)
LANE_RESERVE_VARS: Final = tuple(lane_reserve_var(lane) for lane in LANES)
SHED_DEPTH_VARS: Final = tuple(shed_depth_var(lane) for lane in LANES)

# --- economics ----------------------------------------------------------------------------------
QUOTA_TPM: Final = "QUOTA_TPM"
GOVERNOR_SHARE: Final = "GOVERNOR_SHARE"
GOVERNOR_CAPACITY: Final = "GOVERNOR_CAPACITY"  # tokens; empty = one minute of quota
GOVERNOR_MAX_WAIT_SECONDS: Final = "GOVERNOR_MAX_WAIT_SECONDS"  # worker's bounded wait
MAX_ATTEMPTS: Final = "MAX_ATTEMPTS"
LEASE_SECONDS: Final = "LEASE_SECONDS"  # reservation lease = the lanes' visibility timeout
DEFAULT_BUDGET_TOKENS: Final = "DEFAULT_BUDGET_TOKENS"
MAX_BUDGET_TOKENS: Final = "MAX_BUDGET_TOKENS"
SWEEP_INTERVAL_SECONDS: Final = "SWEEP_INTERVAL_SECONDS"  # the sweeper's schedule rate
TENANT_PRINCIPAL_PREFIX: Final = "TENANT_PRINCIPAL_PREFIX"

# --- model plane --------------------------------------------------------------------------------
MODEL_ADAPTER: Final = "MODEL_ADAPTER"  # simulated | bedrock
BEDROCK_MODEL_ID: Final = "BEDROCK_MODEL_ID"
#: seconds the bedrock-runtime client waits for Converse's answer; empty = the adapter's default
BEDROCK_READ_TIMEOUT_SECONDS: Final = "BEDROCK_READ_TIMEOUT_SECONDS"
SIM_MODEL_QUOTA_TPM: Final = "SIM_MODEL_QUOTA_TPM"
SIM_MODEL_FAILURE_RATE: Final = "SIM_MODEL_FAILURE_RATE"
SIM_MODEL_SEED: Final = "SIM_MODEL_SEED"

# --- metrics the alarms watch (namespace = POWERTOOLS_METRICS_NAMESPACE, dimension service) ----
METRIC_UNITS_COMPLETED: Final = "UnitsCompleted"
METRIC_UNITS_FAILED: Final = "UnitsFailed"
METRIC_UNITS_DEAD_LETTERED: Final = "UnitsDeadLettered"
METRIC_TOKENS_SPENT: Final = "TokensSpent"
METRIC_GOVERNOR_WAIT_MS: Final = "GovernorWaitMs"
METRIC_GOVERNOR_SATURATION: Final = "GovernorSaturation"  # percent of draws that had to wait
METRIC_MODEL_THROTTLES: Final = "ModelThrottles"
METRIC_SUBMISSIONS_SHED: Final = "SubmissionsShed"
METRIC_SUBMISSIONS_REFUSED: Final = "SubmissionsRefused"
METRIC_RUNS_COMPLETED: Final = "RunsCompleted"
METRIC_RUNS_EXHAUSTED: Final = "RunsExhausted"
METRIC_RUNS_REPAIRED: Final = "RunsRepaired"  # the sweeper restarted a run's dead execution
METRIC_SWEEP_ERRORS: Final = "SweepErrors"  # runs the sweeper failed to look at

FunctionName = Literal["api", "fanout", "worker", "dlq", "finalizer", "drain", "sweeper"]
FUNCTIONS: Final[tuple[FunctionName, ...]] = (
    "api",
    "fanout",
    "worker",
    "dlq",
    "finalizer",
    "drain",
    "sweeper",
)

_COMMON: Final = (
    SWARM_FUNCTION,
    STAGE,
    POWERTOOLS_SERVICE_NAME,
    POWERTOOLS_METRICS_NAMESPACE,
    POWERTOOLS_LOG_LEVEL,
)
_GOVERNOR: Final = (QUOTA_TPM, GOVERNOR_SHARE, GOVERNOR_CAPACITY, *LANE_RESERVE_VARS)
_MODEL: Final = (
    MODEL_ADAPTER,
    BEDROCK_MODEL_ID,
    BEDROCK_READ_TIMEOUT_SECONDS,
    SIM_MODEL_QUOTA_TPM,
    SIM_MODEL_FAILURE_RATE,
    SIM_MODEL_SEED,
)

#: Every variable the stack sets on each function. Optional values are set to "" when unset.
FUNCTION_ENV: Final[Mapping[FunctionName, tuple[str, ...]]] = {
    "api": (
        *_COMMON,
        LEDGER_TABLE_NAME,
        GOVERNOR_TABLE_NAME,
        BUCKET_NAME,
        STATE_MACHINE_ARN,
        DRAIN_PARAMETER_NAME,
        *QUEUE_URL_VARS,
        *DLQ_URL_VARS,
        *SHED_DEPTH_VARS,
        *_GOVERNOR,
        MAX_ATTEMPTS,
        DEFAULT_BUDGET_TOKENS,
        MAX_BUDGET_TOKENS,
        TENANT_PRINCIPAL_PREFIX,
    ),
    "fanout": (
        *_COMMON,
        LEDGER_TABLE_NAME,
        *QUEUE_URL_VARS,
        MAX_ATTEMPTS,
        LEASE_SECONDS,
    ),
    "worker": (
        *_COMMON,
        LEDGER_TABLE_NAME,
        GOVERNOR_TABLE_NAME,
        DRAIN_PARAMETER_NAME,
        EVENT_BUS_NAME,
        *QUEUE_URL_VARS,
        *_GOVERNOR,
        GOVERNOR_MAX_WAIT_SECONDS,
        MAX_ATTEMPTS,
        LEASE_SECONDS,
        *_MODEL,
    ),
    "dlq": (
        *_COMMON,
        LEDGER_TABLE_NAME,
        EVENT_BUS_NAME,
        MAX_ATTEMPTS,
    ),
    "finalizer": (
        *_COMMON,
        LEDGER_TABLE_NAME,
        BUCKET_NAME,
        EVENT_BUS_NAME,
        *QUEUE_URL_VARS,  # the lease sweeper requeues a retry whose worker died with its message
    ),
    "drain": (
        *_COMMON,
        DRAIN_PARAMETER_NAME,
        *WORKER_MAPPING_VARS,
        *QUEUE_URL_VARS,
    ),
    "sweeper": (  # the finalizer's, plus the state machine it restarts and its schedule's rate
        *_COMMON,
        LEDGER_TABLE_NAME,
        BUCKET_NAME,
        EVENT_BUS_NAME,
        *QUEUE_URL_VARS,
        STATE_MACHINE_ARN,
        SWEEP_INTERVAL_SECONDS,
    ),
}

#: Variables a function may receive empty (meaning "use the default").
OPTIONAL_VARS: Final = frozenset(
    {GOVERNOR_CAPACITY, BEDROCK_MODEL_ID, BEDROCK_READ_TIMEOUT_SECONDS}
)


class SettingsError(ValueError):
    """The environment does not satisfy the contract; the message names the variable."""


class Settings(BaseModel):
    """Validated configuration of one function. Fields a function does not receive stay None.

    Build it with :meth:`from_env`; the accessors (:meth:`queue_url`, :meth:`governor_config`...)
    raise :class:`SettingsError` when asked for something this function was not given.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=False)

    function: FunctionName = Field(alias=SWARM_FUNCTION)
    stage: str = Field(alias=STAGE, pattern=r"^[a-z][a-z0-9-]{0,15}$")
    service_name: str = Field(alias=POWERTOOLS_SERVICE_NAME, min_length=1)
    metrics_namespace: str = Field(alias=POWERTOOLS_METRICS_NAMESPACE, min_length=1)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", alias=POWERTOOLS_LOG_LEVEL
    )

    governor_table: str | None = Field(default=None, alias=GOVERNOR_TABLE_NAME, min_length=3)
    ledger_table: str | None = Field(default=None, alias=LEDGER_TABLE_NAME, min_length=3)
    bucket_name: str | None = Field(default=None, alias=BUCKET_NAME, min_length=3)
    state_machine_arn: str | None = Field(
        default=None, alias=STATE_MACHINE_ARN, pattern=r"^arn:[a-z-]+:states:"
    )
    event_bus_name: str | None = Field(default=None, alias=EVENT_BUS_NAME, min_length=1)
    drain_parameter: str | None = Field(default=None, alias=DRAIN_PARAMETER_NAME, min_length=1)

    queue_url_high: str | None = Field(default=None, alias=QUEUE_URL_HIGH)
    queue_url_normal: str | None = Field(default=None, alias=QUEUE_URL_NORMAL)
    queue_url_low: str | None = Field(default=None, alias=QUEUE_URL_LOW)
    dlq_url_high: str | None = Field(default=None, alias=DLQ_URL_HIGH)
    dlq_url_normal: str | None = Field(default=None, alias=DLQ_URL_NORMAL)
    dlq_url_low: str | None = Field(default=None, alias=DLQ_URL_LOW)
    mapping_id_high: str | None = Field(default=None, alias=WORKER_MAPPING_ID_HIGH)
    mapping_id_normal: str | None = Field(default=None, alias=WORKER_MAPPING_ID_NORMAL)
    mapping_id_low: str | None = Field(default=None, alias=WORKER_MAPPING_ID_LOW)
    reserve_high: float | None = Field(default=None, alias=LANE_RESERVE_HIGH, ge=0, lt=1)
    reserve_normal: float | None = Field(default=None, alias=LANE_RESERVE_NORMAL, ge=0, lt=1)
    reserve_low: float | None = Field(default=None, alias=LANE_RESERVE_LOW, ge=0, lt=1)
    shed_depth_high: int | None = Field(default=None, alias=SHED_DEPTH_HIGH, ge=1)
    shed_depth_normal: int | None = Field(default=None, alias=SHED_DEPTH_NORMAL, ge=1)
    shed_depth_low: int | None = Field(default=None, alias=SHED_DEPTH_LOW, ge=1)

    quota_tpm: int | None = Field(default=None, alias=QUOTA_TPM, ge=1)
    governor_share: float | None = Field(default=None, alias=GOVERNOR_SHARE, gt=0, le=1)
    governor_capacity: int | None = Field(default=None, alias=GOVERNOR_CAPACITY, ge=1)
    governor_max_wait_seconds: float | None = Field(
        default=None, alias=GOVERNOR_MAX_WAIT_SECONDS, ge=0
    )
    max_attempts: int | None = Field(default=None, alias=MAX_ATTEMPTS, ge=1, le=100)
    lease_seconds: int | None = Field(default=None, alias=LEASE_SECONDS, ge=1)
    default_budget_tokens: int | None = Field(default=None, alias=DEFAULT_BUDGET_TOKENS, ge=0)
    max_budget_tokens: int | None = Field(default=None, alias=MAX_BUDGET_TOKENS, ge=1)
    sweep_interval_seconds: int | None = Field(default=None, alias=SWEEP_INTERVAL_SECONDS, ge=60)
    tenant_principal_prefix: str | None = Field(default=None, alias=TENANT_PRINCIPAL_PREFIX)

    model_adapter: Literal["simulated", "bedrock"] | None = Field(default=None, alias=MODEL_ADAPTER)
    bedrock_model_id: str | None = Field(default=None, alias=BEDROCK_MODEL_ID)
    bedrock_read_timeout_seconds: float | None = Field(
        default=None, alias=BEDROCK_READ_TIMEOUT_SECONDS, gt=0, le=900
    )
    sim_model_quota_tpm: int | None = Field(default=None, alias=SIM_MODEL_QUOTA_TPM, ge=1)
    sim_model_failure_rate: float | None = Field(
        default=None, alias=SIM_MODEL_FAILURE_RATE, ge=0, le=1
    )
    sim_model_seed: int | None = Field(default=None, alias=SIM_MODEL_SEED)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Validate the variables this function's contract lists; raise :class:`SettingsError`."""
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
            settings = cls.model_validate(values)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in item['loc'])}={item.get('input')!r}: "
                f"{item['msg']}"
                for item in error.errors()
            )
            raise SettingsError(f"bad environment variable(s): {problems}") from None
        if settings.model_adapter == "bedrock" and not settings.bedrock_model_id:
            raise SettingsError(f"{BEDROCK_MODEL_ID} is required when {MODEL_ADAPTER}=bedrock")
        return settings

    def _need(self, value: Any, name: str) -> Any:
        if value is None:
            raise SettingsError(f"the {self.function} function has no {name} in its environment")
        return value

    def queue_url(self, lane: Lane) -> str:
        value: str = self._need(getattr(self, f"queue_url_{lane.value}"), queue_url_var(lane))
        return value

    def dlq_url(self, lane: Lane) -> str:
        value: str = self._need(getattr(self, f"dlq_url_{lane.value}"), dlq_url_var(lane))
        return value

    def worker_mapping_id(self, lane: Lane) -> str:
        value: str = self._need(getattr(self, f"mapping_id_{lane.value}"), worker_mapping_var(lane))
        return value

    def shed_depth(self, lane: Lane) -> int:
        value: int = self._need(getattr(self, f"shed_depth_{lane.value}"), shed_depth_var(lane))
        return value

    def governor_config(self) -> GovernorConfig:
        """The governor's parameters as the core models them."""
        quota: int = self._need(self.quota_tpm, QUOTA_TPM)
        share: float = self._need(self.governor_share, GOVERNOR_SHARE)
        reserves = {
            lane: float(self._need(getattr(self, f"reserve_{lane.value}"), lane_reserve_var(lane)))
            for lane in LANES
        }
        capacity = None if self.governor_capacity is None else float(self.governor_capacity)
        return GovernorConfig(quota_tpm=quota, share=share, capacity=capacity, reserves=reserves)
