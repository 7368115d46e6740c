"""A batch across the shipped registry's two models on the local stack (issue 34; docs/governor.md,
"Models"): each unit is answered by the model it names (or the default), each model's bucket is
drawn from, and the books are exact: every unit's attempts and tokens are what the simulated
model's seed says."""

from __future__ import annotations

from typing import Any

from swarm.adapters.simulated_model import answered_by
from tests.e2e.conftest import Stack, assert_books, expected_books, fresh_batch, wait_for

UNITS = 24
MODEL_IDS = {
    "haiku": "anthropic.claude-3-5-haiku-20241022-v1:0",
    "sonnet": "us.anthropic.claude-sonnet-4-20250514-v1:0",
}


def two_model_units(n: int, prefix: str) -> list[dict[str, Any]]:
    """Every third unit names Sonnet; the others name no model (Haiku, the default)."""
    batch = []
    for i in range(n):
        request: dict[str, Any] = {"messages": [{"role": "user", "content": [{"text": f"u{i}"}]}]}
        if i % 3 == 0:
            request["model"] = "sonnet"
        tokens = 1_000 + (i * 787) % 2_000
        batch.append({"unit_id": f"{prefix}-{i:05d}", "projected_tokens": tokens, "input": request})
    return batch


def test_a_batch_across_two_models_runs_each_unit_on_its_model_with_exact_books(
    stack: Stack,
) -> None:
    _, client, key, bid = fresh_batch(stack, "models", "two-models")
    batch = two_model_units(UNITS, "m")
    doc = client.submit({"units": batch}, idempotency_key=key)
    assert doc["batch_id"] == bid
    final = wait_for(client, bid, timeout_s=300, interval_s=1.0)
    assert final["state"] == "completed", final
    # the books: every unit's attempts and billed tokens as the model's seed says
    results = stack.results(bid, "completed")
    assert_books(expected_books(stack.model(), batch), results)
    # each unit answered by its model: the simulated plane names the model asked
    page = client.results(bid, state=None, limit=UNITS, next_token=None)
    got = {u["unit_id"]: u["model_id"] for u in page["units"]}
    assert len(got) == UNITS
    for unit in batch:
        name = unit["input"].get("model", "haiku")
        assert got[unit["unit_id"]] == answered_by(MODEL_IDS[name]), unit["unit_id"]
    # and each model has its bucket in the governor table (its items written by the draws),
    # which the fleet view shows
    dynamodb = stack.aws("dynamodb")
    table = next(t for t in dynamodb.list_tables()["TableNames"] if "Governor" in t)
    items = [
        i for p in dynamodb.get_paginator("scan").paginate(TableName=table) for i in p["Items"]
    ]
    assert {i["pk"]["S"].split("-q")[0] for i in items} >= {"gov#haiku", "gov#sonnet"}
    fleet = client.fleet()
    assert {name: m["model_id"] for name, m in fleet["models"].items()} == MODEL_IDS
    assert fleet["models"]["sonnet"]["governor"]["output_burndown"] == 5.0
