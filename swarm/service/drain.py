"""Draining for a deploy: the one ``safe_to_deploy`` rule, the drain view built on it, and the
drain controller (the workers' event source mappings follow the drain parameter)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swarm.api.models import Drain
from swarm.core.ports import DrainSwitch, LaneDepth, LaneQueue, Mappings, MappingState
from swarm.core.records import Lane


def safe_to_deploy(draining: bool, in_flight: int, mappings: Sequence[MappingState] | None) -> bool:
    """The drain switch is on, nothing is in flight on any lane, and every worker event source
    mapping is stopped.

    ``mappings`` is None for a caller that cannot see the mappings (the API's role may not read
    them): the answer then rests on the switch and the lanes' in-flight count alone. The switch
    is what turns the mappings off (the drain controller runs on every change of it), and a
    worker handed a message while the switch is on runs nothing and hands it back.
    """
    stopped = mappings is None or all(not s.enabled for s in mappings)
    return draining and stopped and in_flight == 0


def drain_view(
    draining: bool, depths: Mapping[Lane, LaneDepth], mappings: Sequence[MappingState] | None
) -> dict[str, Any]:
    """The view operators read before a deploy (:class:`swarm.api.models.Drain`), with the
    mappings' states by lane when the caller can see them."""
    in_flight = sum(d.in_flight for d in depths.values())
    doc = Drain(
        draining=draining,
        in_flight=in_flight,
        queued=sum(d.queued for d in depths.values()),
        safe_to_deploy=safe_to_deploy(draining, in_flight, mappings),
    ).model_dump(mode="json")
    if mappings is not None:
        doc["mappings"] = {s.lane.value: s.state for s in mappings}
    return doc


@dataclass
class DrainController:
    switch: DrainSwitch
    mappings: Mappings
    queue: LaneQueue

    def apply(self) -> dict[str, Any]:
        """Make the event source mappings follow the parameter (exact read, no cache)."""
        draining = self.switch.draining(fresh=True)
        states = self.mappings.set_enabled(not draining)
        return drain_view(draining, self.queue.depths(), states)

    def status(self) -> dict[str, Any]:
        draining = self.switch.draining(fresh=True)
        return drain_view(draining, self.queue.depths(), self.mappings.states())
