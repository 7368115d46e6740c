"""Records to plain JSON-ready dicts and back: one codec for state files, queues and adapters."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from swarm.core.errors import InvalidInput
from swarm.core.governor import BucketState, ticket_from_doc, ticket_to_doc
from swarm.core.lanes import QueuedUnit
from swarm.core.pricing import Prices
from swarm.core.prompts import from_json
from swarm.core.records import (
    AttemptRecord,
    Lane,
    Reservation,
    RunRecord,
    RunSpec,
    RunState,
    UnitRecord,
    UnitSpec,
    UnitState,
)

Doc = dict[str, Any]


def spec_to_doc(spec: RunSpec) -> Doc:
    """The spec as JSON: its unit list when it holds one (the submit's S3 object
    ``manifests/<run>/spec.json``, state files), else its totals and digest."""
    doc: Doc = {
        "run_id": spec.run_id,
        "tenant": spec.tenant,
        "lane": spec.lane.value,
        "budget": spec.budget,
        "max_attempts": spec.max_attempts,
        "units_total": spec.units_total,
        "projected_total": spec.projected_total,
        "digest": spec.digest,
    }
    if spec.usd:
        doc["usd"] = True
    if spec.prices is not None:
        doc["prices"] = spec.prices.to_doc()
    if spec.units:
        doc["units"] = [
            [u.unit_id, u.projected_tokens, *([u.projected_micro] if u.projected_micro else [])]
            for u in spec.units
        ]
    return doc


def spec_from_doc(doc: Doc) -> RunSpec:
    """A spec with its unit list when the document has one, else its summary."""
    units = tuple(
        UnitSpec(str(u[0]), int(u[1]), int(u[2]) if len(u) > 2 else 0)
        for u in doc.get("units") or ()
    )
    spec = RunSpec(
        run_id=doc["run_id"],
        tenant=doc["tenant"],
        lane=Lane.parse(doc["lane"]),
        budget=int(doc["budget"]),
        max_attempts=int(doc["max_attempts"]),
        units=units,
        units_total=int(doc.get("units_total", -1)),
        projected_total=int(doc.get("projected_total", -1)),
        digest=str(doc.get("digest", "")),
        usd=bool(doc.get("usd", False)),
        prices=None if doc.get("prices") is None else Prices.from_doc(doc["prices"]),
    )
    if units and doc.get("digest") not in (None, spec.digest):
        raise InvalidInput("units", f"run {spec.run_id!r}: the unit list does not match its digest")
    return spec


_RUN_COUNTERS = (
    "spent", "reserved", "attempts", "retries", "completed", "dead_lettered", "remainder",
    "in_flight", "budget", "exhaustions", "turns", "tool_calls", "spent_micro",
)  # fmt: skip


def run_to_doc(run: RunRecord) -> Doc:
    doc: Doc = {"spec": spec_to_doc(run.spec), "state": run.state.value}
    doc.update({name: getattr(run, name) for name in _RUN_COUNTERS})
    doc.update({"opened_at": run.opened_at, "closed_at": run.closed_at})
    if run.scan_at is not None:
        doc["scan_at"] = run.scan_at
    return doc


def run_from_doc(doc: Doc) -> RunRecord:
    counters = {name: int(doc.get(name, 0)) for name in _RUN_COUNTERS}  # older files: no turns
    return RunRecord(
        spec=spec_from_doc(doc["spec"]),
        state=RunState(doc["state"]),
        opened_at=float(doc["opened_at"]),
        closed_at=None if doc["closed_at"] is None else float(doc["closed_at"]),
        scan_at=None if doc.get("scan_at") is None else float(doc["scan_at"]),
        **counters,
    )


def unit_to_doc(unit: UnitRecord) -> Doc:
    res = unit.reservation
    return {
        "run_id": unit.run_id,
        "unit_id": unit.unit_id,
        "projected_tokens": unit.projected_tokens,
        "state": unit.state.value,
        "attempts": unit.attempts,
        "spent": unit.spent,
        "projected_micro": unit.projected_micro,
        "spent_micro": unit.spent_micro,
        "drain_epoch": unit.drain_epoch,
        "turns": unit.turns,
        "log_key": unit.log_key,
        "reservation": None
        if res is None
        else {
            "attempt": res.attempt,
            "projected": res.projected,
            "lease_expires": res.lease_expires,
            "claimed": res.claimed,
            "sweep_at": res.sweep_at,
            "loop": res.loop,
            "used": res.used,
            "used_micro": res.used_micro,
            "usd": res.usd,
        },
    }


def unit_from_doc(doc: Doc) -> UnitRecord:
    res = doc.get("reservation")
    return UnitRecord(
        run_id=doc["run_id"],
        unit_id=doc["unit_id"],
        projected_tokens=int(doc["projected_tokens"]),
        state=UnitState(doc["state"]),
        attempts=int(doc["attempts"]),
        spent=int(doc["spent"]),
        projected_micro=int(doc.get("projected_micro", 0)),
        spent_micro=int(doc.get("spent_micro", 0)),
        drain_epoch=int(doc["drain_epoch"]),
        turns=int(doc.get("turns", 0)),
        log_key=doc.get("log_key"),
        reservation=None
        if res is None
        else Reservation(
            int(res["attempt"]),
            int(res["projected"]),
            float(res["lease_expires"]),
            bool(res.get("claimed", False)),
            None if res.get("sweep_at") is None else float(res["sweep_at"]),
            loop=bool(res.get("loop", False)),
            used=int(res.get("used", 0)),
            used_micro=int(res.get("used_micro", 0)),
            usd=bool(res.get("usd", False)),
        ),
    )


def attempt_to_doc(a: AttemptRecord) -> Doc:
    return {
        "run_id": a.run_id,
        "unit_id": a.unit_id,
        "attempt": a.attempt,
        "tokens": a.tokens,
        "succeeded": a.succeeded,
        "settled_at": a.settled_at,
        "reclaimed": a.reclaimed,
        "cost_micro": a.cost_micro,
        "prices": None if a.prices is None else a.prices.to_doc(),
    }


def attempt_from_doc(doc: Doc) -> AttemptRecord:
    return AttemptRecord(
        run_id=doc["run_id"],
        unit_id=doc["unit_id"],
        attempt=int(doc["attempt"]),
        tokens=int(doc["tokens"]),
        succeeded=bool(doc["succeeded"]),
        settled_at=float(doc["settled_at"]),
        reclaimed=bool(doc.get("reclaimed", False)),
        cost_micro=int(doc.get("cost_micro", 0)),
        prices=None if doc.get("prices") is None else Prices.from_doc(doc["prices"]),
    )


def queued_to_doc(q: QueuedUnit) -> Doc:
    return {
        "run_id": q.run_id,
        "unit_id": q.unit_id,
        "tenant": q.tenant,
        "lane": q.lane.value,
        "attempt": q.attempt,
        "tokens": q.tokens,
        "input": q.input,
        **({"ticket": ticket_to_doc(q.ticket)} if q.ticket is not None else {}),
        **({"tools_down_since": q.tools_down_since} if q.tools_down_since is not None else {}),
    }


def queued_from_doc(doc: Doc) -> QueuedUnit:
    """Parse a queue message; a malformed one is an InvalidInput naming the missing field."""
    try:
        return QueuedUnit(
            run_id=str(doc["run_id"]),
            unit_id=str(doc["unit_id"]),
            tenant=str(doc["tenant"]),
            lane=Lane.parse(str(doc["lane"])),
            attempt=int(doc["attempt"]),
            tokens=int(doc["tokens"]),
            input=from_json(doc.get("input", "")),  # a message of any version: str or object
            ticket=ticket_from_doc(doc.get("ticket")),
            tools_down_since=_float_or_none(doc.get("tools_down_since")),
        )
    except KeyError as missing:
        raise InvalidInput(str(missing.args[0]), "missing from the queue message") from None
    except (TypeError, ValueError) as bad:
        raise InvalidInput("message", f"malformed queue message: {bad}") from None


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def bucket_to_doc(state: BucketState) -> Doc:
    return {
        "tokens": state.tokens,
        "updated_at": state.updated_at,
        "cut_rate": state.cut_rate,
        "cut_at": state.cut_at,
        "throttles": state.throttles,
        "last_throttle_at": state.last_throttle_at,
    }


def bucket_from_doc(doc: Doc) -> BucketState:
    return BucketState(
        tokens=float(doc["tokens"]),
        updated_at=float(doc["updated_at"]),
        cut_rate=_float_or_none(doc["cut_rate"]),
        cut_at=float(doc["cut_at"]),
        throttles=int(doc["throttles"]),
        last_throttle_at=_float_or_none(doc["last_throttle_at"]),
    )


def message_body(item: QueuedUnit) -> str:
    return json.dumps(queued_to_doc(item), separators=(",", ":"))


#: what every unit of a bundle shares, written once in its message
_BUNDLE_SHARED = ("run_id", "tenant", "lane")


def bundle_body(units: Sequence[QueuedUnit]) -> str:
    """A lane message carrying ``units`` (swarm.core.lanes.Bundle): one unit's message as
    :func:`message_body` writes it; several as ``{"run_id", "tenant", "lane", "units": [...]}``,
    each unit's own fields in the list."""
    if len(units) == 1:
        return message_body(units[0])
    if not units:
        raise InvalidInput("units", "a lane message carries at least one unit")
    first = queued_to_doc(units[0])
    shared = {name: first[name] for name in _BUNDLE_SHARED}
    docs = []
    for unit in units:
        doc = queued_to_doc(unit)
        if any(doc[name] != shared[name] for name in _BUNDLE_SHARED):
            raise InvalidInput("units", "a bundle's units share their run, tenant and lane")
        docs.append({k: v for k, v in doc.items() if k not in _BUNDLE_SHARED})
    return json.dumps({**shared, "units": docs}, separators=(",", ":"))


def bundle_size(units: Sequence[QueuedUnit]) -> int:
    """The bytes of the lane message carrying ``units``."""
    return len(bundle_body(units).encode())


def parse_message(body: str) -> tuple[QueuedUnit, ...]:
    """The units of a lane message (one, or a bundle's); a malformed one raises InvalidInput
    naming what is wrong."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as e:
        raise InvalidInput("body", f"not JSON: {e.msg}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("body", "a lane message is a JSON object")
    if "units" not in doc:
        return (queued_from_doc(doc),)
    units = doc["units"]
    if not isinstance(units, list) or not units or not all(isinstance(u, dict) for u in units):
        raise InvalidInput("units", "a bundle's units are a non-empty list of objects")
    shared = {name: doc[name] for name in _BUNDLE_SHARED if name in doc}
    return tuple(queued_from_doc({**unit, **shared}) for unit in units)


def parse_message_body(body: str) -> QueuedUnit:
    """A lane message of one unit; a malformed one, or a bundle, raises InvalidInput naming
    what is wrong."""
    units = parse_message(body)
    if len(units) != 1:
        raise InvalidInput("body", f"a bundle of {len(units)} units, not one unit's message")
    return units[0]
