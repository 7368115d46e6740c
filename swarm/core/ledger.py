"""The budget ledger: admission, settlement, retries, exhaustion and resume, as pure decisions.

The ``decide_*`` functions work on :class:`RunRecord` / :class:`UnitRecord`; the ``Ledger`` port
(:mod:`swarm.core.ports`) is implemented in memory (:mod:`swarm.core.memory`) and on DynamoDB
(:mod:`swarm.adapters.dynamodb_ledger`), checked by one shared contract suite. Semantics, the
unit state machine and the DynamoDB items: docs/explanation/ledger.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from swarm.core.errors import Conflict, InvalidInput
from swarm.core.pricing import Priced
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

#: DynamoDB's limit on an item (names and values, UTF-8): a log event's item must fit in it
LOG_ITEM_LIMIT = 400 * 1024
#: DynamoDB's limits on one TransactWriteItems: its items, and their total size
TRANSACTION_ITEMS = 100
TRANSACTION_BYTES = 4 * 1024 * 1024
#: a turn's settlement writes the unit and the books with its events: at most this many events
MAX_TURN_EVENTS = TRANSACTION_ITEMS - 2
#: a log's sequence numbers are kept as 6 digits (the items' sort key, in order)
MAX_LOG_SEQ = 999_999


class Fate(StrEnum):
    """What happens to a unit after one of its attempts settles."""

    RETRY = "retry"
    COMPLETED = "completed"
    DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True)
class Admission:
    admitted: bool
    reason: str  # admitted | already_admitted | budget | exhausting | closed | terminal
    # | awaiting_approval (a parked agent loop: a decision sends it back)
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
        # claimed | busy (another worker holds a live lease) | stale | settled | not_admitted
        # | taken_over (an agent loop's stale claim, claimed again: decide_claim)
        str
    )
    unit: UnitRecord


@dataclass(frozen=True)
class TurnSettlement:
    """What :meth:`Ledger.settle_turn` did: ``settled`` False for a turn settled before (a
    duplicate: nothing written); the run's state (the loop stops at this boundary unless it is
    ``open``) and the unit as it stands."""

    settled: bool
    run_state: RunState
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
    if unit.state is UnitState.AWAITING_APPROVAL:  # a person's decision sends it back
        return refuse("awaiting_approval", run, unit)
    if attempt != unit.attempts:
        raise Conflict(
            f"unit {unit.unit_id} of run {run.run_id} expects attempt {unit.attempts}, "
            f"got {attempt}"
        )
    if run.state.closed:
        return refuse("closed", run, unit)
    if run.state is RunState.EXHAUSTING and not owed_drain_retry(run, unit):
        return refuse("exhausting", run, unit)

    # in the budget's unit: tokens, or micro-dollars (a budget in dollars:
    # docs/explanation/ledger.md)
    projected = unit.projected_in(run.spec.usd)
    if run.charged + run.reserved + projected > run.budget:
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
            usd=run.spec.usd,
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
        if res is None or res.sweep_at != math.inf or unit.state is not UnitState.IN_FLIGHT:
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
    retry: bool = True,
    priced: Priced | None = None,
) -> tuple[RunRecord, UnitRecord, Settlement]:
    """Settle a first (never a repeated) settlement of an admitted attempt; ``priced``: the
    cost of the usage ``tokens`` bills and the prices it was priced at (None: unpriced, 0);
    ``outcome_key``: where the attempt's outcome is kept (:attr:`UnitRecord.outcome_key`).
    ``retry`` False: a failed attempt ends the unit dead-lettered whatever attempts it has left
    (a model that refused: its guardrail or content filter). For an agent loop's reservation,
    ``tokens`` (and ``priced``) is what is billed beyond the turns settled against it
    (:func:`decide_turn`)."""
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
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
    cost = 0 if priced is None else priced.cost_micro
    # a loop's turns were settled against its reservation already (settle_turn): ``tokens``
    # is what is billed beyond them, and the attempt's bill is both
    record = AttemptRecord(
        run.run_id,
        unit.unit_id,
        attempt,
        reservation.used + tokens,
        succeeded,
        now,
        reclaimed,
        cost_micro=reservation.used_micro + cost,
        prices=None if priced is None else priced.prices,
    )
    attempts = unit.attempts + 1
    run = run.with_(
        spent=run.spent + tokens,
        spent_micro=run.spent_micro + cost,
        reserved=run.reserved - reservation.held,
        in_flight=run.in_flight - 1,
        attempts=run.attempts + 1,
    )
    unit = unit.with_(
        attempts=attempts,
        spent=unit.spent + tokens,
        spent_micro=unit.spent_micro + cost,
        reservation=None,
        outcome_key=outcome_key,
    )
    if succeeded:
        fate = Fate.COMPLETED
        unit = unit.with_(state=UnitState.COMPLETED)
        run = run.with_(completed=run.completed + 1)
    elif attempts >= run.spec.max_attempts or not retry:
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
    retry: bool = True,
    priced: Priced | None = None,
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
    stand_in = RunRecord(spec, reserved=res.held, in_flight=1)
    after, unit, settlement = decide_settlement(
        stand_in,
        claimed,
        attempt,
        tokens,
        succeeded,
        now,
        outcome_key=outcome_key,
        retry=retry,
        priced=priced,
    )
    if after.state.closed:
        return None
    return stand_in, after, unit, settlement


def decide_claim(
    run: RunRecord,
    unit: UnitRecord,
    attempt: int,
    now: float,
    lease_s: float,
    loop: bool = False,
) -> tuple[UnitRecord, Claim]:
    """A worker starts attempt ``attempt``: take the reservation's lease (run books unchanged).
    ``loop``: the attempt is an agent loop's; its reservation is marked so, and a stale claim of
    a loop's reservation (its worker died) is taken over (reason ``taken_over``): the loop goes
    on from its log, its attempt is never settled as lost."""
    res = unit.reservation
    if unit.state is UnitState.IN_FLIGHT and res is not None and res.attempt == attempt:
        if res.claimed and res.lease_expires > now:
            return unit, Claim(False, "busy", unit)
        if res.claimed and not (loop and res.loop):
            return unit, Claim(False, "stale", unit)
        # the sweep keeps looking at it when it did before (see Reservation.sweep_at)
        claimed = replace(
            res,
            claimed=True,
            lease_expires=now + lease_s,
            sweep_at=res.swept_from,
            loop=res.loop or loop,
        )
        unit = unit.with_(reservation=claimed)
        return unit, Claim(True, "taken_over" if res.claimed else "claimed", unit)
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
    """Give back an unclaimed reservation (no attempt ran, so nothing is spent or counted), or
    an agent loop's, claimed or not: its settled turns stay spent, what it still holds is given
    back, and the unit is pending again with its attempts, turns and spent as they are."""
    res = unit.reservation
    if unit.state is not UnitState.IN_FLIGHT or res is None or (res.claimed and not res.loop):
        raise Conflict(f"unit {unit.unit_id} of run {run.run_id} holds no unclaimed reservation")
    unit = unit.with_(state=UnitState.PENDING, reservation=None)
    run = run.with_(reserved=run.reserved - res.held, in_flight=run.in_flight - 1)
    if run.state is RunState.EXHAUSTING:  # not a drain retry: it joins the remainder
        run = run.with_(remainder=run.remainder + 1)
    return _close_if_done(run, now), unit


def tool_calls_in(events: Sequence[tuple[int, Mapping[str, Any]]]) -> int:
    """The tool calls a turn's log events record (its ``tool_result`` events): the books count
    them with the turn (``RunRecord.tool_calls``)."""
    return sum(1 for _, event in events if event.get("type") == "tool_result")


def decide_turn(
    run: RunRecord,
    unit: UnitRecord,
    attempt: int,
    turn: int,
    tokens: int,
    now: float,
    tool_calls: int = 0,
    priced: Priced | None = None,
) -> tuple[RunRecord, UnitRecord, TurnSettlement]:
    """Settle model turn ``turn`` of an agent loop's attempt ``attempt`` (``Ledger.settle_turn``):
    its billed ``tokens`` spent now, released from the reservation as far as it still holds
    them (a turn beyond it is an overrun: spent, and ``available`` drops by the excess). A
    turn settled before is a duplicate (``settled`` False, records unchanged); any state of the
    run (a turn that ran is always billed): the caller stops the loop unless it is open."""
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
        raise InvalidInput("turn", f"must be a whole number >= 1, got {turn!r}")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise InvalidInput("tokens", f"must be a whole number >= 0, got {tokens!r}")
    if unit.turns >= turn:
        return run, unit, TurnSettlement(False, run.state, unit)
    res = unit.reservation
    if unit.state is not UnitState.IN_FLIGHT or res is None or res.attempt != attempt:
        raise Conflict(
            f"attempt {attempt} of unit {unit.unit_id} (run {run.run_id}) holds no reservation: "
            f"its turn {turn} cannot be settled"
        )
    if not res.loop:
        raise Conflict(
            f"attempt {attempt} of unit {unit.unit_id} (run {run.run_id}) is not an agent "
            "loop's: claim it with loop=True before settling its turns"
        )
    if turn != unit.turns + 1:
        raise Conflict(
            f"unit {unit.unit_id} (run {run.run_id}) has settled {unit.turns} turns: turn "
            f"{turn} cannot be settled before turn {unit.turns + 1}"
        )
    cost = 0 if priced is None else priced.cost_micro
    released = min(cost if res.usd else tokens, res.held)
    unit = unit.with_(
        turns=turn,
        spent=unit.spent + tokens,
        spent_micro=unit.spent_micro + cost,
        reservation=replace(res, used=res.used + tokens, used_micro=res.used_micro + cost),
        log_key=unit.log_key or log_key(run.run_id, unit.unit_id),
    )
    run = run.with_(
        spent=run.spent + tokens,
        spent_micro=run.spent_micro + cost,
        reserved=run.reserved - released,
        turns=run.turns + 1,
        tool_calls=run.tool_calls + tool_calls,
    )
    return run, unit, TurnSettlement(True, run.state, unit)


def decide_pause(
    run: RunRecord, unit: UnitRecord, attempt: int, now: float
) -> tuple[RunRecord, UnitRecord]:
    """An agent loop stopped at a turn boundary because its run is no longer open
    (``Ledger.pause``): its reservation is released (:func:`decide_release`), the unit is
    pending again (the remainder while the run exhausts) and may close the run. A unit that no
    longer holds a reservation for ``attempt`` is left as it is (a repeated pause), and so is
    one whose run is open (a top-up reopened it since the turn's answer): the loop goes on (its
    message would be gone, and the top-up did not requeue a unit in flight)."""
    res = unit.reservation
    if unit.state is not UnitState.IN_FLIGHT or res is None or res.attempt != attempt:
        return run, unit
    if not res.loop:
        raise Conflict(
            f"attempt {attempt} of unit {unit.unit_id} (run {run.run_id}) is not an agent "
            "loop's: only a loop pauses at a turn boundary (settle or unclaim it)"
        )
    if run.state is RunState.OPEN:
        return run, unit
    return decide_release(run, unit, now)


def decide_park(
    run: RunRecord, unit: UnitRecord, attempt: int, now: float, until: float
) -> tuple[RunRecord, UnitRecord]:
    """An agent loop whose next tool call waits for a person's decision is parked
    (``Ledger.park``): the unit leaves ``in_flight`` for ``awaiting_approval``, its reservation
    kept (unclaimed, its lease ``until``: when the sweeper rejects the undecided call), so no
    message and no worker hold it. An exhausting run may close now (a drain does not wait for a
    person). A unit parked already is left as it is (a repeated park)."""
    if unit.state is UnitState.AWAITING_APPROVAL:
        return run, unit
    res = unit.reservation
    if unit.state is not UnitState.IN_FLIGHT or res is None or res.attempt != attempt:
        raise Conflict(
            f"attempt {attempt} of unit {unit.unit_id} (run {run.run_id}) holds no reservation: "
            "it cannot be parked"
        )
    if not res.loop:
        raise Conflict(
            f"attempt {attempt} of unit {unit.unit_id} (run {run.run_id}) is not an agent "
            "loop's: only a loop waits for an approval"
        )
    unit = unit.with_(
        state=UnitState.AWAITING_APPROVAL,
        reservation=replace(res, claimed=False, lease_expires=until, sweep_at=None),
    )
    run = run.with_(in_flight=run.in_flight - 1, awaiting=run.awaiting + 1)
    return _close_if_done(run, now), unit


def decide_unpark(
    run: RunRecord, unit: UnitRecord, now: float, lease_s: float
) -> tuple[RunRecord, UnitRecord, bool]:
    """A parked unit's decisions are all recorded (``Ledger.unpark``): on an open run it is in
    flight again, its reservation unclaimed with a fresh lease (the caller sends it to its
    lane; a send that fails leaves a lease the sweep finds), and True; on a run that stopped
    admitting (its budget ran out) its reservation is released and it joins the remainder
    (a top-up's resume runs it: no turn the batch cannot pay for), and False."""
    res = unit.reservation
    if unit.state is not UnitState.AWAITING_APPROVAL or res is None:
        raise Conflict(f"unit {unit.unit_id} of run {run.run_id} is not awaiting an approval")
    run = run.with_(awaiting=run.awaiting - 1)
    if run.state is RunState.OPEN:
        unit = unit.with_(
            state=UnitState.IN_FLIGHT,
            reservation=replace(res, claimed=False, lease_expires=now + lease_s, sweep_at=None),
        )
        return run.with_(in_flight=run.in_flight + 1), unit, True
    unit = unit.with_(state=UnitState.PENDING, reservation=None, drain_epoch=0)
    run = run.with_(reserved=run.reserved - res.held, remainder=run.remainder + 1)
    return _close_if_done(run, now), unit, False


def log_key(run_id: str, unit_id: str) -> str:
    """The key of a unit's event log (``UnitRecord.log_key``; the log items' partition key)."""
    return f"log#{run_id}#{unit_id}"


def log_sort_key(seq: int) -> str:
    """A log event's place, as its item's sort key: in order as text."""
    return f"{seq:06d}"


def log_item_bytes(key: str, text: str) -> int:
    """The size DynamoDB counts for a log event's item: its attributes' names and values."""
    return len("pk") + len(key.encode()) + len("sk") + 6 + len("event") + len(text.encode())


def numbered(
    seq: int, events: Sequence[Mapping[str, object]]
) -> list[tuple[int, Mapping[str, object]]]:
    """``Ledger.append_log``'s events with their seqs: ``seq``, ``seq + 1``, ..."""
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise InvalidInput("seq", f"must be a whole number >= 0, got {seq!r}")
    return list(enumerate(events, start=seq))


def encode_events(
    key: str, events: Sequence[tuple[int, Mapping[str, object]]], max_events: int
) -> list[tuple[int, str]]:
    """A unit's log events as the compact JSON text they are kept as, each checked: its
    ``seq`` a whole number 0..999999 and given once, the event a JSON object, its item within
    DynamoDB's 400 KB, and all of them within one transaction (at most ``max_events``, 4 MB)."""
    if len(events) > max_events:
        raise InvalidInput(
            "events", f"{len(events)} events in one write; at most {max_events} fit a transaction"
        )
    encoded: list[tuple[int, str]] = []
    seen: set[int] = set()
    total = 0
    for i, entry in enumerate(events):
        if not isinstance(entry, tuple) or len(entry) != 2:
            raise InvalidInput(
                f"events[{i}]", f"must be a (seq, event) pair, got {type(entry).__name__}"
            )
        seq, event = entry
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_LOG_SEQ:
            raise InvalidInput("seq", f"must be a whole number 0..{MAX_LOG_SEQ}, got {seq!r}")
        if seq in seen:
            raise InvalidInput("seq", f"event {seq} is given more than once")
        seen.add(seq)
        if not isinstance(event, Mapping):
            raise InvalidInput(
                f"events[{seq}]", f"must be a JSON object, got {type(event).__name__}"
            )
        try:
            text = json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            text.encode()  # a lone surrogate is no UTF-8: DynamoDB could not store it
        except (TypeError, ValueError) as e:  # UnicodeEncodeError is a ValueError
            raise InvalidInput(f"events[{seq}]", f"is not JSON: {e}") from None
        size = log_item_bytes(key, text)
        if size > LOG_ITEM_LIMIT:
            raise InvalidInput(
                f"events[{seq}]",
                f"is {size:,} bytes as a log item; DynamoDB keeps at most {LOG_ITEM_LIMIT:,}: "
                "truncate what it carries (a tool's result) before recording it",
            )
        total += size
        encoded.append((seq, text))
    if total > TRANSACTION_BYTES - 8 * 1024:  # the unit and the books travel with them
        raise InvalidInput(
            "events", f"{total:,} bytes in one write; a transaction takes at most 4 MB"
        )
    return encoded


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
    """Add ``amount`` to the run's budget (reopening an exhausted run), in its budget's unit:
    tokens, or micro-dollars for a budget in dollars. ``max_budget``: the deployment's ceiling
    on a run's total budget, after any number of top-ups."""
    name, what = ("top_up_usd", "micro-dollars") if run.spec.usd else ("top_up", "tokens")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise InvalidInput(name, f"must be a positive whole number of {what}, got {amount!r}")
    if run.state is RunState.COMPLETED:
        raise Conflict(f"run {run.run_id} is completed: there is nothing to resume")
    if max_budget is not None and run.budget + amount > max_budget:
        room = max(0, max_budget - run.budget)
        raise InvalidInput(
            name,
            f"the budget would be {run.budget + amount:,} {what}, above this deployment's "
            f"maximum of {max_budget:,} for a batch: top up at most {room:,}",
        )
    run = run.with_(budget=run.budget + amount)
    if run.state in (RunState.EXHAUSTING, RunState.EXHAUSTED):
        run = run.with_(state=RunState.OPEN, remainder=0, closed_at=None)
    return run


def fresh_records(spec: RunSpec, now: float) -> tuple[RunRecord, list[UnitRecord]]:
    run = RunRecord(spec=spec, opened_at=now)
    units = [
        UnitRecord(spec.run_id, u.unit_id, u.projected_tokens, projected_micro=u.projected_micro)
        for u in spec.units
    ]
    return _close_if_done(run, now), units


def lost_bill(run: RunRecord, unit: UnitRecord) -> tuple[int, Priced | None]:
    """What an attempt settled as lost (its worker died holding it) is billed: its projected
    tokens, and its projected cost at the prices it was projected at (the submit's)."""
    prices = run.spec.prices
    return unit.projected_tokens, None if prices is None else Priced(unit.projected_micro, prices)


# ---------------------------------------------------------------- the port


def remainder_of(ledger: Ledger, run_id: str) -> list[str]:
    return [u.unit_id for u in ledger.units(run_id) if u.state is UnitState.REMAINDER]
