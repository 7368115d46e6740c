"""A manifest uploaded through ``POST /uploads`` on the strict local stack: the tenant's role has
no rights on the bucket (only ``execute-api:Invoke``), the URL the API's role presigned writes
exactly the signed request once, the batch submitted by its key runs to exact books, and
another tenant can neither submit the key nor get a URL under the first tenant's prefix."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from swarm.client import ApiError
from tests.e2e.conftest import (
    Stack,
    assert_books,
    batch_id,
    expected_books,
    fresh_key,
    units,
    wait_for,
)


def put(url: str, headers: dict[str, str], body: bytes) -> int:
    """The status S3 (the local emulator) answers a PUT of ``url``."""
    request = urllib.request.Request(url, data=body, method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_a_manifest_uploaded_through_the_api_runs_and_stays_the_tenants(stack: Stack) -> None:
    tenant, key = "e2e-uploads", fresh_key("uploaded")
    bid = batch_id(tenant, key)
    batch = units(40, "m")
    books = expected_books(stack.model(), batch)
    data = json.dumps(batch).encode()
    client = stack.client(tenant)

    # Given a URL for the manifest's size: a new key under the tenant's own prefix
    _, doc = client.request("POST", "/uploads", {"size_bytes": len(data)})
    assert doc["key"].startswith(f"manifests/uploads/{tenant}/") and doc["method"] == "PUT"
    # Then S3 takes exactly the signed request, once: not another size, and not twice
    longer = {**doc["headers"], "Content-Length": str(len(data) + 1)}
    assert put(doc["url"], longer, data + b" ") == 403  # Content-Length is a signed header
    assert put(doc["url"], doc["headers"], data) == 200
    assert put(doc["url"], doc["headers"], data) == 412

    # And another tenant can neither submit that key nor upload under this tenant's prefix
    other = stack.client("e2e-uploads-other")
    with pytest.raises(ApiError) as refused:
        other.submit({"manifest": {"key": doc["key"]}})
    assert refused.value.status == 400 and "manifest.key" in str(refused.value)
    _, theirs = other.request("POST", "/uploads", {"size_bytes": 10})
    assert theirs["key"].startswith("manifests/uploads/e2e-uploads-other/")

    # When the tenant submits the key (Client.upload: what `swarm submit --upload` does)
    key_again = client.upload(data)
    assert key_again != doc["key"]
    created = client.submit({"manifest": {"key": key_again}, "lane": "high"}, idempotency_key=key)
    assert created["batch_id"] == bid and created["units"] == 40 and created["lane"] == "high"
    # Then it runs to exactly the books the model's seed gives, as the tenant's batch
    final = wait_for(client, bid, timeout_s=180)
    assert final["state"] == "completed" and final["tenant"] == tenant, final
    assert_books(books, stack.results(bid, "completed"))
