"""The DynamoDB ledger's views: a worker's claim decides on what its own client last read of the
unit, without reading again, and a view never changes an answer."""

from __future__ import annotations

from collections import Counter
from typing import Any

from swarm.adapters.dynamodb_ledger import DynamoDBLedger
from swarm.core.ledger import Fate
from swarm.core.records import RunState
from tests.integration.conftest import TABLE
from tests.ledger_contract import balanced, spec


class Counting:
    """A DynamoDB client that counts the requests made through it."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)

        def counted(**kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(**kwargs)

        return counted


def test_a_workers_read_claim_and_settlement_make_four_requests(dynamodb: Any) -> None:
    # Given a run whose unit the fan-out (another client) admitted
    DynamoDBLedger(TABLE, client=dynamodb).open_run(spec(units=2), now=0.0)
    DynamoDBLedger(TABLE, client=dynamodb).admit("run-1", "u0", 0, now=1.0)
    counting = Counting(dynamodb)
    worker = DynamoDBLedger(TABLE, client=counting)
    worker.run("run-1")  # a client reads a run's (immutable) spec once
    counting.calls.clear()

    # When a worker reads the unit, claims its attempt and settles it
    unit = worker.unit("run-1", "u0")
    assert unit.reservation is not None
    assert worker.claim("run-1", "u0", unit.reservation.attempt, 2.0, 60.0).claimed
    settlement = worker.settle("run-1", "u0", 0, 90, True, now=3.0)

    # Then the claim decided on what the client read (the settlement reads afresh)
    assert settlement.fate is Fate.COMPLETED
    assert counting.calls == {"batch_get_item": 2, "update_item": 1, "transact_write_items": 1}
    balanced(DynamoDBLedger(TABLE, client=dynamodb), "run-1")


def test_a_view_gone_stale_never_changes_an_answer(dynamodb: Any) -> None:
    # Given a unit another worker claimed, as this worker's client saw it
    other = DynamoDBLedger(TABLE, client=dynamodb)
    other.open_run(spec(units=2), now=0.0)
    other.admit("run-1", "u0", 0, now=1.0)
    assert other.claim("run-1", "u0", 0, 2.0, 60.0).claimed
    worker = DynamoDBLedger(TABLE, client=dynamodb)
    assert worker.unit("run-1", "u0").reservation.claimed  # type: ignore[union-attr]

    # When the other worker hands the attempt back (its model call was throttled)
    assert other.unclaim("run-1", "u0", 0, 3.0, 60.0)

    # Then this worker's claim is what a fresh read decides (claimed), not its view's "busy"
    assert worker.claim("run-1", "u0", 0, 4.0, 60.0).claimed
    assert not other.claim("run-1", "u0", 0, 5.0, 60.0).claimed


def _two_claimed(dynamodb: Any, units: int) -> tuple[DynamoDBLedger, DynamoDBLedger]:
    """Two workers (clients), each of which read and then claimed its unit: u0 and u1."""
    a, b = DynamoDBLedger(TABLE, client=dynamodb), DynamoDBLedger(TABLE, client=dynamodb)
    a.open_run(spec(units=units), now=0.0)
    a.admit_many("run-1", ["u0", "u1"], now=1.0)
    for worker, unit_id in ((a, "u0"), (b, "u1")):
        worker.unit("run-1", unit_id)
        assert worker.claim("run-1", unit_id, 0, 2.0, 60.0).claimed
    return a, b


def test_claims_from_views_then_settlements_close_the_run_with_exact_books(dynamodb: Any) -> None:
    # Given two units in flight, each claimed from its own worker's view
    a, b = _two_claimed(dynamodb, units=2)

    # When b settles first, then a, whose view of the books predates b's settlement
    b.settle("run-1", "u1", 0, 70, True, now=3.0)
    last = a.settle("run-1", "u0", 0, 80, True, now=4.0)

    # Then a's settlement is the last one and closes the run, with exact books
    assert last.run.state is RunState.COMPLETED
    run = DynamoDBLedger(TABLE, client=dynamodb).run("run-1")
    assert (run.state, run.completed, run.spent) == (RunState.COMPLETED, 2, 150)
    balanced(DynamoDBLedger(TABLE, client=dynamodb), "run-1")


def test_a_settlement_answers_with_the_books_as_they_stand_after_it(dynamodb: Any) -> None:
    # Given a worker that read and claimed u0, and another that then settled u1
    a, b = _two_claimed(dynamodb, units=3)
    b.settle("run-1", "u1", 0, 70, True, now=3.0)

    # When a settles u0 (the run stays open: u2 is pending)
    settled = a.settle("run-1", "u0", 0, 80, True, now=4.0)

    # Then its answer counts b's settlement too (a view of the books before it would not)
    assert settled.run == DynamoDBLedger(TABLE, client=dynamodb).run("run-1")
    assert (settled.run.completed, settled.run.spent) == (2, 150)


def test_a_settlement_whose_attempt_was_settled_as_lost_is_a_duplicate(dynamodb: Any) -> None:
    # Given a worker that claimed an attempt and outlived its lease: the sweeper settled it lost
    worker = DynamoDBLedger(TABLE, client=dynamodb)
    worker.open_run(spec(units=1), now=0.0)
    worker.admit("run-1", "u0", 0, now=1.0)
    worker.unit("run-1", "u0")
    assert worker.claim("run-1", "u0", 0, 2.0, 10.0).claimed
    assert DynamoDBLedger(TABLE, client=dynamodb).reclaim_unit("run-1", "u0", now=20.0)

    # When the worker settles from its view, Then the ledger's settlement stands
    late = worker.settle("run-1", "u0", 0, 55, True, now=21.0)
    assert late.duplicate
    unit = DynamoDBLedger(TABLE, client=dynamodb).unit("run-1", "u0")
    assert unit.attempts == 1 and unit.spent == 100  # the lost attempt's projection, not 55
    balanced(DynamoDBLedger(TABLE, client=dynamodb), "run-1")
