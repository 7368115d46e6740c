"""boto3 clients of a local AWS endpoint (an embedded moto server, or in-process moto): one
factory for every place that talks to one, so region, endpoint, credentials, connection pool and
retries are chosen in one way.

Used by the local stack (:mod:`swarm.local.stack`), the governor benchmark
(:mod:`swarm.bench.governor`) and the test tiers' harnesses. Credentials are always given: an
emulator must never be reached with a caller's real ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from swarm.local.patches.iam import Credentials

REGION = "us-east-1"
#: moto's dummy keys: any pair is accepted while IAM is not enforced
DUMMY_CREDENTIALS = Credentials("testing", "testing")
#: retries after the first try: moto answers at once, so a retry only covers a dropped connection
RETRIES = 3
#: the pseudo-service of a Lambda ``Invoke`` client: one try (an invoke is never retried) and a
#: read timeout as long as a function may run
LAMBDA_INVOKE = "lambda-invoke"
LAMBDA_INVOKE_READ_TIMEOUT_S = 900

ClientFactory = Callable[[str], Any]


def credentials_of(boto: Mapping[str, str] | None) -> Credentials:
    """``boto3.client`` keyword arguments (``aws_access_key_id``...) as :class:`Credentials`;
    None: :data:`DUMMY_CREDENTIALS`."""
    if not boto:
        return DUMMY_CREDENTIALS
    return Credentials(
        boto["aws_access_key_id"], boto["aws_secret_access_key"], boto.get("aws_session_token")
    )


def config(pool: int = 10, *, retries: int = RETRIES, read_timeout: float | None = None) -> Any:
    """The botocore ``Config`` of a local client: ``pool`` connections, ``retries`` retries in
    standard mode, and botocore's read timeout unless given."""
    from botocore.config import Config

    options: dict[str, Any] = {
        "max_pool_connections": pool,
        "retries": {"max_attempts": retries, "mode": "standard"},
    }
    if read_timeout is not None:
        options["read_timeout"] = read_timeout
    return Config(**options)


def local_client(
    service: str,
    endpoint: str | None,
    *,
    credentials: Credentials = DUMMY_CREDENTIALS,
    region: str = REGION,
    pool: int = 10,
    read_timeout: float | None = None,
) -> Any:
    """One client of ``service`` at ``endpoint`` (None: in-process moto, which intercepts every
    client of the process), signed with ``credentials``. ``service`` may be
    :data:`LAMBDA_INVOKE`."""
    return _client(_session(credentials, region), service, endpoint, pool, read_timeout)


def client_factory(
    endpoint: str | None,
    credentials: Credentials = DUMMY_CREDENTIALS,
    *,
    region: str = REGION,
    pool: int = 10,
) -> ClientFactory:
    """Clients of ``endpoint`` signed with ``credentials``, one per service, made on first use
    (thread-safe): what :class:`swarm.wiring.Wiring` and the local stack's plumbing take."""
    cache: dict[str, Any] = {}
    lock = threading.Lock()  # a boto3 session is not thread-safe: one client made at a time
    session = _session(credentials, region)

    def client(service: str) -> Any:
        with lock:
            if service not in cache:
                cache[service] = _client(session, service, endpoint, pool, None)
            return cache[service]

    return client


_LOADER: list[Any] = []
_LOADER_GUARD = threading.Lock()


def _session(credentials: Credentials, region: str) -> Any:
    """A boto3 session signing with ``credentials``. Every session shares one botocore data
    loader, so each service's model is read and parsed once per process (a session of its own
    parses it again: ~50 ms per service, for every function of every local stack and test)."""
    import boto3
    import botocore.loaders
    import botocore.session

    with _LOADER_GUARD:
        if not _LOADER:
            _LOADER.append(botocore.loaders.create_loader())
        loader = _LOADER[0]
    core = botocore.session.get_session()
    core.register_component("data_loader", loader)
    return boto3.session.Session(botocore_session=core, region_name=region, **credentials.boto())


def _client(
    session: Any, service: str, endpoint: str | None, pool: int, read_timeout: float | None
) -> Any:
    if service == LAMBDA_INVOKE:
        invoke = config(pool, retries=0, read_timeout=LAMBDA_INVOKE_READ_TIMEOUT_S)
        return session.client("lambda", endpoint_url=endpoint, config=invoke)
    settings = config(pool, read_timeout=read_timeout)
    if service == "s3":  # as on Lambda (swarm.wiring.client_configs): presigned URLs are SigV4
        from botocore.config import Config

        settings = settings.merge(Config(signature_version="s3v4"))
    return session.client(service, endpoint_url=endpoint, config=settings)
