"""S3 without s3:ListBucket answers 403 AccessDenied, not 404, for a missing key.

The adapter never reads a 403 as "missing" (it raises ReadDenied); the callers that may read it
as "missing" do so only where that is a refusal writing nothing. The stack grants s3:ListBucket
on the prefixes each function reads (tests/infra/test_permissions.py), so S3 says 404 there.
"""

from __future__ import annotations

import io
from typing import Any

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from swarm.adapters.aws import S3Blobs
from swarm.core.errors import Conflict, InvalidInput, NotFound, ReadDenied
from swarm.core.records import RunState
from tests.unit.test_service_flow import Plane

BUCKET = "swarm-batches"


def blobs() -> tuple[S3Blobs, Stubber]:
    client = boto3.client(
        "s3",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return S3Blobs(client, BUCKET), Stubber(client)


def body(data: bytes) -> dict[str, Any]:
    return {"Body": StreamingBody(io.BytesIO(data), len(data))}


def test_a_403_on_get_object_is_read_denied_not_a_botocore_error() -> None:
    store, stub = blobs()
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", http_status_code=403)
    with stub, pytest.raises(ReadDenied) as error:
        store.get_json("manifests/uploads/acme/missing.json")
    assert error.value.key == "manifests/uploads/acme/missing.json"
    assert "s3:ListBucket" in str(error.value)


def test_a_403_on_head_object_is_never_read_as_absent() -> None:
    """HeadObject has no body: botocore reports the status code as the error code. Reading a 403
    as "absent" would make the finalizer write its results and announce the closure again."""
    store, stub = blobs()
    stub.add_client_error("head_object", "403", "Forbidden", http_status_code=403)
    stub.add_client_error("head_object", "404", "Not Found", http_status_code=404)
    with stub:
        with pytest.raises(ReadDenied):
            store.exists("results/b-1/completed-0.json")
        assert store.exists("results/b-1/completed-0.json") is False


def test_a_404_is_not_found_and_a_body_that_is_not_json_names_the_key() -> None:
    store, stub = blobs()
    stub.add_client_error("get_object", "NoSuchKey", "The key does not exist", 404)
    stub.add_response("get_object", body(b"{not json"))
    stub.add_response("get_object", body(b"\xff\xfe\x00"))
    stub.add_response("get_object", body(b'[{"unit_id": "a"}]'))
    with stub:
        with pytest.raises(NotFound):
            store.get_json("manifests/b-1/units.json")
        with pytest.raises(InvalidInput, match=r"^k\.json: not JSON"):
            store.get_json("k.json")
        with pytest.raises(InvalidInput, match="not UTF-8 text"):
            store.get_json("k.json")
        assert store.get_json("k.json") == [{"unit_id": "a"}]


def test_other_errors_are_not_mapped() -> None:
    store, stub = blobs()
    stub.add_client_error("get_object", "SlowDown", "Reduce your request rate", 503)
    with stub, pytest.raises(Exception, match="SlowDown") as error:
        store.get_json("k.json")
    assert not isinstance(error.value, (NotFound, ReadDenied))


def test_resume_after_the_manifest_expired_is_a_409_when_s3_says_403() -> None:
    # Given an exhausted run whose manifest the bucket's lifecycle rule has expired, on a stack
    # whose API role cannot list the bucket (S3 answers 403 for the missing key)
    plane = Plane()
    run_id = plane.submit(20, budget=100_000)
    plane.run(run_id)
    before = plane.ledger.run(run_id)
    assert before.state is RunState.EXHAUSTED
    store, stub = blobs()
    stub.add_client_error("get_object", "AccessDenied", "Access Denied", http_status_code=403)
    plane.batches.blobs = store

    # When the tenant resumes it, then it is refused as expired, before the top-up commits
    with stub, pytest.raises(Conflict, match="manifest has expired"):
        plane.batches.resume("acme", run_id, 1_000_000, plane.clock.now())
    after = plane.ledger.run(run_id)
    assert (after.budget, after.state) == (before.budget, RunState.EXHAUSTED)
