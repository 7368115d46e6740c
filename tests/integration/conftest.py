"""Fixtures for the moto-backed integration tests (AWS's service limits enforced throughout).

moto's DynamoDB backend is not atomic under threads (docs/explanation/local.md): every fixture here
runs with :func:`swarm.local.patches.apply_all` applied, in-process (``mock_aws``) or in an embedded
moto server on a free localhost port. ``plane`` is the whole control plane as the synthesized
template declares it (:mod:`tests.integration.plane`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from swarm.adapters.dynamodb import create_table
from swarm.local import patches
from swarm.local.clients import REGION as REGION
from swarm.local.clients import local_client
from swarm.local.patches import limits
from swarm.local.server import EmbeddedServer, start_server
from tests.integration.plane import ControlPlane, control_plane, template

TABLE = "swarm-test"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start synthesizing the tier's template (:func:`tests.integration.plane.template`) in the
    background once a collected test needs the plane, so a cold synthesis overlaps the tests that
    do not (each xdist worker starts one; the lock lets one synthesize, the cache serves the
    other)."""
    if any({"plane", "interpreter"} & set(getattr(item, "fixturenames", ())) for item in items):
        threading.Thread(target=template, name="synthesize-template", daemon=True).start()


@pytest.fixture(autouse=True)
def aws_service_limits() -> None:
    """AWS's service limits (item and transaction sizes, numbers, message sizes, state payloads,
    history length, Lambda payloads: swarm.local.patches.limits) on every moto of this tier, as on
    the local stack: crossing one fails here as on AWS. Applied over the atomicity patch, before
    each test (idempotent): a test that runs moto unpatched drops both for its duration."""
    patches.apply_all()
    limits.apply_all()


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials, so nothing can reach a real account."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def plane(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlPlane]:
    """The tier's template deployed into a fresh in-process moto, IAM enforced, every handler
    wired to its function, and every event published on the bus observed."""
    with control_plane(monkeypatch) as deployed:
        deployed.observe_events()
        yield deployed


@pytest.fixture
def dynamodb(aws_credentials: None) -> Iterator[Any]:
    """An in-process moto DynamoDB client with the single table created (patched backend)."""
    patches.apply_all()
    with mock_aws():
        client = boto3.client("dynamodb", region_name=REGION)
        create_table(client, TABLE)
        yield client


@pytest.fixture(scope="session")
def moto_server() -> Iterator[EmbeddedServer]:
    """One embedded, patched moto server per test process (xdist workers get their own)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    server = start_server()
    yield server
    server.stop()


def server_client(endpoint: str, pool: int = 10) -> Any:
    """A DynamoDB client of the embedded server."""
    return local_client("dynamodb", endpoint, region=REGION, pool=pool)


@pytest.fixture
def server_table(moto_server: EmbeddedServer, request: pytest.FixtureRequest) -> str:
    """A fresh table on the embedded server, named after the test."""
    name = "t-" + "".join(c if c.isalnum() else "-" for c in request.node.name)[:200]
    create_table(server_client(moto_server.endpoint), name)
    return name
