"""Manifest uploads on moto, IAM enforced per function role: ``POST /uploads`` answers a URL the
API function's role presigned, the tenant PUTs its manifest there with no S3 rights of its own,
and submits the key; S3 (moto, judged by swarm.local.patches.iam as S3 judges a presigned
request) takes exactly the signed request once. The fan-out takes tenant and lane from the
ledger even when the manifest in S3 says otherwise."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import requests

from swarm.api.models import MAX_MANIFEST_BYTES
from swarm.core.codec import parse_message
from swarm.core.records import Lane
from swarm.local.patches import iam
from tests.integration.plane import ControlPlane, ledger, units
from tests.integration.test_functions import objects


def executions(plane: ControlPlane) -> list[str]:
    sfn = plane.client("stepfunctions")
    listed = sfn.list_executions(stateMachineArn=plane.state_machine_arn)["executions"]
    return [e["name"] for e in listed]


def put(doc: dict[str, Any], body: bytes, **headers: str) -> requests.Response:
    """The upload as a tenant's HTTP client sends it: the answer's method, URL and headers."""
    sent = {**doc["headers"], **headers}
    return requests.request(doc["method"], doc["url"], data=body, headers=sent, timeout=10)


def test_a_tenant_uploads_through_the_url_and_submits_the_key(plane: ControlPlane) -> None:
    body = json.dumps(units(20)).encode()
    # When acme asks for an upload
    status, doc, _ = plane.api("POST", "/uploads", {"size_bytes": len(body)})
    assert status == 200, doc
    key = doc["key"]
    assert key.startswith("manifests/uploads/acme/") and doc["method"] == "PUT"
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(doc["url"]).query)
    assert query["X-Amz-Expires"] == ["300"]  # cdk.json uploads.url_seconds
    assert query["X-Amz-SignedHeaders"] == ["content-length;content-type;host;if-none-match"]
    # Then the PUT needs no rights of the tenant's: the URL carries the API role's
    assert put(doc, body).status_code == 200
    api_role = plane.functions["api"].role_arn.rsplit("/", 1)[-1]
    arn = f"arn:aws:s3:::{plane.bucket}/{key}"
    assert any(
        iam.role_of(principal) == api_role and ("s3:PutObject", arn) in pairs
        for principal, pairs in iam.AUDIT.used.items()
    )
    # and the key is a manifest the tenant submits
    status, batch, _ = plane.api("POST", "/batches", {"manifest": {"key": key}, "lane": "low"})
    assert status == 201 and batch["units"] == 20, batch
    plane.run_to_close(batch["batch_id"])
    assert ledger(plane).run(batch["batch_id"]).completed == 20


def test_the_url_takes_exactly_the_signed_request_once(plane: ControlPlane) -> None:
    body = json.dumps(units(3)).encode()
    _, doc, _ = plane.api("POST", "/uploads", {"size_bytes": len(body)})
    # another size than signed (S3 signs Content-Length: no bigger upload), another type, no
    # write-once, or an unsigned x-amz header (e.g. the holder's own encryption): refused
    assert put(doc, body + b" ").status_code == 403
    assert put(doc, body, **{"Content-Type": "text/plain"}).status_code == 403
    unconditional = {k: v for k, v in doc["headers"].items() if k != "If-None-Match"}
    response = requests.put(doc["url"], data=body, headers=unconditional, timeout=10)
    assert response.status_code == 403
    assert put(doc, body, **{"x-amz-server-side-encryption": "aws:kms"}).status_code == 403
    # another key with the same signature
    other = doc["url"].replace(doc["key"].rsplit("/", 1)[-1], "mine.json")
    assert requests.put(other, data=body, headers=doc["headers"], timeout=10).status_code == 403
    assert objects(plane, "manifests/") == []
    # the signed request writes once; the URL cannot replace it afterwards
    assert put(doc, body).status_code == 200
    assert put(doc, json.dumps(units(3, prefix="x")).encode()).status_code == 412
    stored = plane.client("s3").get_object(Bucket=plane.bucket, Key=doc["key"])["Body"].read()
    assert stored == body


def test_another_tenant_cannot_submit_an_upload(plane: ControlPlane) -> None:
    body = json.dumps(units(2)).encode()
    _, doc, _ = plane.api("POST", "/uploads", {"size_bytes": len(body)})
    assert put(doc, body).status_code == 200
    status, refused, _ = plane.api(
        "POST", "/batches", {"manifest": {"key": doc["key"]}}, tenant="globex"
    )
    assert status == 400, refused
    assert refused["message"].startswith("manifest.key: must be an object under")
    assert "manifests/uploads/globex/" in refused["message"]
    assert executions(plane) == [] and objects(plane, "manifests/b-") == []


def test_upload_requests_are_checked_like_every_other(plane: ControlPlane) -> None:
    for body, field in (
        ({"size_bytes": 0}, "size_bytes"),
        ({"size_bytes": MAX_MANIFEST_BYTES + 1}, "size_bytes"),
        ({"size_bytes": 10, "key": "manifests/uploads/globex/x.json"}, "key"),
    ):
        status, doc, _ = plane.api("POST", "/uploads", body)
        assert status == 400 and doc["message"].startswith(f"{field}:"), doc
    status, doc, _ = plane.api("POST", "/uploads", raw="[" * 5_000)
    assert status == 400 and doc["error"] == "invalid_request"
    status, doc, _ = plane.api("POST", "/uploads", {"size_bytes": 10}, tenant=None)
    assert status == 401
    status, doc, _ = plane.api("POST", "/uploads", {"size_bytes": 10}, operator=True)
    assert status == 403 and doc["error"] == "forbidden"


def test_a_manifest_over_the_limit_is_refused_before_it_is_read(plane: ControlPlane) -> None:
    # Given an object over the limit under acme's prefix, written by someone with S3 rights (an
    # upload URL cannot write it: S3 checks its signed size)
    key = "manifests/uploads/acme/huge.json"
    huge = b"[" + b" " * MAX_MANIFEST_BYTES + b"]"
    plane.client("s3").put_object(Bucket=plane.bucket, Key=key, Body=huge)
    # When it is submitted, then the API answers 413 naming the key, and writes nothing
    status, doc, _ = plane.api("POST", "/batches", {"manifest": {"key": key}})
    assert status == 413 and doc["error"] == "too_large", doc
    assert doc["message"].startswith(f"manifest.key: {key!r} is 33,554,434 bytes; the limit is")
    assert executions(plane) == [] and objects(plane, "manifests/b-") == []


def test_the_fan_out_ignores_a_manifest_items_tenant_and_lane(plane: ControlPlane) -> None:
    # Given acme's batch on the low lane, whose manifest in S3 is then rewritten to say globex
    # and the high lane (whoever could write it)
    status, batch, _ = plane.api("POST", "/batches", {"units": units(3), "lane": "low"})
    assert status == 201
    key = f"manifests/{batch['batch_id']}/units.json"
    s3 = plane.client("s3")
    manifest = json.loads(s3.get_object(Bucket=plane.bucket, Key=key)["Body"].read())
    forged = [{**item, "tenant": "globex", "lane": "high", "tokens": 1} for item in manifest]
    s3.put_object(Bucket=plane.bucket, Key=key, Body=json.dumps(forged).encode())
    # When the map fans it out
    plane.run_state_machine()
    # Then every unit is on acme's lane, as acme's, reserving what the ledger holds
    assert plane.receive(Lane.HIGH) == []
    sent = [q for m in plane.receive(Lane.LOW) for q in parse_message(m["Body"])]
    assert sorted(q.unit_id for q in sent) == ["u0000", "u0001", "u0002"]
    assert {(q.tenant, q.lane) for q in sent} == {("acme", Lane.LOW)}
    assert sorted(q.tokens for q in sent) == [10_000, 10_013, 10_026]
    assert ledger(plane).run(batch["batch_id"]).reserved == 30_039
