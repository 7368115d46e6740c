"""The results store on S3 (moto): write-once attempt records, and a results file past one part
written as a multipart upload, over several calls when one has no time for it all, aborted when
it fails half-way before anything was saved for the next call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.adapters.s3_results import PART_BYTES, S3Results
from swarm.core.results import AttemptOutcome, attempt_key

BUCKET = "batches"


@pytest.fixture
def store(aws_credentials: None) -> Iterator[S3Results]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield S3Results(client, BUCKET)


def test_an_attempt_is_recorded_once_and_read_back(store: S3Results) -> None:
    first = AttemptOutcome("b-1", "u1", 0, True, 120, output="the answer", model_id="m")
    assert store.record(first) == attempt_key("b-1", "u1", 0)
    assert store.record(AttemptOutcome("b-1", "u1", 0, True, 5, output="another")) is None
    asked = [("u1", 0, None), ("u1", 1, None), ("u2", 0, None)]
    assert store.outcomes("b-1", asked) == [first, None, None]


def test_a_page_holds_many_attempts_and_each_object_is_read_once(store: S3Results) -> None:
    # Given a page of two attempts' outcomes, written in one request, and an attempt alone
    a = AttemptOutcome("b-1", "u1", 0, True, 120, output="one")
    b = AttemptOutcome("b-1", "u2", 1, False, 80, error="refused")
    alone = AttemptOutcome("b-1", "u3", 0, True, 90, output="three")
    client: Any = store.client
    calls: list[str] = []
    client.meta.events.register("before-call.s3.*", lambda model, **_: calls.append(model.name))
    page = store.record_page("b-1", [a, b])
    assert calls == ["PutObject"] and page.startswith("results/b-1/attempts/")
    assert store.record_page("b-1", [a]) != page  # every page a key of its own
    store.record(alone)
    calls.clear()
    # When the outcomes are read by where the ledger says they are
    asked = [("u1", 0, page), ("u2", 1, page), ("u3", 0, None), ("u2", 0, page)]
    # Then each comes from its object, the page read once; an attempt the page lacks is None
    assert store.outcomes("b-1", asked) == [a, b, alone, None]
    assert sorted(calls) == ["GetObject", "GetObject"]


def lines(n: int, size: int, after: str | None = None) -> Iterator[tuple[str, bytes]]:
    for i in range(n):
        unit_id = f"u{i:05d}"
        if after is None or unit_id > after:
            yield unit_id, json.dumps({"unit_id": unit_id, "output": "x" * size}).encode() + b"\n"


def body(n: int, size: int) -> bytes:
    return b"".join(line for _, line in lines(n, size))


def test_a_results_file_past_one_part_is_a_multipart_upload_of_every_line(
    store: S3Results,
) -> None:
    # 20 MiB of lines: two full parts and a last, shorter one
    n, size = 20, 1024 * 1024
    key = store.write_file("b-1", "completed-0.jsonl", lambda after: lines(n, size, after))
    assert key is not None
    client: Any = store.client
    head = client.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == len(body(n, size)) > 2 * PART_BYTES
    assert head["ETag"].strip('"').endswith("-3")  # S3's multipart ETag: 3 parts
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body(n, size)


def test_a_file_too_long_for_one_call_goes_on_where_the_last_call_stopped(
    store: S3Results,
) -> None:
    # Given 20 MiB of lines in parts of S3's minimum (5 MiB), and calls with time for one part
    store.part_bytes = 5 * 1024 * 1024
    n, size = 20, 1024 * 1024
    asked: list[str | None] = []

    def file_lines(after: str | None) -> Iterator[tuple[str, bytes]]:
        asked.append(after)
        return lines(n, size, after)

    # When the file is written call after call
    keys = [store.write_file("b-1", "completed-0.jsonl", file_lines, lambda: False)]
    while keys[-1] is None and len(keys) < 10:
        keys.append(store.write_file("b-1", "completed-0.jsonl", file_lines, lambda: False))
    # Then each call kept one part (5 lines of ~1 MiB) and asked for the lines after it; the
    # last call completed the upload: every line once, in order, one upload
    assert keys == [None, None, None, "results/b-1/completed-0.jsonl"]
    assert asked == [None, "u00004", "u00009", "u00014"]
    client: Any = store.client
    head = client.head_object(Bucket=BUCKET, Key=keys[-1])
    assert head["ETag"].strip('"').endswith("-4")
    assert client.get_object(Bucket=BUCKET, Key=keys[-1])["Body"].read() == body(n, size)
    assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def test_a_saved_upload_that_is_gone_is_begun_again(store: S3Results) -> None:
    # Given a file that a call left half-written, its upload since aborted (the lifecycle rule)
    store.part_bytes = 5 * 1024 * 1024
    n, size = 12, 1024 * 1024
    name = "completed-0.jsonl"
    assert store.write_file("b-1", name, lambda a: lines(n, size, a), lambda: False) is None
    client: Any = store.client
    (upload,) = client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]
    client.abort_multipart_upload(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
    # When the next call goes on, Then it writes the whole file again
    key = store.write_file("b-1", name, lambda a: lines(n, size, a))
    assert key is not None
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body(n, size)


def test_a_file_that_fails_half_way_leaves_no_upload_behind(store: S3Results) -> None:
    def failing(after: str | None) -> Iterator[tuple[str, bytes]]:
        yield from lines(10, 1024 * 1024)  # past one part: the upload has begun
        raise RuntimeError("the ledger went away")

    with pytest.raises(RuntimeError):
        store.write_file("b-1", "completed-0.jsonl", failing)
    client: Any = store.client
    assert client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    assert not store.exists("results/b-1/completed-0.jsonl")


def test_a_call_that_fails_after_a_saved_part_keeps_the_upload_for_the_next(
    store: S3Results,
) -> None:
    # Given a file a call left half-written
    store.part_bytes = 5 * 1024 * 1024
    n, size = 12, 1024 * 1024
    name = "completed-0.jsonl"
    assert store.write_file("b-1", name, lambda a: lines(n, size, a), lambda: False) is None

    def failing(after: str | None) -> Iterator[tuple[str, bytes]]:
        yield from lines(2, size, after)
        raise RuntimeError("the ledger went away")

    # When the next call fails, Then the saved upload stays, and a third call finishes the file
    with pytest.raises(RuntimeError):
        store.write_file("b-1", name, failing)
    client: Any = store.client
    assert len(client.list_multipart_uploads(Bucket=BUCKET)["Uploads"]) == 1
    key = store.write_file("b-1", name, lambda a: lines(n, size, a))
    assert key is not None
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body(n, size)
