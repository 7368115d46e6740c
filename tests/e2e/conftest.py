"""One local stack (``swarm local up``) per test session; every test talks to it over HTTP.

The stack runs as a background process on an embedded, patched moto server, with the time scale
of ``make run`` (quota x10, model latency / 10). Tests use distinct tenants so their batches and
their fair-queue groups do not mix.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from swarm.client import ApiError, Client, Target
from swarm.local.cli import down, up
from swarm.local.deploy import LocalOptions

TERMINAL = ("completed", "exhausted")


@dataclass
class Stack:
    target: Target

    def client(self, tenant: str) -> Client:
        return Client(Target(**{**asdict(self.target), "tenant": tenant}), timeout_s=60)

    def aws(self, service: str) -> Any:
        return boto3.client(
            service,
            endpoint_url=self.target.aws_endpoint,
            region_name=self.target.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def local(self, method: str, path: str, body: Any = None) -> Any:
        return self.client("admin").request(method, path, body)[1]

    def model(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.local("GET", "/_local/model")
        return doc

    def results(self, batch_id: str, state: str) -> dict[str, Any]:
        """The finalizer's results object for the run's latest closure as ``state``."""
        s3 = self.aws("s3")
        bucket = next(b["Name"] for b in s3.list_buckets()["Buckets"] if "batches" in b["Name"])
        prefix = f"results/{batch_id}/{state}-"
        # the finalizer (the state machine's poll loop) writes it shortly after the run closes
        deadline = time.monotonic() + 30
        while True:
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
            if listed:
                key = max((o["Key"] for o in listed), key=lambda k: int(k[len(prefix) : -5]))
                doc: dict[str, Any] = json.loads(
                    s3.get_object(Bucket=bucket, Key=key)["Body"].read()
                )
                return doc
            if time.monotonic() > deadline:
                raise AssertionError(f"no {prefix}*.json in the bucket")
            time.sleep(0.5)


def units(n: int, prefix: str = "u", tokens: Callable[[int], int] | None = None) -> list[Any]:
    size = tokens or (lambda i: 8_000 + (i * 7_919) % 8_001)  # 8k-16k, deterministic
    return [
        {"unit_id": f"{prefix}-{i:05d}", "projected_tokens": size(i), "input": f"unit {i}"}
        for i in range(n)
    ]


def wait_for(
    client: Client,
    batch_id: str,
    until: Callable[[dict[str, Any]], bool] = lambda d: d["state"] in TERMINAL,
    timeout_s: float = 300,
    interval_s: float = 0.5,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        doc: dict[str, Any] = client.status(batch_id)
        if until(doc):
            return doc
        if time.monotonic() > deadline:
            raise AssertionError(f"batch {batch_id} never reached the condition: {doc}")
        time.sleep(interval_s)


def submit_retrying(client: Client, body: dict[str, Any], attempts: int = 30) -> Any:
    """Submit, honouring 429/503 Retry-After (bounded)."""
    for _ in range(attempts):
        try:
            return client.submit(body)
        except ApiError as e:
            if e.status not in (429, 503):
                raise
            time.sleep(min(5, e.retry_after or 1))
    raise AssertionError("submission kept being refused")


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # the drain switch is an SSM call: the local emulator takes any credentials
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    state_dir: Path = tmp_path_factory.mktemp("swarm-local")
    target = up(LocalOptions(time_scale=10.0), state_dir, quiet=True)
    try:
        yield Stack(target)
    finally:
        down(state_dir, quiet=True)
