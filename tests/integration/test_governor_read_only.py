"""The API reads the governor and never writes it (moto in-process): its role needs only Query.

On AWS the API's role may only read the governor table (``infra/api.py``). ``POST /batches``
and ``GET /fleet`` read a snapshot of the bucket; on a fresh stack (or after a
change of quota, share or capacity, which names a fresh bucket) the shard items do not exist yet.
The API must then answer with the bucket's configured initial state, without putting the items:
the workers create them on their first draw.
"""

from __future__ import annotations

from typing import Any

import pytest

from swarm import contract as env
from swarm.adapters.dynamodb_governor import DynamoDBGovernor, GovernorReadOnly
from swarm.contract import FUNCTION_ENV
from swarm.core.governor import GovernorConfig, Grant
from swarm.core.memory import InMemoryGovernor
from swarm.core.records import LANES, Lane
from swarm.settings import Settings
from swarm.wiring import Wiring, governor_name
from tests.integration.conftest import TABLE

CONFIG = GovernorConfig(quota_tpm=300_000, share=0.95, initial_fill=0.5)

#: DynamoDB operations that change a table: none of them may reach it from the API.
WRITES = frozenset(
    {
        "put_item",
        "update_item",
        "delete_item",
        "batch_write_item",
        "transact_write_items",
        "execute_statement",
        "batch_execute_statement",
        "execute_transaction",
    }
)


class ReadOnlyClient:
    """A DynamoDB client that fails the test on any write, as IAM would refuse it on AWS."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in WRITES:
            raise AssertionError(f"the API's governor called dynamodb {name}: its role may not")
        self.calls.append(name)
        return getattr(self._client, name)


def _item_count(client: Any) -> int:
    return len(client.scan(TableName=TABLE, ConsistentRead=True)["Items"])


def _api_runtime(client: Any) -> Wiring:
    """The API function's runtime, exactly as its environment (the stack's contract) builds it."""
    values = {name: f"value-of-{name.lower()}" for name in FUNCTION_ENV["api"]}
    values.update(
        {
            env.SWARM_FUNCTION: "api",
            env.STAGE: "dev",
            env.POWERTOOLS_LOG_LEVEL: "INFO",
            env.GOVERNOR_TABLE_NAME: TABLE,
            env.LEDGER_TABLE_NAME: TABLE,
            env.STATE_MACHINE_ARN: "arn:aws:states:us-east-1:123456789012:stateMachine:x",
            env.MODELS: '{"default":"m","catalog":{"m":{"model_id":"anthropic.claude-test",'
            '"tpm":300000,"share":0.95,"burndown":1}}}',
            env.GOVERNOR_CAPACITY: "",
            env.MODEL_PRICES: "",  # no prices
            env.MAX_ATTEMPTS: "3",
            env.DEFAULT_BUDGET_TOKENS: "1000",
            env.MAX_BUDGET_TOKENS: "1000000",
            env.RESULTS_URL_SECONDS: "300",
            env.UPLOAD_URL_SECONDS: "300",
            env.UNITS_PER_CHILD: "100",
            env.BUNDLE_UNITS: "5",
            env.TENANT_LIMITS: "",  # no tenant limits of their own
            env.TENANT_PRINCIPAL_PREFIX: "swarm-tenant-",
            env.OPERATOR_PRINCIPAL_PREFIX: "swarm-operator-",
            env.TOOL_GRANTS: "",  # no tools
            env.LEASE_SECONDS: "60",
        }
    )
    for lane in LANES:
        values[env.lane_reserve_var(lane)] = "0.1"
        values[env.shed_depth_var(lane)] = "100"
    settings = Settings.from_env(values)
    others: dict[str, Any] = {}

    def clients(service: str) -> Any:
        if service == "dynamodb":
            return client
        return others.setdefault(service, object())  # never called by a snapshot

    return Wiring(settings, clients)


def test_a_never_written_governor_reads_as_its_initial_state_without_a_write(
    dynamodb: Any,
) -> None:
    # Given a governor table nobody has written (a fresh stack)
    assert _item_count(dynamodb) == 0
    client = ReadOnlyClient(dynamodb)
    reader = DynamoDBGovernor(CONFIG, TABLE, client=client, read_only=True)
    # When the read-only client takes snapshots
    first = reader.snapshot(100.0)
    later = reader.snapshot(160.0)
    # Then each is the bucket's configured initial state: what the in-memory reference holds
    # right after creation (the time of the read is the creation time it reports)
    assert first == InMemoryGovernor(CONFIG, now=100.0).snapshot(100.0)
    assert first.available == pytest.approx(CONFIG.initial_fill * CONFIG.bucket_capacity)
    assert first.effective_rate == pytest.approx(CONFIG.rate)
    assert first.throttles == 0 and first.last_throttle_at is None
    assert later == first
    # And nothing was written: it only queried
    assert _item_count(dynamodb) == 0
    assert set(client.calls) == {"query"}


def test_the_read_only_client_sees_what_the_workers_wrote(dynamodb: Any) -> None:
    # Given a worker that created the bucket and drew from it
    writer = DynamoDBGovernor(CONFIG, TABLE, client=dynamodb)
    assert writer.draw(20_000, Lane.HIGH, 10.0).granted
    writer.report_throttle(11.0)
    # When the read-only client takes a snapshot
    reader = DynamoDBGovernor(CONFIG, TABLE, client=ReadOnlyClient(dynamodb), read_only=True)
    # Then it is the stored bucket, not the initial state
    assert reader.snapshot(12.0) == writer.snapshot(12.0)
    assert reader.snapshot(12.0).throttles == 1


def test_a_read_only_client_refuses_every_write(dynamodb: Any) -> None:
    reader = DynamoDBGovernor(CONFIG, TABLE, client=ReadOnlyClient(dynamodb), read_only=True)
    with pytest.raises(GovernorReadOnly):
        reader.create(0.0)
    with pytest.raises(GovernorReadOnly):
        reader.draw(1_000, Lane.HIGH, 0.0)
    with pytest.raises(GovernorReadOnly):
        reader.report_throttle(0.0)
    with pytest.raises(GovernorReadOnly):
        reader.true_up(Grant(1_000, Lane.HIGH, 0.0), 2_000, 0.0)
    assert _item_count(dynamodb) == 0


def test_the_api_runtime_wires_a_governor_that_never_writes(dynamodb: Any) -> None:
    """``POST /batches`` and ``GET /fleet`` read ``Batches.governor`` and each model's."""
    # Given the API function's runtime on a fresh governor table, every write refused
    runtime = _api_runtime(ReadOnlyClient(dynamodb))
    batches = runtime.batches()
    assert batches.models is not None
    assert batches.models.routes["m"].governor is not batches.governor  # its own reader
    for governor in (batches.governor, batches.models.routes["m"].governor):
        # When the API reads the model's bucket
        snapshot = governor.snapshot(50.0)
        # Then it reads the configured initial state of the bucket the workers will create
        config = runtime.governor_config()
        assert snapshot.capacity == config.bucket_capacity
        assert snapshot.available == pytest.approx(config.initial_fill * config.bucket_capacity)
        assert _item_count(dynamodb) == 0
    # And the worker's governor (same name, same table) creates exactly that bucket
    worker = DynamoDBGovernor(config, TABLE, client=dynamodb, name=governor_name(config, "m"))
    assert worker.snapshot(50.0) == snapshot
    assert _item_count(dynamodb) == 1
