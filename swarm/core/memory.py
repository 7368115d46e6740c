"""In-memory implementations of every port in :mod:`swarm.core.ports`: the simulator runs on
them, and the unit tests use them as twins of the AWS adapters (the ledger and the governor are
held to the same contract tests as their DynamoDB versions)."""

from __future__ import annotations

import copy
import json
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from swarm.core.errors import Conflict, Contended, InvalidInput, NotFound, ObjectTooLarge
from swarm.core.governor import (
    BucketState,
    Draw,
    GovernorConfig,
    GovernorSnapshot,
    Grant,
    LevelHistory,
    Ticket,
    TrueUp,
    snapshot_of,
)
from swarm.core.lanes import Bundle, Policy, QueuedUnit
from swarm.core.ledger import (
    DEFAULT_LEASE_S,
    MAX_TURN_EVENTS,
    TRANSACTION_ITEMS,
    Admission,
    Claim,
    Fate,
    Settlement,
    TopUp,
    TurnSettlement,
    decide_admission,
    decide_claim,
    decide_claimed_settlement,
    decide_dead_letter,
    decide_park,
    decide_pause,
    decide_release,
    decide_settlement,
    decide_top_up,
    decide_turn,
    decide_unclaim,
    decide_unpark,
    effective_state,
    encode_events,
    fresh_records,
    log_key,
    lost_bill,
    numbered,
    reclaim_in_turn,
    scan_leases,
    tool_calls_in,
)
from swarm.core.ports import (
    ClaimedSettlement,
    DrainState,
    LaneDepth,
    LeaseKey,
    LeasesPage,
    MappingState,
    RunningUnits,
    SignedUpload,
    TenantQueued,
    UnitsPage,
    WatchedRun,
    check_delays,
    check_entry,
    tally,
    upload_headers,
)
from swarm.core.pricing import Priced
from swarm.core.records import (
    LANES,
    AttemptRecord,
    Lane,
    RunRecord,
    RunSpec,
    RunState,
    UnitRecord,
    UnitState,
)
from swarm.core.results import (
    AttemptOutcome,
    FileLines,
    always,
    attempt_key,
    find_outcomes,
    page_doc,
    page_key,
    results_file_key,
    write_in_parts,
)
from swarm.core.tenancy import HOLD_WINDOW_S, MAX_HOLDS


class InMemoryLedger:
    """The reference implementation: a dict per run, used by the simulator and unit tests."""

    def __init__(self) -> None:
        self._runs: dict[str, RunRecord] = {}
        self._units: dict[str, dict[str, UnitRecord]] = {}
        self._attempts: dict[tuple[str, str, int], Settlement] = {}
        #: runs being opened (begin_open .. the last open_units): their books and the units
        #: written so far, invisible to every other method until ready
        self._opening: dict[str, tuple[RunRecord, dict[str, UnitRecord]]] = {}
        #: per tenant: its holds' version and the runs held (units, when), see hold_queue
        self._holds: dict[str, tuple[int, dict[str, tuple[int, float]]]] = {}
        #: the units' event logs (log_key -> seq -> the event as compact JSON text: what a
        #: DynamoDB item holds, so a log here holds only what the table can)
        self._logs: dict[str, dict[int, str]] = {}

    # -- reads
    def run(self, run_id: str, opening: bool = False) -> RunRecord:
        if opening and run_id in self._opening:
            run, written = self._opening[run_id]
            return run.with_(units_written=len(written))
        try:
            return self._runs[run_id]
        except KeyError:
            raise NotFound(f"no run {run_id!r}") from None

    def unit(self, run_id: str, unit_id: str) -> UnitRecord:
        run = self.run(run_id)
        try:
            unit = self._units[run_id][unit_id]
        except KeyError:
            raise NotFound(f"run {run_id!r} has no unit {unit_id!r}") from None
        return unit.with_(state=effective_state(run, unit))

    def units(self, run_id: str) -> list[UnitRecord]:
        run = self.run(run_id)
        return [u.with_(state=effective_state(run, u)) for u in self._units[run_id].values()]

    def units_page(self, run_id: str, after: str | None, limit: int) -> UnitsPage:
        run = self.run(run_id)
        ids = sorted(u for u in self._units[run_id] if after is None or u > after)
        page = [self._units[run_id][u] for u in ids[:limit]]
        return UnitsPage(
            [u.with_(state=effective_state(run, u)) for u in page],
            page[-1].unit_id if len(ids) > limit else None,
        )

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        self.run(run_id)
        return [s.attempt for (r, _, _), s in self._attempts.items() if r == run_id]

    def queued_units(self, tenant: str) -> int:
        return sum(self._queued_by_run(tenant).values())

    def _queued_by_run(self, tenant: str) -> dict[str, int]:
        runs = [*self._runs.values(), *(run for run, _ in self._opening.values())]
        return {
            r.run_id: r.outstanding for r in runs if r.spec.tenant == tenant and not r.state.closed
        }

    def _live_holds(self, tenant: str, now: float) -> dict[str, tuple[int, float]]:
        _, holds = self._holds.get(tenant, (0, {}))
        return {run: held for run, held in holds.items() if held[1] > now - HOLD_WINDOW_S}

    def tenant_queue(self, tenant: str, now: float) -> TenantQueued:
        queued = self._queued_by_run(tenant)
        known = {*self._runs, *self._opening}
        for run_id, (units, _) in self._live_holds(tenant, now).items():
            if run_id not in known:  # held, not created yet: what it will queue
                queued[run_id] = units
        runs = [*self._runs.values(), *(run for run, _ in self._opening.values())]
        progress = tuple(
            (r.opened_at, r.completed + r.dead_lettered)
            for r in runs
            if r.spec.tenant == tenant and not r.state.closed
        )
        return TenantQueued(sum(queued.values()), self._holds.get(tenant, (0, {}))[0], progress)

    def hold_queue(self, tenant: str, version: int, run_id: str, units: int, now: float) -> None:
        current, _ = self._holds.get(tenant, (0, {}))
        holds = self._live_holds(tenant, now)
        if current != version:
            raise Contended(f"tenant {tenant!r}: another submission was decided meanwhile")
        if len(holds) >= MAX_HOLDS:
            raise Contended(f"tenant {tenant!r}: {MAX_HOLDS} submissions in the last minute")
        holds[run_id] = (units, now)
        self._holds[tenant] = (version + 1, holds)

    # -- writes
    def open_run(self, spec: RunSpec, now: float) -> RunRecord:
        if self.begin_open(spec, "", now).state is RunState.OPENING:
            self.open_units(spec, 0, spec.units_total, now)
        return self.run(spec.run_id)

    def begin_open(self, spec: RunSpec, spec_key: str, now: float) -> RunRecord:
        existing = self._runs.get(spec.run_id)
        if existing is None and spec.run_id in self._opening:
            existing = self._opening[spec.run_id][0]
        if existing is not None:
            if existing.spec != spec:
                raise Conflict(f"run {spec.run_id!r} exists with a different spec")
            return self.run(spec.run_id, opening=True)
        run, _ = fresh_records(spec.summary, now)
        self._opening[spec.run_id] = (run.with_(state=RunState.OPENING), {})
        return self.run(spec.run_id, opening=True)

    def open_units(
        self,
        spec: RunSpec,
        cursor: int,
        limit: int,
        now: float,
        keep_going: Callable[[], bool] = lambda: True,
    ) -> int:
        if spec.run_id in self._runs:
            return spec.units_total
        if spec.run_id not in self._opening:
            raise NotFound(f"no run {spec.run_id!r}")
        if len(spec.units) != spec.units_total:
            raise ValueError("open_units needs the spec's unit list")
        run, written = self._opening[spec.run_id]
        stop = min(spec.units_total, cursor + limit)
        while cursor < stop and keep_going():
            for u in spec.units[cursor : min(stop, cursor + 25)]:
                written[u.unit_id] = UnitRecord(
                    spec.run_id, u.unit_id, u.projected_tokens, projected_micro=u.projected_micro
                )
                cursor += 1
        if cursor < spec.units_total:
            return cursor
        del self._opening[spec.run_id]
        self._runs[spec.run_id] = run.with_(state=RunState.OPEN)
        # in submission order, whatever order the pages came in
        self._units[spec.run_id] = {u.unit_id: written[u.unit_id] for u in spec.units}
        return cursor

    def admit(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        by_scan: bool = False,
    ) -> Admission:
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        run, unit, admission = decide_admission(run, unit, attempt, now, lease_s, by_scan)
        self._runs[run_id] = run
        self._units[run_id][unit_id] = unit
        return admission

    def admit_many(
        self,
        run_id: str,
        unit_ids: Sequence[str],
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        by_scan: bool = False,
    ) -> list[Admission]:
        admissions = []
        for unit_id in unit_ids:
            attempt = self._raw_unit(run_id, unit_id).next_attempt
            admissions.append(self.admit(run_id, unit_id, attempt, now, lease_s, by_scan))
        return admissions

    def settle(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        tokens: int,
        succeeded: bool,
        now: float,
        outcome_key: str | None = None,
        *,
        retry: bool = True,
        priced: Priced | None = None,
    ) -> Settlement:
        return self._settle(
            run_id,
            unit_id,
            attempt,
            tokens,
            succeeded,
            now,
            reclaimed=False,
            key=outcome_key,
            retry=retry,
            priced=priced,
        )

    def settle_turn(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        turn: int,
        tokens: int,
        now: float,
        events: Sequence[tuple[int, Mapping[str, Any]]] = (),
        known: UnitRecord | None = None,  # the DynamoDB ledger's hint; nothing to save here
        priced: Priced | None = None,
    ) -> TurnSettlement:
        key = log_key(run_id, unit_id)
        encoded = encode_events(key, events, MAX_TURN_EVENTS)
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        new_run, new_unit, settled = decide_turn(
            run, unit, attempt, turn, tokens, now, tool_calls_in(events), priced
        )
        if not settled.settled:
            return TurnSettlement(False, run.state, unit.with_(state=effective_state(run, unit)))
        self._check_free(key, [seq for seq, _ in encoded])
        self._runs[run_id], self._units[run_id][unit_id] = new_run, new_unit
        self._logs.setdefault(key, {}).update(encoded)
        return settled

    def pause(self, run_id: str, unit_id: str, attempt: int, now: float) -> RunRecord:
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        self._runs[run_id], self._units[run_id][unit_id] = decide_pause(run, unit, attempt, now)
        return self._runs[run_id]

    def park(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        until: float,
        events: Sequence[tuple[int, Mapping[str, Any]]] = (),
    ) -> RunRecord:
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        new_run, new_unit = decide_park(run, unit, attempt, now, until)
        key = log_key(run_id, unit_id)
        encoded = encode_events(key, events, MAX_TURN_EVENTS)
        if new_unit != unit:
            self._check_free(key, [seq for seq, _ in encoded])
            self._logs.setdefault(key, {}).update(encoded)
        self._runs[run_id], self._units[run_id][unit_id] = new_run, new_unit
        return new_run

    def unpark(
        self,
        run_id: str,
        unit_id: str,
        now: float,
        lease_s: float,
        events: Sequence[tuple[int, Mapping[str, Any]]],
    ) -> tuple[RunRecord, UnitRecord, bool]:
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        new_run, new_unit, queued = decide_unpark(run, unit, now, lease_s)
        key = log_key(run_id, unit_id)
        encoded = encode_events(key, events, MAX_TURN_EVENTS)
        self._check_free(key, [seq for seq, _ in encoded])
        self._logs.setdefault(key, {}).update(encoded)
        self._runs[run_id], self._units[run_id][unit_id] = new_run, new_unit
        return new_run, new_unit.with_(state=effective_state(new_run, new_unit)), queued

    def read_log(self, run_id: str, unit_id: str) -> list[dict[str, Any]]:
        log = self._logs.get(log_key(run_id, unit_id), {})
        return [json.loads(log[seq]) for seq in sorted(log)]

    def append_log(
        self, run_id: str, unit_id: str, seq: int, events: Sequence[Mapping[str, Any]]
    ) -> None:
        key = log_key(run_id, unit_id)
        encoded = encode_events(key, numbered(seq, events), TRANSACTION_ITEMS)
        self._check_free(key, [s for s, _ in encoded])
        self._logs.setdefault(key, {}).update(encoded)

    def _check_free(self, key: str, seqs: Sequence[int]) -> None:
        log = self._logs.get(key, {})
        taken = [seq for seq in seqs if seq in log]
        if taken:
            raise Contended(f"log {key!r} holds event {taken[0]} already: another worker")

    def settle_claimed(
        self,
        claimed: UnitRecord,
        attempt: int,
        tokens: int,
        succeeded: bool,
        now: float,
        outcome_key: str | None = None,
        *,
        retry: bool = True,
        priced: Priced | None = None,
    ) -> Fate | None:
        # the DynamoDB write's conditions: the unit exactly as claimed, the attempt unsettled,
        # the run open and, for a unit that ends, not its last outstanding one
        run_id, unit_id = claimed.run_id, claimed.unit_id
        run = self._runs.get(run_id)
        unit = self._units.get(run_id, {}).get(unit_id)
        if run is None or unit != claimed or run.state is not RunState.OPEN:
            return None
        if (run_id, unit_id, attempt) in self._attempts:
            return None
        decided = decide_claimed_settlement(
            run.spec, claimed, attempt, tokens, succeeded, now, retry=retry, priced=priced
        )
        if decided is None:
            return None
        if decided[3].fate is not Fate.RETRY and run.outstanding <= 1:
            return None  # it would close the run: the books decide (settle)
        settled = self.settle(
            run_id,
            unit_id,
            attempt,
            tokens,
            succeeded,
            now,
            outcome_key,
            retry=retry,
            priced=priced,
        )
        return settled.fate

    def settle_claimed_many(self, settlements: Sequence[ClaimedSettlement]) -> list[Fate | None]:
        return [
            self.settle_claimed(
                s.claimed,
                s.attempt,
                s.tokens,
                s.succeeded,
                s.now,
                s.outcome_key,
                retry=s.retry,
                priced=s.priced,
            )
            for s in settlements
        ]

    def top_up(self, run_id: str, amount: int, now: float, max_budget: int | None = None) -> TopUp:
        before = self.run(run_id)
        requeue = tuple(
            u.unit_id
            for u in self._units[run_id].values()
            if effective_state(before, u) is UnitState.REMAINDER
        )
        run = decide_top_up(before, amount, now, max_budget)
        self._runs[run_id] = run
        return TopUp(run, requeue if run.state is RunState.OPEN else ())

    def claim(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float,
        loop: bool = False,
    ) -> Claim:
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        unit, claim = decide_claim(run, unit, attempt, now, lease_s, loop)
        self._units[run_id][unit_id] = unit
        return claim

    def claim_queued(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float,
        loop: bool = False,
    ) -> Claim | None:
        unit = self._units.get(run_id, {}).get(unit_id)
        res = None if unit is None else unit.reservation
        if unit is None or unit.state is not UnitState.IN_FLIGHT or res is None:
            return None
        if res.attempt != attempt or res.claimed:
            return None
        return self.claim(run_id, unit_id, attempt, now, lease_s, loop)

    def unclaim(self, run_id: str, unit_id: str, attempt: int, now: float, lease_s: float) -> bool:
        self.run(run_id)
        unit, done = decide_unclaim(self._raw_unit(run_id, unit_id), attempt, now, lease_s)
        self._units[run_id][unit_id] = unit
        return done

    def expired_leases(self, run_id: str, now: float) -> list[str]:
        self.run(run_id)
        return [key.unit_id for key in self._leases(run_id, now)]  # the oldest expiry first

    def _leases(self, run_id: str, until: float) -> list[LeaseKey]:
        """The run's leases that end by ``until``, as the lease index lists them
        (Reservation.sweep_at)."""
        return sorted(
            LeaseKey(u.reservation.swept_from, u.unit_id)
            for u in self._units[run_id].values()
            if u.reservation is not None and u.reservation.swept_from <= until
        )

    def leases_page(
        self, run_id: str, until: float, after: LeaseKey | None, limit: int
    ) -> LeasesPage:
        self.run(run_id)
        rest = [k for k in self._leases(run_id, until) if after is None or k > after]
        return LeasesPage(rest[:limit], len(rest) > limit)

    def reclaim_expired(
        self, run_id: str, now: float, keep_going: Callable[[], bool] = always
    ) -> list[Settlement]:
        run = self.run(run_id)
        expired = self.expired_leases(run_id, now)
        scan_at = run.scan_at if run.scan_at is not None and run.scan_at <= now else None
        horizon = None
        if scan_at is not None:  # every unit, as DynamoDB's scan
            found, horizon = scan_leases(self._units[run_id].values(), now)
            expired = list(dict.fromkeys([*expired, *found]))
        lost, whole = reclaim_in_turn(
            expired, lambda unit_id: self.reclaim_unit(run_id, unit_id, now), keep_going
        )
        latest = self.run(run_id)
        if (
            whole and scan_at is not None and latest.scan_at == scan_at
        ):  # else an admission moved it
            self._runs[run_id] = latest.with_(scan_at=horizon)
        return lost

    def reclaim_unit(self, run_id: str, unit_id: str, now: float) -> Settlement | None:
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        res = unit.reservation
        if res is None or res.lease_expires > now or unit.state is not UnitState.IN_FLIGHT:
            return None  # a parked unit's lease is its approvals' timeout (the finalizer's)
        if not res.claimed or res.loop:  # a loop's attempt is never lost: its log tells
            self._runs[run_id], self._units[run_id][unit_id] = decide_release(run, unit, now)
            return None
        return self._settle_lost(run, unit, now)

    def dead_letter(self, run_id: str, unit_id: str, now: float) -> UnitRecord:
        unit = self._raw_unit(run_id, unit_id)
        res = unit.reservation
        if res is not None:
            if res.claimed and not res.loop:
                self._settle_lost(self.run(run_id), unit, now)
            else:
                self._runs[run_id], self._units[run_id][unit_id] = decide_release(
                    self.run(run_id), unit, now
                )
        unit = self._raw_unit(run_id, unit_id)
        if unit.state is UnitState.PENDING:
            self._runs[run_id], unit = decide_dead_letter(self.run(run_id), unit, now)
            self._units[run_id][unit_id] = unit
        return self.unit(run_id, unit_id)

    def opening(self) -> list[RunRecord]:
        """The runs being opened (the sweeper's watch sees them from the submit on)."""
        return [self.run(run_id, opening=True) for run_id in self._opening]

    # -- persistence (the simulator's state files)
    def records(self) -> tuple[list[RunRecord], list[UnitRecord], list[AttemptRecord]]:
        """Everything the books hold, stored states (not effective ones)."""
        units = [u for by_id in self._units.values() for u in by_id.values()]
        return list(self._runs.values()), units, [s.attempt for s in self._attempts.values()]

    @classmethod
    def from_records(
        cls,
        runs: Iterable[RunRecord],
        units: Iterable[UnitRecord],
        attempts: Iterable[AttemptRecord],
    ) -> InMemoryLedger:
        ledger = cls()
        for run in runs:
            ledger._runs[run.run_id] = run
            ledger._units[run.run_id] = {}
        for unit in units:
            ledger._units[unit.run_id][unit.unit_id] = unit
        for a in attempts:
            run = ledger._runs[a.run_id]
            unit = ledger._units[a.run_id][a.unit_id]
            if a.succeeded:
                fate = Fate.COMPLETED
            elif a.attempt + 1 >= run.spec.max_attempts or (
                unit.state is UnitState.DEAD_LETTERED and a.attempt + 1 == unit.attempts
            ):  # its last attempt, or one settled without a retry
                fate = Fate.DEAD_LETTERED
            else:
                fate = Fate.RETRY
            ledger._attempts[(a.run_id, a.unit_id, a.attempt)] = Settlement(
                fate, False, run, unit, a
            )
        return ledger

    # -- helpers
    def _raw_unit(self, run_id: str, unit_id: str) -> UnitRecord:
        try:
            return self._units[run_id][unit_id]
        except KeyError:
            raise NotFound(f"run {run_id!r} has no unit {unit_id!r}") from None

    def _settle_lost(self, run: RunRecord, unit: UnitRecord, now: float) -> Settlement:
        """Settle the claimed attempt the unit holds as lost: its projection billed
        (:func:`swarm.core.ledger.lost_bill`)."""
        assert unit.reservation is not None
        tokens, priced = lost_bill(run, unit)
        return self._settle(
            run.run_id,
            unit.unit_id,
            unit.reservation.attempt,
            tokens,
            False,
            now,
            reclaimed=True,
            priced=priced,
        )

    def _settle(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        tokens: int,
        succeeded: bool,
        now: float,
        *,
        reclaimed: bool,
        key: str | None = None,
        retry: bool = True,
        priced: Priced | None = None,
    ) -> Settlement:
        settled = (run_id, unit_id, attempt)
        first = self._attempts.get(settled)
        if first is not None:
            return Settlement(
                first.fate, True, self.run(run_id), self.unit(run_id, unit_id), first.attempt
            )
        run, unit = self.run(run_id), self._raw_unit(run_id, unit_id)
        run, unit, settlement = decide_settlement(
            run,
            unit,
            attempt,
            tokens,
            succeeded,
            now,
            reclaimed=reclaimed,
            outcome_key=key,
            retry=retry,
            priced=priced,
        )
        self._runs[run_id] = run
        self._units[run_id][unit_id] = unit
        self._attempts[settled] = settlement
        return settlement


class InMemoryGovernor:
    """One bucket in one process: the simulator's governor and the reference for the adapters.
    It never books ahead (a ticket presented to it is ignored) and settles a true-up at once.
    Thread-safe (a worker runs its batch's units on threads): each operation holds its lock,
    so two draws never grant from one reading of the bucket."""

    def __init__(self, config: GovernorConfig, now: float = 0.0) -> None:
        self.config = config
        self.state = BucketState.fresh(config, now)
        # what bounds a refund (docs/explanation/governor.md, "True-up")
        self.history = LevelHistory()
        self._lock = threading.RLock()

    def draw(
        self, amount: int, lane: Lane, now: float, ticket: Ticket | None = None, tenant: str = ""
    ) -> Draw:
        with self._lock:
            return self._draw(amount, lane, now)

    def _draw(self, amount: int, lane: Lane, now: float) -> Draw:
        # a thread that read its clock before another's draw: the bucket's time (its clock
        # never runs backward, or the next draw would be refilled twice for the same seconds)
        now = max(now, self.state.updated_at)
        before = self.state.available(self.config, now)
        requests = 0 if self.config.rpm is None else 1  # one model call
        self.state, result = self.state.draw(self.config, amount, lane, now, requests)
        if not result.granted:
            return result
        self.history.observe(now, before)
        seq = self.history.observe(now, result.available)
        mark = None
        if requests:  # the request bucket's level - credit - refunded (GovernorConfig.rpm)
            st = self.state
            mark = Decimal(repr(st.requests - st.request_credit - st.requests_refunded))
        grant = Grant(amount, lane, now, seq=seq, requests=requests, requests_mark=mark)
        return replace(result, grant=grant)

    def true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        """Give back what the model did not use, as far as that is sound; draw what it used
        beyond the grant, into debt if need be."""
        with self._lock:
            return self._true_up(grant, used, now)

    def _true_up(self, grant: Grant, used: int, now: float) -> TrueUp:
        now = max(now, self.state.updated_at)
        level = self.state.available(self.config, now)
        if used > grant.amount:
            self.history.observe(now, level)
            self.state = replace(self.state, tokens=level - (used - grant.amount), updated_at=now)
            return TrueUp(debited=used - grant.amount)
        unused = grant.amount - used
        room = self.history.room(grant.seq, level, self.config.bucket_capacity)
        back = min(unused, math.floor(room))
        if back > 0:
            self.history.observe(now, level)
            self.history.refunded += back
            self.state = replace(self.state, tokens=level + back, updated_at=now)
        if used == 0:
            self._release_request(grant, now)
        return TrueUp(refunded=back, dropped=unused - back)

    def _release_request(self, grant: Grant, now: float) -> None:
        """The call never went out: its request goes back if the request bucket, had it never
        been drawn, could not have overflowed since (swarm.core.governor.plan_requests)."""
        cap = self.config.request_capacity
        if cap is None or grant.requests <= 0 or grant.requests_mark is None:
            return
        st = self.state.at(self.config, now)
        bound = cap - st.request_credit - float(grant.requests_mark)
        if st.requests_refunded + grant.requests <= bound:
            self.state = replace(
                st,
                requests=st.requests + grant.requests,
                requests_refunded=st.requests_refunded + grant.requests,
            )

    def report_throttle(self, now: float) -> None:
        with self._lock:
            self.state = self.state.throttled(self.config, max(now, self.state.updated_at))

    def snapshot(self, now: float) -> GovernorSnapshot:
        with self._lock:
            return snapshot_of(self.state, self.config, now)


class _Lane:
    """One lane: a FIFO per tenant and a rotation of tenants (one tenant = plain FIFO)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.fifo: deque[QueuedUnit] = deque()
        self.tenants: OrderedDict[str, deque[QueuedUnit]] = OrderedDict()

    def __len__(self) -> int:
        if self.policy is Policy.FIFO:
            return len(self.fifo)
        return sum(len(q) for q in self.tenants.values())

    def push(self, item: QueuedUnit, first: bool = False) -> None:
        queue = (
            self.fifo
            if self.policy is Policy.FIFO
            else self.tenants.setdefault(item.tenant, deque())
        )
        if first:  # a retry that goes to the head of its tenant's queue (swarm.core.scheduling)
            queue.appendleft(item)
        else:
            queue.append(item)

    def peek(self) -> QueuedUnit | None:
        if self.policy is Policy.FIFO:
            return self.fifo[0] if self.fifo else None
        for queue in self.tenants.values():
            return queue[0]
        return None

    def pop(self) -> QueuedUnit:
        if self.policy is Policy.FIFO:
            return self.fifo.popleft()
        tenant, queue = next(iter(self.tenants.items()))
        item = queue.popleft()
        del self.tenants[tenant]
        if queue:  # the tenant goes to the back of the rotation
            self.tenants[tenant] = queue
        return item

    def items(self) -> Iterator[QueuedUnit]:
        if self.policy is Policy.FIFO:
            yield from self.fifo
        else:
            for queue in self.tenants.values():
                yield from queue

    def remove(self, run_id: str, unit_ids: set[str]) -> int:
        def keep(q: QueuedUnit) -> bool:
            return not (q.run_id == run_id and q.unit_id in unit_ids)

        before = len(self)
        if self.policy is Policy.FIFO:
            self.fifo = deque(q for q in self.fifo if keep(q))
        else:
            for tenant in list(self.tenants):
                kept = deque(q for q in self.tenants[tenant] if keep(q))
                if kept:
                    self.tenants[tenant] = kept
                else:
                    del self.tenants[tenant]
        return before - len(self)


class InMemoryLanes:
    """Strict priority across lanes; ``policy`` inside each lane."""

    def __init__(self, policy: Policy = Policy.FIFO) -> None:
        self.policy = policy
        self._lanes = {lane: _Lane(policy) for lane in LANES}

    def push(self, item: QueuedUnit, first: bool = False) -> None:
        self._lanes[item.lane].push(item, first)

    def peek(self) -> QueuedUnit | None:
        for lane in LANES:
            item = self._lanes[lane].peek()
            if item is not None:
                return item
        return None

    def pop(self) -> QueuedUnit:
        for lane in LANES:
            if len(self._lanes[lane]):
                return self._lanes[lane].pop()
        raise IndexError("pop from empty lanes")

    def remove(self, run_id: str, unit_ids: set[str]) -> int:
        return sum(self._lanes[lane].remove(run_id, unit_ids) for lane in LANES)

    def depth(self, lane: Lane | None = None) -> int:
        if lane is not None:
            return len(self._lanes[lane])
        return sum(len(q) for q in self._lanes.values())

    def items(self) -> list[QueuedUnit]:
        """Every queued unit in service order per lane (used to save simulator state)."""
        return [item for lane in LANES for item in self._lanes[lane].items()]


@dataclass
class MemoryQueue:
    """Lanes as FIFO deques; ``receive`` hands out messages the way a poller would."""

    lanes: dict[Lane, deque[QueuedUnit]] = field(
        default_factory=lambda: {lane: deque() for lane in LANES}
    )
    delayed: list[tuple[float, QueuedUnit]] = field(default_factory=list)
    in_flight: dict[Lane, int] = field(default_factory=lambda: dict.fromkeys(LANES, 0))
    sent: list[QueuedUnit] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)  # each send_many's (or send_bundles') units
    bundles: list[int] = field(default_factory=list)  # each bundle's number of units, as sent

    def send(self, item: QueuedUnit, delay_s: float = 0) -> None:
        self.sent.append(item)
        if delay_s > 0:
            self.delayed.append((delay_s, item))
        else:
            self.lanes[item.lane].append(item)

    def send_many(self, items: Sequence[QueuedUnit], delays_s: Sequence[float] = ()) -> None:
        """In order, as SQS keeps each lane's batches (there are no batch limits here)."""
        self.batches.append(len(items))
        for item, delay in zip(items, check_delays(items, delays_s), strict=True):
            self.send(item, delay)

    def send_bundles(self, bundles: Sequence[Bundle]) -> None:
        """Each bundle's units in order, with its delay (a receive here takes one unit)."""
        self.batches.append(sum(len(b.units) for b in bundles))
        for b in bundles:
            self.bundles.append(len(b.units))
            for item in b.units:
                self.send(item, b.delay_s)

    def change_visibility(self, lane: Lane, receipt_handle: str, seconds: float) -> None:
        """Messages here have no receipt handles: a retry is sent again by the test itself."""

    def release_delayed(self) -> None:
        for _, item in self.delayed:
            self.lanes[item.lane].append(item)
        self.delayed.clear()

    def receive(self) -> QueuedUnit | None:
        for lane in LANES:
            if self.lanes[lane]:
                return self.lanes[lane].popleft()
        return None

    def depths(self) -> Mapping[Lane, LaneDepth]:
        delayed = {lane: sum(1 for _, i in self.delayed if i.lane is lane) for lane in LANES}
        return {
            lane: LaneDepth(len(self.lanes[lane]), self.in_flight[lane], delayed[lane])
            for lane in LANES
        }


@dataclass
class MemoryBlobs:
    """The bucket in memory, with the S3 adapter's rules: a size limit on reads that reads
    nothing of a bigger object, and upload URLs that write one object once, of exactly the
    size they were signed for, with exactly their headers (:meth:`upload`, what S3 checks of a
    presigned PUT; their expiry is not modelled: there is no clock here)."""

    objects: dict[str, str | bytes] = field(default_factory=dict)
    #: upload URL -> (the key it writes, the size it was signed for)
    signed: dict[str, tuple[str, int]] = field(default_factory=dict)

    def put_json(self, key: str, doc: Any) -> None:
        self.objects[key] = json.dumps(doc)

    def get_json(self, key: str, max_bytes: int | None = None) -> Any:
        try:
            body = self.objects[key]
        except KeyError:
            raise NotFound(f"no object {key!r}") from None
        size = len(body.encode() if isinstance(body, str) else body)
        if max_bytes is not None and size > max_bytes:
            raise ObjectTooLarge(key, size, max_bytes)
        try:
            return json.loads(body)
        except ValueError as e:  # as S3Blobs says it
            reason = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
            raise InvalidInput(key, f"not JSON ({reason})") from None

    def exists(self, key: str) -> bool:
        return key in self.objects

    def upload_url(self, key: str, size_bytes: int, expires_s: int) -> SignedUpload:
        url = f"memory://{key}?size={size_bytes}&expires={expires_s}"
        self.signed[url] = (key, size_bytes)
        return SignedUpload(url, upload_headers(size_bytes))

    def upload(self, url: str, method: str, headers: Mapping[str, str], body: bytes) -> None:
        """Send ``body`` to an upload URL as a client would. Refused as S3 refuses it: a URL
        this store did not sign, another method or other headers than signed, a body of another
        size than the Content-Length (InvalidInput); an object that exists already (Conflict,
        S3's 412 for ``If-None-Match: *``)."""
        if url not in self.signed:
            raise InvalidInput("url", "not an upload URL of this store (S3: 403)")
        key, size = self.signed[url]
        sent = {name.lower(): value for name, value in headers.items()}
        wanted = {name.lower(): value for name, value in upload_headers(size).items()}
        if method != "PUT" or sent != wanted or len(body) != size:
            raise InvalidInput(
                "headers", "not the request the URL was signed for (S3: SignatureDoesNotMatch)"
            )
        if key in self.objects:
            raise Conflict(f"{key!r} exists already (S3: 412 PreconditionFailed)")
        self.objects[key] = body


@dataclass
class MemoryResults:
    """The results store in memory: the same keys and write-once rule as the S3 adapter."""

    objects: dict[str, bytes] = field(default_factory=dict)

    pages: int = 0
    #: a results file is written in parts of this size (the S3 adapter's PART_BYTES)
    part_bytes: int = 8 * 1024 * 1024
    #: results files begun and not finished: key -> (the parts written, the unit they end after)
    partial: dict[str, tuple[bytes, str | None]] = field(default_factory=dict)

    def record(self, outcome: AttemptOutcome) -> str | None:
        key = attempt_key(outcome.run_id, outcome.unit_id, outcome.attempt)
        if key in self.objects:
            return None
        self.objects[key] = json.dumps(outcome.as_doc()).encode()
        return key

    def record_page(self, run_id: str, outcomes: Sequence[AttemptOutcome]) -> str:
        self.pages += 1
        key = page_key(run_id, f"{self.pages:08d}")
        self.objects[key] = json.dumps(page_doc(outcomes)).encode()
        return key

    def outcomes(
        self, run_id: str, attempts: Sequence[tuple[str, int, str | None]]
    ) -> list[AttemptOutcome | None]:
        def read(keys: Sequence[str]) -> dict[str, Any]:
            return {k: json.loads(self.objects[k]) for k in keys if k in self.objects}

        return find_outcomes(run_id, attempts, read)

    def write_file(
        self,
        run_id: str,
        name: str,
        lines: FileLines,
        keep_going: Callable[[], bool] = always,
    ) -> str | None:
        key = results_file_key(run_id, name)
        written, after = self.partial.pop(key, (b"", None))
        parts = [written]

        def put_part(part: bytes, last: str) -> None:
            nonlocal after
            parts.append(part)
            after = last

        tail = write_in_parts(lines(after), self.part_bytes, put_part, keep_going)
        if tail is None:  # out of time: what is written stays for the next call
            self.partial[key] = (b"".join(parts), after)
            return None
        self.objects[key] = b"".join(parts) + tail
        return key

    def exists(self, key: str) -> bool:
        return key in self.objects

    def download_url(self, key: str, expires_s: int) -> str:
        return f"memory://{key}?expires={expires_s}"

    def location(self, key: str) -> str:
        return f"memory://{key}"


@dataclass
class MemoryBindings:
    bound: dict[str, str] = field(default_factory=dict)

    def bind(self, tenant: str, role_id: str, now: float) -> bool:
        return self.bound.setdefault(tenant, role_id) == role_id

    def unbind(self, tenant: str) -> bool:
        return self.bound.pop(tenant, None) is not None


@dataclass
class MemoryExecutions:
    started: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: execution name -> status; a started execution is RUNNING until a test says otherwise
    statuses: dict[str, str] = field(default_factory=dict)
    #: the execution's open step, run as it starts (an input with ``open``: the run is being
    #: opened); e.g. swarm.service.opener.open_at_once. None: the run stays opening.
    open_step: Callable[[Mapping[str, Any]], None] | None = None

    def start(self, name: str, payload: Mapping[str, Any]) -> bool:
        if name in self.started:
            return False
        self.started[name] = copy.deepcopy(dict(payload))
        self.statuses[name] = "RUNNING"
        if self.open_step is not None and "open" in payload:
            self.open_step(payload)
        return True

    def status(self, name: str) -> str | None:
        return self.statuses.get(name)


@dataclass
class MemoryRunWatch:
    """The sweeper's watch list over an :class:`InMemoryLedger`, with the DynamoDB adapter's
    meaning (swarm.adapters.dynamodb_watch): a run is watched from its opening (due
    ``grace_s`` later) until the closure it is in is released; a run that left that closure (a
    top-up reopened it) is watched again, due at once."""

    ledger: InMemoryLedger
    grace_s: float = 300.0
    entries: dict[str, WatchedRun] = field(default_factory=dict)
    released: dict[str, tuple[RunState, int]] = field(default_factory=dict)

    def _sync(self) -> None:
        runs, _, _ = self.ledger.records()
        for run in [*self.ledger.opening(), *runs]:  # watched from the submit on
            closure = self.released.get(run.run_id)
            if closure == (run.state, run.exhaustions):
                continue
            if closure is not None:  # reopened after its closure was announced
                del self.released[run.run_id]
                self.entries[run.run_id] = WatchedRun(run.run_id, run.opened_at)
            elif run.run_id not in self.entries:
                self.entries[run.run_id] = WatchedRun(run.run_id, run.opened_at + self.grace_s)

    def due(self, now: float, limit: int) -> list[WatchedRun]:
        self._sync()
        due = sorted((w for w in self.entries.values() if w.sweep_at <= now), key=_by_sweep_at)
        return due[:limit]

    def get(self, run_id: str) -> WatchedRun | None:
        self._sync()
        return self.entries.get(run_id)

    def record(self, run_id: str, execution: str) -> bool:
        watched = self.get(run_id)
        if watched is None:
            return False
        self.entries[run_id] = replace(watched, execution=execution)
        return True

    def check(
        self,
        run_id: str,
        sweep_at: float,
        *,
        repairs: int | None = None,
        forget_execution: bool = False,
    ) -> bool:
        watched = self.get(run_id)
        if watched is None:
            return False
        watched = replace(watched, sweep_at=sweep_at)
        if repairs is not None:
            watched = replace(watched, repairs=repairs)
        if forget_execution:
            watched = replace(watched, execution=None)
        self.entries[run_id] = watched
        return True

    def release(self, run_id: str, state: RunState, epoch: int) -> bool:
        self._sync()
        run = self.ledger.run(run_id)
        if run_id not in self.entries or (run.state, run.exhaustions) != (state, epoch):
            return False
        del self.entries[run_id]
        self.released[run_id] = (state, epoch)
        return True


def _by_sweep_at(watched: WatchedRun) -> tuple[float, str]:
    return watched.sweep_at, watched.run_id


@dataclass
class MemoryDrain:
    on: bool = False
    settled_at: float | None = None  # tests set it to model readers' caches

    def draining(self, fresh: bool = False) -> bool:
        return self.on

    def state(self) -> DrainState:
        return DrainState(self.on, self.settled_at)

    def set(self, draining: bool) -> None:
        self.on = draining


@dataclass
class MemoryRunning:
    """The register of running work (:class:`swarm.core.ports.RunningWork`) in memory."""

    entries: dict[str, tuple[dict[str, int], float]] = field(default_factory=dict)

    def enter(
        self, invocation: str, runs: Mapping[str, int], expires_at: float, now: float
    ) -> None:
        check_entry(invocation, runs)
        self.entries[invocation] = (dict(runs), expires_at)

    def leave(self, invocation: str) -> None:
        self.entries.pop(invocation, None)

    def running(self, now: float) -> RunningUnits:
        return tally((runs for runs, expires in self.entries.values() if expires > now))


@dataclass
class MemoryEvents:
    published: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def publish(self, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.published.append((detail_type, dict(detail)))


@dataclass
class MemoryMappings:
    enabled: dict[Lane, bool] = field(default_factory=lambda: dict.fromkeys(LANES, True))

    def set_enabled(self, enabled: bool) -> list[MappingState]:
        for lane in LANES:
            self.enabled[lane] = enabled
        return self.states()

    def states(self) -> list[MappingState]:
        return [
            MappingState(lane, f"esm-{lane.value}", "Enabled" if on else "Disabled")
            for lane, on in self.enabled.items()
        ]


@dataclass
class MemoryClosures:
    """The finalize loop's wait, in memory: the token kept per run, and every wake sent."""

    tokens: dict[str, str] = field(default_factory=dict)
    woken: list[tuple[str, str]] = field(default_factory=list)  # (run, token) handed back

    def wait(self, run_id: str, token: str, now: float) -> None:
        self.tokens[run_id] = token

    def notify(self, run_id: str) -> bool:
        token = self.tokens.pop(run_id, None)  # a task's token is handed back once
        if token is None:
            return False
        self.woken.append((run_id, token))
        return True
