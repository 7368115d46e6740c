"""Agent units whose tools come from an MCP server (docs/agents.md, "MCP tools"): the local
stack runs a real MCP server of the ``mcp`` package (swarm.local.mcp_server, Streamable HTTP,
stateless) and registers it as the entry ``local_mcp`` (its tools listed, granted to every
tenant, its auth header in a Secrets Manager secret only the worker's role may read). Every
unit's worker is killed once while its tools run (after a call's effect, before its result is
recorded), every message is delivered twice on top; then every unit completes, the server
counted each write's effect exactly once per idempotency key, no call was repeated once its
result was recorded, and the books are exact."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from swarm.cli.ops import generated_agent_units
from swarm.core.agent_driver import KillPoint
from tests.e2e.conftest import Stack, fresh_batch, wait_for
from tests.e2e.test_45_agents import _books_exact, _send_twice, killed_in_turn

UNITS, TURNS = 12, 4
#: the MCP server's tools (the simulated model calls them with an empty input)
TOOLS = ("tally_write", "tally_read")
RUN_S = 900.0


@pytest.mark.lease_wait
def test_mcp_tools_with_workers_killed_mid_call_have_one_effect_per_key_and_exact_books(
    stack: Stack,
) -> None:
    tenant, client, key, bid = fresh_batch(stack, "mcp", "mcp-kills")
    units = generated_agent_units(UNITS, seed=49, turns=(TURNS, TURNS), tools=TOOLS)
    # Given every unit's worker dies once while its tools run, in its first or second turn
    # (after a call's effect, before the turn's results are recorded)
    stack.local("POST", "/_local/faults", {"batch_id": bid, "kill": [KillPoint.WHILE_TOOLS.value]})
    doc = client.submit({"units": units, "budget": 10_000_000}, idempotency_key=key)
    assert doc["batch_id"] == bid
    # and every unit's message is delivered a second time, while the first runs or after it
    _send_twice(stack, bid, tenant, units)
    # When the batch runs to its end
    final = wait_for(client, bid, timeout_s=RUN_S, interval_s=2.0)
    # Then every loop completed its turns, each worker killed once mid-call
    assert final["state"] == "completed" and final["counts"]["completed"] == UNITS, final
    model = stack.local("GET", f"/_local/model?batch={bid}")
    assert model["kills"] == {KillPoint.WHILE_TOOLS.value: UNITS}, model["kills"]
    transcripts = {u["unit_id"]: client.transcript(bid, u["unit_id"]) for u in units}
    recorded: dict[str, dict[str, object]] = {}
    for unit_id, t in transcripts.items():
        assert t["stop"] == {"reason": "completed", "detail": ""}, (unit_id, t["stop"])
        assert len([turn for turn in t["turns"] if turn["message"] is not None]) == TURNS
        for turn in t["turns"]:
            for call in turn["tool_calls"]:
                # every call was answered (the message first: pytest cuts a long call short)
                assert call["status"] == "success", (unit_id, call.get("content"), call)
                if call["name"] == "tally_write":
                    recorded[f"{bid}/{unit_id}/{call['toolUseId']}"] = {
                        "turn": turn["turn"],
                        "content": call["content"],
                    }
    assert recorded, "the loops called the MCP server's write tool"
    # and the server counted each recorded write's effect exactly once, under its key
    server = stack.local("GET", f"/_local/mcp?batch={bid}")
    assert server["effects"] == dict.fromkeys(recorded, 1)
    assert set(server["tenants"].values()) == {tenant}  # the tenant in the call's _meta
    # and each call's recorded result is the server's first answer for its key
    for k, call in recorded.items():
        first = json.dumps(server["results"][k], sort_keys=True)
        assert first in json.dumps(call["content"], sort_keys=True), (k, call, first)
    # and no call was repeated once its result was recorded: a key was called again only in
    # the turn its worker died in (its results not yet recorded), at most once more
    again: Counter[str] = Counter()
    for k, calls in server["calls"].items():
        unit_id = k.split("/")[1]
        assert calls in (1, 2), (k, calls)
        if calls == 2:
            assert recorded[k]["turn"] == killed_in_turn(unit_id), (k, recorded[k])
            again[unit_id] += 1
    assert again, "a worker died after a write's effect, and its next delivery called it again"
    # and each turn was billed once: a unit's bill is its turns', the batch's its units'
    _books_exact(client, bid, transcripts)
    answered = sum(
        1 for t in transcripts.values() for turn in t["turns"] if turn["message"] is not None
    )
    assert model["calls"] == answered  # a kill mid-call loses no model turn
