"""The open step (the first state of statemachines/fanout.asl.json, ``OpenUnits``): write a run's
unit records in pages, then mark it ready.

The submit recorded the run as ``opening`` (its run-level spec and books: O(1) writes) and put
its unit list in S3 (``manifests/<run>/spec.json``); each invocation reads that object, writes
as many unit items as fit its time (``page_units`` at most), and returns a cursor the state
machine's Choice loops on until the run is open. Re-running it from any cursor is idempotent:
units cannot change before the run is ready, and a run open already is left alone (a restarted
execution passes through at the cost of one read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from swarm.api.models import MAX_MANIFEST_UNITS
from swarm.core.codec import spec_from_doc
from swarm.core.errors import Conflict
from swarm.core.ports import BlobStore, Ledger
from swarm.core.records import RunState

#: units one invocation writes at most (4,000 BatchWriteItem requests of 25); it also stops when
#: its time runs short (functions/finalizer.py's margin), whichever comes first
DEFAULT_PAGE_UNITS = 100_000

#: the spec object's size at most: 100,000 units of 128-character ids and their token counts
MAX_SPEC_BYTES = MAX_MANIFEST_UNITS * 160 + 1024 * 1024


@dataclass
class Opener:
    ledger: Ledger
    blobs: BlobStore
    page_units: int = DEFAULT_PAGE_UNITS

    def open(
        self,
        run_id: str,
        spec_key: str,
        cursor: int,
        now: float,
        keep_going: Callable[[], bool] = lambda: True,
    ) -> dict[str, Any]:
        """One page of the open: ``{"cursor": next, "done": the run is open, "units": total}``."""
        run = self.ledger.run(run_id, opening=True)
        if run.state is not RunState.OPENING:
            return {
                "cursor": run.units_total,
                "done": True,
                "units": run.units_total,
                "spec_key": spec_key,
            }
        spec = spec_from_doc(self.blobs.get_json(spec_key, max_bytes=MAX_SPEC_BYTES))
        if spec != run.spec:  # the digest too: never open a run with another batch's units
            raise Conflict(f"{spec_key!r} is not the spec of run {run_id!r}")
        cursor = self.ledger.open_units(spec, max(0, cursor), self.page_units, now, keep_going)
        done = cursor >= spec.units_total
        return {"cursor": cursor, "done": done, "units": spec.units_total, "spec_key": spec_key}


def open_at_once(
    ledger: Ledger, blobs: BlobStore, now: float = 0.0
) -> Callable[[Mapping[str, Any]], None]:
    """The open step of an execution input (``{"batch_id", "open": {"spec_key", "cursor"}}``)
    run to the end at once, page after page as the state machine's Choice loops: the in-memory
    stack's executions (:class:`swarm.core.memory.MemoryExecutions`)."""
    opener = Opener(ledger, blobs)

    def step(payload: Mapping[str, Any]) -> None:
        state = dict(payload["open"])
        while not state.get("done"):
            state = opener.open(
                str(payload["batch_id"]), str(state["spec_key"]), int(state["cursor"]), now
            )

    return step
