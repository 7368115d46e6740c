"""Human gates through the real handlers on moto, IAM enforced (docs/agents.md, "Human gates"):
the worker parks a unit whose tool call needs approval, the API lists and decides it as the
batch's tenant (another tenant gets the same 404 as for no batch), the decision sends the unit
back to its lane (the API role's SendMessage), and a deployment whose approvals.deciders names
operator roles refuses the tenant and takes only those roles."""

from __future__ import annotations

from typing import Any

import pytest

from swarm.contract import APPROVAL_DECIDERS, APPROVAL_TOOL_DECIDERS
from swarm.core.records import Lane
from tests.integration.plane import ControlPlane, control_plane, ledger


def gated_unit(unit_id: str) -> dict[str, Any]:
    return {
        "unit_id": unit_id,
        "projected_tokens": 20_000,
        "input": {
            "system": [{"text": "Keep notes. turns=2"}],
            "messages": [{"role": "user", "content": [{"text": f"note for {unit_id}"}]}],
            "inferenceConfig": {"maxTokens": 256},
            "tools": ["notes_write"],
            "limits": {"approve_tools": ["notes_write"]},
        },
    }


def parked_batch(plane: ControlPlane, n: int = 2) -> str:
    status, doc, _ = plane.api(
        "POST", "/batches", {"units": [gated_unit(f"u{i}") for i in range(n)]}
    )
    assert status == 201, doc
    batch_id: str = doc["batch_id"]
    plane.run_state_machine()
    plane.work()
    return batch_id


def test_a_gated_call_parks_its_unit_and_the_tenant_decides_it(plane: ControlPlane) -> None:
    plane.observe_events()
    batch_id = parked_batch(plane)
    # the worker's role announced each parked unit on the bus
    announced = [e for e in plane.events() if e["detail-type"] == "unit.awaiting_approval"]
    assert sorted(e["detail"]["unit_id"] for e in announced) == ["u0", "u1"], announced
    assert all(e["detail"]["calls"][0]["tool"] == "notes_write" for e in announced)
    # Then both units wait: counted in the status, nothing in the lanes
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}")
    assert status == 200 and doc["counts"]["awaiting_approval"] == 2, doc
    assert plane.receive(Lane.NORMAL) == [] and plane.delayed() == 0
    # the results show them as awaiting approval, and filter on it
    status, page, _ = plane.api("GET", f"/batches/{batch_id}/results")
    assert status == 200 and {u["state"] for u in page["units"]} == {"awaiting_approval"}, page
    query = {"state": "awaiting_approval"}
    status, page, _ = plane.api("GET", f"/batches/{batch_id}/results", query=query)
    assert status == 200 and len(page["units"]) == 2, page
    # the tenant lists them
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}/approvals")
    assert status == 200, doc
    waiting = sorted(doc["waiting"], key=lambda w: w["unit_id"])  # (the longest waiting first)
    assert [(w["unit_id"], w["tool"]) for w in waiting] == [
        ("u0", "notes_write"),
        ("u1", "notes_write"),
    ]
    assert [w["requested_at"] for w in doc["waiting"]] == sorted(
        w["requested_at"] for w in doc["waiting"]
    )
    assert all(w["input"]["name"] and w["waited_s"] >= 0 for w in waiting)
    tool_use = waiting[0]["toolUseId"]
    path = f"/batches/{batch_id}/units/u0/approvals/{tool_use}"
    # another tenant gets the 404 of a batch that does not exist, listing or deciding
    for method, route, body in (
        ("GET", f"/batches/{batch_id}/approvals", None),
        ("POST", path, {"decision": "approve"}),
    ):
        status, other, _ = plane.api(method, route, body, tenant="globex")
        _, none, _ = plane.api(method, route.replace(batch_id, "b-" + "0" * 24), body)
        assert status == 404 and other["message"] == none["message"].replace(
            "b-" + "0" * 24, batch_id
        ), (other, none)
    # a bad decision is a 400 naming the field
    status, bad, _ = plane.api("POST", path, {"decision": "maybe"})
    assert status == 400 and "decision" in bad["message"], bad
    status, bad, _ = plane.api("POST", path, {"decision": "reject"})
    assert status == 400 and bad["message"].startswith("reason"), bad
    status, bad, _ = plane.api("POST", f"/batches/{batch_id}/units/u0/approvals/nope")
    assert status in (400, 404), bad
    # an operator may read the list, but (no deciders configured) the tenant decides
    status, _, _ = plane.api("GET", f"/batches/{batch_id}/approvals", operator=True)
    assert status == 200
    status, refused, _ = plane.api("POST", path, {"decision": "approve"}, operator=True)
    assert status == 403 and "tenant" in refused["message"], refused
    # When the tenant approves u0 and rejects u1
    status, decided, _ = plane.api("POST", path, {"decision": "approve", "reason": "fine"})
    assert status == 200, decided
    assert decided["recorded"] and decided["unit_state"] == "in_flight"
    assert decided["decided_by"] == plane.tenant_arn("acme")
    status, again, _ = plane.api("POST", path, {"decision": "approve", "reason": "fine"})
    assert status == 200 and not again["recorded"] and again["decided_at"] == decided["decided_at"]
    status, clash, _ = plane.api("POST", path, {"decision": "reject", "reason": "no"})
    assert status == 409, clash
    other_use = waiting[1]["toolUseId"]
    status, _, _ = plane.api(
        "POST",
        f"/batches/{batch_id}/units/u1/approvals/{other_use}",
        {"decision": "reject", "reason": "not this one"},
    )
    assert status == 200
    # Then the API sent both back to their lane and they complete
    plane.work()
    result = plane.finalize(batch_id)
    assert result, result
    run = ledger(plane).run(batch_id)
    assert run.completed == 2 and run.reserved == 0 and run.awaiting == 0
    status, transcript, _ = plane.api("GET", f"/batches/{batch_id}/units/u1/transcript")
    assert status == 200
    (call,) = transcript["turns"][0]["tool_calls"]
    assert call["status"] == "error" and call["approval"]["reason"] == "not this one"


@pytest.fixture
def decided_by_operators(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    with control_plane(monkeypatch, None, **{APPROVAL_DECIDERS: "swarm-operator-approver"}) as p:
        yield p


def test_deciders_replace_the_tenant(decided_by_operators: ControlPlane) -> None:
    plane = decided_by_operators
    batch_id = parked_batch(plane, n=1)
    _, doc, _ = plane.api("GET", f"/batches/{batch_id}/approvals")
    path = f"/batches/{batch_id}/units/u0/approvals/{doc['waiting'][0]['toolUseId']}"
    # the tenant may see its waiting call, not approve it
    status, refused, _ = plane.api("POST", path, {"decision": "approve"})
    assert status == 403 and "swarm-operator-approver" in refused["message"], refused
    # nor may any operator role but a decider
    status, refused, _ = plane.api("POST", path, {"decision": "approve"}, operator=True)
    assert status == 403, refused
    status, decided, _ = plane.api(
        "POST", path, {"decision": "approve"}, operator=True, operator_name="approver"
    )
    assert status == 200, decided
    assert decided["decided_by"] == plane.operator_arn("approver")


@pytest.fixture
def decided_per_tool(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Any:
    env = {
        APPROVAL_DECIDERS: "swarm-operator-approver",
        APPROVAL_TOOL_DECIDERS: "notes_write=swarm-operator-security,swarm-operator-legal",
    }
    with control_plane(monkeypatch, None, **env) as p:
        yield p


def test_each_call_is_decided_by_its_own_tools_deciders(decided_per_tool: ControlPlane) -> None:
    plane = decided_per_tool
    calculating = gated_unit("u1")
    calculating["input"]["tools"] = calculating["input"]["limits"]["approve_tools"] = ["calculator"]
    status, doc, _ = plane.api("POST", "/batches", {"units": [gated_unit("u0"), calculating]})
    assert status == 201, doc
    batch_id = doc["batch_id"]
    plane.run_state_machine()
    plane.work()
    # the listing says whose turn each call is: notes_write names its own deciders, the
    # calculator (gated by the unit) falls back on approvals.deciders
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}/approvals")
    assert status == 200, doc
    waiting = {w["unit_id"]: w for w in doc["waiting"]}
    assert waiting["u0"]["tool"] == "notes_write" and waiting["u1"]["tool"] == "calculator"
    assert waiting["u0"]["deciders"] == ["swarm-operator-legal", "swarm-operator-security"]
    assert waiting["u1"]["deciders"] == ["swarm-operator-approver"]
    notes = f"/batches/{batch_id}/units/u0/approvals/{waiting['u0']['toolUseId']}"
    calc = f"/batches/{batch_id}/units/u1/approvals/{waiting['u1']['toolUseId']}"
    approve = {"decision": "approve"}
    # the tenant decides neither: each 403 names that call's deciders
    status, refused, _ = plane.api("POST", notes, approve)
    assert status == 403 and "swarm-operator-security" in refused["message"], refused
    assert "swarm-operator-approver" not in refused["message"]
    status, refused, _ = plane.api("POST", calc, approve)
    assert status == 403 and "swarm-operator-approver" in refused["message"], refused
    # the deployment's decider may not decide a tool naming its own, nor its deciders another
    status, refused, _ = plane.api("POST", notes, approve, operator=True, operator_name="approver")
    assert status == 403 and "swarm-operator-security" in refused["message"], refused
    status, refused, _ = plane.api("POST", calc, approve, operator=True, operator_name="legal")
    assert status == 403, refused
    # another tenant: the 404 of a batch that does not exist, before any decider check
    status, other, _ = plane.api("POST", notes, approve, tenant="globex")
    assert status == 404, other
    # each call's own deciders decide it
    status, decided, _ = plane.api("POST", notes, approve, operator=True, operator_name="legal")
    assert status == 200 and decided["decided_by"] == plane.operator_arn("legal"), decided
    status, decided, _ = plane.api("POST", calc, approve, operator=True, operator_name="approver")
    assert status == 200 and decided["decided_by"] == plane.operator_arn("approver"), decided
    # and a decided call is not answered to the tenant either: still its 403
    status, refused, _ = plane.api("POST", notes, approve)
    assert status == 403 and "swarm-operator-security" in refused["message"], refused


def test_the_listing_pages_by_parked_unit_and_refuses_a_bad_limit_or_token(
    plane: ControlPlane,
) -> None:
    # Given a batch of three parked units (one waiting call each) and another parked batch
    batch_id = parked_batch(plane, 3)
    other_id = parked_batch(plane, 1)
    route = f"/batches/{batch_id}/approvals"
    status, whole, _ = plane.api("GET", route)
    assert status == 200 and len(whole["waiting"]) == 3 and whole["next_token"] is None, whole
    # When the tenant reads it a unit a page, following next_token
    seen: list[str] = []
    token: str | None = None
    for _ in range(5):
        query = {"limit": "1"} | ({"next_token": token} if token else {})
        status, page, _ = plane.api("GET", route, query=query)
        assert status == 200 and len(page["waiting"]) <= 1, page
        seen += [w["unit_id"] for w in page["waiting"]]
        token = page["next_token"]
        if token is None:
            break
    # Then the pages list each unit once, in the order of the whole listing
    assert seen == [w["unit_id"] for w in whole["waiting"]], seen
    status, first, _ = plane.api("GET", route, query={"limit": "1"})
    assert first["next_token"], first
    # a bad limit, a made-up token, or a token of another batch is a 400 naming the field
    for query, field in (
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"next_token": "garbage!"}, "next_token"),
        ({"sort": "asc"}, "sort"),
    ):
        status, bad, _ = plane.api("GET", route, query=query)
        assert status == 400 and bad["message"].startswith(field), (query, bad)
    query = {"next_token": first["next_token"]}
    status, bad, _ = plane.api("GET", f"/batches/{other_id}/approvals", query=query)
    assert status == 400 and bad["message"].startswith("next_token: is a token of another"), bad
