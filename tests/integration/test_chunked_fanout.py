"""A chunk of the manifest through the fan-out function on moto, with its role: one invocation
admits every unit of the chunk and sends them with SendMessageBatch, ten per request; the
entries SQS fails are sent again."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from moto.dynamodb.models import DynamoDBBackend
from moto.sqs.models import SQSBackend

from swarm.core.codec import parse_message_body
from swarm.core.records import Lane, UnitState
from swarm.service.batches import manifest_key, manifest_units
from tests.integration.plane import ControlPlane, ledger, units


def _manifest(plane: ControlPlane, batch_id: str) -> list[dict[str, Any]]:
    body = plane.client("s3").get_object(Bucket=plane.bucket, Key=manifest_key(batch_id))["Body"]
    doc: list[dict[str, Any]] = json.loads(body.read())
    return doc


def _all_messages(plane: ControlPlane, lane: Lane = Lane.NORMAL) -> list[str]:
    seen: list[str] = []
    while batch := plane.receive(lane):
        seen.extend(parse_message_body(m["Body"]).unit_id for m in batch)
    return seen


class Batches:
    """Every SendMessageBatch moto serves (its entries' count); the first one fails ``fail``
    of its entries (as SQS may, SenderFault false) instead of sending them."""

    def __init__(self, fail: int = 0) -> None:
        self.sizes: list[int] = []
        self.fail = fail

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def send_message_batch(backend: Any, queue_name: str, entries: dict[str, Any]) -> Any:
            self.sizes.append(len(entries))
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
def test_one_child_admits_a_chunk_and_sends_it_ten_per_request(
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
    # Then every unit is admitted and sent, in ceil(n / 10) SendMessageBatch requests
    assert result["counts"] == {"enqueued": n} and len(result["units"]) == n
    assert counter.sizes == [10] * (n // 10) + ([n % 10] if n % 10 else [])
    assert len(counter.sizes) == math.ceil(n / 10)
    # admitted in batches of 99 (one transaction of the books and 99 units each)
    assert transactions == [1 + k for k in ([99] * (n // 99) + ([n % 99] if n % 99 else []))]
    assert sorted(_all_messages(plane)) == sorted(u["unit_id"] for u in chunk["units"])
    run = ledger(plane).run(batch_id)
    assert run.in_flight == n and run.reserved == sum(u["projected_tokens"] for u in units(n))
    # (with the function's role, IAM enforced: SendMessageBatch is authorized as SendMessage)
    # well within the function's timeout on this emulator (measured: see docs/scale.md)
    assert took < 60, took


def test_failed_entries_of_a_batch_are_sent_again(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, doc, _ = plane.api("POST", "/batches", {"units": units(14), "budget": 10**8})
    assert status == 201, doc
    batch_id = doc["batch_id"]
    # Given SQS fails 3 entries of the first SendMessageBatch (not the sender's fault)
    counter = _count_batches(monkeypatch, fail=3)
    (event,) = plane.fan_out_events()
    result = plane.invoke("fanout", event)
    # Then those 3 are sent again in a request of their own, and every unit is on its lane once
    assert result["counts"] == {"enqueued": 14}
    assert counter.sizes == [10, 3, 4]
    sent = _all_messages(plane)
    assert sorted(sent) == sorted(u["unit_id"] for u in units(14)) and len(set(sent)) == 14
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
