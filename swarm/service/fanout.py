"""Fan-out: one Distributed Map item admits a unit's next attempt in the ledger, then enqueues it
on its lane.

Who pays and where it runs come from the ledger, never from the item: the run's spec (written
by the API from the SigV4-verified caller) holds the tenant, the lane and the budget; the unit's
record its projected tokens and its attempt. The item only names the unit and carries its input
(the manifest the API wrote under ``manifests/<batch>/``), so an item that claims another tenant
or lane changes nothing, and an item of another run than the execution's is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from swarm.core.errors import InvalidInput
from swarm.core.lanes import QueuedUnit
from swarm.core.ports import LaneQueue, Ledger
from swarm.core.prompts import Prompt, from_json


@dataclass
class FanOut:
    """One Distributed Map item: admit the unit's next attempt, then enqueue it on its lane."""

    ledger: Ledger
    queue: LaneQueue
    queue_lease_s: float  # how long a reservation may wait in its lane before it is released

    def admit_and_enqueue(
        self, item: Mapping[str, Any], now: float, batch_id: str | None = None
    ) -> dict[str, Any]:
        """``batch_id``: the execution's batch (its input, which the API or the sweeper wrote);
        an item naming another run is refused (InvalidInput) before anything is written."""
        run_id, unit_id, prompt = _named(item)
        if batch_id is not None and run_id != batch_id:
            raise InvalidInput(
                "unit.run_id", f"item of run {run_id!r} in the execution of batch {batch_id!r}"
            )
        unit = self.ledger.unit(run_id, unit_id)
        if unit.state.terminal:
            return {"unit_id": unit_id, "outcome": unit.state.value}
        attempt = unit.reservation.attempt if unit.reservation else unit.attempts
        admission = self.ledger.admit(run_id, unit_id, attempt, now, self.queue_lease_s)
        if not admission.admitted:
            return {"unit_id": unit_id, "outcome": "remainder", "reason": admission.reason}
        spec = admission.run.spec  # the tenant, lane and budget the API opened the run with
        # a Step Functions retry of this item may send twice: the worker's claim makes it harmless
        self.queue.send(
            QueuedUnit(
                run_id,
                unit_id,
                spec.tenant,
                spec.lane,
                attempt,
                unit.projected_tokens,
                prompt,
            )
        )
        return {"unit_id": unit_id, "outcome": "enqueued", "attempt": attempt}


def _named(item: Mapping[str, Any]) -> tuple[str, str, Prompt]:
    """The run and unit an item names, and its input; a malformed item is an InvalidInput."""
    try:
        run_id, unit_id = item["run_id"], item["unit_id"]
    except KeyError as missing:
        raise InvalidInput(f"unit.{missing.args[0]}", "missing from the manifest item") from None
    if not isinstance(run_id, str) or not isinstance(unit_id, str):
        raise InvalidInput("unit", "a manifest item's run_id and unit_id are strings")
    return run_id, unit_id, from_json(item.get("input", ""))
