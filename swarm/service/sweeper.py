"""The sweeper: repair runs whose execution died.

A run needs a live execution until its closure is announced: the Distributed Map admits and
enqueues its units, then the finalize loop sweeps expired leases and, once every unit is
terminal, writes the results and publishes ``run.completed`` / ``run.exhausted``. Executions die
in ways no state can catch (a timeout, an operator's StopExecution, a Lambda outage that outlasts
the retries, a definition bug) and in ways the definition does catch and ends on purpose (the
map failed, the finalizer kept failing: ``statemachines/fanout.asl.json`` ends those executions
with a clear error and leaves the run to this sweeper). Either way the run stays open with no one
to close it.

A run whose *open* never finished (the submit recorded it as ``opening`` and died before
starting its execution, or the execution failed in its open step) is watched from the submit
on: with no live execution (the batch's own, or the sweeper's latest restart) it is restarted
from the open step, which is idempotent (verdict ``open``).

The sweeper runs on a schedule (EventBridge, ``fanout.sweeper_rate_minutes``). It reads the runs
that are due from the ledger's sparse ``OpenRuns`` index (:mod:`swarm.adapters.dynamodb_watch`:
runs are watched from opening until their closure is announced), at most ``max_runs`` per
invocation, most overdue first, and for each:

1. **an execution of the run is RUNNING** (the one that last reached the finalize loop, the
   sweeper's latest restart, the latest resume's, the batch's own): leave it alone, look again
   next tick;
2. otherwise **finalize it here** (the state machine's own finalizer logic): expired leases are
   swept (lost attempts settled and requeued), and a run whose units are all terminal is closed
   and announced: done;
3. otherwise **restart** its execution (``<batch>-r<n>``): with the map when units wait for
   admission, or when no execution has reached the finalize loop since the last fan-out (the map
   died part-way: a unit may be admitted without its message; admission is idempotent and a
   duplicate message is absorbed by the worker's claim); else the finalize loop only (every
   unit is terminal, in flight, or owed a retry whose message is in its lane).

Each restart of a run doubles the time before the sweeper looks at it again (capped at a day),
so a failure that kills every execution costs a few executions a day, not one per tick.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from swarm.core.ports import Ledger, RunWatch, SweptExecutions, WatchedRun
from swarm.core.records import RunRecord, RunState
from swarm.service.batches import execution_input, manifest_key
from swarm.service.finalizer import Finalizer

#: Step Functions' limit on an execution name
MAX_EXECUTION_NAME = 80
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

#: execution statuses that mean "someone is still taking care of the run"
LIVE_STATUSES = frozenset({"RUNNING", "PENDING_REDRIVE"})

#: the input key of a continuation: the finalize loop's state (see statemachines/fanout.asl.json)
LOOP = "loop"


# ---------------------------------------------------------------- execution names and inputs


def execution_name(run_id: str, suffix: str) -> str:
    """``<run id><suffix>`` as a valid execution name: at most 80 characters of letters, digits,
    ``-``, ``_`` and ``.``; a longer or unusual run id keeps a prefix plus a digest (API batch
    ids, ``b-`` and 24 hex digits, are used as they are)."""
    name = _NAME_UNSAFE.sub("-", run_id) + suffix
    if len(name) <= MAX_EXECUTION_NAME and name == run_id + suffix:
        return name
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    keep = MAX_EXECUTION_NAME - len(suffix) - len(digest) - 1
    return f"{_NAME_UNSAFE.sub('-', run_id)[:keep]}-{digest}{suffix}"


def repair_execution_name(run_id: str, repair: int) -> str:
    """The sweeper's ``repair``-th restart of the run (deterministic: a repeated sweep of the
    same repair starts nothing new)."""
    return execution_name(run_id, f"-r{repair}")


def resume_execution_name(run_id: str, epoch: int) -> str:
    """What ``Batches.resume`` names the execution of the resume ending exhaustion ``epoch``
    (a unit test keeps the two in step)."""
    return f"{run_id}-resume-{epoch}"


def finalize_loop_input(run_id: str, root: str) -> dict[str, Any]:
    """An execution that skips the map: the finalize loop, its poll count at 0, continuations
    named ``<root>-c<n>``. The same shape as the state machine's own continue-as-new input."""
    return {
        **execution_input(run_id, manifest_key(run_id)),
        LOOP: {"root": root, "generation": 0, "polls": 0},
    }


def candidate_executions(run: RunRecord, watched: WatchedRun) -> list[str]:
    """Every execution that may be taking care of the run, most likely first: the one that last
    reached its finalize loop (continuations record themselves on their first poll), the
    sweeper's latest restart, the latest resume's, the batch's own (its map may still run)."""
    names = []
    if watched.execution:
        names.append(watched.execution)
    if watched.repairs > 0:
        names.append(repair_execution_name(run.run_id, watched.repairs))
    if run.exhaustions > 0:
        names.append(resume_execution_name(run.run_id, run.exhaustions))
    names.append(run.run_id)
    return list(dict.fromkeys(names))


class Verdict(StrEnum):
    RUNNING = "running"  # an execution takes care of the run: left alone
    ANNOUNCED = "announced"  # closed: the sweeper announced the closure (or found it announced)
    OPEN = "open"  # restarted from the open step: its open never finished
    FAN_OUT = "fan_out"  # restarted, map first: units wait for admission
    FINALIZE_LOOP = "finalize_loop"  # restarted: the finalize loop only
    UNWATCHED = "unwatched"  # no longer watched (announced meanwhile by its execution)
    ERROR = "error"


def restart_kind(run: RunRecord, watched: WatchedRun) -> Verdict:
    """How to restart a run that is not closed and has no live execution.

    The map again when units wait for admission (``pending``: never admitted, or their
    admission was released), or when no execution reached the finalize loop since the last fan-out
    (the map died part-way, so an admitted unit may lack its message). The finalize loop only
    otherwise: every unit is terminal, in flight with its message sent, or owed a retry whose
    message waits in its lane.
    """
    if run.pending > 0 or watched.execution is None:
        return Verdict.FAN_OUT
    return Verdict.FINALIZE_LOOP


@dataclass(frozen=True)
class SweepConfig:
    interval_s: float  # the schedule's rate
    max_runs: int = 200  # runs examined per invocation (the rest are due next tick)
    max_backoff_s: float = 86_400.0  # the longest wait before looking at a restarted run again

    def recheck_after(self, repairs: int = 0) -> float:
        """How long until the sweeper looks at a run again: a bit under one tick for a healthy
        run (so the next tick finds it due), doubling with each restart of the run."""
        doubling = 1 << min(30, max(0, repairs - 1))
        return min(self.max_backoff_s, 0.9 * self.interval_s * doubling)


@dataclass(frozen=True)
class Swept:
    run_id: str
    verdict: Verdict
    execution: str | None = None  # the live execution, or the one the sweeper started
    error: str | None = None
    state: str | None = None  # ANNOUNCED: the closed run's state
    announced: bool = False  # ANNOUNCED: this sweep published the closure's event


@dataclass
class SweepReport:
    swept: list[Swept] = field(default_factory=list)
    out_of_time: bool = False

    def count(self, verdict: Verdict) -> int:
        return sum(1 for s in self.swept if s.verdict is verdict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "examined": len(self.swept),
            **{v.value: self.count(v) for v in Verdict},
            "restarted": [
                {"batch_id": s.run_id, "verdict": s.verdict.value, "execution": s.execution}
                for s in self.swept
                if s.verdict in (Verdict.OPEN, Verdict.FAN_OUT, Verdict.FINALIZE_LOOP)
            ],
            "errors": [{"batch_id": s.run_id, "error": s.error} for s in self.swept if s.error],
            "out_of_time": self.out_of_time,
        }


@dataclass
class Sweeper:
    ledger: Ledger
    watch: RunWatch
    executions: SweptExecutions
    finalizer: Finalizer
    config: SweepConfig

    def sweep(self, now: float, out_of_time: Callable[[], bool] = lambda: False) -> SweepReport:
        """Look at every due run (up to ``max_runs``) until ``out_of_time()``; a run that fails
        is reported and looked at again next tick, and does not stop the others."""
        report = SweepReport()
        for watched in self.watch.due(now, self.config.max_runs):
            if out_of_time():
                report.out_of_time = True
                break
            try:
                report.swept.append(self.repair(watched.run_id, now, out_of_time))
            except Exception as error:  # one broken run must not starve the others
                report.swept.append(
                    Swept(watched.run_id, Verdict.ERROR, error=f"{type(error).__name__}: {error}")
                )
                self._snooze(watched.run_id, now + self.config.recheck_after())
        return report

    def _snooze(self, run_id: str, sweep_at: float) -> None:
        try:
            self.watch.check(run_id, sweep_at)
        except Exception:  # best effort: it is due again next tick otherwise
            return

    def repair(
        self, run_id: str, now: float, out_of_time: Callable[[], bool] = lambda: False
    ) -> Swept:
        """One run: leave it, announce it, or restart its execution (see the module docstring).
        A closed run's results file that ``out_of_time()`` cuts short is written on by the
        finalize loop the restart starts."""
        watched = self.watch.get(run_id)  # consistent: the index may lag a restart or a release
        if watched is None:
            return Swept(run_id, Verdict.UNWATCHED)
        run = self.ledger.run(run_id, opening=True)
        if run.state is RunState.OPENING:
            return self._reopen(run, watched, now)
        for name in candidate_executions(run, watched):
            if self.executions.status(name) in LIVE_STATUSES:
                self.watch.check(run_id, now + self.config.recheck_after())
                return Swept(run_id, Verdict.RUNNING, execution=name)

        # Nobody is finalizing the run: the finalizer's own logic, here. It sweeps expired
        # leases (a dead worker's attempt is settled and its retry requeued) and announces a
        # closed run (then stops watching it).
        result = self.finalizer.finalize(run_id, now, keep_going=lambda: not out_of_time())
        if result["closed"]:
            announced = bool(result.get("announced"))
            return Swept(run_id, Verdict.ANNOUNCED, state=result["state"], announced=announced)
        run = self.ledger.run(run_id)  # after the sweep of its leases
        kind = restart_kind(run, watched)
        repairs, name = self._restart(run_id, kind, watched.repairs + 1)
        self.watch.check(
            run_id,
            now + self.config.recheck_after(repairs),
            repairs=repairs,
            forget_execution=kind is Verdict.FAN_OUT,
        )
        return Swept(run_id, kind, execution=name)

    def _reopen(self, run: RunRecord, watched: WatchedRun, now: float) -> Swept:
        """A run whose open never finished (its execution failed in the open step, or the
        submit died before starting it): left alone while an execution of it runs, else
        restarted from the open step (idempotent: it rewrites what it wrote already)."""
        for name in (run.run_id, repair_execution_name(run.run_id, watched.repairs)):
            if self.executions.status(name) in LIVE_STATUSES:
                self.watch.check(run.run_id, now + self.config.recheck_after())
                return Swept(run.run_id, Verdict.RUNNING, execution=name)
        repairs, name = self._restart(run.run_id, Verdict.FAN_OUT, watched.repairs + 1, True)
        self.watch.check(
            run.run_id,
            now + self.config.recheck_after(repairs),
            repairs=repairs,
            forget_execution=True,
        )
        return Swept(run.run_id, Verdict.OPEN, execution=name)

    def _restart(
        self, run_id: str, kind: Verdict, repair: int, opening: bool = False
    ) -> tuple[int, str]:
        """Start ``<run>-r<repair>``. A name taken already was started by an earlier sweep that
        died before recording it: if that execution is live it is the restart; otherwise the
        next number is tried."""
        for _ in range(8):
            name = repair_execution_name(run_id, repair)
            if kind is Verdict.FAN_OUT:
                payload = execution_input(run_id, manifest_key(run_id), opening)
            else:
                payload = finalize_loop_input(run_id, name)
            if self.executions.start(name, payload):
                return repair, name
            if self.executions.status(name) in LIVE_STATUSES:
                return repair, name
            repair += 1
        raise RuntimeError(f"every restart name of run {run_id} up to -r{repair} is taken")
