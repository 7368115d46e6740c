"""The drain controller: the workers' event source mappings follow the drain parameter, and the
view operators read before a deploy (``safe_to_deploy``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from swarm.core.ports import DrainSwitch, LaneQueue, Mappings, MappingState


@dataclass
class DrainController:
    switch: DrainSwitch
    mappings: Mappings
    queue: LaneQueue

    def apply(self) -> dict[str, Any]:
        """Make the event source mappings follow the parameter (exact read, no cache)."""
        draining = self.switch.draining(fresh=True)
        states = self.mappings.set_enabled(not draining)
        return self._report(draining, states)

    def status(self) -> dict[str, Any]:
        return self._report(self.switch.draining(fresh=True), self.mappings.states())

    def _report(self, draining: bool, states: list[MappingState]) -> dict[str, Any]:
        depths = self.queue.depths()
        in_flight = sum(d.in_flight for d in depths.values())
        stopped = all(not s.enabled for s in states)
        return {
            "draining": draining,
            "mappings": {s.lane.value: s.state for s in states},
            "in_flight": in_flight,
            "queued": sum(d.queued for d in depths.values()),
            "safe_to_deploy": draining and stopped and in_flight == 0,
        }
