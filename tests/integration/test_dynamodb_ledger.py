"""The DynamoDB ledger (moto in-process, patched) against the shared Ledger contract."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from swarm.adapters.dynamodb_ledger import (
    MAX_UNPROCESSED_RETRIES,
    UNPROCESSED_BASE_S,
    DynamoDBLedger,
)
from swarm.core.errors import Conflict
from swarm.core.ledger import Fate
from swarm.core.ports import ClaimedSettlement, Ledger
from swarm.core.records import Lane, RunSpec, RunState, UnitSpec
from tests.integration.conftest import TABLE
from tests.ledger_contract import LedgerContract, spec


class TestDynamoDBLedger(LedgerContract):
    @pytest.fixture
    def ledger(self, dynamodb: Any) -> Ledger:
        return DynamoDBLedger(TABLE, client=dynamodb)


def test_item_layout_keys_and_a_fresh_client_reads_the_same_books(dynamodb: Any) -> None:
    # Given a run with one settled attempt
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=2), now=0.0)
    ledger.admit("run-1", "u0", 0, now=1.0)
    ledger.settle("run-1", "u0", 0, 42, True, now=2.0)
    # When the table is read directly
    items = dynamodb.scan(TableName=TABLE)["Items"]
    keys = sorted((it["pk"]["S"], it["sk"]["S"]) for it in items)
    # Then it holds the documented single-table items, the attempt kept in its unit's item
    assert keys == [
        ("run#run-1", "books"),
        ("run#run-1", "spec"),
        ("run#run-1", "unit#u0"),
        ("run#run-1", "unit#u1"),
    ]
    unit = next(it for it in items if it["sk"]["S"] == "unit#u0")
    assert unit["att00000"] == {
        "M": {
            "tokens": {"N": "42"},
            "succeeded": {"BOOL": True},
            "settled_at": {"N": "2.0"},
            "reclaimed": {"BOOL": False},
            "fate": {"S": "completed"},
        }
    }
    books = next(it for it in items if it["sk"]["S"] == "books")
    assert books["available"]["N"] == str(1_000 - 42)
    # and another client (another Lambda) sees the same books
    assert DynamoDBLedger(TABLE, client=dynamodb).run("run-1") == ledger.run("run-1")


def test_attempts_settled_in_items_of_their_own_are_still_read(dynamodb: Any) -> None:
    # Given a run whose first attempt was settled by the earlier layout: an item of its own
    # (``attempt#<unit>#<n>``) beside a unit no longer holding the reservation
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=2), now=0.0)
    ledger.admit("run-1", "u0", 0, now=1.0)
    ledger.settle("run-1", "u0", 0, 42, False, now=2.0)
    unit_key = {"pk": {"S": "run#run-1"}, "sk": {"S": "unit#u0"}}
    dynamodb.update_item(TableName=TABLE, Key=unit_key, UpdateExpression="REMOVE att00000")
    dynamodb.put_item(
        TableName=TABLE,
        Item={
            "pk": {"S": "run#run-1"},
            "sk": {"S": "attempt#u0#00000"},
            "unit_id": {"S": "u0"},
            "attempt": {"N": "0"},
            "tokens": {"N": "42"},
            "succeeded": {"BOOL": False},
            "settled_at": {"N": "2.0"},
            "reclaimed": {"BOOL": False},
            "fate": {"S": "retry"},
            "expires_at": {"N": "2592002"},
        },
    )
    # When its second attempt settles, and the first is settled again (a late duplicate)
    ledger.admit("run-1", "u0", 1, now=3.0)
    ledger.settle("run-1", "u0", 1, 50, True, now=4.0)
    again = ledger.settle("run-1", "u0", 0, 42, False, now=5.0)
    # Then both attempts are read, from either layout, and the duplicate changes nothing
    assert [(a.attempt, a.tokens) for a in ledger.attempts("run-1")] == [(0, 42), (1, 50)]
    assert again.duplicate and again.fate is Fate.RETRY and again.attempt.tokens == 42
    assert ledger.run("run-1").spent == 92


def test_a_crash_mid_open_is_finished_by_the_next_open(dynamodb: Any) -> None:
    # Given an open that wrote the books (not ready) but died before the units
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=3), now=0.0)
    dynamodb.update_item(
        TableName=TABLE,
        Key={"pk": {"S": "run#run-1"}, "sk": {"S": "books"}},
        UpdateExpression="SET ready = :f",
        ExpressionAttributeValues={":f": {"BOOL": False}},
    )
    dynamodb.delete_item(TableName=TABLE, Key={"pk": {"S": "run#run-1"}, "sk": {"S": "unit#u2"}})
    fresh = DynamoDBLedger(TABLE, client=dynamodb)
    with pytest.raises(Exception, match="no run"):
        fresh.run("run-1")
    assert fresh.run("run-1", opening=True).state is RunState.OPENING
    # When the (retried) open runs again, Then the run is complete and usable
    assert fresh.open_run(spec(units=3), now=5.0).state is RunState.OPEN
    assert [u.unit_id for u in fresh.units("run-1")] == ["u0", "u1", "u2"]
    assert fresh.admit("run-1", "u2", 0, now=6.0).admitted


def _table(dynamodb: Any) -> dict[tuple[str, str], Any]:
    return {(it["pk"]["S"], it["sk"]["S"]): it for it in dynamodb.scan(TableName=TABLE)["Items"]}


def test_an_open_in_pages_resumed_after_a_crash_gives_exactly_the_same_items(
    dynamodb: Any,
) -> None:
    big = _random_ids_spec(230)
    # Given the items of an open run in one go (a reference)...
    reference = DynamoDBLedger(TABLE, client=dynamodb)
    reference.begin_open(big, "manifests/run-1/spec.json", now=1.0)
    assert reference.open_units(big, 0, 1_000, now=2.0) == 230
    expected = _table(dynamodb)
    for k in expected:
        dynamodb.delete_item(TableName=TABLE, Key={"pk": {"S": k[0]}, "sk": {"S": k[1]}})
    # ...and the same open in pages of 50 by an open step that crashes mid-page (after 3 of
    # its requests) and is restarted from its last returned cursor by a fresh Lambda
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.begin_open(big, "manifests/run-1/spec.json", now=1.0)
    assert ledger.open_units(big, 0, 50, now=2.0) == 50
    crashing = DynamoDBLedger(TABLE, client=_Crashing(dynamodb, after=3))
    with pytest.raises(RuntimeError, match="crash"):
        crashing.open_units(big, 50, 50, now=2.0)
    fresh = DynamoDBLedger(TABLE, client=dynamodb)
    cursor = 50
    while cursor < 230:
        cursor = fresh.open_units(big, cursor, 50, now=2.0)
    # Then the table holds exactly the same items as the open in one go
    assert _table(dynamodb) == expected
    assert [u.unit_id for u in fresh.units("run-1")] == [u.unit_id for u in big.units]


class _Crashing:
    """A client that dies (as a Lambda timing out would) after ``after`` requests."""

    def __init__(self, client: Any, after: int) -> None:
        self._client, self._left = client, after

    def __getattr__(self, op: str) -> Any:
        def call(**kwargs: Any) -> Any:
            if self._left <= 0:
                raise RuntimeError("crash")
            self._left -= 1
            return getattr(self._client, op)(**kwargs)

        return call


class _Unprocessing:
    """A client whose BatchWriteItem leaves some items unprocessed (DynamoDB's throttling of a
    batch): the first ``times`` answers hand back all but the first item of the request."""

    def __init__(self, client: Any, times: int) -> None:
        self._client, self.times, self.batches = client, times, 0

    def __getattr__(self, op: str) -> Any:
        if op != "batch_write_item":
            return getattr(self._client, op)

        def call(RequestItems: dict[str, Any]) -> Any:
            self.batches += 1
            ((table, requests),) = RequestItems.items()
            if self.times > 0 and len(requests) > 1:
                self.times -= 1
                self._client.batch_write_item(RequestItems={table: requests[:1]})
                return {"UnprocessedItems": {table: requests[1:]}}
            return self._client.batch_write_item(RequestItems=RequestItems)

        return call


def test_unprocessed_items_are_sent_again_after_an_exponential_backoff_with_jitter(
    dynamodb: Any,
) -> None:
    # Given a table that leaves items unprocessed 4 times in a row
    client = _Unprocessing(dynamodb, times=4)
    slept: list[float] = []
    ledger = DynamoDBLedger(TABLE, client=client, sleep=slept.append, rng=random.Random(7))
    s = spec(units=25)
    ledger.begin_open(s, "k", now=0.0)
    # When the open step writes a page of 25
    assert ledger.open_units(s, 0, 25, now=1.0) == 25
    # Then every unit is written, after 4 backoffs that grow (base * 2**n, full jitter)
    assert len(ledger.units("run-1")) == 25
    assert client.batches == 5 and len(slept) == 4
    caps = [UNPROCESSED_BASE_S * 2**n for n in range(4)]
    assert all(0 <= d <= cap for d, cap in zip(slept, caps, strict=True))
    assert slept != sorted(slept) or len(set(slept)) == 4  # jittered, not a fixed schedule


def test_items_unprocessed_past_the_retries_fail_the_page_and_the_next_try_resumes(
    dynamodb: Any,
) -> None:
    client = _Unprocessing(dynamodb, times=10**6)
    ledger = DynamoDBLedger(TABLE, client=client, sleep=lambda _: None)
    s = spec(units=30)
    ledger.begin_open(s, "k", now=0.0)
    with pytest.raises(Conflict, match="unprocessed"):
        ledger.open_units(s, 0, 30, now=1.0)
    assert client.batches == MAX_UNPROCESSED_RETRIES + 1
    # the state machine's retry of the task (or a restart) opens it from the start
    assert DynamoDBLedger(TABLE, client=dynamodb).open_units(s, 0, 30, now=2.0) == 30


def test_the_spec_item_is_o1_in_the_batch_size(dynamodb: Any) -> None:
    # Given 100,000 units with random ids (their list compresses to ~2 MB: five DynamoDB items)
    big = _random_ids_spec(100_000)
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    # When the run is recorded as opening
    ledger.begin_open(big, "manifests/run-1/spec.json", now=0.0)
    # Then that is one transaction of two small items, on DynamoDB's 400 KB item limit
    assert ledger.requests == 2  # the read of the (missing) books and spec, the transaction
    spec_item = _table(dynamodb)[("run#run-1", "spec")]
    assert len(json.dumps(spec_item)) < 1_000
    assert DynamoDBLedger(TABLE, client=dynamodb).run("run-1", opening=True).spec == big


def test_a_large_run_opens_in_batches(dynamodb: Any) -> None:
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=130, budget=10**9), now=0.0)
    assert len(ledger.units("run-1")) == 130


def _random_ids_spec(units: int) -> RunSpec:
    rng = random.Random(0)  # UUID-like ids: random hex, as incompressible as real UUIDs
    ids = (f"{rng.getrandbits(128):032x}" for _ in range(units))
    return RunSpec("run-1", "acme", Lane.NORMAL, 10**9, tuple(UnitSpec(i, 10_000) for i in ids))


def test_a_batched_admission_that_a_concurrent_write_cancels_is_decided_again(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run of 5 units, and another fan-out (another Lambda) that admits u2 right after
    # this batch has read the books and the units
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    other = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=5, tokens=100, budget=1_000), now=0.0)
    read = ledger._get_many
    raced: list[bool] = []

    def get_many(keys: list[Any]) -> list[Any]:
        found = read(keys)
        if len(keys) > 2 and not raced:
            raced.append(True)
            other.admit("run-1", "u2", 0, now=1.0)
        return found

    monkeypatch.setattr(ledger, "_get_many", get_many)
    transactions: list[int] = []
    call = ledger._call

    def counted(op: str, **kw: Any) -> Any:
        if op == "transact_write_items":
            transactions.append(len(kw["TransactItems"]))
        return call(op, **kw)

    monkeypatch.setattr(ledger, "_call", counted)
    # When the batch is written: its transaction is cancelled (u2 is not as read)
    admissions = ledger.admit_many("run-1", [f"u{i}" for i in range(5)], now=1.0)
    # Then u0 is admitted on its own, the rest batched again: u2 admitted already, once
    assert raced and transactions == [6, 2, 4]
    assert [a.reason for a in admissions] == [
        "admitted",
        "admitted",
        "already_admitted",
        "admitted",
        "admitted",
    ]
    run = ledger.run("run-1")
    assert (run.in_flight, run.reserved) == (5, 500)


def test_an_invocations_settlements_are_one_transaction_all_or_nothing(dynamodb: Any) -> None:
    # Given five units claimed by one invocation's messages
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=8), now=0.0)
    claims = []
    for i in range(5):
        ledger.admit("run-1", f"u{i}", 0, now=0.0)
        claim = ledger.claim_queued("run-1", f"u{i}", 0, now=1.0, lease_s=30)
        assert claim is not None
        claims.append(claim.unit)
    # When one of them changed since its claim (its worker handed it back, another claimed it)
    assert ledger.unclaim("run-1", "u4", 0, now=1.5, lease_s=30)
    assert ledger.claim("run-1", "u4", 0, now=1.6, lease_s=30).claimed
    before = ledger.run("run-1")
    handed = [ClaimedSettlement(unit, 0, 70, True, 2.0) for unit in claims]
    requests = ledger.requests
    # Then settling them together writes nothing: one request, refused as a whole
    assert ledger.settle_claimed_many(handed) == [None] * 5
    assert ledger.requests == requests + 1
    assert ledger.run("run-1") == before and ledger.attempts("run-1") == []
    # and without it, the other four are settled by one request (one transaction: four units and
    # the books once)
    requests = ledger.requests
    assert ledger.settle_claimed_many(handed[:4]) == [Fate.COMPLETED] * 4
    assert ledger.requests == requests + 1
    run = ledger.run("run-1")
    assert (run.completed, run.spent, run.in_flight) == (4, 280, 1)
    assert [a.unit_id for a in ledger.attempts("run-1")] == ["u0", "u1", "u2", "u3"]


# ------------------------------------------------------------------ agent loops
def _loop_claimed(ledger: DynamoDBLedger, units: int = 2, budget: int = 1_000) -> None:
    ledger.open_run(spec(units=units, tokens=100, budget=budget), now=0.0)
    ledger.admit("run-1", "u0", 0, now=0.0)
    assert ledger.claim_queued("run-1", "u0", 0, now=1.0, lease_s=30, loop=True) is not None


def test_a_turn_is_one_transaction_of_the_unit_the_books_and_its_log_items(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an agent unit claimed as a loop (one conditional write, as any queued claim)
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=2, tokens=100), now=0.0)
    ledger.admit("run-1", "u0", 0, now=0.0)
    calls: list[tuple[str, int]] = []
    call = ledger._call

    def counted(op: str, **kw: Any) -> Any:
        calls.append((op, len(kw.get("TransactItems", []))))
        return call(op, **kw)

    monkeypatch.setattr(ledger, "_call", counted)
    assert ledger.claim_queued("run-1", "u0", 0, now=1.0, lease_s=30, loop=True) is not None
    assert calls == [("update_item", 0)]
    # When a turn settles with two events
    calls.clear()
    events = [(0, {"type": "turn_started", "turn": 1}), (1, {"type": "model_turn", "t": "é"})]
    assert ledger.settle_turn("run-1", "u0", 0, 1, 30, now=2.0, events=events).settled
    # Then it read once and wrote once: the unit, the books and two log items together
    assert calls == [("batch_get_item", 0), ("transact_write_items", 4)]
    # and the items are as documented: the unit points to its log, the events are compact JSON
    table = _table(dynamodb)
    unit = table[("run#run-1", "unit#u0")]
    assert unit["res_loop"] == {"BOOL": True} and unit["res_used"] == {"N": "30"}
    assert unit["turns"] == {"N": "1"} and unit["log"] == {"S": "log#run-1#u0"}
    assert table[("log#run-1#u0", "000000")]["event"] == {"S": '{"type":"turn_started","turn":1}'}
    assert json.loads(table[("log#run-1#u0", "000001")]["event"]["S"])["t"] == "é"
    # and a turn billed nothing is still one transaction (the books only checked)
    calls.clear()
    assert ledger.settle_turn("run-1", "u0", 0, 2, 0, now=3.0).settled
    assert calls == [("batch_get_item", 0), ("transact_write_items", 2)]
    # and an append of one event is one conditional write, of several one transaction
    calls.clear()
    ledger.append_log("run-1", "u0", 2, [{"e": 2}])
    ledger.append_log("run-1", "u0", 3, [{"e": 3}, {"e": 4}])
    assert calls == [("update_item", 0), ("transact_write_items", 2)]
    # and another client (another Lambda) reads the same unit and log
    fresh = DynamoDBLedger(TABLE, client=dynamodb)
    assert fresh.unit("run-1", "u0") == ledger.unit("run-1", "u0")
    assert len(fresh.read_log("run-1", "u0")) == 5


def test_a_turn_settled_on_the_unit_its_worker_knows_reads_nothing_unless_it_moved(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an agent unit claimed as a loop, the claim's answer kept by its worker
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=2, tokens=100), now=0.0)
    ledger.admit("run-1", "u0", 0, now=0.0)
    claim = ledger.claim_queued("run-1", "u0", 0, now=1.0, lease_s=30, loop=True)
    assert claim is not None
    calls: list[tuple[str, int]] = []
    call = ledger._call

    def counted(op: str, **kw: Any) -> Any:
        calls.append((op, len(kw.get("TransactItems", []))))
        return call(op, **kw)

    monkeypatch.setattr(ledger, "_call", counted)
    # When turn 1 settles on the unit it knows
    first = ledger.settle_turn("run-1", "u0", 0, 1, 30, 2.0, [(0, {"e": 0})], known=claim.unit)
    # Then it is one transaction and no read, and the books are those of the read path
    assert first.settled and calls == [("transact_write_items", 3)]
    run = ledger.run("run-1")
    assert (run.spent, run.reserved) == (30, 70)
    # When turn 2 settles on a unit that moved since (another worker settled turn 2 first)
    other = ledger.settle_turn("run-1", "u0", 0, 2, 5, 3.0, known=first.unit)
    assert other.settled
    calls.clear()
    again = ledger.settle_turn("run-1", "u0", 0, 2, 5, 3.0, [(1, {"e": 1})], known=first.unit)
    # Then the write on the stale unit failed, the read found the turn settled: a duplicate,
    # nothing billed twice and nothing of its log written
    assert calls == [("transact_write_items", 3), ("batch_get_item", 0)]
    assert not again.settled and ledger.run("run-1").spent == 35
    assert len(ledger.read_log("run-1", "u0")) == 1


def test_a_log_is_read_a_page_at_a_time_in_seq_order(dynamodb: Any) -> None:
    # Given a log of more than one 1 MB Query page (30 events of ~100 KB)
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    _loop_claimed(ledger)
    for seq in range(30):
        ledger.append_log("run-1", "u0", seq, [{"seq": seq, "blob": "x" * 100_000}])
    before = ledger.requests
    # When it is read, Then every event comes back once, in order, over several pages
    assert [e["seq"] for e in ledger.read_log("run-1", "u0")] == list(range(30))
    assert ledger.requests - before >= 3


def after_first_read(
    monkeypatch: pytest.MonkeyPatch, ledger: DynamoDBLedger, write: Callable[[], object]
) -> list[bool]:
    """Another worker's ``write`` right after ``ledger``'s first read of a run and unit (a
    race, made to happen); the list holds True once it has."""
    read = ledger._read_run_unit
    raced: list[bool] = []

    def read_then_write(run_id: str, unit_id: str) -> Any:
        found = read(run_id, unit_id)
        if not raced:
            raced.append(True)
            write()
        return found

    monkeypatch.setattr(ledger, "_read_run_unit", read_then_write)
    return raced


def test_a_turn_whose_run_stopped_being_open_meanwhile_is_written_on_the_state_read_again(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an agent unit mid-loop, and another worker whose admission exhausts the run right
    # after this turn's settlement read the books (open)
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    other = DynamoDBLedger(TABLE, client=dynamodb)
    _loop_claimed(ledger, units=2, budget=150)

    def exhaust() -> None:
        assert not other.admit("run-1", "u1", 0, now=2.0).admitted  # 150 - 100 < 100

    raced = after_first_read(monkeypatch, ledger, exhaust)
    transactions: list[list[str | None]] = []
    write = ledger._write

    def recorded(writes: list[Any]) -> None:
        try:
            write(writes)
        except Exception as e:
            transactions.append(getattr(e, "codes", []))
            raise
        transactions.append([])

    monkeypatch.setattr(ledger, "_write", recorded)
    # When the turn settles
    settled = ledger.settle_turn("run-1", "u0", 0, 1, 30, now=3.0, events=[(0, {"e": 0})])
    # Then the first transaction was cancelled on the books alone, the second held: the turn is
    # billed once, with its event, and the answer is the state the write was conditioned on
    assert raced and transactions == [["None", "ConditionalCheckFailed", "None"], []]
    assert settled.settled and settled.run_state is RunState.EXHAUSTING
    run = ledger.run("run-1")
    assert (run.state, run.spent, run.reserved) == (RunState.EXHAUSTING, 30, 70)
    assert ledger.read_log("run-1", "u0") == [{"e": 0}]


def test_the_last_of_two_racing_parks_closes_the_exhausting_run(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A park moves a unit from in flight to awaiting, leaving ``outstanding`` as it is, so no
    condition on it orders two parks: each would decide on the books it read (one in flight
    left) and neither would close the run. The park of an exhausting run is conditioned on the
    in-flight count it read (a CI-found race: two loops of one invocation parked together)."""
    # Given an exhausting run whose two admitted loops are claimed (its third unit refused)
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    other = DynamoDBLedger(TABLE, client=dynamodb)
    ledger.open_run(spec(units=3, tokens=100, budget=250), now=0.0)
    for unit_id in ("u0", "u1"):
        ledger.admit("run-1", unit_id, 0, now=0.0)
        assert ledger.claim_queued("run-1", unit_id, 0, now=1.0, lease_s=30, loop=True)
    assert not ledger.admit("run-1", "u2", 0, now=2.0).admitted
    assert ledger.run("run-1").state is RunState.EXHAUSTING
    # and another worker parks u1 right after this one's park of u0 read the books
    raced = after_first_read(
        monkeypatch, ledger, lambda: other.park("run-1", "u1", 0, now=3.0, until=1_000.0)
    )
    # When this one parks u0
    ledger.park("run-1", "u0", 0, now=4.0, until=1_000.0)
    # Then the run is closed: its write was refused on the books it read, and decided again
    run = ledger.run("run-1")
    assert raced and (run.state, run.in_flight, run.awaiting, run.remainder) == (
        RunState.EXHAUSTED, 0, 2, 1,
    )  # fmt: skip


def test_threads_settling_the_same_turn_bill_it_exactly_once(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an agent unit mid-loop, and 8 workers (threads, a client each, one boto3 client
    # underneath, moto patched atomic) that all read it before any of them writes: the same
    # turn delivered 8 times at once
    threads = 8
    _loop_claimed(DynamoDBLedger(TABLE, client=dynamodb))
    barrier = threading.Barrier(threads, timeout=30)
    first_read: set[int] = set()
    results: list[Any] = [None] * threads

    def worker(i: int) -> None:
        ledger = DynamoDBLedger(TABLE, client=dynamodb)
        read = ledger._read_run_unit

        def read_together(run_id: str, unit_id: str) -> Any:
            found = read(run_id, unit_id)
            if i not in first_read:  # every worker decides on the same read
                first_read.add(i)
                barrier.wait()
            return found

        ledger._read_run_unit = read_together  # type: ignore[method-assign]
        try:
            results[i] = ledger.settle_turn(
                "run-1", "u0", 0, 1, 30, now=2.0, events=[(0, {"by": i}), (1, {"by": i})]
            )
        except Exception as e:  # recorded, asserted below
            results[i] = e

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    # Then exactly one settled the turn; every other was answered a duplicate
    assert all(not isinstance(r, Exception) for r in results), results
    winners = [i for i, r in enumerate(results) if r.settled]
    assert len(winners) == 1
    # and the books, the unit and the log hold that one settlement
    ledger = DynamoDBLedger(TABLE, client=dynamodb)
    run, unit = ledger.run("run-1"), ledger.unit("run-1", "u0")
    assert (run.spent, run.reserved, unit.turns, unit.spent) == (30, 70, 1, 30)
    assert ledger.read_log("run-1", "u0") == [{"by": winners[0]}] * 2
