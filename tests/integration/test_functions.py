"""The Lambda handlers on in-process moto, driven with the events AWS would send them."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

import functions.api as api_function
import functions.dlq as dlq_function
import functions.drain as drain_function
import functions.worker as worker_handler
from swarm.adapters.aws import SsmDrainSwitch
from swarm.contract import (
    GOVERNOR_TABLE_NAME,
    LEASE_SECONDS,
    MODELS,
    worker_mapping_var,
)
from swarm.core.codec import message_body, parse_message
from swarm.core.lanes import QueuedUnit
from swarm.core.records import LANES, Lane, RunState, UnitState
from swarm.local.patches import iam
from tests.integration.plane import (
    ControlPlane,
    control_plane,
    freeze_sqs_clock,
    ledger,
    units,
)
from tests.integration.test_tenants import limits as tenant_limits


def objects(plane: ControlPlane, prefix: str = "") -> list[str]:
    listing = plane.client("s3").list_objects_v2(Bucket=plane.bucket, Prefix=prefix)
    return [o["Key"] for o in listing.get("Contents", [])]


def items(plane: ControlPlane) -> int:
    """Every item of the ledger's and the governor's tables, but the tenants' role bindings
    (written at a tenant's first authenticated call, whatever the request)."""
    dynamodb = plane.client("dynamodb")
    tables = (plane.ledger_table, plane.env("worker")[GOVERNOR_TABLE_NAME])
    return sum(
        1
        for table in tables
        for item in dynamodb.scan(TableName=table)["Items"]
        if not item["pk"]["S"].startswith("tenant#")
    )


def test_a_batch_runs_through_admission_workers_and_the_finalizer(plane: ControlPlane) -> None:
    # Given a tenant's batch of 60 units submitted through the API
    status, doc, headers = plane.api("POST", "/batches", {"units": units(60), "budget": 2_000_000})
    assert status == 201 and headers["Location"] == f"/batches/{doc['batch_id']}"
    batch_id = doc["batch_id"]
    # When the state machine fans it out and the workers drain the lanes
    result = plane.run_to_close(batch_id)
    # Then the run completes, the books reconcile and the results are written
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}")
    assert status == 200
    assert doc["state"] == "completed" and doc["counts"]["completed"] == 60
    attempts = ledger(plane).attempts(batch_id)
    assert doc["tokens"]["spent"] == sum(a.tokens for a in attempts)
    assert doc["tokens"]["reserved"] == 0
    assert doc["healthy_line"].startswith("run.completed: completed 60/60")
    assert result["results_key"] in objects(plane, "results/")


def test_exhaustion_enumerates_the_remainder_and_resume_completes_it(plane: ControlPlane) -> None:
    status, doc, _ = plane.api("POST", "/batches", {"units": units(30), "budget": 150_000})
    batch_id = doc["batch_id"]
    plane.run_to_close(batch_id)
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}")
    assert doc["state"] == "exhausted"
    assert doc["tokens"]["spent"] <= 150_000
    remainder = doc["remainder"]
    assert len(remainder) == doc["counts"]["remainder"] == 30 - doc["counts"]["completed"]
    assert f"results/{batch_id}/remainder-1.json" in objects(plane, "results/")
    done_before = {
        u.unit_id for u in ledger(plane).units(batch_id) if u.state is UnitState.COMPLETED
    }
    # When the tenant tops up and resumes
    status, doc, _ = plane.api("POST", f"/batches/{batch_id}/resume", {"top_up": 500_000})
    assert status == 200 and doc["requeued"] == len(remainder) and doc["state"] == "open"
    plane.run_to_close(batch_id)
    status, doc, _ = plane.api("GET", f"/batches/{batch_id}")
    assert doc["state"] == "completed" and doc["counts"]["completed"] == 30
    for attempt in ledger(plane).attempts(batch_id):  # nothing completed ran again
        assert attempt.unit_id not in done_before or attempt.attempt == 0
    # resuming a completed batch is a conflict
    status, doc, _ = plane.api("POST", f"/batches/{batch_id}/resume", {"top_up": 1})
    assert status == 409 and doc["error"] == "conflict"


def results(plane: ControlPlane, batch_id: str, **query: str) -> list[dict[str, Any]]:
    """Every unit of ``GET /batches/{id}/results``, page after page."""
    units: list[dict[str, Any]] = []
    while True:
        status, doc, _ = plane.api("GET", f"/batches/{batch_id}/results", query=query)
        assert status == 200, doc
        units += doc["units"]
        if "next_token" not in doc:
            return units
        query = {**query, "next_token": doc["next_token"]}


def test_outputs_are_kept_once_read_by_page_and_downloadable_by_their_tenant_only(
    aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with control_plane(monkeypatch, SIM_MODEL_FAILURE_RATE="0.3") as plane:
        plane.observe_events()
        _, doc, _ = plane.api("POST", "/batches", {"units": units(12)})
        batch_id = doc["batch_id"]
        plane.run_state_machine()
        plane.work()
        # readable before the finalizer has closed anything: no download yet
        status, page, _ = plane.api("GET", f"/batches/{batch_id}/results", query={"limit": "5"})
        assert status == 200 and len(page["units"]) == 5 and "download" not in page
        # then to its closure: a unit failed twice may still wait out its backoff in its lane
        # (the work above waits 30 s for delayed copies: exceeded under CI's load), and the
        # closure's results file may take more than one poll (the finalizer stops writing when
        # its time is up, and goes on at its next poll)
        plane.run_to_close(batch_id, timeout_s=180.0)
        # the workers wrote each attempt's outcome under the run's prefix, as their own role,
        # an invocation's outcomes in one object (a page): fewer objects than attempts
        s3 = plane.client("s3")
        docs = [
            json.loads(s3.get_object(Bucket=plane.bucket, Key=k)["Body"].read())
            for k in objects(plane, f"results/{batch_id}/attempts/")
        ]
        kept = [o for d in docs for o in d.get("outcomes", [d])]
        assert len(kept) == ledger(plane).run(batch_id).attempts > len(docs)
        got = results(plane, batch_id, limit="4")
        assert [u["unit_id"] for u in got] == [f"u{i:04d}" for i in range(12)]
        for unit in got:
            assert ("output" in unit) == (unit["state"] == "completed")
            assert unit["model_id"]
        completed = results(plane, batch_id, state="completed")
        assert completed == [u for u in got if u["state"] == "completed"]
        # the download: a presigned GET of exactly the closure's results file
        _, page, _ = plane.api("GET", f"/batches/{batch_id}/results")
        download = page["download"]
        key = f"results/{batch_id}/completed-0.jsonl"
        assert download["location"] == f"s3://{plane.bucket}/{key}"
        assert f"/{key}?" in download["url"] and "X-Amz-Expires=300" in download["url"]
        body = requests.get(download["url"], timeout=10).content  # the URL, as a tenant uses it
        assert [json.loads(line) for line in body.splitlines()] == got
        # scoped to the one object, and signed: another key or a changed signature is refused
        other = download["url"].replace("completed-0.jsonl", "completed-1.jsonl")
        assert requests.get(other, timeout=10).status_code == 403
        forged = download["url"][:-1] + ("0" if download["url"][-1] != "0" else "1")
        assert requests.get(forged, timeout=10).status_code == 403
        # the closure's event says where they are
        (event,) = [e for e in plane.events() if e["detail"]["run_id"] == batch_id]
        assert event["detail"]["results"]["location"] == download["location"]
        # another tenant: the same 404 as for a batch that does not exist
        status, doc, _ = plane.api("GET", f"/batches/{batch_id}/results", tenant="globex")
        assert status == 404 and doc["error"] == "not_found"
        status, doc, _ = plane.api(
            "GET", f"/batches/{batch_id}/results", query={"state": "finished"}
        )
        assert status == 400 and doc["message"].startswith("state:")


def test_operators_own_the_fleet_views_and_tenants_are_bound_to_their_roles(
    plane: ControlPlane,
) -> None:
    # tenants see their own batches; the fleet-wide views are an operator's
    _, doc, _ = plane.api("POST", "/batches", {"units": units(1)}, tenant="acme")
    batch_id = doc["batch_id"]
    for path in ("/fleet", "/drain"):
        status, body, _ = plane.api("GET", path, tenant="acme")
        assert status == 403 and "operator" in body["message"], body
        status, _, _ = plane.api("GET", path, operator=True)
        assert status == 200
    # an operator reads any batch, but is nobody's tenant
    status, body, _ = plane.api("GET", f"/batches/{batch_id}", operator=True)
    assert status == 200 and body["tenant"] == "acme"
    status, body, _ = plane.api("POST", "/batches", {"units": units(1)}, operator=True)
    assert status == 403 and "not tenants" in body["message"]
    # acme's role is deleted and created again: same name, a new unique id; refused, and
    # nothing written, until an operator re-binds the tenant
    recreated = "AROA" + "N" * 17
    status, body, _ = plane.api("GET", f"/batches/{batch_id}", tenant="acme", role_id=recreated)
    assert status == 403 and "swarm rebind acme" in body["message"]
    status, body, _ = plane.api("POST", "/tenants/acme/rebind", tenant="acme")
    assert status == 403  # tenants cannot re-bind themselves
    status, body, _ = plane.api("POST", "/tenants/acme/rebind", operator=True)
    assert status == 200 and body == {"tenant": "acme", "was_bound": True}
    status, body, _ = plane.api("GET", f"/batches/{batch_id}", tenant="acme", role_id=recreated)
    assert status == 200 and body["batch_id"] == batch_id
    status, body, _ = plane.api("POST", "/tenants/a%20b/rebind", operator=True)
    assert status == 400 and body["error"] == "invalid_request"
    # the path as a client sends it, percent-encoded (the fuzzer's tenant 's=y.Nj' was a 400)
    status, body, _ = plane.api("POST", "/tenants/s%3Dy.N%40j/rebind", operator=True)
    assert status == 200 and body == {"tenant": "s=y.N@j", "was_bound": False}


def test_a_duplicate_sqs_delivery_settles_once(plane: ControlPlane) -> None:
    _, doc, _ = plane.api("POST", "/batches", {"units": units(2)})
    batch_id = doc["batch_id"]
    plane.run_state_machine()
    # the fan-out sent the two units due together as one message (a bundle)
    [message] = plane.receive(Lane.NORMAL)
    assert [u.unit_id for u in parse_message(message["Body"])] == ["u0001", "u0000"]
    plane.deliver(Lane.NORMAL, [message, message])  # the same message twice in one batch
    attempts = ledger(plane).attempts(batch_id)
    assert sorted((a.unit_id, a.attempt) for a in attempts) == [("u0000", 0), ("u0001", 0)]
    run = ledger(plane).run(batch_id)
    assert run.state is RunState.COMPLETED
    assert run.spent == sum(a.tokens for a in attempts)


def test_failed_attempts_are_redelivered_and_their_tokens_counted(
    aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with control_plane(monkeypatch, SIM_MODEL_FAILURE_RATE="0.3") as plane:
        _, doc, _ = plane.api("POST", "/batches", {"units": units(40)})
        batch_id = doc["batch_id"]
        plane.run_to_close(batch_id)
        run = ledger(plane).run(batch_id)
        attempts = ledger(plane).attempts(batch_id)
        failed = [a for a in attempts if not a.succeeded]
        assert failed and run.retries > 0
        assert run.spent == sum(a.tokens for a in attempts)  # failed attempts billed too
        assert run.completed + run.dead_lettered == 40


def test_a_worker_dying_mid_unit_is_redelivered_and_the_lost_attempt_counted(
    aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with control_plane(monkeypatch, LEASE_SECONDS="1") as plane:
        _, doc, _ = plane.api("POST", "/batches", {"units": units(1)})
        batch_id = doc["batch_id"]
        plane.run_state_machine()
        [message] = plane.receive(Lane.NORMAL)
        # the worker claimed the attempt, called the model, and died before settling
        assert ledger(plane).claim(batch_id, "u0000", 0, time.time(), 1.0).claimed
        time.sleep(1.2)  # the visibility timeout and the claim's lease run out
        [again] = plane.receive(Lane.NORMAL)
        assert again["MessageId"] == message["MessageId"]
        plane.deliver(Lane.NORMAL, [again])
        attempts = ledger(plane).attempts(batch_id)
        assert [(a.attempt, a.succeeded, a.reclaimed) for a in attempts] == [
            (0, False, True),
            (1, True, False),
        ]
        # the lost attempt counts its whole reservation; the retry what the model billed
        retry = next(a for a in attempts if a.attempt == 1)
        assert 0 < retry.tokens <= 10_000
        assert ledger(plane).run(batch_id).spent == 10_000 + retry.tokens


def test_draining_gives_503_and_workers_take_nothing_new(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 4 units queued on their lane, and SQS on a clock that moves only when told to
    _, doc, _ = plane.api("POST", "/batches", {"units": units(4)})
    batch_id = doc["batch_id"]
    plane.run_state_machine()
    clock = freeze_sqs_clock(monkeypatch)
    # When the operator drains: new submissions get 503 with Retry-After
    plane.set_drain(True)
    status, body, headers = plane.api("POST", "/batches", {"units": units(1)})
    assert status == 503 and body["error"] == "draining" and int(headers["Retry-After"]) > 0
    # and a worker handed the 4 units (one message: due together, they travel as a bundle)
    # runs nothing and reports no failure (the ESM deletes the message)
    originals = plane.receive(Lane.NORMAL)
    assert [len(parse_message(m["Body"])) for m in originals] == [4]
    response = plane.deliver(Lane.NORMAL, originals)
    assert response["batchItemFailures"] == []
    assert ledger(plane).run(batch_id).spent == 0 and ledger(plane).attempts(batch_id) == []
    status, body, _ = plane.api("GET", "/drain", operator=True)
    assert body["draining"] is True
    # Then the lane holds exactly the worker's own copies, delayed (the 4 units due together,
    # one message again): the original is gone
    assert lane_counts(plane, Lane.NORMAL) == {"visible": 0, "in_flight": 0, "delayed": 1}
    worker, *_ = worker_handler._services()
    delay = math.ceil(worker.config.requeue_delay_s)
    clock.advance(delay - 0.001)  # a millisecond before the delay ends, nothing is deliverable
    assert plane.receive(Lane.NORMAL) == []
    clock.advance(0.001)  # and at the delay, all 4 are
    assert lane_counts(plane, Lane.NORMAL) == {"visible": 1, "in_flight": 0, "delayed": 0}
    plane.set_drain(False)
    # past the original's visibility timeout too (it would be back had it not been deleted)
    clock.advance(int(plane.env("worker")[LEASE_SECONDS]))
    copies = plane.receive(Lane.NORMAL)
    assert [len(parse_message(m["Body"])) for m in copies] == [4]
    assert not {m["MessageId"] for m in copies} & {m["MessageId"] for m in originals}
    assert all(m["Attributes"]["ApproximateReceiveCount"] == "1" for m in copies)

    # each copy carries its original's unit and lane, unchanged
    def by_unit(messages: list[Any]) -> dict[str, QueuedUnit]:
        return {q.unit_id: q for m in messages for q in parse_message(m["Body"])}

    assert by_unit(copies) == by_unit(originals)
    assert {q.lane for q in by_unit(copies).values()} == {Lane.NORMAL}
    # and delivering those copies (not re-sent bodies) completes every unit, once
    plane.deliver(Lane.NORMAL, copies)
    assert plane.receive(Lane.NORMAL) == []
    assert ledger(plane).run(batch_id).completed == 4
    assert sorted((a.unit_id, a.attempt) for a in ledger(plane).attempts(batch_id)) == [
        (f"u{i:04d}", 0) for i in range(4)
    ]


def lane_counts(plane: ControlPlane, lane: Lane) -> dict[str, int]:
    names = {
        "visible": "ApproximateNumberOfMessages",
        "in_flight": "ApproximateNumberOfMessagesNotVisible",
        "delayed": "ApproximateNumberOfMessagesDelayed",
    }
    attrs = plane.client("sqs").get_queue_attributes(
        QueueUrl=plane.queue_urls[lane], AttributeNames=list(names.values())
    )["Attributes"]
    return {key: int(attrs[name]) for key, name in names.items()}


def test_deep_lanes_shed_new_submissions_with_retry_after(
    aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every tenant's guaranteed share: 10 units (tests/integration/test_tenants.py: the caps)
    share = tenant_limits(guaranteed_units=10)
    with control_plane(
        monkeypatch, SHED_DEPTH_LOW="10", SHED_DEPTH_NORMAL="50", TENANT_LIMITS=share
    ) as plane:
        plane.api("POST", "/batches", {"units": units(20), "lane": "normal"})
        plane.run_state_machine()
        # acme, past its share, meets the lanes' ceiling
        status, body, headers = plane.api("POST", "/batches", {"units": units(2), "lane": "low"})
        assert status == 429 and body["error"] == "shedding"
        assert "lane_depth" in body["message"]
        assert int(headers["Retry-After"]) >= 1
        status, _, _ = plane.api("POST", "/batches", {"units": units(2), "lane": "high"})
        assert status == 201  # higher lanes shed last
        # another tenant within its share is not refused by the lanes acme filled
        status, _, _ = plane.api(
            "POST", "/batches", {"units": units(2), "lane": "low"}, tenant="small"
        )
        assert status == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"units": [{"unit_id": "a", "projected_tokens": 0}]}, "units[0].projected_tokens"),
        ({"units": [{"unit_id": "a b", "projected_tokens": 5}]}, "units[0].unit_id"),
        # the model's prompt: Bedrock refuses an empty or whitespace-only one
        ({"units": [{"unit_id": "a", "projected_tokens": 5}]}, "units[0].input"),
        ({"units": [{"unit_id": "a", "projected_tokens": 5, "input": " \n\t"}]}, "units[0].input"),
        ({"units": []}, "units"),
        ({"lane": "urgent", "units": units(1)}, "lane"),
        ({"units": units(1), "budget": -1}, "budget"),
        ({"units": units(1), "budget": "lots"}, "budget"),
        ({}, "body"),
        ({"units": units(1), "manifest": {"key": "x"}}, "body"),
        ({"manifest": {"key": "manifests/uploads/other/x.json"}}, "manifest.key"),
        ({"units": [*units(1), *units(1)]}, "units"),
    ],
)
def test_malformed_submissions_get_400_naming_the_field_and_write_nothing(
    plane: ControlPlane, body: dict[str, Any], field: str
) -> None:
    status, doc, _ = plane.api("POST", "/batches", body)
    assert status == 400, doc
    assert doc["error"] == "invalid_request"
    assert doc["message"].startswith(f"{field}:"), doc["message"]
    assert objects(plane) == []
    assert items(plane) == 0


def _agent_unit(tool_choice: Any) -> dict[str, Any]:
    return {
        "unit_id": "agent-1",
        "projected_tokens": 20_000,
        "input": {
            "messages": [{"role": "user", "content": [{"text": "Add 2 and 2."}]}],
            "tools": ["calculator", "notes_read"],
            "toolChoice": tool_choice,
        },
    }


@pytest.mark.parametrize(
    ("model_id", "choice", "takes"),
    [
        ("meta.llama3-1-70b-instruct-v1:0", {"tool": "calculator"}, 'takes "auto" from it'),
        ("us.meta.llama3-3-70b-instruct-v1:0", "any", 'takes "auto" from it'),
        ("mistral.mistral-large-2407-v1:0", {"tool": "calculator"}, '"auto" and "any"'),
    ],
)
def test_a_tool_choice_the_deployments_model_does_not_take_is_a_400_naming_the_field(
    aws_credentials: None,
    monkeypatch: pytest.MonkeyPatch,
    model_id: str,
    choice: Any,
    takes: str,
) -> None:
    # Given a deployment whose model (cdk.json models.catalog.<default>.model_id) takes no such
    # choice
    one = {"model_id": model_id, "tpm": 6_000_000, "share": 0.95, "burndown": 1}
    overrides = {MODELS: json.dumps({"default": "m", "catalog": {"m": one}})}
    with control_plane(monkeypatch, None, **overrides) as plane:
        # When an agent unit forces that choice
        body = {"units": [units(1)[0], _agent_unit(choice)]}
        status, doc, _ = plane.api("POST", "/batches", body)
        # Then the 400 names the unit's toolChoice, the model and the choices it takes
        assert status == 400, doc
        assert doc["error"] == "invalid_request"
        assert doc["message"].startswith("units[1].input.toolChoice: "), doc["message"]
        assert model_id in doc["message"] and takes in doc["message"], doc["message"]
        assert objects(plane) == [] and items(plane) == 0  # nothing written
        # and the choice the model takes is accepted
        ok, accepted, _ = plane.api("POST", "/batches", {"units": [_agent_unit("auto")]})
        assert ok == 201, accepted


def test_a_forced_tool_choice_is_accepted_for_the_shipped_model(plane: ControlPlane) -> None:
    # cdk.json's model (an Anthropic Claude 3 model) takes every choice, a named tool too
    status, doc, _ = plane.api("POST", "/batches", {"units": [_agent_unit({"tool": "calculator"})]})
    assert status == 201, doc


def test_not_json_oversize_and_unauthorised_requests(plane: ControlPlane) -> None:
    status, doc, _ = plane.api("POST", "/batches", raw="{not json")
    assert status == 400 and "not valid JSON" in doc["message"]
    status, doc, _ = plane.api("POST", "/batches", {"units": units(10_001)})
    assert status == 413 and doc["error"] == "too_large" and "manifest" in doc["message"]
    status, doc, _ = plane.api("POST", "/batches", {"units": units(1)}, tenant=None)
    assert status == 401 and doc["error"] == "unauthenticated"
    event_arn = "arn:aws:sts::123456789012:assumed-role/SomeOtherRole/s"
    from swarm.local.events import proxy_event

    response = plane.invoke("api", proxy_event("GET", "/fleet", user_arn=event_arn, headers={}))
    assert response["statusCode"] == 403
    assert json.loads(response["body"])["error"] == "forbidden"
    # a role named like a tenant's, in another account, is not a tenant
    foreign = plane.tenant_arn("acme").replace(":123456789012:", ":210987654321:")
    body = json.dumps({"units": units(1)})
    event = proxy_event("POST", "/batches", body=body, user_arn=foreign, headers={})
    response = plane.invoke("api", event)
    assert response["statusCode"] == 403, response["body"]
    assert "not this deployment's" in json.loads(response["body"])["message"]
    assert objects(plane) == []


def test_tenants_are_isolated_and_idempotency_keys_are_honoured(plane: ControlPlane) -> None:
    headers = {"Idempotency-Key": "nightly-2026-11-29"}
    status, first, _ = plane.api("POST", "/batches", {"units": units(3)}, headers=headers)
    status2, again, _ = plane.api("POST", "/batches", {"units": units(3)}, headers=headers)
    assert (status, status2) == (201, 200) and first["batch_id"] == again["batch_id"]
    status, doc, _ = plane.api("POST", "/batches", {"units": units(4)}, headers=headers)
    assert status == 409
    status, doc, _ = plane.api("GET", f"/batches/{first['batch_id']}", tenant="globex")
    assert status == 404 and doc["error"] == "not_found"


def test_manifest_submissions_read_the_tenants_upload(plane: ControlPlane) -> None:
    key = "manifests/uploads/acme/big.json"
    plane.client("s3").put_object(Bucket=plane.bucket, Key=key, Body=json.dumps(units(25)).encode())
    status, doc, _ = plane.api("POST", "/batches", {"manifest": {"key": key}})
    assert status == 201 and doc["units"] == 25
    plane.run_to_close(doc["batch_id"])
    assert ledger(plane).run(doc["batch_id"]).completed == 25


def _remember_key(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    context["test_object"] = (params["Bucket"], params["Key"])


def _without_list_bucket(s3: Any) -> Callable[..., Any]:
    """S3 as a role without s3:ListBucket sees it: 403 AccessDenied for a missing key (``s3``:
    a client that may look)."""

    def before_call(context: dict[str, Any], **_: Any) -> Any:
        bucket, key = context["test_object"]
        try:
            s3.head_object(Bucket=bucket, Key=key)
        except s3.exceptions.ClientError:
            error = {"Code": "AccessDenied", "Message": "Access Denied"}
            meta = {"HTTPStatusCode": 403}
            return AWSResponse(f"https://s3/{key}", 403, {}, None), {
                "Error": error,
                "ResponseMetadata": meta,
            }
        return None

    return before_call


@pytest.mark.parametrize("list_bucket", [True, False], ids=["404", "403"])
def test_a_missing_upload_is_a_400_naming_it_whatever_s3_answers(
    plane: ControlPlane, list_bucket: bool
) -> None:
    # Given S3 answering a missing key with 404 (s3:ListBucket granted) or 403 (not granted;
    # the hook is on the API function's own S3 client)
    events = plane.functions["api"].clients("s3").meta.events
    denied = _without_list_bucket(plane.client("s3"))
    if not list_bucket:
        events.register("before-parameter-build.s3.GetObject", _remember_key)
        events.register("before-call.s3.GetObject", denied)
    try:
        # When a tenant submits a manifest key it never uploaded
        key = "manifests/uploads/acme/never-uploaded.json"
        status, doc, _ = plane.api("POST", "/batches", {"manifest": {"key": key}})
    finally:
        events.unregister("before-parameter-build.s3.GetObject", _remember_key)
        events.unregister("before-call.s3.GetObject", denied)
    # Then the caller gets a 400 naming the field and the key, and nothing is written
    assert status == 400, doc
    assert doc["error"] == "invalid_request"
    assert doc["message"].startswith("manifest.key: ") and key in doc["message"]
    assert objects(plane) == []
    assert items(plane) == 0


def test_an_upload_that_is_not_json_is_a_400(plane: ControlPlane) -> None:
    key = "manifests/uploads/acme/units.csv"
    plane.client("s3").put_object(Bucket=plane.bucket, Key=key, Body=b"unit_id,projected_tokens\n")
    status, doc, _ = plane.api("POST", "/batches", {"manifest": {"key": key}})
    assert status == 400 and doc["message"].startswith(f"manifest.key: {key!r} is not JSON"), doc


def test_fleet_view_and_dead_letter_queue(plane: ControlPlane) -> None:
    _, doc, _ = plane.api("POST", "/batches", {"units": units(2)})
    batch_id = doc["batch_id"]
    plane.run_state_machine()
    status, fleet, _ = plane.api("GET", "/fleet", operator=True)
    # the lanes' messages: the two units due together travel as one (a bundle)
    assert status == 200 and fleet["lanes"]["normal"]["visible"] == 1
    models = json.loads(plane.env("api")[MODELS])
    # each model's bucket, and the default model's as the fleet's governor
    assert set(fleet["models"]) == set(models["catalog"])
    for name, model in models["catalog"].items():
        shown = fleet["models"][name]
        assert shown["model_id"] == model["model_id"]
        assert shown["default"] is (name == models["default"])
        rate = model["tpm"] / 60 * model["share"]
        assert shown["governor"]["governed_rate_tps"] == pytest.approx(rate, abs=1e-3)
        # beside the figures, how many quota tokens an output token counts as: the model's
        # (cdk.json models.catalog.<name>.output_burndown, or Bedrock's documented rate)
        assert shown["governor"]["output_burndown"] == model["burndown"]
    assert fleet["governor"] == fleet["models"][models["default"]]["governor"]
    assert fleet["models"]["sonnet"]["governor"]["output_burndown"] == 5.0  # Claude Sonnet 4
    # a poison message that SQS moved to the DLQ ends each of its units as dead-lettered
    sqs = plane.client("sqs")
    [m] = plane.receive(Lane.NORMAL, max_messages=1)
    assert len(parse_message(m["Body"])) == 2
    sqs.send_message(QueueUrl=plane.dlq_url, MessageBody=m["Body"])
    sqs.delete_message(QueueUrl=plane.queue_urls[Lane.NORMAL], ReceiptHandle=m["ReceiptHandle"])
    plane.deliver(Lane.NORMAL, plane.receive(Lane.NORMAL, dlq=True), dlq=True)
    plane.work()
    run = ledger(plane).run(batch_id)
    assert (run.completed, run.dead_lettered, run.state) == (0, 2, RunState.COMPLETED)


def test_each_handler_runs_as_its_own_role_with_iam_enforced(plane: ControlPlane) -> None:
    # Given IAM enforced, every function signing with its own execution role as deployed
    refused_before = len(iam.AUDIT.report()["denied"])
    # When a batch runs through the API, the fan-out, the workers and the finalizer
    _, doc, _ = plane.api("POST", "/batches", {"units": units(2)})
    plane.run_to_close(doc["batch_id"])
    # Then nothing was refused, and each of them called as its own role
    report = iam.AUDIT.report()
    assert report["denied"][refused_before:] == []
    callers = {iam.role_of(principal) for principal in report["used"]}
    for function in ("api", "fanout", "worker", "finalizer"):
        assert plane.functions[function].role_arn.rsplit("/", 1)[1] in callers, function
    # and a function is refused what its role does not grant (the worker never writes S3)
    s3 = plane.functions["worker"].clients("s3")
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=plane.bucket, Key="results/forged.json", Body=b"{}")
    assert refused.value.response["Error"]["Code"] == "AccessDenied"


def test_drain_controller_disables_and_enables_the_worker_mappings(
    plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the worker's SQS mapping of each lane, as deployed
    uuids = [plane.env("drain")[worker_mapping_var(lane)] for lane in LANES]
    lam = plane.client("lambda")
    worker = plane.functions["worker"].name
    assert {
        lam.get_event_source_mapping(UUID=u)["FunctionArn"].rsplit(":", 1)[1] for u in uuids
    } == {worker}
    # When the operator turns the drain switch on, EventBridge invokes the controller
    plane.set_drain(True)
    report = plane.invoke("drain", {"detail-type": "Parameter Store Change"})
    # Then every worker mapping is disabled, and it is not yet safe to deploy: the functions'
    # cached reads of the switch may say "off" for a few more seconds
    assert set(report["mappings"].values()) <= {"Disabled", "Disabling"}
    assert report["draining"] and report["running"] == 0 and not report["settled"]
    assert not report["safe_to_deploy"]
    status, doc, _ = plane.api("GET", "/drain", operator=True)
    assert status == 200 and doc["draining"] and not doc["safe_to_deploy"]
    # ... and it is once they have expired
    later = time.time() + 2 * SsmDrainSwitch.ttl_s
    monkeypatch.setattr(drain_function, "time", SimpleNamespace(time=lambda: later))
    report = plane.invoke("drain", {"detail-type": "Parameter Store Change"})
    assert report["settled"] and report["safe_to_deploy"]
    for uuid in uuids:
        assert lam.get_event_source_mapping(UUID=uuid)["State"] in ("Disabled", "Disabling")
    plane.set_drain(False)
    report = plane.invoke("drain", {"detail-type": "Parameter Store Change"})
    assert set(report["mappings"].values()) <= {"Enabled", "Enabling"}
    assert not report["safe_to_deploy"]
    for uuid in uuids:
        assert lam.get_event_source_mapping(UUID=uuid)["State"] in ("Enabled", "Enabling")


def test_a_malformed_dead_letter_is_dropped_without_logging_its_body(
    plane: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    sqs = plane.client("sqs")
    secret = "the tenant's confidential prompt"
    sqs.send_message(QueueUrl=plane.dlq_url, MessageBody=f'{{"input": "{secret}"')
    messages = plane.receive(Lane.LOW, dlq=True)
    with caplog.at_level(logging.INFO):
        response = plane.deliver(Lane.LOW, messages, dlq=True)
    assert response["batchItemFailures"] == []  # dropped: nothing to settle, not retried
    [dropped] = [r for r in caplog.records if r.getMessage() == "malformed dead letter dropped"]
    logged = " ".join(repr(vars(r)) for r in caplog.records)
    assert secret not in logged
    assert vars(dropped)["message_id"] == messages[0]["MessageId"]  # how to find it in the DLQ


class FormattedLines(logging.Handler):
    """The JSON lines a function's Powertools logger writes, formatted as they are logged (its
    appended keys are applied at that moment, not when a test reads the records)."""

    def __init__(self, logger: Any) -> None:
        super().__init__()
        self.setFormatter(logger.registered_formatter)
        self.lines: list[dict[str, Any]] = []
        self._target = logger._logger

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))

    def __enter__(self) -> FormattedLines:
        self._target.addHandler(self)
        return self

    def __exit__(self, *_: object) -> None:
        self._target.removeHandler(self)


def test_log_lines_carry_their_own_ids_never_an_earlier_records_or_invocations(
    plane: ControlPlane,
) -> None:
    # Given a batch's unit dead-lettered in one record, and a malformed record after it
    status, doc, _ = plane.api("POST", "/batches", {"units": units(1), "lane": "low"})
    assert status == 201, doc
    batch_id = doc["batch_id"]
    assert plane.open_batch(batch_id) == 1  # its execution's open step
    sqs = plane.client("sqs")
    unit = QueuedUnit(batch_id, "u0000", "acme", Lane.LOW, 0, 10_000, "unit 0")
    sqs.send_message(QueueUrl=plane.dlq_url, MessageBody=message_body(unit))
    sqs.send_message(QueueUrl=plane.dlq_url, MessageBody='{"unit_id": ')
    messages = plane.receive(Lane.LOW, dlq=True)
    assert len(messages) == 2
    # When the dead-letter function takes both in one batch, and the API serves a submit and
    # then another request in the same (warm) container
    with FormattedLines(dlq_function.logger) as dlq_lines:
        plane.deliver(Lane.LOW, messages, dlq=True)
    status, _, _ = plane.api("POST", "/batches", {"units": units(1), "lane": "low"})
    assert status == 201  # its invocation names that batch in its lines
    with FormattedLines(api_function.logger) as api_lines:
        status, _, _ = plane.api("POST", "/uploads", {"size_bytes": 10})
    assert status == 200
    # Then the unit's line names its batch, the malformed record's line does not, and the next
    # invocation's lines carry nothing of the one before
    by_message = {line["message"]: line for line in dlq_lines.lines}
    assert by_message["unit dead-lettered by the queue"]["batch_id"] == batch_id
    assert "batch_id" not in by_message["malformed dead letter dropped"]
    [granted] = [line for line in api_lines.lines if line["message"] == "upload URL granted"]
    assert "batch_id" not in granted and granted["tenant"] == "acme"


@pytest.mark.parametrize("batch_id", ["b" * 3_000, "bad%20id"])
def test_a_batch_id_that_cannot_exist_is_a_404_not_a_server_error(
    plane: ControlPlane, batch_id: str
) -> None:
    """DynamoDB refuses a partition key over 2,048 bytes with a ValidationException (a 500)."""
    for method, path, body in (
        ("GET", f"/batches/{batch_id}", None),
        ("POST", f"/batches/{batch_id}/resume", {"top_up": 10}),
    ):
        status, doc, _ = plane.api(method, path, body)
        assert (status, doc["error"]) == (404, "not_found"), doc
