"""Finalization and dead letters: how a run ends.

How completion flows back to a batch: through the ledger's counters, not per-unit callbacks. Every
settlement already updates the run's counts in the same atomic write that makes it exactly-once,
and the run closes itself (``completed`` / ``exhausted``) the moment its last unit becomes
terminal. The state machine's finalizer only has to *observe* that: it polls the run (a Wait loop
costs a few state transitions a minute), sweeps leases that expired (a worker died and its message
was lost), and on closure writes the results, the remainder manifest and the event. Task tokens
per unit would cost a callback per unit and would not survive a drained deploy, where units wait
in their lanes for as long as the deploy takes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from swarm.core.lanes import QueuedUnit
from swarm.core.ledger import Fate
from swarm.core.ports import (
    BlobStore,
    Events,
    LaneQueue,
    Ledger,
)
from swarm.core.prompts import Prompt
from swarm.core.records import RunRecord, UnitState
from swarm.core.report import healthy_line
from swarm.core.results import always
from swarm.service.batches import manifest_key, manifest_units, results_key
from swarm.service.results import Results

if TYPE_CHECKING:
    from swarm.core.ports import RunWatch


@dataclass(frozen=True)
class PollPacing:
    """How long the finalize loop waits before its next poll (the Wait state's ``SecondsPath``).

    Each poll is four state transitions of the Standard parent, so a loop at a fixed interval
    costs in proportion to the run's duration, which grows with its units at the fleet's pace:
    30 s polls billed ~$8.5 per million units whatever the batch's size (docs/scale.md). The
    wait is half the time the run still needs at the pace it has kept since it opened (its
    outstanding units at its completion rate, or its budget at its spending rate if that runs
    out first), within ``[min_s, max_s]``: polls thin out geometrically as the end nears, so a
    run takes about log2(duration / min_s) polls plus a few at ``min_s`` near its end. Its
    closure is announced at most ``max_s`` after it happens (and usually ``min_s``: the
    estimate halves at each poll); a run with no progress yet is polled every ``min_s``.
    """

    min_s: int
    max_s: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_s <= self.max_s:
            raise ValueError(f"poll pacing needs 1 <= min_s <= max_s, got {self}")

    def wait_s(self, run: RunRecord, now: float) -> int:
        elapsed = now - run.opened_at
        done = run.completed + run.dead_lettered
        if run.state.closed or elapsed <= 0 or done <= 0:
            return self.min_s
        eta = run.outstanding * elapsed / done
        if run.spent > 0:  # exhaustion closes the run before its units are done
            eta = min(eta, max(0, run.budget - run.spent) * elapsed / run.spent)
        return int(min(self.max_s, max(self.min_s, math.ceil(eta / 2))))


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

    def finalize(
        self,
        run_id: str,
        now: float,
        execution: str | None = None,
        pacing: PollPacing | None = None,
        keep_going: Callable[[], bool] = always,
    ) -> dict[str, Any]:
        """Sweep expired leases; on closure write results + remainder and announce the event.

        Idempotent: the results object is keyed by the run's closure epoch, so a repeated call
        (a Step Functions retry) neither rewrites it nor announces the closure twice.
        ``execution``: the calling execution's name, on its first poll (the sweeper's record of
        who is finalizing the run). ``pacing``: the loop's; a run still open then answers the
        seconds until the next poll as ``wait_s``. ``closed`` in the answer: the run is closed
        and its closure written. A results file too long for one call (``keep_going()`` turned
        False while it was written: a closure of ~100,000 units) answers ``closed: False`` and
        ``writing: True``, and the next call goes on writing it where this one stopped.
        """
        if execution is not None and self.watch is not None:
            self.watch.record(run_id, execution)
        retries = [s for s in self.ledger.reclaim_expired(run_id, now) if s.fate is Fate.RETRY]
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
        run = self.ledger.run(run_id)
        # the loop's next poll (a closed run's is never waited for, but the answer has it)
        paced = {} if pacing is None else {"wait_s": pacing.wait_s(run, now)}
        if not run.state.closed:
            return {"run_id": run_id, "closed": False, "state": run.state.value, **paced}
        epoch = run.exhaustions
        key = results_key(run_id, run.state, epoch)
        announced = False
        if not self.blobs.exists(key):
            # As of the closure read above: a closed run has nothing in flight or pending, so a
            # unit that is neither completed nor dead-lettered is in its remainder, even if a
            # top-up has reopened the run (and requeued that unit) since.
            units = [
                u
                if u.state in (UnitState.COMPLETED, UnitState.DEAD_LETTERED)
                else u.with_(state=UnitState.REMAINDER)
                for u in self.ledger.units(run_id)
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
                    **paced,
                }
            self.blobs.put_json(
                key,
                {
                    "run_id": run_id,
                    "state": run.state.value,
                    "healthy_line": healthy_line(run, elapsed),
                    "spent": run.spent,
                    "budget": run.budget,
                    "units": {
                        u.unit_id: {
                            "state": u.state.value,
                            "attempts": u.attempts,
                            "tokens": u.spent,
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
        if self.watch is not None:  # announced (now or before): the sweeper can forget the run
            self.watch.release(run_id, run.state, epoch)
        return {
            "run_id": run_id,
            "closed": True,
            "state": run.state.value,
            "results_key": key,
            "announced": announced,
            **paced,
        }


def dead_letter(ledger: Ledger, item: QueuedUnit, now: float) -> UnitState:
    """A message SQS gave up on (maxReceiveCount): end the unit, settling any claimed attempt."""
    return ledger.dead_letter(item.run_id, item.unit_id, now).state
