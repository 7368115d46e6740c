"""Per-tool deciders on the strict local stack (docs/agents.md, "Human gates"): the local stack
registers ``notes_publish`` with ``"approval": {"deciders": ["swarm-operator-local"]}``. A
tenant's batch parks on it; the tenant may list its waiting calls but not decide them (403,
naming the deciders); another tenant gets the same 404 as for a batch that does not exist; the
operator role decides through the CLI (``--operator``); every unit completes with the decided
effects only, and each transcript's ``approval.by`` is the operator role's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swarm.client import ApiError
from swarm.local.deploy import LOCAL_GATED_TOOL, LOCAL_OPERATOR
from tests.e2e.conftest import Stack, fresh_batch, wait_for
from tests.e2e.test_30_cli import ok, swarm
from tests.e2e.test_45_agents import _books_exact, _notes

UNITS = 4
APPROVED = ("publish-00000", "publish-00002")
RUN_S = 300.0
OPERATOR = f"swarm-operator-{LOCAL_OPERATOR}"


def publishing_units(n: int) -> list[dict[str, Any]]:
    """Units of two model turns: the first publishes a note (``<unit>-1``), gated by the
    registry (no ``limits.approve_tools``); the second answers with what the tool gave."""
    return [
        {
            "unit_id": f"publish-{i:05d}",
            "projected_tokens": 12_000,
            "input": {
                "system": "Publish what you find, then report. turns=2",
                "messages": [{"role": "user", "content": [{"text": f"Publishing unit {i}."}]}],
                "inferenceConfig": {"maxTokens": 256},
                "tools": [LOCAL_GATED_TOOL],
            },
        }
        for i in range(n)
    ]


def _refusal(call: Callable[[str], Any], batch_id: str) -> tuple[int, str, str]:
    """The API's refusal of ``call(batch_id)``: status, code and message, the id masked."""
    with pytest.raises(ApiError) as refused:
        call(batch_id)
    error = refused.value
    return error.status, error.code, str(error).replace(batch_id, "<batch>")


def test_a_tool_naming_operator_deciders_is_decided_by_them_only(stack: Stack, here: Path) -> None:
    tenant, client, key, bid = fresh_batch(stack, "deciders", "deciders-cli")
    units = publishing_units(UNITS)
    doc = client.submit({"units": units, "budget": 1_000_000}, idempotency_key=key)
    assert doc["batch_id"] == bid
    # When every unit's first turn asks to publish its note (a tool the registry gates)
    wait_for(client, bid, lambda d: d["counts"]["awaiting_approval"] == UNITS, timeout_s=RUN_S)
    assert _notes(stack, tenant) == {}  # nothing published yet
    # Then the tenant sees its waiting calls and whose turn each is: the operator role's
    listed = json.loads("\n".join(ok(swarm(here, "approvals", bid, "--json", "--tenant", tenant))))[
        "waiting"
    ]
    assert sorted(w["unit_id"] for w in listed) == [u["unit_id"] for u in units]
    assert all(w["tool"] == LOCAL_GATED_TOOL and w["deciders"] == [OPERATOR] for w in listed)
    tool_use = {w["unit_id"]: w["toolUseId"] for w in listed}
    first = APPROVED[0]
    # but its own approval is refused, naming who decides
    mine = swarm(here, "approve", bid, first, tool_use[first], "--tenant", tenant)
    said = mine.stderr + mine.stdout
    assert mine.returncode != 0 and "403" in said and OPERATOR in said, mine
    # another tenant gets the same 404 as for a batch that does not exist, listing or deciding
    other = stack.client(f"{tenant}-x")
    missing = "b-" + "0" * (len(bid) - 2)
    for call in (
        lambda b: other.approvals(b),
        lambda b: other.decide(b, first, tool_use[first], "approve", "mine now"),
    ):
        theirs = _refusal(call, bid)
        assert theirs[0] == 404, theirs
        assert theirs == _refusal(call, missing)
    # When the operator role lists the calls and decides them through the CLI
    lines = ok(swarm(here, "approvals", bid, "--operator"))
    assert lines[0] == f"batch {bid}: {UNITS} tool call(s) wait for a decision", lines
    assert sum(f"decided by {OPERATOR}" in line for line in lines) == UNITS, lines
    for unit_id in sorted(tool_use):
        if unit_id in APPROVED:
            args = ("approve", unit_id, tool_use[unit_id], "--reason", "publish it")
        else:
            args = ("reject", unit_id, tool_use[unit_id], "--reason", "not for publication")
        (line,) = ok(swarm(here, args[0], bid, *args[1:], "--operator"))
        assert f"{unit_id} {tool_use[unit_id]} ({LOCAL_GATED_TOOL}): " in line, line
    # Then every unit completes
    final = wait_for(client, bid, timeout_s=RUN_S, interval_s=1.0)
    assert final["state"] == "completed" and final["counts"]["completed"] == UNITS, final
    # with the decided effects only, each decision the operator role's in the transcript
    transcripts = {u["unit_id"]: client.transcript(bid, u["unit_id"]) for u in units}
    published = {}
    for unit_id, t in transcripts.items():
        (call,) = t["turns"][0]["tool_calls"]
        approval = call["approval"]
        # an assumed role's ARN: arn:aws:sts::<account>:assumed-role/<role>/<session>
        assert approval["by"].split("/")[-2] == OPERATOR, approval
        if unit_id in APPROVED:
            assert call["status"] == "success" and approval["decision"] == "approve"
            published[call["input"]["name"]] = call["input"]["value"]
        else:
            assert call["status"] == "error" and approval["decision"] == "reject"
            assert "not for publication" in json.dumps(call["content"])
        assert t["stop"] == {"reason": "completed", "detail": ""}, t["stop"]
    assert sorted(published) == [f"{u}-1" for u in APPROVED]
    assert _notes(stack, tenant) == published
    _books_exact(client, bid, transcripts)
