"""In-memory implementations of the service ports, for unit tests and the simulator-style runs."""

from __future__ import annotations

import copy
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from swarm.core.errors import NotFound
from swarm.core.lanes import QueuedUnit
from swarm.core.model import LANES, Lane
from swarm.service.ports import LaneDepth, MappingState


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

    def start(self, name: str, payload: Mapping[str, Any]) -> bool:
        if name in self.started:
            return False
        self.started[name] = copy.deepcopy(dict(payload))
        return True


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
