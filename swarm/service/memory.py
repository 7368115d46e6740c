"""In-memory implementations of the service ports, for unit tests and the simulator-style runs."""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from swarm.core.errors import NotFound
from swarm.core.lanes import QueuedUnit
from swarm.core.ledger import InMemoryLedger
from swarm.core.records import LANES, Lane, RunState
from swarm.service.ports import LaneDepth, MappingState
from swarm.service.sweeper import WatchedRun


@dataclass
class MemoryQueue:
    """Lanes as FIFO deques; ``receive`` hands out messages the way a poller would."""

    lanes: dict[Lane, deque[QueuedUnit]] = field(
        default_factory=lambda: {lane: deque() for lane in LANES}
    )
    delayed: list[tuple[int, QueuedUnit]] = field(default_factory=list)
    in_flight: dict[Lane, int] = field(default_factory=lambda: dict.fromkeys(LANES, 0))
    sent: list[QueuedUnit] = field(default_factory=list)

    def send(self, item: QueuedUnit, delay_s: int = 0) -> None:
        self.sent.append(item)
        if delay_s > 0:
            self.delayed.append((delay_s, item))
        else:
            self.lanes[item.lane].append(item)

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
    objects: dict[str, str] = field(default_factory=dict)

    def put_json(self, key: str, doc: Any) -> None:
        self.objects[key] = json.dumps(doc)

    def get_json(self, key: str) -> Any:
        try:
            return json.loads(self.objects[key])
        except KeyError:
            raise NotFound(f"no object {key!r}") from None

    def exists(self, key: str) -> bool:
        return key in self.objects


@dataclass
class MemoryExecutions:
    started: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: execution name -> status; a started execution is RUNNING until a test says otherwise
    statuses: dict[str, str] = field(default_factory=dict)

    def start(self, name: str, payload: Mapping[str, Any]) -> bool:
        if name in self.started:
            return False
        self.started[name] = copy.deepcopy(dict(payload))
        self.statuses[name] = "RUNNING"
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
        for run in runs:
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

    def draining(self, fresh: bool = False) -> bool:
        return self.on

    def set(self, draining: bool) -> None:
        self.on = draining


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
