"""Finalization and dead letters: how a run ends.

How completion flows back to a batch: through the ledger's counters, not per-unit callbacks. Every
settlement already updates the run's counts in the same atomic write that makes it exactly-once,
and the run closes itself (``completed`` / ``exhausted``) the moment its last unit becomes
terminal. The state machine's finalize loop waits for that: each ``Poll`` sweeps leases that
expired (a worker died and its message was lost), then keeps a task token (``Closures.wait``)
and waits, and the worker or dead-letter handler whose write closed the run hands the token back
(``Closures.notify``), so the closure is written within seconds; a wait nobody ends times out
(``FinalizerMaxPollSeconds``) and the loop sweeps again. ``Close`` then writes the results, the
remainder manifest and the event. One token per run, not per unit: a unit waiting in a drained
lane for as long as a deploy takes costs the loop a timed-out wait now and then, nothing more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from swarm.core.lanes import QueuedUnit
from swarm.core.ledger import Fate
from swarm.core.ports import (
    BlobStore,
    Closures,
    Events,
    LaneQueue,
    Ledger,
)
from swarm.core.prompts import Prompt
from swarm.core.records import UnitState
from swarm.core.report import healthy_line
from swarm.core.results import always
from swarm.service.batches import manifest_key, manifest_units, results_key
from swarm.service.results import Results

if TYPE_CHECKING:
    from swarm.core.ports import RunWatch
    from swarm.service.approvals import Gates

log = logging.getLogger(__name__)

#: how soon the sweeper looks again at a closed run whose parked units the lease index does not
#: list yet (it is eventually consistent)
PARKED_RECHECK_S = 60.0


@dataclass
class Finalizer:
    ledger: Ledger
    queue: LaneQueue
    blobs: BlobStore
    events: Events
    results: Results
    #: the sweeper's watch list (swarm.service.sweeper): the execution that reaches the finalize
    #: loop is recorded there, and a run whose closure is announced leaves it
    watch: RunWatch | None = None
    #: where the loop's poll keeps its task token (None: the loop cannot wait; tests)
    closures: Closures | None = None
    #: human gates: each poll rejects the calls nobody decided in time and sends again a
    #: decided unit whose message was lost (None: no gates swept)
    approvals: Gates | None = None

    def poll(
        self,
        run_id: str,
        now: float,
        token: str,
        execution: str | None = None,
        keep_going: Callable[[], bool] = always,
    ) -> bool:
        """The loop's ``Poll``: sweep expired leases (until ``keep_going()`` turns False: the
        next poll goes on), then keep ``token`` for whoever closes the run. True: the run is
        closed already (the loop writes its closure now, not the token's holder). The run is
        read again after the token is kept: a run closed meanwhile by a write that found no
        token yet is seen here, so no closure waits for a timeout. ``execution``: the calling
        execution's name, on its first poll (the sweeper's record of who is finalizing the
        run)."""
        if execution is not None and self.watch is not None:
            self.watch.record(run_id, execution)
        self._sweep(run_id, now, keep_going)
        if self.ledger.run(run_id).state.closed:
            return True
        if self.closures is None:
            raise RuntimeError("the finalizer has no closures to keep its token in")
        self.closures.wait(run_id, token, now)
        return self.ledger.run(run_id).state.closed

    def _sweep(self, run_id: str, now: float, keep_going: Callable[[], bool]) -> None:
        """Settle or release the run's expired leases; requeue the lost attempts' retries. The
        gates' leases first: a parked unit's is its calls' timeout (docs/agents.md, "Human
        gates")."""
        if self.approvals is not None:
            self.approvals.sweep(run_id, now, keep_going)
        reclaimed = self.ledger.reclaim_expired(run_id, now, keep_going)
        retries = [s for s in reclaimed if s.fate is Fate.RETRY]
        if retries:  # the dead workers' messages may be gone: requeue them, input included
            inputs: dict[str, Prompt] = {  # as the manifest holds it: text or a request
                item["unit_id"]: item.get("input", "")
                for item in manifest_units(self.blobs.get_json(manifest_key(run_id)))
            }
            for lost in retries:
                run = lost.run
                self.queue.send(
                    QueuedUnit(
                        run_id,
                        lost.unit.unit_id,
                        run.spec.tenant,
                        run.spec.lane,
                        lost.unit.attempts,
                        lost.unit.projected_tokens,
                        inputs.get(lost.unit.unit_id, ""),
                    )
                )

    def finalize(
        self,
        run_id: str,
        now: float,
        execution: str | None = None,
        keep_going: Callable[[], bool] = always,
    ) -> dict[str, Any]:
        """Sweep expired leases; on closure write results + remainder and announce the event.

        Idempotent: the results object is keyed by the run's closure epoch, so a repeated call
        (a Step Functions retry) neither rewrites it nor announces the closure twice.
        ``execution``: as :meth:`poll`'s. ``closed`` in the answer: the run is closed and its
        closure written. A results file too long for one call (``keep_going()`` turned False
        while it was written: a closure of ~100,000 units) answers ``closed: False`` and
        ``writing: True``, and the next call goes on writing it where this one stopped.
        """
        if execution is not None and self.watch is not None:
            self.watch.record(run_id, execution)
        self._sweep(run_id, now, keep_going)
        run = self.ledger.run(run_id)
        if not run.state.closed:
            return {"run_id": run_id, "closed": False, "writing": False, "state": run.state.value}
        epoch = run.exhaustions
        key = results_key(run_id, run.state, epoch)
        announced = False
        if not self.blobs.exists(key):
            # As of the closure read above: a closed run has nothing in flight or pending, so a
            # unit that is neither completed nor dead-lettered is in its remainder, even if a
            # top-up has reopened the run (and requeued that unit) since.
            # an exhausted run's parked units are in its remainder too, their calls' decisions
            # still taken (marked so below)
            read = self.ledger.units(run_id)
            parked = {u.unit_id for u in read if u.state is UnitState.AWAITING_APPROVAL}
            units = [
                u
                if u.state in (UnitState.COMPLETED, UnitState.DEAD_LETTERED)
                else u.with_(state=UnitState.REMAINDER)
                for u in read
            ]
            remainder = [u.unit_id for u in units if u.state is UnitState.REMAINDER]
            remainder_key = f"results/{run_id}/remainder-{epoch}.json"
            if remainder and not self.blobs.exists(remainder_key):  # kept by an earlier call
                original = manifest_units(self.blobs.get_json(manifest_key(run_id)))
                projected = {u.unit_id: u.projected_tokens for u in units}
                wanted = set(remainder)
                # the remainder's units as a submission takes them (in fan-out order)
                self.blobs.put_json(
                    remainder_key,
                    [
                        {
                            "unit_id": i["unit_id"],
                            "projected_tokens": projected[i["unit_id"]],
                            "input": i.get("input", ""),
                        }
                        for i in original
                        if i["unit_id"] in wanted
                    ],
                )
            elapsed = (run.closed_at or now) - run.opened_at
            # the results file first: the summary written last is what marks the closure done
            results_file = self.results.write_file(run, units, keep_going)
            if results_file is None:  # out of time: the next poll goes on writing it
                return {
                    "run_id": run_id,
                    "closed": False,
                    "state": run.state.value,
                    "writing": True,
                }
            self.blobs.put_json(
                key,
                {
                    "run_id": run_id,
                    "state": run.state.value,
                    "healthy_line": healthy_line(run, elapsed),
                    "spent": run.spent,
                    "budget": run.budget,
                    # money in whole micro-dollars; "usd": the budget is in them too
                    "spent_micro": run.spent_micro,
                    "usd": run.spec.usd,
                    "units": {
                        u.unit_id: {
                            "state": u.state.value,
                            "attempts": u.attempts,
                            "tokens": u.spent,
                            **({"awaiting_approval": True} if u.unit_id in parked else {}),
                        }
                        for u in units
                    },
                    "remainder": remainder,
                    "results_file": results_file,
                },
            )
            self.events.publish(
                run.state.event,
                {
                    "run_id": run_id,
                    "tenant": run.spec.tenant,
                    "state": run.state.value,
                    "completed": run.completed,
                    "dead_lettered": run.dead_lettered,
                    "remainder": run.remainder,
                    "spent": run.spent,
                    "budget": run.budget,
                    "spent_micro": run.spent_micro,
                    "usd": run.spec.usd,
                    "retries": run.retries,
                    "elapsed_s": elapsed,
                    "healthy_line": healthy_line(run, elapsed),
                    "results_key": key,
                    # where every unit's outcome is (JSON lines), so a consumer fetches them
                    # without polling the API
                    "results": {
                        "location": self.results.store.location(results_file),
                        "key": results_file,
                        "units": run.units_total,
                        "completed": run.completed,
                    },
                },
            )
            announced = True
        if self.watch is not None and run.awaiting and self.approvals is not None:
            # an exhausted run's parked units outlive its closure (their decisions are still
            # taken: docs/agents.md, "Human gates"): the sweeper looks again when the first
            # times out, and its sweep (this call) rejects it; the index may lag a unit parked
            # a moment ago, so a minute at most when none is listed yet
            due = self.approvals.next_timeout(run_id, now)
            self.watch.check(run_id, now + PARKED_RECHECK_S if due is None else due)
        elif self.watch is not None:  # announced (now or before): the sweeper can forget it
            self.watch.release(run_id, run.state, epoch)
        return {
            "run_id": run_id,
            "closed": True,
            "writing": False,
            "state": run.state.value,
            "results_key": key,
            "announced": announced,
        }


def dead_letter(
    ledger: Ledger, item: QueuedUnit, now: float, closures: Closures | None = None
) -> UnitState:
    """A message SQS gave up on (maxReceiveCount): end the unit, settling any claimed attempt;
    if that closed the run, wake its finalize loop (``closures``)."""
    state = ledger.dead_letter(item.run_id, item.unit_id, now).state
    if closures is not None and ledger.run(item.run_id).state.closed:
        wake(closures, item.run_id)
    return state


def wake(closures: Closures, run_id: str) -> None:
    """Hand the run's closure to its finalize loop; a wake that fails is logged, never raised:
    the loop's wait times out and it finds the run closed (a closure announced later, not
    lost)."""
    try:
        closures.notify(run_id)
    except Exception:
        log.exception("waking the finalize loop of run %s failed", run_id)
