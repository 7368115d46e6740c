"""Agent units on the local stack: loops of model turns calling the shipped tools (Lambda
functions with roles of their own), their workers killed at each of the four points of a turn,
every message delivered twice on top; then every loop completed, no model turn asked or billed
twice, the books exact, and every note written once with the value its recorded call gave. And
the same crash story with BFCL's multi-turn entries on the BFCL toolset's function: every unit's
final backend state equals its ground truth's (BFCL's own state_checker, `swarm judge`)."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import pytest

from swarm.cli.judge import judged
from swarm.cli.ops import bfcl_units, generated_agent_units
from swarm.core.agent_driver import KillPoint
from swarm.core.codec import message_body
from swarm.core.lanes import QueuedUnit
from swarm.core.records import Lane
from tests.e2e.conftest import Stack, fresh_batch, wait_for

POINTS = (
    KillPoint.BEFORE_MODEL_CALL,
    KillPoint.AFTER_MODEL_CALL,
    KillPoint.WHILE_TOOLS,
    KillPoint.BEFORE_SETTLEMENT,
)
UNITS, TURNS = 16, 5
#: BFCL's first entries: their ids put a kill at each of the four points
BFCL_UNITS = 20
TOOLS = ("calculator", "notes_write", "notes_read")
#: a killed worker's units come back after a claim's lease (the local stack's, x10): a few waves
RUN_S = 900.0


def killed_at(unit_id: str) -> KillPoint:
    """The point the local stack's kill hook picks for a unit (swarm.local.functions)."""
    return POINTS[int(hashlib.sha256(unit_id.encode()).hexdigest(), 16) % len(POINTS)]


def killed_in_turn(unit_id: str) -> int:
    """The turn the hook kills it in: its first or second (swarm.local.functions)."""
    return 1 + (int(hashlib.sha256(unit_id.encode()).hexdigest(), 16) // 7) % 2


def bfcl_units_killed_once(count: int) -> list[dict[str, Any]]:
    """BFCL's first ``count`` units whose kill fires: one killed while its tools run, or after
    them before the settlement, needs a tool call in that turn (the scripted model's first
    answer to a user turn calls its ground truth group's tools, the second ends the turn; an
    empty group is answered at once)."""
    from swarm.workloads import bfcl

    entries = bfcl.entries_by_unit()
    kept = []
    for unit in bfcl_units("multi_turn_base", count):
        groups = entries[unit["unit_id"]].ground_truth
        turn = killed_in_turn(unit["unit_id"])
        calls_in = (bool(groups[0]), not groups[0] and len(groups) > 1 and bool(groups[1]))
        after_tools = (KillPoint.WHILE_TOOLS, KillPoint.BEFORE_SETTLEMENT)
        if killed_at(unit["unit_id"]) not in after_tools or calls_in[turn - 1]:
            kept.append(unit)
    return kept


def _send_twice(stack: Stack, bid: str, tenant: str, units: list[dict[str, Any]]) -> None:
    """Every unit's message sent a second time, while the first runs or after it."""
    sqs = stack.aws("sqs")
    lane = next(u for u in sqs.list_queues()["QueueUrls"] if "LanesNormalLane" in u)
    for u in units:
        copy = QueuedUnit(
            bid, u["unit_id"], tenant, Lane.NORMAL, 0, u["projected_tokens"], u["input"]
        )
        sqs.send_message(QueueUrl=lane, MessageBody=message_body(copy))


def _books_exact(client: Any, bid: str, transcripts: dict[str, Any]) -> None:
    """A unit's bill is its turns', the batch's its units', nothing left reserved."""
    results = {r["unit_id"]: r for r in _results(client, bid)}
    for unit_id, t in transcripts.items():
        bills = [turn["billed"] for turn in t["turns"]]
        assert None not in bills and sum(bills) == results[unit_id]["tokens"], unit_id
        for turn in t["turns"]:  # an answered turn is billed what the model counted
            if turn["message"] is not None:
                assert turn["billed"] == sum(turn["usage"].values()), (unit_id, turn["turn"])
    status = client.status(bid)
    assert status["tokens"]["spent"] == sum(r["tokens"] for r in results.values())
    assert status["tokens"]["reserved"] == 0
    assert status["agent"]["turns"] == sum(len(t["turns"]) for t in transcripts.values())


@pytest.mark.lease_wait
def test_bfcl_units_killed_at_every_point_of_a_turn_end_in_their_ground_truth_state(
    stack: Stack,
) -> None:
    tenant, client, key, bid = fresh_batch(stack, "bfcl", "bfcl-kills")
    units = bfcl_units_killed_once(BFCL_UNITS)
    assert set(killed_at(u["unit_id"]) for u in units) == set(POINTS)
    # Given every unit's worker dies once, at one of the four points of a turn, on the BFCL
    # toolset's function (its backends kept per unit in the journals table)
    stack.local("POST", "/_local/faults", {"batch_id": bid, "kill": [p.value for p in POINTS]})
    budget = sum(u["projected_tokens"] for u in units)
    doc = client.submit({"units": units, "budget": budget}, idempotency_key=key)
    assert doc["batch_id"] == bid
    # and every message delivered twice
    _send_twice(stack, bid, tenant, units)
    # When the batch runs to its end
    final = wait_for(client, bid, timeout_s=RUN_S, interval_s=2.0)
    # Then every unit completed, each worker killed once
    assert final["state"] == "completed" and final["counts"]["completed"] == len(units), final
    model = stack.local("GET", f"/_local/model?batch={bid}")
    kills = Counter({KillPoint(p): n for p, n in model["kills"].items()})
    assert set(kills) == set(POINTS) and sum(kills.values()) == len(units), kills
    # and every unit's final backend state, rebuilt from its journal alone, is its ground
    # truth's: no BFCL call run twice or lost (read as the operator, as `swarm judge` does)
    verdicts = list(judged(client, bid, "multi_turn_base"))
    assert [v for v in verdicts if not v["valid"]] == [] and len(verdicts) == len(units)
    # and no turn billed twice: the books are exact
    transcripts = {u["unit_id"]: client.transcript(bid, u["unit_id"]) for u in units}
    _books_exact(client, bid, transcripts)
    lost = [turn for t in transcripts.values() for turn in t["turns"] if turn["lost"]]
    assert len(lost) == kills[KillPoint.BEFORE_MODEL_CALL] + kills[KillPoint.AFTER_MODEL_CALL]
    answered = sum(
        1 for t in transcripts.values() for turn in t["turns"] if turn["message"] is not None
    )
    assert model["calls"] == answered + kills[KillPoint.AFTER_MODEL_CALL]


@pytest.mark.lease_wait
def test_agent_loops_killed_at_every_point_of_a_turn_and_delivered_twice_stay_exact(
    stack: Stack,
) -> None:
    tenant, client, key, bid = fresh_batch(stack, "agents", "agents-kills")
    units = generated_agent_units(UNITS, seed=33, turns=(TURNS, TURNS), tools=TOOLS)
    # the units' ids put a kill at each of the four points (the hook's choice is their hash)
    assert set(killed_at(u["unit_id"]) for u in units) == set(POINTS)
    # Given every unit's worker dies once, at one of the four points of its first or second turn
    stack.local("POST", "/_local/faults", {"batch_id": bid, "kill": [p.value for p in POINTS]})
    doc = client.submit({"units": units, "budget": 10_000_000}, idempotency_key=key)
    assert doc["batch_id"] == bid
    # and every unit's message is delivered a second time, while the first runs or after it
    _send_twice(stack, bid, tenant, units)
    # When the batch runs to its end
    final = wait_for(client, bid, timeout_s=RUN_S, interval_s=2.0)
    # Then every loop completed its turns
    assert final["state"] == "completed" and final["counts"]["completed"] == UNITS, final
    model = stack.local("GET", f"/_local/model?batch={bid}")
    kills = Counter({KillPoint(p): n for p, n in model["kills"].items()})
    assert set(kills) == set(POINTS) and sum(kills.values()) == UNITS, kills
    transcripts = {u["unit_id"]: client.transcript(bid, u["unit_id"]) for u in units}
    for unit_id, t in transcripts.items():
        assert t["stop"] == {"reason": "completed", "detail": ""}, (unit_id, t["stop"])
        answered = [turn for turn in t["turns"] if turn["message"] is not None]
        assert len(answered) == TURNS, unit_id
    # and each turn is billed once: a unit's bill is its turns', the batch's its units'
    _books_exact(client, bid, transcripts)
    # and a call killed after it was made, or before, is billed at its draw, once; every other
    # turn was asked of the model once, duplicates and restarts included
    lost = [turn for t in transcripts.values() for turn in t["turns"] if turn["lost"]]
    assert len(lost) == kills[KillPoint.BEFORE_MODEL_CALL] + kills[KillPoint.AFTER_MODEL_CALL]
    assert all(turn["billed"] == turn["drawn"] for turn in lost)
    answered_turns = sum(
        1 for t in transcripts.values() for turn in t["turns"] if turn["message"] is not None
    )
    assert model["calls"] == answered_turns + kills[KillPoint.AFTER_MODEL_CALL]
    # and every note a recorded call wrote is there once, with that call's value (a call run
    # again after its worker died answered its first outcome: no second effect)
    written = {
        call["input"]["name"]: call["input"]["value"]
        for t in transcripts.values()
        for turn in t["turns"]
        for call in turn["tool_calls"]
        if call["name"] == "notes_write" and call["status"] == "success"
    }
    assert written, "the loops wrote notes"
    assert _notes(stack, tenant) == written


def _results(client: Any, bid: str) -> list[dict[str, Any]]:
    page = client.results(bid, state=None, limit=1000, next_token=None)
    assert "next_token" not in page
    return list(page["units"])


def _notes(stack: Stack, tenant: str) -> dict[str, str]:
    """The tenant's notes as the notes table holds them (its admin's view)."""
    dynamodb = stack.aws("dynamodb")
    table = next(t for t in dynamodb.list_tables()["TableNames"] if "Notes" in t)
    notes: dict[str, str] = {}
    pages = dynamodb.get_paginator("query").paginate(
        TableName=table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :n)",
        ExpressionAttributeValues={":pk": {"S": f"t#{tenant}"}, ":n": {"S": "n#"}},
        ConsistentRead=True,
    )
    for page in pages:
        for item in page["Items"]:
            notes[item["sk"]["S"][2:]] = item["value"]["S"]
    return notes
