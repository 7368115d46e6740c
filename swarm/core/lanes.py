"""Priority lanes with per-tenant fairness: which queued unit runs next.

Lanes are served strictly by priority (high, normal, low). Inside a lane, the ``fifo`` policy
serves units in arrival order (Lab 6.1); the ``fair`` policy serves tenants round-robin, so a
tenant that dumps ten thousand units does not starve a tenant with ten. On AWS the same roles are
played by one SQS queue per lane, the event source mappings' per-lane concurrency, and SQS fair
queues keyed by tenant (``MessageGroupId``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    #: tokens the governor booked for this attempt on an earlier try (docs/explanation/governor.md)
    ticket: Ticket | None = None
    #: when a worker first found this unit's tools unlisted (an MCP server down: the unit waits
    #: in its lane unclaimed), on the workers' clock; None: they were listed. A unit that waits
    #: longer than ``WorkerTimings.tools_wait_s`` fails (docs/agents.md, "MCP tools")
    tools_down_since: float | None = None


@dataclass(frozen=True)
class Bundle:
    """Units that travel as one lane message, and how long it is delayed.

    Lambda bills a worker invocation's duration and a worker waits for the model, so units that
    reach the model together share an invocation (and its receive, delete and outcome page).
    SQS decides which messages a worker receives together: units due a few seconds apart, each a
    message of its own, reach the workers one by one. A bundle's units are one message, so they
    reach one invocation together, whatever SQS's pollers do. Every unit is of the bundle's run,
    lane and tenant; the message is delayed until its last unit is due."""

    units: tuple[QueuedUnit, ...]
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.units:
            raise InvalidInput("units", "a bundle carries at least one unit")


def bundle(
    items: Sequence[QueuedUnit],
    delays_s: Sequence[float],
    window_s: float,
    max_units: int,
    size: Callable[[Sequence[QueuedUnit]], int] | None = None,
    max_bytes: int | None = None,
    stretch: float = 0.0,
    max_window_s: float | None = None,
) -> list[Bundle]:
    """The units as bundles: those of one run, lane and tenant, in the order they are due, each
    bundle as many units as are due within its window of its first (at most ``max_units``,
    and, with ``size``, at most ``max_bytes`` as a message), delayed until its last is due.

    The window is ``window_s``, or ``stretch`` times the first unit's delay if that is longer,
    but never longer than ``max_window_s`` (when given, at least ``window_s``): a unit deep in a
    queue, which waits long anyway, waits a little more so that more units share its
    invocation. So a unit waits at most ``max(window_s, stretch x its delay)`` more than it
    would alone, and never more than ``max_window_s``; ``max_units`` 1 sends each alone."""
    if len(delays_s) != len(items):
        raise InvalidInput("delays_s", f"{len(delays_s)} delays for {len(items)} items")
    if max_units < 1 or window_s < 0:
        raise InvalidInput(
            "bundle", f"max_units >= 1 and window_s >= 0, not {max_units}, {window_s}"
        )
    if stretch < 0 or (max_window_s is not None and max_window_s < window_s):
        raise InvalidInput(
            "bundle",
            f"stretch >= 0 and max_window_s >= window_s, not {stretch}, {max_window_s}",
        )
    longest = math.inf if max_window_s is None else max_window_s
    groups: dict[tuple[str, Lane, str], list[tuple[float, QueuedUnit]]] = {}
    for item, delay in zip(items, delays_s, strict=True):
        groups.setdefault((item.run_id, item.lane, item.tenant), []).append((max(0.0, delay), item))
    bundles: list[Bundle] = []
    for due in groups.values():
        due.sort(key=lambda d: d[0])  # stable: units due together keep their order
        current: list[QueuedUnit] = []
        first = last = 0.0
        for delay, item in due:
            fits = (
                current
                and len(current) < max_units
                and delay - first <= min(max(window_s, stretch * first), longest)
                and (size is None or max_bytes is None or size([*current, item]) <= max_bytes)
            )
            if current and not fits:
                bundles.append(Bundle(tuple(current), last))
                current = []
            if not current:
                first = delay
            current.append(item)
            last = delay
        if current:
            bundles.append(Bundle(tuple(current), last))
    return bundles


@dataclass(frozen=True)
class Bundling:
    """How units are bundled into lane messages (:func:`bundle`); the default sends each unit
    alone. ``size``: a bundle's message in bytes, bounded by ``max_bytes``; ``stretch`` and
    ``max_window_s``: the window of a bundle whose first unit is deep in a queue."""

    window_s: float = 0.0
    max_units: int = 1
    max_bytes: int | None = None
    size: Callable[[Sequence[QueuedUnit]], int] | None = None
    stretch: float = 0.0
    max_window_s: float | None = None

    def of(self, items: Sequence[QueuedUnit], delays_s: Sequence[float]) -> list[Bundle]:
        return bundle(
            items,
            delays_s,
            self.window_s,
            self.max_units,
            self.size,
            self.max_bytes,
            self.stretch,
            self.max_window_s,
        )
