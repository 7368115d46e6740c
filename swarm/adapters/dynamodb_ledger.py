"""The budget ledger on DynamoDB: the core's decisions (:mod:`swarm.core.ledger`), made atomic.

Every operation reads the records it needs, lets a pure ``decide_*`` function decide, and
writes the difference in one conditional write (:meth:`DynamoDBLedger._optimistic`), deciding
again from fresh records when a condition fails. Items (:mod:`swarm.adapters.dynamodb_items`),
conditions and their reasons: docs/explanation/ledger.md.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from swarm.adapters import dynamodb_items as items
from swarm.adapters.client_errors import client_error_type, error_code
from swarm.adapters.dynamodb import (
    CONDITIONAL_CHECK_FAILED,
    PARTITION_KEY,
    SORT_KEY,
    TRANSACTION_CANCELED,
    call,
    default_client,
)
from swarm.adapters.dynamodb_items import BOOKS, SPEC, Item, key
from swarm.adapters.dynamodb_watch import (
    DEFAULT_WATCH_GRACE_S,
    WATCH_NAMES,
    WATCH_SET,
    watch_values,
)
from swarm.contract import LEASE_EXPIRY, LEASES_INDEX, OPEN_TENANT, TENANT_RUNS_INDEX
from swarm.core.errors import Conflict, Contended, NotFound
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
from swarm.core.ports import ClaimedSettlement, LeaseKey, LeasesPage, TenantQueued, UnitsPage
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
from swarm.core.results import always
from swarm.core.tenancy import HOLD_WINDOW_S, MAX_HOLDS

MAX_TRIES = 64  # an operation re-decided this often is starved: report Conflict, don't spin
#: BatchWriteItem's UnprocessedItems: sent again up to this often, after base * 2**n seconds
#: (capped, full jitter)
MAX_UNPROCESSED_RETRIES = 10
UNPROCESSED_BASE_S = 0.05
UNPROCESSED_MAX_S = 5.0
#: a batched admission's units: with the books, one TransactWriteItems of at most 100 items
#: DynamoDB's limit on the items of one TransactWriteItems
MAX_TRANSACTION_ITEMS = TRANSACTION_ITEMS
MAX_BATCH_ADMISSIONS = MAX_TRANSACTION_ITEMS - 1
#: the (books, unit) views a client keeps for its next write to the same unit (a worker's claim
#: after its read): at most this many, the oldest dropped first
MAX_VIEWS = 256

T = TypeVar("T")


class _Retry(Exception):
    """The write's conditions no longer hold: decide again from fresh records."""

    def __init__(self, codes: list[str | None]) -> None:
        super().__init__(codes)
        self.codes = codes  # a transaction's cancellation reasons (one per item), or a single
        # Update's ConditionalCheckFailedException


class _Again:
    """Look again: read and decide once more (without backing off)."""


_AGAIN = _Again()


@dataclass(frozen=True)
class _Write(Generic[T]):
    """What a decision wants written: one conditional Update, or a transaction of several.

    ``then`` gives the operation's result once the write succeeded (or :data:`_AGAIN`);
    ``on_conflict`` may settle a failed write from its cancellation reasons (else the
    operation backs off and decides again).
    """

    items: list[Item]
    then: Callable[[], T | _Again]
    on_conflict: Callable[[list[str | None]], T | _Again] | None = None


def _held_meanwhile(tenant: str) -> Contended:
    """A hold refused: another submission of the tenant held after this decision's read."""
    return Contended(f"tenant {tenant!r}: another submission was decided meanwhile")


class DynamoDBLedger:
    """The Ledger port on one DynamoDB table (item layout: docs/explanation/ledger.md)."""

    def __init__(
        self,
        table_name: str,
        *,
        client: Any = None,
        client_factory: Any = None,
        rng: random.Random | None = None,
        watch_grace_s: float = DEFAULT_WATCH_GRACE_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.table_name = table_name
        #: a run (re)opened now is due for the sweeper this much later (swarm.adapters.
        #: dynamodb_watch): its execution is being started by the same request
        self.watch_grace_s = watch_grace_s
        self.requests = 0
        self._client = client
        self._client_factory = client_factory
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._specs: dict[str, RunSpec] = {}
        self._lock = threading.Lock()
        self._views: OrderedDict[tuple[str, str], tuple[RunRecord, UnitRecord]] = OrderedDict()
        self._holds: dict[str, tuple[int, dict[str, tuple[int, float]]]] = {}  # see _holds_key

    # ------------------------------------------------------------------ requests
    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = (self._client_factory or default_client)()
        return self._client

    def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.requests += 1
        return call(self.client, op, self._rng, **kwargs)

    def _get_many(self, keys: list[Item]) -> list[Item | None]:
        """Strongly consistent reads of up to 100 keys in one request (order kept)."""
        found: dict[tuple[str, str], Item] = {}
        pending: dict[str, Any] = {
            self.table_name: {"Keys": keys, "ConsistentRead": True},
        }
        while pending:
            page = self._call("batch_get_item", RequestItems=pending)
            for item in page.get("Responses", {}).get(self.table_name, []):
                found[(item[PARTITION_KEY]["S"], item[SORT_KEY]["S"])] = item
            pending = page.get("UnprocessedKeys") or {}
        return [found.get((k[PARTITION_KEY]["S"], k[SORT_KEY]["S"])) for k in keys]

    def _query(self, run_id: str, prefix: str) -> list[Item]:
        return list(self._pages(run_id, prefix))

    def _pages(self, run_id: str, prefix: str) -> Iterator[Item]:
        """The run's items under ``prefix`` (a strongly consistent Query), a page at a time:
        a reader that keeps only what it needs holds one page (1 MB) in memory, not the run."""
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {
                ":pk": items.string(items.run_pk(run_id)),
                ":prefix": items.string(prefix),
            },
            "ConsistentRead": True,
        }
        while True:
            page = self._call("query", **kwargs)
            yield from page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                return
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _write(self, writes: list[Item]) -> None:
        """One conditional Update (cheaper than a one-item transaction), or TransactWriteItems.

        A failed condition raises :class:`_Retry` with the reasons."""
        try:
            if len(writes) > 1:
                self._call("transact_write_items", TransactItems=writes)
            else:
                self._call("update_item", **writes[0]["Update"])
        except client_error_type() as e:
            code = error_code(e)
            if code == TRANSACTION_CANCELED:
                reasons = getattr(e, "response", {}).get("CancellationReasons", [])
                raise _Retry([r.get("Code") for r in reasons]) from None
            if code == CONDITIONAL_CHECK_FAILED:
                raise _Retry([CONDITIONAL_CHECK_FAILED]) from None
            raise

    def _optimistic(
        self,
        step: Callable[[], T | _Write[T] | _Again],
        conflict: str,
        *,
        tries: int = MAX_TRIES,
        backoff: bool = True,
    ) -> T:
        """Read, decide, write conditionally; on a failed condition, back off and do it again.

        ``step`` reads and decides: it returns the operation's result (nothing to write), a
        :class:`_Write`, or :data:`_AGAIN`. After ``tries`` rounds the operation is starved:
        :class:`Conflict` with the message ``conflict``.
        """
        for round_ in range(tries):
            outcome = step()
            if isinstance(outcome, _Again):
                continue
            if not isinstance(outcome, _Write):
                return outcome
            try:
                self._write(outcome.items)
            except _Retry as failed:
                if outcome.on_conflict is not None:
                    settled = outcome.on_conflict(failed.codes)
                    if not isinstance(settled, _Again):
                        return settled
                if backoff and round_ > 2:
                    time.sleep(min(0.05, 0.001 * round_) * self._rng.random())
                continue
            result = outcome.then()
            if not isinstance(result, _Again):
                return result
        raise Conflict(conflict)

    # ------------------------------------------------------------------ reads
    def _spec(self, run_id: str) -> RunSpec:
        """The run's immutable spec, read once per client."""
        spec = self._specs.get(run_id)
        if spec is not None:
            return spec
        (item,) = self._get_many([key(run_id, SPEC)])
        if item is None:
            raise NotFound(f"no run {run_id!r}")
        spec = items.spec_from(item)
        self._specs[run_id] = spec
        return spec

    def _run_from(self, books: Item) -> RunRecord:
        run = items.run_from(books, self._spec(items.run_id_of(books)))
        if not items.flag_of(books, "ready"):
            # being opened (a books item of an earlier version may say "open" before ready)
            run = run.with_(
                state=RunState.OPENING, units_written=items.whole_of(books, "units_written")
            )
        return run

    def _read_run_unit(self, run_id: str, unit_id: str) -> tuple[RunRecord, UnitRecord]:
        books, unit = self._get_many([key(run_id, BOOKS), key(run_id, items.unit_sk(unit_id))])
        if books is None or not items.flag_of(books, "ready"):
            raise NotFound(f"no run {run_id!r}")
        if unit is None:
            raise NotFound(f"run {run_id!r} has no unit {unit_id!r}")
        return self._run_from(books), items.unit_from(run_id, unit)

    # A view is what this client last read of a unit (with its run's books), kept for its claim:
    # the worker reads the unit, then claims it, and the claim decides on the view instead of
    # reading again. It is sound because a view may only lead to a conditional write, never to
    # an answer: the claim's write is conditional on the unit being exactly as viewed, and its
    # answer carries only the unit it wrote. A decision on a view that writes nothing is decided
    # again on a fresh read; a view is taken out when used, so a write that fails re-reads. The
    # settlement reads afresh: its answer carries the books as they stand after it.
    def _keep_view(self, run: RunRecord, unit: UnitRecord) -> None:
        with self._lock:
            self._views[(run.run_id, unit.unit_id)] = (run, unit)
            self._views.move_to_end((run.run_id, unit.unit_id))
            while len(self._views) > MAX_VIEWS:
                self._views.popitem(last=False)

    def _take_view(self, run_id: str, unit_id: str) -> tuple[RunRecord, UnitRecord] | None:
        with self._lock:
            return self._views.pop((run_id, unit_id), None)

    def run(self, run_id: str, opening: bool = False) -> RunRecord:
        (books,) = self._get_many([key(run_id, BOOKS)])
        if books is None or not (opening or items.flag_of(books, "ready")):
            raise NotFound(f"no run {run_id!r}")
        return self._run_from(books)

    def unit(self, run_id: str, unit_id: str) -> UnitRecord:
        run, unit = self._read_run_unit(run_id, unit_id)
        self._keep_view(run, unit)  # for the claim that follows (see _keep_view)
        return unit.with_(state=effective_state(run, unit))

    def _raw_units(self, run_id: str) -> list[UnitRecord]:
        """Every unit, in submission order: each unit item holds its index (``idx``); a run
        opened before that keeps its unit list in its spec item."""
        spec = self._spec(run_id)
        found = self._query(run_id, "unit#")
        if spec.units:
            order = {u.unit_id: i for i, u in enumerate(spec.units)}
            found.sort(key=lambda it: order.get(it["unit_id"]["S"], len(order)))
        else:
            found.sort(key=items.index_of)
        return [items.unit_from(run_id, it) for it in found]

    def units(self, run_id: str) -> list[UnitRecord]:
        run = self.run(run_id)
        return [u.with_(state=effective_state(run, u)) for u in self._raw_units(run_id)]

    def units_page(self, run_id: str, after: str | None, limit: int) -> UnitsPage:
        """One Query of up to ``limit`` unit items, in sort key (unit id) order."""
        run = self.run(run_id)
        pk = items.string(items.run_pk(run_id))
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": pk, ":prefix": items.string("unit#")},
            "ConsistentRead": True,
            "Limit": limit,
        }
        if after is not None:
            kwargs["ExclusiveStartKey"] = {
                PARTITION_KEY: pk,
                SORT_KEY: items.string(items.unit_sk(after)),
            }
        page = self._call("query", **kwargs)
        units = [items.unit_from(run_id, it) for it in page.get("Items", [])]
        more = "LastEvaluatedKey" in page and units
        return UnitsPage(
            [u.with_(state=effective_state(run, u)) for u in units],
            units[-1].unit_id if more else None,
        )

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Every settled attempt, in settlement order: kept in their units' items (and, for
        attempts settled before that, in items of their own)."""
        self.run(run_id)
        records = [items.attempt_from(run_id, it)[0] for it in self._query(run_id, "attempt#")]
        for item in self._query(run_id, "unit#"):
            records += [record for record, _ in items.attempts_of(run_id, item).values()]
        return sorted(records, key=lambda a: (a.settled_at, a.unit_id, a.attempt))

    def queued_units(self, tenant: str) -> int:
        """One Query of the sparse ``TenantRuns`` index (keys only: the tenant's watched runs,
        eventually consistent), then their books' ``outstanding``, strongly consistent, 100
        runs per read: the cost grows with the tenant's own open runs, nobody else's."""
        return sum(n or 0 for n in self._queued_by_run(tenant, []).values())

    def _queued_by_run(
        self,
        tenant: str,
        also: Sequence[str],
        progress: list[tuple[float, int]] | None = None,
    ) -> dict[str, int | None]:
        """Each of the tenant's open runs (the index's, and the runs ``also`` names) with its
        units not yet terminal: 0 for a closed run, None for a run whose books do not exist;
        ``progress`` gets each open run's (opened_at, units completed or dead-lettered)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": TENANT_RUNS_INDEX,
            "KeyConditionExpression": "#tenant = :tenant",
            "ExpressionAttributeNames": {"#tenant": OPEN_TENANT},
            "ExpressionAttributeValues": {":tenant": items.string(tenant)},
        }
        run_ids: dict[str, None] = {}  # in order, once each
        while True:
            page = self._call("query", **kwargs)
            run_ids.update((items.run_id_of(it), None) for it in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        run_ids.update((run_id, None) for run_id in also)
        ordered = list(run_ids)
        queued: dict[str, int | None] = {}
        for start in range(0, len(ordered), 100):
            batch = ordered[start : start + 100]
            for run_id, books in zip(
                batch, self._get_many([key(r, BOOKS) for r in batch]), strict=True
            ):
                if books is None:
                    queued[run_id] = None
                elif RunState(books["state"]["S"]).closed:
                    queued[run_id] = 0
                else:
                    queued[run_id] = items.whole_of(books, "outstanding")
                    opened_at = items.real_of(books, "opened_at")
                    if progress is not None and opened_at is not None:
                        drained = items.whole_of(books, "completed")
                        drained += items.whole_of(books, "dead_lettered")
                        progress.append((opened_at, drained))
        return queued

    # A tenant's holds: one item (``tenant#<tenant>`` / ``queue``) with a version and the runs
    # held in the last HOLD_WINDOW_S ({run id: {units, at}}). A hold is written on the version
    # the decision read, so two decisions on the same count cannot both pass; the holds read
    # for a version are kept for the hold that follows (sound: the write is conditional on it).
    @staticmethod
    def _holds_key(tenant: str) -> Item:
        return {PARTITION_KEY: items.string(f"tenant#{tenant}"), SORT_KEY: items.string("queue")}

    def _read_holds(self, tenant: str, now: float) -> tuple[int, dict[str, tuple[int, float]]]:
        (item,) = self._get_many([self._holds_key(tenant)])
        version = 0 if item is None else items.whole_of(item, "version")
        held: dict[str, tuple[int, float]] = {}
        for run_id, value in ({} if item is None else item.get("holds", {}).get("M", {})).items():
            units, at = int(value["M"]["units"]["N"]), float(value["M"]["at"]["N"])
            if at > now - HOLD_WINDOW_S:
                held[run_id] = (units, at)
        with self._lock:
            self._holds[tenant] = (version, held)
        return version, held

    def tenant_queue(self, tenant: str, now: float) -> TenantQueued:
        version, held = self._read_holds(tenant, now)
        progress: list[tuple[float, int]] = []
        queued = self._queued_by_run(tenant, list(held), progress)
        units = sum(held[r][0] if n is None and r in held else n or 0 for r, n in queued.items())
        return TenantQueued(units, version, tuple(progress))

    def hold_queue(self, tenant: str, version: int, run_id: str, units: int, now: float) -> None:
        with self._lock:
            read = self._holds.pop(tenant, None)
        current, held = read if read is not None and read[0] == version else (None, {})
        if current is None:
            current, held = self._read_holds(tenant, now)
        if current != version:
            raise _held_meanwhile(tenant)
        held = {r: h for r, h in held.items() if h[1] > now - HOLD_WINDOW_S}
        if len(held) >= MAX_HOLDS:
            raise Contended(f"tenant {tenant!r}: {MAX_HOLDS} submissions in the last minute")
        held[run_id] = (units, now)
        holds = {
            r: {"M": {"units": items.whole(n), "at": items.real(at)}} for r, (n, at) in held.items()
        }
        try:
            self._call(
                "update_item",
                TableName=self.table_name,
                Key=self._holds_key(tenant),
                UpdateExpression="SET #version = :next, #holds = :holds",
                ConditionExpression=(
                    "attribute_not_exists(#version)" if version == 0 else "#version = :version"
                ),
                ExpressionAttributeNames={"#version": "version", "#holds": "holds"},
                ExpressionAttributeValues={
                    ":next": items.whole(version + 1),
                    ":holds": {"M": holds},
                    **({} if version == 0 else {":version": items.whole(version)}),
                },
            )
        except client_error_type() as e:
            if error_code(e) == CONDITIONAL_CHECK_FAILED:
                raise _held_meanwhile(tenant) from None
            raise

    # ------------------------------------------------------------------ open
    def open_run(self, spec: RunSpec, now: float) -> RunRecord:
        """Create the books and every unit item in one call (tests, tools): :meth:`begin_open`
        then :meth:`open_units` to the end; idempotent for the same spec."""
        run = self.begin_open(spec, items.no_spec_key(spec.run_id), now)
        if run.state is RunState.OPENING:
            self.open_units(spec, 0, spec.units_total, now)
        return self.run(spec.run_id)

    def begin_open(self, spec: RunSpec, spec_key: str, now: float) -> RunRecord:
        """The spec item (run-level fields, totals, digest, ``spec_key``) and the books
        (``opening``, watched by the sweeper from ``now`` plus the grace) in one transaction:
        two writes whatever the batch size. Idempotent for the same spec (its run as it stands,
        opening or open), Conflict for another."""
        run, _ = fresh_records(spec.summary, now)

        opening = run.with_(spec=spec.summary, state=RunState.OPENING, units_written=0)

        def created() -> RunRecord:
            self._specs[spec.run_id] = spec.summary
            return opening

        def step() -> RunRecord | _Write[RunRecord]:
            existing, spec_item = self._get_many([key(spec.run_id, BOOKS), key(spec.run_id, SPEC)])
            if existing is not None and spec_item is not None:
                stored = items.spec_from(spec_item)
                if stored != spec:
                    raise Conflict(f"run {spec.run_id!r} exists with a different spec")
                self._specs[spec.run_id] = stored
                return self._run_from(existing)
            books = items.books_item(opening, ready=False)
            books["units_written"] = items.whole(0)
            books.update(items.watch_attributes(now + self.watch_grace_s, spec.tenant))
            puts = [items.spec_item(spec, spec_key), books]
            return _Write([items.put_new(self.table_name, p) for p in puts], created)

        conflict = f"run {spec.run_id!r} is being opened by another caller; retry"
        return self._optimistic(step, conflict, tries=3, backoff=False)

    def open_units(
        self,
        spec: RunSpec,
        cursor: int,
        limit: int,
        now: float,
        keep_going: Callable[[], bool] = lambda: True,
    ) -> int:
        """Write the unit items ``spec.units[cursor:cursor + limit]`` (25 per BatchWriteItem,
        UnprocessedItems retried with exponential backoff and full jitter) while
        ``keep_going()``; the run becomes ready (and watched as open) once the last is written.
        Returns the next cursor: ``spec.units_total`` when the run is open. Idempotent from
        any cursor: units cannot change before the run is ready (admission requires it), so
        rewriting one writes the same item; a ready run is left alone."""
        (books,) = self._get_many([key(spec.run_id, BOOKS)])
        if books is None:
            raise NotFound(f"no run {spec.run_id!r}")
        if items.flag_of(books, "ready"):
            return spec.units_total
        if len(spec.units) != spec.units_total:
            raise ValueError("open_units needs the spec's unit list")
        stop = min(spec.units_total, cursor + limit)
        while cursor < stop and keep_going():
            page = spec.units[cursor : min(stop, cursor + 25)]
            requests = [
                {
                    "PutRequest": {
                        "Item": items.unit_item(
                            UnitRecord(
                                spec.run_id,
                                u.unit_id,
                                u.projected_tokens,
                                projected_micro=u.projected_micro,
                            ),
                            cursor + i,
                        )
                    }
                }
                for i, u in enumerate(page)
            ]
            self._batch_write(requests)
            cursor += len(page)
        if cursor < spec.units_total:
            self._call(
                "update_item",
                TableName=self.table_name,
                Key=key(spec.run_id, BOOKS),
                UpdateExpression="SET units_written = :n",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues={":n": items.whole(cursor)},
            )
            return cursor
        # ready, and watched by the sweeper until its closure is announced (the watch attributes
        # are written here and by begin_open, not by the hot paths: see docs/explanation/ledger.md)
        self._call(
            "update_item",
            TableName=self.table_name,
            Key=key(spec.run_id, BOOKS),
            UpdateExpression=f"SET ready = :true, #state = :open, {WATCH_SET} REMOVE units_written",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames={**WATCH_NAMES, "#state": "state"},
            ExpressionAttributeValues={
                ":true": items.flag(True),
                ":open": items.string(RunState.OPEN.value),
                **watch_values(now + self.watch_grace_s, spec.tenant),
            },
        )
        return cursor

    def _batch_write(self, requests: list[Item]) -> None:
        """One BatchWriteItem of up to 25 puts, its UnprocessedItems sent again after an
        exponential backoff with full jitter (the SDK's retries do not cover them)."""
        pending: dict[str, Any] = {self.table_name: requests}
        for retry in range(MAX_UNPROCESSED_RETRIES + 1):
            page = self._call("batch_write_item", RequestItems=pending)
            pending = page.get("UnprocessedItems") or {}
            if not pending:
                return
            if retry < MAX_UNPROCESSED_RETRIES:
                delay = min(UNPROCESSED_MAX_S, UNPROCESSED_BASE_S * 2**retry)
                self._sleep(delay * self._rng.random())
        raise Conflict(
            f"DynamoDB left {len(pending.get(self.table_name, []))} unit items unprocessed "
            f"{MAX_UNPROCESSED_RETRIES + 1} times (throttled): retry the open"
        )

    # ------------------------------------------------------------------ admission
    def admit(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        by_scan: bool = False,
    ) -> Admission:
        def step() -> Admission | _Write[Admission]:
            run, unit = self._read_run_unit(run_id, unit_id)
            new_run, new_unit, admission = decide_admission(
                run, unit, attempt, now, lease_s, by_scan
            )
            if new_run == run and new_unit == unit:
                return admission  # nothing to write: already admitted, terminal, closed, ...
            projected = unit.projected_in(run.spec.usd)  # the budget's unit
            if admission.admitted:
                extra = [("available", ">=", projected)]
            elif run.state is RunState.OPEN:
                # exhaustion begins: the remainder is every unit pending *now*, so the counts
                # this decision read must still hold
                extra = [
                    ("available", "<", projected),
                    ("in_flight", "=", run.in_flight),
                    ("outstanding", "=", run.outstanding),
                ]
            else:
                extra = [("available", "<", projected)]
            writes = [items.run_update(self.table_name, run, new_run, extra)]
            if new_unit != unit:
                writes.append(items.unit_update(self.table_name, unit, new_unit))
            return _Write(writes, lambda: admission)

        return self._optimistic(
            step, f"admission of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    def admit_many(
        self,
        run_id: str,
        unit_ids: Sequence[str],
        now: float,
        lease_s: float = DEFAULT_LEASE_S,
        by_scan: bool = False,
    ) -> list[Admission]:
        """Up to :data:`MAX_BATCH_ADMISSIONS` units at a time: one BatchGetItem of the books and
        the units, :func:`decide_admission` for each in turn on the run as it would stand, and
        one TransactWriteItems of the books (by deltas, on condition that ``available`` still
        covers every reservation it adds: what :meth:`admit` asks of one) and each unit written
        (on condition that it is as read). A decision :meth:`admit` writes with conditions of
        its own (the refusal that starts exhaustion, a drain retry the budget no longer
        covers), a Conflict, a unit not found, and a batch whose transaction was cancelled (a
        concurrent write) go to :meth:`admit`, one unit, and the batching resumes after it."""
        admissions: list[Admission] = []
        pending = list(unit_ids)
        while pending:
            batch = pending[:MAX_BATCH_ADMISSIONS]
            decided = self._admit_batch(run_id, batch, now, lease_s, by_scan)
            if not decided:
                attempt = self._read_run_unit(run_id, pending[0])[1].next_attempt
                decided = [self.admit(run_id, pending[0], attempt, now, lease_s, by_scan)]
            admissions.extend(decided)
            pending = pending[len(decided) :]
        return admissions

    def _admit_batch(
        self, run_id: str, unit_ids: Sequence[str], now: float, lease_s: float, by_scan: bool
    ) -> list[Admission]:
        """The admissions of the longest prefix of ``unit_ids`` that one transaction can
        write (none: the first unit goes to :meth:`admit`)."""
        found = self._get_many(
            [key(run_id, BOOKS), *(key(run_id, items.unit_sk(u)) for u in unit_ids)]
        )
        books = found[0]
        if books is None or not items.flag_of(books, "ready"):
            raise NotFound(f"no run {run_id!r}")
        read = run = self._run_from(books)
        decided: list[Admission] = []
        writes: list[Item] = []
        reserving = 0
        for item in found[1:]:
            if item is None:
                break  # admit() says NotFound for it
            unit = items.unit_from(run_id, item)
            try:
                new_run, new_unit, admission = decide_admission(
                    run, unit, unit.next_attempt, now, lease_s, by_scan
                )
            except Conflict:
                break
            if new_run == run and new_unit == unit:
                decided.append(admission)  # nothing to write: already admitted, terminal, ...
                continue
            if not admission.admitted:
                break  # a refusal that writes has conditions of its own: admit() writes it
            writes.append(items.unit_update(self.table_name, unit, new_unit))
            reserving += unit.projected_in(run.spec.usd)
            run = new_run
            decided.append(admission)
        if writes:
            extra = [("available", ">=", reserving)]
            try:
                self._write([items.run_update(self.table_name, read, run, extra), *writes])
            except _Retry:
                return []  # a concurrent write: one by one for the first, then batch again
        return decided

    # ------------------------------------------------------------------ settlement
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
        settlement = self._settle(
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
        assert settlement is not None  # only a reclaim (``expect``) can give up
        return settlement

    # ------------------------------------------------------------------ agent loops
    def settle_turn(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        turn: int,
        tokens: int,
        now: float,
        events: Sequence[tuple[int, Mapping[str, Any]]] = (),
        known: UnitRecord | None = None,
        priced: Priced | None = None,
    ) -> TurnSettlement:
        """With ``known`` (the unit as this worker's last write left it), nearly always ONE
        TransactWriteItems and no read: the turn decided on it and a stand-in of the books
        (open: a turn's deltas do not depend on the books), written on the unit exactly as known
        and the books still open; if that fails, or without ``known``:
        a strongly consistent read of the books and the unit, then ONE TransactWriteItems:
        the unit (as read: its turns, its reservation), the books by deltas (on the state and
        exhaustion epoch read: a run that stopped being open meanwhile cancels it, and the turn
        is decided again on the state read then, so the answer carries the state the write
        held), and each log event (only if its seq is free). Cancelled on a log event only:
        Contended, nothing written; on the unit: decided again from a fresh read (a duplicate
        answers ``settled`` False)."""
        log = log_key(run_id, unit_id)
        encoded = encode_events(log, events, MAX_TURN_EVENTS)

        def on_conflict(codes: list[str | None]) -> TurnSettlement | _Again:
            if codes and codes[0] == "ConditionalCheckFailed":
                return _AGAIN  # the unit moved: decide again (a duplicate, perhaps)
            if any(code == "ConditionalCheckFailed" for code in codes[2:]):
                raise Contended(
                    f"the log of unit {unit_id} (run {run_id}) holds one of events "
                    f"{[seq for seq, _ in encoded]} already: another worker moved it"
                )
            return _AGAIN  # the books moved (the run's state) or a conflict: decide again

        if known is not None and known.turns == turn - 1:
            stand_in = RunRecord(self._spec(run_id))  # open, nothing reserved but this unit's
            held = known.reservation.held if known.reservation is not None else 0
            stand_in = stand_in.with_(reserved=held, in_flight=1)
            try:
                after, new_unit, settled = decide_turn(
                    stand_in, known, attempt, turn, tokens, now, tool_calls_in(events), priced
                )
            except Conflict:
                settled = None
            if settled is not None and settled.settled:
                writes = [
                    items.unit_update(self.table_name, known, new_unit),
                    items.run_update(self.table_name, stand_in, after, any_epoch=True),
                    *(items.log_put(self.table_name, log, seq, text) for seq, text in encoded),
                ]
                try:
                    self._write(writes)
                    return settled
                except _Retry as e:
                    on_conflict(e.codes)  # a log event's seq taken: Contended; else read

        def step() -> TurnSettlement | _Write[TurnSettlement]:
            run, unit = self._read_run_unit(run_id, unit_id)
            new_run, new_unit, settled = decide_turn(
                run, unit, attempt, turn, tokens, now, tool_calls_in(events), priced
            )
            if not settled.settled:
                return TurnSettlement(
                    False, run.state, unit.with_(state=effective_state(run, unit))
                )
            writes = [
                items.unit_update(self.table_name, unit, new_unit),
                items.run_update(self.table_name, run, new_run),
                *(items.log_put(self.table_name, log, seq, text) for seq, text in encoded),
            ]
            return _Write(writes, lambda: settled, on_conflict)

        return self._optimistic(
            step, f"turn {turn} of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    def pause(self, run_id: str, unit_id: str, attempt: int, now: float) -> RunRecord:
        """A read, then one transaction of the books and the unit (``decide_pause``), each as
        read; nothing when the unit no longer holds the attempt's reservation."""

        def step() -> RunRecord | _Write[RunRecord]:
            run, unit = self._read_run_unit(run_id, unit_id)
            new_run, new_unit = decide_pause(run, unit, attempt, now)
            if new_unit == unit:
                return run
            writes = [
                items.run_update(self.table_name, run, new_run),
                items.unit_update(self.table_name, unit, new_unit),
            ]
            return _Write(writes, lambda: new_run)

        return self._optimistic(
            step, f"pause of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    def park(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        until: float,
        events: Sequence[tuple[int, Mapping[str, Any]]] = (),
    ) -> RunRecord:
        """A read, then ONE TransactWriteItems: the unit and the books as read
        (``decide_park``) and each event only if its seq is free (taken: Contended).

        A park leaves ``outstanding`` as it is, so :func:`items.run_update`'s conditions on it
        do not order two parks; on an exhausting run, whose closure waits for the last unit in
        flight, the write is conditioned on the in-flight count read (two parks deciding on
        the same count would each leave one in flight, and neither would close the run)."""
        log = log_key(run_id, unit_id)
        encoded = encode_events(log, events, MAX_TURN_EVENTS)

        def step() -> RunRecord | _Write[RunRecord]:
            run, unit = self._read_run_unit(run_id, unit_id)
            new_run, new_unit = decide_park(run, unit, attempt, now, until)
            if new_unit == unit:
                return run
            exhausting = run.state is RunState.EXHAUSTING
            extra = [("in_flight", "=", run.in_flight)] if exhausting else []
            writes = [
                items.unit_update(self.table_name, unit, new_unit),
                items.run_update(self.table_name, run, new_run, extra),
                *(items.log_put(self.table_name, log, seq, text) for seq, text in encoded),
            ]
            return _Write(writes, lambda: new_run, self._log_conflict(run_id, unit_id, encoded))

        return self._optimistic(
            step, f"park of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    def unpark(
        self,
        run_id: str,
        unit_id: str,
        now: float,
        lease_s: float,
        events: Sequence[tuple[int, Mapping[str, Any]]],
    ) -> tuple[RunRecord, UnitRecord, bool]:
        """A read, then ONE TransactWriteItems: the unit and the books as read
        (``decide_unpark``) and each event only if its seq is free (taken: Contended)."""
        log = log_key(run_id, unit_id)
        encoded = encode_events(log, events, MAX_TURN_EVENTS)

        def step() -> (
            tuple[RunRecord, UnitRecord, bool] | _Write[tuple[RunRecord, UnitRecord, bool]]
        ):
            run, unit = self._read_run_unit(run_id, unit_id)
            new_run, new_unit, queued = decide_unpark(run, unit, now, lease_s)
            writes = [
                items.unit_update(self.table_name, unit, new_unit),
                items.run_update(self.table_name, run, new_run),
                *(items.log_put(self.table_name, log, seq, text) for seq, text in encoded),
            ]
            shown = new_unit.with_(state=effective_state(new_run, new_unit))
            answer = (new_run, shown, queued)
            return _Write(writes, lambda: answer, self._log_conflict(run_id, unit_id, encoded))

        return self._optimistic(
            step, f"unpark of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    @staticmethod
    def _log_conflict(
        run_id: str, unit_id: str, encoded: Sequence[tuple[int, str]]
    ) -> Callable[[list[str | None]], Any]:
        """A transaction of the unit, the books and log events cancelled on an event: another
        writer moved the log (Contended); on the unit or the books: decide again."""

        def on_conflict(codes: list[str | None]) -> Any:
            if any(code == "ConditionalCheckFailed" for code in codes[2:]):
                raise Contended(
                    f"the log of unit {unit_id} (run {run_id}) holds one of events "
                    f"{[seq for seq, _ in encoded]} already: another writer moved it"
                )
            return _AGAIN

        return on_conflict

    def read_log(self, run_id: str, unit_id: str) -> list[dict[str, Any]]:
        """A strongly consistent Query of the log's partition, a page at a time, in seq order."""
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": {":pk": items.string(log_key(run_id, unit_id))},
            "ConsistentRead": True,
        }
        events: list[dict[str, Any]] = []
        while True:
            page = self._call("query", **kwargs)
            events += [json.loads(it[items.EVENT]["S"]) for it in page.get("Items", [])]
            if "LastEvaluatedKey" not in page:
                return events
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def append_log(
        self, run_id: str, unit_id: str, seq: int, events: Sequence[Mapping[str, Any]]
    ) -> None:
        """One conditional UpdateItem for one event, one TransactWriteItems for several (all or
        nothing); a seq taken: Contended."""
        log = log_key(run_id, unit_id)
        encoded = encode_events(log, numbered(seq, events), TRANSACTION_ITEMS)
        if not encoded:
            return
        writes = [items.log_put(self.table_name, log, n, text) for n, text in encoded]
        try:
            self._write(writes)
        except _Retry as failed:
            raise Contended(
                f"the log of unit {unit_id} (run {run_id}) holds an event at "
                f"{seq}..{seq + len(encoded) - 1} already: another worker moved it "
                f"({failed.codes})"
            ) from None

    def _duplicate(self, run_id: str, unit_id: str, attempt: int) -> Settlement | None:
        """The settlement of ``attempt`` if it was settled already (a duplicate), else None."""
        keys = [key(run_id, BOOKS), key(run_id, items.unit_sk(unit_id))]
        keys.append(key(run_id, items.attempt_sk(unit_id, attempt)))  # kept apart, before
        books, unit_item, legacy = self._get_many(keys)
        if books is None or not items.flag_of(books, "ready"):
            raise NotFound(f"no run {run_id!r}")
        if unit_item is None:
            raise NotFound(f"run {run_id!r} has no unit {unit_id!r}")
        kept = items.attempts_of(run_id, unit_item).get(attempt)
        if kept is None and legacy is not None:
            kept = items.attempt_from(run_id, legacy)
        if kept is None:
            return None
        record, fate = kept
        run, unit = self._run_from(books), items.unit_from(run_id, unit_item)
        return Settlement(fate, True, run, unit.with_(state=effective_state(run, unit)), record)

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
        expect: Reservation | None = None,
        key: str | None = None,
        retry: bool = True,
        priced: Priced | None = None,
    ) -> Settlement | None:
        """Settle once. With ``expect`` (a reclaim), only that exact reservation is settled:
        None if it changed meanwhile (e.g. the worker unclaimed it with a fresh lease).
        ``key``: where the attempt's outcome is kept. ``reclaimed``: settled as lost, billed
        its projection (``lost_bill``: ``tokens`` and ``priced`` are not used)."""

        def duplicate(codes: list[str | None]) -> Settlement | _Again:
            # the unit's update (the first item) failed: settled already?
            found = None
            if codes and codes[0] == "ConditionalCheckFailed":
                found = self._duplicate(run_id, unit_id, attempt)
            return _AGAIN if found is None else found

        def step() -> Settlement | _Write[Settlement | None] | None:
            # never from a view (see _keep_view): the answer carries the books after it
            run, unit = self._read_run_unit(run_id, unit_id)
            reservation = unit.reservation
            if (
                unit.state is not UnitState.IN_FLIGHT
                or reservation is None
                or reservation.attempt != attempt
            ):
                found = self._duplicate(run_id, unit_id, attempt)
                if found is not None:
                    return found
            if expect is not None and reservation != expect:
                return None
            billed, money = lost_bill(run, unit) if reclaimed else (tokens, priced)
            new_run, new_unit, settlement = decide_settlement(
                run,
                unit,
                attempt,
                billed,
                succeeded,
                now,
                reclaimed=reclaimed,
                outcome_key=key,
                retry=retry,
                priced=money,
            )
            settled = (settlement.attempt, settlement.fate)
            writes = [
                items.unit_update(self.table_name, unit, new_unit, settled),
                items.run_update(self.table_name, run, new_run),
            ]
            return _Write(writes, lambda: settlement, duplicate)

        return self._optimistic(
            step, f"settlement of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

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
        one = ClaimedSettlement(
            claimed, attempt, tokens, succeeded, now, outcome_key, retry, priced
        )
        return self.settle_claimed_many([one])[0]

    def settle_claimed_many(self, settlements: Sequence[ClaimedSettlement]) -> list[Fate | None]:
        """One transaction: each unit exactly as claimed, with the attempt it settles, and each
        run's books once, by the sum of their deltas, on an open run whose outstanding units
        outnumber the ones this write ends (the write that closes a run is settle()'s). All or
        nothing: if any condition fails, nothing is written and every fate is None."""
        fates: list[Fate | None] = [None] * len(settlements)
        units: list[Item] = []
        books: dict[str, list[tuple[RunRecord, RunRecord]]] = {}
        seen: set[tuple[str, str]] = set()
        for i, s in enumerate(settlements):
            run_id, unit_id = s.claimed.run_id, s.claimed.unit_id
            runs = books.get(run_id, [])
            items_then = len(units) + 1 + len(books) + (not runs)  # with its run's books
            if (run_id, unit_id) in seen or items_then > MAX_TRANSACTION_ITEMS:
                continue  # one write per item, and a transaction's limit: left to settle alone
            spec = self._spec(run_id)  # immutable, read once per client
            decided = decide_claimed_settlement(
                spec,
                s.claimed,
                s.attempt,
                s.tokens,
                s.succeeded,
                s.now,
                s.outcome_key,
                s.retry,
                s.priced,
            )
            if decided is None:
                continue
            stand_in, after, unit, settlement = decided
            seen.add((run_id, unit_id))
            units.append(
                items.unit_update(
                    self.table_name, s.claimed, unit, (settlement.attempt, settlement.fate)
                )
            )
            books[run_id] = [*runs, (stand_in, after)]
            fates[i] = settlement.fate
        if not units:
            return fates
        writes = units + [
            items.run_update(self.table_name, *_together(pairs), any_epoch=True)
            for pairs in books.values()
        ]
        try:
            self._write(writes)
        except _Retry:
            return [None] * len(settlements)
        return fates

    # ------------------------------------------------------------------ top-up
    def top_up(self, run_id: str, amount: int, now: float, max_budget: int | None = None) -> TopUp:
        def step() -> TopUp | _Write[TopUp]:  # always a write (the union lets mypy infer T)
            before = self.run(run_id)
            run = decide_top_up(before, amount, now, max_budget)
            requeue: tuple[str, ...] = ()
            if before.state is not RunState.OPEN:
                # read after the books: a unit joins or leaves the remainder only with a write
                # to the books' remainder, which the condition below would then see
                requeue = tuple(
                    u.unit_id
                    for u in self._raw_units(run_id)
                    if effective_state(before, u) is UnitState.REMAINDER
                )
            # a closed run's closure was announced and the sweeper stopped watching it: reopened,
            # it needs a finalizer again (see docs/explanation/ledger.md)
            rewatch = now + self.watch_grace_s if before.state.closed else None
            update = items.run_update(
                self.table_name,
                before,
                run,
                # the budget as read: two concurrent top-ups cannot both pass the ceiling
                [("remainder", "=", before.remainder), ("budget", "=", before.budget)],
                watch_from=rewatch,
            )
            top_up = TopUp(run, requeue if run.state is RunState.OPEN else ())
            return _Write([update], lambda: top_up)

        return self._optimistic(step, f"top-up of run {run_id} kept colliding; retry")

    # ------------------------------------------------------------------ claims and leases
    def claim(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float,
        loop: bool = False,
    ) -> Claim:
        def step() -> Claim | _Write[Claim] | _Again:
            view = self._take_view(run_id, unit_id)
            run, unit = view or self._read_run_unit(run_id, unit_id)
            # a loop's stale claim is taken over conditional on the exact reservation read
            new_unit, claim = decide_claim(run, unit, attempt, now, lease_s, loop)
            if new_unit == unit:
                return claim if view is None else _AGAIN  # never an answer from a view
            write = items.unit_update(self.table_name, unit, new_unit)
            return _Write([write], lambda: claim)

        return self._optimistic(
            step, f"claim of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    def claim_queued(
        self,
        run_id: str,
        unit_id: str,
        attempt: int,
        now: float,
        lease_s: float,
        loop: bool = False,
    ) -> Claim | None:
        update = items.queued_claim(self.table_name, run_id, unit_id, attempt, now + lease_s, loop)
        try:
            written = self._call("update_item", **update["Update"], ReturnValues="ALL_NEW")
        except client_error_type() as e:
            if error_code(e) == CONDITIONAL_CHECK_FAILED:
                return None  # not waiting for this attempt (or no such unit): read and decide
            raise
        unit = items.unit_from(run_id, written["Attributes"])
        return Claim(True, "claimed", unit)

    def unclaim(self, run_id: str, unit_id: str, attempt: int, now: float, lease_s: float) -> bool:
        def step() -> bool | _Write[bool]:
            _, unit = self._read_run_unit(run_id, unit_id)
            new_unit, done = decide_unclaim(unit, attempt, now, lease_s)
            if not done:
                return False
            return _Write([items.unit_update(self.table_name, unit, new_unit)], lambda: True)

        return self._optimistic(
            step, f"unclaim of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    def _release_write(
        self, run: RunRecord, unit: UnitRecord, now: float, then: Callable[[], T | _Again]
    ) -> _Write[T]:
        """Give back the unit's unclaimed reservation (``decide_release``)."""
        new_run, new_unit = decide_release(run, unit, now)
        writes = [
            items.run_update(self.table_name, run, new_run),
            items.unit_update(self.table_name, unit, new_unit),
        ]
        return _Write(writes, then)

    def _settle_lost(
        self, run_id: str, unit_id: str, res: Reservation, now: float
    ) -> Settlement | None:
        """Settle the claimed attempt holding ``res`` as failed, charging its projection (its
        tokens, and its cost at the submit's prices: ``lost_bill``); None if that reservation
        changed meanwhile."""
        return self._settle(
            run_id, unit_id, res.attempt, res.projected, False, now, reclaimed=True, expect=res
        )

    def reclaim_unit(self, run_id: str, unit_id: str, now: float) -> Settlement | None:
        """Settle a claimed attempt whose lease expired as lost (its projected tokens charged),
        or release an expired unclaimed reservation. None unless this call settled a lost
        attempt (another caller, or the worker itself, may have settled it first)."""

        def step() -> Settlement | _Write[Settlement | None] | _Again | None:
            run, unit = self._read_run_unit(run_id, unit_id)
            res = unit.reservation
            if res is None or res.lease_expires > now or unit.state is not UnitState.IN_FLIGHT:
                return None  # a parked unit's lease is its approvals' timeout (the finalizer's)
            if not res.claimed or res.loop:
                # released on this read (a loop's attempt is never lost: its log tells what
                # its worker did); if it changed meanwhile, look again
                return self._release_write(run, unit, now, lambda: None)
            s = self._settle_lost(run_id, unit_id, res, now)
            if s is None:
                return _AGAIN  # the reservation changed before we could settle it: look again
            return None if s.duplicate else s

        return self._optimistic(
            step, f"reclaim of unit {unit_id} (run {run_id}) kept colliding; retry"
        )

    def expired_leases(self, run_id: str, now: float) -> list[str]:
        """The units whose lease expired by ``now``, the oldest expiry first (ties by unit id),
        from the ``Leases`` index: a Query of the run's expired entries only (keys only, a page
        at a time), not of every unit.

        The index is eventually consistent: a lease renewed or ended just now may still be
        listed (the caller re-reads the unit before acting: :meth:`reclaim_unit`), and one that
        expired just now may be missing (the next poll finds it).
        """
        self.run(run_id)  # NotFound for an unknown run
        return self._expired_leases(run_id, now)

    def _expired_leases(self, run_id: str, now: float) -> list[str]:
        kwargs = self._leases_query(run_id, now)
        found: list[LeaseKey] = []
        while True:
            page = self._call("query", **kwargs)
            found += _lease_keys(page)
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return [key.unit_id for key in sorted(found)]  # the oldest expiry first

    def _leases_query(self, run_id: str, until: float) -> dict[str, Any]:
        """A keys-only Query of the run's entries of the ``Leases`` index that end by ``until``."""
        return {
            "TableName": self.table_name,
            "IndexName": LEASES_INDEX,
            "KeyConditionExpression": "#pk = :pk AND #lease <= :until",
            "ExpressionAttributeNames": {"#pk": PARTITION_KEY, "#lease": LEASE_EXPIRY},
            "ExpressionAttributeValues": {
                ":pk": items.string(items.run_pk(run_id)),
                ":until": items.real(until),
            },
        }

    def leases_page(
        self, run_id: str, until: float, after: LeaseKey | None, limit: int
    ) -> LeasesPage:
        """One keys-only Query of the ``Leases`` index (``Limit``: ``limit``), starting after
        the entry ``after`` (``ExclusiveStartKey``: the index's keys and the table's, so a page
        goes on exactly after its last entry, whatever order the index gives units of the same
        lease: DynamoDB promises none)."""
        self.run(run_id)  # NotFound for an unknown run
        kwargs = {**self._leases_query(run_id, until), "Limit": limit}
        if after is not None:
            kwargs["ExclusiveStartKey"] = {
                PARTITION_KEY: items.string(items.run_pk(run_id)),
                SORT_KEY: items.string(items.unit_sk(after.unit_id)),
                LEASE_EXPIRY: items.real(after.lease),
            }
        page = self._call("query", **kwargs)
        return LeasesPage(_lease_keys(page), "LastEvaluatedKey" in page)

    def reclaim_expired(
        self, run_id: str, now: float, keep_going: Callable[[], bool] = always
    ) -> list[Settlement]:
        """Reclaim every expired lease of the run: one Query of the ``Leases`` index (only the
        expired entries), then, per expired unit, a strongly consistent read and a conditional
        write (:meth:`reclaim_unit` decides from the fresh records: a lease renewed after the
        index was read is left alone).

        Once the run's scan horizon passed, every unit is read too (a strongly consistent Query,
        a page at a time: ``scan_leases``), and when every expired unit it found is decided, the
        horizon moves to the latest lease still waiting that the index does not hold, unless an
        admission moved it meanwhile. Cut short by ``keep_going()`` (after one unit at least, so
        that every call makes progress), the horizon stays, and the next call reads the run
        again and goes on where this one stopped (the units it decided are no longer expired).
        An expired unclaimed reservation is released on the read that found it: a read and a
        transaction.

        Attempts settled meanwhile (by their worker or another reclaimer) are skipped: each
        attempt is counted once, by whoever settles it first.
        """
        run = self.run(run_id)
        expired = self._expired_leases(run_id, now)
        scan_at = run.scan_at if run.scan_at is not None and run.scan_at <= now else None
        horizon = None
        if scan_at is not None:
            units = (items.unit_from(run_id, it) for it in self._pages(run_id, "unit#"))
            found, horizon = scan_leases(units, now)
            expired = list(dict.fromkeys([*expired, *found]))
        lost, whole = reclaim_in_turn(
            expired, lambda unit_id: self.reclaim_unit(run_id, unit_id, now), keep_going
        )
        if whole and scan_at is not None:
            with contextlib.suppress(_Retry):  # an admission moved it: the next scan is its
                self._write([items.scan_update(self.table_name, run_id, scan_at, horizon)])
        return lost

    def dead_letter(self, run_id: str, unit_id: str, now: float) -> UnitRecord:
        """End a unit the queue gave up on; a claimed attempt is settled as lost first."""

        def step() -> UnitRecord | _Write[UnitRecord] | _Again:
            run, unit = self._read_run_unit(run_id, unit_id)
            res = unit.reservation
            if res is not None:
                # look again at the unit, once without its reservation
                if res.claimed and not res.loop:
                    self._settle_lost(run_id, unit_id, res, now)
                    return _AGAIN
                return self._release_write(run, unit, now, lambda: _AGAIN)
            if unit.state is UnitState.PENDING:
                new_run, new_unit = decide_dead_letter(run, unit, now)
                writes = [
                    items.run_update(self.table_name, run, new_run),
                    items.unit_update(self.table_name, unit, new_unit),
                ]
                return _Write(writes, lambda: self.unit(run_id, unit_id))
            return self.unit(run_id, unit_id)

        return self._optimistic(
            step, f"dead-lettering unit {unit_id} (run {run_id}) kept colliding; retry"
        )


def _together(pairs: Sequence[tuple[RunRecord, RunRecord]]) -> tuple[RunRecord, RunRecord]:
    """Several settlements' stand-ins of one run's books and their afters
    (``decide_claimed_settlement``) as one: the stand-ins' counters summed, and the sum of the
    changes added to them, so the write changes the books by every delta and requires as many
    outstanding units as they end, plus one."""
    first = pairs[0][0]
    names = [c for c in items.COUNTERS if c != "budget"]  # the budget is the run's, not summed
    old = first.with_(**{c: sum(getattr(b, c) for b, _ in pairs) for c in names})
    new = old.with_(
        **{c: getattr(old, c) + sum(getattr(a, c) - getattr(b, c) for b, a in pairs) for c in names}
    )
    return old, new


def _lease_keys(page: Mapping[str, Any]) -> list[LeaseKey]:
    """The unit entries of a page of the ``Leases`` index, in its order (only units carry a
    lease)."""
    prefix = items.unit_sk("")
    return [
        LeaseKey(float(item[LEASE_EXPIRY]["N"]), item[SORT_KEY]["S"][len(prefix) :])
        for item in page.get("Items", [])
        if item[SORT_KEY]["S"].startswith(prefix)
    ]
