"""Manifest uploads on the in-memory twins: ``POST /uploads`` gives a URL that writes one new key
under the caller's own prefix, once, of exactly the size asked for; a submit reads only the
caller's own uploads, and refuses one over the size limit without parsing it; the fan-out takes
who pays and which lane from the ledger, never from a manifest item."""

from __future__ import annotations

import io
import json
import urllib.parse
from typing import Any

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from swarm.adapters.aws import S3Blobs
from swarm.adapters.s3_results import S3_SIGV4
from swarm.api.models import MAX_MANIFEST_BYTES, UPLOADS_PREFIX, UploadRequest
from swarm.core import codec
from swarm.core.backpressure import ShedPolicy
from swarm.core.errors import Conflict, InvalidInput, NotFound, ObjectTooLarge
from swarm.core.governor import GovernorConfig
from swarm.core.memory import (
    InMemoryGovernor,
    InMemoryLedger,
    MemoryBlobs,
    MemoryDrain,
    MemoryExecutions,
    MemoryQueue,
)
from swarm.core.records import Lane, RunSpec, UnitSpec
from swarm.service.api_models import TooLarge, check_manifest_key, parse_submit, parse_upload
from swarm.service.batches import Batches, BatchesConfig, manifest_items
from swarm.service.fanout import FanOut
from swarm.service.opener import open_at_once
from swarm.service.uploads import Uploads

NOW = 1_700_000_000.75


def unit(unit_id: str, tokens: int = 1_000) -> dict[str, Any]:
    return {"unit_id": unit_id, "projected_tokens": tokens, "input": f"work {unit_id}"}


def manifest(n: int) -> bytes:
    return json.dumps([unit(f"u{i:03d}") for i in range(n)]).encode()


def batches(blobs: MemoryBlobs) -> Batches:
    ledger = InMemoryLedger()
    return Batches(
        ledger,
        InMemoryGovernor(GovernorConfig(600_000, 0.95, initial_fill=1.0), now=0.0),
        MemoryQueue(),
        blobs,
        MemoryExecutions(open_step=open_at_once(ledger, blobs)),
        MemoryDrain(),
        BatchesConfig(ShedPolicy({}), max_budget=10**9, default_budget=10**6),
    )


def grant(uploads: Uploads, tenant: str, size: int) -> dict[str, Any]:
    return uploads.grant(tenant, UploadRequest(size_bytes=size), NOW)


def submit_manifest(service: Batches, tenant: str, key: str) -> Any:
    body = parse_submit(json.dumps({"manifest": {"key": key}, "lane": "low"}))
    return service.submit_body(tenant, body, None, NOW)


# ------------------------------------------------------------------ the URL


def test_an_upload_is_a_new_key_under_the_callers_prefix_with_a_short_lived_put() -> None:
    uploads = Uploads(MemoryBlobs(), url_s=120)
    first, second = grant(uploads, "acme", 500), grant(uploads, "acme", 500)
    assert first["key"].startswith(f"{UPLOADS_PREFIX}acme/") and first["key"].endswith(".json")
    assert first["key"] != second["key"]  # generated per request: nobody can name another's
    check_manifest_key("acme", first["key"])  # what a submit of acme accepts
    with pytest.raises(InvalidInput, match="must be an object under manifests/uploads/globex/"):
        check_manifest_key("globex", first["key"])
    assert first["method"] == "PUT"
    assert first["headers"] == {
        "Content-Type": "application/json",
        "Content-Length": "500",
        "If-None-Match": "*",
    }
    assert (first["expires_in_s"], first["expires_at"]) == (120, 1_700_000_120)


def test_a_tenant_with_every_character_a_role_name_may_hold_gets_its_own_prefix() -> None:
    doc = grant(Uploads(MemoryBlobs()), "a+b=c,d.e@f_g-h", 10)
    assert doc["key"].startswith(f"{UPLOADS_PREFIX}a+b=c,d.e@f_g-h/")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"size_bytes": 0}, "size_bytes: Input should be greater than or equal to 1"),
        ({"size_bytes": MAX_MANIFEST_BYTES + 1}, "size_bytes: Input should be less than or"),
        ({"size_bytes": "10"}, "size_bytes: Input should be a valid integer"),
        ({}, "size_bytes: Field required"),
        ({"size_bytes": 10, "key": "manifests/uploads/globex/x.json"}, "key: Extra inputs"),
    ],
)
def test_an_upload_request_out_of_bounds_is_a_400_naming_the_field(
    body: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_upload(json.dumps(body))
    assert str(refused.value).startswith(says)


# ------------------------------------------------------------------ upload, then submit


def test_an_uploaded_manifest_is_submitted_by_its_key() -> None:
    blobs = MemoryBlobs()
    doc = grant(Uploads(blobs), "acme", len(manifest(30)))
    blobs.upload(doc["url"], doc["method"], doc["headers"], manifest(30))
    run = submit_manifest(batches(blobs), "acme", doc["key"]).run
    assert run.units_total == 30 and run.spec.tenant == "acme" and run.spec.lane is Lane.LOW


def test_another_tenant_cannot_submit_or_replace_an_upload() -> None:
    blobs = MemoryBlobs()
    doc = grant(Uploads(blobs), "acme", len(manifest(3)))
    blobs.upload(doc["url"], doc["method"], doc["headers"], manifest(3))
    service = batches(blobs)
    with pytest.raises(InvalidInput) as refused:
        submit_manifest(service, "globex", doc["key"])
    assert refused.value.field == "manifest.key"
    assert service.executions.started == {}  # type: ignore[attr-defined]
    # the URL writes once: whoever holds it cannot replace the upload (S3's 412)
    with pytest.raises(Conflict, match="exists already"):
        blobs.upload(doc["url"], doc["method"], doc["headers"], manifest(3))
    assert blobs.get_json(doc["key"]) == json.loads(manifest(3))


@pytest.mark.parametrize(
    "change",
    [
        {"Content-Length": "99"},  # another size than signed
        {"If-None-Match": "etag"},  # not write-once
        {"Content-Type": "text/plain"},
    ],
)
def test_an_upload_that_is_not_the_signed_request_is_refused(change: dict[str, str]) -> None:
    blobs = MemoryBlobs()
    doc = grant(Uploads(blobs), "acme", len(manifest(3)))
    with pytest.raises(InvalidInput, match="SignatureDoesNotMatch"):
        blobs.upload(doc["url"], "PUT", {**doc["headers"], **change}, manifest(3))
    with pytest.raises(InvalidInput, match="SignatureDoesNotMatch"):  # a body of another size
        blobs.upload(doc["url"], "PUT", doc["headers"], manifest(3) + b" ")
    with pytest.raises(NotFound):
        blobs.get_json(doc["key"])


def test_a_manifest_over_the_size_limit_is_a_413_and_is_not_parsed() -> None:
    # Given an object over the limit under the tenant's prefix, written by some other means
    # than an upload URL (which cannot write it: S3 checks the signed size)
    blobs = MemoryBlobs()
    key = f"{UPLOADS_PREFIX}acme/big.json"
    blobs.objects[key] = b" " * (MAX_MANIFEST_BYTES + 1)  # whitespace: not JSON if parsed
    service = batches(blobs)
    # When it is submitted, then it is refused for its size, before being parsed
    limit = r"manifest\.key: .*33,554,433 bytes; the limit is 33,554,432"
    with pytest.raises(TooLarge, match=limit):
        submit_manifest(service, "acme", key)
    with pytest.raises(ObjectTooLarge):
        blobs.get_json(key, max_bytes=MAX_MANIFEST_BYTES)
    assert service.executions.started == {}  # type: ignore[attr-defined]
    # and one byte less is read (and refused as what it is: not JSON)
    blobs.objects[key] = b" " * MAX_MANIFEST_BYTES
    with pytest.raises(InvalidInput, match="is not JSON"):
        submit_manifest(service, "acme", key)


# ------------------------------------------------------------------ the fan-out


def test_the_fan_out_takes_tenant_lane_and_tokens_from_the_ledger_not_the_item() -> None:
    # Given acme's run on the low lane, opened by the API
    ledger, queue = InMemoryLedger(), MemoryQueue()
    spec = RunSpec("b-acme", "acme", Lane.LOW, 50_000, (UnitSpec("u1", 2_000),))
    ledger.open_run(spec, NOW)
    (chunk,) = manifest_items(spec, {"u1": "summarise"}, 100)
    assert chunk == {"run_id": "b-acme", "units": [{"unit_id": "u1", "input": "summarise"}]}
    # When its manifest item claims another tenant, the high lane and a tiny projection
    forged_unit = {**chunk["units"][0], "tenant": "globex", "lane": "high", "tokens": 1}
    forged = {**chunk, "tenant": "globex", "lane": "high", "units": [forged_unit]}
    fanout = FanOut(ledger, queue, queue_lease_s=600)
    outcome = fanout.admit_and_enqueue_chunk(forged, NOW, "b-acme")
    # Then the unit goes onto acme's lane, as acme's, reserving the ledger's projection
    assert outcome["units"] == [{"unit_id": "u1", "outcome": "enqueued", "attempt": 0}]
    (sent,) = queue.sent
    message = codec.parse_message_body(codec.message_body(sent))
    assert (message.tenant, message.lane, message.tokens) == ("acme", Lane.LOW, 2_000)
    assert message.input == "summarise"
    assert ledger.run("b-acme").reserved == 2_000


def test_the_fan_out_needs_no_tenant_or_lane_in_the_item_and_refuses_another_runs() -> None:
    ledger, queue = InMemoryLedger(), MemoryQueue()
    spec = RunSpec("b-acme", "acme", Lane.HIGH, 50_000, (UnitSpec("u1", 2_000),))
    ledger.open_run(spec, NOW)
    fanout = FanOut(ledger, queue, queue_lease_s=600)
    # an item of another batch than the execution's writes nothing
    another = "item of run 'b-acme' in the execution of batch 'b-other'"
    with pytest.raises(InvalidInput, match=another):
        fanout.admit_and_enqueue({"run_id": "b-acme", "unit_id": "u1"}, NOW, "b-other")
    assert queue.sent == [] and ledger.run("b-acme").reserved == 0
    with pytest.raises(InvalidInput, match=r"unit\.unit_id: missing"):
        fanout.admit_and_enqueue({"run_id": "b-acme"}, NOW, "b-acme")
    # the item only names the unit and carries its input
    fanout.admit_and_enqueue({"run_id": "b-acme", "unit_id": "u1", "input": "x"}, NOW, "b-acme")
    assert [(q.tenant, q.lane) for q in queue.sent] == [("acme", Lane.HIGH)]


# ------------------------------------------------------------------ the S3 adapter


def s3_blobs() -> tuple[S3Blobs, Stubber]:
    client = boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=S3_SIGV4,
    )
    return S3Blobs(client, "swarm-batches"), Stubber(client)


class Unread(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        raise AssertionError("the body of an object over the limit was read")


def test_s3_refuses_an_object_over_the_limit_by_its_size_without_reading_it() -> None:
    store, stub = s3_blobs()
    big = {"Body": StreamingBody(Unread(b"[]"), 2), "ContentLength": 1_001}
    stub.add_response("get_object", big, {"Bucket": "swarm-batches", "Key": "k"})
    with stub, pytest.raises(ObjectTooLarge) as refused:
        store.get_json("k", max_bytes=1_000)
    assert (refused.value.size, refused.value.limit) == (1_001, 1_000)


def test_an_s3_upload_url_is_a_put_of_exactly_the_signed_headers() -> None:
    store, _ = s3_blobs()
    signed = store.upload_url("manifests/uploads/acme/k.json", 1_234, 300)
    parts = urllib.parse.urlsplit(signed.url)
    query = urllib.parse.parse_qs(parts.query)
    assert (
        parts.netloc + parts.path == "swarm-batches.s3.amazonaws.com/manifests/uploads/acme/k.json"
    )
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"] and query["X-Amz-Expires"] == ["300"]
    assert query["X-Amz-SignedHeaders"] == ["content-length;content-type;host;if-none-match"]
    assert signed.headers == {
        "Content-Type": "application/json",
        "Content-Length": "1234",
        "If-None-Match": "*",
    }
