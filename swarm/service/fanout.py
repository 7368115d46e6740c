"""Fan-out: one Distributed Map item (a chunk of a run's units) admits each unit's next attempt
in the ledger, then enqueues the admitted ones on their lane.

Who pays and where it runs come from the ledger, never from the item: the run's spec (written
by the API from the SigV4-verified caller) holds the tenant, the lane and the budget; the unit's
record its projected tokens and its attempt. The item only names the units and carries their
inputs (the manifest the API wrote under ``manifests/<batch>/``, chunked by
:func:`swarm.service.batches.chunk_units`), so an item that claims another tenant or lane
changes nothing, and an item of another run than the execution's is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from swarm.core.agent import is_agent_input
from swarm.core.burndown import unit_draw
from swarm.core.errors import InvalidInput
from swarm.core.lanes import Bundling, QueuedUnit
from swarm.core.ledger import Admission
from swarm.core.ports import LaneQueue, Ledger, PlaceBooker, requeue_delay
from swarm.core.prompts import Prompt, from_json
from swarm.core.records import Lane
from swarm.core.routes import ModelRoutes

log = logging.getLogger(__name__)


@dataclass
class FanOut:
    """One Distributed Map item: admit each unit's next attempt, then enqueue the admitted."""

    ledger: Ledger
    queue: LaneQueue
    queue_lease_s: float  # how long a reservation may wait in its lane before it is released
    #: books the admitted units' places in their tenant's queue before they are sent (the
    #: governor): each is sent with its place and delayed until it is ready, instead of coming
    #: once to be told when. None: sent at once (the workers queue them)
    places: PlaceBooker | None = None
    #: the model's output burndown: a place is booked for the unit's draw in quota tokens, the
    #: figure its worker draws (swarm.core.burndown.unit_draw), so the place is honoured
    output_burndown: float = 1.0
    #: the registry's models: a unit's place is booked in its model's bucket, at its model's
    #: burndown (each route's governor books places: a PlaceBooker). None: one model, ``places``
    models: ModelRoutes | None = None
    clock: Callable[[], float] = time.time  # when the places are booked (after the admissions)
    #: a unit whose place is ready within this long is sent at once: the worker holds on for
    #: it (WorkerTimings.max_hold_s); a later one is delayed until just after its place is ready
    hold_s: float = 0.0
    #: units due together travel as one message (swarm.core.lanes.bundle): they reach one
    #: worker invocation together (the default: each alone)
    bundling: Bundling = field(default_factory=Bundling)

    def admit_and_enqueue(
        self, item: Mapping[str, Any], now: float, batch_id: str | None = None
    ) -> dict[str, Any]:
        """One unit (``{"run_id", "unit_id", "input"}``): a chunk of one."""
        run_id, unit_id, prompt = _named(item, "unit")
        _check_run(run_id, batch_id, "unit")
        outcome, queued = self._admit(run_id, unit_id, prompt, now)
        if queued is not None:
            self._send([queued])
        return outcome

    def admit_and_enqueue_chunk(
        self, chunk: Mapping[str, Any], now: float, batch_id: str | None = None
    ) -> dict[str, Any]:
        """A manifest chunk ``{"run_id", "units": [{"unit_id", "input"}, ...]}`` (an item
        without ``units`` is one unit: a manifest written before chunks). Every unit is read
        before anything is written, so a malformed chunk writes nothing (InvalidInput); then
        the units are admitted together (:meth:`Ledger.admit_many`: the DynamoDB ledger writes
        up to 99 in one transaction), and the admitted ones are sent together
        (:meth:`LaneQueue.send_many`). If the batched admission fails, each unit is admitted on
        its own, and a unit whose admission fails does not stop the others: they are admitted
        and sent, then the first failure is raised, so Step Functions retries the chunk;
        admission is idempotent (a unit admitted already is admitted again with the same
        attempt) and the worker's claim absorbs a message sent twice."""
        if not isinstance(chunk.get("units"), list):
            return self._summary([self.admit_and_enqueue(chunk, now, batch_id)])
        run_id = chunk.get("run_id")
        if not isinstance(run_id, str):
            raise InvalidInput("chunk.run_id", "a manifest chunk's run_id is a string")
        _check_run(run_id, batch_id, "chunk")
        named = []
        for index, unit in enumerate(chunk["units"]):
            if not isinstance(unit, Mapping):
                raise InvalidInput(f"chunk.units[{index}]", "a manifest unit is an object")
            _, unit_id, prompt = _named({"run_id": run_id, **unit}, f"chunk.units[{index}]")
            named.append((unit_id, prompt))
        try:
            # the units' messages carry their reservations: the run's scan horizon, not the
            # lease index, finds one whose message is gone (Reservation.sweep_at)
            admissions = self.ledger.admit_many(
                run_id, [unit_id for unit_id, _ in named], now, self.queue_lease_s, by_scan=True
            )
        except Exception:  # e.g. a DynamoDB error: unit by unit, each failure on its own
            return self._one_by_one(run_id, named, now)
        outcomes: list[dict[str, Any]] = []
        queued: list[QueuedUnit] = []
        for (unit_id, prompt), admission in zip(named, admissions, strict=True):
            outcome, message = _outcome(run_id, unit_id, prompt, admission)
            outcomes.append(outcome)
            if message is not None:
                queued.append(message)
        if queued:
            self._send(queued)
        return self._summary(outcomes)

    def _send(self, queued: Sequence[QueuedUnit]) -> None:
        """Send the admitted units, each with its place booked (:attr:`places`) and delayed
        until the place is ready (a unit past the booking horizon: until its tokens would be
        there). A booking that fails sends the units at once, as without a booker: a place is
        an economy (the unit's first try, one receive, invocation and requeue), never a
        condition of the unit's run."""
        items, delays = list(queued), [0.0] * len(queued)
        groups: dict[tuple[Lane, str, str], list[int]] = {}
        for index, item in enumerate(items):
            if not is_agent_input(item.input):  # an agent unit draws turn by turn, unbooked
                model = "" if self.models is None else self.models.name_of(item.input)
                groups.setdefault((item.lane, item.tenant, model), []).append(index)
        for (lane, tenant, _model), indexes in groups.items():
            if self.places is None:
                break
            places, burndown = self.places, self.output_burndown
            try:
                if self.models is not None:
                    governor = self.models.of(items[indexes[0]].input).governor
                    places, burndown = cast(PlaceBooker, governor), governor.config.output_burndown
                amounts = [unit_draw(items[i].tokens, items[i].input, burndown) for i in indexes]
                draws = places.book_places(amounts, lane, tenant, self.clock())
            except Exception:
                log.exception("booking %d places for %s on %s failed", len(indexes), tenant, lane)
                continue
            for i, draw in zip(indexes, draws, strict=True):
                if draw.ticket is not None:  # bound to the attempt, as a worker's booking is
                    ticket = replace(draw.ticket, tag=str(items[i].attempt))
                    items[i] = replace(items[i], ticket=ticket)
                # a wait the worker holds on for anyway is not worth a second of delay
                delays[i] = requeue_delay(draw.wait_s) if draw.wait_s > self.hold_s else 0
        # units due together go together: each bundle is delayed until its last unit is due
        self.queue.send_bundles(self.bundling.of(items, delays))

    def _one_by_one(
        self, run_id: str, named: Sequence[tuple[str, Prompt]], now: float
    ) -> dict[str, Any]:
        outcomes: list[dict[str, Any]] = []
        queued: list[QueuedUnit] = []
        failure: Exception | None = None
        for unit_id, prompt in named:
            try:
                outcome, message = self._admit(run_id, unit_id, prompt, now)
            except Exception as e:
                failure = failure or e
                outcomes.append({"unit_id": unit_id, "outcome": "failed"})
                continue
            outcomes.append(outcome)
            if message is not None:
                queued.append(message)
        if queued:
            self._send(queued)
        if failure is not None:
            raise failure
        return self._summary(outcomes)

    def _admit(
        self, run_id: str, unit_id: str, prompt: Prompt, now: float
    ) -> tuple[dict[str, Any], QueuedUnit | None]:
        """The unit's admission, and the message to send if it was admitted."""
        unit = self.ledger.unit(run_id, unit_id)
        if unit.state.terminal:
            return {"unit_id": unit_id, "outcome": unit.state.value}, None
        admission = self.ledger.admit(
            run_id, unit_id, unit.next_attempt, now, self.queue_lease_s, by_scan=True
        )
        return _outcome(run_id, unit_id, prompt, admission)

    @staticmethod
    def _summary(outcomes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A child's output (the map's results file holds one per chunk): each unit's outcome
        (``enqueued`` with its attempt, ``remainder`` with the reason, or its terminal state),
        and the count of each."""
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[str(o["outcome"])] = counts.get(str(o["outcome"]), 0) + 1
        return {"units": [dict(o) for o in outcomes], "counts": counts}


def _outcome(
    run_id: str, unit_id: str, prompt: Prompt, admission: Admission
) -> tuple[dict[str, Any], QueuedUnit | None]:
    """A unit's outcome, and the message to send if it was admitted."""
    if admission.reason == "terminal":
        return {"unit_id": unit_id, "outcome": admission.unit.state.value}, None
    if not admission.admitted:
        return {"unit_id": unit_id, "outcome": "remainder", "reason": admission.reason}, None
    spec = admission.run.spec  # the tenant, lane and budget the API opened the run with
    attempt = admission.unit.next_attempt
    # a Step Functions retry of this item may send twice: the worker's claim makes it harmless
    message = QueuedUnit(
        run_id, unit_id, spec.tenant, spec.lane, attempt, admission.unit.projected_tokens, prompt
    )
    return {"unit_id": unit_id, "outcome": "enqueued", "attempt": attempt}, message


def _check_run(run_id: str, batch_id: str | None, field: str) -> None:
    """``batch_id``: the execution's batch (its input, which the API or the sweeper wrote); an
    item naming another run is refused (InvalidInput) before anything is written."""
    if batch_id is not None and run_id != batch_id:
        raise InvalidInput(
            f"{field}.run_id", f"item of run {run_id!r} in the execution of batch {batch_id!r}"
        )


def _named(item: Mapping[str, Any], field: str) -> tuple[str, str, Prompt]:
    """The run and unit an item names, and its input; a malformed item is an InvalidInput."""
    try:
        run_id, unit_id = item["run_id"], item["unit_id"]
    except KeyError as missing:
        raise InvalidInput(f"{field}.{missing.args[0]}", "missing from the manifest item") from None
    if not isinstance(run_id, str) or not isinstance(unit_id, str):
        raise InvalidInput(field, "a manifest item's run_id and unit_id are strings")
    return run_id, unit_id, from_json(item.get("input", ""))
