"""Priority lanes with per-tenant fairness: which queued unit runs next.

Lanes are served strictly by priority (high, normal, low). Inside a lane, the ``fifo`` policy
serves units in arrival order (Lab 6.1); the ``fair`` policy serves tenants round-robin, so a
tenant that dumps ten thousand units does not starve a tenant with ten. On AWS the same roles are
played by one SQS queue per lane, the event source mappings' per-lane concurrency, and SQS fair
queues keyed by tenant (``MessageGroupId``).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from swarm.core.errors import InvalidInput
from swarm.core.records import LANES, Lane


class Policy(StrEnum):
    FIFO = "fifo"
    FAIR = "fair"

    @classmethod
    def parse(cls, value: str) -> Policy:
        try:
            return cls(value)
        except ValueError:
            raise InvalidInput("policy", f"{value!r} is not a policy; use fifo or fair") from None


@dataclass(frozen=True)
class QueuedUnit:
    """A queue message: which attempt of which unit, for which tenant, on which lane."""

    run_id: str
    unit_id: str
    tenant: str
    lane: Lane
    attempt: int
    tokens: int  # the projected cost: what the governor is asked for
    input: str = ""  # the unit's input for the model (the prompt); empty in the simulator


class Lanes(Protocol):
    def push(self, item: QueuedUnit) -> None: ...

    def peek(self) -> QueuedUnit | None: ...

    def pop(self) -> QueuedUnit: ...

    def remove(self, run_id: str, unit_ids: set[str]) -> int: ...

    def depth(self, lane: Lane | None = None) -> int: ...


class _Lane:
    """One lane: a FIFO per tenant and a rotation of tenants (one tenant = plain FIFO)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.fifo: deque[QueuedUnit] = deque()
        self.tenants: OrderedDict[str, deque[QueuedUnit]] = OrderedDict()

    def __len__(self) -> int:
        if self.policy is Policy.FIFO:
            return len(self.fifo)
        return sum(len(q) for q in self.tenants.values())

    def push(self, item: QueuedUnit) -> None:
        if self.policy is Policy.FIFO:
            self.fifo.append(item)
        else:
            self.tenants.setdefault(item.tenant, deque()).append(item)

    def peek(self) -> QueuedUnit | None:
        if self.policy is Policy.FIFO:
            return self.fifo[0] if self.fifo else None
        for queue in self.tenants.values():
            return queue[0]
        return None

    def pop(self) -> QueuedUnit:
        if self.policy is Policy.FIFO:
            return self.fifo.popleft()
        tenant, queue = next(iter(self.tenants.items()))
        item = queue.popleft()
        del self.tenants[tenant]
        if queue:  # the tenant goes to the back of the rotation
            self.tenants[tenant] = queue
        return item

    def items(self) -> Iterator[QueuedUnit]:
        if self.policy is Policy.FIFO:
            yield from self.fifo
        else:
            for queue in self.tenants.values():
                yield from queue

    def remove(self, run_id: str, unit_ids: set[str]) -> int:
        def keep(q: QueuedUnit) -> bool:
            return not (q.run_id == run_id and q.unit_id in unit_ids)

        before = len(self)
        if self.policy is Policy.FIFO:
            self.fifo = deque(q for q in self.fifo if keep(q))
        else:
            for tenant in list(self.tenants):
                kept = deque(q for q in self.tenants[tenant] if keep(q))
                if kept:
                    self.tenants[tenant] = kept
                else:
                    del self.tenants[tenant]
        return before - len(self)


class InMemoryLanes:
    """Strict priority across lanes; ``policy`` inside each lane."""

    def __init__(self, policy: Policy = Policy.FIFO) -> None:
        self.policy = policy
        self._lanes = {lane: _Lane(policy) for lane in LANES}

    def push(self, item: QueuedUnit) -> None:
        self._lanes[item.lane].push(item)

    def peek(self) -> QueuedUnit | None:
        for lane in LANES:
            item = self._lanes[lane].peek()
            if item is not None:
                return item
        return None

    def pop(self) -> QueuedUnit:
        for lane in LANES:
            if len(self._lanes[lane]):
                return self._lanes[lane].pop()
        raise IndexError("pop from empty lanes")

    def remove(self, run_id: str, unit_ids: set[str]) -> int:
        return sum(self._lanes[lane].remove(run_id, unit_ids) for lane in LANES)

    def depth(self, lane: Lane | None = None) -> int:
        if lane is not None:
            return len(self._lanes[lane])
        return sum(len(q) for q in self._lanes.values())

    def items(self) -> list[QueuedUnit]:
        """Every queued unit in service order per lane (used to save simulator state)."""
        return [item for lane in LANES for item in self._lanes[lane].items()]
