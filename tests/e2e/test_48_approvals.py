"""Human gates on the local stack (docs/agents.md, "Human gates"): an agent batch whose notes
write tool needs approval (the unit's ``limits.approve_tools``). Its units park: no worker runs
them, no message of theirs is in the lanes, the model is not called again. `swarm approvals`
lists them; some are approved and some rejected through the CLI; then every unit completes with
the decided effects only (the notes table holds exactly the approved writes), the books are
exact, and every transcript shows its decision: who, when, why and how long it waited."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import Stack, fresh_batch, wait_for
from tests.e2e.test_30_cli import ok, swarm
from tests.e2e.test_45_agents import _books_exact, _notes

UNITS = 6
APPROVED = ("gate-00000", "gate-00002", "gate-00004")
RUN_S = 300.0


def gated_units(n: int) -> list[dict[str, Any]]:
    """Units of two model turns: the first writes a note (``<unit>-1``), gated; the second
    answers with what the tool gave."""
    return [
        {
            "unit_id": f"gate-{i:05d}",
            "projected_tokens": 12_000,
            "input": {
                "system": "Keep a note of what you find, then report. turns=2",
                "messages": [{"role": "user", "content": [{"text": f"Gated unit {i}."}]}],
                "inferenceConfig": {"maxTokens": 256},
                "tools": ["notes_write"],
                "limits": {"approve_tools": ["notes_write"]},
            },
        }
        for i in range(n)
    ]


def test_gated_writes_park_their_units_until_decided_through_the_cli(
    stack: Stack, here: Path
) -> None:
    tenant, client, key, bid = fresh_batch(stack, "gates", "gates-cli")
    units = gated_units(UNITS)
    doc = client.submit({"units": units, "budget": 1_000_000}, idempotency_key=key)
    assert doc["batch_id"] == bid
    # When every unit's first turn asks to write its note
    parked = wait_for(
        client, bid, lambda d: d["counts"]["awaiting_approval"] == UNITS, timeout_s=RUN_S
    )
    # Then each unit is parked: nothing runs it, nothing of it waits in a lane, its tokens
    # stay reserved, and the model is not called again while it waits
    counts = parked["counts"]
    assert (counts["running"], counts["queued"], counts["pending"]) == (0, 0, 0), parked
    assert parked["state"] == "open" and parked["tokens"]["reserved"] > 0
    calls = stack.model(bid)["calls"]
    assert calls == UNITS  # one model turn each
    time.sleep(2.0)  # 20 s of the stack's clock: a cycling message would have come back
    again = client.status(bid)
    assert again["counts"] == counts and stack.model(bid)["calls"] == calls
    assert _notes(stack, tenant) == {}  # no write ran
    # and `swarm approvals` lists each waiting call
    listed = json.loads("\n".join(ok(swarm(here, "approvals", bid, "--json", "--tenant", tenant))))[
        "waiting"
    ]
    assert sorted(w["unit_id"] for w in listed) == [u["unit_id"] for u in units]
    assert all(w["tool"] == "notes_write" and w["waited_s"] >= 0 for w in listed)
    # the API's pages, a unit each, list the same calls in the same order (the index's)
    paged: list[dict[str, Any]] = []
    token = None
    for _ in range(UNITS + 2):
        page = client.approvals_page(bid, limit=1, next_token=token)
        assert len(page["waiting"]) <= 1, page
        paged += page["waiting"]
        token = page["next_token"]
        if token is None:
            break
    assert [w["toolUseId"] for w in paged] == [w["toolUseId"] for w in listed], paged
    lines = ok(swarm(here, "approvals", bid, "--tenant", tenant))
    assert lines[0] == f"batch {bid}: {UNITS} tool call(s) wait for a decision", lines
    tool_use = {w["unit_id"]: w["toolUseId"] for w in listed}
    assert all(any(u in line and tool_use[u] in line for line in lines) for u in tool_use)
    # When three are approved and three rejected through the CLI
    for unit_id in sorted(tool_use):
        if unit_id in APPROVED:
            args = ("approve", bid, unit_id, tool_use[unit_id], "--reason", "checked")
        else:
            args = ("reject", bid, unit_id, tool_use[unit_id], "--reason", "not this note")
        (line,) = ok(swarm(here, *args, "--tenant", tenant))
        assert f"{unit_id} {tool_use[unit_id]} (notes_write): " in line, line
    # the same decision again is answered as recorded; a different one is refused (409)
    first = APPROVED[0]
    (line,) = ok(
        swarm(here, "approve", bid, first, tool_use[first], "--reason", "x", "--tenant", tenant)
    )
    assert "recorded before: unchanged" in line, line
    clash = swarm(here, "reject", bid, first, tool_use[first], "--reason", "no", "--tenant", tenant)
    assert clash.returncode != 0 and "409" in clash.stderr + clash.stdout, clash
    # another tenant cannot see the batch's calls at all
    other = swarm(here, "approvals", bid, "--tenant", f"{tenant}-x")
    assert other.returncode != 0 and "404" in other.stderr + other.stdout, other
    # Then every unit completes
    final = wait_for(client, bid, timeout_s=RUN_S, interval_s=1.0)
    assert final["state"] == "completed" and final["counts"]["completed"] == UNITS, final
    assert final["counts"]["awaiting_approval"] == 0
    assert ok(swarm(here, "approvals", bid, "--tenant", tenant)) == [
        f"batch {bid}: no tool call waits for a decision"
    ]
    # with the decided effects only: each approved note written once, no rejected one
    transcripts = {u["unit_id"]: client.transcript(bid, u["unit_id"]) for u in units}
    written = {}
    for unit_id, t in transcripts.items():
        (call,) = t["turns"][0]["tool_calls"]
        approval = call["approval"]
        assert approval["by"].split("/")[-2] == f"swarm-tenant-{tenant}", approval
        assert approval["waited_s"] > 0 and approval["at"] > 0
        if unit_id in APPROVED:
            assert call["status"] == "success" and approval["decision"] == "approve"
            assert approval["reason"] == "checked"
            written[call["input"]["name"]] = call["input"]["value"]
        else:
            assert call["status"] == "error" and approval["decision"] == "reject"
            assert approval["reason"] == "not this note"
            assert "not this note" in json.dumps(call["content"])
        assert t["stop"] == {"reason": "completed", "detail": ""}, t["stop"]
        assert len(t["turns"]) == 2
    assert sorted(written) == [f"{u}-1" for u in APPROVED]
    assert _notes(stack, tenant) == written
    # and the books exact: each unit billed its turns, the batch its units, nothing reserved
    _books_exact(client, bid, transcripts)
    assert stack.model(bid)["calls"] == 2 * UNITS  # every turn asked of the model once
