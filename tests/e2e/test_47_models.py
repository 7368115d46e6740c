"""A batch across the shipped registry's two models on the local stack (issue 34;
docs/explanation/governor.md, "Models"; docs/explanation/ledger.md, "Money"): Claude 3.5 Haiku (the
default) and Claude Sonnet 4 (output burndown 5, an rpm of its own, prices four times Haiku's). Each
unit is answered by the model it names, each model's bucket is drawn from, and the books are exact
in tokens and in dollars: every unit's attempts and tokens are what the simulated model's seed says,
and the dollars are every call of the model's log priced at its own model's prices. With a smaller
budget in dollars the batch ends exhausted, and a top-up in dollars completes it, the books exact
again."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from infra.context import cdk_json_context
from swarm.adapters.simulated_model import answered_by
from swarm.core.pricing import Prices, Usage, cost_micro, usd
from tests.e2e.conftest import Stack, assert_books, expected_books, fresh_batch, wait_for

UNITS = 24
MODEL_IDS = {
    "haiku": "anthropic.claude-3-5-haiku-20241022-v1:0",
    "sonnet": "us.anthropic.claude-sonnet-4-20250514-v1:0",
}


#: each model's prices, as the deployment has them (cdk.json models.catalog.<name>.prices)
PRICES = {
    name: Prices.parse(entry["prices"])
    for name, entry in cdk_json_context()["models"]["catalog"].items()
}


def two_model_units(n: int, prefix: str, tokens: int | None = None) -> list[dict[str, Any]]:
    """Every third unit names Sonnet; the others name no model (Haiku, the default)."""
    batch = []
    for i in range(n):
        request: dict[str, Any] = {"messages": [{"role": "user", "content": [{"text": f"u{i}"}]}]}
        if i % 3 == 0:
            request["model"] = "sonnet"
        size = tokens or 1_000 + (i * 787) % 2_000
        batch.append({"unit_id": f"{prefix}-{i:05d}", "projected_tokens": size, "input": request})
    return batch


def billed_micro(stack: Stack, batch_id: str, batch: list[dict[str, Any]]) -> int:
    """Every call of the model's log for the batch priced at its unit's model's prices, each
    rounded up once: what the books in dollars must hold."""
    model_of = {u["unit_id"]: u["input"].get("model", "haiku") for u in batch}
    calls = [c for c in stack.model(batch_id)["log"] if not c["throttled"]]
    return sum(
        cost_micro(
            Usage(
                c["input_tokens"],
                c["output_tokens"],
                c.get("cache_read_tokens", 0),
                c.get("cache_write_tokens", 0),
            ),
            PRICES[model_of[c["unit_id"]]],
        )
        for c in calls
    )


def assert_money(status: dict[str, Any], results: dict[str, Any], expected: int) -> None:
    assert results["spent_micro"] == expected
    assert status["usd"]["spent"] == usd(expected)


@pytest.mark.parametrize("currency", ["tokens", "usd"])
def test_a_batch_across_two_models_runs_each_unit_on_its_model_with_exact_books(
    stack: Stack, currency: str
) -> None:
    _, client, key, bid = fresh_batch(stack, "models", f"two-models-{currency}")
    batch = two_model_units(UNITS, "m")
    budget = {"budget": 6_000_000} if currency == "tokens" else {"budget_usd": Decimal("10")}
    doc = client.submit({"units": batch, **budget}, idempotency_key=key)
    assert doc["batch_id"] == bid
    final = wait_for(client, bid, timeout_s=300, interval_s=1.0)
    assert final["state"] == "completed", final
    # the books: every unit's attempts and billed tokens as the model's seed says
    results = stack.results(bid, "completed")
    assert_books(expected_books(stack.model(), batch), results)
    # and in dollars: each call priced at its own model's prices, to the micro-dollar
    assert_money(final, results, billed_micro(stack, bid, batch))
    assert results["usd"] is (currency == "usd")
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


def test_a_budget_in_dollars_across_two_models_exhausts_then_a_top_up_completes_it(
    stack: Stack,
) -> None:
    _, client, key, bid = fresh_batch(stack, "models-x", "two-models-exhausted")
    # Given 12 units of 10,000 tokens, a third of them on Sonnet: each reserves its most
    # expensive attempt at its model's prices ($0.04 on Haiku, $0.15 on Sonnet, all output),
    # $0.92 in all; a budget of $0.40 holds about half
    batch = two_model_units(12, "x", tokens=10_000)
    doc = client.submit({"units": batch, "budget_usd": Decimal("0.40")}, idempotency_key=key)
    assert doc["batch_id"] == bid
    first = wait_for(client, bid, timeout_s=300, interval_s=1.0)
    # Then it ends exhausted within its budget, the remainder enumerated, the books exact
    assert first["state"] == "exhausted", first
    counts = first["counts"]
    assert counts["remainder"] > 0 and counts["completed"] > 0, counts
    assert Decimal(first["usd"]["spent"]) <= Decimal("0.40")
    closed = stack.results(bid, "exhausted")
    assert_money(first, closed, billed_micro(stack, bid, batch))
    done_then = {k: u for k, u in closed["units"].items() if u["state"] == "completed"}
    # When topped up in dollars and resumed
    resumed = client.resume(bid, None, Decimal("1"))
    assert resumed["usd"]["budget"] == "1.400000"
    assert resumed["requeued"] == counts["remainder"]
    final = wait_for(client, bid, timeout_s=300, interval_s=1.0)
    # Then every unit completes once, none run again, the books exact in tokens and dollars
    assert final["state"] == "completed", final
    results = stack.results(bid, "completed")
    for unit_id, before in done_then.items():
        assert results["units"][unit_id]["attempts"] == before["attempts"], unit_id
    assert_books(expected_books(stack.model(), batch), results)
    assert_money(final, results, billed_micro(stack, bid, batch))
