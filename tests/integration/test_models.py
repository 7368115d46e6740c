"""Several models through the deployed handlers on moto (cdk.json ``models``): a batch whose
units name different models runs each on its own model with its own bucket in the governor
table; a model the tenant may not use is a 400 naming the unit's field, nothing written."""

from __future__ import annotations

import json
from typing import Any

import pytest

from swarm.adapters.simulated_model import answered_by
from swarm.contract import GOVERNOR_TABLE_NAME, MODELS
from tests.integration.plane import ControlPlane, ledger, units


def _named(unit: dict[str, Any], model: str | None) -> dict[str, Any]:
    text = unit["input"] if isinstance(unit["input"], str) else "Hello."
    request: dict[str, Any] = {"messages": [{"role": "user", "content": [{"text": text}]}]}
    if model is not None:
        request["model"] = model
    return {**unit, "input": request}


def test_a_batch_across_two_models_runs_each_unit_on_its_own_model_and_bucket(
    plane: ControlPlane,
) -> None:
    models = json.loads(plane.env("worker")[MODELS])
    assert models["default"] == "haiku" and "sonnet" in models["catalog"]
    body = {"units": [_named(u, "sonnet" if i % 2 else None) for i, u in enumerate(units(6))]}
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 201, doc
    batch_id = doc["batch_id"]
    plane.run_to_close(batch_id)
    run = ledger(plane).run(batch_id)
    assert run.completed == 6
    # each unit answered by the model it named (or the default)
    _, page, _ = plane.api("GET", f"/batches/{batch_id}/results")
    got = {u["unit_id"]: u["model_id"] for u in page["units"]}
    for i, unit_id in enumerate(sorted(got)):
        model = models["catalog"]["sonnet" if i % 2 else "haiku"]["model_id"]
        assert got[unit_id] == answered_by(model)
    # and each model has its own bucket in the governor table, the workers' draws in it
    table = plane.env("worker")[GOVERNOR_TABLE_NAME]
    items = plane.client("dynamodb").scan(TableName=table)["Items"]
    buckets = {item["pk"]["S"].split("-q")[0] for item in items}
    assert {"gov#haiku", "gov#sonnet"} <= buckets


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("opus", "'opus' is not a model of this deployment"),
        ("Sonnet", "must be a model's name"),
    ],
)
def test_a_model_the_deployment_lacks_is_a_400_naming_the_units_field(
    plane: ControlPlane, model: str, says: str
) -> None:
    body = {"units": [_named(u, model if i == 1 else None) for i, u in enumerate(units(2))]}
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 400 and doc["error"] == "invalid_request", doc
    assert doc["message"].startswith("units[1].input.model"), doc["message"]
    assert says in doc["message"], doc["message"]
