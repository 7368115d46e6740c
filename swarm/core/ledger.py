"""The budget ledger: admission, settlement, retries, exhaustion and resume, as pure decisions.

The ``decide_*`` functions work on :class:`RunRecord` / :class:`UnitRecord`; the ``Ledger`` port
(:mod:`swarm.core.ports`) is implemented in memory (:mod:`swarm.core.memory`) and on DynamoDB
(:mod:`swarm.adapters.dynamodb_ledger`), checked by one shared contract suite. Semantics, the
unit state machine and the DynamoDB items: docs/ledger.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from swarm.core.errors import Conflict, InvalidInput
from swarm.core.records import (
    AttemptRecord,
    Reservation,
    RunRecord,
    RunSpec,
    RunState,
    UnitRecord,
    UnitState,
)

if TYPE_CHECKING:
    from swarm.core.ports import Ledger


DEFAULT_LEASE_S = 900.0


class Fate(StrEnum):
    """What happens to a unit after one of its attempts settles."""

    RETRY = "retry"
    COMPLETED = "completed"
    DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str  # admitted | already_admitted | budget | exhausting | closed | terminal
    run: RunRecord
    unit: UnitRecord

    @property
    def exhausted_run(self) -> bool:
        """True when this refusal (or an earlier one) put the run into exhaustion."""
        return self.run.state in (RunState.EXHAUSTING, RunState.EXHAUSTED)


@dataclass(frozen=True)
class Settlement:
    fate: Fate
    duplicate: bool
    run: RunRecord
    unit: UnitRecord
    attempt: AttemptRecord


@dataclass(frozen=True)
class Claim:
    claimed: bool
    reason: (
        str  # claimed | busy (another worker holds a live lease) | stale | settled | not_admitted
    )
    unit: UnitRecord


@dataclass(frozen=True)
class TopUp:
    run: RunRecord
    requeue: tuple[str, ...]  # the former remainder, to be enqueued again


# ---------------------------------------------------------------- pure decisions


def owed_drain_retry(run: RunRecord, unit: UnitRecord) -> bool:
    """A pending unit whose attempt failed during the current drain may still be admitted."""
    return (
        run.state is RunState.EXHAUSTING
        and unit.state is UnitState.PENDING
        and unit.drain_epoch == run.exhaustions
    )


def effective_state(run: RunRecord, unit: UnitRecord) -> UnitState:
    """The state a caller should see: pending units of a non-open run are the remainder."""
    if (
        unit.state is UnitState.PENDING
        and run.state is not RunState.OPEN
        and not owed_drain_retry(run, unit)
    ):
        return UnitState.REMAINDER
    return unit.state


def _close_if_done(run: RunRecord, now: float) -> RunRecord:
    if run.state is RunState.OPEN and run.completed + run.dead_lettered == run.units_total:
        return run.with_(state=RunState.COMPLETED, closed_at=now)
    if run.state is RunState.EXHAUSTING and run.in_flight == 0 and run.pending == 0:
        return run.with_(state=RunState.EXHAUSTED, closed_at=now)
    return run


def decide_admission(
    run: RunRecord,
    unit: UnitRecord,
    attempt: int,
    now: float,
    lease_s: float = DEFAULT_LEASE_S,
    by_scan: bool = False,
) -> tuple[RunRecord, UnitRecord, Admission]:
    """Admit (reserve) or refuse attempt ``attempt`` of ``unit``; returns the new records.
    ``by_scan``: the reservation is left out of the lease index, and the run's scan horizon
    (``RunRecord.scan_at``) covers its lease instead (the fan-out's admissions)."""

    def refuse(reason: str, r: RunRecord, u: UnitRecord) -> tuple[RunRecord, UnitRecord, Admission]:
        return r, u, Admission(False, reason, r, u)

    if unit.state is UnitState.IN_FLIGHT:
        if unit.reservation is not None and unit.reservation.attempt == attempt:
            return run, unit, Admission(True, "already_admitted", run, unit)
        raise Conflict(
            f"unit {unit.unit_id} of run {run.run_id} is in flight with attempt "
            f"{unit.attempts}, not {attempt}"
        )
    if unit.state.terminal:
        return refuse("terminal", run, unit)
    if attempt != unit.attempts:
        raise Conflict(
            f"unit {unit.unit_id} of run {run.run_id} expects attempt {unit.attempts}, "
            f"got {attempt}"
        )
    if run.state.closed:
        return refuse("closed", run, unit)
    if run.state is RunState.EXHAUSTING and not owed_drain_retry(run, unit):
        return refuse("exhausting", run, unit)

    projected = unit.projected_tokens
    if run.spent + run.reserved + projected > run.budget:
        if run.state is RunState.OPEN:
            # Exhaustion begins: every waiting unit (this one included) joins the remainder.
            run = run.with_(
                state=RunState.EXHAUSTING, remainder=run.pending, exhaustions=run.exhaustions + 1
            )
        else:  # a drain retry the budget no longer covers
            unit = unit.with_(drain_epoch=0)
            run = run.with_(remainder=run.remainder + 1)
        return refuse("budget", _close_if_done(run, now), unit)

    lease = now + lease_s
    unit = unit.with_(
        state=UnitState.IN_FLIGHT,
        drain_epoch=0,
        reservation=Reservation(
            attempt=attempt,
            projected=projected,
            lease_expires=lease,
            sweep_at=math.inf if by_scan else None,
        ),
    )
    run = run.with_(reserved=run.reserved + projected, in_flight=run.in_flight + 1)
    if by_scan and (run.scan_at is None or run.scan_at < lease):
        run = run.with_(scan_at=lease)
    return run, unit, Admission(True, "admitted", run, unit)


def scan_leases(units: Iterable[UnitRecord], now: float) -> tuple[list[str], float | None]:
    """What the lease sweep's scan of a run's units finds (``RunRecord.scan_at``): the units
    whose reservation the lease index does not hold and whose lease expired by ``now``, the
    oldest first; and the run's next scan horizon, the latest lease of such a reservation still
    waiting for its worker (None: there is none). A live claim does not hold the horizon back:
    its worker has its message, which comes back if the worker dies."""
    expired: list[tuple[float, str]] = []
    horizon: float | None = None
    for unit in units:
        res = unit.reservation
        if res is None or res.sweep_at != math.inf:
            continue
        if res.lease_expires <= now:
            expired.append((res.lease_expires, unit.unit_id))
        elif not res.claimed and (horizon is None or res.lease_expires > horizon):
            horizon = res.lease_expires
    return [unit_id for _, unit_id in sorted(expired)], horizon


def reclaim_in_turn(
    unit_ids: Iterable[str],
    reclaim: Callable[[str], Settlement | None],
    keep_going: Callable[[], bool],
) -> tuple[list[Settlement], bool]:
    """The lease sweep's loop (``Ledger.reclaim_expired``): ``reclaim`` each unit in turn until
    ``keep_going()`` turns False, after one at least, so that every call makes progress. The lost
    attempts' settlements, and whether every unit was reached (only then may the run's scan
    horizon move: a sweep cut short leaves it, and the next one reads the run again)."""
    lost: list[Settlement] = []
    for i, unit_id in enumerate(unit_ids):
        if i > 0 and not keep_going():
            return lost, False
        settlement = reclaim(unit_id)
        if settlement is not None:
            lost.append(settlement)
    return lost, True


def decide_settlement(
    run: RunRecord,
    unit: UnitRecord,
    attempt: int,
    tokens: int,
    succeeded: bool,
    now: float,
    *,
    reclaimed: bool = False,
    outcome_key: str | None = None,
) -> tuple[RunRecord, UnitRecord, Settlement]:
    """Settle a first (never a repeated) settlement of an admitted attempt; ``outcome_key``:
    where the attempt's outcome is kept (:attr:`UnitRecord.outcome_key`)."""
    if not isinstance(tokens, int) or tokens < 0:
        raise InvalidInput("tokens", f"must be a whole number >= 0, got {tokens!r}")
    reservation = unit.reservation
    if (
        unit.state is not UnitState.IN_FLIGHT
        or reservation is None
        or reservation.attempt != attempt
    ):
        raise Conflict(
            f"attempt {attempt} of unit {unit.unit_id} (run {run.run_id}) holds no reservation"
        )
    record = AttemptRecord(run.run_id, unit.unit_id, attempt, tokens, succeeded, now, reclaimed)
    attempts = unit.attempts + 1
    run = run.with_(
        spent=run.spent + tokens,
        reserved=run.reserved - reservation.projected,
        in_flight=run.in_flight - 1,
        attempts=run.attempts + 1,
    )
    unit = unit.with_(
        attempts=attempts, spent=unit.spent + tokens, reservation=None, outcome_key=outcome_key
    )
    if succeeded:
        fate = Fate.COMPLETED
        unit = unit.with_(state=UnitState.COMPLETED)
        run = run.with_(completed=run.completed + 1)
    elif attempts >= run.spec.max_attempts:
        fate = Fate.DEAD_LETTERED
        unit = unit.with_(state=UnitState.DEAD_LETTERED)
        run = run.with_(dead_lettered=run.dead_lettered + 1)
    else:
        fate = Fate.RETRY
        draining = run.state is RunState.EXHAUSTING
        unit = unit.with_(state=UnitState.PENDING, drain_epoch=run.exhaustions if draining else 0)
        run = run.with_(retries=run.retries + 1)
    run = _close_if_done(run, now)
    return run, unit, Settlement(fate, False, run, unit, record)


def decide_claimed_settlement(
    spec: RunSpec,
    claimed: UnitRecord,
    attempt: int,
    tokens: int,
    succeeded: bool,
    now: float,
    outcome_key: str | None = None,
) -> tuple[RunRecord, RunRecord, UnitRecord, Settlement] | None:
    """The settlement of the attempt a worker claimed, decided on the unit its claim wrote and
    without the books: on an open run, an attempt's fate and the books' changes do not depend
    on the books, except when it is the run's last outstanding unit (which closes the run) and
    while the run is exhausting (a retry then joins the drain). So it is decided on a stand-in
    of the books (open, only this attempt reserved) and is good for any open run of which this
    unit is not the last outstanding one, which the write then requires (``Ledger.
    settle_claimed``). Returns the stand-in, the stand-in after it, the unit after it and the
    settlement (whose ``run`` is the stand-in: not the books); None if the unit holds no claimed
    reservation for ``attempt``, or if the stand-in itself closes (a run of one unit)."""
    res = claimed.reservation
    if claimed.state is not UnitState.IN_FLIGHT or res is None or res.attempt != attempt:
        return None
    if not res.claimed:
        return None
    stand_in = RunRecord(spec, reserved=res.projected, in_flight=1)
    after, unit, settlement = decide_settlement(
        stand_in, claimed, attempt, tokens, succeeded, now, outcome_key=outcome_key
    )
    if after.state.closed:
        return None
    return stand_in, after, unit, settlement


def decide_claim(
    run: RunRecord, unit: UnitRecord, attempt: int, now: float, lease_s: float
) -> tuple[UnitRecord, Claim]:
    """A worker starts attempt ``attempt``: take the reservation's lease (run books unchanged)."""
    res = unit.reservation
    if unit.state is UnitState.IN_FLIGHT and res is not None and res.attempt == attempt:
        if res.claimed and res.lease_expires > now:
            return unit, Claim(False, "busy", unit)
        if res.claimed:
            return unit, Claim(False, "stale", unit)
        # the sweep keeps looking at it when it did before (see Reservation.sweep_at)
        claimed = replace(res, claimed=True, lease_expires=now + lease_s, sweep_at=res.swept_from)
        unit = unit.with_(reservation=claimed)
        return unit, Claim(True, "claimed", unit)
    if unit.state.terminal or attempt < unit.attempts:
        return unit, Claim(False, "settled", unit)
    return unit, Claim(False, "not_admitted", unit)


def decide_unclaim(
    unit: UnitRecord, attempt: int, now: float, lease_s: float
) -> tuple[UnitRecord, bool]:
    """The claiming worker hands the attempt back unstarted (the model plane throttled it): the
    reservation stays, unclaimed, so the unit's next delivery claims it again."""
    res = unit.reservation
    if unit.state is not UnitState.IN_FLIGHT or res is None or res.attempt != attempt:
        return unit, False
    unit = unit.with_(
        reservation=replace(res, claimed=False, lease_expires=now + lease_s, sweep_at=None)
    )
    return unit, True


def decide_release(run: RunRecord, unit: UnitRecord, now: float) -> tuple[RunRecord, UnitRecord]:
    """Give back an unclaimed reservation: no attempt ran, so nothing is spent or counted."""
    res = unit.reservation
    if unit.state is not UnitState.IN_FLIGHT or res is None or res.claimed:
        raise Conflict(f"unit {unit.unit_id} of run {run.run_id} holds no unclaimed reservation")
    unit = unit.with_(state=UnitState.PENDING, reservation=None)
    run = run.with_(reserved=run.reserved - res.projected, in_flight=run.in_flight - 1)
    if run.state is RunState.EXHAUSTING:  # not a drain retry: it joins the remainder
        run = run.with_(remainder=run.remainder + 1)
    return _close_if_done(run, now), unit


def decide_dead_letter(
    run: RunRecord, unit: UnitRecord, now: float
) -> tuple[RunRecord, UnitRecord]:
    """Force a pending unit to dead-lettered (the queue gave up on its message)."""
    if unit.state is not UnitState.PENDING:
        raise Conflict(f"unit {unit.unit_id} of run {run.run_id} is {unit.state.value}")
    if effective_state(run, unit) is UnitState.REMAINDER:
        run = run.with_(remainder=run.remainder - 1)
    unit = unit.with_(state=UnitState.DEAD_LETTERED, drain_epoch=0)
    run = run.with_(dead_lettered=run.dead_lettered + 1)
    return _close_if_done(run, now), unit


def decide_top_up(
    run: RunRecord, amount: int, now: float, max_budget: int | None = None
) -> RunRecord:
    """Add ``amount`` tokens to the run's budget (reopening an exhausted run). ``max_budget``: the
    deployment's ceiling on a run's total budget, after any number of top-ups."""
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise InvalidInput("top_up", f"must be a positive whole number of tokens, got {amount!r}")
    if run.state is RunState.COMPLETED:
        raise Conflict(f"run {run.run_id} is completed: there is nothing to resume")
    if max_budget is not None and run.budget + amount > max_budget:
        room = max(0, max_budget - run.budget)
        raise InvalidInput(
            "top_up",
            f"the budget would be {run.budget + amount:,} tokens, above this deployment's "
            f"maximum of {max_budget:,} for a batch: top up at most {room:,}",
        )
    run = run.with_(budget=run.budget + amount)
    if run.state in (RunState.EXHAUSTING, RunState.EXHAUSTED):
        run = run.with_(state=RunState.OPEN, remainder=0, closed_at=None)
    return run


def fresh_records(spec: RunSpec, now: float) -> tuple[RunRecord, list[UnitRecord]]:
    run = RunRecord(spec=spec, opened_at=now)
    units = [UnitRecord(spec.run_id, u.unit_id, u.projected_tokens) for u in spec.units]
    return _close_if_done(run, now), units


# ---------------------------------------------------------------- the port


def remainder_of(ledger: Ledger, run_id: str) -> list[str]:
    return [u.unit_id for u in ledger.units(run_id) if u.state is UnitState.REMAINDER]
