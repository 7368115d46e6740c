"""The local emulator's fair receive: tenants (message groups) interleave, the least busy first;
and the pollers' receipts, by which the e2e fairness scenario judges it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from swarm.core.codec import bundle_body, message_body
from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane
from swarm.local.patches.emulator import fair_order
from swarm.local.poller import Receipts


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


def test_the_pollers_receipts_name_each_unit_of_a_message_once_per_delivery() -> None:
    one = QueuedUnit("b-1", "u-1", "acme", Lane.NORMAL, 1, 100, "x")
    bundled = [QueuedUnit("b-1", f"u-{i}", "acme", Lane.NORMAL, 1, 100, "x") for i in (2, 3)]
    other_batch = QueuedUnit("b-2", "u-1", "acme", Lane.NORMAL, 1, 100, "x")
    receipts = Receipts()
    first = [{"Body": message_body(one)}, {"Body": bundle_body(bundled)}, {"Body": "not ours"}]
    receipts.note(first, 10.0)
    receipts.note([{"Body": message_body(one)}, {"Body": message_body(other_batch)}], 12.5)
    assert receipts.of_run("b-1") == {"u-1": [10.0, 12.5], "u-2": [10.0], "u-3": [10.0]}
    assert receipts.of_run("b-2") == {"u-1": [12.5]}
    assert receipts.of_run("b-3") == {}
