"""The one factory of clients of a local endpoint (swarm/local/clients.py): endpoint, region,
credentials, pool and retries as given, one client per service, an invoke never retried."""

from __future__ import annotations

from swarm.local.clients import (
    DUMMY_CREDENTIALS,
    LAMBDA_INVOKE,
    RETRIES,
    client_factory,
    credentials_of,
    local_client,
)
from swarm.local.patches.iam import Credentials

ENDPOINT = "http://127.0.0.1:5999"  # never contacted: making a client sends nothing


def test_a_client_talks_to_the_endpoint_in_the_region_with_the_credentials_given() -> None:
    credentials = Credentials("AKIDLOCAL", "secret", "token")
    client = local_client(
        "dynamodb", ENDPOINT, credentials=credentials, region="eu-west-1", pool=7, read_timeout=30
    )
    assert client.meta.endpoint_url == ENDPOINT
    assert client.meta.region_name == "eu-west-1"
    signed_with = client._request_signer._credentials
    assert (signed_with.access_key, signed_with.secret_key, signed_with.token) == (
        "AKIDLOCAL",
        "secret",
        "token",
    )
    config = client.meta.config
    assert config.max_pool_connections == 7 and config.read_timeout == 30
    assert config.retries == {"mode": "standard", "total_max_attempts": RETRIES + 1}


def test_an_invoke_client_tries_once_and_waits_as_long_as_a_function_may_run() -> None:
    client = local_client(LAMBDA_INVOKE, ENDPOINT)
    assert client.meta.service_model.service_name == "lambda"
    assert client.meta.config.retries["total_max_attempts"] == 1
    assert client.meta.config.read_timeout == 900


def test_a_factory_makes_one_client_per_service_signed_alike() -> None:
    clients = client_factory(ENDPOINT, Credentials("AKIDROLE", "secret"), pool=64)
    sqs = clients("sqs")
    assert clients("sqs") is sqs and clients("s3") is not sqs
    for client in (sqs, clients("s3")):
        assert client._request_signer._credentials.access_key == "AKIDROLE"
        assert client.meta.config.max_pool_connections == 64


def test_credentials_from_boto_keyword_arguments_or_the_dummy_pair() -> None:
    boto = {"aws_access_key_id": "a", "aws_secret_access_key": "b"}
    assert credentials_of(boto) == Credentials("a", "b")
    assert credentials_of(None) == DUMMY_CREDENTIALS
