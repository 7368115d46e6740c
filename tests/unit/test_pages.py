"""A worker invocation's outcomes written together (swarm.service.pages): one object per run,
once every message has kept its outcome or ended without one; then their settlements, in one
ledger write once every message that kept an outcome has handed its settlement or ended."""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from swarm.core.ledger import Fate
from swarm.core.memory import MemoryResults
from swarm.core.ports import ClaimedSettlement
from swarm.core.records import UnitRecord
from swarm.core.results import MAX_PAGED_OUTPUT_BYTES, AttemptOutcome, attempt_key
from swarm.service.pages import Page, keep_outcome, settle_claimed


def outcome(run_id: str, unit_id: str, output: str = "ok") -> AttemptOutcome:
    return AttemptOutcome(run_id, unit_id, 0, True, 10, output=output)


def run_batch(page: Page, steps: list[Any]) -> list[Any]:
    """Each step runs as one message of the invocation, on a thread of its own."""

    def message(step: Any) -> Any:
        with page.message():
            return step()

    with ThreadPoolExecutor(max_workers=len(steps)) as pool:
        futures = [pool.submit(contextvars.copy_context().run, message, s) for s in steps]
        return [f.result(timeout=10) for f in futures]


def test_an_invocations_outcomes_are_one_object_per_run_written_once_all_are_in() -> None:
    store = MemoryResults()
    page = Page(5)
    seen = threading.Barrier(3, timeout=10)  # the three keeping messages are in at once

    def keeps(run_id: str, unit_id: str) -> Any:
        def step() -> str | None:
            seen.wait()
            return keep_outcome(store, outcome(run_id, unit_id))

        return step

    # Given a batch of five messages: three keep an outcome (two runs), two end without one
    steps = [keeps("b-1", "u1"), keeps("b-1", "u2"), keeps("b-2", "u1"), lambda: None]
    keys = run_batch(page, [*steps, lambda: None])
    # Then one object per run holds its outcomes, each message told which
    assert page.writes == 2 and keys[0] == keys[1] != keys[2] and None not in keys[:3]
    assert store.outcomes("b-1", [("u1", 0, keys[0]), ("u2", 0, keys[1])]) == [
        outcome("b-1", "u1"),
        outcome("b-1", "u2"),
    ]
    assert store.outcomes("b-2", [("u1", 0, keys[2])]) == [outcome("b-2", "u1")]


def test_an_output_too_long_for_a_page_is_kept_alone() -> None:
    store, page = MemoryResults(), Page(2)
    long = outcome("b-1", "u1", "x" * (MAX_PAGED_OUTPUT_BYTES + 1))
    keys = run_batch(
        page,
        [lambda: keep_outcome(store, long), lambda: keep_outcome(store, outcome("b-1", "u2"))],
    )
    assert keys[0] == attempt_key("b-1", "u1", 0)  # its link reads exactly it
    assert page.writes == 1 and keys[1] != keys[0]


def test_a_failed_write_fails_every_message_waiting_on_it() -> None:
    class Broken(MemoryResults):
        def record_page(self, run_id: str, outcomes: Any) -> str:
            raise RuntimeError("S3 is unreachable")

    store, page = Broken(), Page(2)
    steps = [lambda u=u: keep_outcome(store, outcome("b-1", u)) for u in ("u1", "u2")]
    with pytest.raises(RuntimeError, match="unreachable"):
        run_batch(page, steps)


def test_outside_an_invocation_an_outcome_is_kept_alone_under_its_own_key() -> None:
    store = MemoryResults()
    assert keep_outcome(store, outcome("b-1", "u1")) is None  # the ledger's default: its own key
    assert store.outcomes("b-1", [("u1", 0, None)]) == [outcome("b-1", "u1")]


class Settlements:
    """A ledger's settlement calls, recorded: together (one list per call), or alone."""

    def __init__(self, together: bool = True) -> None:
        self.together = together  # False: the write of them all fails (every fate None)
        self.many: list[list[str]] = []
        self.alone: list[str] = []
        self.lock = threading.Lock()

    def settle_claimed_many(self, settlements: list[ClaimedSettlement]) -> list[Fate | None]:
        with self.lock:
            self.many.append([c.claimed.unit_id for c in settlements])
        return [Fate.COMPLETED if self.together else None for _ in settlements]

    def settle_claimed(self, claimed: UnitRecord, *args: Any, **kwargs: Any) -> Fate | None:
        with self.lock:
            self.alone.append(claimed.unit_id)
        return Fate.RETRY


def settles(store: MemoryResults, ledger: Settlements, unit_id: str, fail: bool = False) -> Any:
    def step() -> Fate | None:
        keep_outcome(store, outcome("b-1", unit_id))
        if fail:  # kept its outcome, then raised before settling
            raise RuntimeError("the model's answer was unreadable")
        unit = UnitRecord("b-1", unit_id, 100)
        return settle_claimed(ledger, ClaimedSettlement(unit, 0, 10, True, 1.0))  # type: ignore[arg-type]

    return step


def test_an_invocations_settlements_are_one_write_once_all_are_in() -> None:
    # Given four messages: three keep an outcome and settle, one ends without an outcome
    store, ledger, page = MemoryResults(), Settlements(), Page(4)
    steps = [settles(store, ledger, u) for u in ("u1", "u2", "u3")]
    fates = run_batch(page, [*steps, lambda: None])
    # Then their settlements are one call, made once all three were in
    assert sorted(map(sorted, ledger.many)) == [["u1", "u2", "u3"]] and ledger.alone == []
    assert fates[:3] == [Fate.COMPLETED] * 3 and page.together == 3


def test_a_message_that_kept_an_outcome_and_ended_without_settling_is_not_waited_for() -> None:
    store, ledger, page = MemoryResults(), Settlements(), Page(3)
    steps = [settles(store, ledger, "u1"), settles(store, ledger, "u2", fail=True)]
    with ThreadPoolExecutor(max_workers=3) as pool:

        def message(step: Any) -> Any:
            with page.message():
                return step()

        futures = [pool.submit(contextvars.copy_context().run, message, s) for s in steps]
        futures.append(pool.submit(contextvars.copy_context().run, message, lambda: None))
        assert futures[0].result(timeout=10) is Fate.COMPLETED
        with pytest.raises(RuntimeError, match="unreadable"):
            futures[1].result(timeout=10)
    assert ledger.many == [["u1"]]


def test_settlements_the_write_of_them_all_did_not_make_are_made_alone() -> None:
    store, ledger, page = MemoryResults(), Settlements(together=False), Page(2)
    fates = run_batch(page, [settles(store, ledger, "u1"), settles(store, ledger, "u2")])
    assert len(ledger.many) == 1 and sorted(ledger.alone) == ["u1", "u2"]
    assert fates == [Fate.RETRY, Fate.RETRY]  # what settling alone answered


def test_outside_an_invocation_a_settlement_is_made_alone() -> None:
    ledger = Settlements()
    unit = UnitRecord("b-1", "u1", 100)
    fate = settle_claimed(ledger, ClaimedSettlement(unit, 0, 10, True, 1.0))  # type: ignore[arg-type]
    assert fate is Fate.RETRY and ledger.alone == ["u1"] and ledger.many == []


def test_a_settlement_made_alone_keeps_its_no_retry() -> None:
    # Given a failed attempt that must not be retried (an agent loop the model refused, or one
    # that cannot run on this deployment), settled alone (outside a page, or after the page's
    # write of them all failed)
    seen: list[bool] = []

    class Alone(Settlements):
        def settle_claimed(
            self, claimed: UnitRecord, *args: Any, retry: bool = True, **kwargs: Any
        ) -> Fate:
            seen.append(retry)
            return Fate.RETRY if retry else Fate.DEAD_LETTERED

    unit = UnitRecord("b-1", "u1", 100)
    claimed = ClaimedSettlement(unit, 0, 0, False, 1.0, retry=False)
    # Then the ledger is told so: the unit is dead-lettered, not retried
    assert settle_claimed(Alone(), claimed) is Fate.DEAD_LETTERED  # type: ignore[arg-type]
    assert seen == [False]
