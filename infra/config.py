"""The stack's configuration: cdk.json context, validated at synth.

Every key lives at the top level of the context (``npx cdk synth -c quota_tpm=400000`` overrides
one; object values such as ``lanes`` take JSON on the command line). A bad value fails synth with
:class:`ConfigError`, whose message names the key and what is allowed.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlparse

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from infra.constants import FANOUT_ASL
from infra.timing import (
    API_GATEWAY_INTEGRATION_TIMEOUT_S,
    EXPRESS_MAX_SECONDS,
    LAMBDA_INIT_MAX_S,
    TimingError,
    machine_budget,
    parse_definition,
)
from infra.tool_sources import SourceError, declared_tools
from swarm.api.models import MAX_BUDGET_TOKENS, MAX_BUDGET_USD
from swarm.contract import (
    BEDROCK_CONNECT_TIMEOUT_S,
    BEDROCK_DEFAULT_READ_TIMEOUT_S,
    DEFAULT_UNITS_PER_CHILD,
    MAX_APPROVAL_TIMEOUT_HOURS,
    MAX_BUNDLE_UNITS,
    MAX_UNITS_PER_CHILD,
    bedrock_call_bound_s,
)
from swarm.core.burndown import documented_burndown
from swarm.core.errors import InvalidInput
from swarm.core.governor import GovernorConfig
from swarm.core.pricing import USD_PLACES, Prices, parse_usd, prices_table_to_env
from swarm.core.records import LANES, TENANT_PATTERN, Lane
from swarm.core.scheduling import (
    MAPPING_CONCURRENCY,
    UNRESERVED_MINIMUM,
    FleetSizing,
    UnitProfile,
    size_fleet,
)

#: CloudWatch Logs accepts only these retention periods (days).
RETENTION_DAYS = (
    1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922,
    3288, 3653,
)  # fmt: skip


class IConstructLike(Protocol):
    """A CDK construct (an App, a Stack...): what :meth:`SwarmConfig.from_context` reads."""

    @property
    def node(self) -> Any: ...


class ConfigError(ValueError):
    """A context value is missing or not allowed; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LaneConfig(_Strict):
    # the ESM's MaximumConcurrency (2..1000); required, unless worker.concurrency is "auto"
    max_concurrency: int | None = Field(default=None, ge=2, le=1000)
    # units queued on this lane and every higher one (the work ahead of a new unit) past which
    # the API sheds submissions to this lane with 429; must not increase towards lower lanes,
    # so that a higher lane never sheds while a lower one still admits
    shed_depth: int = Field(ge=1)


class LanesConfig(_Strict):
    high: LaneConfig
    normal: LaneConfig
    low: LaneConfig

    def of(self, lane: Lane) -> LaneConfig:
        value: LaneConfig = getattr(self, lane.value)
        return value

    @model_validator(mode="after")
    def _higher_lanes_get_more(self) -> LanesConfig:
        given = [c for c in (self.of(lane).max_concurrency for lane in LANES) if c is not None]
        if len(given) == len(LANES) and given != sorted(given, reverse=True):
            raise ValueError(
                "max_concurrency must not increase from high to normal to low "
                f"(got {self.high.max_concurrency}, {self.normal.max_concurrency}, "
                f"{self.low.max_concurrency})"
            )
        if not self.high.shed_depth >= self.normal.shed_depth >= self.low.shed_depth:
            raise ValueError(
                "shed_depth must not increase from high to normal to low: it counts the work "
                "queued at or above a lane, and higher lanes shed last "
                f"(got {self.high.shed_depth}, {self.normal.shed_depth}, {self.low.shed_depth})"
            )
        return self


class LaneReserves(_Strict):
    high: float = Field(ge=0, lt=1)
    normal: float = Field(ge=0, lt=1)
    low: float = Field(ge=0, lt=1)

    def of(self, lane: Lane) -> float:
        value: float = getattr(self, lane.value)
        return value

    @model_validator(mode="after")
    def _lower_lanes_leave_more(self) -> LaneReserves:
        if not self.high <= self.normal <= self.low:
            raise ValueError(
                "reserves keep tokens for higher lanes, so they must not decrease from high to "
                f"normal to low (got {self.high}, {self.normal}, {self.low})"
            )
        return self


class UnitProfileConfig(_Strict):
    """``worker.unit_profile``: the units ``worker.concurrency: "auto"`` sizes the fleet for
    (:class:`swarm.core.scheduling.UnitProfile`; ``swarm plan`` prints it for a workload)."""

    mean_tokens: float = Field(gt=0)  # a unit's projected tokens, on average
    mean_seconds: float = Field(ge=0)  # a unit's wall clock on a worker, on average
    small_tokens: int = Field(ge=1)  # a small unit (the smallest that matter in bulk)...
    small_seconds: float = Field(ge=0)  # ...and its wall clock


class WorkerConfig(_Strict):
    # the worker function's Lambda timeout: the governor wait, the model's timeouts and a
    # message's own work must fit in it (checked at synth; the lanes' visibility timeout is 6x it)
    timeout_seconds: int = Field(ge=10, le=900)
    # the worker function's memory (Lambda bills GB-seconds by it)
    memory_mb: int = Field(ge=128, le=10240)
    # null (default): unreserved. A reservation must fit account_concurrency_limit (see below).
    reserved_concurrency: int | None = Field(default=None, ge=2)
    # "auto": every lane's max_concurrency and the reserved concurrency are derived at synth from
    # quota_tpm, governor_share and unit_profile (SwarmConfig.sizing); null: given by hand
    concurrency: Literal["auto"] | None = None
    unit_profile: UnitProfileConfig | None = None
    # lane messages per worker invocation (the event source mapping's BatchSize); a worker
    # runs them at once, one thread each
    batch_size: int = Field(ge=1, le=10)
    # how long a worker waits for the governor's tokens before it hands the unit back to its
    # lane with a delay (below worker.timeout_seconds)
    governor_max_wait_seconds: float = Field(ge=0)
    # units due within bundle_window_seconds of each other travel as one lane message, at most
    # bundle_units of them (swarm.core.lanes.bundle): they reach one invocation together
    bundle_units: int = Field(default=5, ge=1, le=MAX_BUNDLE_UNITS)
    bundle_window_seconds: float = Field(default=10, ge=0, le=60)
    # a bundle whose first unit is due later (deep in a queue) gathers for this fraction of that
    # unit's delay when longer than bundle_window_seconds, at most bundle_max_window_seconds:
    # a unit waits at most that much (and this fraction) longer than its place, and more units
    # share an invocation's wait for the model (docs/explanation/scale.md)
    bundle_stretch: float = Field(default=0.0, ge=0, le=1)
    bundle_max_window_seconds: float | None = Field(default=None, ge=0, le=600)

    @property
    def longest_bundle_window_seconds(self) -> float:
        """``bundle_max_window_seconds``, or without one ``bundle_window_seconds``."""
        given = self.bundle_max_window_seconds
        return self.bundle_window_seconds if given is None else given

    @model_validator(mode="after")
    def _bundle_windows(self) -> WorkerConfig:
        if self.longest_bundle_window_seconds < self.bundle_window_seconds:
            raise ValueError(
                f"worker.bundle_max_window_seconds={self.bundle_max_window_seconds} is below "
                f"worker.bundle_window_seconds={self.bundle_window_seconds}: the longest window "
                "is at least the shortest"
            )
        return self


class BudgetConfig(_Strict):
    # a batch's budget when the submission names none
    default_tokens: int = Field(ge=0)
    # the API's document states this ceiling (swarm.api.models): a deployment may lower it
    max_tokens: int = Field(ge=1, le=MAX_BUDGET_TOKENS)


#: Step Functions ends a standard execution at 25,000 history events; each finalizer poll adds
#: at most 11 (a wait nobody ends: the task's 6, the poll count's 2), each retry of it 3 more:
#: 1,500 polls leave room for the map's events and one retry of every poll
MAX_POLLS_PER_EXECUTION = 1500


class FanoutConfig(_Strict):
    max_concurrency: int = Field(ge=1, le=10000)  # Distributed Map child executions at once
    # the Distributed Map's ToleratedFailurePercentage: failed children past it fail the map
    tolerated_failure_percentage: int = Field(ge=0, le=100)
    # between two invocations writing a closure's results file too long for one
    finalizer_poll_seconds: int = Field(ge=1, le=3600)
    # how long a poll of the finalize loop waits for the run's closer to wake it before it
    # sweeps expired leases again (a closure is announced when it happens, not at a poll)
    finalizer_max_poll_seconds: int = Field(default=300, ge=1, le=3600)
    # polls of the finalize loop before an execution continues as a new one (history limit)
    finalizer_polls_per_execution: int = Field(default=1000, ge=1)
    # how often the sweeper looks for runs whose execution died (an EventBridge schedule)
    sweeper_rate_minutes: int = Field(default=15)
    # the most units one child execution admits and enqueues: the API writes the manifest in
    # chunks of this many (and under the 256 KiB child input), so a batch costs one child
    # start, one Express request and one fan-out invocation per chunk, not per unit
    units_per_child: int = Field(default=DEFAULT_UNITS_PER_CHILD)
    # the fan-out function's Lambda timeout: each attempt of a map child's AdmitAndEnqueue
    # lasts at most this plus INIT, and every attempt and retry pause must fit the Express
    # child's 5 minutes (infra/timing.py, checked at synth)
    timeout_seconds: int = Field(default=30, ge=3, le=300)

    @model_validator(mode="after")
    def _bounded(self) -> FanoutConfig:
        if self.finalizer_polls_per_execution > MAX_POLLS_PER_EXECUTION:
            raise ValueError(
                f"finalizer_polls_per_execution={self.finalizer_polls_per_execution} is above "
                f"{MAX_POLLS_PER_EXECUTION}: each poll adds up to 11 events to the execution's "
                "history and Step Functions ends an execution at 25,000; the loop continues as a "
                "new execution after this many polls, so a lower value costs nothing"
            )
        if not 1 <= self.units_per_child <= MAX_UNITS_PER_CHILD:
            raise ValueError(
                f"units_per_child={self.units_per_child} must be a whole number from 1 to "
                f"{MAX_UNITS_PER_CHILD}: one fan-out invocation admits (a ledger transaction "
                "each) and sends that many units within its Lambda timeout"
            )
        if not 1 <= self.sweeper_rate_minutes <= 1440:
            raise ValueError(
                f"sweeper_rate_minutes={self.sweeper_rate_minutes} must be a whole number of "
                "minutes from 1 to 1440 (a day): the sweeper finds runs whose execution died "
                "within about two of these periods"
            )
        return self


class ApiConfig(_Strict):
    # the API stage's throttling (API Gateway): steady requests per second, and the burst
    throttle_rate_limit: float = Field(gt=0)
    throttle_burst_limit: int = Field(ge=1, le=5000)
    # a tenant is the IAM role named <prefix><tenant> in the stack's account
    tenant_principal_prefix: str = Field(pattern=r"^[A-Za-z0-9+=,.@_-]{1,32}$")
    # the roles that own the fleet-wide views (GET /fleet, /drain), read any batch and re-bind
    # a tenant whose role was recreated; never a tenant
    operator_principal_prefix: str = Field(
        default="swarm-operator-", pattern=r"^[A-Za-z0-9+=,.@_-]{1,32}$"
    )
    create_cloudwatch_role: bool  # API Gateway's logging role (docs/tutorials/first-deployment.md)
    # the API function's Lambda timeout: with INIT it must end within API Gateway's 29 s
    # integration timeout, or the caller gets a 504 while the function goes on (checked at synth)
    timeout_seconds: int = Field(default=19, ge=3, le=900)

    @model_validator(mode="after")
    def _distinct_principals(self) -> ApiConfig:
        tenant, operator = self.tenant_principal_prefix, self.operator_principal_prefix
        if tenant.startswith(operator) or operator.startswith(tenant):
            raise ValueError(
                f"api.operator_principal_prefix {operator!r} and api.tenant_principal_prefix "
                f"{tenant!r} must not be prefixes of each other: a role would be both"
            )
        return self


class ResultsConfig(_Strict):
    """What the stack keeps of the work's product (results/<batch>/ in the batch bucket)."""

    # every unit's outcome and the results files are deleted this long after they are written
    retention_days: int = Field(default=90, ge=1, le=3650)
    # a results download URL's lifetime (a presigned GET of one object; signed with the API
    # function's session credentials, so it can end sooner, never later)
    download_url_seconds: int = Field(default=300, ge=30, le=3600)


class UploadsConfig(_Strict):
    """Manifest uploads (POST /uploads: a presigned PUT of manifests/uploads/<tenant>/<id>)."""

    # an upload URL's lifetime: the upload must start within it (signed with the API function's
    # session credentials, so it can end sooner, never later)
    url_seconds: int = Field(default=300, ge=30, le=3600)


#: an IAM role's name, and a role's ARN (a decider of approvals.deciders)
ROLE_NAME = re.compile(r"^[A-Za-z0-9+=,.@_-]{1,64}$")
ROLE_ARN = re.compile(
    r"^arn:aws[a-z-]*:iam::\d{12}:role/(?:[^/]+/)*(?P<name>[A-Za-z0-9+=,.@_-]{1,64})$"
)


def role_name(given: str) -> str:
    """A decider's role name: ``given``, or a role ARN's last path part."""
    match = ROLE_ARN.match(given)
    return match.group("name") if match else given


def check_deciders(key: str, deciders: Sequence[str], prefix: str) -> None:
    """Each of ``deciders`` is an operator role (a name with the operator prefix, or such a
    role's ARN), never a tenant's; ValueError naming ``key[i]``."""
    for i, given in enumerate(deciders):
        if ROLE_ARN.match(given) is None and not ROLE_NAME.match(given):
            raise ValueError(
                f"{key}[{i}]: {given!r} is neither an IAM role name nor a role ARN "
                "(arn:aws:iam::<account>:role/<name>)"
            )
        name = role_name(given)
        if any(c in name for c in ",=;"):  # the API's environment lists them with those
            raise ValueError(
                f"{key}[{i}]: {name!r}: a decider's role name may not contain ',', '=' or ';' "
                "(IAM allows them; the API function's environment separates names with them): "
                "rename the role"
            )
        if not name.startswith(prefix) or name == prefix:
            raise ValueError(
                f"{key}[{i}]: {name!r} is not an operator role: name one '{prefix}<name>' "
                "(api.operator_principal_prefix); a tenant role decides by default, with "
                "approvals.deciders empty"
            )


class ApprovalsConfig(_Strict):
    """Human gates: tool calls that wait for a person's decision (docs/agents.md, "Human
    gates")."""

    # an undecided call is rejected by the sweeper after this many hours (1 to 14 days)
    timeout_hours: int = Field(default=24, ge=1, le=MAX_APPROVAL_TIMEOUT_HOURS)
    # who decides: empty, the batch's tenant role; else only these operator roles (names, or
    # role ARNs of the stack's account), for tools whose effect a tenant must not approve itself
    deciders: tuple[str, ...] = ()

    def decider_names(self) -> list[str]:
        """The deciders' role names (an ARN's last path part)."""
        return [role_name(given) for given in self.deciders]


#: the most operator roles one tool's ``approval.deciders`` names
MAX_TOOL_DECIDERS = 8
#: the most the tools' deciders may take in the API function's environment
#: (APPROVAL_TOOL_DECIDERS): Lambda allows 4 KB for all of a function's variables, and the
#: API's others take about 2.5 KB with the shipped tenants (their tokens at their longest); the
#: sum is checked at synth too (infra/functions.py), naming this key among the large ones
MAX_TOOL_DECIDERS_BYTES = 512

#: a tenant's name: an IAM role name's characters (swarm.core.records.check_tenant)
TENANT_NAME = re.compile(TENANT_PATTERN)
#: the most the resolved ``tenants`` may take in the API function's environment (JSON): Lambda
#: allows 4 KB for all of a function's variables, and the API's others take about 1.5 KB
MAX_TENANT_LIMITS_BYTES = 2048


class TenantLimitsConfig(_Strict):
    """``tenants.defaults``: what every tenant may do (:mod:`swarm.core.tenancy`)."""

    # the lanes it may submit to (others: 400 naming lane)
    lanes: tuple[Lane, ...] = Field(min_length=1)
    # its open runs' units not yet terminal, a new batch included (past it: 429 tenant_queue);
    # null: no cap of its own
    max_queued_units: int | None = Field(default=None, ge=1)
    # its share of the lanes: within it, a submission is never shed for the lanes' depth
    guaranteed_units: int = Field(ge=0)
    # the most tokens one batch's budget may reach, top-ups included; null: budget.max_tokens
    max_budget_per_batch: int | None = Field(default=None, ge=1)
    # the most US dollars one batch's budget_usd may reach, top-ups included (at most 6
    # decimals); null: the API's maximum. Capped in one unit only, a tenant must give its
    # budgets in that unit
    max_budget_usd_per_batch: Decimal | None = Field(
        default=None, gt=0, le=MAX_BUDGET_USD, decimal_places=USD_PLACES
    )
    # the tools of the registry (``tools``) its units may use
    tools: tuple[str, ...] = ()
    # the models of the registry (``models.catalog``) its units may name (the default among
    # them); null/absent: every registered model
    models: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _coherent(self) -> TenantLimitsConfig:
        if len(set(self.lanes)) != len(self.lanes):
            raise ValueError(f"lanes lists a lane twice (got {[x.value for x in self.lanes]})")
        cap = self.max_queued_units
        if cap is not None and self.guaranteed_units > cap:
            raise ValueError(
                f"guaranteed_units={self.guaranteed_units} is above max_queued_units={cap}: the "
                "share a tenant is guaranteed cannot exceed what it may queue"
            )
        return self

    def doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "lanes": [lane.value for lane in LANES if lane in self.lanes],
            "max_queued_units": self.max_queued_units,
            "guaranteed_units": self.guaranteed_units,
            "max_budget_per_batch": self.max_budget_per_batch,
        }
        if self.max_budget_usd_per_batch is not None:
            doc["max_budget_micro_per_batch"] = parse_usd(self.max_budget_usd_per_batch, "usd")
        if self.models is not None:
            doc["models"] = list(self.models)
        return doc


class TenantOverrideConfig(_Strict):
    """``tenants.overrides.<tenant>``: any of the defaults' keys; the rest (and any null) are
    the defaults'."""

    lanes: tuple[Lane, ...] | None = Field(default=None, min_length=1)
    max_queued_units: int | None = Field(default=None, ge=1)
    guaranteed_units: int | None = Field(default=None, ge=0)
    max_budget_per_batch: int | None = Field(default=None, ge=1)
    max_budget_usd_per_batch: Decimal | None = Field(
        default=None, gt=0, le=MAX_BUDGET_USD, decimal_places=USD_PLACES
    )
    tools: tuple[str, ...] | None = None
    models: tuple[str, ...] | None = None


class TenantsConfig(_Strict):
    """``tenants``: the limits that keep tenants from hurting each other
    (docs/how-to/budgets-and-tenants.md)."""

    defaults: TenantLimitsConfig
    # by tenant name: any key of defaults (a key left out, or null, is the default's)
    overrides: dict[str, TenantOverrideConfig] = Field(default_factory=dict)

    def of(self, tenant: str) -> TenantLimitsConfig:
        """The tenant's limits: its override's keys over the defaults."""
        override = self.overrides.get(tenant)
        if override is None:
            return self.defaults
        # null is the same as leaving the key out: CDK drops nulls from cdk.json's objects, so
        # it could not mean "no cap" there (to lift a cap, give a large number)
        given = {name: value for name, value in override if value is not None}
        return TenantLimitsConfig.model_validate({**self.defaults.model_dump(), **given})

    @model_validator(mode="after")
    def _valid_overrides(self) -> TenantsConfig:
        for name in self.overrides:
            if not TENANT_NAME.match(name):
                raise ValueError(
                    f"overrides.{name}: {name!r} is not a tenant name (an IAM role name's "
                    "characters without the tenant prefix: letters, digits and +=,.@_-, 1-64)"
                )
            try:
                self.of(name)
            except ValidationError as error:
                problem = error.errors()[0]["msg"].removeprefix("Value error, ")
                raise ValueError(f"overrides.{name}: {problem}") from None
        size = len(self.env_value().encode())
        if size > MAX_TENANT_LIMITS_BYTES:
            raise ValueError(
                f"the tenants' limits take {size:,} bytes of the API function's environment, "
                f"more than {MAX_TENANT_LIMITS_BYTES:,} (Lambda allows 4 KB for all its "
                "variables): give fewer overrides, or move tenants onto the defaults"
            )
        return self

    def env_value(self) -> str:
        """:data:`swarm.contract.TENANT_LIMITS`: every override resolved, compact JSON."""
        doc = {
            "defaults": self.defaults.doc(),
            "overrides": {name: self.of(name).doc() for name in sorted(self.overrides)},
        }
        return json.dumps(doc, separators=(",", ":"))


#: Converse's pattern for a tool's name (a toolSpec's ``name``)
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: a tool source: a module ``functions/tools/<source>.py``
TOOL_SOURCE_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
#: a Lambda function's ARN, optionally with a version or alias (Invoke's FunctionName)
FUNCTION_ARN_PATTERN = (
    r"^arn:aws[a-zA-Z-]*:lambda:[a-z]{2}(-gov)?-[a-z]+-\d:\d{12}:function:[a-zA-Z0-9_-]{1,64}"
    r"(:(\$LATEST|[a-zA-Z0-9_-]{1,128}))?$"
)
#: the default timeout of a tool call (seconds)
DEFAULT_TOOL_TIMEOUT_S = 10
#: the most the resolved registry may take in the worker's environment (JSON, with every ARN
#: counted at its longest): Lambda allows 4 KB for all of a function's variables, and the
#: worker's others take about 1.4 KB (tests/infra/test_tools.py checks the sum)
MAX_TOOL_REGISTRY_BYTES = 2400
#: the longest function ARN the registry may hold (what the size check counts for a source's)
LONGEST_FUNCTION_ARN = 140
#: the longest description of one tool (characters): the worker's environment holds it
MAX_TOOL_DESCRIPTION = 600
#: ... and of a toolset's tool, whose spec the asset holds (BFCL's longest is 640)
MAX_TOOLSET_DESCRIPTION = 2000


#: a Secrets Manager secret: its name (1-512 of letters, digits, ``/_+=.@-``) or its ARN
SECRET_PATTERN = (
    r"^(arn:aws[a-zA-Z-]*:secretsmanager:[a-z]{2}(-gov)?-[a-z]+-\d:\d{12}:secret:"
    r"[A-Za-z0-9/_+=.@-]{1,512}|[A-Za-z0-9/_+=.@-]{1,512})$"
)
#: the hosts an ``http://`` MCP URL may name, on the local stack only (stage ``local``)
LOCAL_MCP_HOSTS = ("localhost", "127.0.0.1")


class McpConfig(_Strict):
    """``tools.<name>.mcp``: an MCP server whose tools the worker calls over Streamable HTTP
    (docs/agents.md, "MCP tools")."""

    # the server's Streamable HTTP endpoint: https://... (http://localhost or 127.0.0.1 only on
    # the local stack, stage local)
    url: str = Field(min_length=1, max_length=512)
    # a Secrets Manager secret (name or ARN) whose value is the auth header: one line
    # "Name: value" (e.g. "Authorization: Bearer ...") or a JSON object of headers
    auth_secret: str | None = Field(default=None, pattern=SECRET_PATTERN)
    # the server's tools to expose (each under its own name); absent: every tool it lists
    tools: tuple[str, ...] | None = Field(default=None, min_length=1, max_length=64)


class ToolApprovalConfig(_Strict):
    """``tools.<name>.approval`` as an object: the tool is gated, and these operator roles
    decide its calls (docs/agents.md, "Human gates")."""

    # operator roles (names, or role ARNs of the stack's account) that decide this tool's calls
    # instead of approvals.deciders or the batch's tenant; empty: as "required"
    deciders: tuple[str, ...] = Field(default=(), max_length=MAX_TOOL_DECIDERS)


class ToolConfig(_Strict):
    """``tools.<name>``: one tool of the registry (docs/agents.md, "Tools")."""

    # what the model reads to choose the tool; a source's declaration gives it by default
    description: str | None = Field(default=None, min_length=1, max_length=MAX_TOOL_DESCRIPTION)
    # a JSON Schema object ({"type": "object", ...}); a source's declaration gives it by default
    input_schema: dict[str, Any] | None = None
    # read: no effect outside the call; write: it changes something (honours its idempotency key)
    effect: Literal["read", "write"] | None = None
    # how long the worker waits for the tool's answer
    timeout_seconds: int = Field(default=DEFAULT_TOOL_TIMEOUT_S, ge=1, le=300)
    # exactly one of: a module functions/tools/<source>.py, built by the stack as a function of
    # its own (one per source), or an existing function
    source: str | None = Field(default=None, pattern=TOOL_SOURCE_PATTERN)
    function_arn: str | None = Field(default=None, pattern=FUNCTION_ARN_PATTERN)
    # a toolset: the entry registers every tool its source declares (under their own names),
    # and a tenant granted the entry's name gets them all (e.g. a benchmark's functions)
    toolset: bool = False
    # "required": each call of the tool waits for a person's decision before it runs
    # (docs/agents.md, "Human gates"); "none": it runs at once (a unit may still gate it with
    # input.limits.approve_tools); {"deciders": [...]}: gated, and only these operator roles
    # decide its calls (else approvals.deciders, else the batch's tenant). On an mcp entry:
    # every tool of its server (deciders: its listed mcp.tools)
    approval: Literal["required", "none"] | ToolApprovalConfig = "none"
    # an MCP server (instead of source or function_arn): a tenant granted the entry's name gets
    # its tools; effect, if given, is every tool's (else a tool annotated readOnlyHint is read)
    mcp: McpConfig | None = None

    @field_validator("approval", mode="before")
    @classmethod
    def _one_approval(cls, value: Any) -> Any:
        """One clear error for what is neither form (not one per form of the union)."""
        form = 'must be "required", "none" or {"deciders": ["<operator role name or ARN>", ...]}'
        if isinstance(value, str) and value not in ("required", "none"):
            raise ValueError(f"{form} (got {value!r})")
        if isinstance(value, Mapping):
            extra = sorted(set(value) - {"deciders"})
            deciders = value.get("deciders", [])
            if extra:
                raise ValueError(f"{form}: {extra[0]!r} is not a key of it")
            if not isinstance(deciders, list | tuple) or not all(
                isinstance(d, str) for d in deciders
            ):
                raise ValueError(f"{form}: deciders must be a list of role names or ARNs")
            if len(deciders) > MAX_TOOL_DECIDERS:
                raise ValueError(f"{form}: at most {MAX_TOOL_DECIDERS} deciders")
        elif not isinstance(value, str | ToolApprovalConfig):
            raise ValueError(f"{form} (got {type(value).__name__})")
        return value

    @property
    def gated(self) -> bool:
        """Whether each call of the tool waits for a person's decision."""
        return self.approval != "none"

    @property
    def deciders(self) -> tuple[str, ...]:
        """The operator roles ``approval.deciders`` names (empty: the default deciders)."""
        return self.approval.deciders if isinstance(self.approval, ToolApprovalConfig) else ()


@dataclass(frozen=True)
class ResolvedTool:
    """A tool with its source's defaults filled in."""

    name: str
    description: str
    input_schema: dict[str, Any]
    effect: str
    timeout_seconds: int
    source: str | None
    function_arn: str | None


def input_schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a tool's input schema Converse takes, or None."""
    if not isinstance(schema, dict):
        return 'must be a JSON Schema object such as {"type": "object", "properties": {}}'
    if schema.get("type") != "object":
        return (
            f'must have "type": "object" (a tool takes a JSON object; got {schema.get("type")!r})'
        )
    properties = schema.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(v, dict) for v in properties.values()
    ):
        return '"properties" must be an object of schemas'
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return '"required" must be a list of property names'
    missing = [r for r in required if r not in properties]
    if missing:
        return f'"required" names {missing}, which "properties" does not define'
    try:
        json.dumps(schema)
    except (TypeError, ValueError):
        return "must be plain JSON"
    return None


def resolve_tool(
    name: str, tool: ToolConfig, max_description: int = MAX_TOOL_DESCRIPTION
) -> ResolvedTool:
    """``tool`` with its source's declaration as defaults; ValueError naming ``tools.<name>...``."""
    key = f"tools.{name}"
    if not TOOL_NAME.match(name):
        raise ValueError(
            f"{key}: {name!r} is not a tool name Converse accepts: 1 to 64 letters, digits, "
            "'_' or '-'"
        )
    if (tool.source is None) == (tool.function_arn is None):
        raise ValueError(
            f"{key}: give exactly one of source (a module functions/tools/<source>.py) or "
            "function_arn (an existing Lambda function)"
        )
    declared: dict[str, Any] = {}
    if tool.source is not None:
        try:
            declared = declared_tools(tool.source).get(name, {})
        except SourceError as error:
            raise ValueError(f"{key}.source: {error}") from None
    description = tool.description or declared.get("description")
    schema = tool.input_schema if tool.input_schema is not None else declared.get("input_schema")
    effect = tool.effect or declared.get("effect")
    where = (
        f"functions/tools/{tool.source}.py declares no tool {name!r}"
        if tool.source is not None
        else "a function_arn tool declares nothing of its own"
    )
    if not isinstance(description, str) or not description.strip():
        raise ValueError(f"{key}.description: required ({where})")
    if len(description) > max_description:
        raise ValueError(f"{key}.description: at most {max_description} characters")
    if schema is None:
        raise ValueError(f"{key}.input_schema: required ({where})")
    problem = input_schema_problem(schema)
    if problem is not None:
        raise ValueError(f"{key}.input_schema: {problem}")
    if effect not in ("read", "write"):
        raise ValueError(f"{key}.effect: required, read or write ({where})")
    return ResolvedTool(
        name, description, schema, effect, tool.timeout_seconds, tool.source, tool.function_arn
    )


def check_mcp(name: str, tool: ToolConfig, local: bool) -> McpConfig:
    """``tool``'s MCP server, checked; ValueError naming ``tools.<name>.mcp...``."""
    key = f"tools.{name}"
    mcp = tool.mcp
    assert mcp is not None
    given = [
        f
        for f in ("source", "function_arn", "description", "input_schema")
        if getattr(tool, f) is not None
    ] + (["toolset"] if tool.toolset else [])
    if given:
        raise ValueError(
            f"{key}.{given[0]}: an mcp entry takes its tools and their specs from the server "
            "(give mcp, and optionally effect, timeout_seconds)"
        )
    url = urlparse(mcp.url)
    if url.scheme == "http" and url.hostname in LOCAL_MCP_HOSTS:
        if not local:
            raise ValueError(
                f"{key}.mcp.url: http:// is accepted only for localhost on the local stack "
                f"(stage local); give the server's https:// URL (got {mcp.url!r})"
            )
    elif url.scheme != "https" or not url.hostname:
        raise ValueError(
            f"{key}.mcp.url: must be an https:// URL of the server's Streamable HTTP endpoint "
            f"(got {mcp.url!r})"
        )
    if url.username or url.password:
        raise ValueError(
            f"{key}.mcp.url: must not carry credentials; put the header in a secret "
            "(mcp.auth_secret)"
        )
    for i, each in enumerate(mcp.tools or ()):
        if not TOOL_NAME.match(each):
            raise ValueError(
                f"{key}.mcp.tools[{i}]: {each!r} is not a tool name Converse accepts: 1 to 64 "
                "letters, digits, '_' or '-'"
            )
    if mcp.tools is not None and len(set(mcp.tools)) != len(mcp.tools):
        raise ValueError(f"{key}.mcp.tools: lists a tool twice ({list(mcp.tools)})")
    return mcp


def toolset_tools(name: str, tool: ToolConfig) -> list[ResolvedTool]:
    """Every tool a toolset entry's source declares, resolved (its ``timeout_seconds`` for
    each); ValueError naming ``tools.<name>...``."""
    key = f"tools.{name}"
    if tool.source is None or tool.function_arn is not None:
        raise ValueError(f"{key}.toolset: a toolset needs a source (and no function_arn)")
    if tool.gated:
        raise ValueError(
            f"{key}.approval: a toolset is not gated as a whole; list the calls to gate in a "
            "unit's input.limits.approve_tools"
        )
    given = [f for f in ("description", "input_schema", "effect") if getattr(tool, f) is not None]
    if given:
        raise ValueError(
            f"{key}.{given[0]}: a toolset's tools each take theirs from what "
            f"functions/tools/{tool.source} declares"
        )
    try:
        declared = declared_tools(tool.source)
    except SourceError as error:
        raise ValueError(f"{key}.source: {error}") from None
    if not declared:
        raise ValueError(f"{key}.source: functions/tools/{tool.source}.py declares no tools")
    single = ToolConfig(source=tool.source, timeout_seconds=tool.timeout_seconds)
    return [resolve_tool(each, single, MAX_TOOLSET_DESCRIPTION) for each in sorted(declared)]


class SimulatedModelConfig(_Strict):
    # the simulated model plane's own quota in tokens a minute (its throttles start past it)
    quota_tpm: int = Field(ge=1)
    # the chance an attempt fails (a function of seed, unit and attempt: reproducible)
    failure_rate: float = Field(ge=0, le=1)
    seed: int


class BedrockConfig(_Strict):
    # How long the worker's bedrock-runtime client waits for Converse's answer, which arrives
    # whole when the generation ends (boto3's own 60 s is short for it). The default, 180 s,
    # covers the adapter's 4,096 output tokens at 30 tokens/s plus 30 s to a first token
    # (swarm/adapters/bedrock.py); a faster model may set less, a slower one more. The worker's
    # timeout must hold batch_size such calls: see worker_timing_problem.
    read_timeout_seconds: int = Field(default=BEDROCK_DEFAULT_READ_TIMEOUT_S, ge=30, le=900)


class ModelConfig(_Strict):
    # the model plane the workers call: the simulated one, or Amazon Bedrock
    adapter: Literal["simulated", "bedrock"]
    # the one model of a configuration without ``models`` (with it: models.catalog.<name>)
    bedrock_model_id: str | None = Field(default=None, pattern=r"^[a-z0-9.:-]+$")
    bedrock: BedrockConfig = BedrockConfig()
    simulated: SimulatedModelConfig
    # How many tokens of the model's tokens-per-minute quota one output token counts as
    # (Bedrock's "token burndown rate"); null/absent: what Bedrock documents for
    # bedrock_model_id's family (swarm.core.burndown: 5 for the Claude 4 family, else 1).
    # The governor draws and trues up in these quota tokens; budgets stay in billed tokens.
    output_burndown: float | None = Field(default=None, ge=1, le=100, allow_inf_nan=False)
    # the one model's prices of a configuration without ``models`` (with it:
    # models.catalog.<name>.prices; the same shape)
    prices: dict[str, Any] | None = None

    @field_validator("prices")
    @classmethod
    def _prices_parse(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _checked_prices(value)

    def call_bound_s(self) -> float:
        """The longest a worker's model call can take on AWS: the Bedrock clients' connect and
        read timeouts, CountTokens' and Converse's (no SDK retries); the simulated model answers
        at once there."""
        if self.adapter == "bedrock":
            return bedrock_call_bound_s(self.bedrock.read_timeout_seconds)
        return 0.0


#: a model's name in the registry (``models.catalog``): what units and tenants name it by
MODEL_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
#: the most models one deployment registers: their quotas travel in the worker's, the fan-out's
#: and the API's environments (Lambda allows 4 KB for all of a function's variables)
MAX_MODELS = 8
#: the name of the one model a configuration without ``models`` describes (``quota_tpm``,
#: ``governor_share``, ``model.bedrock_model_id``, ``model.output_burndown``)
LEGACY_MODEL_NAME = "default"


def _checked_prices(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """A prices block as swarm.core.pricing parses it, or ValueError naming its key."""
    if value is not None:
        try:
            Prices.parse(value, "prices")
        except InvalidInput as e:
            raise ValueError(f"{e.field}: {e.message}") from None
    return value


class CatalogModelConfig(_Strict):
    """``models.catalog.<name>``: a model the fleet may call, with the quota Bedrock gives it in
    this account and region (Service Quotas: "On-demand model inference tokens per minute" and
    "requests per minute" for the model id, or for the cross-region inference profile)."""

    model_id: str = Field(pattern=r"^[a-z0-9.:-]+$")
    tpm: int = Field(ge=1, le=1_000_000_000)
    # requests per minute; null: not governed (tokens only)
    rpm: int | None = Field(default=None, ge=1, le=10_000_000, strict=True)
    # quota tokens one output token counts as; null: what Bedrock documents for the model id's
    # family (swarm.core.burndown)
    output_burndown: float | None = Field(default=None, ge=1, le=100, allow_inf_nan=False)
    # the share of the quota the fleet takes; null: the top-level governor_share
    governor_share: float | None = Field(default=None, gt=0, le=1)
    # The model's on-demand prices, US dollars per million tokens (at most 6 decimals), dated:
    # {"as_of": "YYYY-MM-DD", "input", "output", "cache_read", "cache_write"}. Absent: its
    # spend is counted in tokens only, and a batch's budget_usd is refused while any model lacks
    # them. The shipped ones (AWS's Bedrock pricing, read 2026-12-06, on-demand, us-east-1):
    # Claude 3.5 Haiku $0.80 in, $4.00 out; Claude Sonnet 4 $3.00 in, $15.00 out; cache writes
    # 1.25x and cache reads 0.1x of input.
    prices: dict[str, Any] | None = None

    @field_validator("prices")
    @classmethod
    def _prices_parse(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _checked_prices(value)

    @property
    def parsed_prices(self) -> Prices | None:
        """The prices as swarm.core.pricing keeps them (whole micro-dollars per million)."""
        return None if self.prices is None else Prices.parse(self.prices, "prices")

    @property
    def burndown(self) -> float:
        if self.output_burndown is not None:
            return float(self.output_burndown)
        return documented_burndown(self.model_id)


class ModelsConfig(_Strict):
    """``models``: the registry of the models units may name (``input.model``), and the one a
    unit without a name takes."""

    default: str
    catalog: dict[str, CatalogModelConfig] = Field(min_length=1, max_length=MAX_MODELS)

    @model_validator(mode="after")
    def _named(self) -> ModelsConfig:
        for name in self.catalog:
            if not MODEL_NAME.match(name):
                raise ValueError(
                    f"catalog.{name}: {name!r} is not a model name (lowercase letters, digits "
                    "and -, starting with a letter, at most 32)"
                )
        if self.default not in self.catalog:
            raise ValueError(
                f"default: {self.default!r} is not in catalog (models: "
                f"{', '.join(sorted(self.catalog))})"
            )
        seen: dict[str, str] = {}
        for name, entry in sorted(self.catalog.items()):
            other = seen.setdefault(entry.model_id, name)
            if other != name:
                raise ValueError(
                    f"catalog.{name}.model_id: {entry.model_id!r} is model {other!r}'s too: "
                    "Bedrock's quota is per model id, so one bucket must govern it (register it "
                    "once)"
                )
        return self


class ObservabilityConfig(_Strict):
    # the log groups' retention in days (one of CloudWatch Logs' values)
    log_retention_days: int
    # the handlers' Logger level (POWERTOOLS_LOG_LEVEL); Lambda's own filter stays at INFO
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"]
    # the alarms' SNS topic mails this address (none: the topic has no subscriber)
    alarm_email: str | None = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+$")
    # the governor saturation alarm's threshold
    governor_saturation_percent: float = Field(gt=0, le=100)

    @model_validator(mode="after")
    def _retention_allowed(self) -> ObservabilityConfig:
        if self.log_retention_days not in RETENTION_DAYS:
            raise ValueError(
                f"log_retention_days={self.log_retention_days} is not a CloudWatch Logs retention;"
                f" use one of {', '.join(str(d) for d in RETENTION_DAYS)}"
            )
        return self


#: A worker's own time per message besides the governor wait and the model call: the ledger's
#: reads and conditional writes, the governor's requests, a requeue; tens of milliseconds each
#: on AWS, seconds when DynamoDB conflicts make swarm.adapters.dynamodb.call back off.
WORKER_MESSAGE_OVERHEAD_S = 2.0
#: Lambda's longest function timeout.
LAMBDA_MAX_TIMEOUT_S = 900


class SwarmConfig(_Strict):
    # the stage: the stack is Swarm-<stage>
    stage: str = Field(pattern=r"^[a-z][a-z0-9-]{0,15}$")
    # The account's Lambda "Concurrent executions" quota in this region (Service Quotas): 1,000
    # is the usual one; new accounts often have 10. Synth checks the worker's concurrency fits.
    account_concurrency_limit: int = Field(default=1000, ge=1)
    # stages whose tables, queues, buckets and logs are retained, with deletion protection
    production_stages: tuple[str, ...]
    # the one model's quota of a configuration without ``models`` (with it: each model's tpm)
    quota_tpm: int | None = Field(default=None, ge=1, le=1_000_000_000)
    # the one model's requests per minute (null: requests not governed; with ``models``: each
    # model's rpm): the request bucket beside its tokens (docs/explanation/governor.md, "Requests
    # per minute")
    quota_rpm: int | None = Field(default=None, ge=1, le=100_000_000, strict=True)
    # the share of each model's quota the fleet takes (a model's own governor_share overrides)
    governor_share: float = Field(gt=0, le=1)
    # each governor bucket's capacity in tokens (null: one minute of the model's quota)
    governor_capacity_tokens: int | None = Field(default=None, ge=1)
    # per lane, the fraction of the bucket kept for the lanes above it
    lane_reserves: LaneReserves
    # per lane (high, normal, low): its event source mapping's concurrency, its shed depth
    lanes: LanesConfig
    worker: WorkerConfig
    # attempts per unit before it is dead-lettered, for a batch that names no max_attempts
    max_attempts: int = Field(ge=1, le=100)
    # the lanes' redrive maxReceiveCount (at least max_attempts: a governor wait returns a
    # message without an attempt)
    max_receive_count: int = Field(ge=1, le=1000)
    budget: BudgetConfig
    fanout: FanoutConfig
    api: ApiConfig
    results: ResultsConfig = ResultsConfig()
    uploads: UploadsConfig = UploadsConfig()
    # human gates: their timeout and who decides (docs/agents.md, "Human gates")
    approvals: ApprovalsConfig = ApprovalsConfig()
    tenants: TenantsConfig
    model: ModelConfig
    # the models units may name, each with its own quota (docs/explanation/governor.md, "Models");
    # absent: one model, from quota_tpm and model.bedrock_model_id (and model.output_burndown)
    models: ModelsConfig | None = None
    observability: ObservabilityConfig
    # the tool registry: name -> ToolConfig (docs/agents.md, "Tools"); tenants get tools by name
    # (tenants.defaults.tools, tenants.overrides.<tenant>.tools)
    tools: dict[str, ToolConfig] = Field(default_factory=dict)

    def _deciders_are_operators(self) -> None:
        """Each of ``approvals.deciders`` and of a tool's ``approval.deciders`` is an operator
        role (a name with the operator prefix, or such a role's ARN), never a tenant's: a tenant
        must not approve its own. A tool naming deciders is one the API knows by name (an mcp
        entry lists its tools), and they all fit the API function's environment."""
        prefix = self.api.operator_principal_prefix
        check_deciders("approvals.deciders", self.approvals.deciders, prefix)
        for name, entry in sorted(self.tools.items()):
            key = f"tools.{name}.approval.deciders"
            check_deciders(key, entry.deciders, prefix)
            if entry.deciders and entry.mcp is not None and entry.mcp.tools is None:
                raise ValueError(
                    f"{key}: an mcp entry naming deciders must list its tools (mcp.tools): the "
                    "API decides who may approve a call by its tool's name, and only the "
                    "worker learns what else the server lists"
                )
        size = len(self.tool_deciders_value().encode())
        if size > MAX_TOOL_DECIDERS_BYTES:
            raise ValueError(
                f"tools.*.approval.deciders: the tools' deciders take {size:,} bytes of the API "
                f"function's environment, more than {MAX_TOOL_DECIDERS_BYTES:,} (Lambda allows "
                "4 KB for all its variables): name fewer roles per tool, or leave the common "
                "ones to approvals.deciders"
            )

    def tool_deciders(self) -> dict[str, list[str]]:
        """Each gated tool whose entry names deciders -> their role names (an mcp entry's:
        each of its listed tools)."""
        out: dict[str, list[str]] = {}
        for name, entry in sorted(self.tools.items()):
            if not entry.deciders:
                continue
            names = sorted({role_name(given) for given in entry.deciders})
            tools = [name] if entry.mcp is None else list(entry.mcp.tools or ())
            for tool in tools:
                out[tool] = names
        return out

    def tool_deciders_value(self) -> str:
        """:data:`swarm.contract.APPROVAL_TOOL_DECIDERS`: compact, the tools that name deciders
        only, ``tool,tool=role,role;...`` (tools sharing their roles grouped); empty: none."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for tool, roles in self.tool_deciders().items():
            groups.setdefault(tuple(roles), []).append(tool)
        return ";".join(f"{','.join(tools)}={','.join(roles)}" for roles, tools in groups.items())

    @property
    def production(self) -> bool:
        """Production stages retain data and turn on deletion protection."""
        return self.stage in self.production_stages

    @property
    def visibility_timeout_seconds(self) -> int:
        """AWS's guidance for SQS-triggered Lambda: at least six times the function timeout."""
        return 6 * self.worker.timeout_seconds

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, key: str | None = None) -> SwarmConfig:
        """The settings as cdk.json's context gives them (``stage``, ``lanes``, ``worker``...),
        validated as synth validates them: :class:`ConfigError` names the key at fault (under
        ``key.`` when ``key`` says where they came from) and what is allowed."""
        return load_config(values, key=key)

    @classmethod
    def from_context(cls, scope: IConstructLike, *, key: str | None = None) -> SwarmConfig:
        """The settings in a CDK app's context (cdk.json and ``-c`` values), as this
        repository's app.py reads them: top-level keys, or those of the object at ``key`` (an
        app whose cdk.json holds its own keys too: ``"swarm": {"stage": "dev", ...}``)."""
        context = dict(scope.node.get_all_context())
        if key is None:
            return load_config(context)
        if key not in context:
            raise ConfigError(
                f"context key '{key}' is required: an object holding the control plane's "
                "settings (stage, lanes, worker, ...; docs/reference/config.md)"
            )
        values = _decode(key, context[key])
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"context key '{key}' must be an object of the control plane's settings "
                f"(got {type(values).__name__})"
            )
        return load_config(values, key=key)

    @model_validator(mode="after")
    def _consistent(self) -> SwarmConfig:
        if self.max_receive_count < self.max_attempts:
            raise ValueError(
                f"max_receive_count={self.max_receive_count} must be >= max_attempts="
                f"{self.max_attempts}: a governor wait returns a message without an attempt"
            )
        self._one_registry()
        self._concurrency_given_or_derived()
        self._concurrency_fits_the_account()
        self._tools_resolved()
        self._deciders_are_operators()
        if self.worker.governor_max_wait_seconds >= self.worker.timeout_seconds:
            raise ValueError(
                "worker.governor_max_wait_seconds must be below worker.timeout_seconds "
                f"({self.worker.governor_max_wait_seconds} >= {self.worker.timeout_seconds})"
            )
        if self.budget.default_tokens > self.budget.max_tokens:
            raise ValueError("budget.default_tokens must be <= budget.max_tokens")
        self._bundles_keep_their_tickets()
        self._request_buckets_hold_a_request()
        self._tenants_fit_the_deployment()
        self._models_granted()
        return self

    def _one_registry(self) -> None:
        """Either ``models``, or the one model of ``quota_tpm`` and ``model.bedrock_model_id``:
        never both, so that no quota is given twice."""
        legacy = {
            "quota_tpm": self.quota_tpm,
            "quota_rpm": self.quota_rpm,
            "model.bedrock_model_id": self.model.bedrock_model_id,
            "model.prices": self.model.prices,
            "model.output_burndown": self.model.output_burndown,
        }
        if self.models is not None:
            given = [key for key, value in legacy.items() if value is not None]
            if given:
                raise ValueError(
                    f"{given[0]}: with models, each model gives its own (models.catalog.<name>:"
                    " model_id, tpm, rpm, output_burndown, prices); leave it out"
                )
            return
        for key in ("quota_tpm", "model.bedrock_model_id"):
            if legacy[key] is None:
                raise ValueError(
                    f"{key} is required without models (or give models: a default and a "
                    "catalog of models, each with its model_id and tpm)"
                )

    @property
    def registry(self) -> ModelsConfig:
        """The models units may name: ``models``, or the one model the legacy keys give."""
        if self.models is not None:
            return self.models
        assert self.quota_tpm is not None and self.model.bedrock_model_id is not None
        one = CatalogModelConfig(
            model_id=self.model.bedrock_model_id,
            tpm=self.quota_tpm,
            rpm=self.quota_rpm,
            output_burndown=self.model.output_burndown,
            prices=self.model.prices,
        )
        return ModelsConfig(default=LEGACY_MODEL_NAME, catalog={LEGACY_MODEL_NAME: one})

    def governor_config(self, name: str) -> GovernorConfig:
        """Model ``name``'s governor (its quota tokens' bucket), as the workers run it."""
        entry = self.registry.catalog[name]
        share = self.governor_share if entry.governor_share is None else entry.governor_share
        return GovernorConfig(
            entry.tpm,
            share,
            capacity=self.governor_capacity_tokens,
            output_burndown=entry.burndown,
            rpm=entry.rpm,
        )

    def prices_env(self) -> str:
        """:data:`swarm.contract.MODEL_PRICES`: each registered model's prices by its name;
        empty when no model has any."""
        table = {
            name: prices
            for name, entry in self.registry.catalog.items()
            if (prices := entry.parsed_prices) is not None
        }
        return prices_table_to_env(table) if table else ""

    def models_value(self) -> str:
        """:data:`swarm.contract.MODELS`: the registry as the functions read it, compact JSON."""
        registry = self.registry
        catalog = {}
        for name, entry in sorted(registry.catalog.items()):
            governor = self.governor_config(name)
            catalog[name] = {
                "model_id": entry.model_id,
                "tpm": entry.tpm,
                "rpm": entry.rpm,
                "share": governor.share,
                "burndown": governor.output_burndown,
            }
        doc = {"default": registry.default, "catalog": catalog}
        return json.dumps(doc, separators=(",", ":"))

    def _models_granted(self) -> None:
        """Every tenant's models are registered, listed once, and include the default (a unit
        that names no model takes it)."""
        registry = self.registry
        granted = [("tenants.defaults.models", self.tenants.defaults.models)]
        granted += [
            (f"tenants.overrides.{name}.models", override.models)
            for name, override in sorted(self.tenants.overrides.items())
        ]
        for key, names in granted:
            if names is None:
                continue
            for i, name in enumerate(names):
                if name not in registry.catalog:
                    known = ", ".join(sorted(registry.catalog))
                    raise ValueError(
                        f"{key}[{i}]: {name!r} is not a model of the registry (models: {known})"
                    )
            if len(set(names)) != len(names):
                raise ValueError(f"{key}: lists a model twice ({list(names)})")
            if registry.default not in names:
                raise ValueError(
                    f"{key}: must include the default model {registry.default!r} (a unit that "
                    "names no model takes it)"
                )

    def _bundles_keep_their_tickets(self) -> None:
        """A bundle is delayed until its last unit is due: its first unit presents its ticket
        (or place) up to the longest window late. The governor honours one at most the time its
        bucket takes to fill after its ready time (docs/explanation/governor.md): a longer window
        would throw the first units' bookings away."""
        longest = self.worker.longest_bundle_window_seconds
        for name in sorted(self.registry.catalog):
            governor = self.governor_config(name)
            capacity, grace = governor.bucket_capacity, governor.fill_s
            if longest <= grace:
                continue
            key = "max_window" if self.worker.bundle_max_window_seconds is not None else "window"
            raise ValueError(
                f"worker.bundle_{key}_seconds={longest:g} is above {grace:.1f} s, the time "
                f"model {name!r}'s governor bucket ({capacity:,.0f} tokens) takes to fill at "
                f"{governor.quota_tpm} TPM x governor_share={governor.share}: the governor "
                "honours a booking at most that long after it is ready, and a bundle's first "
                "unit would present its booking later; lower the window or raise "
                "governor_capacity_tokens"
            )

    def _request_buckets_hold_a_request(self) -> None:
        """Each model's rpm x share must hold one request above every lane's reserve."""
        reserves = {lane: self.lane_reserves.of(lane) for lane in LANES}
        for name, entry in sorted(self.registry.catalog.items()):
            if entry.rpm is None:
                continue
            key = "quota_rpm" if self.models is None else f"models.catalog.{name}.rpm"
            try:
                replace(self.governor_config(name), reserves=reserves)
            except InvalidInput as e:
                raise ValueError(f"{key}: {e.message}") from None

    def _tenants_fit_the_deployment(self) -> None:
        """A tenant's budget per batch within the deployment's (a cap in dollars only: its
        models priced); its guaranteed share within the lowest lane's ceiling it may use (else
        the share would be the ceiling's, not its own)."""
        names = ["defaults", *(f"overrides.{name}" for name in sorted(self.tenants.overrides))]
        for label in names:
            tenant = label.removeprefix("overrides.")
            limits = self.tenants.defaults if label == "defaults" else self.tenants.of(tenant)
            cap = limits.max_budget_per_batch
            if cap is not None and cap > self.budget.max_tokens:
                raise ValueError(
                    f"tenants.{label}.max_budget_per_batch={cap} is above budget.max_tokens="
                    f"{self.budget.max_tokens}: no batch may have more than the deployment's "
                    "maximum"
                )
            if limits.max_budget_usd_per_batch is not None and cap is None:
                # capped in dollars only, its budgets must be in dollars: every model it may
                # use needs prices, or its units on that model could never be submitted
                usable = limits.models or tuple(self.registry.catalog)
                unpriced = [m for m in usable if self.registry.catalog[m].prices is None]
                if unpriced:
                    where = (
                        "model.prices"
                        if self.models is None
                        else f"models.catalog.{unpriced[0]}.prices"
                    )
                    raise ValueError(
                        f"tenants.{label}.max_budget_usd_per_batch: the tenant's budgets must be "
                        f"in dollars (it has no max_budget_per_batch), but model "
                        f"{unpriced[0]!r} has no prices ({where}): give the model prices, or "
                        "the tenant a cap in tokens too"
                    )
            ceilings = [self.lanes.of(lane).shed_depth for lane in limits.lanes]
            if limits.guaranteed_units > min(ceilings):
                raise ValueError(
                    f"tenants.{label}.guaranteed_units={limits.guaranteed_units} is above "
                    f"{min(ceilings)}, the shed_depth of the lowest lane it may use: a share "
                    "larger than the lanes' ceiling would switch the ceiling off"
                )

    def sizing(self) -> FleetSizing | None:
        """The fleet ``worker.concurrency: "auto"`` derives (None when it is given by hand):
        :func:`swarm.core.scheduling.size_fleet`, the arithmetic ``swarm plan`` prints."""
        profile = self.worker.unit_profile
        if self.worker.concurrency != "auto" or profile is None:
            return None
        # every model's governed rate: the fleet serves them all
        rate = sum(
            GovernorConfig(c.quota_tpm, c.share).rate
            for c in map(self.governor_config, self.registry.catalog)
        )
        return size_fleet(rate, UnitProfile(**profile.model_dump()))

    def lane_concurrency(self, lane: Lane) -> int:
        """The lane's event source mapping's ``MaximumConcurrency``, given or derived."""
        sizing = self.sizing()
        if sizing is not None:
            return sizing.per_lane
        given = self.lanes.of(lane).max_concurrency
        assert given is not None  # _concurrency_given_or_derived
        return given

    @property
    def reserved_concurrency(self) -> int | None:
        """The worker function's reserved concurrency, given or derived (None: unreserved)."""
        sizing = self.sizing()
        return self.worker.reserved_concurrency if sizing is None else sizing.reserved

    def _concurrency_given_or_derived(self) -> None:
        """By hand, every lane's ``max_concurrency``; with ``worker.concurrency: "auto"``,
        none of them, no ``worker.reserved_concurrency``, a ``worker.unit_profile``, and a
        derived fleet that fits the account."""
        given = [lane.value for lane in LANES if self.lanes.of(lane).max_concurrency is not None]
        if self.worker.concurrency != "auto":
            missing = [lane.value for lane in LANES if lane.value not in given]
            if missing:
                raise ValueError(
                    f"lanes.{missing[0]}.max_concurrency is required: give every lane's "
                    'max_concurrency, or set worker.concurrency to "auto" (with '
                    "worker.unit_profile) to derive them from the quota"
                )
            return
        if given:
            raise ValueError(
                'worker.concurrency "auto" derives lanes.*.max_concurrency: leave out '
                f"lanes.{given[0]}.max_concurrency, or set worker.concurrency to null"
            )
        if self.worker.reserved_concurrency is not None:
            raise ValueError(
                'worker.concurrency "auto" derives worker.reserved_concurrency: leave it out '
                "(or null), or set worker.concurrency to null"
            )
        if self.worker.unit_profile is None:
            raise ValueError(
                'worker.concurrency "auto" needs worker.unit_profile ({"mean_tokens", '
                '"mean_seconds", "small_tokens", "small_seconds"}): `swarm plan` prints it '
                "for your workload"
            )
        sizing = self.sizing()
        assert sizing is not None
        problem = sizing.problem(self.account_concurrency_limit)
        if problem is not None:
            raise ValueError(
                f'worker.concurrency "auto" derives {sizing.per_lane} workers per lane from '
                "the models' quotas (quota_tpm or models.catalog.*.tpm), governor_share and "
                f"worker.unit_profile (N* = {sizing.n_star}), which does not fit: {problem}; "
                "set account_concurrency_limit to this account's Lambda 'Concurrent "
                "executions' quota (Service Quotas) if it is higher, or give "
                "lanes.*.max_concurrency and worker.reserved_concurrency by hand"
            )

    def concurrency_budget(self) -> ConcurrencyBudget:
        """Every concurrent execution the stack can start, and the pool each comes from."""
        limit, reserved = self.account_concurrency_limit, self.reserved_concurrency
        counted: list[Demand] = []
        if reserved is None:  # the workers draw from the same pool as everything else
            for lane in LANES:  # given by hand ("auto" always reserves)
                key, peak = f"lanes.{lane.value}.max_concurrency", self.lane_concurrency(lane)
                counted.append(
                    Demand(f"{lane.value} lane workers", peak, key, MAPPING_CONCURRENCY[0])
                )
            pool, label = limit, f"account_concurrency_limit={limit}"
        else:
            pool = limit - reserved
            label = (
                f"the {pool} left unreserved (account_concurrency_limit={limit} - "
                f"worker.reserved_concurrency={reserved})"
            )
        counted += [
            Demand(
                "map children of a fanning-out batch",
                self.fanout.max_concurrency,
                "fanout.max_concurrency",
                1,
            ),
            Demand(
                # API Gateway lets the burst through at once, then the rate per second: with
                # requests under a second (all but a large manifest's submit), that many at once
                "API requests at once",
                max(self.api.throttle_burst_limit, math.ceil(self.api.throttle_rate_limit)),
                "api.throttle_burst_limit",
                1,
            ),
            Demand(
                "dead-letter workers",
                DLQ_MAPPING_CONCURRENCY,
                "its mapping's least",
                DLQ_MAPPING_CONCURRENCY,
                fixed=True,
            ),
        ]
        return ConcurrencyBudget(pool, label, tuple(counted), RETRIED_WHEN_THROTTLED)

    def resolved_tools(self) -> dict[str, ResolvedTool]:
        """Every tool of the registry, its source's defaults filled in, a toolset's tools each
        under its own name (sorted by name)."""
        resolved: dict[str, ResolvedTool] = {}
        for name in sorted(self.tools):
            entry = self.tools[name]
            if entry.mcp is not None:
                continue  # its tools are the server's (mcp_servers)
            tools = toolset_tools(name, entry) if entry.toolset else [resolve_tool(name, entry)]
            for tool in tools:
                if tool.name in resolved:
                    raise ValueError(
                        f"tools.{name}: registers the tool {tool.name!r}, which another entry "
                        "registers too: a tool name must be unique"
                    )
                resolved[tool.name] = tool
        return dict(sorted(resolved.items()))

    def mcp_servers(self) -> dict[str, McpConfig]:
        """The registry's MCP servers by entry name, checked (their listed tools' names unique
        among every tool's)."""
        servers = {
            name: check_mcp(name, entry, self.stage == "local")
            for name, entry in sorted(self.tools.items())
            if entry.mcp is not None
        }
        taken = {tool: f"tools.{tool}" for tool in self.resolved_tools()}
        for name, server in servers.items():
            for i, tool in enumerate(server.tools or ()):
                if tool in taken or tool in servers:
                    raise ValueError(
                        f"tools.{name}.mcp.tools[{i}]: {tool!r} is registered by another entry "
                        f"too ({taken.get(tool, f'tools.{tool}')}): a tool name must be unique"
                    )
                taken[tool] = f"tools.{name}.mcp"
        return servers

    def mcp_secrets(self) -> list[str]:
        """The secrets (names or ARNs) the MCP servers' auth headers are in."""
        secrets = {s.auth_secret for s in self.mcp_servers().values() if s.auth_secret}
        return sorted(secrets)

    def granted_tools(self, names: tuple[str, ...]) -> list[str]:
        """A tenant's ``tools`` list with each toolset's name replaced by its tools."""
        out: list[str] = []
        for name in names:
            entry = self.tools.get(name)
            if entry is not None and entry.toolset:
                out += [t.name for t in toolset_tools(name, entry)]
            else:
                out.append(name)
        return out

    def tool_sources(self) -> dict[str, list[str]]:
        """Each source module the stack builds a function for, and the tools it serves."""
        sources: dict[str, list[str]] = {}
        for tool in self.resolved_tools().values():
            if tool.source is not None:
                sources.setdefault(tool.source, []).append(tool.name)
        return sources

    def tool_registry_value(self, arns: Mapping[str, str]) -> str:
        """:data:`swarm.contract.TOOL_REGISTRY`, compact JSON: each source's function ARN
        (``arns``, by source), each tool's timeout and either its source or its ARN, and of its
        spec only what the source does not declare (a source's declarations are in the asset,
        which the worker reads: swarm.adapters.tools), each toolset as its source and timeout,
        and the tenants' grants."""
        tools: dict[str, dict[str, Any]] = {}
        toolsets: dict[str, dict[str, Any]] = {}
        mcp: dict[str, dict[str, Any]] = {}
        for name, entry in sorted(self.tools.items()):
            if entry.toolset:
                toolsets[name] = {"source": entry.source, "timeout": entry.timeout_seconds}
                continue
            if entry.mcp is not None:
                server: dict[str, Any] = {"url": entry.mcp.url, "timeout": entry.timeout_seconds}
                if entry.mcp.tools is not None:
                    server["tools"] = list(entry.mcp.tools)
                if entry.mcp.auth_secret is not None:
                    server["secret"] = entry.mcp.auth_secret
                if entry.effect is not None:
                    server["effect"] = entry.effect
                if entry.gated:
                    server["approval"] = "required"
                mcp[name] = server
                continue
            tool = resolve_tool(name, entry)
            if tool.source is not None:
                given = {
                    field: getattr(entry, field)
                    for field in ("description", "input_schema", "effect")
                    if getattr(entry, field) is not None
                }
                tools[name] = {"source": tool.source, "timeout": tool.timeout_seconds, **given}
                if entry.gated:
                    tools[name]["approval"] = "required"
            else:
                tools[name] = {
                    "arn": tool.function_arn,
                    "timeout": tool.timeout_seconds,
                    "effect": tool.effect,
                    "description": tool.description,
                    "input_schema": tool.input_schema,
                    **({"approval": "required"} if entry.gated else {}),
                }
        doc = {
            "functions": {source: arns[source] for source in self.tool_sources()},
            "tools": tools,
            "toolsets": toolsets,
            "grants": self._tool_grants(),
        }
        if mcp:
            doc["mcp"] = mcp
        return json.dumps(doc, separators=(",", ":"))

    def tool_grants_value(self) -> str:
        """:data:`swarm.contract.TOOL_GRANTS`: the tools' names, each toolset's source (its
        names are its declarations') and the tenants' grants (a toolset by its name)."""
        toolsets = {
            name: entry.source for name, entry in sorted(self.tools.items()) if entry.toolset
        }
        plain = sorted(
            name for name, entry in self.tools.items() if not entry.toolset and entry.mcp is None
        )
        doc: dict[str, Any] = {"tools": plain, "toolsets": toolsets, "grants": self._tool_grants()}
        servers = {
            name: None if server.tools is None else list(server.tools)
            for name, server in self.mcp_servers().items()
        }
        if servers:  # an entry's listed tools, or null: every tool it lists (the worker checks)
            doc["mcp"] = servers
        return json.dumps(doc, separators=(",", ":"))

    def _tool_grants(self) -> dict[str, Any]:
        tenants = self.tenants
        overrides = {
            name: list(override.tools)
            for name, override in sorted(tenants.overrides.items())
            if override.tools is not None
        }
        return {"defaults": list(tenants.defaults.tools), "overrides": overrides}

    def _tools_resolved(self) -> None:
        resolved = self.resolved_tools()  # raises naming tools.<name>.<field>
        granted = [("tenants.defaults.tools", self.tenants.defaults.tools)]
        granted += [
            (f"tenants.overrides.{name}.tools", override.tools)
            for name, override in sorted(self.tenants.overrides.items())
            if override.tools is not None
        ]
        toolsets = {name for name, entry in self.tools.items() if entry.toolset}
        servers = self.mcp_servers()  # raises naming tools.<name>.mcp...
        for key, names in granted:
            for i, name in enumerate(names):
                if name not in resolved and name not in toolsets and name not in servers:
                    known = (
                        ", ".join([*resolved, *sorted(toolsets), *servers])
                        or "none: the registry is empty"
                    )
                    listed = [m for m, s in servers.items() if name in (s.tools or ())]
                    if listed:
                        raise ValueError(
                            f"{key}[{i}]: {name!r} is a tool of the MCP entry {listed[0]!r}: "
                            f"grant the entry's name ({listed[0]!r}), which gives all its tools"
                        )
                    raise ValueError(
                        f"{key}[{i}]: {name!r} is not a tool of the registry (tools: {known})"
                    )
            expanded = self.granted_tools(names)
            if len(set(expanded)) != len(expanded):
                raise ValueError(f"{key}: lists a tool twice ({list(names)})")
        size = self.tool_registry_bytes()
        if size > MAX_TOOL_REGISTRY_BYTES:
            raise ValueError(
                f"tools: the registry takes up to {size:,} bytes of the worker's environment, "
                f"more than {MAX_TOOL_REGISTRY_BYTES:,} (Lambda allows 4 KB for all its "
                "variables): shorten the tools' descriptions and input schemas, or register "
                "fewer tools"
            )

    def tool_registry_bytes(self) -> int:
        """The most :data:`~swarm.contract.TOOL_REGISTRY` may take: its JSON with every source's
        function ARN at its longest (0 without tools: the variable is left empty)."""
        if not self.tools:
            return 0
        placeholder = "a" * LONGEST_FUNCTION_ARN
        return len(self.tool_registry_value(dict.fromkeys(self.tool_sources(), placeholder)))

    def _concurrency_fits_the_account(self) -> None:
        """Refuse a concurrency the account cannot give.

        Reserving concurrency fails to deploy when it would leave less than 100 unreserved.
        Each lane's event source mapping runs up to its ``max_concurrency`` workers at once
        (``MaximumConcurrency``), out of the reservation (or, unreserved, the account's pool):
        beyond it Lambda throttles, and a throttled SQS delivery counts as a receive, so units
        that never ran would reach their dead-letter queue. Every other function draws from the
        unreserved pool: the Distributed Map's children (``fanout.max_concurrency`` fan-out
        invocations at once; a throttled child spends its Express 5 minutes and the map's
        tolerated failures), the API (a throttle is a 5xx to the caller) and the dead-letter
        mapping must fit it beside the workers (:meth:`concurrency_budget`).
        """
        limit = self.account_concurrency_limit
        lanes_total = sum(self.lane_concurrency(lane) for lane in LANES)
        lanes_sum = " + ".join(str(self.lane_concurrency(lane)) for lane in LANES)
        reserved = self.reserved_concurrency
        if reserved is not None:
            reservable = max(0, limit - UNRESERVED_MINIMUM)
            if reserved > reservable:
                raise ValueError(
                    f"worker.reserved_concurrency={reserved} does not fit "
                    f"account_concurrency_limit={limit}: Lambda keeps {UNRESERVED_MINIMUM} "
                    f"concurrent executions unreserved, so at most {reservable} can be reserved; "
                    "set worker.reserved_concurrency to null (unreserved), or "
                    "account_concurrency_limit to this account's Lambda 'Concurrent executions' "
                    "quota (Service Quotas)"
                )
            if lanes_total > reserved:
                raise ValueError(
                    f"the lanes' max_concurrency add up to {lanes_total} ({lanes_sum}), more than "
                    f"worker.reserved_concurrency={reserved}: the workers would be throttled and "
                    "units dead-lettered without running; lower lanes.*.max_concurrency or raise "
                    "worker.reserved_concurrency (or set it to null)"
                )
        budget = self.concurrency_budget()
        if budget.total <= budget.pool:
            return
        fit = budget.propose()
        if fit is None:
            advice = (
                f"no values fit: at their least they need {budget.floor} (an event source mapping "
                f"runs at least {MAPPING_CONCURRENCY[0]}); request a higher 'Concurrent "
                "executions' quota (Service Quotas)"
                + ("" if reserved is None else ", or lower worker.reserved_concurrency")
            )
        else:
            api = fit.get("api.throttle_burst_limit")
            if api is not None and api < self.api.throttle_rate_limit:
                fit["api.throttle_rate_limit"] = api  # the steady rate also starts requests
            advice = "values that fit: " + ", ".join(f"{k}={v}" for k, v in fit.items())
        raise ValueError(
            f"the concurrent executions a throttle would hurt add up to {budget.total} "
            f"({budget.explain()}), more than {budget.label}: throttled lane deliveries "
            "dead-letter units that never ran, throttled map children fail the fan-out "
            f"(FanOutFailed), throttled API calls fail; {advice} (docs/how-to/small-accounts.md); "
            "or set account_concurrency_limit to this account's Lambda 'Concurrent executions' "
            "quota (Service Quotas) if it is higher"
        )


#: The lanes' dead-letter queue's event source mapping: SQS's least MaximumConcurrency.
DLQ_MAPPING_CONCURRENCY = MAPPING_CONCURRENCY[0]


@dataclass(frozen=True)
class Demand:
    """Concurrent executions a part of the stack can start at once, the key that sets it, and
    the least it can be set to."""

    what: str
    peak: int
    key: str
    floor: int = 0
    fixed: bool = False  # not a context key: the stack sets it


#: Functions whose throttles are retried without losing anything, at their expected peak: the
#: finalizer (one invocation per execution at a time; the state machine retries
#: Lambda.TooManyRequestsException, then the sweeper repairs the run), the sweeper (one
#: invocation per schedule tick, EventBridge's asynchronous invoke, which Lambda retries) and the
#: drain controller (one per switch flip, asynchronous too). They are listed, not counted: they
#: take what the counted ones leave (docs/how-to/small-accounts.md).
RETRIED_WHEN_THROTTLED = (
    Demand("the finalizer (retried by the state machine)", 1, "one per closing batch"),
    Demand("the sweeper (asynchronous, retried)", 1, "one per schedule tick"),
    Demand("the drain controller (asynchronous, retried)", 1, "one per switch flip"),
)


@dataclass(frozen=True)
class ConcurrencyBudget:
    """The counted demands on the pool they share (the account's, or what the worker's
    reservation leaves), and the retried ones beside them."""

    pool: int
    label: str
    counted: tuple[Demand, ...]
    retried: tuple[Demand, ...]

    @property
    def total(self) -> int:
        return sum(d.peak for d in self.counted)

    @property
    def floor(self) -> int:
        """The least the counted demands can be lowered to."""
        return sum(d.floor for d in self.counted)

    def explain(self) -> str:
        counted = " + ".join(f"{d.peak} {d.what} ({d.key})" for d in self.counted)
        retried = sum(d.peak for d in self.retried)
        return f"{counted}; not counted: {retried} for functions retried when throttled"

    def propose(self) -> dict[str, int] | None:
        """The configured values lowered until they fit the pool, the largest first (of equal
        ones the last: so a higher lane stays at least as large as a lower one), none below its
        floor; None when even the floors do not fit."""
        if self.floor > self.pool:
            return None
        peaks = [d.peak for d in self.counted]
        while sum(peaks) > self.pool:
            lowerable = [i for i, d in enumerate(self.counted) if peaks[i] > d.floor]
            top = max(peaks[i] for i in lowerable)
            peaks[max(i for i in lowerable if peaks[i] == top)] -= 1
        return {d.key: p for d, p in zip(self.counted, peaks, strict=True) if not d.fixed}


def worker_timing_problem(config: SwarmConfig) -> str | None:
    """Why the worker's batch cannot fit its Lambda timeout, or None.

    A worker runs its SQS batch's messages at once (functions/worker.py), and each message may
    wait for the governor up to ``governor_max_wait_seconds`` and then for the model up to its
    call bound, so the batch takes as long as its slowest message. A worker that Lambda times
    out mid-batch reports nothing, so SQS redelivers the whole batch after the lanes' visibility
    timeout (six worker timeouts), finished messages included: every unit of it waits minutes,
    and the ones that ran find their attempt settled or, if they were mid-call, retry with the
    lost attempt's tokens settled.
    """
    worker, model = config.worker, config.model
    wait, call = worker.governor_max_wait_seconds, model.call_bound_s()
    per_message = wait + call + WORKER_MESSAGE_OVERHEAD_S
    if per_message <= worker.timeout_seconds:
        return None
    terms = [f"worker.governor_max_wait_seconds={wait:g}"]
    if model.adapter == "bedrock":
        terms.append(f"model.bedrock.read_timeout_seconds={model.bedrock.read_timeout_seconds}")
        terms.append(f"{BEDROCK_CONNECT_TIMEOUT_S:g} s to connect")
        count = call - model.bedrock.read_timeout_seconds - BEDROCK_CONNECT_TIMEOUT_S
        terms.append(f"{count:g} s to count the input's tokens")
    terms.append(f"{WORKER_MESSAGE_OVERHEAD_S:g} s of ledger and governor calls")
    problem = (
        f"a message of the worker's batch may take {' + '.join(terms)} = {per_message:,.0f} s, "
        f"more than worker.timeout_seconds={worker.timeout_seconds} (the batch's messages run "
        "at once): a worker timed out mid-batch returns the whole SQS batch for redelivery, "
        "finished units included"
    )
    lower = "lower worker.governor_max_wait_seconds" + (
        " or model.bedrock.read_timeout_seconds" if model.adapter == "bedrock" else ""
    )
    if per_message > LAMBDA_MAX_TIMEOUT_S:
        return f"{problem}; that is more than Lambda's {LAMBDA_MAX_TIMEOUT_S} s: {lower}"
    needed = math.ceil(per_message)
    return f"{problem}; raise worker.timeout_seconds to {needed} or more, or {lower}"


#: The finalizer function's timeout (its open step stops 60 s before it).
FINALIZER_TIMEOUT_S = 300


def fanout_definition_numbers(config: SwarmConfig) -> dict[str, str]:
    """The numbers statemachines/fanout.asl.json takes from the context (``${...}``)."""
    return {
        "MaxConcurrency": str(config.fanout.max_concurrency),
        "ToleratedFailurePercentage": str(config.fanout.tolerated_failure_percentage),
        "FinalizerPollSeconds": str(config.fanout.finalizer_poll_seconds),
        "FinalizerMaxPollSeconds": str(config.fanout.finalizer_max_poll_seconds),
        "MaxPollsPerExecution": str(config.fanout.finalizer_polls_per_execution),
    }


def express_child_problem(config: SwarmConfig, definition: Path = FANOUT_ASL) -> str | None:
    """Why the Distributed Map's Express child can outlast Express's 5 minutes, or None.

    The child's worst case is derived from the ASL (:mod:`infra.timing`): every attempt its
    retriers allow, each up to the fan-out function's timeout plus INIT, and every retry pause
    at its longest. An Express execution past 300 s is stopped: its chunk counts as a failed
    item towards ``fanout.tolerated_failure_percentage``."""
    machine = parse_definition(definition.read_text(), fanout_definition_numbers(config))
    child = machine["States"]["FanOut"]["ItemProcessor"]
    timeouts = {
        "${FanoutFunctionArn}": (float(config.fanout.timeout_seconds), "fanout.timeout_seconds"),
        "${FinalizerFunctionArn}": (float(FINALIZER_TIMEOUT_S), "the finalizer's timeout"),
    }
    try:
        budget = machine_budget(child, timeouts)
    except TimingError as error:
        return f"the map's child in {definition.name} cannot be bounded: {error}"
    if budget.total_s <= EXPRESS_MAX_SECONDS:
        return None
    return (
        f"the map's Express child may run {budget.total_s:g} s in the worst case "
        f"({budget.explain()}), more than Express's {EXPRESS_MAX_SECONDS} s: Step Functions "
        "stops it and its chunk counts as a failed item; lower fanout.timeout_seconds, or the "
        "MaxAttempts, IntervalSeconds, BackoffRate or MaxDelaySeconds of its retriers in "
        f"statemachines/{definition.name} (FanOut.ItemProcessor)"
    )


def api_timing_problem(config: SwarmConfig) -> str | None:
    """Why the API function can outlast API Gateway's 29 s integration timeout, or None.

    Its retries (botocore's, the adapters' backoff on a conflict) all run inside its Lambda
    timeout, which Lambda enforces; a cold start adds INIT (at most 10 s) before it. Past 29 s
    API Gateway answers 504 while the function goes on, so a caller may retry a submission that
    is being accepted."""
    worst = config.api.timeout_seconds + LAMBDA_INIT_MAX_S
    if worst <= API_GATEWAY_INTEGRATION_TIMEOUT_S:
        return None
    most = API_GATEWAY_INTEGRATION_TIMEOUT_S - LAMBDA_INIT_MAX_S
    return (
        f"api.timeout_seconds={config.api.timeout_seconds} + {LAMBDA_INIT_MAX_S} s of Lambda "
        f"INIT = {worst} s, more than API Gateway's {API_GATEWAY_INTEGRATION_TIMEOUT_S} s "
        f"integration timeout (the caller would get a 504 while the function goes on); set "
        f"api.timeout_seconds to {most} or less"
    )


CONFIG_KEYS = tuple(SwarmConfig.model_fields)

# Context keys that are not ours: CDK feature flags ("@aws-cdk/..."), CDK's own ("aws:cdk:...",
# "cli-telemetry", "acknowledged-issue-numbers"...) and lookups ("availability-zones:..."); and
# the staging of index changes, which infra/indexes.py reads and checks (deployed_indexes...).
_FOREIGN_KEYS = frozenset(
    {"cli-telemetry", "acknowledged-issue-numbers", "deployed_indexes", "index_rollout"}
)


def _decode(key: str, value: Any) -> Any:
    """`cdk -c lanes='{...}'` passes a string: decode JSON for keys whose value is structured."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            raise ConfigError(f"context key '{key}': not valid JSON ({error.msg})") from None
    if isinstance(value, str) and value == "null":
        return None
    return value


def load_config(context: Mapping[str, Any], *, key: str | None = None) -> SwarmConfig:
    """Validate the swarm keys of a CDK context; raise :class:`ConfigError` naming the key
    (``<key>.<name>`` when the settings are the object at context key ``key``)."""
    where = f"{key}." if key else ""
    unknown = sorted(
        key
        for key in context
        if key not in CONFIG_KEYS
        and key not in _FOREIGN_KEYS
        and not key.startswith(("@", "aws:", "aws-cdk:"))
        and ":" not in key
    )
    if unknown:
        raise ConfigError(
            f"unknown context key(s): {', '.join(where + k for k in unknown)}; allowed keys: "
            f"{', '.join(CONFIG_KEYS)}"
        )
    values = {name: _decode(where + name, context[name]) for name in CONFIG_KEYS if name in context}
    try:
        config = SwarmConfig.model_validate(values)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            key = ".".join(str(part) for part in item["loc"]) or "(context)"
            message = item["msg"].removeprefix("Value error, ")
            head, colon, rest = message.partition(": ")
            across = ("tools", "tenants.", "quota_tpm", "quota_rpm", "model", "approvals.")
            if key == "(context)" and colon and head.startswith(across):
                key, message = head, rest  # a check across keys that names the key at fault
            elif colon and head.startswith(f"{key}."):
                key, message = head, rest  # a check of a block that names its field
            elif colon and "." in head and f".{key}".endswith(f".{head.split('.')[0]}"):
                # a block's check that names its field from the block's own name (a model's
                # prices: models.catalog.<name>.prices + prices.input)
                key, message = key[: len(key) - len(head.split(".")[0])] + head, rest
            if where:
                key = where + key if key != "(context)" else where.rstrip(".")
            if item["type"] == "missing":
                problems.append(f"context key '{key}' is required")
            elif isinstance(item.get("input"), dict):
                problems.append(f"context key '{key}': {message}")
            else:
                problems.append(f"context key '{key}': {message} (got {item.get('input')!r})")
        raise ConfigError("invalid cdk.json context: " + "; ".join(problems)) from None
    check_config(config)
    return config


def check_config(config: SwarmConfig) -> None:
    """The checks across the configuration and the state machine's definition that the model's
    own validators do not run (the worker's, the map child's and the API's timing):
    :class:`ConfigError` naming the key. SwarmControlPlane runs them on any config it gets."""
    for check in (worker_timing_problem, express_child_problem, api_timing_problem):
        timing = check(config)
        if timing is not None:
            raise ConfigError(f"invalid cdk.json context: {timing}")
