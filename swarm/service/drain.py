"""Draining for a deploy: the one ``safe_to_deploy`` rule, the drain view built on it, and the
drain controller (the workers' event source mappings follow the drain parameter)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swarm.api.models import Drain
from swarm.core.ports import DrainState, DrainSwitch, LaneDepth, LaneQueue, Mappings, MappingState
from swarm.core.records import Lane


def safe_to_deploy(
    draining: bool, in_flight: int, mappings: Sequence[MappingState] | None, settled: bool = True
) -> bool:
    """The drain switch is on and has reached every reader's cache (``settled``: the functions
    read it cached for a few seconds, see swarm.adapters.aws.SsmDrainSwitch), nothing is in
    flight on any lane, and every worker event source mapping is stopped.

    ``mappings`` is None for a caller that cannot see the mappings (the API's role may not read
    them): the answer then rests on the switch and the lanes' in-flight count alone. The switch
    is what turns the mappings off (the drain controller runs on every change of it), and a
    worker handed a message while the switch is on runs nothing and hands it back.
    """
    stopped = mappings is None or all(not s.enabled for s in mappings)
    return draining and settled and stopped and in_flight == 0


def drain_view(
    switch: DrainState,
    depths: Mapping[Lane, LaneDepth],
    mappings: Sequence[MappingState] | None,
    now: float,
) -> dict[str, Any]:
    """The view operators read before a deploy (:class:`swarm.api.models.Drain`), with the
    mappings' states by lane when the caller can see them."""
    in_flight = sum(d.in_flight for d in depths.values())
    settled = switch.settled(now)
    doc = Drain(
        draining=switch.on,
        settled=settled,
        in_flight=in_flight,
        queued=sum(d.queued for d in depths.values()),
        safe_to_deploy=safe_to_deploy(switch.on, in_flight, mappings, settled),
    ).model_dump(mode="json")
    if mappings is not None:
        doc["mappings"] = {s.lane.value: s.state for s in mappings}
    return doc


@dataclass
class DrainController:
    switch: DrainSwitch
    mappings: Mappings
    queue: LaneQueue

    def apply(self, now: float) -> dict[str, Any]:
        """Make the event source mappings follow the parameter (exact read, no cache)."""
        switch = self.switch.state()
        states = self.mappings.set_enabled(not switch.on)
        return drain_view(switch, self.queue.depths(), states, now)

    def status(self, now: float) -> dict[str, Any]:
        return drain_view(self.switch.state(), self.queue.depths(), self.mappings.states(), now)
