"""Every patch the control plane applies to moto, in one package.

- :mod:`.dynamodb`: item operations atomic, as DynamoDB's are (every moto server needs it),
  each expression string parsed once and item responses written without moto's serializer
  (the same answers for less CPU);
- :func:`patch_server_module_list` (here): moto's request routing without a directory listing
  per request (every moto server);
- :mod:`.limits`: the AWS service limits moto does not enforce (the local stack and the
  integration tier);
- :mod:`.iam`: IAM authorization on the real resource ARNs of each request (the local stack);
- :mod:`.stepfunctions` and :mod:`.emulator`: what the local stack needs of Step Functions,
  SQS and EventBridge to run the synthesized template.

:func:`apply_all` applies the ones every moto server needs; the local stack applies the rest
itself. Each patch is idempotent and process-wide.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from swarm.local.patches.dynamodb import (
    patch_dynamodb_atomicity,
    patch_dynamodb_expressions,
    patch_dynamodb_json,
)

_PATCH_GUARD = threading.Lock()


def patch_server_module_list() -> None:
    """moto's server routes each request by asking whether the host names one of its modules,
    and ``list_of_moto_modules`` answers by listing moto's package directory and stat-ing every
    entry, on every request (~9% of the local stack's CPU under load). The list cannot change
    while the process runs: compute it once."""
    from moto import backends

    with _PATCH_GUARD:
        if getattr(backends.list_of_moto_modules, "__swarm_patched__", False):
            return
        modules = tuple(backends.list_of_moto_modules())

        def list_of_moto_modules() -> Iterator[str]:
            return iter(modules)

        list_of_moto_modules.__swarm_patched__ = True  # type: ignore[attr-defined]
        backends.list_of_moto_modules = list_of_moto_modules


PATCHES: dict[str, Callable[[], None]] = {
    "dynamodb-atomicity": patch_dynamodb_atomicity,
    "dynamodb-expressions": patch_dynamodb_expressions,
    "dynamodb-json": patch_dynamodb_json,
    "server-module-list": patch_server_module_list,
}


def apply_all() -> None:
    """Apply every patch the control plane relies on (idempotent)."""
    for patch in PATCHES.values():
        patch()
