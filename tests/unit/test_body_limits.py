"""The inline body's limit holds on AWS: Lambda's 6 MiB payload is the whole API Gateway event,
the body JSON-escaped in it, so the handler's limit counts the body escaped, and any body within
it fits the event with the largest headers API Gateway takes."""

from __future__ import annotations

import json

import pytest

from swarm.api.models import (
    EVENT_OVERHEAD_BYTES,
    LAMBDA_PAYLOAD_BYTES,
    MAX_BODY_BYTES,
    SAFE_BODY_BYTES,
    escaped_bytes,
)
from swarm.core.errors import InvalidInput
from swarm.local.events import proxy_event
from swarm.local.patches.limits import LAMBDA_MAX_SYNC_REQUEST_BYTES
from swarm.service.api_models import TooLarge, parse_json, parse_submit

#: API Gateway takes at most 10,240 bytes of request line and headers (REST APIs); a header
#: value of obs-text bytes (é as one Latin-1 byte) is the worst to escape: 6 bytes each
HEADER_BYTES = 10_240
TENANT_ARN = "arn:aws:sts::123456789012:assumed-role/" + "r" * 64 + "/" + "s" * 64


def largest_headers() -> dict[str, str]:
    headers: dict[str, str] = {}
    for i in range(40):
        name = f"X-Header-{i:02d}"
        headers[name] = "é" * (HEADER_BYTES // 40 - len(name) - 4)  # ": " and CRLF
    return headers


def worst_event(body: str) -> bytes:
    """The event as the most escaping serializer writes it (every non-ASCII character too)."""
    event = proxy_event(
        "POST",
        "/batches",
        body=body,
        headers=largest_headers(),
        user_arn=TENANT_ARN,
        user="AROAEXAMPLEEXAMPLE:" + "s" * 64,
        stage="production",
    )
    return json.dumps(event, ensure_ascii=True).encode()


def test_the_limit_is_lambdas_payload_the_local_stack_enforces() -> None:
    assert LAMBDA_PAYLOAD_BYTES == LAMBDA_MAX_SYNC_REQUEST_BYTES == 6_291_456
    assert MAX_BODY_BYTES == 6_029_312  # 5.75 MiB
    assert SAFE_BODY_BYTES * 6 <= MAX_BODY_BYTES


def test_a_body_is_counted_as_its_event_carries_it() -> None:
    assert escaped_bytes("plain") == 5
    assert escaped_bytes('"\\') == 4  # \" and \\
    assert escaped_bytes("\n\x01") == 2 + 6  # \n and \u0001
    assert escaped_bytes("é✓") == 12  # \u00e9 \u2713, whatever a serializer keeps
    assert escaped_bytes("😀") == 12  # a surrogate pair: \ud83d\ude00


def test_the_event_but_its_body_fits_its_allowance_with_the_largest_headers() -> None:
    assert len(worst_event("")) - len('""') + len("null") <= EVENT_OVERHEAD_BYTES
    assert len(worst_event("x")) - len('"x"') <= EVENT_OVERHEAD_BYTES


@pytest.mark.parametrize("char", ["\x01", '"', "é", "😀"])
def test_a_body_within_the_limit_fits_lambdas_payload_however_it_escapes(char: str) -> None:
    """Worst cases per byte: a control character (1 -> 6 bytes), a quote (1 -> 2), a 2-byte
    character (2 -> 6), a 4-byte one (4 -> 12): a body the handler takes always reaches it."""
    body = char * (SAFE_BODY_BYTES // len(char.encode()))
    assert len(worst_event(body)) <= LAMBDA_PAYLOAD_BYTES
    with pytest.raises(InvalidInput):  # not JSON, but within the limit: a 400, not a 413
        parse_json(body)
    # and the largest body of its kind the handler takes fits too
    largest = char * (MAX_BODY_BYTES // (escaped_bytes(char)))
    assert escaped_bytes(largest) <= MAX_BODY_BYTES
    assert len(worst_event(largest)) <= LAMBDA_PAYLOAD_BYTES


def test_a_body_of_escaped_characters_under_5_mib_is_refused_with_413_naming_the_manifest() -> None:
    """3.1 MB of ``\\"`` is 6.2 MB in the event: before, the handler took it by its raw size
    (5 MiB), though AWS could not pass it to Lambda with the largest headers."""
    body = '{"units": "' + '\\"' * 1_550_000 + '"}'
    assert len(body.encode()) < 5 * 1024 * 1024
    assert len(worst_event(body)) > LAMBDA_PAYLOAD_BYTES
    with pytest.raises(TooLarge) as refused:
        parse_submit(body)
    message = str(refused.value)
    assert f"{escaped_bytes(body):,} bytes" in message and "6,029,312" in message
    assert "manifest" in message and "POST /uploads" in message


def test_a_body_at_the_limit_is_parsed_and_one_byte_more_is_413() -> None:
    prefix, suffix = '{"units": "', '"}'  # 4 quotes: 4 bytes more escaped
    fill = MAX_BODY_BYTES - len(prefix) - len(suffix) - 4
    at = prefix + "a" * fill + suffix
    assert escaped_bytes(at) == MAX_BODY_BYTES
    with pytest.raises(InvalidInput, match="units"):  # parsed: a string is not units
        parse_submit(at)
    over = prefix + "a" * (fill + 1) + suffix
    with pytest.raises(TooLarge):
        parse_submit(over)
