"""Agent units on the local stack whose batch's budget runs out mid-loop: the loops stop at a
turn boundary with their transcripts kept and join the remainder, the books exact; a top-up's
resume continues them from their logs (no recorded turn asked of the model again), and every
loop completes, the books exact again (issue 33, point 6; docs/agents.md, "Budget and
exhaustion").

The batch's budget pays for three loops' caps of eight: admitting a fourth exhausts it. The
model's calls for the batch are held (``/_local/faults`` ``hold``) until the batch is exhausting
and every admitted loop waits in its first model call, so the loops are mid-loop when the budget
runs out by construction, not by the race of the fan-out against the workers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from infra.context import cdk_json_context
from swarm.cli.ops import generated_agent_units
from swarm.client import ApiError, Client
from swarm.core.pricing import Prices, Usage, cost_micro, unit_cost_bound, usd, usd_decimal
from tests.e2e.conftest import Stack, fresh_batch, wait_for

UNITS, TURNS, ADMITTED = 8, 6, 3
TOOLS = ("calculator", "notes_write", "notes_read")
#: the bound of each wait: the whole scenario took ~25 s here, the stack otherwise idle
RUN_S = 300.0


#: the default model's prices (cdk.json models.catalog.haiku.prices): a budget in dollars is
#: priced by them
PRICES = Prices.parse(cdk_json_context()["models"]["catalog"]["haiku"]["prices"])


@pytest.mark.parametrize("currency", ["tokens", "usd"])
def test_an_exhausted_agent_batch_pauses_its_loops_and_a_top_up_continues_them_from_their_logs(
    stack: Stack, currency: str
) -> None:
    _, client, key, bid = fresh_batch(stack, "agents-b", f"agents-budget-{currency}")
    units = generated_agent_units(UNITS, seed=46, turns=(TURNS, TURNS), tools=TOOLS)
    [cap] = {u["projected_tokens"] for u in units}
    # Given a budget for three loops' caps (admission reserves a loop's whole cap: in dollars,
    # its tokens at the dearest rate), and the batch's model calls held: the admitted loops
    # wait in their first turn
    if currency == "tokens":
        body: dict[str, Any] = {"budget": ADMITTED * cap + cap // 2}
    else:
        cost = unit_cost_bound(cap, cap, PRICES)
        body = {"budget_usd": usd_decimal(ADMITTED * cost + cost // 2)}
    stack.local("POST", "/_local/faults", {"batch_id": bid, "hold": True})
    try:
        doc = client.submit({"units": units, **body}, idempotency_key=key)
        assert doc["batch_id"] == bid
        # When the fan-out's fourth admission finds no budget: the batch is exhausting, and
        # the three admitted loops are in their first model call
        wait_for(client, bid, lambda d: d["state"] == "exhausting", timeout_s=RUN_S)
        _until(lambda: stack.model(bid)["held_calls"] == ADMITTED, "three loops held")
    finally:
        stack.local("POST", "/_local/faults", {"batch_id": bid, "release": True})
    first = wait_for(client, bid, timeout_s=RUN_S, interval_s=1.0)

    # Then the batch ends exhausted: no loop completed, every unit in the remainder
    assert first["state"] == "exhausted", first
    assert first["counts"]["remainder"] == UNITS and first["counts"]["completed"] == 0, first
    assert sorted(first["remainder"]) == sorted(u["unit_id"] for u in units)
    if currency == "tokens":
        assert first["tokens"]["reserved"] == 0, first
    else:
        assert first["usd"]["reserved"] == "0.000000", first
    # and the admitted loops stopped at a turn boundary, their transcripts kept: their first
    # turn answered (a later one too if a held call outwaited the hold's bound), its tools'
    # results recorded and settled; a turn started with that settlement was settled at 0 as
    # paused, never called
    before = _transcripts(client, bid, units)
    assert len(before) == ADMITTED, sorted(before)
    for unit_id, t in before.items():
        assert "stop" not in t, (unit_id, t["stop"])  # not stopped: paused, to go on
        answered = [turn for turn in t["turns"] if turn["message"] is not None]
        numbers = [turn["turn"] for turn in answered]
        assert numbers == list(range(1, len(numbers) + 1)) and numbers, (unit_id, t["turns"])
        assert len(numbers) < TURNS, (unit_id, numbers)  # stopped mid-loop
        for turn in answered:  # each answered turn asked for tools, their results are kept
            assert turn["tool_calls"], (unit_id, turn)
        assert all(turn["billed"] is not None for turn in t["turns"]), unit_id  # all settled
        last = t["turns"][-1]
        if last["message"] is None:  # started with the last settlement: paused, never called
            assert last["refused"] == "paused" and last["billed"] == 0, (unit_id, last)
    # and the books are exact: spent is every turn's bill, each answered turn billed what the
    # model counted, once; the model was asked each recorded turn once
    calls = _calls(stack, bid)
    _assert_books(first, before, calls)
    _assert_money(first, before)
    assert stack.model(bid)["tokens_billed"] == first["tokens"]["spent"]  # the model's own count
    assert first["agent"]["turns"] == sum(len(t["turns"]) for t in before.values())

    # When the batch is topped up and resumed
    if currency == "tokens":
        resumed = client.resume(bid, UNITS * cap)
    else:
        resumed = client.resume(bid, None, usd_decimal(UNITS * unit_cost_bound(cap, cap, PRICES)))
    assert resumed["requeued"] == UNITS, resumed
    final = wait_for(client, bid, timeout_s=RUN_S, interval_s=1.0)

    # Then every loop completed its turns
    assert final["state"] == "completed" and final["counts"]["completed"] == UNITS, final
    after = _transcripts(client, bid, units)
    assert set(after) == {u["unit_id"] for u in units}
    for unit_id, t in after.items():
        assert t["stop"] == {"reason": "completed", "detail": ""}, (unit_id, t["stop"])
        answered = [turn["turn"] for turn in t["turns"] if turn["message"] is not None]
        assert len(answered) == TURNS, (unit_id, answered)
    # and a paused loop went on from its log: its turns before the exhaustion are there as they
    # were, and its turn numbers go on after them
    for unit_id, t in before.items():
        kept = after[unit_id]["turns"][: len(t["turns"])]
        assert kept == t["turns"], unit_id
        later = [turn["turn"] for turn in after[unit_id]["turns"][len(t["turns"]) :]]
        assert later and min(later) > t["turns"][-1]["turn"], (unit_id, later)
    # and the model was not asked a recorded turn again: the resume asked only the turns the
    # loops had not answered (the paused loops' first turns were not called again)
    calls_after = _calls(stack, bid)
    for unit_id in before:
        assert calls_after[(unit_id, 1)] == 1, unit_id
    new_calls = sum(calls_after.values()) - sum(calls.values())
    answered_before = sum(
        1 for t in before.values() for turn in t["turns"] if turn["message"] is not None
    )
    assert new_calls == UNITS * TURNS - answered_before
    # and the books are exact again
    _assert_books(final, after, calls_after)
    _assert_money(final, after)
    assert stack.model(bid)["tokens_billed"] == final["tokens"]["spent"]
    assert final["agent"]["turns"] == sum(len(t["turns"]) for t in after.values())
    results = _results(client, bid)
    for unit_id, t in after.items():
        assert results[unit_id]["tokens"] == sum(turn["billed"] for turn in t["turns"]), unit_id


def _assert_books(
    status: dict[str, Any],
    transcripts: dict[str, dict[str, Any]],
    calls: Counter[tuple[str, int]],
) -> None:
    """Spent is the sum of every turn's bill; an answered turn is billed what the model counted
    for it, and was answered by the model once; no turn is lost (no worker dies here)."""
    turns = [turn for t in transcripts.values() for turn in t["turns"]]
    assert status["tokens"]["spent"] == sum(turn["billed"] for turn in turns), status
    for unit_id, t in transcripts.items():
        numbers = [turn["turn"] for turn in t["turns"]]
        assert len(numbers) == len(set(numbers)), (unit_id, numbers)  # a turn settled once
        for turn in t["turns"]:
            assert not turn["lost"], (unit_id, turn)
            if turn["message"] is not None:
                assert turn["billed"] == sum(turn["usage"].values()), (unit_id, turn)
                assert calls[(unit_id, turn["turn"])] == 1, (unit_id, turn["turn"])
            else:
                assert calls[(unit_id, turn["turn"])] == 0, (unit_id, turn["turn"])
    answered = sum(1 for turn in turns if turn["message"] is not None)
    assert sum(calls.values()) == answered


def _assert_money(status: dict[str, Any], transcripts: dict[str, dict[str, Any]]) -> None:
    """Spent in dollars is every turn's usage priced at the deployment's prices, each turn
    rounded up once (a turn never called costs nothing)."""
    turns = [turn for t in transcripts.values() for turn in t["turns"]]
    priced = sum(
        cost_micro(Usage.of_converse(turn["usage"]), PRICES) for turn in turns if turn["usage"]
    )
    assert status["usd"]["spent"] == usd(priced), status
    assert Decimal(status["usd"]["spent"]) > 0


def _calls(stack: Stack, bid: str) -> Counter[tuple[str, int]]:
    """The model calls of the batch's loops the model answered, per (unit, turn): a call the
    plane refused for quota (another scenario's load) is settled at 0 and not counted here."""
    model = stack.model(bid)
    return Counter((c["unit_id"], int(c["attempt"])) for c in model["log"] if c["succeeded"])


def _transcripts(client: Client, bid: str, units: list[Any]) -> dict[str, dict[str, Any]]:
    """The transcripts of the batch's units that have one (a unit never admitted has none)."""
    found = {}
    for u in units:
        try:
            found[u["unit_id"]] = client.transcript(bid, u["unit_id"])
        except ApiError as e:
            if e.status != 404:
                raise
    return found


def _results(client: Client, bid: str) -> dict[str, dict[str, Any]]:
    page = client.results(bid, state=None, limit=1000, next_token=None)
    assert "next_token" not in page
    return {r["unit_id"]: r for r in page["units"]}


def _until(condition: Callable[[], bool], what: str, timeout_s: float = RUN_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.5)
