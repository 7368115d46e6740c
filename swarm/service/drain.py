"""Draining for a deploy: the one ``safe_to_deploy`` rule, the drain view built on it, and the
drain controller (the workers' event source mappings follow the drain parameter)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from swarm.api.models import Drain
from swarm.core.ports import (
    DrainState,
    DrainSwitch,
    LaneDepth,
    LaneQueue,
    Mappings,
    MappingState,
    RunningUnits,
    RunningWork,
)
from swarm.core.records import Lane


def safe_to_deploy(
    draining: bool, running: int, mappings: Sequence[MappingState] | None, settled: bool = True
) -> bool:
    """The drain switch is on and has reached every reader's cache (``settled``: the functions
    read it cached for a few seconds, see swarm.adapters.aws.SsmDrainSwitch), nothing is
    running (``running``: the units of worker invocations in the register of running work,
    :class:`swarm.core.ports.RunningWork`), and every worker event source mapping is stopped.

    Queued work does not count, however deep: visible, delayed and hidden messages (a unit
    deep in its tenant's queue waits hidden for up to 12 hours) stay in their lanes across the
    deploy and run after the drain is off. An invocation enters the register before its first
    claim and after reading the switch (Worker.enter, with a cached read no older than the
    caches' lifetime; the switch settles twice that after its change, leaving an entry being
    written time to land), so once the switch is settled no invocation outside the register
    can claim, and an empty register means no attempt is running.

    ``mappings`` is None for a caller that cannot see the mappings (the API's role may not read
    them): the answer then rests on the switch and the register alone. The switch is what turns
    the mappings off (the drain controller runs on every change of it), and a worker handed a
    message while the switch is on runs nothing and hands it back.
    """
    stopped = mappings is None or all(not s.enabled for s in mappings)
    return draining and settled and stopped and running == 0


def queued_messages(depths: Mapping[Lane, LaneDepth]) -> int:
    """Every message in the lanes: visible, delayed, and not visible (received, or hidden by a
    worker until its unit's turn): queued work, none of it running."""
    return sum(d.visible + d.delayed + d.in_flight for d in depths.values())


def drain_view(
    switch: DrainState,
    depths: Mapping[Lane, LaneDepth],
    running: RunningUnits,
    mappings: Sequence[MappingState] | None,
    now: float,
) -> dict[str, Any]:
    """The view operators read before a deploy (:class:`swarm.api.models.Drain`), with the
    mappings' states by lane when the caller can see them."""
    settled = switch.settled(now)
    doc = Drain(
        draining=switch.on,
        settled=settled,
        running=running.units,
        queued=queued_messages(depths),
        safe_to_deploy=safe_to_deploy(switch.on, running.units, mappings, settled),
    ).model_dump(mode="json")
    if mappings is not None:
        doc["mappings"] = {s.lane.value: s.state for s in mappings}
    return doc


@dataclass
class DrainController:
    switch: DrainSwitch
    mappings: Mappings
    queue: LaneQueue
    running: RunningWork

    def apply(self, now: float) -> dict[str, Any]:
        """Make the event source mappings follow the parameter (exact read, no cache)."""
        switch = self.switch.state()
        states = self.mappings.set_enabled(not switch.on)
        return drain_view(switch, self.queue.depths(), self.running.running(now), states, now)

    def status(self, now: float) -> dict[str, Any]:
        running = self.running.running(now)
        return drain_view(
            self.switch.state(), self.queue.depths(), running, self.mappings.states(), now
        )
