"""Names and ids only the infrastructure uses. What the functions, the CLI or the tests must agree
on (function names, environment variables, stack outputs, the drain parameter, metrics) is in
:mod:`swarm.contract`."""

from __future__ import annotations

from pathlib import Path

from swarm import contract

ROOT = Path(__file__).resolve().parent.parent
STATEMACHINES_DIR = ROOT / "statemachines"
FANOUT_ASL = STATEMACHINES_DIR / "fanout.asl.json"


# Table key schema (the adapters in swarm/ use these attribute names).
PARTITION_KEY = "pk"
SORT_KEY = "sk"
TTL_ATTRIBUTE = "expires_at"
# The ledger's sparse index of the runs the sweeper watches (names in swarm.contract).
OPEN_RUNS_INDEX = contract.OPEN_RUNS_INDEX
WATCH_PARTITION_KEY = contract.WATCH
WATCH_SORT_KEY = contract.SWEEP_AT
WATCH_PROJECTED = (contract.EXECUTION, contract.REPAIRS)  # what the sweeper reads from the index
# The ledger's sparse index of each tenant's watched runs (keys only: the API's queue cap).
TENANT_RUNS_INDEX = contract.TENANT_RUNS_INDEX
TENANT_RUNS_PARTITION_KEY = contract.OPEN_TENANT
# The ledger's sparse index of units holding a lease, by run (pk) and expiry (keys only: the
# finalizer's lease sweep).
LEASES_INDEX = contract.LEASES_INDEX
LEASE_EXPIRY = contract.LEASE_EXPIRY

# Bucket prefixes.
MANIFEST_PREFIX = "manifests/"
RESULTS_PREFIX = "results/"
