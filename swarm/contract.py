"""The contract between the infrastructure, the Lambda functions, the CLI and the tests: every
name more than one of them must agree on, in one place.

- the functions, and the environment variables the stack sets on each (:data:`FUNCTION_ENV`; a
  test in ``tests/infra`` checks the synthesized template against it, and each function validates
  its environment at cold start with :mod:`swarm.settings`);
- the drain switch: its parameter's name per stage and its two values;
- the metrics the alarms watch, and their namespace;
- the stack outputs the CLI and the local stack read.

Plain names only: no boto3, no pydantic; importable by every layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from swarm.core.errors import InvalidInput
from swarm.core.records import LANES, Lane

SERVICE: Final = "swarm"  # Powertools' service name, the dimension of every metric
METRICS_NAMESPACE: Final = "Swarm"

# --- the ledger's sparse index of the runs the sweeper watches (infra declares it, the adapter
# in swarm/adapters/dynamodb_watch.py writes and queries it) -----------------------------------
OPEN_RUNS_INDEX: Final = "OpenRuns"
WATCH: Final = "watch"  # S, the index's partition key: present while the run is watched
SWEEP_AT: Final = "sweep_at"  # N, its sort key: when the sweeper looks at the run next
EXECUTION: Final = "execution"  # projected: the execution that last reached the finalize loop
REPAIRS: Final = "repairs"  # projected: how many times the sweeper restarted the run

# --- the ledger's sparse index of each tenant's watched runs (the API's per-tenant queue cap:
# swarm.core.tenancy; written with the watch attributes above, never by the hot paths) ---------
TENANT_RUNS_INDEX: Final = "TenantRuns"
OPEN_TENANT: Final = "open_tenant"  # S, the index's partition key: the run's tenant, while watched

# --- the ledger's sparse index of the leases units hold (the finalizer's lease sweep:
# DynamoDBLedger.expired_leases). Its partition key is the table's own ``pk`` (the run) and its
# sort key the unit's lease expiry, an attribute only a unit holding a reservation has: every
# write that takes, renews or ends a lease already sets or removes it, so the index follows ---
LEASES_INDEX: Final = "Leases"
LEASE_EXPIRY: Final = "res_lease"  # N, the index's sort key: when the lease sweep looks at the unit

# --- Bedrock's client timeouts (the adapter uses them; infra checks the worker timeout against
# them at synth) --------------------------------------------------------------------------------
#: ceil(4,096 / 30) + 30 = 167 s, rounded up: a Converse call that generates the longest answer
#: at the slowest rate (30 output tokens/s, 30 s to a first token) still arrives in time
BEDROCK_DEFAULT_READ_TIMEOUT_S: Final = 180
#: to open the HTTPS connection; nothing reaches the model before it
BEDROCK_CONNECT_TIMEOUT_S: Final = 10
#: CountTokens (the input's tokens, when the reservation is tight) has a client of its own with
#: short timeouts: it answers without generating, and a slow count falls back to an upper bound
BEDROCK_COUNT_CONNECT_TIMEOUT_S: Final = 2
BEDROCK_COUNT_READ_TIMEOUT_S: Final = 3


def bedrock_call_bound_s(read_timeout_s: float) -> float:
    """The longest one model call can take (no SDK retries): counting the input's tokens, then
    Converse's connection and the wait for its answer (sent whole when the generation ends)."""
    count = BEDROCK_COUNT_CONNECT_TIMEOUT_S + BEDROCK_COUNT_READ_TIMEOUT_S
    return count + BEDROCK_CONNECT_TIMEOUT_S + read_timeout_s


# --- stack outputs the CLI and the local stack read ---------------------------------------------
OUTPUT_API_URL: Final = "ApiUrl"
OUTPUT_STATE_MACHINE_ARN: Final = "StateMachineArn"
OUTPUT_BUCKET_NAME: Final = "BucketName"
OUTPUT_DRAIN_PARAMETER: Final = "DrainParameterName"
OUTPUT_GOVERNOR_TABLE: Final = "GovernorTableName"
OUTPUT_LEDGER_TABLE: Final = "LedgerTableName"
OUTPUT_EVENT_BUS: Final = "EventBusName"
OUTPUT_DASHBOARD: Final = "DashboardName"
#: the BFCL toolset's journals table (when the registry holds it): `swarm judge` reads it
OUTPUT_TOOL_JOURNALS_TABLE: Final = "ToolJournalsTableName"
OUTPUT_STAGE: Final = "Stage"


def drain_parameter_name(stage: str) -> str:
    """The drain switch per stage: operators (and `swarm drain`) know where to find it."""
    return f"/swarm/{stage}/drain"


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
#: how long a results download URL is valid (cdk.json results.download_url_seconds)
RESULTS_URL_SECONDS: Final = "RESULTS_URL_SECONDS"
#: how long a manifest upload URL is valid (cdk.json uploads.url_seconds)
UPLOAD_URL_SECONDS: Final = "UPLOAD_URL_SECONDS"


STATE_MACHINE_ARN: Final = "STATE_MACHINE_ARN"
#: the most units one Distributed Map child fans out (cdk.json fanout.units_per_child): the API
#: writes the manifest in chunks of this many (swarm.service.batches.chunk_units)
UNITS_PER_CHILD: Final = "UNITS_PER_CHILD"
#: the bound on cdk.json fanout.units_per_child: one fan-out invocation admits (one ledger
#: transaction each) and sends this many units within its Lambda timeout (infra/fanout.py)
MAX_UNITS_PER_CHILD: Final = 500
DEFAULT_UNITS_PER_CHILD: Final = 100


EVENT_BUS_NAME: Final = "EVENT_BUS_NAME"


DRAIN_PARAMETER_NAME: Final = "DRAIN_PARAMETER_NAME"


#: The drain parameter's two values (the parameter's AllowedPattern admits only these).
DRAIN_ON: Final = "on"  # draining: refuse submissions (503), workers take nothing new


DRAIN_OFF: Final = "off"  # accepting work


def parse_drain_value(value: str) -> bool:
    """The drain parameter's value: ``on``/``off`` (also true/false, 1/0)."""
    v = value.strip().lower()
    if v in (DRAIN_ON, "true", "1", "yes"):
        return True
    if v in (DRAIN_OFF, "false", "0", "no", ""):
        return False
    raise InvalidInput("drain", f"{value!r} is not a drain value; use on or off")


# Per-lane variables: one literal per lane (pydantic aliases must be literals for mypy).
QUEUE_URL_HIGH: Final = "QUEUE_URL_HIGH"


QUEUE_URL_NORMAL: Final = "QUEUE_URL_NORMAL"


QUEUE_URL_LOW: Final = "QUEUE_URL_LOW"


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


WORKER_MAPPING_VARS: Final = tuple(worker_mapping_var(lane) for lane in LANES)


LANE_RESERVE_VARS: Final = tuple(lane_reserve_var(lane) for lane in LANES)


SHED_DEPTH_VARS: Final = tuple(shed_depth_var(lane) for lane in LANES)


# --- economics ----------------------------------------------------------------------------------
#: the model registry (cdk.json ``models``, resolved at synth), compact JSON:
#: ``{"default": name, "catalog": {name: {"model_id", "tpm", "rpm", "share", "burndown"}}}``:
#: each model's Bedrock id and the quota its governor (``gov#<name>``) governs
MODELS: Final = "MODELS"


GOVERNOR_CAPACITY: Final = "GOVERNOR_CAPACITY"  # tokens; empty = one minute of quota


GOVERNOR_MAX_WAIT_SECONDS: Final = "GOVERNOR_MAX_WAIT_SECONDS"  # worker's bounded wait


#: the models' prices (cdk.json models.catalog.<name>.prices, validated at synth): JSON, a
#: model name (of the registry) to its
#: prices in whole micro-dollars per million tokens (swarm.core.pricing); empty = none, then
#: spend is in tokens only and a budget in dollars is refused
MODEL_PRICES: Final = "MODEL_PRICES"


MAX_ATTEMPTS: Final = "MAX_ATTEMPTS"


LEASE_SECONDS: Final = "LEASE_SECONDS"  # reservation lease = the lanes' visibility timeout


#: units due within this many seconds of each other travel as one lane message (a bundle:
#: swarm.core.lanes.bundle), at most BUNDLE_UNITS of them (cdk.json worker.bundle_*)
BUNDLE_WINDOW_SECONDS: Final = "BUNDLE_WINDOW_SECONDS"
BUNDLE_UNITS: Final = "BUNDLE_UNITS"
#: a bundle whose first unit is due later: its window is this fraction of that unit's delay when
#: longer than BUNDLE_WINDOW_SECONDS, at most BUNDLE_MAX_WINDOW_SECONDS
BUNDLE_STRETCH: Final = "BUNDLE_STRETCH"
BUNDLE_MAX_WINDOW_SECONDS: Final = "BUNDLE_MAX_WINDOW_SECONDS"
#: the bound on cdk.json worker.bundle_units: a worker runs every unit of its SQS batch at once
#: (at most 10 messages), one thread each
MAX_BUNDLE_UNITS: Final = 25


DEFAULT_BUDGET_TOKENS: Final = "DEFAULT_BUDGET_TOKENS"


MAX_BUDGET_TOKENS: Final = "MAX_BUDGET_TOKENS"


SWEEP_INTERVAL_SECONDS: Final = "SWEEP_INTERVAL_SECONDS"  # the sweeper's schedule rate


TENANT_PRINCIPAL_PREFIX: Final = "TENANT_PRINCIPAL_PREFIX"
#: every tenant's lanes, queue cap and share, budget per batch (cdk.json ``tenants``, resolved at
#: synth): compact JSON ``{"defaults": {...}, "overrides": {"<tenant>": {...}}}``; empty = no
#: per-tenant limits (every lane, no caps)
TENANT_LIMITS: Final = "TENANT_LIMITS"
OPERATOR_PRINCIPAL_PREFIX: Final = "OPERATOR_PRINCIPAL_PREFIX"
#: human gates (cdk.json ``approvals``): how long a gated tool call waits for a decision before
#: the sweeper rejects it, and the operator role names that decide (comma-separated; empty: the
#: batch's tenant decides)
APPROVAL_TIMEOUT_SECONDS: Final = "APPROVAL_TIMEOUT_SECONDS"
APPROVAL_DECIDERS: Final = "APPROVAL_DECIDERS"
#: the tools whose own operator roles decide their calls (cdk.json ``tools.<name>.approval.
#: deciders``), compact: ``tool,tool=role,role;tool=role`` (a tool's name has no ``=``); a tool
#: not listed is decided by APPROVAL_DECIDERS; empty: none is
APPROVAL_TOOL_DECIDERS: Final = "APPROVAL_TOOL_DECIDERS"
#: the longest ``approvals.timeout_hours``: every parked unit's lease ends within it
MAX_APPROVAL_TIMEOUT_HOURS: Final = 336


# --- tools (cdk.json ``tools``: infra/config.py ToolsConfig; read by swarm.adapters.tools) -------
#: the worker's registry: compact JSON ``{"functions": {source: arn}, "tools": {name: {"timeout",
#: "source" | "arn", and of "description", "input_schema", "effect" what the source does not
#: declare}}, "toolsets": {name: {"source", "timeout"}}, "grants": {"defaults": [...],
#: "overrides": {t: [...]}}}``: a source's tools' specs are its declarations, which the worker
#: reads from the asset (swarm.core.tool_declarations); a grant may name a toolset; empty = no
#: tools
TOOL_REGISTRY: Final = "TOOL_REGISTRY"
#: the API's view of it: ``{"tools": [names], "toolsets": {name: source}, "grants": {...}}`` (no
#: ARNs, no specs: the API's environment is the fuller one, and it only checks names); empty =
#: no tools
TOOL_GRANTS: Final = "TOOL_GRANTS"
#: the notes tools' table (the notes tool function's only resource)
NOTES_TABLE_NAME: Final = "NOTES_TABLE_NAME"
#: the BFCL toolset's journals table (its function's only resource)
TOOL_JOURNALS_TABLE_NAME: Final = "TOOL_JOURNALS_TABLE_NAME"
#: the tool functions' handlers: ``functions.tools.<source>.handler``
TOOL_HANDLER_PACKAGE: Final = "functions.tools"
#: which tool source a tool function runs (its variables beside the Powertools ones)
TOOL_SOURCE: Final = "SWARM_TOOL_SOURCE"


# --- model plane --------------------------------------------------------------------------------
MODEL_ADAPTER: Final = "MODEL_ADAPTER"  # simulated | bedrock


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


# One module per function; the handler is functions.<name>.handler.
API: Final[FunctionName] = "api"
FANOUT: Final[FunctionName] = "fanout"
WORKER: Final[FunctionName] = "worker"
DLQ: Final[FunctionName] = "dlq"
FINALIZER: Final[FunctionName] = "finalizer"
DRAIN: Final[FunctionName] = "drain"
SWEEPER: Final[FunctionName] = "sweeper"
FUNCTIONS: Final[tuple[FunctionName, ...]] = (API, FANOUT, WORKER, DLQ, FINALIZER, DRAIN, SWEEPER)


_COMMON: Final = (
    SWARM_FUNCTION,
    STAGE,
    POWERTOOLS_SERVICE_NAME,
    POWERTOOLS_METRICS_NAMESPACE,
    POWERTOOLS_LOG_LEVEL,
)


_GOVERNOR: Final = (
    MODELS,
    GOVERNOR_CAPACITY,
    *LANE_RESERVE_VARS,
)


_BUNDLES: Final = (BUNDLE_WINDOW_SECONDS, BUNDLE_UNITS, BUNDLE_STRETCH, BUNDLE_MAX_WINDOW_SECONDS)


_MODEL: Final = (
    MODEL_ADAPTER,
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
        *SHED_DEPTH_VARS,
        *_GOVERNOR,
        MAX_ATTEMPTS,
        DEFAULT_BUDGET_TOKENS,
        MAX_BUDGET_TOKENS,
        TENANT_LIMITS,
        TENANT_PRINCIPAL_PREFIX,
        OPERATOR_PRINCIPAL_PREFIX,
        APPROVAL_DECIDERS,  # who decides a gated tool call (empty: the batch's tenant)
        APPROVAL_TOOL_DECIDERS,  # who decides the calls of a tool naming its own deciders
        LEASE_SECONDS,  # a decided unit's lease until a worker claims it
        RESULTS_URL_SECONDS,
        UPLOAD_URL_SECONDS,
        UNITS_PER_CHILD,
        BUNDLE_UNITS,  # the lanes' depths are messages: units at most this many times them
        TOOL_GRANTS,  # a unit's tools must be registered and granted to its tenant
        MODEL_PRICES,  # a unit's projected cost at its model's prices, a budget in dollars
    ),
    "fanout": (
        *_COMMON,
        LEDGER_TABLE_NAME,
        GOVERNOR_TABLE_NAME,  # it books the admitted units' places (DynamoDBGovernor.book_places)
        *_GOVERNOR,
        *QUEUE_URL_VARS,
        MAX_ATTEMPTS,
        LEASE_SECONDS,
        *_BUNDLES,
    ),
    "worker": (
        *_COMMON,
        LEDGER_TABLE_NAME,
        GOVERNOR_TABLE_NAME,
        BUCKET_NAME,  # each attempt's outcome goes to results/<run>/attempts/
        DRAIN_PARAMETER_NAME,
        EVENT_BUS_NAME,
        *QUEUE_URL_VARS,
        *_GOVERNOR,
        GOVERNOR_MAX_WAIT_SECONDS,
        MAX_ATTEMPTS,
        LEASE_SECONDS,
        *_BUNDLES,  # it requeues units in bundles too
        *_MODEL,
        MODEL_PRICES,  # each attempt's usage is priced at its settlement
        TOOL_REGISTRY,  # the tools its units may call, and their functions
        APPROVAL_TIMEOUT_SECONDS,  # a parked unit's lease: when its undecided calls time out
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
        LEASE_SECONDS,  # a unit whose approvals timed out is sent back with this lease
    ),
    "drain": (
        *_COMMON,
        LEDGER_TABLE_NAME,  # the register of running work (DynamoDBRunning.running)
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
        LEASE_SECONDS,  # the finalizer's: a unit whose approvals timed out is sent back
    ),
}


#: Variables a function may receive empty (meaning "use the default").
OPTIONAL_VARS: Final = frozenset(
    {
        GOVERNOR_CAPACITY,
        BEDROCK_READ_TIMEOUT_SECONDS,
        MODEL_PRICES,
        TENANT_LIMITS,
        TOOL_REGISTRY,
        TOOL_GRANTS,
        APPROVAL_DECIDERS,
        APPROVAL_TOOL_DECIDERS,
        APPROVAL_TIMEOUT_SECONDS,  # (default: 24 hours)
    }
)

#: The variables of each tool source's function beside the Powertools ones (the shipped sources;
#: a source not listed here gets only those)
TOOL_FUNCTION_ENV: Final[Mapping[str, tuple[str, ...]]] = {
    "calculator": (),
    "notes": (NOTES_TABLE_NAME,),
    "object_read": (BUCKET_NAME,),
    "bfcl": (TOOL_JOURNALS_TABLE_NAME,),
}
