"""A chunk of the manifest through the fan-out function on moto, with its role: one invocation
admits every unit of the chunk and sends them with SendMessageBatch, ten messages per request (a
message: a unit, or a bundle of units due together); the entries SQS fails are sent again."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from moto.dynamodb.models import DynamoDBBackend
from moto.sqs.models import SQSBackend

from swarm.contract import BUNDLE_MAX_WINDOW_SECONDS, BUNDLE_UNITS, GOVERNOR_TABLE_NAME
from swarm.core.codec import parse_message
from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane, UnitState
from swarm.service.batches import manifest_key, manifest_units
from swarm.wiring import Wiring
from tests.integration.plane import ControlPlane, ledger, units


def _manifest(plane: ControlPlane, batch_id: str) -> list[dict[str, Any]]:
    body = plane.client("s3").get_object(Bucket=plane.bucket, Key=manifest_key(batch_id))["Body"]
    doc: list[dict[str, Any]] = json.loads(body.read())
    return doc


class Batches:
    """Every SendMessageBatch moto serves (its entries' count, and each entry's units and
    delay: an entry is a message, of one unit or a bundle's); the first one fails ``fail`` of
    its entries (as SQS may, SenderFault false) instead of sending them."""

    def __init__(self, fail: int = 0) -> None:
        self.sizes: list[int] = []
        self.entries: list[tuple[tuple[QueuedUnit, ...], int]] = []
        self.fail = fail

    def sent(self) -> list[str]:
        """The units of the entries SQS took (failed ones excluded), in order."""
        failed = set(range(self.fail))
        return [
            item.unit_id
            for n, (items, _) in enumerate(self.entries)
            if n not in failed
            for item in items
        ]

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def send_message_batch(backend: Any, queue_name: str, entries: dict[str, Any]) -> Any:
            self.sizes.append(len(entries))
            self.entries.extend(
                (parse_message(e["MessageBody"]), int(e.get("DelaySeconds") or 0))
                for _, e in sorted(entries.items(), key=lambda kv: int(kv[0]))
            )
            if self.fail and len(self.sizes) == 1:
                keys = sorted(entries)[: self.fail]
                kept = {k: v for k, v in entries.items() if k not in keys}
                messages, failed = original(backend, queue_name, kept)
                failed = [
                    *failed,
                    *(
                        {
                            "Id": entries[k]["Id"],
                            "SenderFault": False,
                            "Code": "InternalError",
                            "Message": "injected",
                        }
                        for k in keys
                    ),
                ]
                return messages, failed
            return original(backend, queue_name, entries)

        return send_message_batch


def _count_batches(monkeypatch: pytest.MonkeyPatch, fail: int = 0) -> Batches:
    counter = Batches(fail)
    monkeypatch.setattr(
        SQSBackend, "send_message_batch", counter.wrap(SQSBackend.send_message_batch)
    )
    return counter


@pytest.mark.parametrize("n", [1, 10, 23, 100])
def test_one_child_admits_a_chunk_and_sends_it_ten_messages_per_request(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    # Given a batch of n units (the deployed units_per_child is 100: one chunk)
    status, doc, _ = plane.api("POST", "/batches", {"units": units(n), "budget": 10**8})
    assert status == 201, doc
    batch_id = doc["batch_id"]
    (chunk,) = _manifest(plane, batch_id)
    assert chunk["run_id"] == batch_id and len(chunk["units"]) == n
    counter = _count_batches(monkeypatch)
    transactions: list[int] = []
    original = DynamoDBBackend.transact_write_items

    def transact(backend: Any, items: list[Any], *args: Any, **kw: Any) -> Any:
        transactions.append(len(items))
        return original(backend, items, *args, **kw)

    monkeypatch.setattr(DynamoDBBackend, "transact_write_items", transact)
    # When the map's one child runs the fan-out function
    (event,) = plane.fan_out_events()
    started = time.monotonic()
    result = plane.invoke("fanout", event)
    took = time.monotonic() - started
    # Then every unit is admitted and sent, its messages (a unit alone, or up to bundle_units
    # due together) in ceil(messages / 10) SendMessageBatch requests
    assert result["counts"] == {"enqueued": n} and len(result["units"]) == n
    messages = len(counter.entries)
    assert counter.sizes == [10] * (messages // 10) + ([messages % 10] if messages % 10 else [])
    most = int(plane.env("fanout")[BUNDLE_UNITS])
    assert all(1 <= len(items) <= most for items, _ in counter.entries)
    assert messages >= math.ceil(n / most)
    # admitted in batches of 99 (one transaction of the books and 99 units each)
    assert transactions == [1 + k for k in ([99] * (n // 99) + ([n % 99] if n % 99 else []))]
    # every unit sent once (those whose place is a few seconds away delayed: see below)
    assert sorted(counter.sent()) == sorted(u["unit_id"] for u in chunk["units"])
    run = ledger(plane).run(batch_id)
    assert run.in_flight == n and run.reserved == sum(u["projected_tokens"] for u in units(n))
    # (with the function's role, IAM enforced: SendMessageBatch is authorized as SendMessage)
    # well within the function's timeout on this emulator (measured: see docs/explanation/scale.md)
    assert took < 60, took


def test_failed_entries_of_a_batch_are_sent_again(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a batch of at least four messages (a message carries up to bundle_units units)
    n = 3 * int(plane.env("fanout")[BUNDLE_UNITS]) + 2
    status, doc, _ = plane.api("POST", "/batches", {"units": units(n), "budget": 10**8})
    assert status == 201, doc
    batch_id = doc["batch_id"]
    # Given SQS fails 3 entries of the first SendMessageBatch (not the sender's fault)
    counter = _count_batches(monkeypatch, fail=3)
    (event,) = plane.fan_out_events()
    result = plane.invoke("fanout", event)
    # Then those 3 are sent again in a request of their own, and every unit is on its lane once
    assert result["counts"] == {"enqueued": n}
    assert counter.sizes[0] >= 3 and counter.sizes[1:] == [3]
    sent = counter.sent()
    assert sorted(sent) == sorted(u["unit_id"] for u in units(n)) and len(set(sent)) == n
    assert all(u.state is UnitState.IN_FLIGHT for u in ledger(plane).units(batch_id))


def test_a_chunk_retried_whole_admits_nothing_twice(plane: ControlPlane) -> None:
    status, doc, _ = plane.api("POST", "/batches", {"units": units(12), "budget": 10**8})
    assert status == 201, doc
    batch_id = doc["batch_id"]
    (event,) = plane.fan_out_events()
    plane.invoke("fanout", event)
    reserved = ledger(plane).run(batch_id).reserved
    # a Step Functions retry of the same item (e.g. its first answer was lost)
    again = plane.invoke("fanout", event)
    assert again["counts"] == {"enqueued": 12}
    assert ledger(plane).run(batch_id).reserved == reserved
    assert len(manifest_units(_manifest(plane, batch_id))) == 12


def test_the_fan_out_books_each_units_place_and_sends_it_for_when_its_tokens_are_there(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reserved lane's units take their places in their tenant's queue at the fan-out, one
    write for the chunk, instead of each coming once to its lane to take it: each is sent with
    its place, delayed until the place is ready (docs/explanation/governor.md)."""
    # Given a batch of 30 units of ~10,000 tokens on the normal lane (5% reserve), a bucket a
    # worker has created (empty) refilling at 95,000 tokens/s
    status, doc, _ = plane.api("POST", "/batches", {"units": units(30), "budget": 10**8})
    assert status == 201, doc
    with plane.running("worker"):
        Wiring.from_env().dynamodb_governor().create(time.time())
    counter = _count_batches(monkeypatch)
    writes: list[str] = []
    original = DynamoDBBackend.update_item

    def update_item(backend: Any, table_name: str, *args: Any, **kw: Any) -> Any:
        writes.append(table_name)
        return original(backend, table_name, *args, **kw)

    monkeypatch.setattr(DynamoDBBackend, "update_item", update_item)
    # When the chunk is fanned out
    (event,) = plane.fan_out_events()
    assert plane.invoke("fanout", event)["counts"] == {"enqueued": 30}
    # Then the 30 places took one write of the governor's table
    assert writes.count(plane.env("fanout")[GOVERNOR_TABLE_NAME]) == 1
    # and each unit went with its place, bound to its attempt, in the fan-out's order
    sent = [(item, delay) for items, delay in counter.entries for item in items]
    (chunk,) = _manifest(plane, doc["batch_id"])  # largest first
    assert [item.unit_id for item, _ in sent] == [u["unit_id"] for u in chunk["units"]]
    tickets = [item.ticket for item, _ in sent]
    assert all(
        t is not None and t.slot and t.tag == str(item.attempt)
        for (item, _), t in zip(sent, tickets, strict=True)
    )
    # one after the other in the tenant's queue, each its own tokens further (one tenant)
    positions = [t.position for t in tickets if t is not None]
    steps = [b - a for a, b in itertools.pairwise(positions)]
    assert steps == [item.tokens for item, _ in sent[1:]]
    # units due within the bundling window of each other went as one message, delayed until
    # the last one's place is ready (the whole second after), or at once if every place of it
    # is ready within the second the worker holds on for; never before a place is ready, and
    # never the longest window later
    window = float(plane.env("fanout")[BUNDLE_MAX_WINDOW_SECONDS])
    for items, delay in counter.entries:
        waits = [i.ticket.ready_at - i.ticket.booked_at for i in items if i.ticket is not None]
        last = max(waits)
        assert delay == (math.ceil(last) if last > 1.0 else 0), (waits, delay)
        assert max(waits) - min(waits) <= window
    assert [d for _, d in sent] == sorted(d for _, d in sent) and sent[-1][1] >= 2
    # and the units it sent at once run on their first try, their places drawn (a unit sent
    # with a second's delay may be visible too by now: its place is ready, so it runs as well)
    at_once = {item.unit_id for item, d in sent if d == 0}
    received: set[str] = set()
    for _ in range(len(at_once)):  # a receive returns at most 10, in no promised order
        if at_once <= received:
            break
        messages = plane.receive(Lane.NORMAL)
        received |= {q.unit_id for m in messages for q in parse_message(m["Body"])}
        plane.deliver(Lane.NORMAL, messages)
    assert at_once <= received
    batch = ledger(plane).units(doc["batch_id"])
    assert {u.unit_id for u in batch if u.state is UnitState.COMPLETED} == received
