"""Tenants cannot hurt each other, through the API function on moto (the synthesized template,
IAM enforced): tenant A over its queue cap is refused with 429 and a Retry-After, and nothing is
written, while tenant B's submission is accepted; the lanes' ceiling spares a tenant within its
share."""

from __future__ import annotations

import json

import pytest

from swarm.contract import TENANT_LIMITS
from swarm.service.batches import batch_id_for
from tests.integration.plane import control_plane, units


def limits(**defaults: object) -> str:
    """A TENANT_LIMITS value (what synth resolves from cdk.json tenants)."""
    base = {
        "lanes": ["high", "normal", "low"],
        "max_queued_units": None,
        "guaranteed_units": 0,
        "max_budget_per_batch": None,
    }
    return json.dumps({"defaults": {**base, **defaults}, "overrides": {}})


def test_tenant_a_over_its_share_gets_429_with_retry_after_while_tenant_b_is_accepted(
    aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {TENANT_LIMITS: limits(max_queued_units=25, lanes=["normal", "low"])}
    with control_plane(monkeypatch, **overrides) as plane:
        # Given tenant a with 20 of its 25 units queued
        status, _, _ = plane.api("POST", "/batches", {"units": units(20)}, tenant="a")
        assert status == 201
        # When a submits 10 more
        key = {"Idempotency-Key": "a-more"}
        status, body, headers = plane.api(
            "POST", "/batches", {"units": units(10, prefix="m")}, tenant="a", headers=key
        )
        # Then it is refused with 429 and a Retry-After, naming its own queue
        assert status == 429 and body["error"] == "tenant_queue", body
        assert int(headers["Retry-After"]) >= 1
        assert "20 units queued" in body["message"] and "at most 25" in body["message"]
        # and nothing was written: the batch that key would make does not exist
        refused_id = batch_id_for("a", "a-more")
        assert plane.api("GET", f"/batches/{refused_id}", tenant="a")[0] == 404
        # When tenant b submits the same batch, it is accepted
        status, body, _ = plane.api(
            "POST", "/batches", {"units": units(10, prefix="m")}, tenant="b"
        )
        assert status == 201 and body["tenant"] == "b"
        # and a lane the tenants may not use is a 400 naming lane and the allowed lanes
        status, body, _ = plane.api(
            "POST", "/batches", {"units": units(2), "lane": "high"}, tenant="b"
        )
        assert status == 400 and body["message"].startswith("lane: ")
        assert "normal, low" in body["message"]
