"""Each function's validated configuration: :meth:`Settings.from_env` checks, once at cold start,
the variables :data:`swarm.contract.FUNCTION_ENV` lists for the function. A missing or malformed
variable fails the cold start with an error naming the variable, never a ``KeyError`` deep
inside a request.

No boto3 here: plain configuration, importable by the CLI and the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarm.contract import (
    BEDROCK_MODEL_ID,
    BEDROCK_READ_TIMEOUT_SECONDS,
    BUCKET_NAME,
    DEFAULT_BUDGET_TOKENS,
    DLQ_URL_HIGH,
    DLQ_URL_LOW,
    DLQ_URL_NORMAL,
    DRAIN_PARAMETER_NAME,
    EVENT_BUS_NAME,
    FUNCTION_ENV,
    FUNCTIONS,
    GOVERNOR_CAPACITY,
    GOVERNOR_MAX_WAIT_SECONDS,
    GOVERNOR_SHARE,
    GOVERNOR_TABLE_NAME,
    LANE_RESERVE_HIGH,
    LANE_RESERVE_LOW,
    LANE_RESERVE_NORMAL,
    LEASE_SECONDS,
    LEDGER_TABLE_NAME,
    MAX_ATTEMPTS,
    MAX_BUDGET_TOKENS,
    MODEL_ADAPTER,
    OPTIONAL_VARS,
    POWERTOOLS_LOG_LEVEL,
    POWERTOOLS_METRICS_NAMESPACE,
    POWERTOOLS_SERVICE_NAME,
    QUEUE_URL_HIGH,
    QUEUE_URL_LOW,
    QUEUE_URL_NORMAL,
    QUOTA_TPM,
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
    TENANT_PRINCIPAL_PREFIX,
    WORKER_MAPPING_ID_HIGH,
    WORKER_MAPPING_ID_LOW,
    WORKER_MAPPING_ID_NORMAL,
    FunctionName,
    dlq_url_var,
    lane_reserve_var,
    queue_url_var,
    shed_depth_var,
    worker_mapping_var,
)
from swarm.core.governor import GovernorConfig
from swarm.core.records import LANES, Lane


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
