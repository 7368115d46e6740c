"""The local API over HTTP (swarm.local.apiserver): what it answers before the function runs is
the API's Error body, and a body of any bytes gets an answer (found by the e2e tier's fuzzer)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from swarm.api.models import Error
from swarm.local.apiserver import MAX_BODY_BYTES, LocalApi


class EchoApi(LocalApi):
    """The local API with the function replaced by an echo of what it would have been sent."""

    def invoke(self, method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        caller = self.authenticate(method, path, "", {}, b"")
        assert isinstance(caller, tuple)  # unsigned: refused, as any request here
        status, doc = caller
        return status, {"Content-Type": "application/json"}, json.dumps(doc).encode()


@pytest.fixture
def api() -> Iterator[LocalApi]:
    local = EchoApi(
        clients=None,
        function_arn="unused",
        account="123456789012",
        region="us-east-1",
        api_id="abc123",
        admin=lambda *a: (404, None),
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


def send(api: LocalApi, body: bytes, length: int | None = None) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", api.server.server_address[1], timeout=10)
    try:
        connection.putrequest("POST", "/batches")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body) if length is None else length))
        connection.endheaders()
        connection.send(body)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_body_past_the_gateways_limit_is_a_413_with_the_error_body(api: LocalApi) -> None:
    status, doc = send(api, b"", length=MAX_BODY_BYTES + 1)
    assert status == 413
    assert Error.model_validate(doc).error == "REQUEST_TOO_LARGE"


def test_a_body_that_is_not_utf8_is_answered(api: LocalApi) -> None:
    # before: the server's decode raised outside its handler and dropped the connection
    status, doc = send(api, b'{"top_up": "\xff\xfe"}')
    assert status == 403
    assert Error.model_validate(doc).error == "MISSING_AUTHENTICATION_TOKEN"
