"""The ledger's DynamoDB items: attribute values, keys, records <-> items, and the conditional
writes that move a books or unit item from one record to the next.

Pure: no requests. Item layouts and the conditions' reasons: docs/explanation/ledger.md.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from swarm.adapters.dynamodb import PARTITION_KEY, SORT_KEY
from swarm.adapters.dynamodb_watch import WATCH_NAMES, WATCH_SET, watch_values
from swarm.contract import LEASE_EXPIRY
from swarm.core.codec import spec_from_doc, spec_to_doc
from swarm.core.ledger import Fate, log_sort_key
from swarm.core.pricing import Prices
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

SPEC = "spec"
BOOKS = "books"

#: the books' counters, changed by ADD; ``available`` and ``outstanding`` are derived from them
COUNTERS = (
    "budget", "spent", "reserved", "attempts", "retries", "completed", "dead_lettered",
    "remainder", "in_flight", "exhaustions", "turns", "tool_calls", "spent_micro", "awaiting",
)  # fmt: skip

#: a unit's reservation, set and removed together (:func:`unit_update`). ``res_lease`` is also
#: the ``Leases`` index's sort key (swarm.contract.LEASE_EXPIRY): when the lease sweep looks at
#: the reservation (``Reservation.swept_from``); only a unit holding a reservation the sweep finds
#: by the index is in it (not a fan-out's: the run's scan finds those), and the write that takes,
#: hands back or ends it moves it there, in the same write. A reservation's own lease when it is
#: not that one (a claim's, a fan-out's admission's) is ``res_until``, which no index holds
CLAIM_LEASE = "res_until"
#: the books' scan horizon (RunRecord.scan_at): when the lease sweep reads every unit of the run
SCAN_AT = "scan_at"
#: an agent loop's reservation (Reservation.loop) and the tokens of the turns settled against it
#: (Reservation.used): only on a loop's
RES_LOOP = "res_loop"
RES_USED = "res_used"
#: a loop's turns' cost in micro-dollars (Reservation.used_micro), and a reservation in
#: micro-dollars (Reservation.usd: its run's budget is in dollars); absent: 0, False
RES_USED_MICRO = "res_used_micro"
RES_USD = "res_usd"
RESERVATION_ATTRIBUTES = (
    "res_attempt", "res_projected", LEASE_EXPIRY, "res_claimed", CLAIM_LEASE, RES_LOOP, RES_USED,
    RES_USED_MICRO, RES_USD,
)  # fmt: skip
#: a unit's projected cost per attempt and its settled cost, in micro-dollars (absent: 0)
PROJECTED_MICRO = "projected_micro"
SPENT_MICRO = "spent_micro"
#: a unit's model turns settled (UnitRecord.turns; absent: 0) and where its event log is kept
#: (UnitRecord.log_key: the log items' partition key), both written by ``settle_turn``
TURNS = "turns"
LOG = "log"
#: a log event's item: the event as compact JSON text
EVENT = "event"
#: where the outcome of the unit's last settled attempt is kept (UnitRecord.outcome_key)
OUTCOME_KEY = "outcome_key"
#: a unit's settled attempts are kept in its own item, one map attribute each (``att00001``):
#: the settlement writes it with the unit, in the same update, once (docs/explanation/ledger.md)
ATTEMPT_PREFIX = "att"


# ------------------------------------------------------------------ attribute values
def string(value: str) -> dict[str, str]:
    return {"S": value}


def whole(value: int) -> dict[str, str]:
    return {"N": str(int(value))}


def real(value: float) -> dict[str, str]:
    return {"N": repr(float(value))}


def flag(value: bool) -> dict[str, bool]:
    return {"BOOL": bool(value)}


def real_of(item: Mapping[str, Any], name: str) -> float | None:
    raw = item.get(name)
    return None if raw is None or "N" not in raw else float(raw["N"])


def whole_of(item: Mapping[str, Any], name: str) -> int:
    raw = item.get(name)
    return 0 if raw is None else int(raw["N"])


def flag_of(item: Mapping[str, Any] | None, name: str) -> bool:
    return item is not None and bool(item.get(name, {}).get("BOOL", False))


# ------------------------------------------------------------------ keys
def run_pk(run_id: str) -> str:
    return f"run#{run_id}"


def key(run_id: str, sk: str) -> Item:
    return {PARTITION_KEY: string(run_pk(run_id)), SORT_KEY: string(sk)}


def unit_sk(unit_id: str) -> str:
    return f"unit#{unit_id}"


def attempt_sk(unit_id: str, attempt: int) -> str:
    return f"attempt#{unit_id}#{attempt:05d}"


def run_id_of(item: Mapping[str, Any]) -> str:
    return str(item[PARTITION_KEY]["S"].split("#", 1)[1])


# ------------------------------------------------------------------ records <-> items
def spec_item(spec: RunSpec, spec_key: str) -> Item:
    """The run-level fields, the unit list's totals and digest, and where the list is (the S3
    key of the submit's ``spec.json``): O(1) in the batch size, so the 400 KB item limit no
    longer bounds a batch. The unit list itself is in the unit items (see
    docs/explanation/ledger.md)."""
    doc = spec_to_doc(spec.summary)
    return {
        **key(spec.run_id, SPEC),
        "summary": string(json.dumps(doc, separators=(",", ":"))),
        "spec_key": string(spec_key),
    }


def no_spec_key(run_id: str) -> str:
    """``spec_key`` of a run opened in one call (:meth:`DynamoDBLedger.open_run`): no object."""
    return f"inline:{run_id}"


def watch_attributes(sweep_at: float, tenant: str) -> Item:
    """The watch attributes as item values (a Put of a books item that is watched from the
    start: :func:`swarm.adapters.dynamodb_watch.watch_values` by name)."""
    values = watch_values(sweep_at, tenant)
    return {attr: values[f":{name[1:]}"] for name, attr in WATCH_NAMES.items()}


def spec_from(item: Mapping[str, Any]) -> RunSpec:
    """The run's spec: its summary (units not held); a run opened before the summary items
    kept its whole spec compressed in ``spec`` (read as it is)."""
    if "summary" in item:
        return spec_from_doc(json.loads(item["summary"]["S"]))
    return spec_from_doc(json.loads(zlib.decompress(item["spec"]["B"])))


def spec_key_of(item: Mapping[str, Any]) -> str | None:
    raw = item.get("spec_key")
    return None if raw is None else str(raw["S"])


def books_item(run: RunRecord, ready: bool) -> Item:
    item: Item = {**key(run.run_id, BOOKS), "state": string(run.state.value)}
    item.update({name: whole(getattr(run, name)) for name in COUNTERS})
    item.update(
        {
            "available": whole(run.available),
            "outstanding": whole(run.outstanding),
            "units_total": whole(run.units_total),
            "opened_at": real(run.opened_at),
            "ready": flag(ready),
        }
    )
    if run.closed_at is not None:
        item["closed_at"] = real(run.closed_at)
    if run.scan_at is not None:
        item[SCAN_AT] = real(run.scan_at)
    return item


def run_from(books: Mapping[str, Any], spec: RunSpec) -> RunRecord:
    return RunRecord(
        spec=spec,
        state=RunState(books["state"]["S"]),
        opened_at=float(books["opened_at"]["N"]),
        closed_at=real_of(books, "closed_at"),
        scan_at=real_of(books, SCAN_AT),
        **{name: whole_of(books, name) for name in COUNTERS},
    )


def unit_item(unit: UnitRecord, index: int | None = None) -> Item:
    """A fresh unit's item; ``index``: its place in the submission (``units()`` order)."""
    item: Item = {
        **key(unit.run_id, unit_sk(unit.unit_id)),
        "unit_id": string(unit.unit_id),
        "projected": whole(unit.projected_tokens),
        "state": string(unit.state.value),
        "attempts": whole(unit.attempts),
        "spent": whole(unit.spent),
        "drain_epoch": whole(unit.drain_epoch),
    }
    if unit.projected_micro:
        item[PROJECTED_MICRO] = whole(unit.projected_micro)
    if unit.spent_micro:
        item[SPENT_MICRO] = whole(unit.spent_micro)
    if index is not None:
        item["idx"] = whole(index)
    return item


def index_of(item: Mapping[str, Any]) -> int:
    """A unit item's place in the submission (0 for an item written without one)."""
    return whole_of(item, "idx")


def unit_from(run_id: str, item: Mapping[str, Any]) -> UnitRecord:
    reservation = None
    if "res_attempt" in item:
        # the lease the index holds (res_lease), the reservation's own when it differs
        # (res_until: a claim's, or one the index does not hold). A claim written before claims
        # kept their lease apart moved res_lease itself: read as it is
        lease, until = real_of(item, LEASE_EXPIRY), real_of(item, CLAIM_LEASE)
        expires = until if until is not None else lease
        if expires is None:
            raise ValueError(f"unit {item['unit_id']['S']}: a reservation without a lease")
        reservation = Reservation(
            attempt=whole_of(item, "res_attempt"),
            projected=whole_of(item, "res_projected"),
            lease_expires=expires,
            claimed=flag_of(item, "res_claimed"),
            sweep_at=None if until is None else (math.inf if lease is None else lease),
            loop=flag_of(item, RES_LOOP),
            used=whole_of(item, RES_USED),
            used_micro=whole_of(item, RES_USED_MICRO),
            usd=flag_of(item, RES_USD),
        )
    return UnitRecord(
        run_id=run_id,
        unit_id=item["unit_id"]["S"],
        projected_tokens=whole_of(item, "projected"),
        state=UnitState(item["state"]["S"]),
        attempts=whole_of(item, "attempts"),
        spent=whole_of(item, "spent"),
        reservation=reservation,
        drain_epoch=whole_of(item, "drain_epoch"),
        outcome_key=item[OUTCOME_KEY]["S"] if OUTCOME_KEY in item else None,
        turns=whole_of(item, TURNS),
        log_key=item[LOG]["S"] if LOG in item else None,
        projected_micro=whole_of(item, PROJECTED_MICRO),
        spent_micro=whole_of(item, SPENT_MICRO),
    )


def attempt_attribute(attempt: int) -> str:
    """The unit item's attribute that holds its settled attempt ``attempt``."""
    return f"{ATTEMPT_PREFIX}{attempt:05d}"


def attempt_value(record: AttemptRecord, fate: Fate) -> dict[str, Any]:
    """A settled attempt, as the map its unit item keeps (:func:`attempt_attribute`): with its
    cost in micro-dollars and the prices it was settled at, when it was priced."""
    doc: Item = {
        "tokens": whole(record.tokens),
        "succeeded": flag(record.succeeded),
        "settled_at": real(record.settled_at),
        "reclaimed": flag(record.reclaimed),
        "fate": string(fate.value),
    }
    if record.prices is not None:
        doc["cost_micro"] = whole(record.cost_micro)
        prices = record.prices.to_doc()
        doc["prices"] = {
            "M": {
                name: string(value) if name == "as_of" else whole(value)
                for name, value in prices.items()
            }
        }
    return {"M": doc}


def attempts_of(run_id: str, item: Mapping[str, Any]) -> dict[int, tuple[AttemptRecord, Fate]]:
    """The settled attempts a unit item keeps, by attempt number."""
    found: dict[int, tuple[AttemptRecord, Fate]] = {}
    unit_id = item["unit_id"]["S"]
    for name, value in item.items():
        if not (name.startswith(ATTEMPT_PREFIX) and name[len(ATTEMPT_PREFIX) :].isdigit()):
            continue
        attempt = int(name[len(ATTEMPT_PREFIX) :])
        doc = value["M"]
        record = AttemptRecord(
            run_id=run_id,
            unit_id=unit_id,
            attempt=attempt,
            tokens=whole_of(doc, "tokens"),
            succeeded=flag_of(doc, "succeeded"),
            settled_at=float(doc["settled_at"]["N"]),
            reclaimed=flag_of(doc, "reclaimed"),
            cost_micro=whole_of(doc, "cost_micro"),
            prices=_prices_of(doc),
        )
        found[attempt] = (record, Fate(doc["fate"]["S"]))
    return found


def _prices_of(doc: Mapping[str, Any]) -> Prices | None:
    """The prices a settled attempt's map keeps (None: it was not priced)."""
    if "prices" not in doc:
        return None
    return Prices.from_doc({name: next(iter(v.values())) for name, v in doc["prices"]["M"].items()})


def attempt_from(run_id: str, item: Mapping[str, Any]) -> tuple[AttemptRecord, Fate]:
    """A settled attempt kept in an item of its own (``attempt#<unit>#<n>``): how a settlement
    recorded it before attempts were kept in their unit's item. Read, never written."""
    record = AttemptRecord(
        run_id=run_id,
        unit_id=item["unit_id"]["S"],
        attempt=whole_of(item, "attempt"),
        tokens=whole_of(item, "tokens"),
        succeeded=bool(item["succeeded"]["BOOL"]),
        settled_at=float(item["settled_at"]["N"]),
        reclaimed=flag_of(item, "reclaimed"),
    )
    return record, Fate(item["fate"]["S"])


# ------------------------------------------------------------------ conditional writes
def put_new(table_name: str, item: Item) -> Item:
    """A transaction's Put of an item that must not exist yet."""
    return {
        "Put": {
            "TableName": table_name,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(pk)",
        }
    }


def _update(
    table_name: str,
    item_key: Item,
    expression: str,
    conditions: list[str],
    names: dict[str, str],
    values: Item,
) -> Item:
    return {
        "Update": {
            "TableName": table_name,
            "Key": item_key,
            "UpdateExpression": expression,
            "ConditionExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
    }


def run_update(
    table_name: str,
    old: RunRecord,
    new: RunRecord,
    extra: Iterable[tuple[str, str, int]] = (),
    *,
    watch_from: float | None = None,
    any_epoch: bool = False,
) -> Item:
    """An Update of the books from ``old`` to ``new``: deltas by ADD, state by SET.

    Conditions: the run is ready and still in ``old.state`` (and in ``old``'s exhaustion epoch,
    unless ``any_epoch``: a change decided on a stand-in of the books, whose deltas do not depend
    on it); a write that closes the run requires ``outstanding`` to be exactly what was read (so
    it reaches 0 now); one that lowers it without closing requires it to stay above 0. ``extra``
    adds conditions ``(attribute, operator, value)``. ``watch_from``: the sweeper watches the
    run again from then (a top-up reopening a closed run).
    """
    values: Item = {":old_state": string(old.state.value), ":true": flag(True)}
    names = {"#state": "state"}
    conditions = ["#state = :old_state", "ready = :true"]
    if not any_epoch:
        names["#exhaustions"] = "exhaustions"
        values[":old_exh"] = whole(old.exhaustions)
        conditions.append("#exhaustions = :old_exh")
    adds: list[str] = []
    for name in (*COUNTERS, "available", "outstanding"):
        if name == "available":
            delta = new.available - old.available
        elif name == "outstanding":
            delta = new.outstanding - old.outstanding
        else:
            delta = getattr(new, name) - getattr(old, name)
        if delta:
            names[f"#{name}"] = name
            adds.append(f"#{name} :d_{name}")
            values[f":d_{name}"] = whole(delta)
    sets: list[str] = []
    removes: list[str] = []
    if new.state is not old.state:
        sets.append("#state = :new_state")
        values[":new_state"] = string(new.state.value)
    if new.scan_at != old.scan_at:  # unconditional: the scan that reads it recomputes it
        if new.scan_at is None:
            removes.append(SCAN_AT)
        else:
            sets.append(f"{SCAN_AT} = :scan_at")
            values[":scan_at"] = real(new.scan_at)
    if new.closed_at != old.closed_at:
        if new.closed_at is None:
            removes.append("closed_at")
        else:
            sets.append("closed_at = :closed_at")
            values[":closed_at"] = real(new.closed_at)
    if watch_from is not None:
        sets.append(WATCH_SET)
        names.update(WATCH_NAMES)
        values.update(watch_values(watch_from, new.spec.tenant))
    closes = new.state.closed and not old.state.closed
    drop = old.outstanding - new.outstanding
    if closes:
        names["#outstanding"] = "outstanding"
        conditions.append("#outstanding = :o_now")
        values[":o_now"] = whole(old.outstanding)
    elif drop > 0 and not new.state.closed:
        names["#outstanding"] = "outstanding"
        conditions.append("#outstanding > :o_drop")
        values[":o_drop"] = whole(drop)
    for i, (attr, op, value) in enumerate(extra):
        names[f"#{attr}"] = attr
        conditions.append(f"#{attr} {op} :x{i}")
        values[f":x{i}"] = whole(value)
    parts = []
    if sets:
        parts.append("SET " + ", ".join(sets))
    if adds:
        parts.append("ADD " + ", ".join(adds))
    if removes:
        parts.append("REMOVE " + ", ".join(removes))
    if not parts:  # nothing changes (a turn billed 0): the write only checks the conditions
        parts.append("SET #state = :old_state")
    return _update(table_name, key(old.run_id, BOOKS), " ".join(parts), conditions, names, values)


def scan_update(table_name: str, run_id: str, read: float, horizon: float | None) -> Item:
    """An Update of the books' scan horizon (``RunRecord.scan_at``) from ``read`` to
    ``horizon`` (None: removed), only if it is still ``read`` (an admission that moved it
    meanwhile keeps its own): what the lease sweep's scan of the run's units found."""
    names, values = {"#scan": SCAN_AT}, {":read": real(read)}
    expression = "REMOVE #scan"
    if horizon is not None:
        expression, values[":next"] = "SET #scan = :next", real(horizon)
    return _update(table_name, key(run_id, BOOKS), expression, ["#scan = :read"], names, values)


def queued_claim(
    table_name: str,
    run_id: str,
    unit_id: str,
    attempt: int,
    lease_expires: float,
    loop: bool = False,
) -> Item:
    """An Update that claims attempt ``attempt`` of a unit only if it is in flight for it and
    unclaimed (``Ledger.claim_queued``): what the claim decides on a read, checked by the write
    itself, so no read comes first. The claim's lease is its own (``res_until``): the unit keeps
    its place in the lease index (``Reservation.sweep_at``), so the claim writes no index entry."""
    names = {"#state": "state"}
    values: Item = {
        ":in_flight": string(UnitState.IN_FLIGHT.value),
        ":attempt": whole(attempt),
        ":unclaimed": flag(False),
        ":claimed": flag(True),
        ":lease": real(lease_expires),
    }
    conditions = ["#state = :in_flight", "res_attempt = :attempt", "res_claimed = :unclaimed"]
    expression = f"SET res_claimed = :claimed, {CLAIM_LEASE} = :lease"
    if loop:  # an agent loop's attempt (Reservation.loop), marked with its claim
        expression += f", {RES_LOOP} = :claimed"
    return _update(table_name, key(run_id, unit_sk(unit_id)), expression, conditions, names, values)


def unit_update(
    table_name: str,
    old: UnitRecord,
    new: UnitRecord,
    settled: tuple[AttemptRecord, Fate] | None = None,
) -> Item:
    """An Update of a unit from ``old`` to ``new``, conditional on ``old`` being current;
    ``settled``: the attempt this update settles, kept in the unit's item (only if it is not
    there yet: exactly once)."""
    names = {"#state": "state"}
    values: Item = {
        ":old_state": string(old.state.value),
        ":old_attempts": whole(old.attempts),
        ":old_de": whole(old.drain_epoch),
        ":state": string(new.state.value),
        ":attempts": whole(new.attempts),
        ":spent": whole(new.spent),
        ":de": whole(new.drain_epoch),
    }
    conditions = ["#state = :old_state", "attempts = :old_attempts", "drain_epoch = :old_de"]
    # the turns settled as read: a turn settled meanwhile (settle_turn) fails every other write
    values[":old_turns"] = whole(old.turns)
    if old.turns == 0:  # a unit written before turns existed has no attribute
        conditions.append(f"(attribute_not_exists({TURNS}) OR {TURNS} = :old_turns)")
    else:
        conditions.append(f"{TURNS} = :old_turns")
    old_res = old.reservation
    if old_res is not None:
        # the exact reservation read: a claim, unclaim or lease change meanwhile fails this
        conditions += ["res_attempt = :old_ra", "res_claimed = :old_rc"]
        values.update({":old_ra": whole(old_res.attempt), ":old_rc": flag(old_res.claimed)})
        if old_res.sweep_at == math.inf:
            conditions.append(f"attribute_not_exists({LEASE_EXPIRY})")
        else:
            conditions.append(f"{LEASE_EXPIRY} = :old_rl")
            values[":old_rl"] = real(old_res.swept_from)
        if old_res.sweep_at is None:
            conditions.append(f"attribute_not_exists({CLAIM_LEASE})")
        else:
            conditions.append(f"{CLAIM_LEASE} = :old_ru")
            values[":old_ru"] = real(old_res.lease_expires)
    sets = ["#state = :state", "attempts = :attempts", "spent = :spent", "drain_epoch = :de"]
    removes: tuple[str, ...] = ()
    if new.spent_micro != old.spent_micro:
        sets.append(f"{SPENT_MICRO} = :spent_micro")
        values[":spent_micro"] = whole(new.spent_micro)
    if new.outcome_key is not None:
        sets.append(f"{OUTCOME_KEY} = :ok")
        values[":ok"] = string(new.outcome_key)
    elif old.outcome_key is not None:
        removes += (OUTCOME_KEY,)
    if new.turns != old.turns:
        sets.append(f"{TURNS} = :turns")
        values[":turns"] = whole(new.turns)
    if new.log_key is not None and new.log_key != old.log_key:
        sets.append("#log = :log")
        names["#log"] = LOG
        values[":log"] = string(new.log_key)
    res = new.reservation
    if res is not None:
        sets += ["res_attempt = :ra", "res_projected = :rp", "res_claimed = :rc"]
        values.update(
            {":ra": whole(res.attempt), ":rp": whole(res.projected), ":rc": flag(res.claimed)}
        )
        if res.sweep_at == math.inf:  # not in the lease index (the run's scan finds it)
            removes += (LEASE_EXPIRY,)
        else:
            sets.append(f"{LEASE_EXPIRY} = :rl")
            values[":rl"] = real(res.swept_from)
        if res.sweep_at is not None:
            sets.append(f"{CLAIM_LEASE} = :ru")
            values[":ru"] = real(res.lease_expires)
        elif old_res is not None and old_res.sweep_at is not None:
            removes += (CLAIM_LEASE,)
        if res.loop:
            sets += [f"{RES_LOOP} = :rloop", f"{RES_USED} = :rused"]
            values.update({":rloop": flag(True), ":rused": whole(res.used)})
            if res.used_micro:
                sets.append(f"{RES_USED_MICRO} = :rumicro")
                values[":rumicro"] = whole(res.used_micro)
        elif old_res is not None and old_res.loop:
            removes += (RES_LOOP, RES_USED, RES_USED_MICRO)
        if res.usd:
            sets.append(f"{RES_USD} = :rusd")
            values[":rusd"] = flag(True)
    elif old_res is not None:
        removes += RESERVATION_ATTRIBUTES
    if settled is not None:
        record, fate = settled
        names["#att"] = attempt_attribute(record.attempt)
        values[":att"] = attempt_value(record, fate)
        sets.append("#att = :att")
        conditions.append("attribute_not_exists(#att)")
    expr = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    item_key = key(old.run_id, unit_sk(old.unit_id))
    return _update(table_name, item_key, expr, conditions, names, values)


def log_key_of(key_text: str, seq: int) -> Item:
    """A log event's item key: the log's own partition (``UnitRecord.log_key``), its seq."""
    return {PARTITION_KEY: string(key_text), SORT_KEY: string(log_sort_key(seq))}


def log_put(table_name: str, key_text: str, seq: int, text: str) -> Item:
    """An Update that creates log event ``seq`` only if its seq is free. An Update rather than a
    Put: the worker's role writes the ledger's items with ``dynamodb:UpdateItem`` only."""
    return _update(
        table_name,
        log_key_of(key_text, seq),
        "SET #event = :event",
        ["attribute_not_exists(pk)"],
        {"#event": EVENT},
        {":event": string(text)},
    )
