"""The budget ledger on DynamoDB: the same decisions as the in-memory ledger, made atomic.

Every operation reads the records it needs (one strongly consistent ``BatchGetItem``), lets the
core's pure functions (:func:`decide_admission`, :func:`decide_settlement`,
:func:`decide_top_up`) decide, and writes the *difference* in one conditional write or one
``TransactWriteItems``. The conditions re-check, at write time, exactly the facts the decision
relied on; if another worker changed one of them, the write fails and the operation is decided
again from fresh records. Nothing is ever half-written.

Hot path without version contention: counters change with ``ADD`` (deltas), so concurrent
admissions and settlements of one run do not conflict with each other. DynamoDB conditions can
compare an attribute only with a constant, so the books keep two derived attributes, maintained
atomically in the same writes:

* ``available = budget - spent - reserved``: admission requires ``available >= :projected``,
  which is ``spent + reserved + projected <= budget``;
* ``outstanding = units - completed - dead_lettered - remainder`` (= in flight + pending): a run
  closes exactly when it reaches 0, so a settlement that does not close requires
  ``outstanding > :decrement`` and the one that closes requires ``outstanding = :current``.

Rare transitions (open -> exhausting, which enumerates the remainder; top-up) condition on the
exact counters they read.

Exactly-once settlement: the settlement transaction puts the attempt item
(``attempt#<unit>#<n>``, ``attribute_not_exists``) together with the unit and run updates. A
duplicate SQS delivery, or a worker that settled and died before deleting its message, fails
that condition and gets the first settlement's fate back, changing nothing. Attempt items carry
the TTL attribute ``expires_at`` (default retention 30 days, beyond SQS's 14-day maximum).

Remainder membership is derived (as in the core): O(1) writes per operation. Claims and leases:
the unit item holds its reservation (attempt, projected, lease, claimed); a claim or unclaim is
one conditional write on the unit. :meth:`DynamoDBLedger.reclaim_expired` settles an expired
*claimed* attempt as lost through the same exactly-once transaction (so a late settlement by the
worker that held it is a duplicate) and releases an expired *unclaimed* one; both are
conditional on the exact reservation read, so a claim racing the reclaim is never lost.

Item layout: see :mod:`swarm.adapters`. The immutable run spec is its own item (read once per
client and cached), so the hot ``books`` item stays small (a read costs 1 RCU, not the spec's
size). A spec is stored zlib-compressed; DynamoDB's 400 KB item limit caps a run at roughly
50,000+ units (unit ids compress well).
"""

from __future__ import annotations

import json
import random
import threading
import time
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from swarm.adapters import (
    CONDITIONAL_CHECK_FAILED,
    PARTITION_KEY,
    SORT_KEY,
    TRANSACTION_CANCELED,
    TTL_ATTRIBUTE,
    call,
    client_error_type,
    default_client,
    error_code,
)
from swarm.adapters.dynamodb_watch import (
    DEFAULT_WATCH_GRACE_S,
    WATCH_NAMES,
    WATCH_SET,
    watch_values,
)
from swarm.core.codec import spec_from_doc, spec_to_doc
from swarm.core.errors import Conflict, NotFound
from swarm.core.ledger import (
    DEFAULT_LEASE_S,
    Admission,
    Claim,
    Fate,
    Settlement,
    TopUp,
    decide_admission,
    decide_claim,
    decide_dead_letter,
    decide_release,
    decide_settlement,
    decide_top_up,
    decide_unclaim,
    effective_state,
    fresh_records,
)
from swarm.core.records import (
    AttemptRecord,
    Reservation,
    RunRecord,
    RunSpec,
    RunState,
    UnitRecord,
    UnitState,
)

Item = dict[str, Any]

DEFAULT_ATTEMPT_RETENTION_S = 30 * 24 * 3600.0
MAX_TRIES = 64  # an operation re-decided this often is starved: report Conflict, don't spin

# counters changed by ADD; ``available`` and ``outstanding`` are derived (see module docstring)
_COUNTERS = (
    "budget", "spent", "reserved", "attempts", "retries", "completed", "dead_lettered",
    "remainder", "in_flight", "exhaustions",
)  # fmt: skip


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _i(value: int) -> dict[str, str]:
    return {"N": str(int(value))}


def _f(value: float) -> dict[str, str]:
    return {"N": repr(float(value))}


def _b(value: bool) -> dict[str, bool]:
    return {"BOOL": bool(value)}


def _num(item: Mapping[str, Any], name: str) -> float | None:
    raw = item.get(name)
    return None if raw is None or "N" not in raw else float(raw["N"])


def _int(item: Mapping[str, Any], name: str) -> int:
    raw = item.get(name)
    return 0 if raw is None else int(raw["N"])


def _outstanding(run: RunRecord) -> int:
    return run.units_total - run.completed - run.dead_lettered - run.remainder


class _Retry(Exception):
    """The write's conditions no longer hold: decide again from fresh records."""


class DynamoDBLedger:
    """The Ledger port on one DynamoDB table (see :mod:`swarm.adapters` for the key schema)."""

    def __init__(
        self,
        table_name: str,
        *,
        client: Any = None,
        client_factory: Any = None,
        attempt_retention_s: float = DEFAULT_ATTEMPT_RETENTION_S,
        rng: random.Random | None = None,
        watch_grace_s: float = DEFAULT_WATCH_GRACE_S,
    ) -> None:
        self.table_name = table_name
        self.attempt_retention_s = attempt_retention_s
        #: a run (re)opened now is due for the sweeper this much later (swarm.adapters.
        #: dynamodb_watch): its execution is being started by the same request
        self.watch_grace_s = watch_grace_s
        self.requests = 0
        self._client = client
        self._client_factory = client_factory
        self._rng = rng or random.Random()
        self._specs: dict[str, RunSpec] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing
    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = (self._client_factory or default_client)()
        return self._client

    def _call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.requests += 1
        return call(self.client, op, self._rng, **kwargs)

    @staticmethod
    def _pk(run_id: str) -> str:
        return f"run#{run_id}"

    def _key(self, run_id: str, sk: str) -> Item:
        return {PARTITION_KEY: _s(self._pk(run_id)), SORT_KEY: _s(sk)}

    @staticmethod
    def _unit_sk(unit_id: str) -> str:
        return f"unit#{unit_id}"

    @staticmethod
    def _attempt_sk(unit_id: str, attempt: int) -> str:
        return f"attempt#{unit_id}#{attempt:05d}"

    def _backoff(self, tries: int) -> None:
        if tries > 2:
            time.sleep(min(0.05, 0.001 * tries) * self._rng.random())

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
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :prefix)",
            "ExpressionAttributeValues": {":pk": _s(self._pk(run_id)), ":prefix": _s(prefix)},
            "ConsistentRead": True,
        }
        items: list[Item] = []
        while True:
            page = self._call("query", **kwargs)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]

    def _transact(self, items: list[Item]) -> None:
        """TransactWriteItems; a failed condition raises :class:`_Retry` with the reasons."""
        try:
            self._call("transact_write_items", TransactItems=items)
        except client_error_type() as e:
            if error_code(e) == TRANSACTION_CANCELED:
                reasons = getattr(e, "response", {}).get("CancellationReasons", [])
                raise _Retry([r.get("Code") for r in reasons]) from None
            raise

    # ------------------------------------------------------------------ record <-> item
    def _spec(self, run_id: str, books: Item | None = None) -> RunSpec:
        spec = self._specs.get(run_id)
        if spec is not None:
            return spec
        (item,) = self._get_many([self._key(run_id, "spec")])
        if item is None:
            raise NotFound(f"no run {run_id!r}")
        spec = spec_from_doc(json.loads(zlib.decompress(item["spec"]["B"])))
        self._specs[run_id] = spec
        return spec

    @staticmethod
    def _spec_blob(spec: RunSpec) -> bytes:
        return zlib.compress(json.dumps(spec_to_doc(spec), separators=(",", ":")).encode())

    def _books_item(self, run: RunRecord, ready: bool) -> Item:
        item: Item = {**self._key(run.run_id, "books"), "state": _s(run.state.value)}
        item.update({name: _i(getattr(run, name)) for name in _COUNTERS})
        item.update(
            {
                "available": _i(run.available),
                "outstanding": _i(_outstanding(run)),
                "units_total": _i(run.units_total),
                "opened_at": _f(run.opened_at),
                "ready": _b(ready),
            }
        )
        if run.closed_at is not None:
            item["closed_at"] = _f(run.closed_at)
        return item

    def _run_from(self, books: Item) -> RunRecord:
        run_id = books[PARTITION_KEY]["S"].split("#", 1)[1]
        closed = _num(books, "closed_at")
        return RunRecord(
            spec=self._spec(run_id),
            state=RunState(books["state"]["S"]),
            opened_at=float(books["opened_at"]["N"]),
            closed_at=closed,
            **{name: _int(books, name) for name in _COUNTERS},
        )

    def _unit_item(self, unit: UnitRecord) -> Item:
        item: Item = {
            **self._key(unit.run_id, self._unit_sk(unit.unit_id)),
            "unit_id": _s(unit.unit_id),
            "projected": _i(unit.projected_tokens),
            "state": _s(unit.state.value),
            "attempts": _i(unit.attempts),
            "spent": _i(unit.spent),
            "drain_epoch": _i(unit.drain_epoch),
        }
        return item

    @staticmethod
    def _unit_from(run_id: str, item: Item) -> UnitRecord:
        lease = _num(item, "res_lease")
        reservation = None
        if lease is not None:
            reservation = Reservation(
                attempt=_int(item, "res_attempt"),
                projected=_int(item, "res_projected"),
                lease_expires=lease,
                claimed=bool(item.get("res_claimed", {}).get("BOOL", False)),
            )
        return UnitRecord(
            run_id=run_id,
            unit_id=item["unit_id"]["S"],
            projected_tokens=_int(item, "projected"),
            state=UnitState(item["state"]["S"]),
            attempts=_int(item, "attempts"),
            spent=_int(item, "spent"),
            reservation=reservation,
            drain_epoch=_int(item, "drain_epoch"),
        )

    @staticmethod
    def _attempt_from(run_id: str, item: Item) -> tuple[AttemptRecord, Fate]:
        record = AttemptRecord(
            run_id=run_id,
            unit_id=item["unit_id"]["S"],
            attempt=_int(item, "attempt"),
            tokens=_int(item, "tokens"),
            succeeded=bool(item["succeeded"]["BOOL"]),
            settled_at=float(item["settled_at"]["N"]),
            reclaimed=bool(item.get("reclaimed", {}).get("BOOL", False)),
        )
        return record, Fate(item["fate"]["S"])

    # ------------------------------------------------------------------ writes: building blocks
    def _run_update(
        self,
        old: RunRecord,
        new: RunRecord,
        extra: Iterable[tuple[str, str, int]] = (),
        *,
        watch_from: float | None = None,
    ) -> Item:
        """An Update of the books from ``old`` to ``new``: deltas by ADD, state by SET.

        Conditions: the run is ready and still in ``old.state``; a write that closes the run
        requires ``outstanding`` to be exactly what was read (so it reaches 0 now); one that
        lowers it without closing requires it to stay above 0. ``extra`` adds conditions
        ``(attribute, operator, value)``. ``watch_from``: the sweeper watches the run again
        from then (a top-up reopening a closed run).
        """
        values: Item = {
            ":old_state": _s(old.state.value),
            ":true": _b(True),
            ":old_exh": _i(old.exhaustions),
        }
        names = {"#state": "state", "#exhaustions": "exhaustions"}
        conditions = ["#state = :old_state", "ready = :true", "#exhaustions = :old_exh"]
        adds: list[str] = []
        for name in (*_COUNTERS, "available", "outstanding"):
            if name == "available":
                delta = new.available - old.available
            elif name == "outstanding":
                delta = _outstanding(new) - _outstanding(old)
            else:
                delta = getattr(new, name) - getattr(old, name)
            if delta:
                names[f"#{name}"] = name
                adds.append(f"#{name} :d_{name}")
                values[f":d_{name}"] = _i(delta)
        sets: list[str] = []
        removes: list[str] = []
        if new.state is not old.state:
            sets.append("#state = :new_state")
            values[":new_state"] = _s(new.state.value)
        if new.closed_at != old.closed_at:
            if new.closed_at is None:
                removes.append("closed_at")
            else:
                sets.append("closed_at = :closed_at")
                values[":closed_at"] = _f(new.closed_at)
        if watch_from is not None:
            sets.append(WATCH_SET)
            names.update(WATCH_NAMES)
            values.update(watch_values(watch_from))
        closes = new.state.closed and not old.state.closed
        drop = _outstanding(old) - _outstanding(new)
        if closes:
            names["#outstanding"] = "outstanding"
            conditions.append("#outstanding = :o_now")
            values[":o_now"] = _i(_outstanding(old))
        elif drop > 0 and not new.state.closed:
            names["#outstanding"] = "outstanding"
            conditions.append("#outstanding > :o_drop")
            values[":o_drop"] = _i(drop)
        for i, (attr, op, value) in enumerate(extra):
            names[f"#{attr}"] = attr
            conditions.append(f"#{attr} {op} :x{i}")
            values[f":x{i}"] = _i(value)
        parts = []
        if sets:
            parts.append("SET " + ", ".join(sets))
        if adds:
            parts.append("ADD " + ", ".join(adds))
        if removes:
            parts.append("REMOVE " + ", ".join(removes))
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": self._key(old.run_id, "books"),
                "UpdateExpression": " ".join(parts),
                "ConditionExpression": " AND ".join(conditions),
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
        }

    def _unit_update(self, old: UnitRecord, new: UnitRecord) -> Item:
        """An Update of a unit from ``old`` to ``new``, conditional on ``old`` being current."""
        names = {"#state": "state"}
        values: Item = {
            ":old_state": _s(old.state.value),
            ":old_attempts": _i(old.attempts),
            ":old_de": _i(old.drain_epoch),
            ":state": _s(new.state.value),
            ":attempts": _i(new.attempts),
            ":spent": _i(new.spent),
            ":de": _i(new.drain_epoch),
        }
        conditions = ["#state = :old_state", "attempts = :old_attempts", "drain_epoch = :old_de"]
        old_res = old.reservation
        if old_res is not None:
            # the exact reservation read: a claim, unclaim or lease change meanwhile fails this
            conditions += ["res_attempt = :old_ra", "res_claimed = :old_rc", "res_lease = :old_rl"]
            values.update(
                {
                    ":old_ra": _i(old_res.attempt),
                    ":old_rc": _b(old_res.claimed),
                    ":old_rl": _f(old_res.lease_expires),
                }
            )
        sets = ["#state = :state", "attempts = :attempts", "spent = :spent", "drain_epoch = :de"]
        removes: list[str] = []
        res = new.reservation
        if res is not None:
            sets += [
                "res_attempt = :ra",
                "res_projected = :rp",
                "res_lease = :rl",
                "res_claimed = :rc",
            ]
            values.update(
                {
                    ":ra": _i(res.attempt),
                    ":rp": _i(res.projected),
                    ":rl": _f(res.lease_expires),
                    ":rc": _b(res.claimed),
                }
            )
        elif old_res is not None:
            removes = ["res_attempt", "res_projected", "res_lease", "res_claimed"]
        expr = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": self._key(old.run_id, self._unit_sk(old.unit_id)),
                "UpdateExpression": expr,
                "ConditionExpression": " AND ".join(conditions),
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
        }

    def _read_run_unit(self, run_id: str, unit_id: str) -> tuple[RunRecord, UnitRecord]:
        books, unit = self._get_many(
            [self._key(run_id, "books"), self._key(run_id, self._unit_sk(unit_id))]
        )
        if books is None or not books.get("ready", {}).get("BOOL", False):
            raise NotFound(f"no run {run_id!r}")
        if unit is None:
            raise NotFound(f"run {run_id!r} has no unit {unit_id!r}")
        return self._run_from(books), self._unit_from(run_id, unit)

    # ------------------------------------------------------------------ reads
    def _books(self, run_id: str) -> Item:
        (books,) = self._get_many([self._key(run_id, "books")])
        if books is None or not books.get("ready", {}).get("BOOL", False):
            raise NotFound(f"no run {run_id!r}")
        return books

    def run(self, run_id: str) -> RunRecord:
        return self._run_from(self._books(run_id))

    def unit(self, run_id: str, unit_id: str) -> UnitRecord:
        run, unit = self._read_run_unit(run_id, unit_id)
        return unit.with_(state=effective_state(run, unit))

    def _raw_units(self, run_id: str) -> list[UnitRecord]:
        spec = self._spec(run_id)
        order = {u.unit_id: i for i, u in enumerate(spec.units)}
        units = [self._unit_from(run_id, it) for it in self._query(run_id, "unit#")]
        return sorted(units, key=lambda u: order.get(u.unit_id, len(order)))

    def units(self, run_id: str) -> list[UnitRecord]:
        run = self.run(run_id)
        return [u.with_(state=effective_state(run, u)) for u in self._raw_units(run_id)]

    def attempts(self, run_id: str) -> list[AttemptRecord]:
        """Every settled attempt (while its record is retained), in settlement order."""
        self.run(run_id)
        records = [self._attempt_from(run_id, it)[0] for it in self._query(run_id, "attempt#")]
        return sorted(records, key=lambda a: (a.settled_at, a.unit_id, a.attempt))

    # ------------------------------------------------------------------ open
    def open_run(self, spec: RunSpec, now: float) -> RunRecord:
        """Create the books; idempotent for the same spec (also after a crash mid-way)."""
        run, units = fresh_records(spec, now)
        for _ in range(3):
            existing, spec_item = self._get_many(
                [self._key(spec.run_id, "books"), self._key(spec.run_id, "spec")]
            )
            if existing is not None and spec_item is not None:
                stored = spec_from_doc(json.loads(zlib.decompress(spec_item["spec"]["B"])))
                if stored != spec:
                    raise Conflict(f"run {spec.run_id!r} exists with a different spec")
                self._specs[spec.run_id] = stored
                if existing.get("ready", {}).get("BOOL", False):
                    return self._run_from(existing)
                break  # a crashed (or concurrent) open: finish writing the units
            try:
                self._transact(
                    [
                        {
                            "Put": {
                                "TableName": self.table_name,
                                "Item": {
                                    **self._key(spec.run_id, "spec"),
                                    "spec": {"B": self._spec_blob(spec)},
                                },
                                "ConditionExpression": "attribute_not_exists(pk)",
                            }
                        },
                        {
                            "Put": {
                                "TableName": self.table_name,
                                "Item": self._books_item(run, ready=False),
                                "ConditionExpression": "attribute_not_exists(pk)",
                            }
                        },
                    ]
                )
            except _Retry:
                continue
            self._specs[spec.run_id] = spec
            break
        else:
            raise Conflict(f"run {spec.run_id!r} is being opened by another caller; retry")
        # Units cannot change before the run is ready (admission requires ready), so an
        # unconditional batch write is safe, and a repeated open rewrites the same content.
        for start in range(0, len(units), 25):
            requests = [
                {"PutRequest": {"Item": self._unit_item(u)}} for u in units[start : start + 25]
            ]
            pending: dict[str, Any] = {self.table_name: requests}
            while pending:
                page = self._call("batch_write_item", RequestItems=pending)
                pending = page.get("UnprocessedItems") or {}
        # ready, and watched by the sweeper until its closure is announced (the watch attributes
        # are written here, not by the hot paths: see swarm.adapters.dynamodb_watch)
        self._call(
            "update_item",
            TableName=self.table_name,
            Key=self._key(spec.run_id, "books"),
            UpdateExpression=f"SET ready = :true, {WATCH_SET}",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames=WATCH_NAMES,
            ExpressionAttributeValues={":true": _b(True), **watch_values(now + self.watch_grace_s)},
        )
        return self.run(spec.run_id)

    # ------------------------------------------------------------------ admission
    def admit(
        self, run_id: str, unit_id: str, attempt: int, now: float, lease_s: float = DEFAULT_LEASE_S
    ) -> Admission:
        for tries in range(MAX_TRIES):
            run, unit = self._read_run_unit(run_id, unit_id)
            new_run, new_unit, admission = decide_admission(run, unit, attempt, now, lease_s)
            if new_run == run and new_unit == unit:
                return admission  # nothing to write: already admitted, terminal, closed, ...
            projected = unit.projected_tokens
            if admission.admitted:
                extra = [("available", ">=", projected)]
            elif run.state is RunState.OPEN:
                # exhaustion begins: the remainder is every unit pending *now*, so the counts
                # this decision read must still hold
                extra = [
                    ("available", "<", projected),
                    ("in_flight", "=", run.in_flight),
                    ("outstanding", "=", _outstanding(run)),
                ]
            else:
                extra = [("available", "<", projected)]
            items = [self._run_update(run, new_run, extra)]
            if new_unit != unit:
                items.append(self._unit_update(unit, new_unit))
            try:
                if len(items) > 1:
                    self._transact(items)
                else:
                    self._update(items[0])
            except _Retry:
                self._backoff(tries)
                continue
            return admission
        raise Conflict(f"admission of unit {unit_id} (run {run_id}) kept colliding; retry")

    def _update(self, item: Item) -> None:
        """A single conditional Update (cheaper than a one-item transaction)."""
        try:
            self._call("update_item", **item["Update"])
        except client_error_type() as e:
            if error_code(e) == CONDITIONAL_CHECK_FAILED:
                raise _Retry([CONDITIONAL_CHECK_FAILED]) from None
            raise

    # ------------------------------------------------------------------ settlement
    def settle(
        self, run_id: str, unit_id: str, attempt: int, tokens: int, succeeded: bool, now: float
    ) -> Settlement:
        settlement = self._settle(run_id, unit_id, attempt, tokens, succeeded, now, reclaimed=False)
        assert settlement is not None  # only a reclaim (``expect``) can give up
        return settlement

    def _duplicate(self, run_id: str, unit_id: str, attempt: int) -> Settlement | None:
        (item,) = self._get_many([self._key(run_id, self._attempt_sk(unit_id, attempt))])
        if item is None:
            return None
        record, fate = self._attempt_from(run_id, item)
        return Settlement(fate, True, self.run(run_id), self.unit(run_id, unit_id), record)

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
    ) -> Settlement | None:
        """Settle once. With ``expect`` (a reclaim), only that exact reservation is settled:
        None if it changed meanwhile (e.g. the worker unclaimed it with a fresh lease)."""
        for tries in range(MAX_TRIES):
            run, unit = self._read_run_unit(run_id, unit_id)
            reservation = unit.reservation
            if (
                unit.state is not UnitState.IN_FLIGHT
                or reservation is None
                or reservation.attempt != attempt
            ):
                duplicate = self._duplicate(run_id, unit_id, attempt)
                if duplicate is not None:
                    return duplicate
            if expect is not None and reservation != expect:
                return None
            new_run, new_unit, settlement = decide_settlement(
                run, unit, attempt, tokens, succeeded, now, reclaimed=reclaimed
            )
            record = settlement.attempt
            attempt_item: Item = {
                **self._key(run_id, self._attempt_sk(unit_id, attempt)),
                "unit_id": _s(unit_id),
                "attempt": _i(attempt),
                "tokens": _i(record.tokens),
                "succeeded": _b(record.succeeded),
                "settled_at": _f(record.settled_at),
                "reclaimed": _b(record.reclaimed),
                "fate": _s(settlement.fate.value),
                TTL_ATTRIBUTE: _i(int(now + self.attempt_retention_s)),
            }
            items = [
                {
                    "Put": {
                        "TableName": self.table_name,
                        "Item": attempt_item,
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                self._unit_update(unit, new_unit),
                self._run_update(run, new_run),
            ]
            try:
                self._transact(items)
            except _Retry as cancelled:
                codes = cancelled.args[0] if cancelled.args else []
                if codes and codes[0] == "ConditionalCheckFailed":
                    duplicate = self._duplicate(run_id, unit_id, attempt)
                    if duplicate is not None:
                        return duplicate
                self._backoff(tries)
                continue
            return settlement
        raise Conflict(f"settlement of unit {unit_id} (run {run_id}) kept colliding; retry")

    # ------------------------------------------------------------------ top-up
    def top_up(self, run_id: str, amount: int, now: float) -> TopUp:
        for tries in range(MAX_TRIES):
            before = self.run(run_id)
            run = decide_top_up(before, amount, now)
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
            # it needs a finalizer again (see swarm.adapters.dynamodb_watch)
            rewatch = now + self.watch_grace_s if before.state.closed else None
            update = self._run_update(
                before, run, [("remainder", "=", before.remainder)], watch_from=rewatch
            )
            try:
                self._update(update)
            except _Retry:
                self._backoff(tries)
                continue
            return TopUp(run, requeue if run.state is RunState.OPEN else ())
        raise Conflict(f"top-up of run {run_id} kept colliding; retry")

    # ------------------------------------------------------------------ claims and leases
    def claim(self, run_id: str, unit_id: str, attempt: int, now: float, lease_s: float) -> Claim:
        for tries in range(MAX_TRIES):
            run, unit = self._read_run_unit(run_id, unit_id)
            new_unit, claim = decide_claim(run, unit, attempt, now, lease_s)
            if new_unit == unit:
                return claim
            try:
                self._update(self._unit_update(unit, new_unit))
            except _Retry:
                self._backoff(tries)
                continue
            return claim
        raise Conflict(f"claim of unit {unit_id} (run {run_id}) kept colliding; retry")

    def unclaim(self, run_id: str, unit_id: str, attempt: int, now: float, lease_s: float) -> bool:
        for tries in range(MAX_TRIES):
            _, unit = self._read_run_unit(run_id, unit_id)
            new_unit, done = decide_unclaim(unit, attempt, now, lease_s)
            if not done:
                return False
            try:
                self._update(self._unit_update(unit, new_unit))
            except _Retry:
                self._backoff(tries)
                continue
            return True
        raise Conflict(f"unclaim of unit {unit_id} (run {run_id}) kept colliding; retry")

    def _release(self, run_id: str, unit_id: str, now: float) -> bool:
        """Give back an unclaimed reservation whose lease expired; False if it changed."""
        for tries in range(MAX_TRIES):
            run, unit = self._read_run_unit(run_id, unit_id)
            res = unit.reservation
            if res is None or res.claimed or res.lease_expires > now:
                return False
            new_run, new_unit = decide_release(run, unit, now)
            try:
                self._transact([self._run_update(run, new_run), self._unit_update(unit, new_unit)])
            except _Retry:
                self._backoff(tries)
                continue
            return True
        raise Conflict(f"release of unit {unit_id} (run {run_id}) kept colliding; retry")

    def reclaim_unit(self, run_id: str, unit_id: str, now: float) -> Settlement | None:
        """Settle a claimed attempt whose lease expired as lost (its projected tokens charged),
        or release an expired unclaimed reservation. None unless this call settled a lost
        attempt (another caller, or the worker itself, may have settled it first)."""
        for _ in range(MAX_TRIES):
            _, unit = self._read_run_unit(run_id, unit_id)
            res = unit.reservation
            if res is None or res.lease_expires > now:
                return None
            if not res.claimed:
                if self._release(run_id, unit_id, now):
                    return None
                continue  # it changed meanwhile (claimed?): look again
            s = self._settle(
                run_id,
                unit_id,
                res.attempt,
                res.projected,
                False,
                now,
                reclaimed=True,
                expect=res,
            )
            if s is None:
                continue  # the reservation changed before we could settle it: look again
            return None if s.duplicate else s
        raise Conflict(f"reclaim of unit {unit_id} (run {run_id}) kept colliding; retry")

    def reclaim_expired(self, run_id: str, now: float) -> list[Settlement]:
        """Reclaim every expired lease of the run (one Query, then one write per expired one).

        Attempts settled meanwhile (by their worker or another reclaimer) are skipped: each
        attempt is counted once, by whoever settles it first.
        """
        self.run(run_id)
        lost = []
        for u in self._raw_units(run_id):
            if u.reservation is not None and u.reservation.lease_expires <= now:
                settlement = self.reclaim_unit(run_id, u.unit_id, now)
                if settlement is not None:
                    lost.append(settlement)
        return lost

    def dead_letter(self, run_id: str, unit_id: str, now: float) -> UnitRecord:
        """End a unit the queue gave up on; a claimed attempt is settled as lost first."""
        for tries in range(MAX_TRIES):
            run, unit = self._read_run_unit(run_id, unit_id)
            res = unit.reservation
            if res is not None:
                if res.claimed:
                    self._settle(
                        run_id,
                        unit_id,
                        res.attempt,
                        res.projected,
                        False,
                        now,
                        reclaimed=True,
                        expect=res,
                    )
                else:
                    new_run, new_unit = decide_release(run, unit, now)
                    try:
                        self._transact(
                            [self._run_update(run, new_run), self._unit_update(unit, new_unit)]
                        )
                    except _Retry:
                        self._backoff(tries)
                continue  # look again at the unit, now without its reservation
            if unit.state is UnitState.PENDING:
                new_run, new_unit = decide_dead_letter(run, unit, now)
                try:
                    self._transact(
                        [self._run_update(run, new_run), self._unit_update(unit, new_unit)]
                    )
                except _Retry:
                    self._backoff(tries)
                    continue
            return self.unit(run_id, unit_id)
        raise Conflict(f"dead-lettering unit {unit_id} (run {run_id}) kept colliding; retry")
