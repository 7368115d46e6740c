"""The ledger's ``Leases`` index on moto: sparse (only units holding a lease are in it), kept by
the writes that take, renew and end a lease, and what the finalizer's poll reads with it: the
expired leases only, not the run's units (docs/explanation/ledger.md, docs/explanation/scale.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.adapters.dynamodb import create_table
from swarm.adapters.dynamodb_ledger import DynamoDBLedger
from swarm.contract import LEASE_EXPIRY, LEASES_INDEX
from swarm.core.records import Lane, RunSpec, UnitSpec
from swarm.local import billing
from swarm.local.clients import REGION
from tests.integration.conftest import TABLE
from tests.ledger_contract import spec

KEY = "AKIDLEASESTEST"  # the test's requests are signed with it, metered as "finalizer"


def _client() -> Any:
    return boto3.client(
        "dynamodb", region_name=REGION, aws_access_key_id=KEY, aws_secret_access_key="secret"
    )


def _index(client: Any, pk: str, until: float = 1e15) -> list[tuple[str, float]]:
    page = client.query(
        TableName=TABLE,
        IndexName=LEASES_INDEX,
        KeyConditionExpression="pk = :pk AND #l <= :t",
        ExpressionAttributeNames={"#l": LEASE_EXPIRY},
        ExpressionAttributeValues={":pk": {"S": pk}, ":t": {"N": str(until)}},
    )
    return [(it["sk"]["S"], float(it[LEASE_EXPIRY]["N"])) for it in page["Items"]]


def test_the_index_is_sparse_on_moto(dynamodb: Any) -> None:
    # Given the ledger's table (swarm.adapters.dynamodb.create_table, as the local stack makes
    # it) and four items of one partition: two with a lease, one without, one books item
    def put(sk: str, **extra: Any) -> None:
        dynamodb.put_item(TableName=TABLE, Item={"pk": {"S": "run#r"}, "sk": {"S": sk}, **extra})

    put("books", state={"S": "open"})
    put("unit#a", res_lease={"N": "10.5"}, res_claimed={"BOOL": True})
    put("unit#b")
    put("unit#c", res_lease={"N": "20"})
    # Then only the items carrying the sort key are in the index, by expiry, keys only
    assert _index(dynamodb, "run#r") == [("unit#a", 10.5), ("unit#c", 20.0)]
    assert _index(dynamodb, "run#r", until=15) == [("unit#a", 10.5)]
    item = dynamodb.query(
        TableName=TABLE,
        IndexName=LEASES_INDEX,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": "run#r"}},
        Limit=1,
    )["Items"][0]
    assert set(item) == {"pk", "sk", LEASE_EXPIRY}  # KEYS_ONLY: the table's keys and its own
    # When a lease is renewed, one is removed and one is taken
    key = {"pk": {"S": "run#r"}}
    dynamodb.update_item(
        TableName=TABLE,
        Key={**key, "sk": {"S": "unit#a"}},
        UpdateExpression="SET res_lease = :l",
        ExpressionAttributeValues={":l": {"N": "99"}},
    )
    dynamodb.update_item(
        TableName=TABLE, Key={**key, "sk": {"S": "unit#c"}}, UpdateExpression="REMOVE res_lease"
    )
    dynamodb.update_item(
        TableName=TABLE,
        Key={**key, "sk": {"S": "unit#b"}},
        UpdateExpression="SET res_lease = :l",
        ExpressionAttributeValues={":l": {"N": "5"}},
    )
    # Then the index follows each write, and another run's partition is not read
    assert _index(dynamodb, "run#r") == [("unit#b", 5.0), ("unit#a", 99.0)]
    assert _index(dynamodb, "run#other") == []


def test_the_ledgers_writes_keep_the_index(dynamodb: Any) -> None:
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=3), now=0.0)
    pk = "run#run-1"
    assert _index(dynamodb, pk) == []  # opened: no unit holds a lease
    ledger.admit("run-1", "u0", 0, now=0.0, lease_s=900)
    ledger.admit("run-1", "u1", 0, now=0.0, lease_s=900)
    assert _index(dynamodb, pk) == [("unit#u0", 900.0), ("unit#u1", 900.0)]
    ledger.claim("run-1", "u0", 0, now=10.0, lease_s=60)  # its own lease: not in the index
    assert _index(dynamodb, pk) == [("unit#u0", 900.0), ("unit#u1", 900.0)]
    ledger.unclaim("run-1", "u0", 0, now=10.0, lease_s=30)  # handed back: a new lease
    assert _index(dynamodb, pk) == [("unit#u0", 40.0), ("unit#u1", 900.0)]
    ledger.claim("run-1", "u0", 0, now=11.0, lease_s=60)
    ledger.settle("run-1", "u0", 0, 50, True, now=11.0)  # ended by the settlement
    assert _index(dynamodb, pk) == [("unit#u1", 900.0)]
    ledger.dead_letter("run-1", "u1", now=12.0)
    assert _index(dynamodb, pk) == []


def _spec(run_id: str, units: int) -> RunSpec:
    return RunSpec(
        run_id=run_id,
        tenant="tenant-a",
        lane=Lane.NORMAL,
        budget=10**9,
        units=tuple(UnitSpec(f"unit-{i:06d}", 100) for i in range(units)),
        max_attempts=3,
    )


@pytest.fixture
def metered(aws_credentials: None) -> Iterator[tuple[billing.Meter, Any]]:
    """moto in this process with the local stack's meter on, and a ledger table."""
    billing.install()
    meter = billing.METER
    meter.name_caller(KEY, "finalizer")
    meter.reset()
    meter.enabled = True
    try:
        with mock_aws():
            client = _client()
            create_table(client, TABLE)
            yield meter, client
    finally:
        meter.enabled = False
        meter.reset()


def _read_units(meter: billing.Meter) -> float:
    return sum(
        line["quantity"]
        for line in meter.snapshot()["lines"]
        if line["service"] == "dynamodb"
        and line["caller"] == "finalizer"
        and line["price"] == billing.DYNAMODB_READ
    )


def test_a_poll_reads_the_expired_leases_not_the_units(
    metered: tuple[billing.Meter, Any],
) -> None:
    # Given two runs, of 200 and 2,000 units, each with 10 units in flight: 3 claimed by
    # workers that died (the sweep looks at them at 60: their admission's lease; their claims'
    # ended at 30) and 7 still leased until 900
    meter, client = metered
    ledger = DynamoDBLedger(TABLE, client=client)
    polls: dict[int, tuple[float, float, int]] = {}
    for size in (200, 2_000):
        run_id = f"run-{size}"
        ledger.open_run(_spec(run_id, size), now=0.0)
        for i in range(10):
            ledger.admit(run_id, f"unit-{i:06d}", 0, now=0.0, lease_s=60 if i < 3 else 900)
        for i in range(3):
            ledger.claim(run_id, f"unit-{i:06d}", 0, now=0.0, lease_s=30)
        # When the finalizer polls once (its leases, then the books: Finalizer.finalize)
        meter.reset()
        lost = ledger.reclaim_expired(run_id, now=61.0)
        ledger.run(run_id)
        reclaiming = _read_units(meter)
        # and once more, when nothing has expired since
        meter.reset()
        assert ledger.reclaim_expired(run_id, now=62.0) == []
        ledger.run(run_id)
        polls[size] = (reclaiming, _read_units(meter), len(lost))
    # Then each poll reads the same whatever the run's size: the index's expired entries (half
    # a unit: eventually consistent, keys only), the books, and per expired lease the strongly
    # consistent reads of its reclaim
    assert polls[200] == polls[2_000]
    reclaiming, idle, lost = polls[2_000]
    assert lost == 3
    assert idle <= 3.0, idle  # the books twice (1 each) and the index's empty page (0.5)
    # The old sweep (a strongly consistent Query of every unit item) for comparison: at least
    # 2,000 x ~60 bytes / 4 KB, and more than the poll that reclaims three leases
    meter.reset()
    assert len(ledger.units("run-2000")) == 2_000
    whole_run = _read_units(meter)
    assert whole_run >= 25
    assert reclaiming < whole_run / 2 and idle < whole_run / 10, (reclaiming, idle, whole_run)


def test_a_stale_index_entry_is_decided_from_the_fresh_unit(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an index read that lags the table (eventually consistent): it still lists u0, whose
    # worker unclaimed it with a fresh lease since, u1, settled since, and u2, really expired
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=3), now=0.0)
    for uid in ("u0", "u1", "u2"):
        ledger.admit("run-1", uid, 0, now=0.0, lease_s=900)
        ledger.claim("run-1", uid, 0, now=0.0, lease_s=60)
    assert ledger.unclaim("run-1", "u0", 0, now=59.0, lease_s=900)
    ledger.settle("run-1", "u1", 0, 70, True, now=59.0)
    monkeypatch.setattr(ledger, "_expired_leases", lambda run_id, now: ["u0", "u1", "u2"])
    # When the finalizer reclaims what the index listed
    lost = ledger.reclaim_expired("run-1", now=61.0)
    # Then only u2's attempt is settled as lost; u0 keeps its renewed lease, u1 its settlement
    assert [s.unit.unit_id for s in lost] == ["u2"]
    u0 = ledger.unit("run-1", "u0")
    assert u0.reservation is not None and u0.reservation.lease_expires == 959.0
    run = ledger.run("run-1")
    assert (run.completed, run.spent, run.in_flight) == (1, 70 + 100, 1)


def test_a_claim_written_before_claims_kept_their_own_lease_is_read_as_it_is(
    dynamodb: Any,
) -> None:
    # Given u0 claimed by the earlier layout (the claim moved res_lease itself, no res_until)
    # and u1 claimed now (its own lease, res_until; res_lease stays its admission's)
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=2), now=0.0)
    for uid in ("u0", "u1"):
        ledger.admit("run-1", uid, 0, now=0.0, lease_s=900)
    dynamodb.update_item(
        TableName=TABLE,
        Key={"pk": {"S": "run#run-1"}, "sk": {"S": "unit#u0"}},
        UpdateExpression="SET res_claimed = :t, res_lease = :l",
        ExpressionAttributeValues={":t": {"BOOL": True}, ":l": {"N": "70"}},
    )
    ledger.claim("run-1", "u1", 0, now=10.0, lease_s=60)
    # Then each reads as the reservation it is, and the index lists each where its layout put it
    u0, u1 = ledger.unit("run-1", "u0").reservation, ledger.unit("run-1", "u1").reservation
    assert u0 is not None and (u0.claimed, u0.lease_expires, u0.sweep_at) == (True, 70.0, None)
    assert u1 is not None and (u1.claimed, u1.lease_expires, u1.sweep_at) == (True, 70.0, 900.0)
    assert _index(dynamodb, "run#run-1") == [("unit#u0", 70.0), ("unit#u1", 900.0)]
    # When the sweep runs after both claims' leases ended, then at u1's admission's lease
    first = ledger.reclaim_expired("run-1", now=71.0)
    second = ledger.reclaim_expired("run-1", now=900.0)
    # Then each lost attempt is settled once, and the index is empty
    assert [s.unit.unit_id for s in first] == ["u0"]
    assert [s.unit.unit_id for s in second] == ["u1"]
    assert _index(dynamodb, "run#run-1") == []


def test_a_fan_out_admission_and_its_claim_and_settlement_write_no_index_entry(
    metered: tuple[billing.Meter, Any],
) -> None:
    # Given a run of 50 units admitted by the fan-out (by_scan), then claimed and settled
    meter, client = metered
    ledger = DynamoDBLedger(TABLE, client=client)
    ledger.open_run(_spec("run-f", 50), now=0.0)
    meter.reset()
    ids = [f"unit-{i:06d}" for i in range(50)]
    ledger.admit_many("run-f", ids, now=0.0, lease_s=900, by_scan=True)
    for uid in ids:
        claim = ledger.claim_queued("run-f", uid, 0, now=1.0, lease_s=60)
        assert claim is not None
        if ledger.settle_claimed(claim.unit, 0, 70, True, now=2.0) is None:
            ledger.settle("run-f", uid, 0, 70, True, now=2.0)  # the last unit closes the run
    # Then the index was never written (the run's scan horizon stands for it, on the books)
    index_writes = [
        line
        for line in meter.snapshot()["lines"]
        if line["service"] == "dynamodb" and ": index " in line["operation"]
    ]
    assert index_writes == []
    assert _index(client, "run#run-f") == []
    books = client.get_item(TableName=TABLE, Key={"pk": {"S": "run#run-f"}, "sk": {"S": "books"}})
    assert float(books["Item"]["scan_at"]["N"]) == 900.0
    assert ledger.run("run-f").state.closed
