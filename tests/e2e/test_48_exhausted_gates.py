"""Human gates when the budget runs out (docs/agents.md, "Budget, drain and exhaustion"), on the
local stack: a batch whose budget holds two of its three gated units closes ``exhausted`` while
two of them wait for a decision. They are in its remainder (the results mark them as awaiting),
their calls are still listed and decided after the closure (each decided unit joins the
remainder, its tokens freed), and a top-up's resume runs the remainder from the logs: the
approved note written once, the rejected one never."""

from __future__ import annotations

from tests.e2e.conftest import Stack, fresh_batch, wait_for
from tests.e2e.test_45_agents import _notes
from tests.e2e.test_48_approvals import RUN_S, gated_units


def test_an_exhausted_batchs_parked_units_are_decided_after_its_closure_and_resumed(
    stack: Stack,
) -> None:
    tenant, client, key, bid = fresh_batch(stack, "gates", "gates-exhausted")
    units = gated_units(3)
    # Given a budget that holds two units' caps: two are admitted and park, the third is refused
    client.submit({"units": units, "budget": 24_000}, idempotency_key=key)
    closed = wait_for(client, bid, timeout_s=RUN_S)
    # Then the batch closes exhausted with its two parked units still waiting
    assert closed["state"] == "exhausted", closed
    counts = closed["counts"]
    assert (counts["awaiting_approval"], counts["remainder"]) == (2, 1), closed
    # and its results put them in the remainder, marked as awaiting a decision
    results = stack.results(bid, "exhausted")
    parked = sorted(u for u, d in results["units"].items() if d.get("awaiting_approval"))
    assert len(parked) == 2 and sorted(results["remainder"]) == [u["unit_id"] for u in units]
    # When their calls are listed and decided after the closure
    waiting = {w["unit_id"]: w["toolUseId"] for w in client.approvals(bid)["waiting"]}
    assert sorted(waiting) == parked
    approved, rejected = parked
    first = client.decide(bid, approved, waiting[approved], "approve", "checked")
    second = client.decide(bid, rejected, waiting[rejected], "reject", "not this note")
    # Then no turn runs: each joins the remainder, its reservation released
    assert first["unit_state"] == second["unit_state"] == "remainder", (first, second)
    after = client.status(bid)
    assert after["state"] == "exhausted" and after["counts"]["remainder"] == 3, after
    assert after["counts"]["awaiting_approval"] == 0 and after["tokens"]["reserved"] == 0, after
    assert _notes(stack, tenant) == {}
    # When a top-up resumes it, the third unit parks on its own gate, and is approved
    client.resume(bid, 100_000)
    third = next(u["unit_id"] for u in units if u["unit_id"] not in parked)
    wait_for(client, bid, lambda d: d["counts"]["awaiting_approval"] == 1, timeout_s=RUN_S)
    (call,) = client.approvals(bid)["waiting"]
    assert call["unit_id"] == third
    client.decide(bid, third, call["toolUseId"], "approve", "checked")
    # Then every unit completes with the decided effects only
    final = wait_for(client, bid, timeout_s=RUN_S)
    assert final["state"] == "completed" and final["counts"]["completed"] == 3, final
    assert sorted(_notes(stack, tenant)) == sorted([f"{approved}-1", f"{third}-1"])
    transcript = client.transcript(bid, rejected)
    (rejected_call,) = transcript["turns"][0]["tool_calls"]
    assert rejected_call["status"] == "error"
    assert rejected_call["approval"]["reason"] == "not this note"
