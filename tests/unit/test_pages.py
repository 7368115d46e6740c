"""A worker invocation's outcomes written together (swarm.service.pages): one object per run,
once every message has kept its outcome or ended without one."""

from __future__ import annotations

import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from swarm.core.memory import MemoryResults
from swarm.core.results import MAX_PAGED_OUTPUT_BYTES, AttemptOutcome, attempt_key
from swarm.service.pages import Page, keep_outcome


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
