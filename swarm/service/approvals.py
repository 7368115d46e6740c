"""Human gates: the tool calls that wait for a person's decision, and the decisions.

A gated tool call (docs/agents.md, "Human gates") parks its agent unit: the worker records
``approval_requested`` and the ledger holds the unit ``awaiting_approval`` with its reservation,
no message and no worker. This module is the other side:

- :meth:`Gates.waiting` lists a batch's waiting calls (the unit, the tool, its input, its
  toolUseId, how long it has waited);
- :meth:`Gates.decide` records one decision (``approve`` | ``reject``, a reason, who, when)
  as an ``approval_decided`` event: a repeat of the same decision answers the recorded one, a
  different one is a Conflict (409). The decision that leaves none of the unit's calls waiting
  moves the unit out of ``awaiting_approval`` in the same write (``Ledger.unpark``), then sends
  it to its lane; a send that fails leaves an unclaimed reservation whose lease runs out, and
  :meth:`Gates.sweep` (the finalizer's and the sweeper's poll) sends it again;
- :meth:`Gates.sweep` also rejects the calls nobody decided within the deployment's
  ``approvals.timeout_hours`` (the parked reservation's lease is that timeout, so the ledger's
  lease index finds them without reading every unit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from swarm.contract import MAX_APPROVAL_TIMEOUT_HOURS
from swarm.core import agent
from swarm.core.errors import Conflict, Contended, InvalidInput, NotFound
from swarm.core.lanes import QueuedUnit
from swarm.core.ports import BlobStore, LaneQueue, Ledger
from swarm.core.records import RunRecord, RunState, UnitRecord, UnitState
from swarm.service.batches import manifest_key, manifest_units

log = logging.getLogger(__name__)

#: who decides a call nobody decided in time (the ``by`` of its ``approval_decided``)
TIMEOUT_DECIDER: Final = "swarm:approvals-timeout"
#: how many times a decision is tried again when another decision moved the log meanwhile
_TRIES: Final = 4


@dataclass(frozen=True)
class GateDecision:
    """What a decision did: the recorded ``approval_decided`` event, whether this call recorded
    it (False: it was recorded before, a repeat), and whether the unit went back to its lane
    (False: other calls of it still wait, or its batch's budget ran out: the remainder)."""

    event: dict[str, Any]
    recorded: bool
    queued: bool
    unit_state: str

    def doc(self, run_id: str, unit_id: str) -> dict[str, Any]:
        e = self.event
        return {
            "batch_id": run_id,
            "unit_id": unit_id,
            "toolUseId": e["toolUseId"],
            "tool": e["name"],
            "decision": e["decision"],
            "reason": e["reason"],
            "decided_by": e["by"],
            "decided_at": e["at"],
            "waited_s": e["waited_s"],
            "recorded": self.recorded,
            "unit_state": self.unit_state,
        }


@dataclass
class Gates:
    ledger: Ledger
    queue: LaneQueue
    blobs: BlobStore
    #: a unit sent back to its lane holds an unclaimed reservation this long (the lanes'
    #: visibility timeout): past it, :meth:`sweep` sends it again
    lease_s: float

    def _parked(self, run_id: str, now: float) -> Iterator[UnitRecord]:
        """The run's parked units. A parked unit's lease is its approvals' timeout, so the
        ledger's lease index lists it among the run's leased units (those in flight too, as
        many as run at once): one keys-only Query of the index, then a read of each listed
        unit, never a read of every unit of the batch. The index is eventually consistent: a
        unit parked a moment ago may be listed on the next call."""
        # every parked lease ends within the longest timeout (the local stack's faster clock
        # parks for less wall time, never more)
        horizon = now + MAX_APPROVAL_TIMEOUT_HOURS * 3600
        for unit_id in self.ledger.expired_leases(run_id, horizon):
            try:
                unit = self.ledger.unit(run_id, unit_id)
            except NotFound:
                continue
            if unit.state is UnitState.AWAITING_APPROVAL and unit.reservation is not None:
                yield unit

    def waiting(self, run: RunRecord, now: float) -> list[dict[str, Any]]:
        """Every call of the run that waits for a decision, the longest waiting first: each
        parked unit (:meth:`_parked`) and its log read."""
        out: list[dict[str, Any]] = []
        for unit in self._parked(run.run_id, now):
            for e in agent.waiting_approvals(self.ledger.read_log(run.run_id, unit.unit_id)):
                out.append(
                    {
                        "unit_id": unit.unit_id,
                        "toolUseId": e["toolUseId"],
                        "tool": e["name"],
                        "input": e["input"],
                        "turn": e["turn"],
                        "requested_at": e["at"],
                        "waited_s": round(max(0.0, now - float(e["at"])), 3),
                    }
                )
        out.sort(key=lambda w: (w["requested_at"], w["unit_id"], w["toolUseId"]))
        return out

    def next_timeout(self, run_id: str, now: float) -> float | None:
        """When the run's first parked unit times out (its lease), None if none is listed: a
        closed run's parked units are looked at again then (``Finalizer.finalize``)."""
        ends = [u.reservation.lease_expires for u in self._parked(run_id, now) if u.reservation]
        return min(ends, default=None)

    def decide(
        self,
        run: RunRecord,
        unit_id: str,
        tool_use_id: str,
        decision: str,
        reason: str,
        by: str,
        now: float,
        may_decide: Callable[[str], None] | None = None,
    ) -> GateDecision:
        """Record ``decision`` on call ``tool_use_id`` of unit ``unit_id`` (NotFound: no such
        unit, or no such call waits or waited; Conflict: a different decision was recorded).
        ``may_decide`` is called with the call's tool name once the call is found, before
        anything is answered of it (it raises to refuse the caller: who decides depends on the
        tool)."""
        if decision not in agent.DECISIONS:
            raise InvalidInput("decision", f'must be "approve" or "reject", got {decision!r}')
        for _ in range(_TRIES):
            unit = self.ledger.unit(run.run_id, unit_id)  # NotFound: no such unit
            events = self.ledger.read_log(run.run_id, unit_id)
            requested, recorded = _find(events, tool_use_id)
            if requested is None:
                raise NotFound(
                    f"unit {unit_id!r} of batch {run.run_id!r} has no tool call {tool_use_id!r} "
                    "waiting for a decision"
                )
            if may_decide is not None:
                may_decide(requested["name"])
            if recorded is not None:
                if recorded["decision"] != decision:
                    why = recorded["reason"] or "no reason"
                    raise Conflict(
                        f"call {tool_use_id!r} of unit {unit_id!r} was decided already: "
                        f"{recorded['decision']} by {recorded['by']} ({why})"
                    )
                return GateDecision(recorded, False, False, unit.state.value)
            event = agent.approval_decided(requested, decision, reason, by, now)
            try:
                return self._record(run, unit, events, event, now)
            except Contended:
                continue  # another decision of the unit moved its log: read it again
        raise Conflict(f"the decisions on unit {unit_id!r} kept colliding; try again")

    def _record(
        self,
        run: RunRecord,
        unit: UnitRecord,
        events: list[dict[str, Any]],
        event: dict[str, Any],
        now: float,
    ) -> GateDecision:
        if unit.state is not UnitState.AWAITING_APPROVAL:
            raise Conflict(
                f"unit {unit.unit_id!r} is {unit.state.value}, not awaiting an approval; "
                "read its transcript"
            )
        if agent.waiting_approvals([*events, event]):  # other calls of the unit still wait
            self.ledger.append_log(run.run_id, unit.unit_id, len(events), [event])
            return GateDecision(event, True, False, unit.state.value)
        _, after, queued = self.ledger.unpark(
            run.run_id, unit.unit_id, now, self.lease_s, [(len(events), event)]
        )
        if queued:
            try:
                self.send(run, after)
            except Exception:  # recorded: the sweep sends it once its lease runs out
                log.exception("sending unit %s back to its lane failed", unit.unit_id)
        state = after.state.value if queued else UnitState.REMAINDER.value
        return GateDecision(event, True, queued, state)

    def send(self, run: RunRecord, unit: UnitRecord) -> None:
        """Send the unit, in flight with an unclaimed reservation, to its lane (its input from
        the batch's manifest)."""
        res = unit.reservation
        if res is None:
            return
        units = manifest_units(self.blobs.get_json(manifest_key(run.run_id)))
        given = next((u.get("input", "") for u in units if u.get("unit_id") == unit.unit_id), "")
        self.queue.send(
            QueuedUnit(
                run.run_id,
                unit.unit_id,
                run.spec.tenant,
                run.spec.lane,
                res.attempt,
                unit.projected_tokens,
                given,
            )
        )

    def sweep(self, run_id: str, now: float, keep_going: Callable[[], bool]) -> None:
        """The expired leases of the run's gates: a parked unit past its timeout has its
        waiting calls rejected (and goes back to its lane); a decided unit whose message never
        reached a worker (its send failed) is sent again, with a fresh lease."""
        for i, unit_id in enumerate(self.ledger.expired_leases(run_id, now)):
            if i and not keep_going():
                return
            unit = self.ledger.unit(run_id, unit_id)
            res = unit.reservation
            if res is None or res.lease_expires > now:
                continue
            if unit.state is UnitState.AWAITING_APPROVAL:
                self._time_out(run_id, unit_id, now)
            elif unit.state is UnitState.IN_FLIGHT and res.loop and not res.claimed:
                events = self.ledger.read_log(run_id, unit_id)
                if events and events[-1].get("type") == "approval_decided":
                    run = self.ledger.run(run_id)
                    if run.state is not RunState.OPEN:
                        continue  # the lease sweep releases it: the remainder
                    if self.ledger.unclaim(run_id, unit_id, res.attempt, now, self.lease_s):
                        self.send(run, self.ledger.unit(run_id, unit_id))

    def _time_out(self, run_id: str, unit_id: str, now: float) -> None:
        run = self.ledger.run(run_id)
        for e in agent.waiting_approvals(self.ledger.read_log(run_id, unit_id)):
            hours = (now - float(e["at"])) / 3600
            reason = f"timed out: nobody decided within {hours:.1f} hours (approvals.timeout_hours)"
            try:
                self.decide(run, unit_id, e["toolUseId"], "reject", reason, TIMEOUT_DECIDER, now)
            except Conflict:  # a person decided meanwhile
                continue


def _find(
    events: list[dict[str, Any]], tool_use_id: str
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The ``approval_requested`` event of ``tool_use_id`` and its ``approval_decided``, if
    any, anywhere in the log."""
    requested = decided = None
    for e in events:
        if e.get("toolUseId") != tool_use_id:
            continue
        if e.get("type") == "approval_requested":
            requested = e
        elif e.get("type") == "approval_decided":
            decided = e
    return requested, decided
