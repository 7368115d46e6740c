"""The local emulator's fair receive: tenants (message groups) interleave, the least busy first."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from swarm.local.patches.emulator import fair_order


@dataclass
class Message:
    id: str
    group_id: str | None


def ids(messages: list[Message]) -> list[str]:
    return [m.id for m in messages]


def test_a_small_tenant_behind_a_flood_is_served_next() -> None:
    flood = [Message(f"big-{i}", "big") for i in range(5)]
    small = [Message("small-0", "small"), Message("small-1", "small")]
    order = fair_order([*flood, *small], Counter())
    assert ids(order)[:4] == ["big-0", "small-0", "big-1", "small-1"]


def test_tenants_with_work_in_flight_wait_behind_idle_ones() -> None:
    messages = [Message("big-0", "big"), Message("big-1", "big"), Message("small-0", "small")]
    order = fair_order(messages, Counter({"big": 3}))
    assert ids(order) == ["small-0", "big-0", "big-1"]


def test_one_tenant_keeps_send_order_and_ungrouped_messages_form_one_group() -> None:
    messages = [Message(str(i), None) for i in range(4)]
    assert ids(fair_order(messages, Counter())) == ["0", "1", "2", "3"]
