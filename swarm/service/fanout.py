"""Fan-out: one Distributed Map item admits a unit's next attempt in the ledger, then enqueues it
on its lane."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from swarm.core import codec
from swarm.core.lanes import QueuedUnit
from swarm.core.ports import LaneQueue, Ledger


@dataclass
class FanOut:
    """One Distributed Map item: admit the unit's next attempt, then enqueue it on its lane."""

    ledger: Ledger
    queue: LaneQueue
    queue_lease_s: float  # how long a reservation may wait in its lane before it is released

    def admit_and_enqueue(self, item: Mapping[str, Any], now: float) -> dict[str, Any]:
        queued = codec.queued_from_doc(dict(item))
        unit = self.ledger.unit(queued.run_id, queued.unit_id)
        if unit.state.terminal:
            return {"unit_id": queued.unit_id, "outcome": unit.state.value}
        attempt = unit.reservation.attempt if unit.reservation else unit.attempts
        admission = self.ledger.admit(
            queued.run_id, queued.unit_id, attempt, now, self.queue_lease_s
        )
        if not admission.admitted:
            return {"unit_id": queued.unit_id, "outcome": "remainder", "reason": admission.reason}
        # a Step Functions retry of this item may send twice: the worker's claim makes it harmless
        self.queue.send(
            QueuedUnit(
                queued.run_id,
                queued.unit_id,
                queued.tenant,
                queued.lane,
                attempt,
                unit.projected_tokens,
                queued.input,
            )
        )
        return {"unit_id": queued.unit_id, "outcome": "enqueued", "attempt": attempt}
