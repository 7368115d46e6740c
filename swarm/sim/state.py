"""Saving a killed (or finished) simulation to a JSON file and loading it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarm.core import codec
from swarm.core.clock import VirtualClock
from swarm.core.errors import InvalidInput
from swarm.core.files import write_atomically
from swarm.core.lanes import Policy
from swarm.core.memory import InMemoryGovernor, InMemoryLanes, InMemoryLedger
from swarm.core.scheduling import Schedule, ServiceModel
from swarm.sim.engine import FleetConfig, Running, Simulation
from swarm.sim.workload import Workload

FORMAT = "swarm-sim-state/1"


def to_doc(sim: Simulation) -> dict[str, Any]:
    assert sim.lanes is not None and sim.governor is not None
    runs, units, attempts = sim.ledger.records()
    w, f = sim.workload, sim.fleet
    return {
        "format": FORMAT,
        "clock": sim.clock.now(),
        "workload": {
            "units": w.units,
            "min_tokens": w.min_tokens,
            "max_tokens": w.max_tokens,
            "failure_rate": w.failure_rate,
            "seed": w.seed,
            "base_s": w.service.base_s,
            "tokens_per_s": w.service.tokens_per_s,
            "sizes": list(w.sizes),
            "ids": list(w.ids),
        },
        "fleet": {
            "workers": f.workers,
            "quota_tpm": f.quota_tpm,
            "share": f.share,
            "budget": f.budget,
            "max_attempts": f.max_attempts,
            "policy": f.policy.value,
            "schedule": f.schedule.value,
            "horizon_s": f.horizon_s,
        },
        "governor": codec.bucket_to_doc(sim.governor.state),
        "ledger": {
            "runs": [codec.run_to_doc(r) for r in runs],
            "units": [codec.unit_to_doc(u) for u in units],
            "attempts": [codec.attempt_to_doc(a) for a in attempts],
        },
        "lanes": [codec.queued_to_doc(q) for q in sim.lanes.items()],
        "in_flight": [
            {"finish": r.finish, "item": codec.queued_to_doc(r.item)} for r in sim.in_flight
        ],
        "lost_attempts": sim.lost_attempts,
        "waiting": None if sim.waiting is None else codec.queued_to_doc(sim.waiting),
    }


def from_doc(doc: dict[str, Any], workers: int | None = None) -> Simulation:
    if doc.get("format") != FORMAT:
        raise InvalidInput("state", f"not a simulator state file (expected format {FORMAT!r})")
    fleet_doc = dict(doc["fleet"])
    fleet_doc["policy"] = Policy.parse(fleet_doc["policy"])
    # a state file from before the scheduling policies ran the book's schedule
    fleet_doc["schedule"] = Schedule.parse(fleet_doc.get("schedule", Schedule.BOOK.value))
    if workers is not None:
        fleet_doc["workers"] = workers
    fleet = FleetConfig(**fleet_doc)
    clock = VirtualClock(float(doc["clock"]))
    governor = InMemoryGovernor(fleet.governor)
    governor.state = codec.bucket_from_doc(doc["governor"])
    lanes = InMemoryLanes(fleet.policy)
    for item in doc["lanes"]:
        lanes.push(codec.queued_from_doc(item))
    ledger = InMemoryLedger.from_records(
        [codec.run_from_doc(r) for r in doc["ledger"]["runs"]],
        [codec.unit_from_doc(u) for u in doc["ledger"]["units"]],
        [codec.attempt_from_doc(a) for a in doc["ledger"]["attempts"]],
    )
    return Simulation(
        workload=_workload(doc["workload"]),
        fleet=fleet,
        clock=clock,
        ledger=ledger,
        lanes=lanes,
        governor=governor,
        in_flight=[
            Running(int(r["finish"]), codec.queued_from_doc(r["item"])) for r in doc["in_flight"]
        ],
        lost_attempts=int(doc.get("lost_attempts", 0)),
        waiting=None if doc.get("waiting") is None else codec.queued_from_doc(doc["waiting"]),
    )


def _workload(doc: dict[str, Any]) -> Workload:
    w = dict(doc)
    service = ServiceModel(int(w.pop("base_s", 180)), int(w.pop("tokens_per_s", 100)))
    sizes, ids = tuple(w.pop("sizes", ())), tuple(w.pop("ids", ()))
    if sizes:
        return Workload.from_sizes(sizes, ids, w["failure_rate"], w["seed"], service)
    return Workload(**w, service=service, ids=ids)


def save(sim: Simulation, path: Path) -> None:
    """Write atomically: a crash mid-write leaves the previous file, never half a file."""
    write_atomically(Path(path), json.dumps(to_doc(sim)))


def load(path: Path, workers: int | None = None) -> Simulation:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InvalidInput("state", f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidInput(
            "state", f"{path} is not valid JSON ({e.msg} at line {e.lineno})"
        ) from None
    if not isinstance(doc, dict):
        raise InvalidInput("state", f"{path} is not a simulator state file")
    try:
        return from_doc(doc, workers)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, InvalidInput):
            raise
        raise InvalidInput("state", f"{path} is damaged or from another version: {e!r}") from None
