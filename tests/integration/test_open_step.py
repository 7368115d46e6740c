"""The open inside the workflow, on moto with IAM enforced: the submit's writes are O(1) in the
batch size, the batch is shown while it is being opened, and the finalizer function's open
action (with its own role) opens it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.client import BaseClient

from tests.integration.plane import ControlPlane


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Every AWS request made while counting, by ``service:Operation``."""
    calls: Counter[str] = Counter()
    real = BaseClient._make_api_call

    def counting(self: Any, op: str, params: Any) -> Any:
        calls[f"{self.meta.service_model.service_name}:{op}"] += 1
        return real(self, op, params)

    monkeypatch.setattr(BaseClient, "_make_api_call", counting)
    yield calls


def _body(units: int) -> dict[str, Any]:
    return {
        "units": [
            {"unit_id": f"{i:032x}", "projected_tokens": 1_000, "input": "x"} for i in range(units)
        ]
    }


def test_the_submits_requests_do_not_grow_with_the_batch(
    plane: ControlPlane, requests: Counter[str]
) -> None:
    seen = []
    plane.api("POST", "/batches", _body(1))  # the first call binds the tenant: not counted
    for units in (30, 3_000):
        requests.clear()
        status, doc, _ = plane.api(
            "POST", "/batches", _body(units), headers={"Idempotency-Key": str(units)}
        )
        assert status == 201, doc
        assert doc["state"] == "opening" and doc["units"] == units
        seen.append({k: v for k, v in requests.items() if k.split(":")[0] in ("dynamodb", "s3")})
    # the same requests whatever the size: no BatchWriteItem, two S3 objects (manifest, spec)
    assert seen[0] == seen[1]
    assert "dynamodb:BatchWriteItem" not in seen[0]
    assert seen[0]["s3:PutObject"] == 2 and seen[0]["dynamodb:TransactWriteItems"] == 1
    assert sum(v for k, v in seen[0].items() if k.startswith("dynamodb")) <= 8


def test_a_batch_is_shown_opening_then_opened_by_the_finalizers_open_action(
    plane: ControlPlane,
) -> None:
    status, doc, _ = plane.api("POST", "/batches", _body(120), headers={"Idempotency-Key": "k"})
    assert status == 201
    batch = doc["batch_id"]
    # Then, before the open step, the batch is shown (never "no run"), with no results yet
    status, doc, _ = plane.api("GET", f"/batches/{batch}")
    assert status == 200 and doc["state"] == "opening" and doc["units_written"] == 0
    status, page, _ = plane.api("GET", f"/batches/{batch}/results")
    assert status == 200 and page["state"] == "opening" and page["units"] == []
    # and a replay is the same batch, a different body under the key a 409
    status, again, _ = plane.api("POST", "/batches", _body(120), headers={"Idempotency-Key": "k"})
    assert status in (200, 201) and again["batch_id"] == batch
    status, _, _ = plane.api("POST", "/batches", _body(121), headers={"Idempotency-Key": "k"})
    assert status == 409
    # When the state machine runs (its open step: the finalizer's open action, its own role)
    assert plane.run_state_machine() == [batch]
    # Then the batch is open and runs to completion
    status, doc, _ = plane.api("GET", f"/batches/{batch}")
    assert doc["state"] == "open" and "units_written" not in doc
    plane.work()
    assert plane.finalize(batch)["state"] == "completed"
