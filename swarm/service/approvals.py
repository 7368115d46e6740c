"""Human gates: the tool calls that wait for a person's decision, and the decisions.

A gated tool call (docs/agents.md, "Human gates") parks its agent unit: the worker records
``approval_requested`` and the ledger holds the unit ``awaiting_approval`` with its reservation,
no message and no worker. This module is the other side:

- :meth:`Gates.waiting` lists a batch's waiting calls (the unit, the tool, its input, its
  toolUseId, how long it has waited), a page of parked units at a time (``next_token``);
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

import base64
import binascii
import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from swarm.api.models import (
    DEFAULT_APPROVALS_PAGE,
    MAX_APPROVALS_PAGE,
    MAX_RESULTS_PAGE_BYTES,
    response_bytes,
)
from swarm.contract import MAX_APPROVAL_TIMEOUT_HOURS
from swarm.core import agent
from swarm.core.errors import Conflict, Contended, InvalidInput, NotFound
from swarm.core.lanes import QueuedUnit
from swarm.core.ports import BlobStore, LaneQueue, LeaseKey, Ledger
from swarm.core.records import RunRecord, RunState, UnitRecord, UnitState, check_id
from swarm.core.results import always
from swarm.service.batches import manifest_key, manifest_units

log = logging.getLogger(__name__)

#: who decides a call nobody decided in time (the ``by`` of its ``approval_decided``)
TIMEOUT_DECIDER: Final = "swarm:approvals-timeout"
#: how many times a decision is tried again when another decision moved the log meanwhile
_TRIES: Final = 4
#: index entries asked for at a time (one keys-only Query each)
_INDEX_PAGE: Final = MAX_APPROVALS_PAGE
#: units of the lease index one page of approvals reads at most (the in-flight units the index
#: lists beside the parked ones too): a page answers well within API Gateway's 29 s, and the
#: token goes on from there
LOOK_BUDGET: Final = 2 * MAX_APPROVALS_PAGE


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

    def _parked_unit(self, run_id: str, unit_id: str) -> UnitRecord | None:
        """The unit, if it is parked (the index may list it a moment after it moved on)."""
        try:
            unit = self.ledger.unit(run_id, unit_id)
        except NotFound:
            return None
        if unit.state is UnitState.AWAITING_APPROVAL and unit.reservation is not None:
            return unit
        return None

    def _listed(
        self, run_id: str, now: float, after: LeaseKey | None, ask: Callable[[], int]
    ) -> Iterator[tuple[LeaseKey, bool]]:
        """The run's leased units from the position ``after`` on, as the ledger's lease index
        lists them (a parked unit's lease is its approvals' timeout, so the index lists it
        among the run's leased units, those in flight too: as many as run at once), each with
        whether more entries may follow it: keys-only Queries of the index, ``ask()`` entries
        at a time, never a read of every unit of the batch. The index is eventually
        consistent: a unit parked a moment ago may be listed on the next call."""
        # every parked lease ends within the longest timeout (the local stack's faster clock
        # parks for less wall time, never more)
        horizon = now + MAX_APPROVAL_TIMEOUT_HOURS * 3600
        while True:
            page = self.ledger.leases_page(run_id, horizon, after, min(ask(), _INDEX_PAGE))
            for i, key in enumerate(page.keys):
                yield key, page.more or i < len(page.keys) - 1
            if not page.more or not page.keys:
                return
            after = page.keys[-1]

    def waiting(
        self,
        run: RunRecord,
        now: float,
        limit: int = DEFAULT_APPROVALS_PAGE,
        next_token: str | None = None,
        extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        keep_going: Callable[[], bool] = always,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the run's calls that wait for a decision, and the token of the next
        page (None: the last). A page holds the calls of up to ``limit`` parked units, in the
        lease index's order (a parked unit's lease is its park time plus the timeout: the
        longest waiting first), each unit's calls in the order they were asked for; a unit's
        calls are never split across pages. A page also stops before the unit that would take
        its answer past :data:`MAX_RESULTS_PAGE_BYTES` (as Lambda's response carries it:
        JSON-escaped), after :data:`LOOK_BUDGET` units of the index are read, or when
        ``keep_going()`` turns False (after one unit at least): the token goes on from there.
        ``extra`` adds fields to each call (counted in the page's bytes)."""
        after = decode_token(run.run_id, next_token) if next_token is not None else None
        out: list[dict[str, Any]] = []
        listed: list[str] = []  # the page's parked units so far (the index is asked for more)
        size = 0
        listing = self._listed(run.run_id, now, after, lambda: limit - len(listed))
        for looked, (key, more) in enumerate(listing):
            # a cut before this unit goes on from the last one looked at (there is one: looked)
            if looked and after is not None and (looked >= LOOK_BUDGET or not keep_going()):
                return out, encode_token(run.run_id, after)
            calls = self._calls(run.run_id, key.unit_id, now, extra)
            line = sum(response_bytes(c) for c in calls)
            if calls and listed and after is not None and size + line > MAX_RESULTS_PAGE_BYTES:
                return out, encode_token(run.run_id, after)  # this unit opens the next page
            if calls:
                out.extend(calls)
                size += line
                listed.append(key.unit_id)
            after = key
            if len(listed) == limit or not more:
                return out, encode_token(run.run_id, key) if more else None
        return out, None

    def _calls(
        self,
        run_id: str,
        unit_id: str,
        now: float,
        extra: Callable[[dict[str, Any]], dict[str, Any]] | None,
    ) -> list[dict[str, Any]]:
        """The calls of the unit that wait for a decision (none: it is not parked)."""
        unit = self._parked_unit(run_id, unit_id)
        if unit is None:
            return []
        calls = []
        for e in agent.waiting_approvals(self.ledger.read_log(run_id, unit_id)):
            call = {
                "unit_id": unit_id,
                "toolUseId": e["toolUseId"],
                "tool": e["name"],
                "input": e["input"],
                "turn": e["turn"],
                "requested_at": e["at"],
                "waited_s": round(max(0.0, now - float(e["at"])), 3),
            }
            calls.append(call if extra is None else {**call, **extra(call)})
        return calls

    def next_timeout(self, run_id: str, now: float) -> float | None:
        """When the run's first parked unit times out (its lease), None if none is listed: a
        closed run's parked units are looked at again then (``Finalizer.finalize``). The index
        lists leases in their order, so the first parked unit it lists is the one: the units
        listed after it are not read."""
        for key, _ in self._listed(run_id, now, None, lambda: _INDEX_PAGE):
            unit = self._parked_unit(run_id, key.unit_id)
            if unit is not None and unit.reservation is not None:
                return unit.reservation.lease_expires
        return None

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


def encode_token(run_id: str, key: LeaseKey) -> str:
    """A page's ``next_token``: the batch and the position in its lease index after the page's
    last unit (opaque to callers)."""
    raw = json.dumps({"b": run_id, "l": key.lease, "u": key.unit_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(run_id: str, token: str) -> LeaseKey:
    """The position ``token`` (:func:`encode_token`) gives; InvalidInput naming ``next_token``
    if it is malformed or another batch's."""
    try:
        doc = json.loads(base64.urlsafe_b64decode((token + "=" * (-len(token) % 4)).encode()))
        batch, lease, unit_id = doc["b"], doc["l"], doc["u"]
        if not isinstance(lease, (int, float)) or isinstance(lease, bool):
            raise ValueError(lease)
        if not math.isfinite(lease) or not isinstance(batch, str):
            raise ValueError(lease)
        key = LeaseKey(float(lease), check_id("next_token", unit_id))
    except (InvalidInput, UnicodeError, binascii.Error, ValueError, TypeError, KeyError):
        raise InvalidInput(
            "next_token", "is not a token this API gave: pass a page's next_token unchanged"
        ) from None
    if batch != run_id:
        raise InvalidInput(
            "next_token",
            f"is a token of another batch ({batch}), not of {run_id}: pass the next_token of "
            "this batch's previous page, or none for its first page",
        )
    return key


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
