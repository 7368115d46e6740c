"""GET /batches/{id}/approvals a page at a time (Gates.waiting on the in-memory ledger): the
pages list every waiting call once, in the lease index's order (the longest waiting unit first),
a unit's calls never split; a page stops at ``limit`` parked units, before the unit that would
take its answer past MAX_RESULTS_PAGE_BYTES, and after its read budget; a token of another
batch, or a made-up one, is refused naming ``next_token``."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from swarm.api.models import MAX_RESULTS_PAGE_BYTES, response_bytes
from swarm.client import Client
from swarm.core import agent
from swarm.core.errors import InvalidInput
from swarm.core.memory import InMemoryLedger, MemoryBlobs, MemoryQueue
from swarm.core.ports import LeaseKey
from swarm.core.records import Lane, RunRecord, RunSpec, UnitSpec
from swarm.service.approvals import Gates, decode_token, encode_token

TIMEOUT_S = 3_600.0


def plane(units: int) -> tuple[InMemoryLedger, Gates]:
    ledger = InMemoryLedger()
    ledger.open_run(
        RunSpec(
            run_id="b-1",
            tenant="acme",
            lane=Lane.NORMAL,
            budget=10_000_000,
            units=tuple(UnitSpec(f"u{i:02d}", 1_000) for i in range(units)),
        ),
        now=0.0,
    )
    ledger.open_run(RunSpec("b-2", "acme", Lane.NORMAL, 10_000, (UnitSpec("u00", 1_000),)), now=0.0)
    gates = Gates(ledger, MemoryQueue(), MemoryBlobs(), lease_s=60.0)
    return ledger, gates


def park(
    ledger: InMemoryLedger, unit_id: str, at: float, calls: int = 1, given: Any = None
) -> list[str]:
    """Park ``unit_id`` at ``at`` with ``calls`` gated calls of one turn: their toolUseIds."""
    ledger.admit("b-1", unit_id, 0, now=at, lease_s=60.0)
    ledger.claim("b-1", unit_id, 0, now=at, lease_s=60.0, loop=True)
    uses = [f"t-{unit_id}-{i}" for i in range(calls)]
    content: list[dict[str, Any]] = [
        {"toolUse": {"toolUseId": u, "name": "notes_write", "input": given or {"n": u}}}
        for u in uses
    ]
    response = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 10, "outputTokens": 5},
    }
    log = [
        {"type": "turn_started", "turn": 1, "drawn": 100, "at": at},
        agent.model_turn(1, response, 0.1, at),
    ]
    ledger.append_log("b-1", unit_id, 0, log)
    asked = [
        agent.approval_requested(
            agent.ToolCall(1, u, "notes_write", given or {"n": u}, f"b-1/{unit_id}/{u}"), at
        )
        for u in uses
    ]
    ledger.park("b-1", unit_id, 0, at, at + TIMEOUT_S, [(2 + i, e) for i, e in enumerate(asked)])
    return uses


def pages(gates: Gates, run: RunRecord, limit: int, now: float) -> list[list[dict[str, Any]]]:
    out, token = [], None
    while True:
        waiting, token = gates.waiting(run, now, limit, token)
        out.append(waiting)
        if token is None:
            return out


def test_pages_list_every_waiting_call_once_in_lease_order_never_splitting_a_unit() -> None:
    ledger, gates = plane(8)
    # Given units parked at different times (u05 first: it waits longest), some with several
    # waiting calls, and u01 in flight (the lease index lists it too), u07 never admitted
    order = ["u05", "u02", "u00", "u06", "u03", "u04"]
    calls = {"u05": 3, "u02": 1, "u00": 2, "u06": 1, "u03": 2, "u04": 1}
    uses = {u: park(ledger, u, at=10.0 * i, calls=calls[u]) for i, u in enumerate(order)}
    ledger.admit("b-1", "u01", 0, now=15.0, lease_s=60.0)
    run = ledger.run("b-1")
    everything, last = gates.waiting(run, 100.0, limit=1_000)
    assert last is None
    expected = [(u, t) for u in order for t in uses[u]]
    assert [(w["unit_id"], w["toolUseId"]) for w in everything] == expected
    for limit in (1, 2, 4, 6):
        # When the listing is read `limit` parked units a page
        got = pages(gates, run, limit, now=100.0)
        # Then the pages hold every call once, in the same order, each page `limit` units (a
        # unit's calls all on one page), the last page marked by a null token
        assert [(w["unit_id"], w["toolUseId"]) for p in got for w in p] == expected
        assert [len({w["unit_id"] for w in p}) for p in got[:-1]] == [limit] * (len(got) - 1)
        assert len({w["unit_id"] for w in got[-1]}) <= limit
        units_per_page = [[w["unit_id"] for w in p] for p in got]
        for i, page in enumerate(units_per_page):
            later = {u for p in units_per_page[i + 1 :] for u in p}
            assert not set(page) & later, f"a unit's calls split across pages at page {i}"
    # and a call asked 90 s ago has waited 90 s
    assert everything[0]["waited_s"] == 100.0 and everything[-1]["waited_s"] == 50.0


def test_a_page_stops_before_the_unit_that_would_pass_the_byte_bound() -> None:
    ledger, gates = plane(10)
    # Given ten parked units, each asking one call whose input is a string of quotes: as
    # Lambda's response carries it (the body JSON-escaped in the response's JSON), each quote
    # is four bytes, so each call is a little over 1/9 of the bound (a log item holds it)
    big = {"text": '"' * (MAX_RESULTS_PAGE_BYTES // 34)}
    for i in range(10):
        park(ledger, f"u{i:02d}", at=float(i), given=big)
    run = ledger.run("b-1")
    # When the first page is asked for all of them
    first, token = gates.waiting(run, 20.0, limit=1_000)
    # Then it carries the eight units that fit the bound, and the token goes on with the next
    assert [w["unit_id"] for w in first] == [f"u{i:02d}" for i in range(8)]
    assert sum(response_bytes(w) for w in first) <= MAX_RESULTS_PAGE_BYTES
    assert token is not None
    second, token = gates.waiting(run, 20.0, limit=1_000, next_token=token)
    assert [w["unit_id"] for w in second] == ["u08", "u09"] and token is None


def test_a_page_stops_when_its_time_is_up_and_the_token_goes_on() -> None:
    ledger, gates = plane(3)
    for i in range(3):
        park(ledger, f"u{i:02d}", at=float(i))
    run = ledger.run("b-1")
    # the caller's time runs out after the first unit: the page carries it, the token the rest
    first, token = gates.waiting(run, 10.0, limit=10, keep_going=lambda: False)
    assert [w["unit_id"] for w in first] == ["u00"] and token is not None
    rest, token = gates.waiting(run, 10.0, limit=10, next_token=token)
    assert [w["unit_id"] for w in rest] == ["u01", "u02"] and token is None


def test_a_page_stops_after_its_read_budget_and_the_token_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("swarm.service.approvals.LOOK_BUDGET", 3)
    ledger, gates = plane(6)
    # Given three units in flight whose leases come first in the index, then three parked
    for i in range(3):
        ledger.admit("b-1", f"u{i:02d}", 0, now=0.0, lease_s=60.0)
    for i in range(3, 6):
        park(ledger, f"u{i:02d}", at=float(i))
    run = ledger.run("b-1")
    # When a page is asked for: it reads three index entries, all in flight, and stops
    first, token = gates.waiting(run, 10.0, limit=10)
    # Then it holds no call yet, and its token goes on where it stopped
    assert first == [] and token is not None
    second, token = gates.waiting(run, 10.0, limit=10, next_token=token)
    assert [w["unit_id"] for w in second] == ["u03", "u04", "u05"] and token is None


def test_an_extra_field_is_added_to_each_call() -> None:
    ledger, gates = plane(1)
    park(ledger, "u00", at=0.0, calls=2)
    waiting, _ = gates.waiting(ledger.run("b-1"), 1.0, extra=lambda c: {"deciders": c["tool"]})
    assert [w["deciders"] for w in waiting] == ["notes_write", "notes_write"]


def test_no_parked_unit_is_one_empty_last_page() -> None:
    ledger, gates = plane(2)
    ledger.admit("b-1", "u00", 0, now=0.0, lease_s=60.0)  # in flight, listed by the index
    assert gates.waiting(ledger.run("b-1"), 1.0, limit=1) == ([], None)


def test_the_next_timeout_is_the_first_parked_units_lease() -> None:
    ledger, gates = plane(3)
    ledger.admit("b-1", "u02", 0, now=0.0, lease_s=60.0)  # in flight: its lease comes first
    park(ledger, "u01", at=5.0)
    park(ledger, "u00", at=9.0)
    assert gates.next_timeout("b-1", 10.0) == 5.0 + TIMEOUT_S
    assert gates.next_timeout("b-2", 10.0) is None


@pytest.mark.parametrize(
    "token",
    [
        "nope!",  # not base64
        base64.urlsafe_b64encode(b"not json").decode(),
        base64.urlsafe_b64encode(b'{"b":"b-1","l":"x","u":"u00"}').decode(),  # lease not a number
        base64.urlsafe_b64encode(b'{"b":"b-1","l":1.0}').decode(),  # no unit
        base64.urlsafe_b64encode(b'{"b":"b-1","l":1.0,"u":"a/b"}').decode(),  # not a unit id
        base64.urlsafe_b64encode(b"[1]").decode(),
    ],
)
def test_a_malformed_token_is_refused_naming_next_token(token: str) -> None:
    with pytest.raises(InvalidInput, match="next_token: is not a token this API gave"):
        decode_token("b-1", token)


def test_a_token_of_another_batch_is_refused_naming_next_token() -> None:
    ledger, gates = plane(3)
    for i in range(3):
        park(ledger, f"u{i:02d}", at=float(i))
    _, token = gates.waiting(ledger.run("b-1"), 10.0, limit=1)
    assert token is not None
    with pytest.raises(InvalidInput, match=r"next_token: is a token of another batch \(b-1\)"):
        gates.waiting(ledger.run("b-2"), 10.0, limit=1, next_token=token)


def test_a_token_round_trips_its_position() -> None:
    key = LeaseKey(1_765_000_000.123456, "unit-7")
    assert decode_token("b-1", encode_token("b-1", key)) == key


def test_the_client_follows_every_page_into_one_answer() -> None:
    pages_by_token = {
        None: {"batch_id": "b-1", "waiting": [{"unit_id": "u0"}], "next_token": "A"},
        "A": {"batch_id": "b-1", "waiting": [], "next_token": "B"},  # a page of in-flight units
        "B": {"batch_id": "b-1", "waiting": [{"unit_id": "u1"}, {"unit_id": "u1"}]},
    }
    asked: list[dict[str, list[str]]] = []

    def request(method: str, path: str, *args: Any, **kwargs: Any) -> tuple[int, Any]:
        assert method == "GET" and urlsplit(path).path == "/batches/b-1/approvals"
        query = parse_qs(urlsplit(path).query)
        asked.append(query)
        return 200, pages_by_token[query.get("next_token", [None])[0]]

    client = Client.__new__(Client)
    client.request = request  # type: ignore[method-assign]
    doc = client.approvals("b-1")
    assert [w["unit_id"] for w in doc["waiting"]] == ["u0", "u1", "u1"]
    assert doc["next_token"] is None and len(asked) == 3
    assert [q.get("next_token") for q in asked] == [None, ["A"], ["B"]]
