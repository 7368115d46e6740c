"""Priority lanes with per-tenant fairness: which queued unit runs next.

Lanes are served strictly by priority (high, normal, low). Inside a lane, the ``fifo`` policy
serves units in arrival order (Lab 6.1); the ``fair`` policy serves tenants round-robin, so a
tenant that dumps ten thousand units does not starve a tenant with ten. On AWS the same roles are
played by one SQS queue per lane, the event source mappings' per-lane concurrency, and SQS fair
queues keyed by tenant (``MessageGroupId``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from swarm.core.errors import InvalidInput
from swarm.core.governor import Ticket
from swarm.core.prompts import Prompt
from swarm.core.records import Lane


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
    #: the unit's input for the model (swarm.core.prompts): a prompt text or a Converse-shaped
    #: request; empty in the simulator
    input: Prompt = ""
    #: tokens the governor booked for this attempt on an earlier try (docs/governor.md)
    ticket: Ticket | None = None
