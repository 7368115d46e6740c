"""Names and ids used across the stack, in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from swarm.adapters import dynamodb_watch as _watch
from swarm.settings import FunctionName

ROOT = Path(__file__).resolve().parent.parent
STATEMACHINES_DIR = ROOT / "statemachines"
FANOUT_ASL = STATEMACHINES_DIR / "fanout.asl.json"

SERVICE = "swarm"
METRICS_NAMESPACE = "Swarm"

# Table key schema (the adapters in swarm/ use these attribute names).
PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"
# The ledger's sparse index of the runs the sweeper watches (swarm/adapters/dynamodb_watch.py).
OPEN_RUNS_INDEX = _watch.OPEN_RUNS_INDEX
WATCH_PARTITION_KEY = _watch.WATCH  # S, present while the run is watched
WATCH_SORT_KEY = _watch.SWEEP_AT  # N, when the sweeper looks at the run next
WATCH_PROJECTED = (_watch.EXECUTION, _watch.REPAIRS)  # what the sweeper reads from the index

# Bucket prefixes.
MANIFEST_PREFIX = "manifests/"
RESULTS_PREFIX = "results/"

# One module per function; the handler is functions.<name>.handler.
API: Final[FunctionName] = "api"
FANOUT: Final[FunctionName] = "fanout"
WORKER: Final[FunctionName] = "worker"
DLQ: Final[FunctionName] = "dlq"
FINALIZER: Final[FunctionName] = "finalizer"
DRAIN: Final[FunctionName] = "drain"
SWEEPER: Final[FunctionName] = "sweeper"

# Stack outputs the CLI and the local runtime read.
OUTPUT_API_URL = "ApiUrl"
OUTPUT_STATE_MACHINE_ARN = "StateMachineArn"
OUTPUT_BUCKET_NAME = "BucketName"
OUTPUT_DRAIN_PARAMETER = "DrainParameterName"
OUTPUT_GOVERNOR_TABLE = "GovernorTableName"
OUTPUT_LEDGER_TABLE = "LedgerTableName"
OUTPUT_EVENT_BUS = "EventBusName"
OUTPUT_DASHBOARD = "DashboardName"


def drain_parameter_name(stage: str) -> str:
    """The drain switch per stage: operators (and `swarm drain`) know where to find it."""
    return f"/swarm/{stage}/drain"
